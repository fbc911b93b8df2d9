"""`clusterhealth probe parse`: the real command on real captures prints the contract's JSON keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import FIXTURES, run_cli

NCCL = FIXTURES / "nccl-tests"


def test_nccl_tests_capture_parses_to_the_documented_keys() -> None:
    result = run_cli(
        "probe", "parse", "--kind", "nccl-tests", str(NCCL / "01_multinode_2x8_h100_allreduce_ib.txt")
    )
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    for key in ("collective", "ranks", "rows", "avg_bus_bandwidth_gbps", "peak_bus_bandwidth_gbps"):
        assert key in parsed
    for key in ("out_of_bounds", "errors", "verdict"):
        assert key in parsed
    assert parsed["collective"] == "all_reduce"
    assert parsed["ranks"] == 16
    assert parsed["avg_bus_bandwidth_gbps"] == pytest.approx(139.56)
    assert parsed["verdict"] == "ok"
    row = parsed["rows"][-1]
    assert set(row) >= {"size_bytes", "count", "type", "redop", "out_of_place", "in_place"}
    assert set(row["out_of_place"]) >= {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}


def test_wrong_results_capture_has_its_verdict() -> None:
    result = run_cli(
        "probe", "parse", "--kind", "nccl-tests", str(NCCL / "06_wrong_nonzero_2node_gh200_slingshot.txt")
    )
    parsed = json.loads(result.stdout)
    assert parsed["verdict"] == "wrong_results"
    assert parsed["out_of_bounds"] == 4
    assert result.returncode == 2
    assert result.stderr.startswith("failed: ") and "wrong results" in result.stderr


# `probe parse` exits as `probe run` does (SPEC): 0 ok, 1 degraded, 2 failed, incomplete or wrong.
ALLREDUCE = NCCL / "01_multinode_2x8_h100_allreduce_ib.txt"


@pytest.mark.parametrize(
    ("expect", "code", "summary"),
    [
        (None, 0, "ok: nccl-tests finished: 467.98 GB/s"),
        ("400 GB/s", 0, "ok: 467.98 GB/s is 117% of the expected 400.00 GB/s"),
        ("600 GB/s", 0, "ok: "),  # 78% of 600: above the 0.75 asked for below
        ("700 GB/s", 1, "degraded: 467.98 GB/s is 67% of the expected 700.00 GB/s"),
    ],
)
def test_exit_code_and_summary_follow_the_verdict(expect: str | None, code: int, summary: str) -> None:
    options = ["--expect", expect, "--degraded-fraction", "0.75"] if expect else []
    result = run_cli("probe", "parse", "--kind", "nccl-tests", *options, str(ALLREDUCE))
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith(summary) and result.stderr.count("\n") == 1, result.stderr
    assert json.loads(result.stdout)["verdict"] == "ok"


def test_an_incomplete_output_exits_2(tmp_path: Path) -> None:
    cut = tmp_path / "cut.txt"
    cut.write_text(ALLREDUCE.read_text()[:1500])
    result = run_cli("probe", "parse", "--kind", "nccl-tests", str(cut))
    assert json.loads(result.stdout)["verdict"] == "incomplete"
    assert result.returncode == 2 and result.stderr.startswith("failed: ")


def test_help_says_the_gbps_fields_are_gigabytes_a_second() -> None:
    result = run_cli("probe", "parse", "--help")
    assert "GB/s" in result.stdout and "*_gbps" in result.stdout and "0 ok, 1 degraded" in result.stdout


def test_iperf3_json_from_stdin() -> None:
    text = (FIXTURES / "iperf3" / "01_tcp_loopback.json").read_text()
    result = run_cli("probe", "parse", "--kind", "iperf3", "-", input=text)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "ok"


def test_unknown_kind_and_missing_file_are_usage_errors() -> None:
    assert run_cli("probe", "parse", "--kind", "hpl", "x").returncode == 2
    missing = run_cli("probe", "parse", "--kind", "iperf3", "/nonexistent/out.json")
    assert missing.returncode == 2
    assert "cannot read /nonexistent/out.json" in missing.stderr


# NCCL's transport: the JSON says what the INFO lines said, and --has-rdma / --has-nvlink state what
# the node that printed them had, as `probe run` reads it from sysfs and NVML.
DEBUG_INFO = NCCL / "nccl-debug-info"


def test_the_json_carries_the_transport_the_info_lines_say() -> None:
    result = run_cli(
        "probe", "parse", "--kind", "nccl-tests", str(DEBUG_INFO / "nccl-tests-issue-166_socket_and_shm.log")
    )
    assert json.loads(result.stdout)["transport"] == {"net": "Socket", "gdrdma": False, "intra": "SHM"}
    quiet = run_cli("probe", "parse", "--kind", "nccl-tests", str(ALLREDUCE))
    assert json.loads(quiet.stdout)["transport"] == {"net": None, "gdrdma": None, "intra": None}


@pytest.mark.parametrize(
    ("info", "flags", "code", "summary"),
    [
        (
            "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log",
            ["--has-rdma"],
            1,
            "degraded: nccl-tests finished: 467.98 GB/s, but NCCL used sockets (NET/Socket) although the "
            "node has RDMA devices (--has-rdma)",
        ),
        ("nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log", ["--has-nvlink"], 0, "ok: "),
        (
            "nccl-tests-issue-228_shm_on_nvswitch.log",
            ["--has-nvlink", "--has-rdma"],
            1,
            "degraded: nccl-tests finished: 467.98 GB/s, but NCCL connected its GPUs through shared "
            "memory (SHM) although the node has NVLink up (--has-nvlink): peer access is off",
        ),
        ("nccl-tests-issue-228_shm_on_nvswitch.log", [], 0, "ok: "),
    ],
)
def test_a_fallback_the_node_had_better_than_exits_1(
    tmp_path: Path, info: str, flags: list[str], code: int, summary: str
) -> None:
    # No capture holds both a whole table and a fallback: the real INFO lines of one output go
    # before the real table of another, where NCCL prints them (as capture 11 shows).
    output = tmp_path / "output.txt"
    output.write_text((DEBUG_INFO / info).read_text() + ALLREDUCE.read_text())
    result = run_cli("probe", "parse", "--kind", "nccl-tests", *flags, str(output))
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith(summary), result.stderr
