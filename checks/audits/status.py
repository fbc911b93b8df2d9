"""One status type for every check, and what the checks share: results, precedence, patterns."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum


class Status(IntEnum):
    """A check's status, valued as Nagios plugins exit (and `clusterhealth_check_status` exports).

    The numbers are not the precedence: a node with an UNKNOWN and a WARNING result is UNKNOWN
    (a check that could not run may hide a critical fault), and CRITICAL, which is known, outranks
    UNKNOWN. That is the Nagios/NHC rule `worst` applies.
    """

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def rank(self) -> int:
        """CRITICAL > UNKNOWN > WARNING > OK."""
        return _RANK[self]


_RANK = {Status.OK: 0, Status.WARNING: 1, Status.UNKNOWN: 2, Status.CRITICAL: 3}
OK, WARNING, CRITICAL, UNKNOWN = Status.OK, Status.WARNING, Status.CRITICAL, Status.UNKNOWN

# A policy's `severity: warning|critical`.
SEVERITY_STATUS = {"warning": Status.WARNING, "critical": Status.CRITICAL}
# The subject of a check that covers every subject but could not run at all.
NODE = "node"


@dataclass(frozen=True)
class CheckResult:
    check: str
    subject: str
    status: Status
    message: str


def worse(a: Status, b: Status) -> Status:
    return max(a, b, key=lambda s: s.rank)


def worst(results: Iterable[CheckResult]) -> Status:
    """The node's status and `clusterhealth check`'s exit code: CRITICAL > UNKNOWN > WARNING > OK."""
    return max((r.status for r in results), key=lambda s: s.rank, default=Status.OK)


def natural(name: str) -> list[int | str]:
    """ibp64s0 before ibp154s0."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def compile_pattern(pattern: str) -> re.Pattern[str] | None:
    # The loader rejects bad patterns; a Policy built in code may still hold one.
    try:
        return re.compile(pattern) if pattern else None
    except re.error:
        return None


def bad_pattern(check: str, pattern: str, what: str) -> CheckResult:
    return CheckResult(
        check,
        pattern or NODE,
        Status.UNKNOWN,
        f"policy: {what} pattern {pattern!r} is not a valid regular expression",
    )
