"""nvbandwidth parser, tested on real nvbandwidth outputs (tests/fixtures/nvbandwidth/README.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import REGISTRY, parse
from clusterhealth.checks.probe_parsers.nvbandwidth import GIGABYTE, NvbandwidthResult, parse_nvbandwidth
from clusterhealth.checks.probes import evaluate, run
from clusterhealth.checks.probes.runner import RunResult

FIXTURES = Path(__file__).parent / "fixtures" / "nvbandwidth"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


def ran_exit(code: int) -> RunResult:
    return RunResult(
        argv=("nvbandwidth",),
        exit_code=code,
        signal=None,
        timed_out=False,
        duration_seconds=3.0,
        stdout="",
        stderr="",
        output_truncated=False,
        error=None,
    )


def test_gigabytes_are_decimal() -> None:
    # memcpy.cpp: bandwidth in bytes per second, printed times 1e-9 as GB/s.
    assert GIGABYTE == 10**9


def test_a_whole_v0_8_run() -> None:
    result = parse_nvbandwidth(capture("01_h2d_sm_1x_a100_v0.8.txt"))

    assert result.verdict == "ok"
    assert result.errors == ()
    assert (result.version, result.driver_version, result.cuda_version) == ("v0.8", "560.35.05", "12060")
    assert result.devices == ("NVIDIA A100-SXM4-40GB (00000000:99:00)",)
    assert result.testcases == ("host_to_device_memcpy_sm",)
    (matrix,) = result.matrices
    assert matrix.testcase == "host_to_device_memcpy_sm"
    assert matrix.description == "memcpy SM CPU(row) -> GPU(column) bandwidth (GB/s)"
    assert matrix.columns == ("0",)
    assert matrix.rows == (("0", (25.13,)),)
    assert matrix.sum == 25.13
    assert result.bandwidth_bytes_per_second == pytest.approx(25.13e9)
    assert result.wrong_values == 0


def test_the_headline_is_the_slowest_pair_not_the_sum() -> None:
    result = parse("nvbandwidth", capture("02_d2d_read_ce_6x_a6000_v0.8.txt"))

    assert isinstance(result, NvbandwidthResult)
    assert result.verdict == "ok"
    (matrix,) = result.matrices
    # The poster elided the `Running` line: the SUM line names the testcase.
    assert matrix.testcase == "device_to_device_memcpy_read_ce"
    assert matrix.sum == 715.53
    assert [label for label, _ in matrix.rows] == ["0", "1", "2", "3", "4", "5"]
    # N/A on the diagonal: not measured, not zero.
    assert all(values[int(label)] is None for label, values in matrix.rows)
    assert len(matrix.measured()) == 30
    # The tool sums the unrounded values: 30 cells rounded to 0.01 each.
    assert sum(value for _, _, value in matrix.measured()) == pytest.approx(715.53, abs=30 * 0.005)
    # GPUs 0-2 and 3-5 sit under two PCIe switches; 0 -> 5 is the slowest crossing.
    assert result.slowest == ("device_to_device_memcpy_read_ce", "0", "5", 21.80)
    assert result.bandwidth_bytes_per_second == pytest.approx(21.80e9)
    assert result.peak_bandwidth_bytes_per_second == pytest.approx(26.35e9)


def test_zeros_on_an_older_diagonal_are_not_measurements() -> None:
    result = parse_nvbandwidth(capture("03_d2d_write_ce_8gpu_readme.txt"))

    assert result.verdict == "ok"
    (matrix,) = result.matrices
    assert matrix.sum is None  # that version printed no SUM line
    assert len(matrix.rows) == 8 and len(matrix.measured()) == 56
    assert result.slowest == ("device_to_device_memcpy_write_ce", "6", "0", 274.89)
    assert result.bandwidth_bytes_per_second == pytest.approx(274.89e9)
    assert result.peak_bandwidth_bytes_per_second == pytest.approx(276.76e9)


def test_a_waived_testcase_measured_nothing() -> None:
    result = parse_nvbandwidth(capture("04_waived_d2d_write_ce_2x_2080ti_v0.2.txt"))

    assert result.verdict == "failed"
    assert result.waived == ("device_to_device_memcpy_write_ce",)
    assert result.devices == ("NVIDIA GeForce RTX 2080 Ti", "NVIDIA GeForce RTX 2080 Ti")
    assert result.problem is not None
    assert "waived (device_to_device_memcpy_write_ce)" in result.problem
    assert "peer access" in result.problem
    assert result.bandwidth_bytes_per_second is None
    assert result.wrong_values is None


@pytest.mark.parametrize(
    ("name", "testcase", "last_error"),
    [
        (
            "05_pattern_check_failed_8x_a100_v0.7.txt",
            "device_to_device_memcpy_read_ce",
            "ASSERT in expression",
        ),
        ("06_pattern_check_aborted_8x_l40s_v0.4.txt", "one_to_all_read_sm", "Aborted (core dumped)"),
    ],
)
def test_a_copy_that_corrupted_data_is_wrong_results(name: str, testcase: str, last_error: str) -> None:
    result = parse_nvbandwidth(capture(name))

    assert result.verdict == "wrong_results"
    assert result.testcases == (testcase,)
    assert result.mismatches == 1 and result.wrong_values == 1
    assert result.problem == "a copy's data did not match the pattern written: the copy corrupted data"
    assert result.errors[1].startswith("Invalid value when checking the pattern at ")
    assert result.errors[-1].startswith(last_error)
    assert result.matrices == () and result.bandwidth_bytes_per_second is None


def test_output_cut_inside_a_testcase_is_incomplete() -> None:
    text = capture("01_h2d_sm_1x_a100_v0.8.txt")
    cut = text[: text.index("memcpy SM CPU(row)")]
    result = parse_nvbandwidth(cut)

    assert result.verdict == "incomplete"
    assert result.problem is not None and result.problem.startswith("host_to_device_memcpy_sm: output ends")
    assert result.bandwidth_bytes_per_second is None


def test_a_latency_matrix_is_no_bandwidth() -> None:
    # The real capture with its description replaced by the latency testcase's, as testcases_sm.cpp
    # words it: nanoseconds are kept, never taken for the headline bandwidth.
    text = capture("01_h2d_sm_1x_a100_v0.8.txt").replace(
        "memcpy SM CPU(row) -> GPU(column) bandwidth (GB/s)",
        "memory latency SM CPU(row) <-> GPU(column) (ns)",
    )
    result = parse_nvbandwidth(text)

    (matrix,) = result.matrices
    assert matrix.unit == "ns" and not matrix.is_bandwidth
    assert result.verdict == "ok"
    assert result.bandwidth_bytes_per_second is None


def test_a_testcase_cut_off_after_another_finished_is_incomplete() -> None:
    # The v0.8 run up to its closing NOTE, then a next testcase announced (nvbandwidth.cpp prints
    # `Running <name>.`) and cut off before its matrix.
    text = capture("01_h2d_sm_1x_a100_v0.8.txt")
    result = parse_nvbandwidth(text[: text.index("NOTE:")] + "Running device_to_host_memcpy_sm.\n")

    assert len(result.matrices) == 1
    assert result.verdict == "incomplete"
    assert result.problem is not None and result.problem.startswith("device_to_host_memcpy_sm: output ends")


def _from_running(name: str) -> str:
    text = capture(name)
    return text[text.index("Running ") :]


@pytest.mark.parametrize(
    ("finished", "corrupted"),
    [
        # v0.8's finished testcase, then v0.7's pattern-check failure and ASSERT.
        ("01_h2d_sm_1x_a100_v0.8.txt", "05_pattern_check_failed_8x_a100_v0.7.txt"),
        # An older matrix without a SUM line, then v0.4's failure ended by the shell's Aborted.
        ("03_d2d_write_ce_8gpu_readme.txt", "06_pattern_check_aborted_8x_l40s_v0.4.txt"),
    ],
)
def test_corruption_after_an_earlier_testcase_finished_is_wrong_results(
    finished: str, corrupted: str
) -> None:
    # A run of several testcases (nvbandwidth.cpp runs them in turn and prints `Running <name>.`
    # before each): the real output of one that finished, then the real output of one whose copy
    # failed the pattern check.
    result = parse_nvbandwidth(capture(finished) + _from_running(corrupted))

    assert result.verdict == "wrong_results"
    assert len(result.matrices) == 1 and len(result.testcases) == 2
    assert result.mismatches == 1 and result.wrong_values == 1
    assert result.problem == "a copy's data did not match the pattern written: the copy corrupted data"
    outcome = evaluate("nvbandwidth", ran_exit(1), result, None, 0.9)
    assert outcome.result == "failed" and outcome.wrong_values == 1


def test_json_output_is_named_as_unread() -> None:
    result = parse_nvbandwidth('{\n   "nvbandwidth" : {\n')
    assert result.verdict == "incomplete"
    assert result.problem == "nvbandwidth --json output is not read; run the probe without -j"


def test_to_dict_is_strict_json() -> None:
    for path in sorted(FIXTURES.glob("*.txt")):
        as_dict = json.loads(json.dumps(parse_nvbandwidth(path.read_text()).to_dict(), allow_nan=False))
        assert as_dict["kind"] == "nvbandwidth"
    slowest = parse_nvbandwidth(capture("02_d2d_read_ce_6x_a6000_v0.8.txt")).to_dict()["slowest"]
    assert slowest == {"testcase": "device_to_device_memcpy_read_ce", "row": "0", "column": "5", "gbps": 21.8}


def test_its_exit_codes_are_named() -> None:
    meaning = REGISTRY["nvbandwidth"].exit_code_meaning
    assert meaning is not None
    assert "CUDA or NVML" in meaning(1)
    assert meaning(134) == "killed by signal 6"


def test_a_real_process_through_the_evaluation(tmp_path: Path) -> None:
    # A stand-in for the GPU binary (the hardware boundary): a real process that prints a real
    # capture and exits as nvbandwidth does after its ASSERT.
    stand_in = tmp_path / "nvbandwidth"
    stand_in.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"sys.stdout.write(open({str(FIXTURES / '05_pattern_check_failed_8x_a100_v0.7.txt')!r}).read())\n"
        "sys.exit(1)\n"
    )
    stand_in.chmod(0o755)
    ran = run([str(stand_in), "-t", "device_to_device_memcpy_read_ce"], timeout=30)
    outcome = evaluate("nvbandwidth", ran, parse("nvbandwidth", ran.output), None, 0.9)

    assert outcome.result == "failed"
    assert outcome.reason.startswith("nvbandwidth exited 1: a CUDA or NVML call")
    assert "did not match the pattern written" in outcome.reason
    assert outcome.wrong_values == 1

    # A healthy run against an expectation it falls short of: degraded, in the tool's GB/s.
    healthy = run(["cat", str(FIXTURES / "02_d2d_read_ce_6x_a6000_v0.8.txt")], timeout=30)
    slow = evaluate("nvbandwidth", healthy, parse("nvbandwidth", healthy.output), 25 * GIGABYTE, 0.9)
    assert slow.result == "degraded"
    assert "21.80 GB/s is 87% of the expected 25.00 GB/s" in slow.reason
