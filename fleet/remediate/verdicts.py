"""Every node's verdict as Prometheus has it, and whether it can be trusted: the remediator's input.

The agents export ``clusterhealth_node_verdict{state, action}`` 1 (one series per node) and
``clusterhealth_node_info{node}`` (the node's name); Prometheus adds the scrape target's labels
(``instance``, ``job``, whatever relabelling adds). A few instant queries per reconcile, whatever
the size of the fleet, read them through fleet/prometheus.py's client:

* ``timestamp(clusterhealth_node_verdict)``: each target's verdict now and when it was last
  scraped. A verdict older than ``stale_seconds`` is from a series that stopped: not acted on.
* ``clusterhealth_node_info``: which node each target is.
* for each window W (``hold_seconds``, ``settle_seconds``): ``count_over_time(...[W])``, the
  verdict series a target had within the window, and ``last_over_time(...[stale])`` evaluated W
  ago, its verdict at the window's start. A verdict has held for W when it was the target's verdict
  at the start and no other appeared since. This reads Prometheus's record, not the agent's
  ``since`` (which starts again when the agent restarts).
* ``clusterhealth_check_status > 0``: the checks behind a verdict, for the drain reason.

What cannot be trusted never becomes a verdict: an unreachable Prometheus, an error answer or a
partial one (``warnings``, ``isPartial``) fails the whole read (`NoVerdict`: the reconcile acts on
nothing); a stale verdict, one with labels no agent writes, or a node name two targets claim makes
that node's verdict unusable (``Seen.problem``), and the other nodes are read as usual. A target
that does not say which node it is is named in ``Reading.problems``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterhealth.checks.verdict import ACTIONS, STATES
from clusterhealth.fleet.prometheus import (
    NoVerdict,
    Partial,
    Prometheus,
    Target,
    number,
    show_target,
    target_of,
)
from clusterhealth.fleet.remediate.engine import Seen, weight

VERDICT = "clusterhealth_node_verdict"
NODE_INFO = "clusterhealth_node_info"
CHECK_STATUS = "clusterhealth_check_status"
_OWN = ("state", "action")
# clusterhealth_check_status's values, worst first for the evidence (CRITICAL, UNKNOWN, WARNING).
_STATUS_ORDER = {2: 0, 3: 1, 1: 2}
MAX_EVIDENCE = 3


@dataclass(frozen=True)
class Reading:
    seen: Mapping[str, Seen]
    # What could not be tied to a node (a target without clusterhealth_node_info), one line each.
    problems: tuple[str, ...] = ()
    queries: int = 0
    targets: int = 0


@dataclass
class _Target:
    series: dict[tuple[str, str], float] = field(default_factory=dict)  # (state, action) -> last sample
    odd: list[str] = field(default_factory=list)  # series with labels no agent writes


def _selector(seconds: float) -> str:
    return f"[{max(1, math.ceil(seconds * 1000))}ms]"


def read(
    prometheus: Prometheus,
    now: float,
    *,
    stale_seconds: float,
    windows: Iterable[float],
) -> Reading:
    """Every node's verdict at ``now``, with how long it has held (the longest of ``windows`` it
    is proven over). NoVerdict when Prometheus cannot be asked or answers partially, or holds no
    verdict at all."""
    mark, asked = prometheus.mark(), prometheus.requests
    current: dict[Target, _Target] = defaultdict(_Target)
    for series in prometheus.query(f"timestamp({VERDICT})", now):
        labels = series.get("metric") or {}
        target = target_of(labels, _OWN)
        state, action = labels.get("state"), labels.get("action")
        stamp = number((series.get("value") or [None, None])[1])
        if state not in STATES or action not in ACTIONS or stamp is None:
            current[target].odd.append(f"state={state!r}, action={action!r}")
            continue
        current[target].series[(state, action)] = stamp
    if not current:
        raise NoVerdict(f"Prometheus at {prometheus.url} has no {VERDICT} series (are the agents scraped?)")

    names: dict[Target, set[str]] = defaultdict(set)
    for series in prometheus.query(NODE_INFO, now):
        labels = series.get("metric") or {}
        node = labels.get("node")
        if node:
            names[target_of(labels, ("node",))].add(node)

    # Each window: the verdict series each target had in it, and the one it had at its start.
    proven: list[tuple[float, dict[Target, set[tuple[str, str]]], dict[Target, set[tuple[str, str]]]]] = []
    for width in sorted({w for w in windows if w > 0}):
        within = _by_target(prometheus.query(f"count_over_time({VERDICT}{_selector(width)})", now))
        at_start = _by_target(
            prometheus.query(f"last_over_time({VERDICT}{_selector(stale_seconds)})", now - width)
        )
        proven.append((width, within, at_start))

    evidence = _evidence(prometheus.query(f"{CHECK_STATUS} > 0", now))
    partial = prometheus.partial_since(mark)
    if partial:
        raise Partial("; ".join(partial))

    claims: dict[str, list[Target]] = defaultdict(list)
    problems: list[str] = []
    for target in current:
        found = names.get(target, set())
        if len(found) == 1:
            claims[next(iter(found))].append(target)
        else:
            says = f"names itself {sorted(found)}" if found else f"has no {NODE_INFO}"
            problems.append(f"the target {show_target(target)} has a verdict but {says}: it is left alone")

    seen: dict[str, Seen] = {}
    for node, targets in sorted(claims.items()):
        if len(targets) > 1:
            shown = ", ".join(show_target(t) for t in targets)
            seen[node] = Seen(
                node, None, None, problem=f"{len(targets)} targets say they are {node}: {shown}"
            )
            continue
        target = targets[0]
        entry = current[target]
        if entry.odd:
            problem = (
                f"a verdict series with unexpected labels ({'; '.join(entry.odd)}) from {show_target(target)}"
            )
            seen[node] = Seen(node, None, None, problem=problem)
            continue
        (state, action), stamp = max(entry.series.items(), key=lambda item: item[1])
        age = now - stamp
        if age > stale_seconds:
            # The sample's time rather than its age: the same words at every reconcile, said once.
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))
            problem = f"its series stopped: its latest verdict ({state} {action}) is from {when}"
            seen[node] = Seen(node, None, None, problem=problem)
            continue
        held = 0.0
        for width, within, at_start in proven:
            if within.get(target) == {(state, action)} and (state, action) in at_start.get(target, set()):
                held = width
            else:
                break
        seen[node] = Seen(node, state, action, held, evidence.get(target, ""))
    return Reading(seen, tuple(problems), prometheus.requests - asked, len(current))


def _by_target(result: Iterable[Mapping[str, Any]]) -> dict[Target, set[tuple[str, str]]]:
    out: dict[Target, set[tuple[str, str]]] = defaultdict(set)
    for series in result:
        labels = series.get("metric") or {}
        out[target_of(labels, _OWN)].add((str(labels.get("state")), str(labels.get("action"))))
    return out


def _evidence(result: Iterable[Mapping[str, Any]]) -> dict[Target, str]:
    """The checks that are not OK, per target, worst first: ``gpu_xid 3, mtu ib0 (+2)``."""
    found: dict[Target, list[tuple[int, str]]] = defaultdict(list)
    for series in result:
        labels = series.get("metric") or {}
        value = number((series.get("value") or [None, None])[1])
        if value is None or int(value) not in _STATUS_ORDER:
            continue
        name = " ".join(part for part in (labels.get("check", "?"), labels.get("subject", "")) if part)
        found[target_of(labels, ("check", "subject"))].append((_STATUS_ORDER[int(value)], name))
    out = {}
    for target, items in found.items():
        items.sort()
        text = ", ".join(name for _, name in items[:MAX_EVIDENCE])
        out[target] = text + (f" (+{len(items) - MAX_EVIDENCE})" if len(items) > MAX_EVIDENCE else "")
    return out


def with_suspects(seen: Mapping[str, Seen], suspects: Mapping[str, Seen]) -> dict[str, Seen]:
    """The verdicts with `analyze`'s host suspects laid over them: a suspect makes its node
    unhealthy with the heavier of the two actions, whatever its own verdict (a node's agent
    cannot see that its link is slow; the fleet's pairwise results can)."""
    merged = dict(seen)
    for node, suspect in suspects.items():
        own = seen.get(node)
        if own is not None and own.state == "unhealthy" and weight(own.action) > weight(suspect.action):
            merged[node] = own
        else:
            evidence = suspect.evidence
            if own is not None and own.evidence:
                evidence = f"{evidence}; {own.evidence}"
            merged[node] = Seen(
                node,
                "unhealthy",
                suspect.action,
                suspect.held_seconds,
                evidence,
                source=suspect.source,
                impact=suspect.impact,
            )
    return merged
