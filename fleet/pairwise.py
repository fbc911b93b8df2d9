"""A pairwise group's history as read back from Prometheus: the meetings of a window, its rounds,
its nodes, and what the reading missed.

`analyze`, `model --prometheus`, `lab` and `report` read it here: ``read_history`` returns the
`History` without analysing it, ``judge`` runs the analysis (checks/fabric/analysis.py) on it.
Once judged, a history also answers what the report draws: each pair's latest and worst meeting
(``History.pairs``) and each node's worst meeting of every round (``History.node_rounds``).

It uses Prometheus's HTTP API (fleet/prometheus.py) and the Fabric series of SPEC alone, and reads
them as **samples as scraped**, never as values Prometheus evaluated forward. A plain range query
answers, at each step, with a series' latest sample within the lookback delta (5 minutes by
default) when no staleness marker ended the series: after a backfill, a restart of Prometheus, in
a federated copy or a remote store, a partner's result then shows up again beside the next round's
number, one meeting counted twice.

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

Where ``clusterhealth_gpu_job_info`` names the jobs running on the group's nodes at the end of the
window, the history carries them, each with its GPU count over the cluster, for pricing (one more
instant query; without that family nothing changes).

Partial data, decided once after every query of the history (the jobs' too): a Prometheus answer
with ``warnings`` or ``isPartial`` (a remote store or a federated source that did not answer), or
results that cannot be tied to a node or a round. Without ``allow_partial`` it is no history
(`Partial`); with it, the history names what is missing and the verdict says it is partial.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import math
import re
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterhealth.checks import cost
from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric.analysis import Analysis, Meeting, Report, Rules
from clusterhealth.checks.fabric.topology import PLACE_KEYS, Placement, placement
from clusterhealth.fleet.prometheus import (
    NoVerdict,
    Partial,
    Prometheus,
    Target,
    Windows,
    no_collection_pauses,
    number,
    points,
    show_target,
    target_of,
)

# The Fabric series of SPEC that the history is read from.
NODE_INFO = "clusterhealth_node_info"
BANDWIDTH = "clusterhealth_probe_bandwidth_bytes_per_second"
PEER_SUCCESS = "clusterhealth_probe_peer_success"
ROUND = "clusterhealth_probe_round"
EXPECTED = "clusterhealth_probe_expected_bandwidth_bytes_per_second"
JOB_INFO = "clusterhealth_gpu_job_info"
PLACEMENT_INFO = "clusterhealth_probe_placement_info"
GPU_INFO = "clusterhealth_gpu_info"
# clusterhealth_gpu_info's own labels but the chassis (the NVLink domain); the rest is the target.
_GPU_LABELS = (
    "gpu",
    "uuid",
    "name",
    "pci_bus_id",
    "serial",
    "vbios_version",
    "slot",
    "tray",
    "host_id",
    "module_id",
)

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

# The jobs priced are those running at the end of the window: seen within Prometheus's default
# lookback delta.
JOBS_LOOKBACK = "5m"
# clusterhealth_gpu_job_info's own labels; the rest is the scrape target. The workload's `job`
# reaches Prometheus as `exported_job` (the scrape job keeps `job`), as the rules assume.
_JOB_LABELS = ("gpu", "uuid", "scheduler", "exported_job", "namespace", "pod", "container", "source")

_PROBE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def valid_probe(name: str) -> bool:
    """A probe name that can go into a PromQL matcher as it is."""
    return bool(_PROBE.fullmatch(name))


@dataclass
class History:
    """One group's meetings over a window, as read back from Prometheus."""

    probe: str
    end: float  # the window's end, Unix time
    window: float  # its length, seconds
    period: float  # the group's round period, seconds (read back from its round numbers)
    step: float  # the width of the windows it was read in, seconds
    meetings: list[Meeting]  # one per (round, pair), both ends' reports merged
    nodes: set[str]  # the nodes whose agents export the group's results (a node may have no meeting)
    expected: float | None  # the median of the agents' expectations, when they export one
    jobs: dict[str, list[cost.Job]] | None  # the jobs on each node at the end; None: no attribution
    warnings: list[str]  # Prometheus's partial answers (warnings, isPartial), as problems' texts
    untied: list[str]  # results that could not be tied to a node or a round, and why
    node_info: list[dict[str, Any]] = field(repr=False, default_factory=list)  # as read
    # Where each node sits, as its agent exports it (its members file) and NVML names its NVLink
    # domain; nodes of unknown place are absent.
    placement: dict[str, Placement] = field(default_factory=dict)

    @property
    def rounds(self) -> list[int]:
        """The rounds of the window that have a meeting, in order."""
        return sorted({m.round for m in self.meetings})

    @property
    def problems(self) -> list[str]:
        """What makes the history partial: it may miss meetings, never invent one."""
        return self.warnings + self.untied

    @property
    def partial(self) -> bool:
        return bool(self.problems)

    @property
    def newest(self) -> float | None:
        """When the newest result of the window was last scraped (Unix time); None without any."""
        return max((m.last_seen for m in self.meetings), default=None)

    def pairs(self) -> dict[tuple[str, str], PairMeetings]:
        """Each pair that met in the window (a < b): its latest meeting and its worst, by
        ``seen_ratio``. Once judged (``judge`` sets the meetings' ratios)."""
        found: dict[tuple[str, str], PairMeetings] = {}
        for m in self.meetings:  # in (round, a, b) order: a later meeting of a pair comes later
            ratio = seen_ratio(m)
            pair = found.get((m.a, m.b))
            if pair is None:
                found[(m.a, m.b)] = PairMeetings(m, m, 1)
                continue
            worst = seen_ratio(pair.worst)
            if ratio is not None and (worst is None or ratio < worst):
                pair.worst = m
            pair.latest = m
            pair.meetings += 1
        return found

    def node_rounds(self) -> dict[str, dict[int, float]]:
        """Each node's worst ``seen_ratio`` in each round it met someone with a known result.
        Once judged."""
        found: dict[str, dict[int, float]] = {}
        for m in self.meetings:
            ratio = seen_ratio(m)
            if ratio is None:
                continue
            for node in (m.a, m.b):
                rounds = found.setdefault(node, {})
                rounds[m.round] = min(ratio, rounds.get(m.round, ratio))
        return found


