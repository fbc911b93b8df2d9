"""`clusterhealth analyze`: read a pairwise group's results back from Prometheus and name suspects.

It uses Prometheus's HTTP API (``/api/v1/query_range`` and ``/api/v1/query``) and the Fabric
series of SPEC alone, and reads them as **samples as scraped**, never as values Prometheus
evaluated forward. A plain range query answers, at each step, with a series' latest sample within
the lookback delta (5 minutes by default) when no staleness marker ended the series: after a
backfill, a restart of Prometheus, in a federated copy or a remote store, a partner's result then
shows up again beside the next round's number, one meeting counted twice.

So the window is cut into consecutive *windows* of a fraction of a round (``window_width``),
and each is read through range selectors, which hold only the samples scraped inside it:

* ``max_over_time(round[w]) == min_over_time(round[w])``: the node's round in the window, given
  only when every sample of its ``clusterhealth_probe_round`` in the window has the same value;
* ``last_over_time(bandwidth[w])``: the last result of each partner scraped in the window, and
  ``last_over_time(peer_success[w]) == 0``: the runs that did not meet their expectation (one
  that measured nothing exports no bandwidth);

A result scraped in a window belongs to the round of the same node's samples in that window (it
came with one of them, in the same scrape), so each result is assigned to the round the exporting
node's own ``clusterhealth_probe_round`` had when it was scraped. A window in which the node's
round changed is left out: a result is exported for a good part of a round, so it is read from the
windows before or after. The windows follow the group's period, read back from the latest round
number (rounds are numbered from the Unix epoch), so the cost is per round, not per scrape. The
per-partner families are asked a few rounds at a time (a node exports a new partner's series every
round, and Prometheus evaluates every selected series at every step), and every range query stays
under Prometheus's 11,000 points per series.

Each suspect is priced (``impact``, checks/cost.py) for a stated workload (``--params``,
``--bytes-per-param``, ``--gpus``, ``--compute-seconds``, ``--overlap``), and, where
``clusterhealth_gpu_job_info`` names the jobs running on a suspect's nodes at the end of the
window, for each of them with its own GPU count (one more instant query; without that family
nothing changes).

A Prometheus answer with ``warnings`` (a remote store or a federated source that did not answer)
is partial data, like results that cannot be tied to a node: no verdict without
``--allow-partial``, and with it the verdict says it is partial (``partial`` in the JSON).

Exit codes: 0 no suspect, 1 suspects, 2 bad arguments, 3 no verdict (Prometheus unreachable or
answering an error, no data, partial data, not enough evidence).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from clusterhealth.checks import cost
from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric.analysis import Analysis, Meeting, Rules

EXIT_NO_SUSPECT, EXIT_SUSPECTS, EXIT_USAGE, EXIT_NO_VERDICT = 0, 1, 2, 3
DEFAULT_WINDOW = "6h"
# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000
# The windows a round is read in. A result is read when it stays exported over a whole window
# in which its node's round did not change. The shortest lived is the confirming meeting's, from
# its end to the round's (at the default timing half a round less up to two minutes of runs):
# windows as wide as that, between an eighth and a quarter of a round. Wider windows are fewer
# points to send and decode; Prometheus reads every sample once whatever the width.
CONFIRMING_RUNS_SECONDS = 120.0


def window_width(period: float) -> float:
    """The default width of the windows the history is read in, for a group's period."""
    return min(period / 4, max(period / 8, period / 2 - CONFIRMING_RUNS_SECONDS))


ROUNDS_PER_QUERY = 4  # rounds of per-partner series asked in one range query

JOB_INFO = "clusterhealth_gpu_job_info"
# The jobs priced are those running at the end of the window: seen within Prometheus's default
# lookback delta.
JOBS_LOOKBACK = "5m"
# clusterhealth_gpu_job_info's own labels; the rest is the scrape target. The workload's `job`
# reaches Prometheus as `exported_job` (the scrape job keeps `job`), as the rules assume.
_JOB_LABELS = ("gpu", "uuid", "scheduler", "exported_job", "namespace", "pod", "container", "source")

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_PROBE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class NoVerdict(Exception):
    """Why analyze cannot answer: the message names what is missing."""


