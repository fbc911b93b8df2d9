"""The remediator's own metrics, on its own registry and its own ``--listen`` endpoint.

One collector builds fresh families from the latest reconcile at every scrape (client_python's
custom-collector pattern); the counters are kept by `Tally` across reconciles. docs/metrics.md's
remediation table lists them; the rules in deploy/prometheus/clusterhealth_mixin/remediation.py
read them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from clusterhealth.agent import __version__
from clusterhealth.fleet.remediate.backend import QUARANTINE, REBOOT, RELEASE
from clusterhealth.fleet.remediate.engine import DEFERRED, STATUSES, Plan

# clusterhealth_remediation_actions_total's labels.
ACTIONS = (QUARANTINE, REBOOT, RELEASE)
OK, FAILED, DRY_RUN, SKIPPED = "ok", "failed", "dry_run", "skipped"
RESULTS = (OK, FAILED, DRY_RUN, SKIPPED)


@dataclass
class Tally:
    """What the metrics show: the counters since start and the latest reconcile's picture."""

    backend: str
    dry_run: bool
    actions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (action, result)
    plan: Plan | None = None  # the latest plan read from trusted data
    quarantined: int | None = None  # our nodes out of service after the latest reconcile
    leader: bool = False
    would: Counter[str] = field(default_factory=Counter)  # orders not carried out, by action
    last_success: float | None = None
    last_success_duration: float | None = None
    reconciles: Counter[str] = field(default_factory=Counter)  # by result: ok, untrusted, failed
    lock: threading.Lock = field(default_factory=threading.Lock)


class RemediationCollector(Collector):
    def __init__(self, tally: Tally):
        self.tally = tally

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        t = self.tally
        with t.lock:
            yield from self._families(t)

    def _families(self, t: Tally) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        build = GaugeMetricFamily(
            "clusterhealth_build_info", "clusterhealth version, value 1.", labels=["version"]
        )
        build.add_metric([__version__], 1)
        yield build
        actions = CounterMetricFamily(
            "clusterhealth_remediation_actions",
            "Orders carried out on the scheduler (ok, failed), not carried out in dry-run or as a "
            "follower (dry_run), or found taken over just before (skipped).",
            labels=["backend", "action", "result"],
        )
        for action in ACTIONS:
            for result in RESULTS:
                actions.add_metric([t.backend, action, result], t.actions[(action, result)])
        yield actions
        mode = GaugeMetricFamily(
            "clusterhealth_remediation_dry_run",
            "1 when the remediator runs without --act.",
            labels=["backend"],
        )
        mode.add_metric([t.backend], 1 if t.dry_run else 0)
        yield mode
        leader = GaugeMetricFamily(
            "clusterhealth_remediation_leader",
            "1 while this process holds the right to act (the lock or the Lease).",
            labels=["backend"],
        )
        leader.add_metric([t.backend], 1 if t.leader else 0)
        yield leader
        reconciles = CounterMetricFamily(
            "clusterhealth_remediation_reconciles",
            "Reconciles by result: ok, untrusted (no trusted data: nothing done), failed (a scheduler "
            "command failed or hung: the rest of the orders wait for the next).",
            labels=["backend", "result"],
        )
        for result in ("ok", "untrusted", "failed"):
            reconciles.add_metric([t.backend, result], t.reconciles[result])
        yield reconciles
        if t.last_success is not None:
            last = GaugeMetricFamily(
                "clusterhealth_remediation_last_success_timestamp_seconds",
                "When the latest reconcile that read trusted data and carried out its orders ended.",
                labels=["backend"],
            )
            last.add_metric([t.backend], t.last_success)
            yield last
        if t.last_success_duration is not None:
            took = GaugeMetricFamily(
                "clusterhealth_remediation_reconcile_duration_seconds",
                "How long that reconcile took.",
                labels=["backend"],
            )
            took.add_metric([t.backend], t.last_success_duration)
            yield took
        if t.plan is None:
            return  # no trusted picture yet: the budget and the nodes are unknown, not 0
        plan = t.plan
        quarantined = t.quarantined if t.quarantined is not None else plan.ours
        for name, text, value in (
            ("quarantined_nodes", "Nodes out of service by the remediator (its mark on them).", quarantined),
            (
                "budget_remaining",
                "How many more nodes it may take out of service now (budget.max_unavailable minus "
                "its nodes out of service).",
                max(0, plan.budget.max_unavailable - quarantined),
            ),
            ("budget_max_unavailable", "budget.max_unavailable.", plan.budget.max_unavailable),
            ("slow_start_width", "How many of its acts may be in flight at once now.", plan.budget.width),
            (
                "in_flight_nodes",
                "Nodes acted on that have not come back healthy yet (nor past the deadline).",
                plan.budget.in_flight,
            ),
        ):
            family = GaugeMetricFamily(f"clusterhealth_remediation_{name}", text, labels=["backend"])
            family.add_metric([t.backend], value)
            yield family
        deferred = GaugeMetricFamily(
            "clusterhealth_remediation_deferred_nodes",
            "Nodes whose verdict asks for an act that waits: the fleet budget (budget) or a failure "
            "domain's (domain) is spent, or the slow start allows no more in flight (slow_start).",
            labels=["backend", "reason"],
        )
        for reason in DEFERRED:
            deferred.add_metric([t.backend, reason], plan.budget.deferred.get(reason, 0))
        yield deferred
        nodes = GaugeMetricFamily(
            "clusterhealth_remediation_nodes",
            "Nodes by what the remediator makes of them (docs/remediation.md: statuses).",
            labels=["backend", "status"],
        )
        statuses = plan.statuses()
        for status in STATUSES:
            nodes.add_metric([t.backend, status], statuses.get(status, 0))
        yield nodes
        would = GaugeMetricFamily(
            "clusterhealth_remediation_would_act_nodes",
            "The orders of the latest reconcile not carried out because it runs in dry-run or as a "
            "follower, by action (0 when it acts).",
            labels=["backend", "action"],
        )
        for action in ACTIONS:
            would.add_metric([t.backend, action], t.would.get(action, 0))
        yield would


def registry(tally: Tally) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RemediationCollector(tally))
    return registry
