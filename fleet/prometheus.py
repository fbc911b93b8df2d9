"""Prometheus's HTTP API as the fleet-side commands read it: one client, one way to say what is missing.

`analyze`, `model --prometheus`, `lab` (and the report and the remediator) read through this
module alone: ``/api/v1/query``, ``/api/v1/query_range`` and ``/api/v1/series``, with what each
call cost (requests, bytes, seconds waiting and decoding).

The same calls read VictoriaMetrics, Thanos and Mimir, which answer Prometheus's API with their
own habits; every request asks each of them for a whole, unshifted answer (``WHOLE_ANSWER``).

An answer can be partial without being an error. Prometheus says so in ``warnings`` (a remote
store or a federated source that did not answer); VictoriaMetrics' cluster and some Thanos and
Mimir set-ups answer ``"isPartial": true`` instead (some storage nodes did not answer). Both are
recorded the same way, in ``Prometheus.warnings``: a caller that must not act on partial data asks
``partial_since(mark)`` after its reads. An unreachable server, an HTTP error or an answer that is
not the API's JSON raises `NoVerdict`, naming the server and what it answered.

The rest reads Prometheus's answers as they come, without trusting them: a series' scrape target
(``target_of``), its points (``points``), a sample's text as a number (``number``), and range
queries cut into consecutive windows (``Windows``), so that each point holds only the samples
scraped inside its window, whichever store answers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import gc
import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# A range query: (promql, start, end, step).
Query = tuple[str, float, float, float]

# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class NoVerdict(Exception):
    """What was asked cannot be answered from Prometheus: the message names what is missing
    (the server unreachable or answering an error, no data, partial data)."""


class Partial(NoVerdict):
    """No verdict because the data is partial (a caller that accepts it analyses the rest)."""


def parse_duration(text: str) -> float:
    """A Prometheus duration (``6h``, ``1h30m``, ``2d``) in seconds; ValueError otherwise."""
    if not text or not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", text):
        raise ValueError(f"expected a duration such as 6h, 90m or 1d12h, got {text!r}")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))
    if seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return float(seconds)


def valid_url(url: str) -> bool:
    """An address the client can ask: http(s)://HOST:PORT[/path]."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


# Asked of every store with every request; Prometheus and single-node VictoriaMetrics ignore what
# is not theirs. VictoriaMetrics otherwise answers a range query of 50 points or more on a grid
# moved to multiples of its step (to cache it), so that two queries of one window disagree on its
# time, and an instant query of its newest 30 s (-search.latencyOffset) from 30 s earlier
# (`nocache`); its cluster answers without the storage nodes that did not answer
# (`deny_partial_response`), as Thanos' querier does (`partial_response`). A partial answer that
# comes anyway still says so (IS_PARTIAL).
WHOLE_ANSWER = {"nocache": "1", "deny_partial_response": "1", "partial_response": "false"}

# VictoriaMetrics replaces the points of a range query that fall in its newest 30 s
# (-search.latencyOffset) with the point before them when the step is under a minute
# (-search.maxStepForPointsAdjustment, at its default): narrower windows are asked in interleaved
# queries with a step of a minute or more.
UNADJUSTED_STEP_MS = 60_000

# What a store that answers `isPartial` means by it, said once per answer like a warning.
IS_PARTIAL = "the store answered isPartial: true (some of its storage nodes did not answer)"


