"""Parse nccl-tests output: the text table every version prints, and the file written by ``-J``.

What the parser relies on, and where it comes from:

* The text layout is read from the column-header line of each capture rather than assumed, because
  it changed over the years: nccl-tests before 2.13 had an ``error`` column (a maximum difference)
  where newer versions have ``#wrong`` (a count of wrong elements), older ones had no ``root``
  column, ``-C 1`` prints ``cputime`` for ``time``, ``-I 1`` adds per-iteration columns and ``-S 1``
  a timestamp. Values are split on whitespace because numbers overflow their printf widths.
* Launchers prefix lines: OpenMPI ``--tag-output`` writes ``[1,0]<stdout>:``, ``srun --label``
  writes `` 0: ``, MPICH's Hydra (``-prepend-rank``) writes ``[0]`` before every chunk it passes
  on, so inside a row too (``-1[0]     159.4``). NCCL INFO/WARN lines and MPI warnings land
  anywhere, even inside the table and inside a row: the row whose line an INFO line interrupts is
  lost (its two halves are not joined).
* With ``NCCL_DEBUG=INFO`` the INFO lines also say which transports NCCL used: ``transport``, read
  by checks/probe_parsers/nccl_transport.py.
* A run that dies prints ``<host>: Test NCCL failure ...``, ``Test CUDA failure ...`` or
  ``Test timeout ...`` (rccl-tests also ``Test HIP failure ...``; nccl-tests of 2018 printed a bare
  ``NCCL failure <file>:<line> '<error>'``), then one `` .. <host> pid <n>: Test failure
  <file>:<line>`` line per stack frame; the same trace lines follow a finished run whose results
  were wrong (exit code 7).
* A finished run closes its table with ``# Out of bounds values``, ``# Avg bus bandwidth`` and, since
  2.17, ``# Collective test concluded``; a run that is killed prints none of them. Any one of them
  says the run finished, so a capture whose ``# Avg bus bandwidth`` line was trimmed still has its
  large-message bandwidth.
* Captures come without their column header (``kubectl logs --tail``, a pasted tail): a row is then
  read in the one layout every nccl-tests since 2.13 and every rccl-tests prints (size, count, type,
  redop, root, then time, algbw, busbw, #wrong for each placement), or, with 12 values, the older
  one without root and with ``error``.
* rccl-tests (AMD's fork) prints the same table and lines, adds ``rccl-tests: Version ...`` and
  ``# Errors with asterisks indicate ...``, and its older versions word the parameters
  ``# nThreads: 1 nGpus: 4 nRanks: 1 ...``.
* The JSON file (``-J results.json``, nccl-tests 2.17.3 and later) is read according to its writer,
  src/util.cu of nccl-tests 2.17.3 to 2.19.6 (file versions 1 to 3). No captured file was
  available; see ``parse_nccl_tests_json``.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from clusterhealth.checks.probe_parsers._common import (
    ProbeKind,
    ProbeParse,
    Verdict,
    number_or_none,
    parse_float,
    parse_int,
    undocumented_exit_code,
)
from clusterhealth.checks.probe_parsers.nccl_transport import Transport, TransportReader

# nccl-tests computes bandwidth as bytes / 1.0E9 / seconds (src/all_reduce.cu, AllReduceGetBw).
BYTES_PER_GB = 1e9

# The peak is the mean bus bandwidth over the rows whose size is at least this fraction of the
# largest size tested. See NcclTestsResult.peak_bus_bandwidth_gbps for why.
PEAK_MIN_SIZE_FRACTION = 0.25

EXIT_CODE_MEANINGS: Mapping[int, str] = MappingProxyType(
    {
        0: "ok",
        1: "internal error",
        2: "CUDA error",
        3: "NCCL error",
        4: "timeout",
        5: "not implemented",
        6: "invalid usage",
        7: "wrong results, or average bus bandwidth below NCCL_TESTS_MIN_BW",
    }
)

# Collectives whose printed `count` is the element count per rank, not the total: their
# GetCollByteCount divides the count by nranks (src/all_gather.cu, reduce_scatter.cu, ...).
PER_RANK_COUNT_COLLECTIVES = frozenset({"all_gather", "reduce_scatter", "alltoall", "gather", "scatter"})

# The binaries nccl-tests builds (src/*.cu); a longer name first where one extends another.
_COLLECTIVE_NAMES = (
    "all_reduce",
    "all_gather",
    "alltoallv",
    "alltoall",
    "broadcast",
    "gather",
    "hypercube",
    "reduce_scatter",
    "reduce",
    "scatter",
    "sendrecv",
)
_PERF_BINARY = re.compile(rf"\b({'|'.join(_COLLECTIVE_NAMES)})_perf(?:_mpi)?\b")

_MPI_TAG = re.compile(r"^.*?\[\d+,\d+\]<(?:stdout|stderr)>:")
_SLURM_LABEL = re.compile(r"^\s*\d+: ")
_HYDRA_RANK = re.compile(r"^(\[\d+\])(?=\s|$)")

_TESTS_VERSION = re.compile(r"^nccl-tests version (\S+)(?:.*?\bnccl-library=(\d+))?")
_COLLECTIVE_STARTING = re.compile(r"^Collective test starting:\s*(\S+)")
_PARAMETERS = re.compile(r"^nThreads?:?\s+\d+\s+nGpus:?\s+\d+\b")
_VALIDATION = re.compile(r"\bvalidation:\s*(\d+)")
# Before 2.0's Pid and 2.13's Group: "Rank  0 on     node03 device  0 [0x00] Tesla P100-PCIE-16GB".
_DEVICE = re.compile(r"^Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+\d+")
_OUT_OF_BOUNDS = re.compile(r"^Out of bounds values\s*:\s*(\d+)")
_AVG_BUS_BW = re.compile(r"^Avg bus bandwidth\s*:\s*(\S+)(?:\s+(OK|FAILED))?")
_CONCLUDED = re.compile(r"^Collective test concluded:\s*(\S+)")
_LAST_NCCL_ERROR = re.compile(r"^error:\s*(.*)")
_NCCL_VERSION_LINE = re.compile(r"\bNCCL version (\d+\.\d+\.\d+)")
_HARD_FAILURE = re.compile(
    r"Test (?:NCCL|CUDA|HIP) failure|Test timeout|Invalid number of GPUs|^NCCL failure \S+:\d+ "
)
_FAILURE_TRACE = re.compile(r"^\.\. \S+ pid \d+: Test failure")
_NCCL_WARN = re.compile(r"\bNCCL WARN\b")

_TRUNCATED = (
    "output ends before the '# Avg bus bandwidth' footer: the run did not finish (crash, kill or timeout)"
)
_NOTHING_FOUND = "no nccl-tests output found (no results table, footer or failure line)"


def exit_code_meaning(code: int) -> str:
    """What an nccl-tests process exit code means (src/common.h testResult_t; 7 from run())."""
    if code in EXIT_CODE_MEANINGS:
        return EXIT_CODE_MEANINGS[code]
    return undocumented_exit_code(code)


@dataclass(frozen=True)
class Placement:
    """One half of a result row: the out-of-place or the in-place measurement."""

    time_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    # Wrong elements, or None when not checked (`N/A`: validation off) or not printed (before 2.13).
    wrong: int | None
    # Before nccl-tests 2.13 the column was `error`, the largest difference from the expected value.
    max_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_us": self.time_us,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "wrong": self.wrong,
            "max_error": self.max_error,
        }


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int  # elements; per rank for PER_RANK_COUNT_COLLECTIVES
    type: str
    redop: str | None  # None where the version printed no redop column
    root: int | None  # None where the version printed no root column
    out_of_place: Placement | None
    in_place: Placement | None

    def placements(self) -> tuple[Placement, ...]:
        return tuple(p for p in (self.out_of_place, self.in_place) if p is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "size_bytes": self.size_bytes,
            "count": self.count,
            "type": self.type,
            "redop": self.redop,
            "root": self.root,
            "out_of_place": self.out_of_place.to_dict() if self.out_of_place else None,
            "in_place": self.in_place.to_dict() if self.in_place else None,
        }


@dataclass(frozen=True)
class NcclTestsResult:
    collective: str | None
    ranks: int | None
    hosts: tuple[str, ...]
    rows: tuple[Row, ...]
    avg_bus_bandwidth_gbps: float | None  # the footer figure
    out_of_bounds: int | None  # failing test instances, not elements
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    verdict: Verdict
    nccl_version: str | None
    nccl_tests_version: str | None
    validation: bool | None  # whether results were checked (-c), from the parameter line
    format: Literal["text", "json"] = "text"
    # Whether the output reaches the table's closing lines (any of them): the run finished.
    finished: bool = False
    transport: Transport = field(default_factory=Transport)

    @property
    def peak_bus_bandwidth_gbps(self) -> float | None:
        """Mean bus bandwidth, both placements, over the rows whose size is at least 1/4 of the largest.

        The footer average weighs every size equally, and most sizes of the usual 8 B to 16 GiB sweep
        are bound by latency, so it sits far below what the fabric delivers: 139.56 GB/s against
        ~469 GB/s at the largest sizes for 16 H100s over NDR. A fabric verdict needs the plateau.
        With the usual factor-2 sweep, 1/4 of the largest size keeps the three largest sizes: enough
        to smooth one noisy sample while staying on the plateau; a single-size run keeps its size.
        Both placements are averaged, as the footer does, so the two figures differ only in which
        sizes they cover.

        None before the table's closing lines: a run cut short never reached its largest sizes, and
        the largest it did print are not the plateau.
        """
        if not self.finished:
            return None
        return peak_bus_bandwidth_gbps(self.rows)

    @property
    def wrong_values_total(self) -> int | None:
        """`#wrong` summed over every cell that was checked; None when no cell was."""
        counts = [p.wrong for row in self.rows for p in row.placements() if p.wrong is not None]
        return sum(counts) if counts else None

    @property
    def count_is_per_rank(self) -> bool | None:
        if self.collective is None:
            return None
        return self.collective in PER_RANK_COUNT_COLLECTIVES

    @property
    def bandwidth_bytes_per_second(self) -> float | None:
        """The headline: the bus bandwidth at the large sizes (`peak_bus_bandwidth_gbps`), which a
        slow link moves as much as it moves the fabric; not the footer's average over all sizes."""
        peak = self.peak_bus_bandwidth_gbps
        return None if peak is None else peak * BYTES_PER_GB

    @property
    def peak_bandwidth_bytes_per_second(self) -> float | None:
        return self.bandwidth_bytes_per_second

    @property
    def wrong_values(self) -> int | None:
        return self.wrong_values_total

    @property
    def problem(self) -> str | None:
        if self.verdict == "wrong_results":
            found = []
            if wrong := self.wrong_values_total:
                found.append(f"{wrong} wrong values")
            if self.out_of_bounds:
                found.append(f"{self.out_of_bounds} out-of-bounds tests")
            if found:
                return ", ".join(found)
        return self.errors[0] if self.errors else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "nccl-tests",
            "format": self.format,
            "collective": self.collective,
            "ranks": self.ranks,
            "hosts": list(self.hosts),
            "nccl_version": self.nccl_version,
            "nccl_tests_version": self.nccl_tests_version,
            "validation": self.validation,
            "count_is_per_rank": self.count_is_per_rank,
            "rows": [row.to_dict() for row in self.rows],
            "finished": self.finished,
            "avg_bus_bandwidth_gbps": self.avg_bus_bandwidth_gbps,
            "peak_bus_bandwidth_gbps": self.peak_bus_bandwidth_gbps,
            "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
            "peak_bandwidth_bytes_per_second": self.peak_bandwidth_bytes_per_second,
            "out_of_bounds": self.out_of_bounds,
            "wrong_values_total": self.wrong_values_total,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "verdict": self.verdict,
            "transport": self.transport.to_dict(),
        }


