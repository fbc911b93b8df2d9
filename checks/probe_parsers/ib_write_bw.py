"""Parse the text perftest's ``ib_write_bw`` prints (client or server side).

Facts from perftest's source (linux-rdma/perftest, src/perftest_parameters.[ch], write_bw.c):

* The table header is RESULT_FMT, `` #bytes #iterations BW peak[MB/sec] BW average[MB/sec]
  MsgRate[Mpps]``, or RESULT_FMT_G with ``[Gb/sec]`` under ``--report_gbits``; since perftest
  24.07 the default unit is printed ``MiB/sec``. ``--report-both`` and QoS runs add columns.
* The unit behind ``MB/sec`` was always 2^20 bytes: print_report_bw divides by a format_factor of
  0x100000 for MBS and 125000000 (10^9 bits) for GBS. Perftest 24.07 only fixed the label.
* The peak is not measured under ``-D`` (duration) and then prints as 0.00.
* Failures go to stderr as plain sentences: ``Couldn't connect to host:port``,
  `` Unable to init the socket connection``, `` Did not detect devices``, ``Failed status ...``,
  ``Error: BW result is below bw limit``.
* Other lines can land inside the table, e.g. ``Conflicting CPU frequency values detected``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from clusterhealth.checks.probe_parsers._common import ProbeKind, Verdict, parse_float, parse_int

MEBIBYTE = 0x100000
GIGABIT_IN_BYTES = 125_000_000
UNIT_BYTES: Mapping[str, int] = MappingProxyType(
    {"MB/sec": MEBIBYTE, "MiB/sec": MEBIBYTE, "Gb/sec": GIGABIT_IN_BYTES}
)

_HEADER = re.compile(r"#bytes\s.*BW average\[([^\]]+)\]")
_TITLE = re.compile(r"^\s*(\S.*\bBW Test)\s*$")
_FIELD = {
    "device": re.compile(r"\bDevice\s*:\s*(\S+)"),
    "qps": re.compile(r"\bNumber of qps\s*:\s*(\d+)"),
    "link_type": re.compile(r"\bLink type\s*:\s*(\S+)"),
    "connection_type": re.compile(r"\bConnection type\s*:\s*(\S+)"),
}
# Sentence starts of perftest's error messages (fprintf(stderr, ...) in its sources).
_ERROR_STARTS = (
    "Couldn't",
    "Unable to",
    "Failed",
    "Error:",
    "Bad wc status",
    "Completion with error",
    "Did not detect devices",
    "No IB devices found",
    "IB device",
    "Problem in resolving",
    "Parser function exited with Error",
    "ethernet_read_keys",
)
_WARNING_STARTS = ("Conflicting CPU frequency", "WARNING:", "Warning:")

_TRUNCATED = "output ends before the result row: the run did not finish (crash, kill or timeout)"
_NOTHING_FOUND = "no ib_write_bw result table or error message found"


@dataclass(frozen=True)
class BandwidthRow:
    size_bytes: int
    iterations: int
    bw_peak: float | None  # in the table's unit; None when not measured (printed 0.00)
    bw_average: float
    msg_rate_mpps: float | None
    unit_bytes: int  # bytes per printed unit per second

    @property
    def peak_bytes_per_second(self) -> float | None:
        return None if self.bw_peak is None else self.bw_peak * self.unit_bytes

    @property
    def average_bytes_per_second(self) -> float:
        return self.bw_average * self.unit_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "size_bytes": self.size_bytes,
            "iterations": self.iterations,
            "bw_peak": self.bw_peak,
            "bw_average": self.bw_average,
            "msg_rate_mpps": self.msg_rate_mpps,
            "peak_bytes_per_second": self.peak_bytes_per_second,
            "average_bytes_per_second": self.average_bytes_per_second,
        }


@dataclass(frozen=True)
class IbWriteBwResult:
    test: str | None  # e.g. "RDMA_Write BW Test", "RDMA_Write Bidirectional BW Test"
    device: str | None
    link_type: str | None
    connection_type: str | None
    qps: int | None
    unit: str | None  # as printed: "MB/sec", "MiB/sec" or "Gb/sec"
    rows: tuple[BandwidthRow, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    verdict: Verdict

    @property
    def headline_row(self) -> BandwidthRow | None:
        """The row of the largest message: in an ``-a`` sweep the small sizes measure message rate.

        Of equal sizes (``--run_infinitely`` reprints the row) the last one printed counts.
        """
        if not self.rows:
            return None
        largest = max(row.size_bytes for row in self.rows)
        return [row for row in self.rows if row.size_bytes == largest][-1]

    @property
    def message_size_bytes(self) -> int | None:
        row = self.headline_row
        return None if row is None else row.size_bytes

    @property
    def iterations(self) -> int | None:
        row = self.headline_row
        return None if row is None else row.iterations

    @property
    def bandwidth_bytes_per_second(self) -> float | None:
        row = self.headline_row
        return None if row is None else row.average_bytes_per_second

    @property
    def peak_bandwidth_bytes_per_second(self) -> float | None:
        row = self.headline_row
        return None if row is None else row.peak_bytes_per_second

    @property
    def wrong_values(self) -> int | None:
        return None

    @property
    def problem(self) -> str | None:
        return self.errors[0] if self.errors else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "ib_write_bw",
            "test": self.test,
            "device": self.device,
            "link_type": self.link_type,
            "connection_type": self.connection_type,
            "qps": self.qps,
            "unit": self.unit,
            "rows": [row.to_dict() for row in self.rows],
            "message_size_bytes": self.message_size_bytes,
            "iterations": self.iterations,
            "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
            "peak_bandwidth_bytes_per_second": self.peak_bandwidth_bytes_per_second,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "verdict": self.verdict,
        }


def parse_ib_write_bw(text: str) -> IbWriteBwResult:
    """Parse ib_write_bw output (stdout and stderr together). Never raises."""
    fields: dict[str, str] = {}
    test: str | None = None
    unit: str | None = None
    unit_bytes: int | None = None
    qos = False
    rows: list[BandwidthRow] = []
    errors: list[str] = []
    warnings: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(_ERROR_STARTS):
            errors.append(line)
        elif line.startswith(_WARNING_STARTS):
            warnings.append(line)
        elif header := _HEADER.search(line):
            unit = header.group(1)
            unit_bytes = UNIT_BYTES.get(unit)
            qos = "#sl" in line
            if unit_bytes is None:
                errors.append(f"unknown bandwidth unit [{unit}] in {line!r}")
        elif unit_bytes is not None and (row := _row(line.split(), unit_bytes, qos)) is not None:
            rows.append(row)
        elif test is None and (title := _TITLE.match(line)):
            test = title.group(1)
        else:
            for name, pattern in _FIELD.items():
                if name not in fields and (found := pattern.search(line)):
                    fields[name] = found.group(1)

    verdict: Verdict
    if errors:
        verdict = "failed"
    elif rows:
        verdict = "ok"
    else:
        verdict = "incomplete"
        errors.append(_TRUNCATED if unit is not None or test is not None else _NOTHING_FOUND)
    qps = fields.get("qps")
    return IbWriteBwResult(
        test=test,
        device=fields.get("device"),
        link_type=fields.get("link_type"),
        connection_type=fields.get("connection_type"),
        qps=None if qps is None else parse_int(qps),
        unit=unit,
        rows=tuple(rows),
        errors=tuple(errors),
        warnings=tuple(warnings),
        verdict=verdict,
    )


def _row(tokens: list[str], unit_bytes: int, qos: bool) -> BandwidthRow | None:
    if qos:
        # RESULT_FMT_QOS puts the service level between the size and the iteration count.
        tokens = tokens[:1] + tokens[2:]
    if len(tokens) < 4:
        return None
    size, iterations = parse_int(tokens[0]), parse_int(tokens[1])
    peak, average = parse_float(tokens[2]), parse_float(tokens[3])
    if size is None or iterations is None or peak is None or average is None:
        return None
    msg_rate = parse_float(tokens[4]) if len(tokens) > 4 else None
    return BandwidthRow(
        size_bytes=size,
        iterations=iterations,
        bw_peak=peak if peak > 0 else None,
        bw_average=average,
        msg_rate_mpps=msg_rate,
        unit_bytes=unit_bytes,
    )


KIND = ProbeKind(
    name="ib_write_bw",
    parse=parse_ib_write_bw,
    unit="Gbit/s",
    headline="average bandwidth at the largest message size",
    # `ib_write_bw -p PORT` waits for one client; `ib_write_bw -p PORT HOST` is the client, and both
    # print the result table. perftest says "Couldn't connect to HOST:PORT" whether nothing
    # listened or the host is unreachable, so both read as an absent partner (skipped): safe, as
    # it can never count against the fabric, but a partner that is down is not told apart.
    pairwise=True,
    refused=("Connection refused", "Couldn't connect to"),
)
