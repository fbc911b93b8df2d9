"""Which host, which path between two hosts, or which leaf switch or uplink makes a pairwise group
fall short.

Input: *reports* of meetings, one per end that exported it: (round, the node, its partner, the
bandwidth measured, whether it met its expectation), as fleet/pairwise.py reads them back from
Prometheus or checks/fabric/simulation.py plays them. Both ends may report a meeting; ``merge``
makes one meeting of them (the better report wins, so a lost or garbled report can only hide a
shortfall, never invent one).

Output (``analyze``): suspects, by two rules, and nothing else names anyone.

* **Reference.** A meeting falls *short* when it failed (no bandwidth, success 0) or its
  bandwidth is below ``threshold`` (0.8) of the group's reference over the window: the median of
  the measured meetings, leaving out every meeting of a node whose own median meeting is below
  ``threshold`` of the median node's (``reference``). A bad host is one node whatever the share of
  the meetings it takes part in (half of them in a group of four), so its own meetings never drag
  the yardstick it is judged by. Judging against the group's own reference makes a fleet-wide
  slowdown one finding (``fleet``: the reference against the agents' expectation, when they
  export one), not N suspects.
* **Host.** A node is a suspect when it fell short in ``host_partners`` (3) meetings in a row,
  with that many distinct partners that were *clean* then: more than half of each partner's
  nearest meetings with others (two before, two after) were fine. A partner of a bad host takes one hit
  and is clean, so it is never ranked; a bad host met by chance is not clean while it is bad; one
  short run never names anyone.
* **Path.** A pair is a suspect when its own meetings fell short ``path_meetings`` (2) times in a
  row (the regular meeting and the confirming meeting the two ends schedule themselves in the next
  round, see schedule.py) while both ends were fine with at least ``clean_partners`` (2) other
  partners each and are clean themselves (more fine meetings with others than short ones). A pair
  with an end that is a host suspect is the host's evidence, not a path.
* **Leaf and uplink** (members placed on leaf switches, ``leaves``): a leaf cut off from the
  others (most of its meetings across short, round after round) with ``leaf_others`` (2) clean
  other leaves is its **uplink** when its meetings inside were fine, the **leaf** itself when they
  were short (``_leaf_suspects``). One verdict per incident: the hosts and paths a named leaf or
  uplink explains are its evidence; while it is not told apart yet, they wait with it among the
  unconfirmed.
* **Unconfirmed.** A pair whose latest meeting fell short once, or a node short with fewer than
  ``host_partners`` partners, is listed apart, never in ``suspects``.
* **Not enough evidence.** Fewer than ``min_rounds`` rounds in the window: no verdict.

Each suspect, and the fleet finding, carries its price (``impact``, checks/cost.py): the ratio r
of its bandwidth to the reference (a host's or a path's median ratio over the run of short
meetings that names it; for a fleet-wide slowdown, the reference against the agents'
expectation), what a
bandwidth-bound ring all-reduce through it takes longer (1/r), and the step-time slowdown and
GPU-hours per day lost by a job spanning it: the stated workload's, or, when job attribution names
the jobs on the suspect's nodes, each of theirs with its own GPU count, summed. Suspects are
ranked by those GPU-hours per day.

Pure: no I/O and no clock.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from clusterhealth.checks import cost
from clusterhealth.checks.fabric import topology


@dataclass(frozen=True)
class Rules:
    threshold: float = 0.8  # short below this fraction of the reference
    host_partners: int = 3  # distinct clean partners, short in a row, to name a host
    path_meetings: int = 2  # short meetings of one pair in a row to name a path
    clean_partners: int = 2  # other partners each end of a path must have been fine with
    min_rounds: int = 3  # rounds in the window below which there is no verdict
    leaf_others: int = (
        2  # clean other leaves a leaf's members must be short with, to name the leaf or its uplink
    )

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if min(self.host_partners, self.path_meetings, self.min_rounds, self.leaf_others) < 1:
            raise ValueError("host_partners, path_meetings, min_rounds and leaf_others must be at least 1")
        if self.clean_partners < 0:
            raise ValueError("clean_partners must be at least 0")


@dataclass(frozen=True, slots=True)
class Report:
    """One end's report of one meeting."""

    round: int
    node: str  # the end that exported it
    peer: str
    bandwidth: float | None  # bytes/s; None when the run measured nothing (failed, timed out)
    success: bool | None  # clusterhealth_probe_peer_success; None when not exported
    first_seen: float  # Unix time of the first sample
    last_seen: float


@dataclass(slots=True)
class Meeting:
    round: int
    a: str  # the two ends, a < b
    b: str
    bandwidth: float | None
    success: bool | None
    first_seen: float
    last_seen: float
    ratio: float | None = None  # bandwidth / reference, once judged
    short: bool = False

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a


