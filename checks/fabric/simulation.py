"""A pairwise group played round by round without a network, for tests and benchmarks/.

Every node plans its rounds with the real ``schedule.regular`` and ``schedule.confirming`` from
its own history only, exactly as an agent does; a meeting happens when both ends planned it (same
partner, same slot, complementary roles) and neither is busy. A node whose partner is busy or
declined a confirming meeting records ``skipped``. The measurement is drawn from a noise model:

* a healthy run measures ``nominal`` × (1 ± ``jitter``, uniform);
* with probability ``p_short`` it falls short at random, to 30-75 % of that;
* a bad host multiplies every run it takes part in by its factor, a bad path every run between
  its two ends (both directions);
* a confirming meeting is ``confirm_runs`` runs; the best one is its result;
* each round a fraction ``p_busy`` of the nodes is busy (the idle guard) and sits out.

Each end judges a meeting short against ``nominal`` × ``threshold``, as an agent judges it
against its expectation. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from clusterhealth.checks.fabric.analysis import Report
from clusterhealth.checks.fabric.schedule import Assignment, Played, Schedule, confirming, regular

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
    confirm_runs: int = 2
    bad_hosts: dict[str, float] = field(default_factory=dict)  # node -> factor
    bad_paths: dict[frozenset[str], float] = field(default_factory=dict)  # {a, b} -> factor


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
        self.schedule = Schedule(fleet.nodes, fleet.seed)
        self.history: dict[str, dict[int, Played]] = {n: {} for n in fleet.nodes}

    def play(self, r: int) -> Round:
        f, rng = self.fleet, self.rng
        count = round(f.p_busy * len(f.nodes))
        busy = set(rng.sample(list(f.nodes), count)) if count else set()
        meetings: list[Outcome] = []
        plans = {n: regular(self.schedule, n, r) for n in f.nodes}
        skipped = self._slot(r, plans, busy, meetings)
        later = {n: confirming(self.schedule, n, r, self.history[n]) for n in f.nodes}
        skipped += self._slot(r, {n: a for n, a in later.items() if a is not None}, busy, meetings)
        for history in self.history.values():
            history.pop(r - 1, None)  # confirming() reads this round and the one before
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
            if not agreed or node in busy or p.partner in busy:
                skipped += 1
                if not p.confirming:
                    self.history[node][r] = Played(r, p.partner, p.role, None)
                continue
            if p.role != "client":
                continue  # the client's turn measures and records for both ends
            runs = f.confirm_runs if p.confirming else 1
            bandwidth = max(self._measure(p.partner, node) for _ in range(runs))
            short = bandwidth < f.threshold * f.nominal
            meetings.append(Outcome(r, p.partner, node, p.confirming, bandwidth, short))
            if not p.confirming:
                self.history[node][r] = Played(r, p.partner, "client", short)
                self.history[p.partner][r] = Played(r, node, "server", short)
        return skipped

    def _measure(self, server: str, client: str) -> float:
        f, rng = self.fleet, self.rng
        value = f.nominal * (1 + rng.uniform(-f.jitter, f.jitter))
        if rng.random() < f.p_short:
            value *= rng.uniform(0.3, 0.75)
        value *= f.bad_hosts.get(server, 1.0) * f.bad_hosts.get(client, 1.0)
        if f.bad_paths:
            value *= f.bad_paths.get(frozenset((server, client)), 1.0)
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


def node_names(n: int) -> list[str]:
    return [f"h{i + 1}" for i in range(n)]


def path(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def meeting_round(schedule: Schedule, a: str, b: str, after: int) -> int:
    """The first round from ``after`` on in which ``a`` and ``b`` meet regularly."""
    for r in range(after, after + max(schedule.cycle, 1)):
        pair = schedule.partner(a, r)
        if pair is not None and pair.other(a) == b:
            return r
    raise ValueError(f"{a} and {b} never meet")