def peak_bus_bandwidth_gbps(rows: Iterable[Row]) -> float | None:
    """See NcclTestsResult.peak_bus_bandwidth_gbps."""
    measured = [row for row in rows if row.size_bytes > 0]
    if not measured:
        return None
    threshold = max(row.size_bytes for row in measured) * PEAK_MIN_SIZE_FRACTION
    busbws = [
        p.busbw_gbps
        for row in measured
        if row.size_bytes >= threshold
        for p in row.placements()
        if p.busbw_gbps is not None
    ]
    return statistics.fmean(busbws) if busbws else None


def parse_nccl_tests(text: str) -> NcclTestsResult:
    """Parse the text an nccl-tests binary printed, or the JSON file it wrote with ``-J``."""
    if text.lstrip().startswith("{"):
        return parse_nccl_tests_json(text)
    return _TextParse(text).result()


def nccl_version_from_code(code: int) -> str:
    """Decode NCCL_VERSION_CODE: 22809 is 2.28.9; before 2.9 it was 2804 for 2.8.4 (nccl.h)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _collective_from_program(name: str) -> str | None:
    match = _PERF_BINARY.search(name)
    return match.group(1) if match else None


def _strip_launcher_prefix(line: str) -> tuple[str, str | None]:
    """The line without its launcher's prefix, and Hydra's rank tag when it had one (Hydra repeats
    the tag inside the line, after each chunk it passed on)."""
    line = _SLURM_LABEL.sub("", line, count=1)
    line = _MPI_TAG.sub("", line, count=1)
    if match := _HYDRA_RANK.match(line):
        return line[match.end() :], match.group(1)
    return line, None


def _untagged(tokens: list[str], tag: str) -> list[str]:
    """Row tokens without the rank tag Hydra glued to the end of a chunk (`-1[0]`, `0[0]`)."""
    return [t[: -len(tag)] if t.endswith(tag) and len(t) > len(tag) else t for t in tokens]


@dataclass(frozen=True)
class _Layout:
    """The columns of the results table, as named by the header line that precedes it."""

    key_columns: tuple[str, ...]  # size, count, type[, redop][, root]
    placement_columns: tuple[str, ...]  # time|cputime, algbw, busbw, #wrong|error[, per-iteration]
    timestamp: bool

    @classmethod
    def from_header(cls, names: list[str]) -> _Layout | None:
        if names[:3] != ["size", "count", "type"]:
            return None
        timestamp = names[-1] == "timestamp"
        if timestamp:
            names = names[:-1]
        first_time = next((i for i, name in enumerate(names) if name in ("time", "cputime")), None)
        if first_time is None:
            return None
        measured = names[first_time:]
        half = len(measured) // 2
        group = tuple(measured[:half])
        if len(measured) % 2 or group != tuple(measured[half:]) or "busbw" not in group:
            return None
        return cls(tuple(names[:first_time]), group, timestamp)

    def parse_row(self, tokens: list[str]) -> Row | None:
        width = len(self.key_columns) + 2 * len(self.placement_columns) + (2 if self.timestamp else 0)
        if len(tokens) != width:
            return None
        keys = dict(zip(self.key_columns, tokens, strict=False))
        size = parse_int(keys["size"])
        count = parse_int(keys["count"])
        root = parse_int(keys["root"]) if "root" in keys else None
        if size is None or count is None or ("root" in keys and root is None):
            return None
        start = len(self.key_columns)
        out_of_place = self._placement(tokens[start : start + len(self.placement_columns)])
        in_place = self._placement(tokens[start + len(self.placement_columns) :])
        if out_of_place is None or in_place is None:
            return None
        return Row(size, count, keys["type"], keys.get("redop"), root, out_of_place, in_place)

    def _placement(self, tokens: list[str]) -> Placement | None:
        cells = dict(zip(self.placement_columns, tokens, strict=False))
        time = parse_float(cells.get("time", cells.get("cputime", "")))
        algbw = parse_float(cells["algbw"]) if "algbw" in cells else None
        busbw = parse_float(cells["busbw"])
        if time is None or busbw is None:
            return None
        wrong: int | None = None
        if cells.get("#wrong", "N/A") != "N/A":
            # Printed with %6g, so a large count reads 1.5e+06.
            wrong_count = parse_float(cells["#wrong"])
            if wrong_count is None:
                return None
            wrong = int(wrong_count)
        max_error = parse_float(cells["error"]) if "error" in cells else None
        return Placement(time, algbw, busbw, wrong, max_error)


_KEYS_WITH_ROOT = ("size", "count", "type", "redop", "root")
_KEYS_WITHOUT_ROOT = ("size", "count", "type", "redop")
# (tokens in the row, what its #wrong/error cells hold) -> layout. Since 2.13 the cells count wrong
# elements (an integer, or N/A when not checked); before, "error" held the largest difference, printed
# as 5e-07. 13 values are size..root and two groups of four; 12, the pre-2.13 rows without root.
_HEADERLESS_LAYOUTS: Mapping[tuple[int, str], _Layout] = MappingProxyType(
    {
        (13, "#wrong"): _Layout(_KEYS_WITH_ROOT, ("time", "algbw", "busbw", "#wrong"), timestamp=False),
        (13, "error"): _Layout(_KEYS_WITH_ROOT, ("time", "algbw", "busbw", "error"), timestamp=False),
        (12, "error"): _Layout(_KEYS_WITHOUT_ROOT, ("time", "algbw", "busbw", "error"), timestamp=False),
    }
)
_WRONG_CELL = re.compile(r"N/A|\d+")


def _wrong_or_error(tokens: list[str]) -> str:
    """What the row's last cell (in-place #wrong or error) holds."""
    return "#wrong" if tokens and _WRONG_CELL.fullmatch(tokens[-1]) else "error"


