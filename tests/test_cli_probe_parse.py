"""`clusterhealth probe parse`: the real command on real captures prints the contract's JSON keys."""

from __future__ import annotations

import json

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


def test_iperf3_json_from_stdin() -> None:
    text = (FIXTURES / "iperf3" / "01_tcp_loopback.json").read_text()
    result = run_cli("probe", "parse", "--kind", "iperf3", "-", input=text)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "ok"


def test_unknown_kind_and_missing_file_are_usage_errors() -> None:
    assert run_cli("probe", "parse", "--kind", "hpl", "x").returncode == 2
    missing = run_cli("probe", "parse", "--kind", "iperf3", "/nonexistent/out.json")
    assert missing.returncode == 1
    assert "cannot read /nonexistent/out.json" in missing.stderr