@dataclass
class PairMeetings:
    """A pair's meetings in the window, as the report's matrix shows them."""

    latest: Meeting
    worst: Meeting
    meetings: int


def seen_ratio(m: Meeting) -> float | None:
    """A judged meeting's share of the reference as a picture shows it: its ratio; 0 for a run
    that measured nothing and did not meet its expectation (failed, timed out); None when nothing
    says how it went."""
    if m.ratio is not None:
        return m.ratio
    return 0.0 if m.success is False else None


def read_history(
    prometheus: Prometheus,
    probe: str | None,
    window: float,
    *,
    step: float | None = None,
    now: float | None = None,
    allow_partial: bool = False,
    jobs: bool = True,
) -> History:
    """One group's meetings over the ``window`` seconds up to ``now`` (the only group when
    ``probe`` is None), read in windows ``step`` seconds wide (default ``window_width``), with the
    jobs on its nodes unless ``jobs`` is False.

    NoVerdict when Prometheus cannot answer or holds no result of the group; `Partial` on partial
    data without ``allow_partial``."""
    end = time.time() if now is None else now
    mark = prometheus.mark()
    selector = f"[{math.ceil(window)}s]"
    with no_collection_pauses():
        discovered = probe is None
        if probe is None:
            probe = _only_probe(prometheus, selector, end, window)
        match = f'probe="{probe}"'
        period = _period(prometheus, probe, match, selector, end, window, discovered)
        step = max(step if step is not None else window_width(period), 0.001)
        windows = Windows(end, step, max(int(window // step), 1), prometheus.holds_left_edge(end))
        w = windows.selector
        # A node exports a new partner's series every round, so the per-partner families hold about
        # N series per round of the window. Prometheus evaluates a range query at every step for
        # every series it selected; asked a few rounds at a time, it selects only the series of those
        # rounds (ten times less work over a day than one query over the whole window).
        few_rounds = max(1, math.ceil(ROUNDS_PER_QUERY * period / step))
        rounds, bandwidth, success = (
            f"{ROUND}{{{match}}}{w}",
            f'{BANDWIDTH}{{{match},peer!=""}}{w}',
            f'{PEER_SUCCESS}{{{match},peer!=""}}{w}',
        )
        # The agent's name per target: the series over the window (labels only, no sample read),
        # unless an agent changed its name within it; then, per window like the results.
        node_info = prometheus.series(NODE_INFO, end - window, end)
        if len(node_info) != len({target_of(s.get("metric", {}), ("node",)) for s in node_info}):
            node_info = windows.read(prometheus, f"last_over_time({NODE_INFO}{w})")
        # One stream of queries, the rounds first (a result is tied to the round of its window),
        # each answer reduced as it comes and dropped: a day of a large group is never held whole.
        # The rounds too are asked a few rounds at a time: every node's round in every window of a
        # day in one answer is a gigabyte of Python objects at sixteen thousand nodes.
        asked = [
            ("rounds", q)
            for q in windows.queries(f"max_over_time({rounds}) == min_over_time({rounds})", few_rounds)
        ]
        asked += [("bandwidth", q) for q in windows.queries(f"last_over_time({bandwidth})", few_rounds)]
        # Only the runs that did not meet their expectation: the analysis judges a measured
        # meeting by its bandwidth, and one that measured nothing by peer_success.
        asked += [("success", q) for q in windows.queries(f"last_over_time({success}) == 0", few_rounds)]
        reducer = Reducer(probe, node_info)
        answers = prometheus.query_ranges(q for _, q in asked)
        for (family, _), answer in zip(asked, answers, strict=True):
            if family == "rounds":
                reducer.rounds(answer)
            else:
                reducer.results(answer, 0 if family == "bandwidth" else 1)
            del answer
        expected = reducer.expected(prometheus.query(f"last_over_time({EXPECTED}{{{match}}}{selector})", end))
        meetings = analysis.merge(reducer.reports(drain=True))
        if not reducer.reported and not reducer.untied and not prometheus.partial_since(mark):
            raise NoVerdict(f"no pairwise results of probe {probe} in Prometheus over the window")
        history = History(
            probe=probe,
            end=end,
            window=window,
            period=period,
            step=step,
            meetings=meetings,
            nodes=reducer.nodes(),
            expected=expected,
            jobs=None,
            warnings=[],
            untied=reducer.problems(),
            node_info=node_info,
        )
        history.placement = _placement(prometheus, history)
        if jobs:
            history.jobs = _jobs(prometheus, history)
    # Decided after the last query: a partial answer to any of them (the jobs' too) is partial data.
    history.warnings = prometheus.partial_since(mark)
    if history.partial and not allow_partial:
        raise Partial(
            "partial data (rerun with --allow-partial to analyse the rest): " + "; ".join(history.problems)
        )
    return history


def judge(
    history: History,
    *,
    rules: Rules | None = None,
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
) -> Analysis:
    """The analysis of a group's history (checks/fabric/analysis.py): its suspects, each priced
    for the jobs on its nodes where the history names them, else for ``workload``; partial when
    the history is. Judging sets each of the history's meetings' ``ratio`` to the group's
    reference and ``short``."""
    with no_collection_pauses():
        return analysis.analyze(
            history.probe,
            history.meetings,
            window_seconds=history.window,
            rules=rules,
            expected=history.expected,
            nodes=history.nodes,
            problems=history.problems,
            workload=workload,
            jobs=history.jobs,
            leaves={node: place.leaf for node, place in history.placement.items() if place.leaf},
        )


def _names(node_info: Sequence[Mapping[str, Any]]) -> dict[Target, set[str]]:
    """The node names each target had over the window, from ``clusterhealth_node_info``."""
    names: dict[Target, set[str]] = {}
    for series in node_info:
        labels = series.get("metric", {})
        if labels.get("node"):
            names.setdefault(target_of(labels, ("node",)), set()).add(labels["node"])
    return names


def _placement(prometheus: Prometheus, history: History) -> dict[str, Placement]:
    """Each node's place: its leaf, spine group, pod and rail as its agent exports them for the group
    (the latest, should a node have moved in the window), and its NVLink domain where NVML names one
    (``clusterhealth_gpu_info``'s chassis serial number)."""
    selector = f"[{math.ceil(history.window)}s]"
    names = _names(history.node_info)
    match = f'probe="{history.probe}"'
    found = prometheus.query(f"last_over_time({PLACEMENT_INFO}{{{match}}}{selector})", history.end)
    places: dict[Target, set[Placement]] = {}
    for series in found:
        labels = series.get("metric", {})
        places.setdefault(target_of(labels, ("probe", *PLACE_KEYS)), set()).add(placement(labels))
    if any(len(seen) > 1 for seen in places.values()):
        # A node that moved within the window: where it is at the end.
        latest = f"[{math.ceil(history.step)}s]"
        for series in prometheus.query(f"last_over_time({PLACEMENT_INFO}{{{match}}}{latest})", history.end):
            labels = series.get("metric", {})
            target = target_of(labels, ("probe", *PLACE_KEYS))
            if len(places.get(target, ())) > 1:
                places[target] = {placement(labels)}
    domains: dict[Target, set[str]] = {}
    without = ", ".join(_GPU_LABELS)
    query = f'group without ({without}) (last_over_time({GPU_INFO}{{chassis_serial!=""}}{selector}))'
    for series in prometheus.query(query, history.end):
        labels = series.get("metric", {})
        domains.setdefault(target_of(labels, ("chassis_serial",)), set()).add(labels["chassis_serial"])
    found_places: dict[str, Placement] = {}
    for target in places.keys() | domains.keys():
        seen, chassis = places.get(target, set()), domains.get(target, set())
        place = next(iter(seen)) if len(seen) == 1 else Placement()
        domain = next(iter(chassis)) if len(chassis) == 1 else None
        place = dataclasses.replace(place, nvlink_domain=domain)
        if place.known:
            for node in names.get(target, set()) & history.nodes:
                found_places[node] = place
    return found_places


def _jobs(prometheus: Prometheus, history: History) -> dict[str, list[cost.Job]] | None:
    """The jobs running on each node at the end of the window, each with its GPUs over the whole
    cluster (clusterhealth_gpu_job_info); None when the family is absent."""
    found = prometheus.query(f"last_over_time({JOB_INFO}[{JOBS_LOOKBACK}])", history.end)
    if not found:
        return None
    names = _names(history.node_info)
    gpus: dict[tuple[str, str, str, str], set[tuple[Target, str, str]]] = {}
    on: dict[Target, set[tuple[str, str, str, str]]] = {}
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
        target = target_of(labels, _JOB_LABELS)
        gpus.setdefault(key, set()).add((target, labels.get("gpu", ""), labels.get("uuid", "")))
        on.setdefault(target, set()).add(key)
    jobs: dict[str, list[cost.Job]] = {}
    for target, keys in on.items():
        for node in names.get(target, ()):
            jobs.setdefault(node, []).extend(cost.Job(*key, gpus=len(gpus[key])) for key in sorted(keys))
    return jobs


def _only_probe(prometheus: Prometheus, selector: str, end: float, window: float) -> str:
    """The name of the only group with results in the window; NoVerdict when there are none or several.

    The names come from the index (no sample read): a superset, which may hold a group whose
    last results came just before the window. Only when it holds several is the exact answer
    asked, which reads every round number of the window."""
    names = sorted(set(prometheus.label_values("probe", ROUND, end - window, end)) - {""})
    if len(names) > 1:
        found = prometheus.query(f"count by (probe) (last_over_time({ROUND}{selector}))", end)
        names = sorted({s.get("metric", {}).get("probe", "") for s in found} - {""})
    if not names:
        raise NoVerdict(NO_GROUP)
    if len(names) > 1:
        raise NoVerdict(f"several pairwise probe groups ({', '.join(names)}): choose one with --probe")
    return names[0]


NO_GROUP = f"no pairwise probe results ({ROUND}) in Prometheus over the window"
# Every agent of a live group has exported its round within this much of the window's end.
RECENT_SECONDS = 300


def _period(
    prometheus: Prometheus,
    probe: str,
    match: str,
    selector: str,
    end: float,
    window: float,
    discovered: bool = False,
) -> float:
    """The group's round period, in seconds.

    Rounds are numbered from the Unix epoch (round = wall clock // period), so the latest round
    number and the time give the period to well under a second. Should the numbers not follow
    that rule, the number of round changes in the window gives an upper bound.
    """
    latest = _latest_round(prometheus, match, selector, end, window)
    if latest is None:
        # As the question "which group?" answers when the index named one with no result in the window.
        raise NoVerdict(
            NO_GROUP if discovered else f"no results of probe {probe} ({ROUND}) in Prometheus over the window"
        )
    if latest >= 1 and end / (latest + 0.5) <= window:
        return end / (latest + 0.5)
    changes = prometheus.query(f"max(changes({ROUND}{{{match}}}{selector}))", end)
    counted = [float(s["value"][1]) for s in changes if "value" in s]
    return window / (max(counted, default=0.0) + 1)


def _latest_round(
    prometheus: Prometheus, match: str, selector: str, end: float, window: float
) -> float | None:
    """The highest of the group's last round numbers in the window (each node's last); None without any.

    Read from the window's last ``RECENT_SECONDS`` when every round series of the window has a
    sample there (each one's last sample of the window is then among them): a few samples a node
    instead of the whole window's. The series of the window are listed from the index, a superset:
    as many answering as listed is all of them. Otherwise, or on a value that is not a number, the
    whole window is read."""
    recent = f"[{math.ceil(min(RECENT_SECONDS, window))}s]"
    listed = prometheus.series(f"{ROUND}{{{match}}}", end - window, end)
    found = prometheus.query(f"last_over_time({ROUND}{{{match}}}{recent})", end)
    values = [number(s["value"][1]) for s in found if "value" in s]
    if found and len(found) >= len(listed) and None not in values:
        return max(v for v in values if v is not None)
    whole = prometheus.query(f"max(last_over_time({ROUND}{{{match}}}{selector}))", end)
    maxima = [float(s["value"][1]) for s in whole if "value" in s]
    return maxima[0] if maxima else None


# --- from Prometheus's answers to reports -------------------------------------------------------


@dataclass
class Reduced:
    reports: list[Report]
    nodes: set[str]  # names of nodes whose agents export the group's results
    expected: float | None  # median of the agents' expectations, when they export one
    problems: list[str]


def reduce_series(
    probe: str,
    node_info: Sequence[Mapping[str, Any]],
    rounds: Sequence[Mapping[str, Any]],
    bandwidth: Sequence[Mapping[str, Any]],
    peer_success: Sequence[Mapping[str, Any]],
    expected: Sequence[Mapping[str, Any]] = (),
) -> Reduced:
    """Reports of one group from the ``result`` lists of the queries that read its history in
    windows (``read_history``): one point per series and window, at the window's end.

    * ``node_info``: the agents' names, an instant vector (one name per target for the whole
      window) or a matrix (per window, when an agent changed its name);
    * ``rounds``: per target, the round in each window in which it did not change;
    * ``bandwidth``, ``peer_success``: per target and partner, the last result in each window.

    Series are tied to a node by their target (every label but the metric's own: ``instance``,
    ``job`` and whatever relabelling added) and ``clusterhealth_node_info{node}`` of that target.
    A result belongs to the round of the same target in the same window; in a window without one
    (the round changed within it) it is left out, as the windows next to it hold it. Whatever
    cannot be tied to a node or a round is named in ``problems``.
    """
    reducer = Reducer(probe, node_info)
    reducer.rounds(rounds)
    reducer.results(bandwidth, 0)
    reducer.results(peer_success, 1)
    return reducer.reduced(expected)


class Reducer:
    """`reduce_series` an answer at a time: the names first, then every answer of the rounds, then
    the results' (bandwidth before peer_success, each in the order Prometheus answered them)."""

    def __init__(self, probe: str, node_info: Sequence[Mapping[str, Any]]) -> None:
        self.probe = probe
        self.names: dict[Target, str] = {}
        self.named_at: dict[Target, dict[float, str | None]] = {}  # per window; None: two names in it
        for series in node_info:
            labels = series.get("metric", {})
            node = labels.get("node")
            if not node:
                continue
            target = target_of(labels, ("node",))
            if "values" in series:
                at = self.named_at.setdefault(target, {})
                for t, _ in points(series):
                    at[t] = node if at.get(t, node) == node else None
            else:
                self.names[target] = node
        # Per target, its round in each window, by the window's index (``_window``): a day of
        # sixteen thousand nodes is six million of them, eight bytes each in an array; a round
        # too large for one is kept in ``_huge``.
        self.round_at: dict[Target, array.array[int]] = {}
        self._huge: dict[tuple[Target, int], int] = {}
        self._window: dict[Any, int] = {}  # a window's time, as Prometheus wrote it: its index
        self._at: list[Any] = []  # each index's time (one object for every series' points)
        self._as_round: dict[Any, int | None] = {}
        self._peers: dict[str, str] = {}
        self.found: dict[tuple[int, str, str], list[Any]] = {}
        self.reported = 0  # reports given
        self.untied: dict[Target, str] = {}

    def rounds(self, answer: Sequence[Mapping[str, Any]]) -> None:
        """Per target, the round in each window in which it did not change."""
        # A day of a thousand nodes is a million and a half points: they are taken as Prometheus
        # wrote them (a time, a text), and only what is kept is converted.
        as_round, window, times, huge = self._as_round, self._window, self._at, self._huge
        for series in answer:
            labels = series.get("metric", {})
            if labels.get("probe") != self.probe:
                continue
            target = target_of(labels, ("probe",))
            steps = self.round_at.get(target)
            if steps is None:
                steps = self.round_at[target] = array.array("q", [_NO_ROUND]) * len(times)
            for pair in series.get("values", ()):
                try:
                    t, text = pair[0], pair[1]
                    r = as_round[text] if text in as_round else as_round.setdefault(text, _whole(text))
                    if r is None:
                        continue
                    i = window.get(t)
                except (TypeError, IndexError, KeyError):
                    continue
                if i is None:
                    i = window[t] = len(times)
                    times.append(t)
                if i >= len(steps):
                    steps.extend(itertools.repeat(_NO_ROUND, i + 1 - len(steps)))
                if _NO_ROUND < r < 2**63 and r != _HUGE:
                    steps[i] = r
                else:
                    steps[i] = _HUGE
                    huge[(target, i)] = r

    def results(self, answer: Sequence[Mapping[str, Any]], slot: int) -> None:
        """Per target and partner, the last result in each window: bandwidth (slot 0) or
        peer_success (slot 1)."""
        for series in answer:
            self._add(series, slot)

    def _add(self, series: Mapping[str, Any], slot: int) -> None:
        labels = series.get("metric", {})
        if labels.get("probe") != self.probe:
            return
        peer = labels.get("peer", "")
        if not peer:
            return  # a node-local probe of the same name: not a meeting
        peer = self._peers.setdefault(peer, peer)
        target = target_of(labels, ("probe", "peer"))
        names, named_at = self.names, self.named_at
        if target not in names and target not in named_at:
            self.untied[target] = f"{show_target(target)} exports {self.probe} results but no {NODE_INFO}"
            return
        steps = self.round_at.get(target)
        if steps is None:
            self.untied[target] = f"{show_target(target)} exports {self.probe} results without {ROUND}"
            return
        fixed, at = names.get(target), named_at.get(target)
        found, window, times, size = self.found, self._window, self._at, len(steps)
        for pair in series.get("values", ()):
            try:
                t, text = pair[0], pair[1]
                i = window.get(t)
            except (TypeError, IndexError, KeyError):
                continue
            if i is None or i >= size or steps[i] == _NO_ROUND:
                continue  # the round changed in this window (or none was read)
            r = steps[i] if steps[i] != _HUGE else self._huge[(target, i)]
            node = fixed if at is None else at.get(t)
            if node is None:
                continue  # the name changed in this window
            t = times[i]
            key = (r, node, peer)
            entry = found.get(key)
            if entry is None:
                entry = found[key] = [None, None, t, t]
            entry[slot] = text
            entry[3] = t  # Prometheus answers in time order; success after bandwidth, same times

    def reduced(self, expected: Sequence[Mapping[str, Any]] = ()) -> Reduced:
        """The reports of what was taken, and the agents' expectation (``expected``)."""
        return Reduced(list(self.reports()), self.nodes(), self.expected(expected), self.problems())

    def reports(self, drain: bool = False) -> Iterator[Report]:
        """A report per node, partner and round taken; ``drain``: each taken out as it is given
        (in no order: `analysis.merge` sorts), so that a day's reports are never all held."""
        found = self.found
        entries = (found.popitem() for _ in range(len(found))) if drain else iter(list(found.items()))
        for (r, node, peer), (bw_text, ok_text, first, last) in entries:
            bw, ok = number(bw_text), number(ok_text)
            bandwidth_value = bw if bw is not None and bw > 0 else None
            success = None if ok is None else ok >= 0.5
            seen, until = number(first), number(last)
            if seen is None or until is None:
                continue
            self.reported += 1
            yield Report(r, node, peer, bandwidth_value, success, min(seen, until), max(seen, until))

    def nodes(self) -> set[str]:
        """The names of the nodes whose agents export the group's rounds."""
        names, named_at, round_at = self.names, self.named_at, self.round_at
        exporting = {names[t] for t in round_at if t in names}
        exporting |= {n for t in round_at for n in named_at.get(t, {}).values() if n is not None}
        return exporting

    def expected(self, expected: Sequence[Mapping[str, Any]]) -> float | None:
        """The median of the agents' expectations (the answer of their query), if any."""
        expectations = [
            v
            for series in expected
            if series.get("metric", {}).get("probe") == self.probe
            for _, v in points(series)[-1:]
            if math.isfinite(v) and v > 0
        ]
        return statistics.median(expectations) if expectations else None

    def problems(self) -> list[str]:
        """The results that could not be tied to a node or a round, and why."""
        return sorted(self.untied.values())


# Array values that are not a round: none in that window, or one too large (kept apart).
_NO_ROUND, _HUGE = -(2**63), -(2**63) + 1


def _whole(text: Any) -> int | None:
    value = number(text)
    return None if value is None else int(value)