class _TextParse:
    """Accumulates what the lines of a text capture say; result() turns it into a record."""

    def __init__(self, text: str) -> None:
        self.collective: str | None = None
        self.collective_from_command: str | None = None
        self.ranks: dict[int, str] = {}
        self.rows: list[Row] = []
        self.layout: _Layout | None = None
        self.avg_bus_bandwidth: float | None = None
        self.footer_seen = False  # any of the table's closing lines
        self.min_bw_failed_line: str | None = None
        self.out_of_bounds: int | None = None
        self.hard_failures: list[str] = []
        self.failure_traces: list[str] = []
        self.last_nccl_errors: list[str] = []
        self.warnings: list[str] = []
        self.nccl_version: str | None = None
        self.nccl_tests_version: str | None = None
        self.validation: bool | None = None
        self.headerless_layout: _Layout | None = None
        self.transport = TransportReader()
        for raw in text.splitlines():
            line, tag = _strip_launcher_prefix(raw)
            self._line(line.strip(), tag)

    def _line(self, line: str, tag: str | None = None) -> None:
        if not line:
            return
        if line.startswith("#"):
            self._comment(line.lstrip("#").strip())
            return
        if _HARD_FAILURE.search(line):
            # A failure can be printed on the same line as a row's size/count preamble.
            self.hard_failures.append(line)
        elif _FAILURE_TRACE.match(line):
            self.failure_traces.append(line)
        elif _NCCL_WARN.search(line):
            self.warnings.append(line)
        elif self.transport.line(line):
            if (version := _NCCL_VERSION_LINE.search(line)) is not None:
                self.nccl_version = self.nccl_version or version.group(1)
        elif _PARAMETERS.match(line):
            self._comment(line)  # nccl-tests of 2018 printed it without the "#"
        elif (row := self._row(_untagged(line.split(), tag) if tag else line.split())) is not None:
            self.rows.append(row)
        elif (version := _NCCL_VERSION_LINE.search(line)) is not None:
            self.nccl_version = self.nccl_version or version.group(1)
        elif self.layout is None and self.collective_from_command is None:
            # The command line, when the capture shows it (shell prompt, mpirun, srun).
            self.collective_from_command = _collective_from_program(line)

    def _row(self, tokens: list[str]) -> Row | None:
        if self.layout is not None:
            return self.layout.parse_row(tokens)
        # No header read: a capture's tail. A row in the layout its width and #wrong cells tell.
        layout = _HEADERLESS_LAYOUTS.get((len(tokens), _wrong_or_error(tokens)))
        if layout is None or (row := layout.parse_row(tokens)) is None:
            return None
        self.headerless_layout = layout
        return row

    def _comment(self, body: str) -> None:
        if match := _TESTS_VERSION.match(body):
            self.nccl_tests_version = match.group(1)
            code = parse_int(match.group(2)) if match.group(2) else None
            if code is not None:
                self.nccl_version = self.nccl_version or nccl_version_from_code(code)
        elif match := _COLLECTIVE_STARTING.match(body):
            self.collective = _collective_from_program(match.group(1))
        elif _PARAMETERS.match(body):
            if match := _VALIDATION.search(body):
                self.validation = match.group(1) != "0"
        elif match := _DEVICE.match(body):
            if (rank := parse_int(match.group(1))) is not None:
                self.ranks.setdefault(rank, match.group(2))
        elif match := _OUT_OF_BOUNDS.match(body):
            self.footer_seen = True
            self.out_of_bounds = parse_int(match.group(1))
        elif match := _AVG_BUS_BW.match(body):
            self.footer_seen = True
            self.avg_bus_bandwidth = parse_float(match.group(1))
            if match.group(2) == "FAILED":
                self.min_bw_failed_line = f"# {body}"
        elif match := _CONCLUDED.match(body):
            self.footer_seen = True
            self.collective = self.collective or _collective_from_program(match.group(1))
        elif match := _LAST_NCCL_ERROR.match(body):
            if match.group(1):
                self.last_nccl_errors.append(f"# {body}")
        elif (layout := _Layout.from_header(body.split())) is not None:
            self.layout = layout

    def result(self) -> NcclTestsResult:
        verdict, errors = _verdict(
            footer_seen=self.footer_seen,
            rows_seen=bool(self.rows),
            table_seen=self.layout is not None or self.headerless_layout is not None,
            hard_failures=self.hard_failures,
            failure_traces=self.failure_traces,
            min_bw_failed_line=self.min_bw_failed_line,
            out_of_bounds=self.out_of_bounds,
            wrong_values=sum(p.wrong or 0 for row in self.rows for p in row.placements()),
            last_nccl_errors=self.last_nccl_errors,
        )
        warnings = list(self.warnings)
        if verdict in ("ok", "wrong_results"):
            # NCCL records every WARN as its "last error"; after a finished run it is only a warning.
            warnings.extend(self.last_nccl_errors)
        return NcclTestsResult(
            collective=self.collective or self.collective_from_command,
            ranks=len(self.ranks) or None,
            hosts=tuple(dict.fromkeys(self.ranks[rank] for rank in sorted(self.ranks))),
            rows=tuple(self.rows),
            avg_bus_bandwidth_gbps=self.avg_bus_bandwidth,
            out_of_bounds=self.out_of_bounds,
            errors=tuple(errors),
            warnings=tuple(warnings),
            verdict=verdict,
            nccl_version=self.nccl_version,
            nccl_tests_version=self.nccl_tests_version,
            validation=self.validation,
            finished=self.footer_seen,
            transport=self.transport.result(),
        )


