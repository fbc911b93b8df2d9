"""Parse the plain text NVIDIA's ``nvbandwidth`` prints: copy bandwidth between the node's GPUs and
between the CPU and each GPU, the probe that sees an NVLink or PCIe link trained down.

Facts from nvbandwidth's source (NVIDIA/nvbandwidth v0.8: output.cpp, inline_common.h,
nvbandwidth.cpp, error_handling.h, kernels.cu, memcpy.cpp):

* Each testcase prints ``Running <name>.`` and then one or more matrices: a description ending in
  ``bandwidth (GB/s)`` (the latency testcases end in ``(ns)``), a line of column labels, one line
  per row (its label, then one value per column with two decimals, ``N/A`` for a pair that was not
  measured), a blank line and ``SUM <name> <sum>`` (``&&&& PERF <name> <sum>GB/s`` under
  ``--perfFormatter``). Older versions print 0.00 instead of N/A on the diagonal; the tool itself
  counts only values above 0 as measured (its verbose AVG), and so does this parser.
* GB/s is 10^9 bytes per second (memcpy.cpp scales bytes per second by 1e-9).
* A testcase the node cannot run prints ``Waived: `` (before v0.5 ``Waiving <name>.``): peer
  access between the GPUs failed, or too few GPUs. One that threw prints ``Error: <message>``, an
  unknown name ``ERROR: <message>``; the run goes on and exits 0.
* A fatal error prints one line (stderr) and exits 1: ``[CUDA_ERROR_...] ... in expression ...``,
  ``NVML_ERROR: [...] in expression ...``, ``ASSERT in expression ...``; bad arguments print
  ``ERROR: Invalid Arguments``.
* Each copy is verified unless ``-s``: a mismatch prints `` Invalid value when checking the
  pattern at ...`` from the GPU, then the ASSERT on ``h_errorFlag`` ends the run.

``--json`` output is not read: run the probe without ``-j``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from clusterhealth.checks.probe_parsers._common import (
    ProbeKind,
    Verdict,
    finite_or_none,
    parse_float,
    parse_int,
    undocumented_exit_code,
)

GIGABYTE = 1_000_000_000

_RUNNING = re.compile(r"^Running (\S+?)\.?$")
_WAIVING_OLD = re.compile(r"^Waiving (\S+?)\.?$")
_DESCRIPTION = re.compile(r"\((GB/s|ns)\)$")
_SUM = re.compile(r"^(?:SUM|&&&& PERF) (\S+) (\S+?)(?:GB/s|ns)?$")
_FIELD = {
    "version": re.compile(r"^nvbandwidth Version: (\S+)"),
    "driver_version": re.compile(r"^Driver Version: (\S+)"),
    "cuda_version": re.compile(r"^CUDA Driver Version: (\S+)"),
}
_DEVICE = re.compile(r"^Device (\d+): (.+)$")
_MISMATCH = "Invalid value when checking the pattern"
_FATAL = re.compile(
    r"^(\[\w+\] .* in expression |NVML_ERROR: |ASSERT in expression |ERROR: |You cannot specify |"
    r"Specified list of testcase prefixes)"
)
_TESTCASE_ERROR = "Error: "
_KILLED = ("Aborted", "Segmentation fault", "Killed")

_NOTHING_FOUND = "no nvbandwidth result matrix or error message found"
_TRUNCATED = "output ends before a result matrix: the run did not finish (crash, kill or timeout)"


@dataclass(frozen=True)
class Matrix:
    """One matrix a testcase printed, in the unit its description names."""

    testcase: str | None  # from `Running <name>.`; None when the capture starts at the matrix
    description: str  # e.g. "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)"
    unit: str  # "GB/s" or "ns"
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[float | None, ...]], ...]  # (row label, values); None: N/A
    sum: float | None  # the SUM line; None when absent (older versions, a cut capture)

    @property
    def is_bandwidth(self) -> bool:
        return self.unit == "GB/s"

    def measured(self) -> list[tuple[str, str, float]]:
        """(row, column, value) of each measured cell: above 0, as the tool's own average counts."""
        return [
            (label, column, value)
            for label, values in self.rows
            for column, value in zip(self.columns, values, strict=False)
            if value is not None and value > 0
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "testcase": self.testcase,
            "description": self.description,
            "unit": self.unit,
            "columns": list(self.columns),
            "rows": [{"label": label, "values": list(values)} for label, values in self.rows],
            "sum": self.sum,
        }