@dataclass
class Prometheus:
    """The few calls of Prometheus's HTTP API the fleet-side commands make, and what they cost."""

    url: str
    timeout: float = 30.0
    # Every partial answer's warnings, in the order received (``mark`` and ``partial_since`` give
    # those of a stretch of reads, so one client can serve a loop).
    warnings: list[str] = field(default_factory=list)
    requests: int = 0
    bytes_read: int = 0
    seconds_waiting: float = 0.0  # for Prometheus's answers (evaluating, encoding, sending)
    seconds_decoding: float = 0.0  # decoding the JSON
    # Range queries in flight at once (`query_ranges`): the time of a read is then Prometheus's or
    # the reader's, whichever is longer, rather than their sum, and a Prometheus with cores to
    # spare evaluates them side by side. seconds_waiting is then summed over the requests in
    # flight (it may exceed the wall time); the answers are decoded one at a time, in turn.
    parallel: int = 4
    _counting: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _left_edge: bool | None = field(default=None, repr=False)  # holds_left_edge's answer, once asked

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """An instant query's ``result`` (a list of ``{"metric": labels, "value": [t, text]}``)."""
        return self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's ``result`` (a list of ``{"metric": labels, "values": [[t, text], ...]}``)."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        return self._get("/api/v1/query_range", params)

    def series(self, match: str, start: float, end: float) -> list[dict[str, Any]]:
        """The label sets of the series with samples between start and end (no sample is read),
        each as ``{"metric": labels}`` like a query's result."""
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return [{"metric": labels} for labels in self._get("/api/v1/series", params, "data")]

    def label_values(self, name: str, match: str, start: float, end: float) -> list[str]:
        """The values of label ``name`` on the series ``match`` selects that have samples between
        start and end, from the index (no sample is read): Prometheus and VictoriaMetrics answer
        those of every block (Prometheus) or day (VictoriaMetrics) that overlaps, a superset."""
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return [str(v) for v in self._get(f"/api/v1/label/{name}/values", params, "data")]

    def holds_left_edge(self, at: float) -> bool:
        """Whether the store's range selector ``[w]`` at ``t`` holds a sample that lies exactly at
        ``t - w``: Prometheus before 3.0 does (``[t - w, t]``), VictoriaMetrics and Prometheus 3 do
        not (``(t - w, t]``). Asked once, of a subquery whose points fall on both edges."""
        if self._left_edge is None:
            found = self.query("count_over_time(vector(1)[2s:1s])", math.floor(at))
            self._left_edge = [number(v) for _, v in points(found[0])] == [3.0] if found else False
        return self._left_edge

    def mark(self) -> int:
        """Where the warnings stand now, for ``partial_since``."""
        return len(self.warnings)

    def partial_since(self, mark: int = 0) -> list[str]:
        """The partial answers received since ``mark``, each said once, as a problem's text."""
        return [
            f"Prometheus answered with partial data: {text}" for text in dict.fromkeys(self.warnings[mark:])
        ]

    def query_ranges(self, asked: Iterable[Query]) -> Iterator[list[dict[str, Any]]]:
        """Range queries' ``result`` lists, in the order asked: up to ``parallel`` of them in flight
        at once, so that Prometheus evaluates the next while the last answer is decoded and used.
        Each answer is taken (its warnings recorded) when its turn comes, so that what a reader
        sees does not depend on which answer came first, and only the answers ahead of the reader
        are held."""
        requests = (
            ("/api/v1/query_range", {"query": q, "start": f"{a:.3f}", "end": f"{b:.3f}", "step": f"{c:.3f}"})
            for q, a, b, c in asked
        )
        if self.parallel <= 1:
            for path, params in requests:
                yield self._get(path, params)
            return
        with concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix="prometheus") as pool:
            ahead: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
            try:
                for path, params in requests:
                    ahead.append(pool.submit(self._fetch, path, params))
                    if len(ahead) > self.parallel:
                        yield self._answer(ahead.popleft().result())
                while ahead:
                    yield self._answer(ahead.popleft().result())
            finally:
                for future in ahead:
                    future.cancel()

    def _get(self, path: str, params: dict[str, str], key: str = "result") -> list[dict[str, Any]]:
        return self._answer(self._fetch(path, params), key)

    def _fetch(self, path: str, params: dict[str, str]) -> bytes:
        """One request's answer, undecoded (any thread); NoVerdict when there is none."""
        url = self.url.rstrip("/") + path + "?" + urllib.parse.urlencode({**params, **WHOLE_ANSWER})
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                body: bytes = response.read()
        except urllib.error.HTTPError as err:
            raise NoVerdict(f"Prometheus at {self.url} answered {err.code}: {_api_error(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise NoVerdict(f"cannot reach Prometheus at {self.url}: {reason}") from None
        with self._counting:
            self.requests += 1
            self.bytes_read += len(body)
            self.seconds_waiting += time.perf_counter() - began
        return body

    def _decode(self, body: bytes) -> Any:
        """An answer's JSON, decoded in the reader's thread when its turn comes: the answers
        waiting their turn are held as bytes, several times smaller than their Python objects."""
        began = time.perf_counter()
        try:
            return json.loads(body)
        except ValueError:
            raise NoVerdict(f"{self.url} did not answer as Prometheus's HTTP API does (not JSON)") from None
        finally:
            self.seconds_decoding += time.perf_counter() - began

    def _answer(self, body: bytes, key: str = "result") -> list[dict[str, Any]]:
        """An answer's result list, its warnings recorded (in the reader's thread)."""
        document = self._decode(body)
        if not isinstance(document, dict) or document.get("status") != "success":
            raise NoVerdict(f"Prometheus at {self.url} answered an error: {document!r:.200}")
        warnings = document.get("warnings")
        if isinstance(warnings, list):
            self.warnings.extend(str(w) for w in warnings if w)
        if document.get("isPartial") is True:
            self.warnings.append(IS_PARTIAL)
        data = document.get("data")
        result = data if key == "data" else (data or {}).get(key) if isinstance(data, dict) else None
        if not isinstance(result, list):
            raise NoVerdict(f"Prometheus at {self.url} answered without a result list")
        return result


def _api_error(err: urllib.error.HTTPError) -> str:
    try:
        document = json.loads(err.read())
        return f"{document.get('errorType', '')}: {document.get('error', '')}".strip(": ")
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


@dataclass(frozen=True)
class Windows:
    """Consecutive windows of ``width`` seconds ending at ``end``: (end - count*width, end]."""

    end: float
    width: float
    count: int
    # The store's range selectors hold a sample at their left edge (`Prometheus.holds_left_edge`):
    # the selector is a millisecond shorter, so that a sample on the edge between two windows (a
    # timestamp is a whole millisecond) is read in one of them.
    left_edge: bool = False

    @property
    def selector(self) -> str:
        width_ms = max(round(self.width * 1000), 1)
        return f"[{max(width_ms - 1, 1) if self.left_edge else width_ms}ms]"

    def read(
        self, prometheus: Prometheus, promql: str, per_query: int = MAX_POINTS - 1
    ) -> list[dict[str, Any]]:
        """A range query evaluated at each window's end, in queries of at most ``per_query``
        windows (and under Prometheus's limit of points): the answers of `each`, joined.

        A series asked in two queries comes back twice, each with its points of that query: the
        readers take points one by one, so the parts need no joining."""
        return [series for part in self.each(prometheus, promql, per_query) for series in part]

    def each(
        self, prometheus: Prometheus, promql: str, per_query: int = MAX_POINTS - 1
    ) -> Iterator[list[dict[str, Any]]]:
        """Each query's answer of `read`, in order, as it comes (a reader that is done with an
        answer before taking the next holds one at a time)."""
        return prometheus.query_ranges(self.queries(promql, per_query))

    def queries(self, promql: str, per_query: int = MAX_POINTS - 1) -> Iterator[Query]:
        """The range queries of `read`: (promql, start, end, step).

        The steps are computed in whole milliseconds from the same origin for every query, so
        that the samples of two queries at one window carry the same timestamp. Windows narrower
        than ``UNADJUSTED_STEP_MS`` are asked every ``stride``-th in one query, ``stride`` queries
        side by side."""
        end_ms, width_ms = round(self.end * 1000), max(round(self.width * 1000), 1)
        stride = -(-UNADJUSTED_STEP_MS // width_ms)
        chunk = max(1, min(per_query, MAX_POINTS - 1))
        for first in range(0, self.count, chunk):
            last = min(first + chunk, self.count) - 1
            for lead in range(first, min(first + stride, last + 1)):
                tail = last - (last - lead) % stride
                # Window i (0 = the oldest) ends at end - (count - 1 - i) * width.
                start = (end_ms - (self.count - 1 - lead) * width_ms) / 1000
                stop = (end_ms - (self.count - 1 - tail) * width_ms) / 1000
                yield promql, start, stop, stride * width_ms / 1000


Target = tuple[tuple[str, str], ...]  # a scrape target's labels (instance, job, ...), sorted


def target_of(labels: Mapping[str, str], own: tuple[str, ...]) -> Target:
    """The scrape target a series came from: its labels but the metric's name and its own."""
    rest = dict(labels)
    for name in ("__name__", *own):
        rest.pop(name, None)
    return tuple(sorted(rest.items()))


def show_target(target: Target) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in target) + "}"


def number(text: Any) -> float | None:
    """A finite number from Prometheus's text of it; None for anything else (NaN, garbage)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def points(series: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(time, value) of a matrix series (``values``) or an instant vector's sample (``value``)."""
    out = []
    raw: Any = series.get("values") if "values" in series else [series.get("value")]
    for pair in raw or ():
        try:
            out.append((float(pair[0]), float(pair[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return out


@contextlib.contextmanager
def no_collection_pauses() -> Iterator[None]:
    """A day of a thousand nodes decodes into millions of small lists, none of them in a cycle:
    the cyclic garbage collector would walk them all again and again as they pile up (a third of
    the decoding time), for nothing to collect."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
