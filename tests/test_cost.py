"""The communication-wall models (checks/cost.py) and `clusterhealth model`.

The worked examples are the ones published gradient-sync calculators print; each names its source.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterhealth.agent.cli import main
from clusterhealth.checks import cost

GIB = 2**30
GBIT = 1e9 / 8

quick = settings(max_examples=200, derandomize=True, deadline=None)
ranks = st.integers(min_value=1, max_value=100_000)
positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
fraction = st.floats(min_value=0.0, max_value=1.0)


def _workload(**kw: float) -> cost.Workload:
    fields: dict = dict(params=7e9, bytes_per_param=2, gpus=8, compute_seconds=0.0035)
    fields.update(kw)
    return cost.Workload(**fields)


# --- nccl-tests' conventions (doc/PERFORMANCE.md in NVIDIA/nccl-tests) ---------------------


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        ("all_reduce", 8, 2 * 7 / 8),
        ("all_reduce", 2, 1.0),
        ("all_gather", 8, 7 / 8),
        ("reduce_scatter", 16, 15 / 16),
        ("alltoall", 4, 3 / 4),
        ("broadcast", 8, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 2, 1.0),
        ("all_reduce", 1, 0.0),
    ],
)
def test_bus_bandwidth_factors_are_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert cost.bus_factor(collective, n) == pytest.approx(factor)


def test_busbw_of_an_nccl_tests_row() -> None:
    # tests/fixtures/nccl-tests/01_multinode_2x8_h100_allreduce_ib.txt, 16 ranks, the 8 GiB row
    # out of place: 34381 us, algbw 249.84 GB/s, busbw 468.46 GB/s.
    size, seconds = 8589934592, 34381e-6
    assert cost.algorithm_bandwidth(size, seconds) / 1e9 == pytest.approx(249.84, abs=0.01)
    assert cost.bus_bandwidth(size, seconds, "all_reduce", 16) / 1e9 == pytest.approx(468.46, abs=0.01)


def test_an_unknown_collective_or_no_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown collective"):
        cost.bus_factor("allreduce", 8)
    with pytest.raises(ValueError, match="at least 1"):
        cost.bus_factor("all_reduce", 0)


# --- worked examples ------------------------------------------------------------------------


def test_seven_billion_parameters_on_eight_gpus_at_400_gbit() -> None:
    """pingdo.net's Gradient Sync Modeler (https://pingdo.net/tools/data-parallelism-optimizer),
    its default case: "7B parameters × 8 GPUs × 400 Gbps interconnect", compute time 3.5 ms; it
    prints gradient size 13.04 GB, ring all-reduce 456.3 ms, step time 459.8 ms, GPU efficiency
    0.8%. Its "GB" are GiB, and it divides them by a decimal 50 GB/s: the same ring formula on
    the same inputs, with the units mixed."""
    w = _workload()
    e = cost.estimate(w, 400 * GBIT)
    assert e.gradient_bytes == 14e9
    assert round(e.gradient_bytes / GIB, 2) == 13.04
    assert e.allreduce_seconds == pytest.approx(2 * 7 / 8 * 14e9 / 50e9)  # 0.49 s
    # The calculator's figure is ours with the gradient counted in GiB and the rate in GB/s.
    assert round(e.allreduce_seconds * 1e9 / GIB * 1e3, 1) == 456.3
    assert round((e.allreduce_seconds * 1e9 / GIB + 0.0035) * 1e3, 1) == 459.8
    assert e.step_seconds == pytest.approx(0.49 + 0.0035)
    assert e.comm_compute_ratio == pytest.approx(140)
    assert e.scaling_efficiency == pytest.approx(0.0035 / 0.4935)
    assert round(0.0035 / 0.4598, 3) == 0.008  # its 0.8%, from its own step time


def test_a_175b_model_moves_350_gb_of_bf16_gradients() -> None:
    """The same page: "For a 175B parameter model (GPT-3 size) using bfloat16 (2 bytes per
    parameter), each GPU must communicate 350GB of gradients per training step". Over a large
    ring at 400 Gbit/s, the ring moves nearly twice that through the slowest link: ~14 s."""
    w = _workload(params=175e9, gpus=1024)
    e = cost.estimate(w, 400 * GBIT)
    assert e.gradient_bytes == 350e9
    assert e.allreduce_seconds == pytest.approx(2 * 1023 / 1024 * 350e9 / 50e9)
    assert e.allreduce_seconds == pytest.approx(14, rel=0.001)


def test_the_step_model_at_its_named_points() -> None:
    # T = C + comm − η·min(C, comm)
    assert cost.step_seconds(1.0, 0.5, 0.0) == 1.5
    assert cost.step_seconds(1.0, 0.5, 1.0) == 1.0
    assert cost.step_seconds(1.0, 2.0, 1.0) == 2.0
    assert cost.step_seconds(1.0, 2.0, 0.5) == 2.5


def test_accumulation_divides_gamma_by_k() -> None:
    one = cost.estimate(_workload(), 400 * GBIT)
    four = cost.estimate(_workload(accumulation=4), 400 * GBIT)
    assert four.comm_compute_ratio == pytest.approx(one.comm_compute_ratio / 4)
    assert four.compute_seconds == pytest.approx(4 * 0.0035)


def test_the_latency_term_is_two_n_minus_one_alphas() -> None:
    t0 = cost.ring_allreduce_seconds(1e9, 8, 50e9)
    t1 = cost.ring_allreduce_seconds(1e9, 8, 50e9, latency_seconds=5e-6)
    assert t1 - t0 == pytest.approx(2 * 7 * 5e-6)


# --- properties -----------------------------------------------------------------------------


@quick
@given(n=ranks, size=positive, b1=positive, b2=positive, alpha=st.floats(0, 1e-3))
def test_more_bandwidth_never_makes_the_all_reduce_slower(
    n: int, size: float, b1: float, b2: float, alpha: float
) -> None:
    lo, hi = sorted((b1, b2))
    assert cost.ring_allreduce_seconds(size, n, hi, alpha) <= cost.ring_allreduce_seconds(size, n, lo, alpha)


@quick
@given(size=positive, bandwidth=positive)
def test_the_ring_tends_to_twice_the_gradient_over_the_bandwidth(size: float, bandwidth: float) -> None:
    big = cost.ring_allreduce_seconds(size, 10**9, bandwidth)
    assert big == pytest.approx(2 * size / bandwidth, rel=1e-6)
    assert cost.ring_allreduce_seconds(size, 1, bandwidth) == 0


@quick
@given(c=positive, m=positive, eta=fraction)
def test_the_step_lies_between_the_longer_part_and_the_sum(c: float, m: float, eta: float) -> None:
    t = cost.step_seconds(c, m, eta)
    assert max(c, m) * (1 - 1e-12) <= t <= (c + m) * (1 + 1e-12)
    assert cost.step_seconds(c, m, 0.0) == pytest.approx(c + m)
    assert cost.step_seconds(c, m, 1.0) == pytest.approx(max(c, m))


@quick
@given(b1=positive, b2=positive, eta=fraction, k=st.integers(1, 64))
def test_efficiency_rises_and_slowdown_falls_with_bandwidth(b1: float, b2: float, eta: float, k: int) -> None:
    lo, hi = sorted((b1 * 1e6, b2 * 1e6))
    w = _workload(overlap=eta, accumulation=k)
    assert cost.estimate(w, hi).scaling_efficiency >= cost.estimate(w, lo).scaling_efficiency
    assert cost.slowdown(w, hi, lo) * (1 + 1e-12) >= 1


@quick
@given(c=positive, eta=fraction, e=st.floats(0.01, 1.0), size=positive, n=st.integers(2, 4096))
def test_the_bandwidth_for_a_target_gives_that_target(
    c: float, eta: float, e: float, size: float, n: int
) -> None:
    budget = cost.comm_budget_seconds(c, eta, e)
    needed = cost.bandwidth_for_comm_seconds(size, n, budget)
    if math.isinf(needed):
        assert e == 1 or budget == 0
        return
    if needed == 0:  # perfect overlap: any bandwidth keeps the target
        return
    comm = cost.ring_allreduce_seconds(size, n, needed)
    assert cost.scaling_efficiency(c, cost.step_seconds(c, comm, eta)) == pytest.approx(e, rel=1e-9)


def test_perfect_overlap_hides_communication_up_to_the_compute_time() -> None:
    assert cost.comm_budget_seconds(1.0, 1.0, 1.0) == 1.0
    assert cost.comm_budget_seconds(1.0, 0.0, 1.0) == 0.0
    assert cost.comm_budget_seconds(1.0, 0.0, 0.5) == 1.0


@pytest.mark.parametrize(
    "kw",
    [
        {"gpus": 0},
        {"params": 0},
        {"compute_seconds": 0},
        {"overlap": 1.5},
        {"accumulation": 0},
        {"latency_seconds": -1},
    ],
)
def test_a_workload_out_of_range_is_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        _workload(**kw)


# --- impact: the price analyze puts on a suspect (tests/test_fabric_analysis.py has the worked ones)


@quick
@given(r1=st.floats(0.0, 1.0), r2=st.floats(0.0, 1.0), eta=fraction, n=st.integers(2, 4096))
def test_a_slower_suspect_never_costs_less(r1: float, r2: float, eta: float, n: int) -> None:
    w = _workload(gpus=n, overlap=eta, compute_seconds=1.0)
    lo, hi = sorted((r1, r2))
    slow, fast = cost.impact(lo, 1.25e9, w), cost.impact(hi, 1.25e9, w)
    assert slow.step_slowdown * (1 + 1e-12) >= fast.step_slowdown >= 1 - 1e-12
    assert slow.gpu_hours_per_day * (1 + 1e-12) >= fast.gpu_hours_per_day
    assert 0 <= slow.gpu_hours_per_day <= n * 24


def test_the_impact_at_its_limits() -> None:
    w = _workload(gpus=64, compute_seconds=1.0)
    at_reference = cost.impact(1.0, 1.25e9, w)
    assert at_reference.step_slowdown == 1.0 and at_reference.gpu_hours_per_day == 0.0
    # Nothing gets through: the all-reduce never completes and the job loses every GPU-hour.
    dead = cost.impact(0.0, 1.25e9, w)
    assert math.isinf(dead.step_slowdown) and math.isinf(dead.allreduce_slowdown)
    assert dead.gpu_hours_per_day == 64 * 24
    assert dead.to_dict()["step_slowdown"] is None and dead.to_dict()["allreduce_slowdown"] is None
    # One GPU reduces nothing: no price whatever the bandwidth.
    alone = cost.impact(0.0, 1.25e9, _workload(gpus=1))
    assert alone.step_slowdown == 1.0 and alone.gpu_hours_per_day == 0.0
    # The slowdown of the step model, as `model` computes it, without a latency term.
    assert cost.impact(0.3, 1.25e9, w).step_slowdown == pytest.approx(cost.slowdown(w, 1.25e9, 0.3 * 1.25e9))
    with pytest.raises(ValueError):
        cost.impact(-0.1, 1.25e9, w)


# --- the command ----------------------------------------------------------------------------

ARGS = [
    "model",
    "--params",
    "7B",
    "--bytes-per-param",
    "2",
    "--gpus",
    "8",
    "--bandwidth",
    "400Gbit/s",
    "--compute-seconds",
    "0.0035",
]


def test_model_json_has_spec_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gradient_bytes"] == 14e9
    assert doc["allreduce_seconds"] == pytest.approx(0.49)
    assert doc["step_seconds"] == pytest.approx(0.4935)
    assert doc["comm_compute_ratio"] == pytest.approx(140)
    assert doc["scaling_efficiency"] == pytest.approx(0.0035 / 0.4935)
    # 90% by default: comm may take C/9, so B = 24.5 GB / (3.5 ms / 9).
    assert doc["bandwidth_for_target_bytes_per_second"] == pytest.approx(24.5e9 / (0.0035 / 9))
    assert doc["target_efficiency"] == 0.9


def test_model_table_prints_gb_and_gib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--overlap", "0.5", "--accumulation", "4"]) == 0
    out = capsys.readouterr().out
    assert "14.00 GB (13.04 GiB)" in out
    assert "490.0 ms" in out
    assert "communication-bound" in out
    assert "k=4 micro-batches" in out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--bandwidth", "fast", "expected a rate"),
        ("--params", "seven", "expected a count"),
        ("--overlap", "2", "overlap must be between 0 and 1"),
        ("--target-efficiency", "0", "target efficiency"),
        ("--bandwidth", None, "--bandwidth is required"),
        ("--node", "h3", "give --prometheus URL"),
        ("--path", "h2,h5", "give --prometheus URL"),
        ("--prometheus", "http://127.0.0.1:9", "name the --node NAME or the --path A,B"),
    ],
)
def test_model_refuses_bad_input_with_exit_2(
    flag: str, value: str | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = list(ARGS)
    if flag in args and value is None:
        del args[args.index(flag) : args.index(flag) + 2]
    elif flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_model_runs_as_the_installed_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "clusterhealth.agent.cli", *ARGS, "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["allreduce_seconds"] == pytest.approx(0.49)
