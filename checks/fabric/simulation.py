"""A pairwise group played round by round without a network, for tests and benchmarks/.

Every node plans its rounds with the real ``schedule.regular`` and ``schedule.confirming`` from
its own history only, exactly as an agent does; a meeting happens when both ends planned it (same
partner, same slot, complementary roles) and neither is busy. A node whose partner is busy or
declined a confirming meeting records ``skipped``. The measurement is drawn from a noise model:

* a healthy run measures ``nominal`` × (1 ± ``jitter``, uniform);
* with probability ``p_short`` it falls short at random, to 30-75 % of that;
* a bad host multiplies every run it takes part in by its factor, a bad path every run between
  its two ends (both directions), a bad uplink every run between a member of its leaf and a node
  of another leaf, a bad leaf every run that goes through it (inside it, or to or from it);
* a confirming meeting is ``confirm_runs`` runs; the best one is its result;
* each round a fraction ``p_busy`` of the nodes is busy (the idle guard) and sits out.

Each end judges a meeting short against ``nominal`` × ``threshold``, as an agent judges it
against its expectation. Deterministic for a given seed.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clusterhealth.checks.fabric.analysis import Report
from clusterhealth.checks.fabric.schedule import (
    CONFIRM_ATTEMPTS,
    Assignment,
    Played,
    Schedule,
    confirming,
    regular,
)

ROUND_REPORT_DELAY = 30.0  # seconds into a slot when its result is exported


@dataclass
class Fleet:
    nodes: Sequence[str]
    seed: str = "fabric"
    period: float = 900.0
    nominal: float = 1.25e9  # bytes/s (10 Gbit/s)
    p_short: float = 0.01
    jitter: float = 0.05
    p_busy: float = 0.01
    threshold: float = 0.8
    confirm_runs: int = 3
    bad_hosts: dict[str, float] = field(default_factory=dict)  # node -> factor
    bad_paths: dict[frozenset[str], float] = field(default_factory=dict)  # {a, b} -> factor
    leaves: dict[str, str] = field(default_factory=dict)  # node -> its leaf; the schedule pairs by leaf
    bad_uplinks: dict[str, float] = field(default_factory=dict)  # leaf -> factor
    bad_leaves: dict[str, float] = field(default_factory=dict)  # leaf -> factor


@dataclass(frozen=True, slots=True)
class Outcome:
    """One meeting that took place."""

    round: int
    server: str
    client: str
    confirming: bool
    bandwidth: float
    short: bool


@dataclass
class Round:
    round: int
    meetings: list[Outcome]
    skipped: int  # nodes that planned a meeting that did not happen


class Group:
    """The group's state: every node's own history, as its agent keeps it."""

    def __init__(self, fleet: Fleet, rng: random.Random):
        self.fleet = fleet
        self.rng = rng
        self.schedule = Schedule(fleet.nodes, fleet.seed, fleet.leaves)
        self.history: dict[str, dict[int, Played]] = {n: {} for n in fleet.nodes}
        self.confirms: dict[str, dict[int, Played]] = {n: {} for n in fleet.nodes}

    def play(self, r: int) -> Round:
        f, rng = self.fleet, self.rng
        count = round(f.p_busy * len(f.nodes))
        busy = set(rng.sample(list(f.nodes), count)) if count else set()
        meetings: list[Outcome] = []
        plans = {n: regular(self.schedule, n, r) for n in f.nodes}
        skipped = self._slot(r, plans, busy, meetings)
        later = {n: confirming(self.schedule, n, r, self.history[n], self.confirms[n]) for n in f.nodes}
        skipped += self._slot(r, {n: a for n, a in later.items() if a is not None}, busy, meetings)
        for kept in (self.history, self.confirms):
            for history in kept.values():
                history.pop(r - CONFIRM_ATTEMPTS, None)  # confirming() reads no further back
        return Round(r, meetings, skipped)

    def _slot(self, r: int, plans: dict[str, Assignment], busy: set[str], meetings: list[Outcome]) -> int:
        f, skipped = self.fleet, 0
        for node, p in plans.items():
            if p.partner is None:
                if not p.confirming:
                    self.history[node][r] = Played(r, None, None, None)
                continue
            q = plans.get(p.partner)
            agreed = q is not None and q.partner == node and q.role is not None and q.role != p.role
            record = self.confirms if p.confirming else self.history
            if not agreed or node in busy or p.partner in busy:
                skipped += 1
                record[node][r] = Played(r, p.partner, p.role, None)
                continue
            if p.role != "client":
                continue  # the client's turn measures and records for both ends
            runs = f.confirm_runs if p.confirming else 1
            bandwidth = max(self._measure(p.partner, node) for _ in range(runs))
            short = bandwidth < f.threshold * f.nominal
            meetings.append(Outcome(r, p.partner, node, p.confirming, bandwidth, short))
            record[node][r] = Played(r, p.partner, "client", short)
            record[p.partner][r] = Played(r, node, "server", short)
        return skipped

    def _measure(self, server: str, client: str) -> float:
        f, rng = self.fleet, self.rng
        value = f.nominal * (1 + rng.uniform(-f.jitter, f.jitter))
        if rng.random() < f.p_short:
            value *= rng.uniform(0.3, 0.75)
        value *= f.bad_hosts.get(server, 1.0) * f.bad_hosts.get(client, 1.0)
        if f.bad_paths:
            value *= f.bad_paths.get(frozenset((server, client)), 1.0)
        if f.bad_uplinks or f.bad_leaves:
            ends = {f.leaves.get(server), f.leaves.get(client)}
            if len(ends) == 2:
                for leaf in ends:
                    value *= f.bad_uplinks.get(leaf or "", 1.0)
            for leaf in ends:
                value *= f.bad_leaves.get(leaf or "", 1.0)
        return value


def reports(rounds: Sequence[Round], period: float, both_ends: bool = False) -> Iterator[Report]:
    """What the agents export, as ``analysis.merge`` reads it back."""
    for rnd in rounds:
        for m in rnd.meetings:
            seen = rnd.round * period + ROUND_REPORT_DELAY + (period / 2 if m.confirming else 0)
            ends = ((m.client, m.server), (m.server, m.client)) if both_ends else ((m.client, m.server),)
            for node, peer in ends:
                yield Report(m.round, node, peer, m.bandwidth, not m.short, seen, seen + period)


def play(fleet: Fleet, first: int, count: int, seed: int = 1) -> list[Round]:
    group = Group(fleet, random.Random(seed))
    return [group.play(r) for r in range(first, first + count)]


def shifted(rounds: Sequence[Round], by: int) -> list[Round]:
    """The same rounds numbered ``by`` later: a group played once, exported at any time."""
    return [
        Round(r.round + by, [dataclasses.replace(m, round=m.round + by) for m in r.meetings], r.skipped)
        for r in rounds
    ]


def node_names(n: int) -> list[str]:
    return [f"h{i + 1}" for i in range(n)]


def tree(leaves: int, per_leaf: int) -> dict[str, str]:
    """``leaves`` × ``per_leaf`` nodes h1, h2, ... on leaves leaf1, leaf2, ..., in blocks: node ->
    its leaf."""
    return {f"h{i + 1}": f"leaf{i // per_leaf + 1}" for i in range(leaves * per_leaf)}


def path(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def meeting_round(schedule: Schedule, a: str, b: str, after: int) -> int:
    """The first round from ``after`` on in which ``a`` and ``b`` meet regularly."""
    for r in range(after, after + max(schedule.cycle, 1)):
        pair = schedule.partner(a, r)
        if pair is not None and pair.other(a) == b:
            return r
    raise ValueError(f"{a} and {b} never meet")


FAMILIES = (
    "clusterhealth_node_info",
    "clusterhealth_probe_round",
    "clusterhealth_probe_bandwidth_bytes_per_second",
    "clusterhealth_probe_peer_success",
    "clusterhealth_probe_placement_info",
)


def scrapes(
    probe: str,
    rounds: Sequence[Round],
    period: float,
    nodes: Sequence[str],
    *,
    scrape_interval: float = 15.0,
    phase: float = 7.0,
    job: str = "clusterhealth",
    node_info: bool = True,
    leaves: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, str]]:
    """What Prometheus would have scraped from every node's agent: (family, OpenMetrics sample
    line), node by node, each node's scrapes in time order.

    Each node exports, as the agent does, the round its clock is in (from the round's start) and
    its current round's result with the partner's name as ``peer``: the regular meeting's from
    ``ROUND_REPORT_DELAY`` into the round, replaced by the confirming meeting's from mid-round, and
    nothing for a round it skipped. Both ends export a meeting; a node on one of ``leaves`` exports
    its place. Scrapes fall ``phase`` seconds after each multiple of ``scrape_interval`` from the
    first round's start.
    """
    results: dict[tuple[str, int], list[tuple[float, str, float, bool]]] = {}
    for rnd in rounds:
        for m in rnd.meetings:
            at = (period / 2 if m.confirming else 0.0) + ROUND_REPORT_DELAY
            for node, peer in ((m.client, m.server), (m.server, m.client)):
                results.setdefault((node, rnd.round), []).append((at, peer, m.bandwidth, not m.short))
    if not rounds:
        return
    start = rounds[0].round * period + phase
    end = (rounds[-1].round + 1) * period
    steps = int((end - start) // scrape_interval)
    info, current_round, bandwidth_family, success_family, placement = FAMILIES
    for node in nodes:
        target = f'instance="{node}:9845",job="{job}"'
        leaf = (leaves or {}).get(node)
        for i in range(steps):
            t = start + i * scrape_interval
            if node_info:
                yield info, f'{info}{{{target},node="{node}"}} 1 {t:.3f}'
            if leaf:
                place = f'leaf="{leaf}",pod="",probe="{probe}",rail="",spine=""'
                yield placement, f"{placement}{{{target},{place}}} 1 {t:.3f}"
            current = int(t // period)
            yield current_round, f'{current_round}{{{target},probe="{probe}"}} {current} {t:.3f}'
            shown = [r for r in results.get((node, current), []) if t >= current * period + r[0]]
            if not shown:
                continue
            _, peer, bandwidth, success = shown[-1]
            labels = f'{target},peer="{peer}",probe="{probe}"'
            if bandwidth > 0:  # a run that measured nothing (a host at factor 0) exports none
                yield bandwidth_family, f"{bandwidth_family}{{{labels}}} {bandwidth:.1f} {t:.3f}"
            yield success_family, f"{success_family}{{{labels}}} {1 if success else 0} {t:.3f}"


def exposition_history(
    probe: str,
    rounds: Sequence[Round],
    period: float,
    nodes: Sequence[str],
    **options: Any,
) -> dict[str, list[str]]:
    """``scrapes`` as OpenMetrics sample lines per family (for ``openmetrics``)."""
    families: dict[str, list[str]] = {name: [] for name in FAMILIES}
    for family, line in scrapes(probe, rounds, period, nodes, **options):
        families[family].append(line)
    return families


def openmetrics(families: dict[str, list[str]]) -> str:
    """One OpenMetrics document from ``exposition_history`` results (several groups merged)."""
    out = []
    for name, lines in families.items():
        if not lines:
            continue
        out.append(f"# TYPE {name} gauge")
        # promtool wants each series' samples once and in time order; node_info comes once per group.
        series = (line.rsplit(" ", 2) for line in dict.fromkeys(lines))
        out.extend(" ".join(parts) for parts in sorted(series, key=lambda p: (p[0], float(p[2]))))
    out.append("# EOF")
    return "\n".join(out) + "\n"
