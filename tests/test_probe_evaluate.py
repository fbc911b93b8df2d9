"""Probe outcomes from real captured outputs (tests/fixtures), table-driven.

The run results are built by hand where the case is about the exit status the capture came with
(a real NCCL failure cannot be reproduced here); one test runs a real process end to end.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probes.evaluate import RESULTS, ProbeOutcome, evaluate, skipped
from clusterhealth.checks.probes.runner import RunResult, run

FIXTURES = Path(__file__).parent / "fixtures"
GB = 1e9


def capture(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text()


def ran(
    stdout: str = "",
    exit_code: int | None = 0,
    *,
    signal_number: int | None = None,
    timed_out: bool = False,
    error: str | None = None,
    program: str = "all_reduce_perf",
) -> RunResult:
    return RunResult(
        argv=(f"/opt/nccl-tests/build/{program}", "-b", "8", "-e", "16G"),
        exit_code=exit_code,
        signal=signal_number,
        timed_out=timed_out,
        duration_seconds=12.5,
        stdout=stdout,
        stderr="",
        output_truncated=False,
        error=error,
    )


@dataclass(frozen=True)
class Case:
    kind: str
    fixture: str | None  # None: no parse (a probe whose output is not read)
    run: RunResult
    expected: float | None
    result: str
    reason_has: tuple[str, ...]
    bandwidth: float | None
    wrong: int | None = None


NCCL_8X_H100 = "08_single_node_8x_h100_allreduce.txt"  # 469.715 GB/s at the large sizes (footer: 439.369)
NCCL_WRONG = "06_wrong_nonzero_2node_gh200_slingshot.txt"  # 128 wrong values, exit 7 in real life

CASES = {
    "no baseline yet: ok": Case(
        kind="nccl-tests",
        fixture=NCCL_8X_H100,
        run=ran(),
        expected=None,
        result="ok",
        reason_has=("469.71 GB/s", "no expected"),
        bandwidth=469.715 * GB,
        wrong=0,
    ),
    "above the expectation: ok": Case(
        kind="nccl-tests",
        fixture=NCCL_8X_H100,
        run=ran(),
        expected=400 * GB,
        result="ok",
        reason_has=("117% of the expected 400.00 GB/s",),
        bandwidth=469.715 * GB,
        wrong=0,
    ),
    "just above the threshold: ok": Case(
        kind="nccl-tests",
        fixture=NCCL_8X_H100,
        run=ran(),
        expected=520 * GB,
        result="ok",
        reason_has=("90% of the expected 520.00 GB/s",),
        bandwidth=469.715 * GB,
        wrong=0,
    ),
    "below 90% of the expectation: degraded": Case(
        kind="nccl-tests",
        fixture=NCCL_8X_H100,
        run=ran(),
        expected=530 * GB,
        result="degraded",
        reason_has=("469.71 GB/s is 89% of the expected 530.00 GB/s", "below the 90% threshold"),
        bandwidth=469.715 * GB,
        wrong=0,
    ),
    "wrong values, exit 7: failed": Case(
        kind="nccl-tests",
        fixture=NCCL_WRONG,
        run=ran(exit_code=7),
        expected=4 * GB,
        result="failed",
        reason_has=("exited 7: wrong results", "(128 wrong values, 4 out-of-bounds tests)"),
        bandwidth=22.123333333333335 * GB,
        wrong=128,
    ),
    "wrong values although exit 0: failed": Case(
        kind="nccl-tests",
        fixture=NCCL_WRONG,
        run=ran(),
        expected=None,
        result="failed",
        reason_has=("all_reduce_perf exited 0 but reports wrong results (128 wrong values",),
        bandwidth=22.123333333333335 * GB,
        wrong=128,
    ),
    "NCCL error, exit 3: failed": Case(
        kind="nccl-tests",
        fixture="03_test_nccl_failure_2gpu.txt",
        run=ran(exit_code=3),
        expected=400 * GB,
        result="failed",
        reason_has=("exited 3: NCCL error", "Test NCCL failure"),
        bandwidth=None,
        wrong=None,
    ),
    "CUDA error, exit 2: failed": Case(
        kind="nccl-tests",
        fixture="12_test_cuda_failure_8x_h100.txt",
        run=ran(exit_code=2),
        expected=None,
        result="failed",
        reason_has=("exited 2: CUDA error",),
        bandwidth=None,
        wrong=None,
    ),
    "validation off: wrong values unknown": Case(
        kind="nccl-tests",
        fixture="10_multinode_2x8_h100_srun_prefixed_nocheck.txt",
        run=ran(),
        expected=150 * GB,
        result="ok",
        reason_has=("103% of the expected",),
        bandwidth=154.49833333333333 * GB,
        wrong=None,
    ),
    "segfault: failed": Case(
        kind="nccl-tests",
        fixture=NCCL_8X_H100,
        run=ran(exit_code=None, signal_number=signal.SIGSEGV),
        expected=None,
        result="failed",
        reason_has=("all_reduce_perf was killed by SIGSEGV",),
        bandwidth=469.715 * GB,
        wrong=0,
    ),
    "timeout wins over everything": Case(
        kind="nccl-tests",
        fixture=NCCL_8X_H100,
        run=ran(exit_code=None, signal_number=signal.SIGKILL, timed_out=True),
        expected=500 * GB,
        result="timeout",
        reason_has=("all_reduce_perf timed out", "12.5 s", "ignored SIGTERM"),
        bandwidth=469.715 * GB,
        wrong=0,
    ),
    "not installed: failed": Case(
        kind="nccl-tests",
        fixture=None,
        run=ran(exit_code=None, error="executable not found: all_reduce_perf"),
        expected=400 * GB,
        result="failed",
        reason_has=("executable not found: all_reduce_perf",),
        bandwidth=None,
        wrong=None,
    ),
    "iperf3 refused, exit 0: failed": Case(
        kind="iperf3",
        fixture="04_connection_refused.json",
        run=ran(program="iperf3"),
        expected=None,
        result="failed",
        reason_has=("iperf3 exited 0 but its output reports a failure", "Connection refused"),
        bandwidth=None,
        wrong=None,
    ),
    "iperf3 server killed: failed": Case(
        kind="iperf3",
        fixture="05_server_killed_mid_test.json",
        run=ran(program="iperf3"),
        expected=None,
        result="failed",
        reason_has=("the server has terminated",),
        bandwidth=None,
        wrong=None,
    ),
    "iperf3 in Gbit/s: degraded": Case(
        kind="iperf3",
        fixture="01_tcp_loopback.json",
        run=ran(program="iperf3"),
        expected=2.5 * GB,
        result="degraded",
        reason_has=("13.13 Gbit/s is 66% of the expected 20.00 Gbit/s",),
        bandwidth=1641815445.4174755,
        wrong=None,
    ),
    "ib_write_bw ok": Case(
        kind="ib_write_bw",
        fixture="01_sweep_gbits_roce_gpudirect.txt",
        run=ran(program="ib_write_bw"),
        expected=11 * GB,
        result="ok",
        reason_has=("92.39 Gbit/s is 105% of the expected 88.00 Gbit/s",),
        bandwidth=11548750000.0,
        wrong=None,
    ),
    "ib_write_bw cannot connect, exit 1: failed": Case(
        kind="ib_write_bw",
        fixture="03_connect_failure.txt",
        run=ran(exit_code=1, program="ib_write_bw"),
        expected=None,
        result="failed",
        reason_has=("ib_write_bw exited 1", "Couldn't connect to 192.168.125.211:18515"),
        bandwidth=None,
        wrong=None,
    ),
    "ib_write_bw cut short, exit 0: failed": Case(
        kind="ib_write_bw",
        fixture="05_truncated_mbps_server_side.txt",
        run=ran(program="ib_write_bw"),
        expected=None,
        result="failed",
        reason_has=("output is incomplete",),
        bandwidth=None,
        wrong=None,
    ),
    "unparsed probe, exit 0: ok": Case(
        kind="command",
        fixture=None,
        run=ran(program="check-fabric"),
        expected=None,
        result="ok",
        reason_has=("check-fabric finished, no expected",),
        bandwidth=None,
    ),
    "unparsed probe with an expectation: failed": Case(
        kind="command",
        fixture=None,
        run=ran(program="check-fabric"),
        expected=10 * GB,
        result="failed",
        reason_has=("no bandwidth figure",),
        bandwidth=None,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_outcome(case: Case) -> None:
    parsed = None
    if case.fixture is not None:
        parsed = parse(case.kind, capture(case.kind, case.fixture))
    outcome = evaluate(case.kind, case.run, parsed, case.expected, 0.9)
    assert outcome.result == case.result, outcome.reason
    for fragment in case.reason_has:
        assert fragment in outcome.reason
    assert outcome.bandwidth_bytes_per_second == pytest.approx(case.bandwidth)
    assert outcome.expected_bytes_per_second == case.expected
    assert outcome.wrong_values == case.wrong
    assert outcome.success is (case.result == "ok")


def test_output_cut_before_the_footer_fails_even_with_exit_0() -> None:
    text = capture("nccl-tests", "01_multinode_2x8_h100_allreduce_ib.txt")
    cut = text[: text.index("# Out of bounds values")]
    outcome = evaluate("nccl-tests", ran(cut), parse("nccl-tests", cut), 100 * GB, 0.9)
    assert outcome.result == "failed"
    assert "incomplete" in outcome.reason and "footer" in outcome.reason
    assert outcome.bandwidth_bytes_per_second is None


def test_degraded_fraction_sets_the_threshold() -> None:
    text = capture("nccl-tests", NCCL_8X_H100)
    parsed = parse("nccl-tests", text)
    assert evaluate("nccl-tests", ran(text), parsed, 530 * GB, 0.9).result == "degraded"
    assert evaluate("nccl-tests", ran(text), parsed, 530 * GB, 0.85).result == "ok"


def test_a_real_run_end_to_end() -> None:
    # `cat` stands in for the tool: a real process whose stdout is a real nccl-tests capture.
    result = run(["cat", str(FIXTURES / "nccl-tests" / NCCL_8X_H100)], timeout=10)
    outcome = evaluate("nccl-tests", result, parse("nccl-tests", result.output), 530 * GB, 0.9)
    assert (outcome.result, outcome.bandwidth_bytes_per_second) == ("degraded", pytest.approx(469.715 * GB))


def test_a_real_missing_binary_end_to_end() -> None:
    result = run(["all_reduce_perf-absent", "-g", "8"], timeout=10)
    outcome = evaluate("nccl-tests", result, None, None, 0.9)
    assert outcome == ProbeOutcome("failed", "executable not found: all_reduce_perf-absent")


def test_skipped_carries_the_idle_guards_reason() -> None:
    outcome = skipped("GPU 3 runs 2 compute processes (pids 48211, 48212)")
    assert (outcome.result, outcome.success, outcome.bandwidth_bytes_per_second) == ("skipped", False, None)
    assert outcome.reason == "GPU 3 runs 2 compute processes (pids 48211, 48212)"


def test_to_dict_is_json() -> None:
    text = capture("nccl-tests", NCCL_WRONG)
    outcome = evaluate("nccl-tests", ran(text, 7), parse("nccl-tests", text), None, 0.9)
    assert json.loads(json.dumps(outcome.to_dict())) == {
        "result": "failed",
        "reason": "all_reduce_perf exited 7: wrong results, or average bus bandwidth below "
        "NCCL_TESTS_MIN_BW (128 wrong values, 4 out-of-bounds tests)",
        "success": False,
        "bandwidth_bytes_per_second": pytest.approx(22.123333333333335 * GB),
        "expected_bytes_per_second": None,
        "wrong_values": 128,
    }


def test_results_are_the_metric_label_values() -> None:
    assert RESULTS == ("ok", "degraded", "failed", "timeout", "skipped")


@pytest.mark.parametrize(
    ("expected", "fraction"), [(0.0, 0.9), (-1.0, 0.9), (float("nan"), 0.9), (1.0, 0), (1.0, 1.5)]
)
def test_nonsense_thresholds_are_rejected(expected: float, fraction: float) -> None:
    with pytest.raises(ValueError):
        evaluate("nccl-tests", ran(), None, expected, fraction)
