"""The remediator's decisions: a pure function from what Prometheus and the scheduler say to orders.

`decide` reads two pictures taken at one reconcile, every node's verdict (`Seen`, from
fleet/remediate/verdicts.py) and every node as the scheduler has it (`NodeView`, from a backend),
and returns a `Plan`: the orders to carry out now and, for every node left alone, why. It keeps no
state: whatever it needs from the past is in the ledger the backend reports (the acts of ours
each node carries), so a restarted remediator decides what the running one would have, and a
verdict that was true while the budget was full is not replayed when it frees: only the verdicts
of this reconcile are read (level-triggered, like a Kubernetes controller).

The rules, in the order they are applied to a node (docs/remediation.md says them for operators):

1. An act of ours whose mark someone removed or changed is closed in the ledger (`forget`); the
   node is theirs now.
2. A vetoed node (``do-not-act``) is reported and never touched, ours or not.
3. A node of ours is released once its verdict has been ``healthy`` for ``settle_seconds``,
   unless the act holds it for a person (the K-in-window rule). Any other verdict, or none, keeps
   it as it is: a missing or untrusted verdict is neither healthy nor sick.
4. A node out of service for someone else's reason is never touched.
5. A node in service is quarantined when its verdict is in ``act_on_states`` with an action in
   ``act_on_actions``, has held for ``hold_seconds`` and is fresh; the K-th act within
   ``repeat_window_seconds`` is an ``inspect`` that holds the node for a person.
6. The fleet budget then picks among those candidates, the heaviest action first, then the longest
   held: at most ``budget.max_unavailable`` nodes of ours out of service at once, at most
   ``budget.max_unavailable_per_domain`` in any failure domain, and, with the slow start, at most
   as many acts in flight as the width earned by the acts before (see `slow_start_width`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from clusterhealth.checks.verdict import ACTIONS
from clusterhealth.fleet.remediate.backend import (
    FORGET,
    QUARANTINE,
    REBOOT,
    RECOVERED,
    RELEASE,
    Act,
    NodeView,
    Order,
)
from clusterhealth.fleet.remediate.config import RemediateConfig

# Our marks begin with this (Slurm's drain reason; SPEC fixes it).
PREFIX = "clusterhealth:"
# A drain reason is one line that `sinfo -R` and `scontrol show node` show whole.
MAX_REASON = 120

# Why a node is left alone, in the plan and in clusterhealth_remediation_nodes{status}.
VETO = "veto"  # do-not-act
OTHER = "other"  # out of service by someone else
UNKNOWN_NODE = "unknown_node"  # Prometheus names a node the scheduler does not know
NO_VERDICT = "no_verdict"  # the scheduler knows it, Prometheus has no verdict for it
UNTRUSTED = "untrusted"  # a verdict that cannot be trusted: stale, odd labels, two targets
HOLDING = "holding"  # its verdict asks for an act but has not held for hold_seconds yet
QUARANTINED = "quarantined"  # ours, staying so (not healthy for settle_seconds yet)
HELD_FOR_PERSON = "held_for_person"  # ours, acted on K times: a person releases it
BUDGET = "budget"  # deferred: the fleet budget is spent
DOMAIN = "domain"  # deferred: its failure domain's budget is spent
SLOW_START = "slow_start"  # deferred: the slow start allows no more acts in flight
NOT_ACTED_ON = "not_acted_on"  # a verdict the configuration does not act on (degraded, restart_job)
HEALTHY = "healthy"  # in service and healthy, or nothing to do
DEFERRED = (BUDGET, DOMAIN, SLOW_START)
STATUSES = (
    HEALTHY, NOT_ACTED_ON, HOLDING, QUARANTINED, HELD_FOR_PERSON, VETO, OTHER, NO_VERDICT, UNTRUSTED,
    UNKNOWN_NODE, BUDGET, DOMAIN, SLOW_START,
)  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """A node's verdict as Prometheus has it at this reconcile.

    ``state`` and ``action`` are None when there is no verdict to trust for the node (``problem``
    says why: its series stopped, it carries labels no agent writes, two targets name the node).
    ``held_seconds`` is how long this very verdict (state and action) is known to have held: the
    longest of the windows asked over which Prometheus shows nothing else for the node, 0 when
    not even the shortest."""

    node: str
    state: str | None
    action: str | None
    held_seconds: float = 0.0
    evidence: str = ""  # the checks behind it, worst first, short
    problem: str | None = None
    source: str = "verdict"  # or "fabric": an `analyze` host suspect
    impact: Mapping[str, object] | None = None  # a fabric suspect's price (analyze's impact)


@dataclass(frozen=True)
class Left:
    """A node the plan leaves alone (or keeps as it is), and why."""

    node: str
    status: str  # one of STATUSES
    detail: str = ""
    action: str | None = None  # the action its verdict asks for, when one


@dataclass(frozen=True)
class Budget:
    """The fleet budget at this reconcile (after the plan's releases and quarantines)."""

    max_unavailable: int
    used: int  # our nodes out of service once the plan is carried out
    remaining: int
    width: int  # the slow start's width: acts allowed in flight at once
    in_flight: int  # our acts not yet judged (neither back healthy nor past the deadline)
    deferred: Mapping[str, int] = field(default_factory=dict)  # by BUDGET, DOMAIN, SLOW_START

    @property
    def exhausted(self) -> bool:
        """Nodes wait because the fleet's or a domain's budget is spent (not the slow start's
        pacing, which frees itself as acts are judged)."""
        return bool(self.deferred.get(BUDGET) or self.deferred.get(DOMAIN))


@dataclass(frozen=True)
class Plan:
    orders: tuple[Order, ...]  # releases and forgets first, then quarantines, in the order to apply
    left: tuple[Left, ...]
    budget: Budget
    ours: int  # our nodes out of service before the plan

    def statuses(self) -> Counter[str]:
        return Counter(item.status for item in self.left)


def reason(action: str, evidence: str) -> str:
    """The mark we write: ``clusterhealth: <action>: <evidence>``, one printable line of at most
    MAX_REASON characters (evidence comes from label values anyone's exporter could set)."""
    text = re.sub(r"\s+", " ", "".join(c if c.isprintable() else " " for c in evidence)).strip()
    line = f"{PREFIX} {action}: {text}" if text else f"{PREFIX} {action}"
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3].rstrip() + "..."


