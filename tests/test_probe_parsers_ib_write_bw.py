"""ib_write_bw parser, tested on real perftest outputs (tests/fixtures/ib_write_bw/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probe_parsers.ib_write_bw import (
    GIGABIT_IN_BYTES,
    MEBIBYTE,
    UNIT_BYTES,
    BandwidthRow,
    IbWriteBwResult,
    parse_ib_write_bw,
)

FIXTURES = Path(__file__).parent / "fixtures" / "ib_write_bw"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_units_follow_perftests_format_factor() -> None:
    # print_report_bw: format_factor = (report_fmt == MBS) ? 0x100000 : 125000000. Perftest 24.07
    # relabelled MB/sec as MiB/sec without changing the factor.
    assert UNIT_BYTES == {"MB/sec": 1048576, "MiB/sec": 1048576, "Gb/sec": 10**9 // 8}
    assert MEBIBYTE == 1048576
    assert GIGABIT_IN_BYTES * 8 == 10**9


def test_gbits_sweep_headline_is_the_largest_message() -> None:
    result = parse_ib_write_bw(capture("01_sweep_gbits_roce_gpudirect.txt"))

    assert result.verdict == "ok"
    assert result.errors == ()
    assert result.test == "RDMA_Write BW Test"
    assert result.device == "mlx5_0"
    assert result.link_type == "Ethernet"
    assert result.connection_type == "RC"
    assert result.qps == 1
    assert result.unit == "Gb/sec"
    assert len(result.rows) == 23
    assert result.rows[0] == BandwidthRow(2, 5000, 0.11, 0.11, 6.897101, GIGABIT_IN_BYTES)
    assert result.rows[-1] == BandwidthRow(8388608, 5000, 92.39, 92.39, 0.001377, GIGABIT_IN_BYTES)
    assert [row.size_bytes for row in result.rows] == [2**n for n in range(1, 24)]
    assert result.message_size_bytes == 8388608
    assert result.iterations == 5000
    assert result.bandwidth_bytes_per_second == pytest.approx(11_548_750_000)  # 92.39 Gb/sec
    assert result.peak_bandwidth_bytes_per_second == pytest.approx(11_548_750_000)  # 92.39 Gb/sec


def test_run_infinitely_with_eight_qps() -> None:
    result = parse("ib_write_bw", capture("02_run_infinitely_8qp_gbits.txt"))

    assert isinstance(result, IbWriteBwResult)
    assert result.verdict == "ok"
    assert result.device == "mlx5_bond_1"
    assert result.qps == 8
    assert result.rows == (BandwidthRow(65536, 1765470, 185.37, 184.94, 0.352743, GIGABIT_IN_BYTES),)
    assert result.bandwidth_bytes_per_second == pytest.approx(184.94 * 125e6)
    assert result.peak_bandwidth_bytes_per_second == pytest.approx(185.37 * 125e6)


def test_connection_failure() -> None:
    result = parse_ib_write_bw(capture("03_connect_failure.txt"))

    assert result.verdict == "failed"
    assert result.errors == (
        "Couldn't connect to 192.168.125.211:18515",
        "Unable to open file descriptor for socket connection Unable to init the socket connection",
    )
    assert result.rows == ()
    assert result.bandwidth_bytes_per_second is None
    assert result.peak_bandwidth_bytes_per_second is None


def test_node_without_rdma_device() -> None:
    result = parse_ib_write_bw(capture("04_no_rdma_device_local.txt"))

    assert result.verdict == "failed"
    assert result.errors == ("Did not detect devices", "Unable to find the Infiniband/RoCE device")
    assert result.bandwidth_bytes_per_second is None


def test_truncated_server_side_capture_in_mb_per_sec() -> None:
    result = parse_ib_write_bw(capture("05_truncated_mbps_server_side.txt"))

    assert result.verdict == "incomplete"
    assert result.unit == "MB/sec"
    assert result.device == "mlx5_0"
    assert result.rows == ()
    assert result.bandwidth_bytes_per_second is None
    assert result.errors == (
        "output ends before the result row: the run did not finish (crash, kill or timeout)",
    )


def test_cut_through_a_sweep_keeps_the_rows_printed() -> None:
    text = capture("01_sweep_gbits_roce_gpudirect.txt")
    result = parse_ib_write_bw(text[: text.index("      8192       5000")])

    assert result.verdict == "ok"
    assert result.rows[-1].size_bytes == 4096
    assert result.bandwidth_bytes_per_second == pytest.approx(92.06 * 125e6)


def test_a_peak_printed_as_zero_was_not_measured() -> None:
    # perftest prints 0.00 for the peak under -D (duration mode); capture 02 with that one cell.
    text = capture("02_run_infinitely_8qp_gbits.txt").replace(
        " 65536      1765470            185.37", " 65536      1765470            0.00  "
    )
    result = parse_ib_write_bw(text)

    assert result.rows[0].bw_peak is None
    assert result.peak_bandwidth_bytes_per_second is None
    assert result.bandwidth_bytes_per_second == pytest.approx(184.94 * 125e6)


def test_mb_per_sec_is_mebibytes() -> None:
    row = BandwidthRow(65536, 5000, 110.31, 110.28, 0.001764, MEBIBYTE)

    assert row.average_bytes_per_second == pytest.approx(110.28 * 1048576)
    assert row.peak_bytes_per_second == pytest.approx(110.31 * 1048576)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.txt")))
def test_to_dict_is_strict_json(name: str) -> None:
    result = parse_ib_write_bw(capture(name))
    as_dict = json.loads(json.dumps(result.to_dict(), allow_nan=False))

    assert as_dict["verdict"] == result.verdict
    assert len(as_dict["rows"]) == len(result.rows)
    assert as_dict["bandwidth_bytes_per_second"] == result.bandwidth_bytes_per_second


@pytest.mark.parametrize("garbage", ["", "\n \n", "hello world", "\x00\x01\x02", "65536 5000 1.0 2.0 3.0"])
def test_garbage_is_incomplete_with_an_error(garbage: str) -> None:
    result = parse_ib_write_bw(garbage)

    assert result.verdict == "incomplete"
    assert result.errors == ("no ib_write_bw result table or error message found",)
    assert result.rows == ()


def test_a_qp_count_of_thousands_of_digits_is_unreadable_not_raised() -> None:
    # Found by tests/test_fuzz.py: int() of thousands of digits raised out of the parser.
    text = capture("01_sweep_gbits_roce_gpudirect.txt").replace(
        "Number of qps   : 1", "Number of qps   : " + "9" * 5000
    )
    assert "9" * 5000 in text
    result = parse_ib_write_bw(text)
    assert result.qps is None
    assert result.verdict == "ok"
