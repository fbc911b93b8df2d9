"""What every probe parser's result shares: the verdict vocabulary and the headline interface."""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

# ok: the run finished and its own checks passed.
# wrong_results: the run finished but the collective produced wrong data (nccl-tests only).
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

    def to_dict(self) -> dict[str, Any]: ...


def finite_or_none(value: float | None) -> float | None:
    """NaN and infinities are not JSON and not measurements; the tools print them on 0/0."""
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return value


def parse_float(token: str) -> float | None:
    try:
        return finite_or_none(float(token))
    except ValueError:
        return None


def parse_int(token: str) -> int | None:
    try:
        return int(token)
    except ValueError:
        return None
