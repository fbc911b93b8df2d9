"""Probe outcomes from real captured outputs (tests/fixtures), table-driven.

The run results are built by hand where the case is about the exit status the capture came with
(a real NCCL failure cannot be reproduced here); one test runs a real process end to end.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import ProbeParse, parse
from clusterhealth.checks.probe_parsers.nccl_tests import NcclTestsResult
from clusterhealth.checks.probe_parsers.nccl_transport import Transport, read_transport
from clusterhealth.checks.probes.baseline import BaselineStore
from clusterhealth.checks.probes.evaluate import RESULTS, ProbeOutcome, evaluate, skipped
from clusterhealth.checks.probes.runner import RunResult, run
from clusterhealth.checks.probes.transport import NodeLinks, read_node_links
from clusterhealth.exporters.gpu import GpuReading, GpuState, NvlinkReading

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
        "transport": {"net": None, "gdrdma": None, "intra": None},
    }


def test_results_are_the_metric_label_values() -> None:
    assert RESULTS == ("ok", "degraded", "failed", "timeout", "skipped")


@pytest.mark.parametrize(
    ("expected", "fraction"), [(0.0, 0.9), (-1.0, 0.9), (float("nan"), 0.9), (1.0, 0), (1.0, 1.5)]
)
def test_nonsense_thresholds_are_rejected(expected: float, fraction: float) -> None:
    with pytest.raises(ValueError):
        evaluate("nccl-tests", ran(), None, expected, fraction)


# -- NCCL's transport: a fallback where the node has better is degraded ------------------------

DEBUG_INFO = FIXTURES / "nccl-tests" / "nccl-debug-info"
SOCKETS = "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log"  # Socket, P2P
SHM = "nccl-tests-issue-228_shm_on_nvswitch.log"  # SHM on an NVSwitch system
MIXED = "nccl-issue-1817_mixed_shm_and_p2p.log"
ON_IB = "nccl-issue-429_p2p_direct_pointer_and_ib_gdrdma.log"  # IB/GDRDMA, P2P
RDMA_NODE = NodeLinks.of(["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5"], None)
NVLINK_NODE = NodeLinks.of(None, 144)
BOTH = NodeLinks(RDMA_NODE.rdma, NVLINK_NODE.nvlink)


def finished_with(info: str) -> tuple[str, ProbeParse]:
    """Capture 08's finished run (469.715 GB/s), as if its INFO lines had been those of the real
    output `info`: no capture holds both a whole table and a fallback, so the transport read from
    one real output is put on the parse of another."""
    text = capture("nccl-tests", NCCL_8X_H100)
    parsed = parse("nccl-tests", text)
    assert isinstance(parsed, NcclTestsResult) and not parsed.transport.said
    transport = read_transport((DEBUG_INFO / info).read_text())
    return text, dataclasses.replace(parsed, transport=transport)


@pytest.mark.parametrize(
    ("info", "node", "expected", "result", "reason"),
    [
        (
            SOCKETS,
            RDMA_NODE,
            None,
            "degraded",
            "all_reduce_perf finished: 469.71 GB/s, but NCCL used sockets (NET/Socket) although the "
            "node has RDMA devices (mlx5_0, mlx5_1, mlx5_2, mlx5_3 and 2 more)",
        ),
        (
            SHM,
            NVLINK_NODE,
            None,
            "degraded",
            "all_reduce_perf finished: 469.71 GB/s, but NCCL connected its GPUs through shared memory "
            "(SHM) although the node has 144 NVLink links up: peer access is off",
        ),
        (
            MIXED,
            NVLINK_NODE,
            400 * GB,
            "degraded",
            "NCCL connected some of its GPUs through shared memory (SHM) although the node has 144 "
            "NVLink links up: peer access is off (469.71 GB/s is 117% of the expected 400.00 GB/s)",
        ),
        (
            SOCKETS,
            RDMA_NODE,
            530 * GB,
            "degraded",
            "NCCL used sockets (NET/Socket) although the node has RDMA devices (mlx5_0, mlx5_1, mlx5_2, "
            "mlx5_3 and 2 more); 469.71 GB/s is 89% of the expected 530.00 GB/s, below the 90% threshold",
        ),
        # What it has: sockets on an Ethernet-only node, SHM where no NVLink is up.
        (SOCKETS, NVLINK_NODE, None, "ok", "no expected bandwidth"),
        (SHM, RDMA_NODE, 400 * GB, "ok", "469.71 GB/s is 117% of the expected 400.00 GB/s"),
        (ON_IB, BOTH, None, "ok", "no expected bandwidth"),
        # Facts not known: not judged.
        (SOCKETS, NodeLinks(), None, "ok", "no expected bandwidth"),
        (SOCKETS, None, None, "ok", "no expected bandwidth"),
    ],
)
def test_a_transport_fallback_where_the_node_has_better_is_degraded(
    info: str, node: NodeLinks | None, expected: float | None, result: str, reason: str
) -> None:
    text, parsed = finished_with(info)
    outcome = evaluate("nccl-tests", ran(text), parsed, expected, 0.9, node)
    assert outcome.result == result
    assert reason in outcome.reason
    assert outcome.transport == read_transport((DEBUG_INFO / info).read_text())
    assert outcome.bandwidth_bytes_per_second == pytest.approx(469.715 * GB)


def test_a_failed_run_stays_failed_whatever_its_transport() -> None:
    text = (DEBUG_INFO / SOCKETS).read_text()
    outcome = evaluate("nccl-tests", ran(text), parse("nccl-tests", text), None, 0.9, BOTH)
    assert outcome.result == "failed" and "output is incomplete" in outcome.reason
    assert outcome.transport == Transport("Socket", False, "P2P")


def test_a_run_without_info_lines_is_not_judged() -> None:
    text = capture("nccl-tests", NCCL_8X_H100)
    outcome = evaluate("nccl-tests", ran(text), parse("nccl-tests", text), None, 0.9, BOTH)
    assert outcome.result == "ok" and outcome.transport == Transport()


def test_kinds_that_do_not_say_have_no_transport() -> None:
    text = capture("iperf3", "01_tcp_loopback.json")
    outcome = evaluate("iperf3", ran(text, program="iperf3"), parse("iperf3", text), None, 0.9, BOTH)
    assert outcome.transport is None


def test_a_run_that_fell_back_does_not_feed_the_learned_baseline(tmp_path: Path) -> None:
    baselines = BaselineStore(tmp_path, window=10, min_runs=1)
    text, parsed = finished_with(SOCKETS)
    outcome = evaluate("nccl-tests", ran(text), parsed, None, 0.9, RDMA_NODE)
    assert not outcome.success and not baselines.learn("nccl", "", outcome)
    assert baselines.expected("nccl", "") is None


def test_the_transport_survives_the_state_file() -> None:
    text, parsed = finished_with(MIXED)
    outcome = evaluate("nccl-tests", ran(text), parsed, None, 0.9, NVLINK_NODE)
    kept = json.loads(json.dumps(dataclasses.asdict(outcome)))
    assert ProbeOutcome.from_state(kept) == outcome
    # A state file written before the transport was kept reads as "not said".
    del kept["transport"]
    assert ProbeOutcome.from_state(kept).transport is None
    with pytest.raises(ValueError):
        ProbeOutcome.from_state({**kept, "transport": {"net": "IB"}})


SYSFS = FIXTURES / "sysfs" / "cluster-node" / "sys"  # mlx5_0..mlx5_9 and irdma0


def gpus(*links_up: tuple[bool, ...]) -> GpuState:
    return GpuState(
        [
            GpuReading(i, f"GPU-{i}", True, nvlinks=[NvlinkReading(n, up) for n, up in enumerate(links)])
            for i, links in enumerate(links_up)
        ],
        "550.54.15",
    )


def test_the_node_links_are_the_devices_the_rdma_collector_selects_and_the_nvlinks_up() -> None:
    everything = read_node_links(SYSFS, lambda device: True, gpus((True, True, False), (True, False)))
    assert everything == NodeLinks(
        "RDMA devices (irdma0, mlx5_0, mlx5_1, mlx5_2 and 7 more)", "3 NVLink links up"
    )
    some = read_node_links(SYSFS, lambda device: device in ("mlx5_3", "mlx5_4"), gpus((False,)))
    assert some == NodeLinks("RDMA devices (mlx5_3, mlx5_4)", None)
    # Not known: the rdma collector off (no sysfs root given), GPUs not read yet, sysfs without
    # class/infiniband; and a filter that selects nothing.
    assert read_node_links(None, lambda device: True, None) == NodeLinks()
    assert read_node_links(SYSFS.parent, lambda device: True, gpus()) == NodeLinks()
    assert read_node_links(SYSFS, lambda device: False, gpus((False, False))) == NodeLinks()