class Partial(NoVerdict):
    """No verdict because the data is partial (--allow-partial analyses the rest)."""


def valid_probe(name: str) -> bool:
    """A probe name that can go into a PromQL matcher as it is."""
    return bool(_PROBE.fullmatch(name))


def parse_duration(text: str) -> float:
    """A Prometheus duration (``6h``, ``1h30m``, ``2d``) in seconds; ValueError otherwise."""
    if not text or not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", text):
        raise ValueError(f"expected a duration such as 6h, 90m or 1d12h, got {text!r}")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))
    if seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return float(seconds)


@dataclass
class Prometheus:
    """The few calls of Prometheus's HTTP API that analyze makes, and what they cost."""

    url: str
    timeout: float = 30.0
    warnings: list[str] = field(default_factory=list)  # partial answers, in the order received
    requests: int = 0
    bytes_read: int = 0
    seconds_waiting: float = 0.0  # for Prometheus's answers (evaluating, encoding, sending)
    seconds_decoding: float = 0.0  # decoding the JSON

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        return self._get("/api/v1/query_range", params)

    def series(self, match: str, start: float, end: float) -> list[dict[str, Any]]:
        """The label sets of the series with samples between start and end (no sample is read)."""
        params = {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return [{"metric": labels} for labels in self._get("/api/v1/series", params, "data")]

    def _get(self, path: str, params: dict[str, str], key: str = "result") -> list[dict[str, Any]]:
        url = self.url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            raise NoVerdict(f"Prometheus at {self.url} answered {err.code}: {_api_error(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise NoVerdict(f"cannot reach Prometheus at {self.url}: {reason}") from None
        decoding = time.perf_counter()
        try:
            document = json.loads(body)
        except ValueError:
            raise NoVerdict(f"{self.url} did not answer as Prometheus's HTTP API does (not JSON)") from None
        finally:
            self.requests += 1
            self.bytes_read += len(body)
            self.seconds_waiting += decoding - began
            self.seconds_decoding += time.perf_counter() - decoding
        if not isinstance(document, dict) or document.get("status") != "success":
            raise NoVerdict(f"Prometheus at {self.url} answered an error: {document!r:.200}")
        for warning in document.get("warnings") or []:
            if str(warning) not in self.warnings:
                self.warnings.append(str(warning))
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

    @property
    def selector(self) -> str:
        return f"[{max(round(self.width * 1000), 1)}ms]"

    def read(
        self, prometheus: Prometheus, promql: str, per_query: int = MAX_POINTS - 1
    ) -> list[dict[str, Any]]:
        """A range query evaluated at each window's end, in queries of at most ``per_query``
        windows (and under Prometheus's limit of points).

        The steps are computed in whole milliseconds from the same origin for every query, so
        that the samples of two queries at one window carry the same timestamp."""
        end_ms, width_ms = round(self.end * 1000), max(round(self.width * 1000), 1)
        chunk = max(1, min(per_query, MAX_POINTS - 1))
        # A series asked in two queries comes back twice, each with its points of that query: the
        # reduction takes points one by one, so the parts need no joining.
        parts: list[dict[str, Any]] = []
        for first in range(0, self.count, chunk):
            last = min(first + chunk, self.count) - 1
            # Window i (0 = the oldest) ends at end - (count - 1 - i) * width.
            start = (end_ms - (self.count - 1 - first) * width_ms) / 1000
            stop = (end_ms - (self.count - 1 - last) * width_ms) / 1000
            parts += prometheus.query_range(promql, start, stop, width_ms / 1000)
        return parts


@dataclass
class History:
    """One group's meetings over the window, as read back from Prometheus."""

    probe: str
    end: float
    period: float
    meetings: list[Meeting]
    reduced: analysis.Reduced
    node_info: list[dict[str, Any]]  # the node_info series read (labels, or per window)
    problems: list[str]  # partial data


def run(
    url: str,
    probe: str | None,
    window: float,
    *,
    step: float | None = None,
    now: float | None = None,
    allow_partial: bool = False,
    rules: Rules | None = None,
    timeout: float = 30.0,
    prometheus: Prometheus | None = None,
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
) -> Analysis:
    """Query Prometheus and analyse one group; NoVerdict when it cannot.

    ``step`` is the width of the windows the history is read in (default: ``window_width``);
    ``workload`` is what suspects are priced for where no job attribution names the jobs."""
    prometheus = prometheus or Prometheus(url, timeout)
    with _no_collection_pauses():
        history = read(prometheus, probe, window, step=step, now=now, allow_partial=allow_partial)
        jobs = _jobs(prometheus, history)
        if prometheus.warnings and not allow_partial:  # the jobs' answer was partial
            raise Partial(
                "partial data (rerun with --allow-partial to analyse the rest): "
                + "; ".join(_warnings(prometheus))
            )
        problems = list(dict.fromkeys(history.problems + _warnings(prometheus)))
        return analysis.analyze(
            history.probe,
            history.meetings,
            window_seconds=window,
            rules=rules,
            expected=history.reduced.expected,
            nodes=history.reduced.nodes,
            problems=problems,
            workload=workload,
            jobs=jobs,
        )


def _warnings(prometheus: Prometheus) -> list[str]:
    return [f"Prometheus answered with partial data: {text}" for text in prometheus.warnings]


def read(
    prometheus: Prometheus,
    probe: str | None,
    window: float,
    *,
    step: float | None = None,
    now: float | None = None,
    allow_partial: bool = False,
) -> History:
    """One group's meetings over the window (the only group when ``probe`` is None); NoVerdict
    when there are none, or on partial data without ``allow_partial``."""
    end = time.time() if now is None else now
    selector = f"[{math.ceil(window)}s]"
    if probe is None:
        found = prometheus.query(f"count by (probe) (last_over_time({analysis.ROUND}{selector}))", end)
        names = sorted({s.get("metric", {}).get("probe", "") for s in found} - {""})
        if not names:
            raise NoVerdict(f"no pairwise probe results ({analysis.ROUND}) in Prometheus over the window")
        if len(names) > 1:
            raise NoVerdict(f"several pairwise probe groups ({', '.join(names)}): choose one with --probe")
        probe = names[0]
    match = f'probe="{probe}"'
    period = _period(prometheus, probe, match, selector, end, window)
    step = max(step if step is not None else window_width(period), 0.001)
    windows = Windows(end, step, max(int(window // step), 1))
    w = windows.selector
    # A node exports a new partner's series every round, so the per-partner families hold about
    # N series per round of the window. Prometheus evaluates a range query at every step for
    # every series it selected; asked a few rounds at a time, it selects only the series of those
    # rounds (ten times less work over a day than one query over the whole window).
    few_rounds = max(1, math.ceil(ROUNDS_PER_QUERY * period / step))
    rounds, bandwidth, success = (
        f"{analysis.ROUND}{{{match}}}{w}",
        f'{analysis.BANDWIDTH}{{{match},peer!=""}}{w}',
        f'{analysis.PEER_SUCCESS}{{{match},peer!=""}}{w}',
    )
    # The agent's name per target: the series over the window (labels only, no sample read),
    # unless an agent changed its name within it; then, per window like the results.
    node_info = prometheus.series(analysis.NODE_INFO, end - window, end)
    if len(node_info) != len({analysis.target_of(s.get("metric", {}), ("node",)) for s in node_info}):
        node_info = windows.read(prometheus, f"last_over_time({analysis.NODE_INFO}{w})")
    reduced = analysis.reduce_series(
        probe,
        node_info=node_info,
        rounds=windows.read(prometheus, f"max_over_time({rounds}) == min_over_time({rounds})"),
        bandwidth=windows.read(prometheus, f"last_over_time({bandwidth})", few_rounds),
        # Only the runs that did not meet their expectation: the analysis judges a measured
        # meeting by its bandwidth, and one that measured nothing by peer_success.
        peer_success=windows.read(prometheus, f"last_over_time({success}) == 0", few_rounds),
        expected=prometheus.query(f"last_over_time({analysis.EXPECTED}{{{match}}}{selector})", end),
    )
    problems = _warnings(prometheus) + reduced.problems
    if not reduced.reports and not problems:
        raise NoVerdict(f"no pairwise results of probe {probe} in Prometheus over the window")
    if problems and not allow_partial:
        raise Partial("partial data (rerun with --allow-partial to analyse the rest): " + "; ".join(problems))
    return History(probe, end, period, analysis.merge(reduced.reports), reduced, node_info, problems)


def _jobs(prometheus: Prometheus, history: History) -> dict[str, list[cost.Job]] | None:
    """The jobs running on each node at the end of the window, each with its GPUs over the whole
    cluster (clusterhealth_gpu_job_info); None when the family is absent."""
    found = prometheus.query(f"last_over_time({JOB_INFO}[{JOBS_LOOKBACK}])", history.end)
    if not found:
        return None
    names: dict[analysis.Target, set[str]] = {}
    for series in history.node_info:
        labels = series.get("metric", {})
        if labels.get("node"):
            names.setdefault(analysis.target_of(labels, ("node",)), set()).add(labels["node"])
    gpus: dict[tuple[str, str, str, str], set[tuple[analysis.Target, str, str]]] = {}
    on: dict[analysis.Target, set[tuple[str, str, str, str]]] = {}
    for series in found:
        labels = series.get("metric", {})
        key = (
            labels.get("scheduler", ""),
            labels.get("exported_job", ""),
            labels.get("namespace", ""),
            labels.get("pod", ""),
        )
        if not any(key):
            continue
        target = analysis.target_of(labels, _JOB_LABELS)
        gpus.setdefault(key, set()).add((target, labels.get("gpu", ""), labels.get("uuid", "")))
        on.setdefault(target, set()).add(key)
    jobs: dict[str, list[cost.Job]] = {}
    for target, keys in on.items():
        for node in names.get(target, ()):
            jobs.setdefault(node, []).extend(cost.Job(*key, gpus=len(gpus[key])) for key in sorted(keys))
    return jobs


@contextlib.contextmanager
def _no_collection_pauses() -> Iterator[None]:
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


def _period(
    prometheus: Prometheus, probe: str, match: str, selector: str, end: float, window: float
) -> float:
    """The group's round period, in seconds.

    Rounds are numbered from the Unix epoch (round = wall clock // period), so the latest round
    number and the time give the period to well under a second. Should the numbers not follow
    that rule, the number of round changes in the window gives an upper bound.
    """
    latest = prometheus.query(f"max(last_over_time({analysis.ROUND}{{{match}}}{selector}))", end)
    values = [float(s["value"][1]) for s in latest if "value" in s]
    if not values:
        raise NoVerdict(f"no results of probe {probe} ({analysis.ROUND}) in Prometheus over the window")
    if values[0] >= 1 and end / (values[0] + 0.5) <= window:
        return end / (values[0] + 0.5)
    changes = prometheus.query(f"max(changes({analysis.ROUND}{{{match}}}{selector}))", end)
    counted = [float(s["value"][1]) for s in changes if "value" in s]
    return window / (max(counted, default=0.0) + 1)


def main(
    url: str,
    probe: str | None,
    window_text: str,
    as_json: bool,
    *,
    step_text: str | None = None,
    allow_partial: bool = False,
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
) -> int:
    """The command: prints the table or the JSON and returns the exit code."""
    try:
        window = parse_duration(window_text)
        step = parse_duration(step_text) if step_text else None
    except ValueError as err:
        print(f"clusterhealth analyze: {err}", file=sys.stderr)
        return EXIT_USAGE
    if probe is not None and not valid_probe(probe):
        print(f"clusterhealth analyze: --probe: expected a probe name, got {probe!r}", file=sys.stderr)
        return EXIT_USAGE
    if not urllib.parse.urlsplit(url).scheme.startswith("http"):
        print(
            f"clusterhealth analyze: --prometheus: expected http(s)://HOST:PORT, got {url!r}", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        result = run(url, probe, window, step=step, allow_partial=allow_partial, workload=workload)
    except NoVerdict as err:
        if as_json:
            document = {"probe": probe, "window_seconds": round(window), "error": str(err)}
            document["partial"] = isinstance(err, Partial)
            print(json.dumps(document))
        print(f"clusterhealth analyze: {err}", file=sys.stderr)
        return EXIT_NO_VERDICT
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        sys.stdout.write(analysis.render_table(result))
    if result.not_enough_evidence:
        return EXIT_NO_VERDICT
    return EXIT_SUSPECTS if result.suspects else EXIT_NO_SUSPECT
