"""What every probe parser's result shares: the verdict vocabulary and the headline interface."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from clusterhealth.checks.probe_parsers.nccl_transport import Transport

# ok: the run finished and its own checks passed.
# wrong_results: the run finished but the tool found the data it moved wrong (nccl-tests' #wrong,
#   nvbandwidth's pattern check).
# failed: the tool reported an error.
# incomplete: the output stops before the results, or holds none (crash, kill, timeout, garbage).
Verdict = Literal["ok", "wrong_results", "failed", "incomplete"]


class ProbeParse(Protocol):
    """A parsed probe output: typed fields, a headline figure in base units, and a JSON view."""

    @property
    def verdict(self) -> Verdict: ...

    @property
    def errors(self) -> tuple[str, ...]: ...

    @property
    def bandwidth_bytes_per_second(self) -> float | None: ...

    @property
    def peak_bandwidth_bytes_per_second(self) -> float | None: ...

    @property
    def wrong_values(self) -> int | None:
        """What the tool found wrong (its declaration's `wrong_values` says what); None for tools
        that do not check."""
        ...

    @property
    def problem(self) -> str | None:
        """What the output says went wrong, in a few words, for the reason of a failed run."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ProbeKind:
    """What a probe kind declares about itself: how its output is read, the unit its users read
    bandwidth in, what its headline figure is, and what its exit codes mean.

    Each parser module declares one as `KIND`; the registry in `__init__` lists them, and the
    config's accepted kinds, the evaluation's reasons and the metrics' HELP derive from it.
    """

    name: str
    parse: Callable[[str], ProbeParse]
    # The unit the tool prints and its users think in, for reasons: "GB/s" (bytes) or "Gbit/s".
    unit: Literal["GB/s", "Gbit/s"]
    # What `bandwidth_bytes_per_second` is, for the HELP of clusterhealth_probe_bandwidth_*.
    headline: str
    # What a non-zero exit code means beyond "exited N"; None when the tool's codes say no more.
    exit_code_meaning: Callable[[int], str] | None = None
    # What `wrong_values` counts, for the HELP of clusterhealth_probe_wrong_values; None for a tool
    # that does not check the data it moved.
    wrong_values: str | None = None
    # Pairwise probe groups (checks/fabric): the tool runs as a server on one node and as a client
    # on its partner, and each end's output holds the headline figure of their meeting.
    pairwise: bool = False
    # Substrings of a client's output that mean nothing listened on the server's port: the partner
    # is absent (busy, its server still starting, its agent down). A pairwise client retries until
    # its connect deadline and then records `skipped`, never a failure of the fabric.
    refused: tuple[str, ...] = ("Connection refused",)
    # The other end's address as the tool printed it, when it does: the server end of a pairwise
    # meeting checks that the client it served is the partner it expected.
    remote_address: Callable[[ProbeParse], str | None] | None = None
    # Which transports the run used, for a tool that says (NCCL's INFO lines): a run that fell back
    # to sockets or shared memory where the node has better is degraded (checks/probes/transport.py).
    transport: Callable[[ProbeParse], Transport | None] | None = None

    def rate(self, bytes_per_second: float) -> str:
        return format_rate(bytes_per_second, self.unit)


def format_rate(bytes_per_second: float, unit: Literal["GB/s", "Gbit/s"]) -> str:
    if unit == "Gbit/s":
        return f"{bytes_per_second * 8 / 1e9:.2f} Gbit/s"
    return f"{bytes_per_second / 1e9:.2f} GB/s"


def undocumented_exit_code(code: int) -> str:
    """What an exit code the tool does not document means: a signal (negative as Python reports
    it, 128 + N as a shell does) or nothing known."""
    if code < 0:
        return f"killed by signal {-code}"
    if code > 128:
        return f"killed by signal {code - 128}"
    return f"unknown exit code {code}"


def finite_or_none(value: float | None) -> float | None:
    """NaN and infinities are not JSON and not measurements; the tools print them on 0/0."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return value


def number_or_none(value: int | float) -> float | None:
    """A JSON number as a measurement: None for NaN, infinities, and integers too large for a float
    (float() of a 400-digit integer raises OverflowError)."""
    try:
        return finite_or_none(float(value))
    except OverflowError:
        return None


def parse_float(token: str) -> float | None:
    try:
        return finite_or_none(float(token))
    except ValueError:
        return None


# Wider than any count or size a tool prints (64 bits); int() of thousands of digits would raise.
MAX_INT_DIGITS = 20


def parse_int(token: str) -> int | None:
    if len(token.strip().lstrip("+-")) > MAX_INT_DIGITS:
        return None
    try:
        return int(token)
    except ValueError:
        return None
