"""A pairwise group's history made by simulation rather than read from Prometheus, for what is
drawn at sizes no backfilled Prometheus of the test suite holds (5,000 nodes), for the README's
picture (fixed data, so that it regenerates the same) and for benchmarks/report_scale.py's twin
in the tests. The history is what ``pairwise.read_history`` returns for the same meetings."""

from __future__ import annotations

import random
from collections.abc import Mapping

from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.fleet.pairwise import History


def simulated(
    n: int,
    rounds: int,
    *,
    first: int,
    period: float = 900.0,
    fault_from: int | None = None,
    bad_hosts: Mapping[str, float] | None = None,
    bad_paths: Mapping[frozenset[str], float] | None = None,
    seed: str = "report",
    **noise: float,
) -> tuple[History, list[sim.Round]]:
    """The history of ``rounds`` rounds of nodes h1..hN from round ``first`` (and the rounds
    played), the faults from round ``fault_from``; ends at the last round's end."""
    names = sim.node_names(n)
    fleet = sim.Fleet(names, seed=seed, period=period, **noise)
    group = sim.Group(fleet, random.Random(1))
    played = []
    for r in range(first, first + rounds):
        if r == fault_from:
            fleet.bad_hosts.update(bad_hosts or {})
            fleet.bad_paths.update(bad_paths or {})
        played.append(group.play(r))
    end = (first + rounds) * period
    history = History(
        probe="fabric",
        end=end,
        window=rounds * period,
        period=period,
        step=period / 8,
        meetings=analysis.merge(sim.reports(played, period)),
        nodes=set(names),
        expected=None,
        jobs=None,
        warnings=[],
        untied=[],
    )
    return history, played