def _verdict(
    *,
    footer_seen: bool,
    rows_seen: bool,
    table_seen: bool,
    hard_failures: list[str],
    failure_traces: list[str],
    min_bw_failed_line: str | None,
    out_of_bounds: int | None,
    wrong_values: int,
    last_nccl_errors: list[str],
) -> tuple[Verdict, list[str]]:
    errors = [*hard_failures, *failure_traces]
    if hard_failures:
        return "failed", errors + last_nccl_errors
    if footer_seen:
        if min_bw_failed_line is not None:
            return "failed", [min_bw_failed_line, *errors]
        if (out_of_bounds or 0) > 0 or wrong_values > 0:
            # The trace lines after the footer are how nccl-tests exits with code 7.
            return "wrong_results", errors
        if failure_traces:
            return "failed", errors + last_nccl_errors
        if not rows_seen:
            return "incomplete", ["footer without result rows", *errors]
        return "ok", errors
    if failure_traces or last_nccl_errors:
        return "failed", errors + last_nccl_errors
    if table_seen or rows_seen:
        return "incomplete", [_TRUNCATED]
    return "incomplete", [_NOTHING_FOUND]


def _unparsable(message: str, fmt: Literal["text", "json"]) -> NcclTestsResult:
    return NcclTestsResult(
        collective=None,
        ranks=None,
        hosts=(),
        rows=(),
        avg_bus_bandwidth_gbps=None,
        out_of_bounds=None,
        errors=(message,),
        warnings=(),
        verdict="incomplete",
        nccl_version=None,
        nccl_tests_version=None,
        validation=None,
        format=fmt,
    )