@dataclass(frozen=True)
class NvbandwidthResult:
    version: str | None
    driver_version: str | None
    cuda_version: str | None
    devices: tuple[str, ...]  # "NVIDIA A100-SXM4-40GB (00000000:99:00)", by device index
    testcases: tuple[str, ...]  # in the order they ran
    waived: tuple[str, ...]  # testcases the node could not run; "" where the version omits the name
    matrices: tuple[Matrix, ...]
    mismatches: int  # copies the GPU found differing from the pattern written
    errors: tuple[str, ...]
    verdict: Verdict

    def _cells(self) -> list[tuple[Matrix, str, str, float]]:
        return [
            (m, row, column, value)
            for m in self.matrices
            if m.is_bandwidth
            for row, column, value in m.measured()
        ]

    @property
    def slowest(self) -> tuple[str, str, str, float] | None:
        """(testcase, row, column, GB/s) of the lowest measured bandwidth: the weakest link."""
        cells = self._cells()
        if not cells:
            return None
        matrix, row, column, value = min(cells, key=lambda cell: cell[3])
        return (matrix.testcase or "", row, column, value)

    @property
    def bandwidth_bytes_per_second(self) -> float | None:
        """The lowest bandwidth of any measured pair: one link trained down shows here, the SUM
        hides it."""
        slowest = self.slowest
        return None if slowest is None else finite_or_none(slowest[3] * GIGABYTE)

    @property
    def peak_bandwidth_bytes_per_second(self) -> float | None:
        cells = self._cells()
        return finite_or_none(max(cell[3] for cell in cells) * GIGABYTE) if cells else None

    @property
    def wrong_values(self) -> int | None:
        """Pattern mismatches reported; None when nothing was measured or checked."""
        return self.mismatches if self.mismatches or self.matrices else None

    @property
    def problem(self) -> str | None:
        return self.errors[0] if self.errors else None

    def to_dict(self) -> dict[str, Any]:
        slowest = self.slowest
        return {
            "kind": "nvbandwidth",
            "version": self.version,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "devices": list(self.devices),
            "testcases": list(self.testcases),
            "waived": list(self.waived),
            "matrices": [matrix.to_dict() for matrix in self.matrices],
            "slowest": None
            if slowest is None
            else {"testcase": slowest[0], "row": slowest[1], "column": slowest[2], "gbps": slowest[3]},
            "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
            "peak_bandwidth_bytes_per_second": self.peak_bandwidth_bytes_per_second,
            "mismatches": self.mismatches,
            "errors": list(self.errors),
            "verdict": self.verdict,
        }


class _MatrixBuilder:
    def __init__(self, testcase: str | None, description: str, unit: str) -> None:
        self.testcase = testcase
        self.description = description
        self.unit = unit
        self.columns: tuple[str, ...] | None = None
        self.rows: list[tuple[str, tuple[float | None, ...]]] = []
        self.sum: float | None = None

    def take(self, tokens: list[str]) -> bool:
        """Take a header or a row; False when the line is neither (the matrix has ended)."""
        if self.columns is None:
            self.columns = tuple(tokens)
            return True
        if len(tokens) != len(self.columns) + 1:
            return False
        values = tuple(None if token == "N/A" else parse_float(token) for token in tokens[1:])
        if any(value is None and token != "N/A" for value, token in zip(values, tokens[1:], strict=True)):
            return False
        self.rows.append((tokens[0], values))
        return True

    def build(self) -> Matrix:
        return Matrix(
            self.testcase, self.description, self.unit, self.columns or (), tuple(self.rows), self.sum
        )


