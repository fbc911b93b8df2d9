"""Pure parsers for fabric-probe outputs: text in, frozen records out, no I/O.

``parse(kind, text)`` is the entry point ``clusterhealth probe parse --kind KIND FILE`` needs; each
result has ``to_dict()`` (JSON-serializable), a ``verdict`` and a headline
``bandwidth_bytes_per_second`` for ``clusterhealth_probe_bandwidth_bytes_per_second``.
"""

from __future__ import annotations

from collections.abc import Callable

from clusterhealth.checks.probe_parsers._common import ProbeParse, Verdict
from clusterhealth.checks.probe_parsers.ib_write_bw import IbWriteBwResult, parse_ib_write_bw
from clusterhealth.checks.probe_parsers.iperf3 import Iperf3Result, parse_iperf3
from clusterhealth.checks.probe_parsers.nccl_tests import (
    NcclTestsResult,
    exit_code_meaning,
    parse_nccl_tests,
)

KINDS = ("nccl-tests", "iperf3", "ib_write_bw")

_PARSERS: dict[str, Callable[[str], ProbeParse]] = {
    "nccl-tests": parse_nccl_tests,
    "iperf3": parse_iperf3,
    "ib_write_bw": parse_ib_write_bw,
}


def parse(kind: str, text: str) -> ProbeParse:
    """Parse one saved probe output. An unknown kind raises ValueError; bad text never raises."""
    try:
        parser = _PARSERS[kind]
    except KeyError:
        raise ValueError(f"unknown probe output kind {kind!r}; expected one of {', '.join(KINDS)}") from None
    return parser(text)


__all__ = [
    "KINDS",
    "IbWriteBwResult",
    "Iperf3Result",
    "NcclTestsResult",
    "ProbeParse",
    "Verdict",
    "exit_code_meaning",
    "parse",
    "parse_ib_write_bw",
    "parse_iperf3",
    "parse_nccl_tests",
]