def parse_nccl_tests_json(text: str) -> NcclTestsResult:
    """Parse the file nccl-tests writes with ``-J <file>.json``.

    No captured file could be found, so this follows the writer in nccl-tests' src/util.cu
    (jsonOutputInit, writeDeviceReport, writeBenchmarkLine*, writeResultFooter, writeErrors) from
    2.17.3 to 2.19.6, JSON file versions 1 to 3:

    * top level: ``version``, ``args`` (argv; argv[0] names the collective), ``nccl_version``
      (NCCL_VERSION_CODE), ``config`` with ``validation`` and ``devices`` (one object per rank with
      ``rank`` and ``hostname``), ``results``, ``out_of_bounds``, ``average_bus_bandwidth``,
      ``errors``; before nccl-tests 2.17.9 the writer spelled the last-but-one ``average_bus_bandwidith``
      with a ``bandwidith`` member;
    * each result: ``size``, ``count``, ``type``, ``redop``, ``root`` (the printed, space-padded
      string), and ``out_of_place`` / ``in_place`` objects with ``time`` (``cpu_time`` under
      ``-C 1``), ``alg_bw``, ``bus_bw`` and ``nwrong`` (a number, or null when not checked);
    * booleans are written as the strings "true"/"false", NaN as the string "nan", and the
      average's ``okay`` is "unchecked" unless NCCL_TESTS_MIN_BW was set;
    * a killed run leaves the file unterminated; any other exit closes every open object, so a
      failed run gives valid JSON without the footer objects.
    """
    try:
        document = json.loads(text)
    except ValueError as exc:
        return _unparsable(
            f"not valid JSON, the file of a run that did not finish is unterminated: {exc}", "json"
        )
    if not isinstance(document, dict):
        return _unparsable("nccl-tests JSON output is not an object", "json")

    args = document.get("args")
    collective = None
    if isinstance(args, list) and args and isinstance(args[0], str):
        collective = _collective_from_program(args[0].rsplit("/", 1)[-1])

    config = document.get("config")
    if not isinstance(config, dict):
        config = {}
    ranks: dict[int, str] = {}
    for device in config.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("rank"), int):
            ranks.setdefault(device["rank"], str(device.get("hostname", "")))
    validation = config.get("validation")

    rows = [row for item in document.get("results") or [] if (row := _json_row(item)) is not None]

    out_of_bounds_object = document.get("out_of_bounds")
    out_of_bounds = None
    if isinstance(out_of_bounds_object, dict) and isinstance(out_of_bounds_object.get("count"), int):
        out_of_bounds = out_of_bounds_object["count"]

    average = document.get("average_bus_bandwidth", document.get("average_bus_bandwidith"))
    footer_seen = isinstance(average, dict)
    avg_bus_bandwidth = None
    min_bw_failed_line = None
    if isinstance(average, dict):
        avg_bus_bandwidth = _json_number(average.get("bandwidth", average.get("bandwidith")))
        if average.get("okay") in ("false", False):
            min_bw_failed_line = f"average bus bandwidth {avg_bus_bandwidth} is below NCCL_TESTS_MIN_BW"

    last_errors = [e for e in document.get("errors") or [] if isinstance(e, str) and e]
    verdict, errors = _verdict(
        footer_seen=footer_seen,
        rows_seen=bool(rows),
        table_seen="results" in document,
        hard_failures=[],
        failure_traces=[],
        min_bw_failed_line=min_bw_failed_line,
        out_of_bounds=out_of_bounds,
        wrong_values=sum(p.wrong or 0 for row in rows for p in row.placements()),
        last_nccl_errors=last_errors,
    )
    nccl_code = document.get("nccl_version")
    return NcclTestsResult(
        collective=collective,
        ranks=len(ranks) or None,
        hosts=tuple(dict.fromkeys(ranks[rank] for rank in sorted(ranks))),
        rows=tuple(rows),
        avg_bus_bandwidth_gbps=avg_bus_bandwidth,
        out_of_bounds=out_of_bounds,
        errors=tuple(errors),
        warnings=tuple(last_errors) if verdict in ("ok", "wrong_results") else (),
        verdict=verdict,
        nccl_version=nccl_version_from_code(nccl_code) if isinstance(nccl_code, int) else None,
        nccl_tests_version=None,
        validation=bool(validation) if isinstance(validation, int) else None,
        format="json",
        finished=footer_seen,
    )


