"""nccl-tests parser, tested on every real capture in tests/fixtures/nccl-tests.

Expected values are read off the captures by eye; the peaks are the mean of the six busbw cells of
the three largest sizes, worked out by hand from the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probe_parsers.nccl_tests import (
    NcclTestsResult,
    Placement,
    Row,
    exit_code_meaning,
    nccl_version_from_code,
    parse_nccl_tests,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


@dataclass(frozen=True)
class Expected:
    collective: str | None
    ranks: int | None
    hosts: tuple[str, ...]
    rows: int
    avg: float | None
    peak: float | None
    out_of_bounds: int | None
    wrong_total: int | None
    verdict: str
    errors: int
    nccl_version: str | None
    nccl_tests_version: str | None
    validation: bool | None


EXPECTED = {
    "01_multinode_2x8_h100_allreduce_ib.txt": Expected(
        "all_reduce", 16, ("bm-h100-01", "bm-h100-02"), 32, 139.56,
        (466.52 + 465.91 + 468.46 + 468.67 + 469.21 + 469.10) / 6, 0, 0, "ok", 0, "2.26.2", None, True,
    ),
    "03_test_nccl_failure_2gpu.txt": Expected(
        "all_reduce", 2, ("GENOA-06",), 0, None, None, None, None, "failed", 6, None, None, True,
    ),
    "05_all_gather_2node_gb10_roce.txt": Expected(
        "all_gather", 2, ("promaxgb10-4c75", "promaxgb10-4c99"), 1, 22.9611,
        (22.94 + 22.98) / 2, 0, 0, "ok", 0, "2.28.9", "2.18.5", True,
    ),
    "06_wrong_nonzero_2node_gh200_slingshot.txt": Expected(
        "all_reduce", 2, ("gpu-1-1", "gpu-1-7"), 25, 4.79995,
        (21.14 + 21.34 + 22.35 + 22.24 + 22.87 + 22.80) / 6, 4, 96 + 32, "wrong_results", 2,
        "2.29.2", "2.17.8", True,
    ),
    "08_single_node_8x_h100_allreduce.txt": Expected(
        None, 8, ("node005",), 6, 439.369,
        (465.25 + 464.70 + 468.57 + 469.64 + 473.60 + 476.53) / 6, 0, 0, "ok", 0, None, None, True,
    ),
    "10_multinode_2x8_h100_srun_prefixed_nocheck.txt": Expected(
        None, 16, ("node005", "node007"), 11, 142.735,
        (153.09 + 153.14 + 154.74 + 154.89 + 155.57 + 155.56) / 6, 0, None, "ok", 0, None, None, False,
    ),
    "11_efa_2x8_a100_mpirun_tagged_error_column.txt": Expected(
        None, 16, ("nccl-tests-efa-16-worker-0", "nccl-tests-efa-16-worker-1"), 30, 11.2432,
        (42.48 + 42.46 + 43.36 + 43.24 + 43.81 + 43.72) / 6, 0, None, "ok", 0, "2.9.9", None, True,
    ),
    "12_test_cuda_failure_8x_h100.txt": Expected(
        "all_reduce", None, (), 0, None, None, None, None, "failed", 2, None, None, True,
    ),
    # Tails without the column header: rows, footer and large-message bandwidth all the same.
    "13_rccl_tests_tail_without_header.txt": Expected(
        "all_reduce", None, (), 4, 142.652, (359.35 + 359.28 + 360.04 + 360.56 + 360.98 + 361.17) / 6,
        0, 0, "ok", 0, None, None, None,
    ),
    "14_tail_without_header_linear_sweep.txt": Expected(
        None, None, (), 6, 84.8558,
        (95.75 + 95.92 + 95.67 + 96.47 + 96.42 + 96.33 + 96.45 + 95.50 + 95.77 + 96.69 + 95.74 + 95.94) / 12,
        0, 0, "ok", 0, None, None, None,
    ),
    "15_tail_nccl_info_between_last_row_and_footer.txt": Expected(
        None, None, (), 1, 8.62002, (25.86 + 25.88) / 2, 0, 0, "ok", 0, None, None, None,
    ),
    "16_old_nccl_failure_without_test_prefix_8x_p100.txt": Expected(
        "all_reduce", 8, ("node03",), 0, None, None, None, None, "failed", 1, None, None, True,
    ),
    "17_rccl_tests_nccl_failure_4x_mi210.txt": Expected(
        None, 4, ("sharbox-ultra",), 0, None, None, None, None, "failed", 2, None, None, True,
    ),
    "18_rccl_tests_header_and_first_row_8x_mi300x.txt": Expected(
        None, 8, ("g100n126",), 1, None, None, None, 0, "incomplete", 1, None, None, True,
    ),
    "19_mpijob_launcher_log_rows_after_nccl_info.txt": Expected(
        None, None, (), 5, None, None, None, None, "incomplete", 1, None, None, None,
    ),
    # Closing lines whose `# Avg bus bandwidth` the reporter left out, and no row: it finished,
    # with nothing to measure.
    "20_closing_lines_without_avg_footer_2x_rtx_pro_6000.txt": Expected(
        "all_reduce", None, (), 0, None, None, 0, None, "incomplete", 1, None, None, None,
    ),
    "21_row_cut_by_cuda_failure_without_host_2x_rtx_pro_6000.txt": Expected(
        None, None, (), 0, None, None, None, None, "failed", 1, None, None, None,
    ),
}  # fmt: skip
# Captures that hold the end of a table only: their footer averages rows they do not show.
TAILS = {
    "13_rccl_tests_tail_without_header.txt",
    "14_tail_without_header_linear_sweep.txt",
    "15_tail_nccl_info_between_last_row_and_footer.txt",
}


def test_every_capture_has_expectations() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_headline(name: str) -> None:
    expected = EXPECTED[name]
    result = parse_nccl_tests(capture(name))

    assert result.collective == expected.collective
    assert result.ranks == expected.ranks
    assert result.hosts == expected.hosts
    assert len(result.rows) == expected.rows
    assert result.avg_bus_bandwidth_gbps == expected.avg
    assert result.peak_bus_bandwidth_gbps == pytest.approx(expected.peak)
    assert result.out_of_bounds == expected.out_of_bounds
    assert result.wrong_values_total == expected.wrong_total
    assert result.verdict == expected.verdict
    assert len(result.errors) == expected.errors
    assert result.nccl_version == expected.nccl_version
    assert result.nccl_tests_version == expected.nccl_tests_version
    assert result.validation == expected.validation


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_headline_in_bytes_per_second(name: str) -> None:
    expected = EXPECTED[name]
    result = parse("nccl-tests", capture(name))

    if expected.avg is None:
        assert result.bandwidth_bytes_per_second is None
        assert result.peak_bandwidth_bytes_per_second is None
    else:
        # The headline is the large-message bus bandwidth (SPEC), not the footer's average.
        assert result.avg_bus_bandwidth_gbps == pytest.approx(expected.avg)
        assert result.bandwidth_bytes_per_second == pytest.approx((expected.peak or 0) * 1e9)
        assert result.peak_bandwidth_bytes_per_second == result.bandwidth_bytes_per_second


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_to_dict_is_strict_json(name: str) -> None:
    as_dict = parse_nccl_tests(capture(name)).to_dict()

    round_trip = json.loads(json.dumps(as_dict, allow_nan=False))
    assert round_trip["verdict"] == EXPECTED[name].verdict
    assert len(round_trip["rows"]) == EXPECTED[name].rows
    for key in ("collective", "ranks", "rows", "avg_bus_bandwidth_gbps", "peak_bus_bandwidth_gbps"):
        assert key in round_trip
    for key in ("out_of_bounds", "errors", "verdict", "nccl_version", "nccl_tests_version"):
        assert key in round_trip


@pytest.mark.parametrize(
    "name",
    [name for name, expected in EXPECTED.items() if expected.avg is not None and name not in TAILS],
)
def test_footer_is_the_mean_of_every_busbw_cell(name: str) -> None:
    # Why the footer is no fabric verdict: it weighs an 8-byte message like a 16 GiB one.
    result = parse_nccl_tests(capture(name))
    cells = [p.busbw_gbps for row in result.rows for p in row.placements()]

    assert sum(c or 0 for c in cells) / len(cells) == pytest.approx(result.avg_bus_bandwidth_gbps, abs=0.01)


@pytest.mark.parametrize("name", sorted(TAILS))
def test_a_tail_without_the_column_header_yields_its_rows(name: str) -> None:
    # What `kubectl logs --tail` and a pasted end of a log give: rows read in the layout of every
    # nccl-tests since 2.13 and every rccl-tests, the same cells as under their header.
    result = parse_nccl_tests(capture(name))
    last = result.rows[-1]
    assert last.redop == "sum" and last.root == -1 and last.type == "float"
    assert last.out_of_place is not None and last.in_place is not None
    assert (last.out_of_place.wrong, last.in_place.wrong) == (0, 0)
    assert result.finished and result.bandwidth_bytes_per_second == pytest.approx(EXPECTED[name].peak * 1e9)


def test_a_tail_reads_like_the_same_rows_under_their_header() -> None:
    # The rows of a whole capture, their header cut off, give the same rows and the same headline.
    whole = capture("01_multinode_2x8_h100_allreduce_ib.txt")
    header_end = whole.index("\n", whole.index("(elements)")) + 1
    tail = whole[header_end:]
    assert "size" not in tail.split("\n", 1)[0]
    assert parse_nccl_tests(tail).rows == parse_nccl_tests(whole).rows
    assert (
        parse_nccl_tests(tail).bandwidth_bytes_per_second
        == parse("nccl-tests", whole).bandwidth_bytes_per_second
    )


def test_headerless_rows_of_the_pre_2_13_layout_are_read_with_their_error_column() -> None:
    # The EFA capture's rows (no root column, `error` cells) without their header.
    whole = capture("11_efa_2x8_a100_mpirun_tagged_error_column.txt")
    lines = [line for line in whole.splitlines() if "size" not in line or "count" not in line]
    tail = "\n".join(lines)
    assert parse_nccl_tests(tail).rows == parse_nccl_tests(whole).rows


@pytest.mark.parametrize(
    ("name", "trimmed_lines"),
    [
        # `# Out of bounds values` and `# Collective test concluded` remain.
        ("13_rccl_tests_tail_without_header.txt", ("Avg bus bandwidth",)),
        ("05_all_gather_2node_gb10_roce.txt", ("Avg bus bandwidth",)),
        # `# Out of bounds values` alone remains (nccl-tests before 2.17 print no concluded line).
        ("14_tail_without_header_linear_sweep.txt", ("Avg bus bandwidth",)),
        # `# Collective test concluded` alone remains.
        ("13_rccl_tests_tail_without_header.txt", ("Avg bus bandwidth", "Out of bounds values")),
    ],
)
def test_a_capture_whose_avg_footer_was_trimmed_keeps_its_bandwidth(
    name: str, trimmed_lines: tuple[str, ...]
) -> None:
    # The `# Avg bus bandwidth` line is gone, another of the table's closing lines is there: the run
    # finished, its average is unknown.
    whole = capture(name)
    trimmed = "\n".join(line for line in whole.splitlines() if not any(cut in line for cut in trimmed_lines))
    result = parse_nccl_tests(trimmed)
    assert result.finished and result.verdict == "ok"
    assert result.avg_bus_bandwidth_gbps is None
    assert result.peak_bus_bandwidth_gbps == pytest.approx(EXPECTED[name].peak)
    assert result.bandwidth_bytes_per_second == parse("nccl-tests", whole).bandwidth_bytes_per_second


def test_real_closing_lines_without_the_avg_footer_or_rows_measure_nothing() -> None:
    # A reporter quoted only the closing lines of a finished run (NVIDIA/nccl#2418), its `# Avg bus
    # bandwidth` line left out: the run finished and was valid, and nothing says how fast it was.
    result = parse_nccl_tests(capture("20_closing_lines_without_avg_footer_2x_rtx_pro_6000.txt"))
    assert result.finished and result.out_of_bounds == 0 and result.collective == "all_reduce"
    assert result.rows == () and result.avg_bus_bandwidth_gbps is None
    assert result.verdict == "incomplete" and result.errors == ("footer without result rows",)
    assert result.bandwidth_bytes_per_second is None and result.peak_bandwidth_bytes_per_second is None


def test_a_row_cut_by_a_cuda_failure_without_the_host_prefix_fails_the_run() -> None:
    # The same report's failing run: the row's parameters, then the failure where its timings
    # would be, quoted without nccl-tests' `<host>: ` and ` .. <host> pid <n>: ` prefixes.
    result = parse_nccl_tests(capture("21_row_cut_by_cuda_failure_without_host_2x_rtx_pro_6000.txt"))
    assert result.verdict == "failed" and not result.finished
    assert result.rows == ()  # five values are no row
    assert result.problem == "Test CUDA failure common.cu:516 'an illegal memory access was encountered'"
    assert result.bandwidth_bytes_per_second is None


def test_a_capture_cut_before_every_closing_line_has_no_bandwidth() -> None:
    text = capture("13_rccl_tests_tail_without_header.txt")
    result = parse_nccl_tests(text[: text.index("# Errors with asterisks")])
    assert not result.finished and result.verdict == "incomplete"
    assert len(result.rows) == 4 and result.bandwidth_bytes_per_second is None


def test_a_2018_nccl_failure_line_without_test_fails_the_run() -> None:
    result = parse_nccl_tests(capture("16_old_nccl_failure_without_test_prefix_8x_p100.txt"))
    assert result.verdict == "failed"
    assert result.errors == ("NCCL failure all_reduce.cu:95 'unhandled cuda error'",)
    assert result.problem == "NCCL failure all_reduce.cu:95 'unhandled cuda error'"


def test_rccl_tests_failure_and_its_older_parameter_line() -> None:
    result = parse_nccl_tests(capture("17_rccl_tests_nccl_failure_4x_mi210.txt"))
    assert result.verdict == "failed" and result.validation is True
    assert result.errors[0].startswith("sharbox-ultra: Test NCCL failure common.cu:1285")


def test_rccl_tests_hip_failure_fails_the_run() -> None:
    # rccl-tests' HIPCHECK (src/common.h) words the CUDA failure as a HIP one.
    text = capture("17_rccl_tests_nccl_failure_4x_mi210.txt").replace("Test NCCL failure", "Test HIP failure")
    result = parse_nccl_tests(text)
    assert result.verdict == "failed"
    assert result.problem is not None and result.problem.startswith(
        "sharbox-ultra: Test HIP failure common.cu:1285"
    )


def test_multinode_h100_first_and_last_rows() -> None:
    rows = parse_nccl_tests(capture("01_multinode_2x8_h100_allreduce_ib.txt")).rows

    assert rows[0] == Row(
        8, 2, "float", "sum", -1, Placement(68.52, 0.00, 0.00, 0), Placement(24.70, 0.00, 0.00, 0)
    )
    # 17179869184 B overflows its 12-character column into the line's left margin.
    assert rows[-1] == Row(
        17179869184,
        4294967296,
        "float",
        "sum",
        -1,
        Placement(68652.0, 250.24, 469.21, 0),
        Placement(68668.0, 250.19, 469.10, 0),
    )


def test_nccl_failure_before_any_row() -> None:
    result = parse_nccl_tests(capture("03_test_nccl_failure_2gpu.txt"))

    assert result.errors[0] == (
        "GENOA-06: Test NCCL failure common.cu:392 "
        "'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"
    )
    assert result.errors[-1] == ".. GENOA-06 pid 5068: Test failure common.cu:891"
    assert result.avg_bus_bandwidth_gbps is None
    assert result.peak_bandwidth_bytes_per_second is None


def test_all_gather_count_is_per_rank() -> None:
    result = parse_nccl_tests(capture("05_all_gather_2node_gb10_roce.txt"))
    (row,) = result.rows

    assert result.count_is_per_rank is True
    assert row.size_bytes == 17179869184
    assert row.count == 2147483648
    assert row.count * 4 * 2 == row.size_bytes  # float32 elements, 2 ranks
    assert row.redop == "none"
    assert row.out_of_place == Placement(374425.0, 45.88, 22.94, 0)
    assert row.in_place == Placement(373792.0, 45.96, 22.98, 0)
    assert result.to_dict()["count_is_per_rank"] is True


def test_all_reduce_count_is_the_total() -> None:
    assert parse_nccl_tests(capture("01_multinode_2x8_h100_allreduce_ib.txt")).count_is_per_rank is False


def test_wrong_results_are_counted_per_cell_and_the_trace_kept() -> None:
    result = parse_nccl_tests(capture("06_wrong_nonzero_2node_gh200_slingshot.txt"))
    bad = [row for row in result.rows if row.size_bytes == 1048576]

    assert len(bad) == 1
    assert bad[0].out_of_place == Placement(477.32, 2.20, 2.20, 96)
    assert bad[0].in_place == Placement(492.81, 2.13, 2.13, 32)
    assert result.rows[0] == Row(
        8, 2, "float", "sum", -1, Placement(17.49, 0.00, 0.00, 0), Placement(16.41, 0.00, 0.00, 0)
    )
    assert result.rows[-1].out_of_place == Placement(5869.38, 22.87, 22.87, 0)
    assert result.rows[-1].in_place == Placement(5886.67, 22.80, 22.80, 0)
    assert result.errors == (
        ".. gpu-1-1 pid 662195: Test failure common.cu:1189",
        ".. gpu-1-7 pid 2448661: Test failure common.cu:1189",
    )


def test_single_node_without_command_line_has_no_collective() -> None:
    result = parse_nccl_tests(capture("08_single_node_8x_h100_allreduce.txt"))

    assert result.rows[0] == Row(
        134217728, 33554432, "float", "sum", -1,
        Placement(613.3, 218.85, 382.99, 0), Placement(614.3, 218.48, 382.34, 0),
    )  # fmt: skip
    assert result.rows[-1] == Row(
        4294967296, 1073741824, "float", "sum", -1,
        Placement(15870.0, 270.63, 473.60, 0), Placement(15773.0, 272.30, 476.53, 0),
    )  # fmt: skip
    assert result.to_dict()["count_is_per_rank"] is None


def test_srun_labels_and_unchecked_wrong_cells() -> None:
    result = parse_nccl_tests(capture("10_multinode_2x8_h100_srun_prefixed_nocheck.txt"))

    assert result.rows[0] == Row(
        8388608, 2097152, "float", "sum", -1,
        Placement(215.3, 38.96, 73.04, None), Placement(180.0, 46.60, 87.38, None),
    )  # fmt: skip
    assert result.rows[-1] == Row(
        8589934592, 2147483648, "float", "sum", -1,
        Placement(103530.0, 82.97, 155.57, None), Placement(103538.0, 82.96, 155.56, None),
    )  # fmt: skip
    assert result.to_dict()["rows"][0]["out_of_place"]["wrong"] is None


def test_mpirun_tags_nccl_info_and_the_pre_2_13_error_column() -> None:
    result = parse_nccl_tests(capture("11_efa_2x8_a100_mpirun_tagged_error_column.txt"))

    # No root column and an `error` column of maximum differences instead of `#wrong`.
    assert result.rows[0] == Row(
        8, 2, "float", "sum", None,
        Placement(179.1, 0.00, 0.00, None, 2e-07), Placement(176.3, 0.00, 0.00, None, 1e-07),
    )  # fmt: skip
    assert result.rows[-1] == Row(
        4294967296, 1073741824, "float", "sum", None,
        Placement(183834.0, 23.36, 43.81, None, 5e-07), Placement(184216.0, 23.31, 43.72, None, 5e-07),
    )  # fmt: skip
    assert [row.size_bytes for row in result.rows] == [2**n for n in range(3, 33)]
    assert result.warnings == ()


def test_cuda_failure_before_the_device_list() -> None:
    result = parse_nccl_tests(capture("12_test_cuda_failure_8x_h100.txt"))

    assert result.errors == (
        "test: Test CUDA failure common.cu:941 'system not yet initialized'",
        ".. test pid 54340: Test failure common.cu:891",
    )


def test_capture_cut_mid_table_is_incomplete() -> None:
    text = capture("01_multinode_2x8_h100_allreduce_ib.txt")
    cut = text[: text.index("     2097152        524288")]
    result = parse_nccl_tests(cut)

    assert result.verdict == "incomplete"
    assert [row.size_bytes for row in result.rows] == [2**n for n in range(3, 21)]
    assert result.avg_bus_bandwidth_gbps is None
    assert result.bandwidth_bytes_per_second is None
    assert result.peak_bandwidth_bytes_per_second is None
    assert len(result.errors) == 1
    assert "did not finish" in result.errors[0]


def test_capture_cut_inside_a_row_drops_the_partial_row() -> None:
    text = capture("08_single_node_8x_h100_allreduce.txt")
    cut = text[: text.index("473.60") + 3]  # "...  270.63  473."
    result = parse_nccl_tests(cut)

    assert result.verdict == "incomplete"
    assert len(result.rows) == 5
    assert result.rows[-1].size_bytes == 2147483648


def test_capture_cut_after_the_header_is_incomplete_not_empty() -> None:
    text = capture("05_all_gather_2node_gb10_roce.txt")
    result = parse_nccl_tests(text[: text.index(" 17179869184    2147483648")])

    assert result.verdict == "incomplete"
    assert result.rows == ()
    assert result.collective == "all_gather"
    assert result.ranks == 2


def test_openmpi_tags_parse_like_the_bare_capture() -> None:
    # The tag OpenMPI's --tag-output puts on rank 0's lines, as in capture 11, on capture 08.
    bare = capture("08_single_node_8x_h100_allreduce.txt")
    tagged = "\n".join(f"[1,0]<stdout>:{line}" for line in bare.splitlines())

    assert parse_nccl_tests(tagged) == parse_nccl_tests(bare)


def test_slurm_labels_parse_like_the_bare_capture() -> None:
    labelled = capture("10_multinode_2x8_h100_srun_prefixed_nocheck.txt")
    bare = "\n".join(line.removeprefix(" 0: ") for line in labelled.splitlines())

    assert parse_nccl_tests(bare) == parse_nccl_tests(labelled)


def test_average_below_nccl_tests_min_bw_fails_the_run() -> None:
    # writeResultFooter (src/util.cu) appends OK or FAILED when NCCL_TESTS_MIN_BW is set; this is
    # capture 01 with the word the writer would have added for a threshold above 139.56.
    text = capture("01_multinode_2x8_h100_allreduce_ib.txt").replace(
        "# Avg bus bandwidth    : 139.56", "# Avg bus bandwidth    : 139.56 FAILED"
    )
    result = parse_nccl_tests(text)

    assert result.verdict == "failed"
    assert result.errors == ("# Avg bus bandwidth    : 139.56 FAILED",)
    assert result.avg_bus_bandwidth_gbps == pytest.approx(139.56)
    assert result.bandwidth_bytes_per_second == pytest.approx(467.9783333e9)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "\n\n   \n",
        "hello\nworld",
        "\x00\xff\xfe binary \x1b[31m",
        "# just a comment\n#\n",
        "Segmentation fault (core dumped)",
    ],
)
def test_garbage_is_incomplete_with_an_error(garbage: str) -> None:
    result = parse_nccl_tests(garbage)

    assert result.verdict == "incomplete"
    assert result.rows == ()
    assert result.errors == ("no nccl-tests output found (no results table, footer or failure line)",)
    assert result.bandwidth_bytes_per_second is None
    json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (0, "ok"),
        (1, "internal error"),
        (2, "CUDA error"),
        (3, "NCCL error"),
        (4, "timeout"),
        (5, "not implemented"),
        (6, "invalid usage"),
        (7, "wrong results, or average bus bandwidth below NCCL_TESTS_MIN_BW"),
        (137, "killed by signal 9"),
        (-9, "killed by signal 9"),
        (42, "unknown exit code 42"),
    ],
)
def test_exit_code_meaning(code: int, meaning: str) -> None:
    assert exit_code_meaning(code) == meaning


@pytest.mark.parametrize(("code", "version"), [(22809, "2.28.9"), (22902, "2.29.2"), (2804, "2.8.4")])
def test_nccl_version_code(code: int, version: str) -> None:
    assert nccl_version_from_code(code) == version


# --- -J JSON output --------------------------------------------------------------------------
#
# No file written by `-J` could be found. These documents are not captures: they are what the
# writer in nccl-tests' src/util.cu emits, key for key and in its number format (%lf, booleans as
# strings), filled with the figures of real text captures. The JSON parser rests on that source.

# Capture 05 (nccl-tests 2.18.5, JSON file version 1 with the corrected key names) as its -J file.
ALL_GATHER_JSON = (
    '{"version":1,"start_time":"2026-03-01 12:00:00","args":["./build/all_gather_perf","-b","16G",'
    '"-e","16G","-J","all_gather.json"],"env":[],"nccl_version":22809,'
    '"config":{"nthreads":1,"ngpus":1,"minimum_bytes":17179869184,"maximum_bytes":17179869184,'
    '"step_factor":2,"warmup_iters":1,"iterations":20,"aggregated_iterations":1,"validation":1,'
    '"graph":0,"blocking_collectives":"false","parallel_init":"false","devices":['
    '{"rank":0,"group":0,"pid":37755,"hostname":"promaxgb10-4c75","device":0,'
    '"device_hex":"000f:01:00","device_info":"NVIDIA GB10"},'
    '{"rank":1,"group":0,"pid":30808,"hostname":"promaxgb10-4c99","device":0,'
    '"device_hex":"000f:01:00","device_info":"NVIDIA GB10"}]},'
    '"results":[{"size":17179869184,"count":2147483648,"type":"float","redop":"none","root":"    -1",'
    '"out_of_place":{"time":374425.000000,"alg_bw":45.880000,"bus_bw":22.940000,"nwrong":0.000000},'
    '"in_place":{"time":373792.000000,"alg_bw":45.960000,"bus_bw":22.980000,"nwrong":0.000000},'
    '"actual_iterations":20,"experiment_name":""}],'
    '"out_of_bounds":{"count":0,"okay":"true"},'
    '"average_bus_bandwidth":{"bandwidth":22.961100,"okay":"unchecked"},"errors":[],'
    '"end_time":"2026-03-01 12:00:20"}'
)


def test_json_matches_the_text_of_the_same_run() -> None:
    from_json = parse("nccl-tests", ALL_GATHER_JSON)
    from_text = parse_nccl_tests(capture("05_all_gather_2node_gb10_roce.txt"))

    assert isinstance(from_json, NcclTestsResult)
    assert from_json.format == "json"
    assert from_json.rows == from_text.rows
    assert from_json.collective == "all_gather"
    assert from_json.ranks == 2
    assert from_json.hosts == from_text.hosts
    assert from_json.avg_bus_bandwidth_gbps == pytest.approx(22.9611)
    assert from_json.peak_bus_bandwidth_gbps == pytest.approx(22.96)
    assert from_json.out_of_bounds == 0
    assert from_json.verdict == "ok"
    assert from_json.nccl_version == "2.28.9"
    assert from_json.validation is True


def test_json_numbers_too_large_for_a_float_are_no_measurement() -> None:
    # Found by tests/test_fuzz.py: float() of a 400-digit integer raised OverflowError.
    document = json.loads(ALL_GATHER_JSON)
    document["average_bus_bandwidth"]["bandwidth"] = 10**400
    document["results"][0]["in_place"]["bus_bw"] = 10**400
    result = parse_nccl_tests(json.dumps(document))
    assert result.avg_bus_bandwidth_gbps is None
    assert result.rows[0].in_place is not None and result.rows[0].in_place.busbw_gbps is None


def test_json_before_2_17_9_spelled_bandwidth_bandwidith() -> None:
    # Capture 06 came from nccl-tests 2.17.8, whose writer still had the misspelt footer keys;
    # two of its rows, the second with wrong elements.
    document = {
        "version": 1,
        "args": ["/opt/nccl-tests/build/all_reduce_perf_mpi", "-b", "8", "-e", "128M"],
        "nccl_version": 22902,
        "config": {"validation": 1, "devices": [{"rank": 0, "hostname": "gpu-1-1"}]},
        "results": [
            {
                "size": 8, "count": 2, "type": "float", "redop": "sum", "root": "    -1",
                "out_of_place": {"time": 17.49, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
                "in_place": {"time": 16.41, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
            },
            {
                "size": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": "    -1",
                "out_of_place": {"time": 477.32, "alg_bw": 2.2, "bus_bw": 2.2, "nwrong": 96.0},
                "in_place": {"time": 492.81, "alg_bw": 2.13, "bus_bw": 2.13, "nwrong": 32.0},
            },
        ],
        "out_of_bounds": {"count": 4, "okay": "false"},
        "average_bus_bandwidith": {"bandwidith": 4.79995, "okay": "unchecked"},
        "errors": [],
    }  # fmt: skip
    result = parse_nccl_tests(json.dumps(document))

    assert result.collective == "all_reduce"
    assert result.avg_bus_bandwidth_gbps == 4.79995
    assert result.out_of_bounds == 4
    assert result.wrong_values_total == 128
    assert result.rows[1].out_of_place == Placement(477.32, 2.2, 2.2, 96)
    assert result.rows[0].root == -1
    assert result.verdict == "wrong_results"
    assert result.nccl_version == "2.29.2"


def test_json_unchecked_cells_and_min_bw_failure() -> None:
    document = json.loads(ALL_GATHER_JSON)
    for placement in ("out_of_place", "in_place"):
        document["results"][0][placement]["nwrong"] = None  # jsonNull() when validation is off
    document["average_bus_bandwidth"]["okay"] = "false"  # below NCCL_TESTS_MIN_BW
    result = parse_nccl_tests(json.dumps(document))

    assert result.rows[0].out_of_place == Placement(374425.0, 45.88, 22.94, None)
    assert result.wrong_values_total is None
    assert result.verdict == "failed"
    assert "NCCL_TESTS_MIN_BW" in result.errors[0]


def test_json_of_a_run_that_failed_mid_row() -> None:
    # jsonOutputFinalize closes whatever is open: the result the writer had started stays bare,
    # and neither footer nor errors are written. The failure itself went to stdout.
    document = json.loads(ALL_GATHER_JSON)
    bare = {key: document["results"][0][key] for key in ("size", "count", "type", "redop", "root")}
    failed = {key: document[key] for key in ("version", "args", "nccl_version", "config")}
    failed["results"] = [bare]
    result = parse_nccl_tests(json.dumps(failed))

    assert result.rows == ()
    assert result.verdict == "incomplete"
    assert result.ranks == 2


def test_json_errors_without_footer_fail_the_run() -> None:
    document = json.loads(ALL_GATHER_JSON)
    del document["average_bus_bandwidth"], document["out_of_bounds"]
    # ncclGetLastError's text in capture 03.
    document["errors"] = ["unhandled cuda error (run with NCCL_DEBUG=INFO for details)"]
    result = parse_nccl_tests(json.dumps(document))

    assert result.verdict == "failed"
    assert result.errors == ("unhandled cuda error (run with NCCL_DEBUG=INFO for details)",)


@pytest.mark.parametrize("cut", [1, 200, len(ALL_GATHER_JSON) // 2, len(ALL_GATHER_JSON) - 1])
def test_unterminated_json_is_incomplete(cut: int) -> None:
    result = parse_nccl_tests(ALL_GATHER_JSON[:cut])

    assert result.verdict == "incomplete"
    assert result.format == "json"
    assert result.errors[0].startswith("not valid JSON")


HUGE = "9" * 5000


def test_absurd_numbers_in_a_capture_are_skipped_not_raised() -> None:
    # Found by tests/test_fuzz.py: int() of thousands of digits raised out of the parser.
    text = capture("08_single_node_8x_h100_allreduce.txt")
    text = text.replace(
        "# nccl-tests version", f"# nccl-tests version 9 nccl-library={HUGE}\n# was version", 1
    )
    text += f"# Rank {HUGE} Group  0 Pid 1 on host device  0 [0x1b] NVIDIA H100 80GB HBM3\n"
    text += f"# Out of bounds values : {HUGE} OK\n"
    result = parse_nccl_tests(text)
    assert result.verdict == "ok"
    assert result.out_of_bounds is None
    assert result.ranks == 8
    assert parse_nccl_tests(f"# nccl-tests version 2.13.9 nccl-library={HUGE}\n").nccl_version is None
