"""`clusterhealth remediate`: the reconcile loop, its log and its exit codes.

A reconcile reads every node's verdict from Prometheus (fleet/remediate/verdicts.py; with
``--fabric``, `analyze`'s host suspects), takes or renews the right to act (``Backend.lead``),
observes the scheduler, decides (fleet/remediate/engine.py) and carries the orders out: the
forgets and releases first, then the quarantines. Without ``--act``, or while another process
holds the right to act, the orders are logged and counted as what it *would* do, and nothing is
touched.

What goes wrong is said once: a problem is logged when it first appears and again when it is
gone, not at every interval. No trusted data (Prometheus unreachable or partial, the scheduler
unreadable) means no order at all; a scheduler command that fails or hangs stops the reconcile
there, and the next one starts from a fresh picture.

Exit codes of ``--once``: 0 nothing to do or done, 1 acted or would act, 2 bad arguments or
configuration, 3 no trusted data (Prometheus or the scheduler could not be read, or a scheduler
command failed or hung: the reconcile did not finish).
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from clusterhealth.fleet.prometheus import NoVerdict, Prometheus
from clusterhealth.fleet.remediate import engine, verdicts
from clusterhealth.fleet.remediate.backend import (
    FORGET,
    QUARANTINE,
    REBOOT,
    RELEASE,
    TAKEN_OVER,
    Backend,
    BackendError,
    Lead,
    Order,
)
from clusterhealth.fleet.remediate.config import RemediateConfig
from clusterhealth.fleet.remediate.engine import Plan, Seen
from clusterhealth.fleet.remediate.metrics import DRY_RUN, FAILED, OK, SKIPPED, Tally

log = logging.getLogger("clusterhealth.remediate")

EXIT_DONE, EXIT_ACTED, EXIT_USAGE, EXIT_UNTRUSTED = 0, 1, 2, 3
BACKENDS = ("slurm", "kubernetes")


@runtime_checkable
class Tending(Protocol):
    """A backend that keeps its acts up between orders (Kubernetes: the heartbeat of its conditions
    and the evictions that fall due). The reconcile calls ``tend`` after carrying out a plan, when
    it acts (not dry-run) and leads; a backend without it needs nothing of the kind."""

    def tend(self, plan: Plan, now: float) -> None: ...


def open_backend(name: str, config: RemediateConfig, dry_run: bool) -> Backend:
    """The backend ``--backend`` names (its module has ``open_backend``)."""
    module = importlib.import_module(f"clusterhealth.fleet.remediate.{name}")
    backend: Backend = module.open_backend(config, dry_run)
    return backend


class Said:
    """Problems said once: logged when they appear, and when they are gone."""

    def __init__(self) -> None:
        self._current: set[str] = set()

    def now(self, problems: set[str], level: int = logging.WARNING) -> None:
        for problem in sorted(problems - self._current):
            log.log(level, "%s", problem)
        for problem in sorted(self._current - problems):
            log.info("no longer: %s", problem)
        self._current = set(problems)


@dataclass
class Result:
    code: int
    plan: Plan | None = None
    done: list[Order] = field(default_factory=list)  # carried out
    would: list[Order] = field(default_factory=list)  # not carried out: dry-run or follower
    problem: str | None = None


class Remediator:
    def __init__(
        self,
        config: RemediateConfig,
        backend: Backend,
        prometheus: Prometheus,
        *,
        act: bool = False,
        fabric: str | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.backend = backend
        self.prometheus = prometheus
        self.act = act
        self.fabric = fabric
        self.clock = clock
        self.tally = Tally(backend.name, dry_run=not act)
        self._trust = Said()  # Prometheus and the scheduler as a whole
        self._nodes = Said()  # one node's verdict or a target
        self._leading: bool | None = None
        self._node_problems: set[str] = set()

    # --- one reconcile --------------------------------------------------------------------------

    def reconcile(self) -> Result:
        began = time.monotonic()
        now = self.clock()
        try:
            seen = self._read(now)
        except NoVerdict as err:
            return self._untrusted(f"no action: {err}")
        return self.step(seen, now, began)

    def step(self, seen: Mapping[str, Seen], now: float, began: float | None = None) -> Result:
        """The reconcile past the reading of Prometheus: lead, observe, decide, carry out."""
        began = time.monotonic() if began is None else began
        lead = self.backend.lead() if self.act else Lead(False, "dry-run")
        self._say_lead(lead)
        try:
            observation = self.backend.observe(now)
        except BackendError as err:
            return self._untrusted(f"no action: the scheduler cannot be read: {err}")
        plan = engine.decide(now, self.config, seen, observation.nodes, self.backend.can_reboot)
        self._nodes.now(self._node_problems | {_said(item) for item in plan.left if item.status in _SAID})
        result = Result(EXIT_DONE, plan)
        ours = plan.ours
        for order in plan.orders:
            view = observation.nodes[order.node]
            if not lead.leader:
                if order.operation != FORGET:
                    self.backend.would(view, order, now)
                    result.would.append(order)
                    log.info("would %s %s: %s (%s)", order.operation, order.node, order.reason, order.why)
                continue
            try:
                if order.operation == FORGET:
                    assert view.orphan is not None
                    self.backend.forget(view.orphan, TAKEN_OVER, now)
                    log.info("%s is no longer ours (%s): forgotten", order.node, order.why)
                    continue
                if order.operation == RELEASE:
                    assert view.ours is not None
                    if not self.backend.release(view, view.ours, now):
                        self._count(order, SKIPPED)
                        log.info("did not resume %s: its mark changed since it was read", order.node)
                        continue
                    ours -= 1
                elif order.operation in (QUARANTINE, REBOOT):
                    apply = self.backend.reboot if order.operation == REBOOT else self.backend.quarantine
                    apply(view, order, now)
                    ours += 0 if view.ours is not None else 1
            except BackendError as err:
                self._count(order, FAILED)
                self._finish(result, plan, ours, lead, began, ok=False)
                result.code, result.problem = EXIT_UNTRUSTED, f"{order.operation} {order.node} failed: {err}"
                self._trust.now({result.problem}, logging.ERROR)
                return result
            self._count(order, OK)
            result.done.append(order)
            log.warning("%s %s: %s (%s)", _past(order.operation), order.node, order.reason, order.why)
        if lead.leader and isinstance(self.backend, Tending):
            try:
                self.backend.tend(plan, now)
            except BackendError as err:
                self._finish(result, plan, ours, lead, began, ok=False)
                result.code, result.problem = EXIT_UNTRUSTED, f"keeping our acts up failed: {err}"
                self._trust.now({result.problem}, logging.ERROR)
                return result
        self._trust.now(set())
        self._finish(result, plan, ours, lead, began, ok=True)
        acted = [o for o in result.done + result.would if o.operation != FORGET]
        result.code = EXIT_ACTED if acted else EXIT_DONE
        return result

    def _read(self, now: float) -> dict[str, Seen]:
        windows = (self.config.hold_seconds, self.config.settle_seconds)
        reading = verdicts.read(
            self.prometheus, now, stale_seconds=self.config.stale_seconds, windows=windows
        )
        problems = set(reading.problems)
        seen = dict(reading.seen)
        if self.fabric is not None:
            suspects, problem = fabric_suspects(self.prometheus, self.fabric, now, self.config)
            seen = verdicts.with_suspects(seen, suspects)
            if problem:
                problems.add(problem)
        self._node_problems = problems
        return seen

    def _untrusted(self, problem: str) -> Result:
        self._trust.now({problem}, logging.ERROR)
        with self.tally.lock:
            # What was known before is not known now: the budget and the nodes are not exported.
            self.tally.plan, self.tally.quarantined = None, None
            self.tally.reconciles["untrusted"] += 1
        return Result(EXIT_UNTRUSTED, problem=problem)

    def _count(self, order: Order, result: str) -> None:
        with self.tally.lock:
            self.tally.actions[(order.operation, result)] += 1

    def _finish(self, result: Result, plan: Plan, ours: int, lead: Lead, began: float, ok: bool) -> None:
        with self.tally.lock:
            t = self.tally
            t.plan, t.quarantined, t.leader = plan, ours, lead.leader
            t.would.clear()
            for order in result.would:
                t.would[order.operation] += 1
                t.actions[(order.operation, DRY_RUN)] += 1
            t.reconciles["ok" if ok else "failed"] += 1
            if ok:
                t.last_success = self.clock()
                t.last_success_duration = time.monotonic() - began

    def _say_lead(self, lead: Lead) -> None:
        if not self.act or lead.leader == self._leading:
            return
        if lead.leader:
            log.info("this remediator acts now (it holds the lock)")
        else:
            log.warning("another remediator acts (%s): this one only says what it would do", lead.holder)
        self._leading = lead.leader

    # --- the loop -------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Reconcile every ``interval_seconds`` until ``stop`` is set."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.reconcile()
            except Exception:  # a defect must not end the loop: the next reconcile starts afresh
                log.exception("the reconcile failed")
            stop.wait(max(0.0, self.config.interval_seconds - (time.monotonic() - began)))


# What the log says once per node (the rest is in the metrics' statuses).
_SAID = (engine.UNKNOWN_NODE, engine.UNTRUSTED)


def _said(item: engine.Left) -> str:
    if item.status == engine.UNKNOWN_NODE:
        return f"{item.node}: {item.detail}: left alone"
    return f"{item.node}: no verdict to trust: {item.detail}"


def _past(operation: str) -> str:
    return {QUARANTINE: "drained", REBOOT: "reboot asked for", RELEASE: "resumed"}.get(operation, operation)


def fabric_suspects(
    prometheus: Prometheus, probe: str, now: float, config: RemediateConfig
) -> tuple[dict[str, Seen], str | None]:
    """`analyze`'s host suspects in the pairwise group ``probe`` as verdicts of their hosts:
    unhealthy, with ``fabric.action`` (a path or a switch is not one host's fault: reported by
    `analyze`, not acted on). NoVerdict as analyze's: Prometheus unreachable or partial."""
    from clusterhealth.fleet import analyze

    result = analyze.run(
        prometheus.url,
        probe,
        config.fabric.window_seconds,
        step=config.fabric.step_seconds,
        now=now,
        prometheus=prometheus,
    )
    if result.not_enough_evidence:
        return {}, f"--fabric {probe}: no verdict from the pairwise results: {result.not_enough_evidence}"
    found = {}
    for suspect in result.suspects:
        if suspect.kind != "host":
            continue
        (host,) = suspect.hosts
        evidence = f"fabric {result.probe}: {host} at {suspect.ratio:.0%} of the group's bandwidth"
        impact = suspect.impact.to_dict() if suspect.impact is not None else None
        # analyze judged it over rounds in its window: it has held as long as it can be known to.
        found[host] = Seen(
            host, "unhealthy", config.fabric.action, math.inf, evidence, source="fabric", impact=impact
        )
    return found, None