def _json_number(value: object) -> float | None:
    # jsonDouble writes NaN as the string "nan".
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return number_or_none(value)


def _json_row(item: object) -> Row | None:
    if not isinstance(item, dict):
        return None
    size, count = item.get("size"), item.get("count")
    if not isinstance(size, int) or not isinstance(count, int):
        return None
    out_of_place = _json_placement(item.get("out_of_place"))
    in_place = _json_placement(item.get("in_place"))
    if out_of_place is None and in_place is None:
        # The writer opens a result before measuring; a run that failed there leaves it bare.
        return None
    return Row(
        size_bytes=size,
        count=count,
        type=str(item.get("type", "")),
        redop=item.get("redop") if isinstance(item.get("redop"), str) else None,
        root=parse_int(str(item.get("root", "")).strip()),
        out_of_place=out_of_place,
        in_place=in_place,
    )


def _json_placement(value: object) -> Placement | None:
    if not isinstance(value, dict):
        return None
    wrong = _json_number(value.get("nwrong"))
    return Placement(
        time_us=_json_number(value.get("time", value.get("cpu_time"))),
        algbw_gbps=_json_number(value.get("alg_bw")),
        busbw_gbps=_json_number(value.get("bus_bw")),
        wrong=None if wrong is None else int(wrong),
    )


def _transport(parse: ProbeParse) -> Transport | None:
    return parse.transport if isinstance(parse, NcclTestsResult) else None


KIND = ProbeKind(
    name="nccl-tests",
    parse=parse_nccl_tests,
    unit="GB/s",
    headline="bus bandwidth at the large message sizes (those within 1/4 of the largest)",
    exit_code_meaning=exit_code_meaning,
    wrong_values="#wrong of every checked cell, summed",
    transport=_transport,
)