def parse_nvbandwidth(text: str) -> NvbandwidthResult:
    """Parse nvbandwidth's plain output (stdout and stderr together). Never raises."""
    fields: dict[str, str] = {}
    devices: dict[int, str] = {}
    testcases: list[str] = []
    waived: list[str] = []
    matrices: list[Matrix] = []
    errors: list[str] = []
    mismatches = 0
    testcase: str | None = None
    building: _MatrixBuilder | None = None
    saw_json = False

    def close() -> None:
        nonlocal building
        if building is not None and building.rows:
            matrices.append(building.build())
        building = None

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if building is not None and building.take(line.split()):
            continue
        if (summed := _SUM.match(line)) is not None:
            if building is not None and building.rows:
                building.sum = parse_float(summed.group(2))
                building.testcase = building.testcase or summed.group(1)
            close()
        elif (description := _DESCRIPTION.search(line)) is not None and not line.startswith(_TESTCASE_ERROR):
            close()
            building = _MatrixBuilder(testcase, line, description.group(1))
        elif (running := _RUNNING.match(line)) is not None:
            close()
            testcase = running.group(1)
            testcases.append(testcase)
        elif (waiving := _WAIVING_OLD.match(line)) is not None:
            close()
            waived.append(waiving.group(1))
        elif line.startswith("Waived:"):
            close()
            waived.append("")  # since v0.5 a waived testcase's name is not printed
        elif _MISMATCH in line:
            mismatches += 1
            errors.append(line)
        elif line.startswith(_TESTCASE_ERROR):
            close()
            errors.append(f"{testcase}: {line}" if testcase else line)
        elif _FATAL.match(line) is not None or line.startswith(_KILLED):
            close()
            errors.append(line)
        elif line.startswith("{") and not matrices:
            saw_json = True
        elif (device := _DEVICE.match(line)) is not None and (
            index := parse_int(device.group(1))
        ) is not None:
            devices[index] = device.group(2)
        else:
            for name, pattern in _FIELD.items():
                if name not in fields and (found := pattern.match(line)) is not None:
                    fields[name] = found.group(1)
    close()

    # A testcase that ran but printed no matrix, with no error to say why, was cut off.
    measured_testcases = {matrix.testcase for matrix in matrices}
    cut = [name for name in testcases if name not in measured_testcases]
    verdict: Verdict
    if mismatches:
        verdict = "wrong_results"
        copies = "a copy's data" if mismatches == 1 else f"{mismatches} copies' data"
        errors.insert(0, f"{copies} did not match the pattern written: the copy corrupted data")
    elif errors:
        verdict = "failed"
    elif cut:
        verdict = "incomplete"
        errors.append(f"{cut[-1]}: {_TRUNCATED}")
    elif matrices:
        verdict = "ok"  # a latency testcase alone finishes with no bandwidth to headline
    elif waived:
        verdict = "failed"
        names = ", ".join(name for name in waived if name)
        errors.append(
            f"every testcase was waived{f' ({names})' if names else ''}: peer access between the GPUs "
            "failed, or the node has too few GPUs for it"
        )
    else:
        verdict = "incomplete"
        errors.append(
            "nvbandwidth --json output is not read; run the probe without -j" if saw_json else _NOTHING_FOUND
        )
    return NvbandwidthResult(
        version=fields.get("version"),
        driver_version=fields.get("driver_version"),
        cuda_version=fields.get("cuda_version"),
        devices=tuple(devices[index] for index in sorted(devices)),
        testcases=tuple(testcases),
        waived=tuple(waived),
        matrices=tuple(matrices),
        mismatches=mismatches,
        errors=tuple(errors),
        verdict=verdict,
    )


def exit_code_meaning(code: int) -> str:
    """What nvbandwidth's exit code means (nvbandwidth.cpp main, error_handling.h)."""
    if code == 1:
        return "a CUDA or NVML call or one of its checks failed, or the arguments were bad"
    return undocumented_exit_code(code)


KIND = ProbeKind(
    name="nvbandwidth",
    parse=parse_nvbandwidth,
    unit="GB/s",
    headline="lowest copy bandwidth of any measured GPU pair or CPU-GPU link",
    exit_code_meaning=exit_code_meaning,
    wrong_values="copies whose data did not match the pattern written",
)