def merge(reports: Iterable[Report]) -> list[Meeting]:
    """One meeting per (round, pair), from the reports of either end or both."""
    meetings: dict[tuple[int, str, str], Meeting] = {}
    for r in reports:
        if r.node == r.peer:
            continue
        a, b = (r.node, r.peer) if r.node < r.peer else (r.peer, r.node)
        key = (r.round, a, b)
        m = meetings.get(key)
        if m is None:
            meetings[key] = Meeting(r.round, a, b, r.bandwidth, r.success, r.first_seen, r.last_seen)
            continue
        m.first_seen, m.last_seen = min(m.first_seen, r.first_seen), max(m.last_seen, r.last_seen)
        # The better report wins: a missing or failed report from one end must not turn a
        # measured meeting into a failed one.
        if r.bandwidth is not None and (m.bandwidth is None or r.bandwidth > m.bandwidth):
            m.bandwidth = r.bandwidth
        if r.success is not None:
            m.success = r.success if m.success is None else (m.success or r.success)
    return sorted(meetings.values(), key=lambda m: (m.round, m.a, m.b))


KINDS = ("host", "path", "uplink", "leaf")  # what a suspect can be, in the order a tie is listed


@dataclass
class Suspect:
    kind: str  # one of KINDS
    hosts: tuple[str, ...]  # the host, the path's two ends, or the leaf's members
    evidence: dict[str, Any]
    ratio: float = 1.0  # the median ratio of the evidence's meetings, unrounded (0: all failed)
    impact: cost.Impact | None = None  # named suspects only
    leaf: str | None = None  # a leaf or uplink suspect's leaf: its name

    @property
    def name(self) -> str:
        return self.leaf if self.leaf is not None else "<->".join(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        document = {
            "kind": self.kind,
            "suspect": self.name,
            "hosts": list(self.hosts),
            "evidence": self.evidence,
        }
        if self.impact is not None:
            document["impact"] = self.impact.to_dict()
        return document


@dataclass
class Analysis:
    probe: str
    window_seconds: float
    nodes: int
    rounds: int
    meetings: int
    reference: float | None  # the group's reference bandwidth in the window, bytes/s
    expected: float | None
    suspects: list[Suspect] = field(default_factory=list)
    unconfirmed: list[Suspect] = field(default_factory=list)
    not_enough_evidence: str | None = None  # why there is no verdict
    fleet_slowdown: bool = False
    problems: tuple[str, ...] = ()  # partial data that was analysed anyway
    reference_excludes: tuple[str, ...] = ()  # nodes whose meetings the reference leaves out
    workload: cost.Workload = cost.IMPACT_WORKLOAD  # what suspects are priced for
    fleet_impact: cost.Impact | None = None  # the fleet-wide slowdown's price, when there is one
    leaves: dict[str, list[str]] = field(default_factory=dict)  # each leaf's members, when placed

    @property
    def partial(self) -> bool:
        """The verdict was reached on partial data: it may miss meetings (never invent one)."""
        return bool(self.problems)

    def to_dict(self) -> dict[str, Any]:
        ratio = (
            self.reference / self.expected
            if self.reference is not None and self.expected is not None
            else None
        )
        return {
            "probe": self.probe,
            "window_seconds": round(self.window_seconds),
            "nodes": self.nodes,
            "rounds": self.rounds,
            "suspects": [s.to_dict() for s in self.suspects],
            "unconfirmed": [s.to_dict() for s in self.unconfirmed],
            "meetings": self.meetings,
            "reference_bandwidth_bytes_per_second": self.reference,
            "reference_excludes": list(self.reference_excludes),
            "expected_bandwidth_bytes_per_second": self.expected,
            "fleet": {
                "slowdown": self.fleet_slowdown,
                "median_to_expected_ratio": _round(ratio),
                "impact": None if self.fleet_impact is None else self.fleet_impact.to_dict(),
            },
            "not_enough_evidence": self.not_enough_evidence,
            "partial": self.partial,
            "problems": list(self.problems),
            "leaves": self.leaves,
        }


def analyze(
    probe: str,
    meetings: Sequence[Meeting],
    *,
    window_seconds: float,
    rules: Rules | None = None,
    expected: float | None = None,
    nodes: Iterable[str] = (),
    problems: Sequence[str] = (),
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
    jobs: Mapping[str, Sequence[cost.Job]] | None = None,
    leaves: Mapping[str, str] | None = None,
) -> Analysis:
    """Suspects of one group from its meetings in the window (see the module docstring).

    ``workload`` is what each suspect is priced for; ``jobs``, when job attribution exists, the
    jobs on each node (by node name), each with its GPU count over the whole cluster; ``leaves``,
    where the members' places are known, each node's leaf switch."""
    rules = rules or Rules()
    everyone = set(nodes) | {m.a for m in meetings} | {m.b for m in meetings}
    leaf_of = {node: leaf for node, leaf in (leaves or {}).items() if leaf}
    rounds = len({m.round for m in meetings})
    reference, excluded = reference_bandwidth(meetings, rules.threshold)
    result = Analysis(
        probe,
        window_seconds,
        len(everyone),
        rounds,
        len(meetings),
        reference,
        expected,
        problems=tuple(problems),
        reference_excludes=excluded,
        workload=workload,
        leaves=topology.leaves({n: topology.Placement(leaf=leaf) for n, leaf in leaf_of.items()}, everyone),
    )
    if rounds < rules.min_rounds:
        result.not_enough_evidence = (
            f"{rounds} round{'s' if rounds != 1 else ''} of probe {probe} in the window, "
            f"at least {rules.min_rounds} needed"
        )
        return result
    if reference is None:
        result.not_enough_evidence = f"no meeting of probe {probe} in the window measured a bandwidth"
        return result
    if expected is not None and reference < rules.threshold * expected:
        # The finding, and its price: every job of the group runs at the fleet's pace.
        result.fleet_slowdown = True
        result.fleet_impact = cost.impact(
            reference / expected, expected, workload, _jobs_on(jobs, sorted(everyone))
        )

    for m in meetings:
        m.ratio = m.bandwidth / reference if m.bandwidth is not None else None
        if m.ratio is not None:
            m.short = m.ratio < rules.threshold
        else:
            m.short = m.success is False

    by_node: dict[str, list[Meeting]] = defaultdict(list)
    by_pair: dict[tuple[str, str], list[Meeting]] = defaultdict(list)
    for m in meetings:
        by_node[m.a].append(m)
        by_node[m.b].append(m)
        by_pair[(m.a, m.b)].append(m)
    # Per node: fine and short meetings, and the partners it was fine with.
    fine: dict[str, int] = defaultdict(int)
    short: dict[str, int] = defaultdict(int)
    fine_partners: dict[str, set[str]] = defaultdict(set)
    for m in meetings:
        for end in (m.a, m.b):
            if m.short:
                short[end] += 1
            else:
                fine[end] += 1
                fine_partners[end].add(m.other(end))
    pair_fine: dict[tuple[str, str], int] = defaultdict(int)
    pair_short: dict[tuple[str, str], int] = defaultdict(int)
    for key, ms in by_pair.items():
        pair_short[key] = sum(m.short for m in ms)
        pair_fine[key] = len(ms) - pair_short[key]

    def clean(node: str, apart_from: str) -> bool:
        """More fine meetings than short ones with its other partners: never the one to blame here."""
        key = (node, apart_from) if node < apart_from else (apart_from, node)
        ok = fine[node] - pair_fine.get(key, 0)
        bad = short[node] - pair_short.get(key, 0)
        return ok > bad

    for ms in by_node.values():
        ms.sort(key=lambda m: (m.round, m.first_seen))
    position = {(node, id(m)): i for node, ms in by_node.items() for i, m in enumerate(ms)}

    def clean_then(partner: str, m: Meeting) -> bool:
        """Was ``partner`` fine with its other partners around meeting ``m``? Its nearest
        ``_AROUND`` meetings with others before and after must be mostly fine: a bad host that met
        the node is not clean while it is bad, however fine it was earlier in the window."""
        ms, i = by_node[partner], position[(partner, id(m))]
        node = m.other(partner)
        around: list[Meeting] = []
        for step in (-1, 1):
            j, found = i + step, 0
            while 0 <= j < len(ms) and found < _AROUND:
                if ms[j].other(partner) != node:
                    around.append(ms[j])
                    found += 1
                j += step
        fine_around = sum(not x.short for x in around)
        return fine_around > len(around) - fine_around

    hosts: dict[str, Suspect] = {}
    leaning: dict[str, Suspect] = {}
    for node, ms in by_node.items():
        episode = _host_episode(node, ms, rules, clean_then)
        if episode is None:
            continue
        suspect, named = episode
        (hosts if named else leaning)[node] = suspect

    paths: list[Suspect] = []
    singles: list[Suspect] = []
    for (a, b), ms in by_pair.items():
        if a in hosts or b in hosts:
            continue
        ms.sort(key=lambda m: (m.round, m.first_seen))
        streak = _trailing_or_longest_streak(ms)
        if not streak:
            continue
        others_a = len(fine_partners[a] - {b})
        others_b = len(fine_partners[b] - {a})
        evidence = {
            "meetings": [_meeting_evidence(m, a) for m in streak],
            "median_ratio": _round(_median_ratio(streak)),
            "rounds": [m.round for m in streak],
            "first_seen": _time(streak[0].first_seen),
            "last_seen": _time(streak[-1].last_seen),
            "fine_partners": {a: others_a, b: others_b},
            "ongoing": streak[-1] is ms[-1],
        }
        ends_fine = others_a >= rules.clean_partners and others_b >= rules.clean_partners
        ratio = _median_ratio(streak) or 0.0
        if len(streak) >= rules.path_meetings and ends_fine and clean(a, b) and clean(b, a):
            paths.append(Suspect("path", (a, b), evidence, ratio))
        elif streak[-1] is ms[-1]:
            if len(streak) >= rules.path_meetings:
                evidence["why_unconfirmed"] = (
                    f"both ends must have been fine with at least {rules.clean_partners} other partners "
                    "each, and clean"
                )
            else:
                evidence["why_unconfirmed"] = (
                    f"short in {len(streak)} meeting{'s' if len(streak) > 1 else ''}; "
                    f"{rules.path_meetings} in a row name a path"
                )
            singles.append(Suspect("path", (a, b), evidence, ratio))

    places, leaning_places = _leaf_suspects(meetings, leaf_of, result.leaves, rules)
    # One verdict per incident: what a leaf or its uplink explains is its evidence, not a host or
    # a path of its own. A bad leaf explains its members and every path to them; a bad uplink the
    # members that were not short inside the leaf, and the paths across it. While a leaf's
    # incident is not told apart yet, what it would explain waits with it among the unconfirmed.
    waiting: list[Suspect] = []
    for place in [*places, *leaning_places]:
        explained = set(place.evidence.pop("explains"))
        members = set(place.hosts)
        if place in leaning_places:
            explained = members  # not told apart yet: it may be the leaf
        # Ends inside the leaf of a path it explains: any, but for a named uplink, one.
        inside = 1 if place.kind == "uplink" and place in places else None
        held = [h for n, h in hosts.items() if n in explained] + [
            p for p in paths if _through(p, members, inside)
        ]
        hosts = {n: h for n, h in hosts.items() if n not in explained}
        paths = [p for p in paths if not _through(p, members, inside)]
        if place in places:
            leaning = {n: h for n, h in leaning.items() if n not in explained}
            singles = [p for p in singles if not _through(p, members, inside)]
        else:
            for held_back in held:
                held_back.evidence["why_unconfirmed"] = (
                    f"{place.leaf} is short across with its whole leaf: its uplink or the leaf itself, "
                    "not told apart yet"
                )
            waiting.extend(held)

    suspects = [*hosts.values(), *paths, *places]
    for s in suspects:
        s.impact = cost.impact(s.ratio, reference, workload, _jobs_on(jobs, s.hosts))
    # The costliest first: with the stated workload alone, the slowest; with jobs, the one whose
    # jobs lose the most GPU-hours. Hosts before paths, then by name, on a tie.
    result.suspects = sorted(suspects, key=_cost)
    result.unconfirmed = (
        sorted([*leaning.values(), *(h for h in waiting if h.kind == "host")], key=_severity)
        + sorted([*singles, *(p for p in waiting if p.kind == "path")], key=_severity)
        + sorted(leaning_places, key=_severity)
    )
    return result


def _through(path: Suspect, members: set[str], ends_inside: int | None) -> bool:
    """Whether a path goes through a leaf: has that many ends among its ``members`` (None: any)."""
    inside = sum(end in members for end in path.hosts)
    return inside > 0 if ends_inside is None else inside == ends_inside


def _leaf_suspects(
    meetings: Sequence[Meeting],
    leaf_of: Mapping[str, str],
    members: Mapping[str, list[str]],
    rules: Rules,
) -> tuple[list[Suspect], list[Suspect]]:
    """The leaves named (a leaf or its uplink), and those leaning without being named yet.

    A leaf's *crossing* meetings (one end in the leaf, the other on another known leaf) are taken
    round by round; a round *cuts the leaf off* when more of them fell short than not, with at
    least two of its members. The latest run of such rounds (a round whose crossing meetings were
    at least half fine ends it; one with a single member short and nothing fine neither cuts nor
    ends) names the leaf when its members fell short with at least ``leaf_others`` other leaves
    that were clean then (mostly fine with the leaves but this one, in the run's rounds and two
    either side), and its meetings inside, in the run's rounds and the round after, say which:
    at least half fine, the **uplink** (fine with each other, short with every other leaf);
    mostly short, the **leaf** itself (short with each other and with the rest).
    """
    if len(members) < 1 + rules.leaf_others:
        return [], []
    inside: dict[str, list[Meeting]] = defaultdict(list)
    crossing: dict[str, list[Meeting]] = defaultdict(list)
    for m in meetings:
        la, lb = leaf_of.get(m.a), leaf_of.get(m.b)
        if la is None or lb is None:
            continue
        if la == lb:
            inside[la].append(m)
        else:
            crossing[la].append(m)
            crossing[lb].append(m)

    def clean(leaf: str, apart_from: str, rounds: list[int]) -> bool:
        """More fine crossing meetings than short ones with the leaves other than ``apart_from``,
        in ``rounds`` and the two rounds either side: a leaf that was bad then is not clean, however
        fine it was before."""
        ms = [
            m
            for m in crossing[leaf]
            if rounds[0] - _AROUND <= m.round <= rounds[-1] + _AROUND
            and apart_from not in (leaf_of[m.a], leaf_of[m.b])
        ]
        fine = sum(not m.short for m in ms)
        return fine > len(ms) - fine

    named: list[Suspect] = []
    leaning: list[Suspect] = []
    for leaf, ms in crossing.items():
        if len(members.get(leaf, ())) < 2:
            continue  # a leaf of one member is its host
        by_round: dict[int, list[Meeting]] = defaultdict(list)
        for m in ms:
            by_round[m.round].append(m)
        runs: list[list[int]] = []
        cut_before = False
        for r in sorted(by_round):
            short = [m for m in by_round[r] if m.short]
            fine = len(by_round[r]) - len(short)
            ends = {m.a if leaf_of[m.a] == leaf else m.b for m in short}
            if len(short) > fine and len(ends) >= 2:
                if not cut_before:
                    runs.append([])
                runs[-1].append(r)
                cut_before = True
            elif fine >= len(short):
                cut_before = False
            # else one member short across and nothing fine: says nothing about the leaf (a
            # leftover's meeting in a round inside the leaves), neither cuts nor ends a run.
        # The latest run is ongoing unless a round at least half fine came after it.
        found = [
            _place(leaf, run, by_round, inside[leaf], leaf_of, members[leaf], rules, clean) for run in runs
        ]
        for suspect in found:
            suspect.evidence["ongoing"] = suspect is found[-1] and cut_before
        naming = [s for s in found if "why_unconfirmed" not in s.evidence]
        if naming:
            named.append(naming[-1])
        elif found and cut_before:
            leaning.append(found[-1])
    # A leaf short only with leaves named bad is their evidence, not an incident of its own.
    bad = {s.leaf for s in named}
    leaning = [s for s in leaning if not {x["leaf"] for x in s.evidence["short_with"]} <= bad]
    decided = {s.leaf for s in (*named, *leaning)}
    for leaf, ms in inside.items():
        if leaf not in decided and (held := _short_inside(leaf, ms, crossing[leaf], members[leaf])):
            leaning.append(held)
    return named, leaning


def _short_inside(
    leaf: str, inside: list[Meeting], crossing: list[Meeting], members: list[str]
) -> Suspect | None:
    """A leaf whose latest round inside was mostly short, and that has not been fine across since
    (at least half its meetings across fine): the start of a bad leaf, before its members meet
    other leaves (the leaf the circle leaves out when the number of leaves is odd meets itself in
    that round)."""
    latest = max(m.round for m in inside)
    now = [m for m in inside if m.round == latest]
    short = [m for m in now if m.short]
    if len(short) * 2 <= len(now):
        return None
    after = [m for m in crossing if m.round >= latest]
    if after and sum(not m.short for m in after) * 2 >= len(after):
        return None
    ratio = _median_ratio(short) or 0.0
    evidence: dict[str, Any] = {
        "leaf": leaf,
        "meetings": [_meeting_evidence(m, m.a) | {"node": m.a} for m in short],
        "short_with": [],
        "inside": {
            "fine": len(now) - len(short),
            "short": len(short),
            "median_ratio": _round(_median_ratio(now)),
        },
        "members_short": sorted({n for m in short for n in (m.a, m.b)}, key=topology.natural),
        "rounds": [latest],
        "first_seen": _time(min(m.first_seen for m in short)),
        "last_seen": _time(max(m.last_seen for m in short)),
        "ongoing": True,
        "median_ratio": _round(ratio),
        "why_unconfirmed": "short inside, not met across since: the leaf itself, or its hosts",
        "explains": list(members),
    }
    return Suspect("leaf", tuple(members), evidence, ratio, leaf=leaf)


def _place(
    leaf: str,
    run: list[int],
    by_round: Mapping[int, list[Meeting]],
    inside: list[Meeting],
    leaf_of: Mapping[str, str],
    members: list[str],
    rules: Rules,
    clean: Callable[[str, str, list[int]], bool],
) -> Suspect:
    """The verdict on one run of rounds in which ``leaf`` was cut off (see ``_leaf_suspects``)."""
    short = [m for r in run for m in by_round[r] if m.short]
    by_leaf: dict[str, list[Meeting]] = {}
    for m in short:
        other = leaf_of[m.b] if leaf_of[m.a] == leaf else leaf_of[m.a]
        by_leaf.setdefault(other, []).append(m)
    others = [other for other in by_leaf if clean(other, leaf, run)]
    # Inside from the run's first round on: the round before may be from before the fault, and
    # stands in only until a round inside comes (a leaf it names waits with the unconfirmed).
    near = [m for m in inside if run[0] <= m.round <= run[-1] + 1] or [
        m for m in inside if m.round == run[0] - 1
    ]
    inside_short = [m for m in near if m.short]
    inside_fine = len(near) - len(inside_short)
    end = {id(m): (m.a if leaf_of[m.a] == leaf else m.b) for m in short}
    evidence: dict[str, Any] = {
        "leaf": leaf,
        "meetings": [_meeting_evidence(m, end[id(m)]) | {"node": end[id(m)]} for m in short],
        "short_with": [
            {
                "leaf": other,
                "meetings": len(group),
                "median_ratio": _round(_median_ratio(group)),
                "clean": other in others,
            }
            for other, group in by_leaf.items()
        ],
        "inside": {
            "fine": inside_fine,
            "short": len(inside_short),
            "median_ratio": _round(_median_ratio(near)) if near else None,
        },
        "members_short": sorted({end[id(m)] for m in short}, key=topology.natural),
        "rounds": run,
        "first_seen": _time(min(m.first_seen for m in short)),
        "last_seen": _time(max(m.last_seen for m in short)),
        "ongoing": True,  # decided by the caller, who sees the rounds after
    }
    # Noise only shortens a meeting: a bad leaf has nothing fine inside, an uplink at most a few
    # random shortfalls. So a tie is the uplink.
    if inside_fine and inside_fine >= len(inside_short):
        kind, ratio_of = "uplink", short
        # An uplink explains its members' shortfalls across, not a member short with its own leaf.
        own: dict[str, list[bool]] = defaultdict(list)
        for m in inside:
            own[m.a].append(m.short)
            own[m.b].append(m.short)
        evidence["explains"] = [n for n in members if sum(own[n]) * 2 <= len(own[n])]
    elif inside_short:
        kind, ratio_of = "leaf", short + inside_short
        evidence["explains"] = list(members)
    else:
        kind, ratio_of = "uplink", short
        evidence["explains"] = list(members)
        evidence["why_unconfirmed"] = "no meeting inside the leaf yet: its uplink or the leaf itself"
    if not others:
        # Short with leaves that were bad then too: this one or they; it waits, holding what it
        # would explain, until a clean leaf says.
        evidence["why_unconfirmed"] = (
            f"short across with {', '.join(by_leaf)}, not clean then either: this leaf or "
            f"{'that one' if len(by_leaf) == 1 else 'those'}"
        )
    elif len(others) < rules.leaf_others:
        evidence["why_unconfirmed"] = (
            f"short with {len(others)} clean other leaf{'s' if len(others) != 1 else ''}; "
            f"{rules.leaf_others} name a leaf or its uplink"
        )
    ratio = _median_ratio(ratio_of) or 0.0
    evidence["median_ratio"] = _round(ratio)
    return Suspect(kind, tuple(members), evidence, ratio, leaf=leaf)


def reference_bandwidth(
    meetings: Sequence[Meeting], threshold: float
) -> tuple[float | None, tuple[str, ...]]:
    """The bandwidth a meeting is judged against, and the nodes whose meetings it leaves out.

    The median of the measured meetings, without the meetings of any node whose own median meeting
    is below ``threshold`` of the median node's. A plain median of the meetings is dragged by a
    bad host in proportion to its share of them: in a group of four it takes part in half, and the
    median lands between its speed and everyone else's (the host then looks less slow than it is,
    and the group looks slow). The median over nodes is not: a bad host is one node of N, and each
    of its partners met it in a minority of its meetings. A bad path is one meeting of each end's
    many; a fleet-wide slowdown moves every node, so nobody is left out and the reference follows.
    """
    per_node: dict[str, list[float]] = defaultdict(list)
    measured: list[tuple[float, str, str]] = []
    for m in meetings:
        if m.bandwidth is not None and m.bandwidth > 0:
            per_node[m.a].append(m.bandwidth)
            per_node[m.b].append(m.bandwidth)
            measured.append((m.bandwidth, m.a, m.b))
    if not measured:
        return None, ()
    medians = {node: statistics.median(values) for node, values in per_node.items()}
    typical = statistics.median(medians.values())
    slow = {node for node, median in medians.items() if median < threshold * typical}
    kept = [bw for bw, a, b in measured if a not in slow and b not in slow]
    if not kept:  # every meeting has a slow end: nothing to tell them from
        return statistics.median(bw for bw, _, _ in measured), ()
    return statistics.median(kept), tuple(sorted(slow))


def _host_episode(
    node: str, ms: list[Meeting], rules: Rules, clean_then: Callable[[str, Meeting], bool]
) -> tuple[Suspect, bool] | None:
    """The node's latest run of short meetings that names it (True), or its ongoing run that
    leans on it without naming it (False)."""
    streaks: list[tuple[list[Meeting], list[str]]] = []
    after_fine = True
    for m in ms:
        if not m.short:
            after_fine = True
            continue
        if after_fine:
            streaks.append(([], []))
            after_fine = False
        run, partners = streaks[-1]
        run.append(m)
        other = m.other(node)
        if other not in partners and clean_then(other, m):
            partners.append(other)
    naming = [s for s in streaks if len(s[1]) >= rules.host_partners]
    if naming:
        chosen, named_by = naming[-1]
    elif streaks and streaks[-1][0][-1] is ms[-1] and len(streaks[-1][1]) >= 2:
        chosen, named_by = streaks[-1]
    else:
        return None
    named = len(named_by) >= rules.host_partners
    evidence = {
        "meetings": [_meeting_evidence(m, node) for m in chosen],
        "partners": named_by,
        "short_with": _by_partner(chosen, node),
        "median_ratio": _round(_median_ratio(chosen)),
        "rounds": [m.round for m in chosen],
        "first_seen": _time(chosen[0].first_seen),
        "last_seen": _time(chosen[-1].last_seen),
        "ongoing": chosen[-1] is ms[-1],
    }
    if not named:
        evidence["why_unconfirmed"] = (
            f"short with {len(named_by)} clean partners in a row; {rules.host_partners} name a host"
        )
    return Suspect("host", (node,), evidence, _median_ratio(chosen) or 0.0), named


def _trailing_or_longest_streak(ms: list[Meeting]) -> list[Meeting]:
    """The pair's longest run of short meetings, the latest one on a tie."""
    best: list[Meeting] = []
    run: list[Meeting] = []
    for m in ms:
        if m.short:
            run.append(m)
            if len(run) >= len(best):
                best = list(run)
        else:
            run = []
    return best


def _by_partner(ms: Sequence[Meeting], node: str) -> list[dict[str, Any]]:
    """Each partner of a run of short meetings once, with how many there were and their median
    ratio, in the order first met (a small group meets a partner again within the run)."""
    grouped: dict[str, list[Meeting]] = {}
    for m in ms:
        grouped.setdefault(m.other(node), []).append(m)
    return [
        {"peer": peer, "meetings": len(group), "median_ratio": _round(_median_ratio(group))}
        for peer, group in grouped.items()
    ]


def _meeting_evidence(m: Meeting, node: str) -> dict[str, Any]:
    return {
        "round": m.round,
        "peer": m.other(node),
        "ratio": _round(m.ratio),
        "bandwidth_bytes_per_second": m.bandwidth,
        "result": "failed" if m.bandwidth is None else "degraded",
    }


def _median_ratio(ms: Sequence[Meeting]) -> float | None:
    ratios = [m.ratio for m in ms if m.ratio is not None]
    return statistics.median(ratios) if ratios else (0.0 if ms else None)


def _jobs_on(jobs: Mapping[str, Sequence[cost.Job]] | None, nodes: Iterable[str]) -> list[cost.Job] | None:
    """The jobs on any of ``nodes``, each once; None when none is known there."""
    if jobs is None:
        return None
    found = {job: None for node in nodes for job in jobs.get(node, ())}
    return list(found) or None


def _cost(s: Suspect) -> tuple[float, int, float, str]:
    lost = s.impact.gpu_hours_per_day if s.impact is not None else 0.0
    return (-lost, KINDS.index(s.kind), *_severity(s))


def _severity(s: Suspect) -> tuple[float, str]:
    ratio = s.evidence.get("median_ratio")
    return (ratio if isinstance(ratio, float) else 1.0, s.name)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- rendering ---------------------------------------------------------------------------------


def render_table(analysis: Analysis) -> str:
    """The human view: one line per suspect, then the unconfirmed ones, then a summary."""
    lines = [headline(analysis), *fleet_lines(analysis)]
    for problem in analysis.problems:
        lines.append(f"partial data: {problem}")
    if analysis.partial and not analysis.not_enough_evidence:
        lines.append("PARTIAL DATA: the verdict below may miss meetings that Prometheus did not return")
    if analysis.not_enough_evidence:
        lines.append(f"not enough evidence: {analysis.not_enough_evidence}")
        return "\n".join(lines) + "\n"
    rows = [suspect_row(s) for s in analysis.suspects]
    if rows:
        lines.append("")
        lines.extend(_columns([COLUMNS, *rows]))
        lines.append("")
        lines.append(workload_text(analysis.workload))
        lines.extend(jobs_line(s) for s in analysis.suspects if s.impact is not None and s.impact.jobs)
    else:
        lines.append("no suspect")
    if analysis.unconfirmed:
        lines.append("")
        lines.append("unconfirmed (not suspects):")
        lines.extend(_columns([COLUMNS, *(suspect_row(s) for s in analysis.unconfirmed)]))
    return "\n".join(lines) + "\n"


# The columns of a suspect's row (``suspect_row``), in the table and in the report.
COLUMNS = (
    "SUSPECT",
    "KIND",
    "RATIO",
    "STEP",
    "GPU-H/DAY",
    "EVIDENCE",
    "ROUNDS",
    "FIRST SEEN",
    "LAST SEEN",
)


def headline(analysis: Analysis) -> str:
    """The group, its size and the reference it was judged against, on one line."""
    head = (
        f"probe {analysis.probe}: {analysis.nodes} nodes, {analysis.rounds} rounds, "
        f"{analysis.meetings} meetings in {_span(analysis.window_seconds)}"
    )
    if analysis.reference is not None:
        head += f"; reference {rate_text(analysis.reference)} (the group's median"
        if analysis.reference_excludes:
            head += f" without the meetings of {', '.join(analysis.reference_excludes)}"
        head += ")"
    return head


def summary(analysis: Analysis) -> str:
    """The verdict in a few words: who is suspected, "no suspect", or why there is no verdict."""
    if analysis.not_enough_evidence:
        return f"no verdict: {analysis.not_enough_evidence}"
    if not analysis.suspects:
        return "no suspect"
    count = len(analysis.suspects)
    named = ", ".join(f"{s.name} ({s.kind})" for s in analysis.suspects)
    return f"{count} suspect{'s' if count > 1 else ''}: {named}"


def fleet_lines(analysis: Analysis) -> list[str]:
    """The fleet-wide slowdown and its price, when there is one."""
    if analysis.expected is None or analysis.reference is None or not analysis.fleet_slowdown:
        return []
    ratio = analysis.reference / analysis.expected
    lines = [
        f"FLEET-WIDE SLOWDOWN: the group's median is {ratio:.0%} of the agents' expectation "
        f"{rate_text(analysis.expected)}; suspects below are judged against the median"
    ]
    if analysis.fleet_impact is not None:
        lines.append(f"  costs {_impact_text(analysis.fleet_impact)}")
    return lines


def jobs_line(s: Suspect) -> str:
    """The jobs on a suspect's nodes and what each loses (job attribution)."""
    priced = (s.impact.jobs if s.impact is not None else None) or ()
    jobs = "; ".join(
        f"{_job_text(job)} ({job.gpus} GPUs) step {_times(step)}, {lost:.0f} GPU-h/day"
        for job, step, lost in priced
    )
    return f"jobs on {s.name}: {jobs}"


def workload_text(w: cost.Workload) -> str:
    """What STEP and GPU-H/DAY price: the stated workload."""
    return (
        f"STEP: how much longer a step takes for a data-parallel job of {w.gpus} GPUs spanning the suspect "
        f"({w.params / 1e9:g}B parameters x {w.bytes_per_param:g} bytes of gradients in a ring all-reduce, "
        f"{w.compute_seconds:g} s of compute, overlap {w.overlap:g}: --gpus, --params, --bytes-per-param, "
        "--compute-seconds, --overlap)\nGPU-H/DAY: the GPU-hours a day that job loses, or, when job "
        "attribution names the jobs on the suspect, theirs summed"
    )


def _impact_text(i: cost.Impact) -> str:
    return (
        f"all-reduce {_times(i.allreduce_slowdown)}, step {_times(i.step_slowdown)}, "
        f"{i.gpu_hours_per_day:.0f} GPU-h/day"
        + (f" to its {len(i.jobs)} jobs" if i.jobs else f" to a job of {i.workload.gpus} GPUs")
    )


def _job_text(job: cost.Job) -> str:
    if job.pod:
        return f"pod {job.namespace}/{job.pod}"
    return f"{job.scheduler} job {job.job}"


def _times(factor: float) -> str:
    return "stalled" if math.isinf(factor) else f"x{factor:.2f}"


_AROUND = 2  # a partner's meetings with others, each side of a meeting, that say whether it was fine
_SHOWN = 4  # partners of a host listed in a table row; the JSON has them all


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def suspect_row(s: Suspect) -> tuple[str, ...]:
    """A suspect as the columns of ``COLUMNS``."""
    e = s.evidence
    if s.kind == "host":
        partners = e["short_with"]
        shorts = ", ".join(_partner_text(p) for p in partners[:_SHOWN])
        if len(partners) > _SHOWN:
            shorts += f" and {len(partners) - _SHOWN} more"
        text = f"short with {shorts}"
    elif s.kind in ("leaf", "uplink"):
        text = _place_text(s)
    else:
        fine = ", ".join(f"{k} fine with {v}" for k, v in e["fine_partners"].items())
        ratios = ", ".join(f"{m['ratio']:.2f}" if m["ratio"] is not None else "failed" for m in e["meetings"])
        count = len(e["meetings"])
        text = f"{count} meeting{'s' if count > 1 else ''} short ({ratios}); {fine} others"
    if "why_unconfirmed" in e:
        text += f" [{e['why_unconfirmed']}]"
    ratio = e.get("median_ratio")
    rounds = e["rounds"]
    i = s.impact
    return (
        s.name,
        s.kind,
        f"{ratio:.2f}" if isinstance(ratio, float) else "-",
        "-" if i is None else _times(i.step_slowdown),
        "-" if i is None else f"{i.gpu_hours_per_day:.0f}",
        text,
        f"{rounds[0]}-{rounds[-1]}" if len(rounds) > 2 else ",".join(str(r) for r in rounds),
        e["first_seen"],
        e["last_seen"] + (" (ongoing)" if e.get("ongoing") else ""),
    )


def _place_text(s: Suspect) -> str:
    """A leaf's or an uplink's evidence: its members, how they did inside the leaf and across."""
    e = s.evidence
    across = e["short_with"]
    shown = ", ".join(
        f"{x['leaf']} {_ratio_text(x['median_ratio'])}"
        + (f" ({x['meetings']} meetings)" if x["meetings"] > 1 else "")
        for x in across[:_SHOWN]
    )
    if len(across) > _SHOWN:
        shown += f" and {len(across) - _SHOWN} more"
    inside = e["inside"]
    seen = inside["fine"] + inside["short"]
    if inside["short"] > inside["fine"]:
        within = f"short inside ({inside['short']} of {seen} meetings, {_ratio_text(inside['median_ratio'])})"
    elif seen:
        within = f"fine inside ({inside['fine']} of {seen} meetings)"
    else:
        within = "no meeting inside yet"
    hosts = ", ".join(s.hosts[:2]) + (", ..." if len(s.hosts) > 2 else "")
    return f"{len(s.hosts)} hosts ({hosts}): {within}; " + (
        f"short across with {shown}" if shown else "not met across since"
    )


def _ratio_text(ratio: float | None) -> str:
    return "failed" if not ratio else f"{ratio:.2f}"


def _partner_text(partner: dict[str, Any]) -> str:
    ratio = partner["median_ratio"]
    shown = f"{ratio:.2f}" if ratio else "failed"  # a median ratio of 0: every meeting failed
    count = partner["meetings"]
    return f"{partner['peer']} {shown}" + (f" ({count} meetings)" if count > 1 else "")


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def rate_text(bytes_per_second: float) -> str:
    return f"{bytes_per_second * 8 / 1e9:.2f} Gbit/s ({bytes_per_second / 1e9:.2f} GB/s)"