def weight(action: str | None) -> int:
    return ACTIONS.index(action) if action in ACTIONS else -1


def slow_start_width(acts: Iterable[Act], now: float, cap: int, deadline: float) -> tuple[int, int]:
    """(width, in flight): how many of our acts may be in flight at once, and how many are.

    Every act is judged once: a success when we released it (its node came back healthy), a
    failure when someone else took it over or when it is still standing ``deadline`` seconds after
    it was applied (a node held for a person included). Taken in the order they were judged, a
    success doubles the width (up to ``cap``) and a failure sets it back to one; an act not yet
    judged is in flight. The ledger keeps the acts of the repeat window, so after a quiet week the
    width is one again."""
    judged: list[tuple[float, bool]] = []
    in_flight = 0
    for act in acts:
        if act.ended is not None:
            judged.append((act.ended, act.outcome == RECOVERED))
        elif now - act.at >= deadline:
            judged.append((act.at + deadline, False))
        else:
            in_flight += 1
    width = 1
    for _, success in sorted(judged):
        width = min(width * 2, max(cap, 1)) if success else 1
    return width, in_flight


def decide(
    now: float,
    config: RemediateConfig,
    seen: Mapping[str, Seen],
    nodes: Mapping[str, NodeView],
    can_reboot: bool = False,
) -> Plan:
    """The orders for this reconcile; see the module's docstring for the rules."""
    releases: list[Order] = []
    forgets: list[Order] = []
    left: list[Left] = []
    candidates: list[tuple[NodeView, Seen]] = []

    for name in sorted(set(seen) - set(nodes)):
        left.append(Left(name, UNKNOWN_NODE, "Prometheus has a verdict for it, the scheduler no such node"))

    for name in sorted(nodes):
        view = nodes[name]
        verdict = seen.get(name)
        if view.orphan is not None:
            forgets.append(
                Order(
                    name,
                    FORGET,
                    view.orphan.action,
                    view.orphan.reason,
                    why=f"our mark was removed or changed ({view.other or 'back in service'})",
                )
            )
        if view.veto:
            left.append(Left(name, VETO, "do-not-act", _asked(verdict)))
            continue
        if view.ours is not None:
            act = view.ours
            # A reboot the scheduler carried out puts the node back in service itself: if it is
            # still sick, it is acted on again below (a new act, counted for the K rule).
            again = (
                view.in_service
                and verdict is not None
                and verdict.state in config.act_on_states
                and verdict.action in config.act_on_actions
            )
            if act.hold:
                left.append(Left(name, HELD_FOR_PERSON, _held_detail(act, config), _asked(verdict)))
                continue
            if verdict is None or verdict.state is None:
                left.append(Left(name, QUARANTINED, _missing(verdict)))
                continue
            if verdict.state == "healthy" and verdict.held_seconds >= config.settle_seconds:
                why = f"healthy for at least {config.settle_seconds:g} s"
                releases.append(Order(name, RELEASE, act.action, act.reason, why=why))
                continue
            if not again:
                detail = (
                    f"healthy for {verdict.held_seconds:g} s of {config.settle_seconds:g}"
                    if verdict.state == "healthy"
                    else f"{verdict.state} {verdict.action}"
                )
                left.append(Left(name, QUARANTINED, detail, _asked(verdict)))
                continue
        elif not view.in_service or view.other is not None:
            left.append(Left(name, OTHER, view.other or "out of service", _asked(verdict)))
            continue
        if verdict is None or verdict.state is None:
            left.append(Left(name, NO_VERDICT if verdict is None else UNTRUSTED, _missing(verdict)))
            continue
        if verdict.state not in config.act_on_states or verdict.action not in config.act_on_actions:
            status = HEALTHY if verdict.state == "healthy" else NOT_ACTED_ON
            left.append(Left(name, status, f"{verdict.state} {verdict.action}", _asked(verdict)))
            continue
        if verdict.held_seconds < config.hold_seconds:
            detail = (
                f"{verdict.state} {verdict.action} for {verdict.held_seconds:g} s of {config.hold_seconds:g}"
            )
            left.append(Left(name, HOLDING, detail, verdict.action))
            continue
        candidates.append((view, verdict))

    ours = sum(1 for view in nodes.values() if view.ours is not None)
    released = {order.node for order in releases}
    used = ours - len(released)
    per_domain: Counter[tuple[str, str]] = Counter(
        item
        for view in nodes.values()
        if view.ours is not None and view.name not in released
        for item in view.domains.items()
    )
    cap = config.budget.max_unavailable
    all_acts = [act for view in nodes.values() for act in view.history]
    if config.budget.slow_start:
        width, in_flight = slow_start_width(all_acts, now, cap, config.budget.slow_start_deadline_seconds)
        # An act released in this plan came back healthy: it counts as a success now.
        width = min(width * 2 ** len(released), max(cap, 1)) if released else width
        in_flight -= sum(1 for n in released if _in_flight(nodes[n].ours, now, config))
        # An act someone else took over did not come back healthy: a failure now.
        if forgets:
            width = 1
            in_flight -= sum(1 for n in forgets if _in_flight(nodes[n.node].orphan, now, config))
    else:
        width, in_flight = math.inf, 0  # type: ignore[assignment]
    remaining = max(0, cap - used)
    per_domain_cap = config.budget.max_unavailable_per_domain
    deferred: Counter[str] = Counter()
    quarantines: list[Order] = []
    candidates.sort(key=lambda c: (-weight(c[1].action), -c[1].held_seconds, c[0].name))
    for view, verdict in candidates:
        action = verdict.action or "inspect"
        domain = next(
            (f"{k}={v}" for k, v in sorted(view.domains.items()) if per_domain[(k, v)] >= per_domain_cap),
            None,
        )
        counted = view.ours is not None  # acted on again: its place in the budget is its own
        if remaining <= 0 and not counted:
            status, detail = BUDGET, f"{used} of {cap} nodes out of service by us"
        elif domain is not None and not counted:
            status, detail = DOMAIN, f"{domain} has {per_domain_cap} node(s) out of service by us"
        elif in_flight >= width:
            status, detail = SLOW_START, f"{in_flight} act(s) in flight, width {width}"
        else:
            status = ""
        if status:
            deferred[status] += 1
            left.append(Left(view.name, status, detail, action))
            continue
        recent = [a for a in view.history if a.at > now - config.repeat_window_seconds]
        hold = len(recent) + 1 >= config.repeat_limit
        if hold:
            action = "inspect"
        operation = REBOOT if (action == "reboot" and can_reboot) else QUARANTINE
        why = f"{verdict.state} {verdict.action} for at least {config.hold_seconds:g} s"
        if hold:
            why += f"; act {len(recent) + 1} within {config.repeat_window_seconds:g} s: held for a person"
        evidence = verdict.evidence or f"{verdict.state} ({verdict.source})"
        quarantines.append(
            Order(
                view.name,
                operation,
                action,
                reason(action, evidence),
                evidence,
                hold=hold,
                why=why,
                impact=verdict.impact,
            )
        )
        if not counted:
            remaining -= 1
            used += 1
            for item in view.domains.items():
                per_domain[item] += 1
        in_flight += 1
    budget = Budget(
        max_unavailable=cap,
        used=used,
        remaining=remaining,
        width=width if config.budget.slow_start else cap,
        in_flight=in_flight,
        deferred=dict(deferred),
    )
    return Plan(tuple(forgets + releases + quarantines), tuple(left), budget, ours)


def _in_flight(act: Act | None, now: float, config: RemediateConfig) -> bool:
    return act is not None and now - act.at < config.budget.slow_start_deadline_seconds


def _asked(verdict: Seen | None) -> str | None:
    return verdict.action if verdict is not None and verdict.state is not None else None


def _missing(verdict: Seen | None) -> str:
    if verdict is None:
        return "no verdict in Prometheus"
    return verdict.problem or "no verdict to trust"


def _held_detail(act: Act, config: RemediateConfig) -> str:
    return (
        f"acted on {config.repeat_limit} times within {config.repeat_window_seconds:g} s: a person resumes it"
    )
