# ruff: noqa: E501  (the table of mutants reads best one mutant a row)
"""A mutation audit: one-line changes to the code, and which test notices each (issue 27 §4).

Not part of `make test`: run by hand when the code it names changes, to see whether the tests
still decide what it does.

    .venv/bin/python -m tests.mutation_audit --check          # every mutation still applies
    .venv/bin/python -m tests.mutation_audit [--only ID ...] [--module engine] [--out FILE]

Each mutant replaces one exact text (found exactly once in its file) by another, runs the tests of
its first tier (``pytest -x``), and, if none fails, those of its second (the real Slurm, the real
Kubernetes API, the agents: slower); then puts the file back, whatever happened. A mutant is
*caught* when a test fails, *survived* when all pass. A line per mutant goes to ``--out`` (JSON)
and a table to stdout.

The mutants are chosen, not generated: comparisons flipped at the boundary a fixture can reach,
``and``/``or`` swapped, a clause of a condition dropped, a guard removed, a state left out of a
set, a default turned around; each in code whose behaviour a test should decide.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The tests of each part, pure first.
ENGINE = (
    "tests/test_remediate_engine.py",
    "tests/test_remediate_ownership.py::test_ownership_on_a_model_of_slurm",
)
RECONCILE = (
    "tests/test_remediate_reconcile.py",
    "tests/test_remediate_ownership.py::test_ownership_on_a_model_of_slurm",
    "tests/test_remediate_config.py",
)
SLURM_MODEL = (
    "tests/test_remediate_ownership.py::test_ownership_on_a_model_of_slurm",
    "tests/test_remediate_slurm.py::test_parse_nodes_reads_states_reasons_and_features",
    "tests/test_remediate_reconcile.py",
)
SLURM_REAL = ("tests/test_remediate_slurm.py", "tests/test_remediate_ownership.py")
VERDICTS = ("tests/test_remediate_verdicts.py",)
KUBE = ("tests/test_remediate_kubernetes.py",)
KUBE_MORE = (
    "tests/test_remediate_kubernetes_ownership.py",
    "tests/test_remediate_kubernetes_end_to_end.py",
    "tests/test_remediate_kubernetes_rbac.py",
)
COMMAND = ("tests/test_remediate_config.py",)
FLEET = ("tests/test_remediate_fleet.py",)
VERDICT = ("tests/test_verdict.py",)
REPORT = ("tests/test_report.py",)
PROMETHEUS = (
    "tests/test_fleet_prometheus.py",
    "tests/test_remediate_verdicts.py::test_a_partial_answer_is_no_verdict_at_all",
)
PROMETHEUS_MORE = ("tests/test_fabric_analyze_prometheus.py",)


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str
    old: str
    new: str
    first: tuple[str, ...]
    then: tuple[str, ...] = ()
    what: str = ""


E, R, V, S, L, K, M, C = (
    "fleet/remediate/engine.py",
    "fleet/remediate/reconcile.py",
    "fleet/remediate/verdicts.py",
    "fleet/remediate/slurm.py",
    "fleet/remediate/ledger.py",
    "fleet/remediate/kubernetes.py",
    "fleet/remediate/metrics.py",
    "fleet/remediate/command.py",
)
VD, PW, RV, PR = "checks/verdict.py", "fleet/pairwise.py", "fleet/report/view.py", "fleet/prometheus.py"

# fmt: off
MUTANTS: tuple[Mutant, ...] = (
    # --- engine.py: the decisions ---------------------------------------------------------------
    Mutant("E01", E, "return line if len(line) <= MAX_REASON else", "return line if len(line) < MAX_REASON else",
           ENGINE, SLURM_REAL, "a mark of exactly MAX_REASON characters cut"),
    Mutant("E02", E, "        elif now - act.at >= deadline:", "        elif now - act.at > deadline:",
           ENGINE, (), "an act exactly at the slow start's deadline still in flight"),
    Mutant("E03", E, "width = min(width * 2, max(cap, 1)) if success else 1", "width = min(width * 2, max(cap, 1)) if success else width",
           ENGINE, (), "a failure does not set the width back to one"),
    Mutant("E04", E, "    for _, success in sorted(judged):", "    for _, success in judged:",
           ENGINE, SLURM_REAL, "acts taken in the ledger's order, not the order they were judged"),
    Mutant("E05", E, "        width = min(width * 2 ** len(released), max(cap, 1)) if released else width", "        width = width",
           ENGINE, (), "a release in this plan does not widen the slow start"),
    Mutant("E06", E, "        in_flight -= sum(1 for n in released if _in_flight(nodes[n].ours, now, config))", "        pass",
           ENGINE, (), "a release in this plan still counted in flight"),
    Mutant("E07", E, "        if forgets:\n            width = 1", "        if False:\n            width = 1",
           ENGINE, SLURM_REAL, "a take-over in this plan does not set the width back to one"),
    Mutant("E08", E, "            in_flight -= sum(1 for n in forgets if _in_flight(nodes[n.node].orphan, now, config))", "            pass",
           ENGINE, SLURM_REAL, "a taken-over act still counted in flight"),
    Mutant("E09", E, "    return act is not None and now - act.at < config.budget.slow_start_deadline_seconds", "    return act is not None and now - act.at <= config.budget.slow_start_deadline_seconds",
           ENGINE, (), "_in_flight at the deadline"),
    Mutant("E10", E, "    remaining = max(0, cap - used)", "    remaining = cap - used",
           ENGINE, SLURM_REAL, "remaining below zero when the budget was lowered under the nodes already ours"),
    Mutant("E11", E, "        if remaining <= 0 and not counted:", "        if remaining < 0 and not counted:",
           ENGINE, (), "one past the budget"),
    Mutant("E12", E, "        if remaining <= 0 and not counted:", "        if remaining <= 0:",
           ENGINE, SLURM_REAL, "a node of ours acted on again deferred by a spent budget"),
    Mutant("E13", E, "        elif domain is not None and not counted:", "        elif domain is not None:",
           ENGINE, SLURM_REAL, "a node of ours acted on again deferred by its spent domain"),
    Mutant("E14", E, "if per_domain[(k, v)] >= per_domain_cap),", "if per_domain[(k, v)] > per_domain_cap),",
           ENGINE, (), "one past the domain's budget"),
    Mutant("E15", E, "        elif in_flight >= width:", "        elif in_flight > width:",
           ENGINE, (), "one past the slow start's width"),
    Mutant("E16", E, "        hold = len(recent) + 1 >= config.repeat_limit", "        hold = len(recent) + 1 > config.repeat_limit",
           ENGINE, (), "the K-th act not held"),
    Mutant("E17", E, "a.at > now - config.repeat_window_seconds]", "a.at >= now - config.repeat_window_seconds]",
           ENGINE, (), "an act exactly a window ago counted"),
    Mutant("E18", E, "        hold = len(recent) + 1 >= config.repeat_limit", "        hold = len(recent) >= config.repeat_limit",
           ENGINE, (), "off by one in the K rule"),
    Mutant("E19", E, "            remaining -= 1\n", "            pass\n",
           ENGINE, (), "an act does not spend the budget"),
    Mutant("E20", E, "            for item in view.domains.items():\n                per_domain[item] += 1", "            for item in view.domains.items():\n                pass",
           ENGINE, (), "an act does not spend its domain's budget"),
    Mutant("E21", E, "        in_flight += 1\n    budget = Budget(", "        pass\n    budget = Budget(",
           ENGINE, (), "an act not counted in flight"),
    Mutant("E22", E, "key=lambda c: (-weight(c[1].action), -c[1].held_seconds, c[0].name)", "key=lambda c: (weight(c[1].action), -c[1].held_seconds, c[0].name)",
           ENGINE, (), "the lightest action first"),
    Mutant("E23", E, "key=lambda c: (-weight(c[1].action), -c[1].held_seconds, c[0].name)", "key=lambda c: (-weight(c[1].action), c[1].held_seconds, c[0].name)",
           ENGINE, (), "the shortest held first"),
    Mutant("E24", E, "        if view.ours is not None and view.name not in released", "        if view.ours is not None",
           ENGINE, SLURM_REAL, "a node released in this plan still spends its domain"),
    Mutant("E25", E, "    used = ours - len(released)", "    used = ours",
           ENGINE, (), "a release in this plan does not free its place"),
    Mutant("E26", E, 'if verdict.state == "healthy" and verdict.held_seconds >= config.settle_seconds:', 'if verdict.state == "healthy" and verdict.held_seconds > config.settle_seconds:',
           ENGINE, SLURM_REAL, "released one moment late"),
    Mutant("E27", E, 'if verdict.state == "healthy" and verdict.held_seconds >= config.settle_seconds:', "if verdict.held_seconds >= config.settle_seconds:",
           ENGINE, SLURM_REAL, "a node of ours released on any verdict that held"),
    Mutant("E28", E, "            if act.hold:\n", "            if False:\n",
           ENGINE, (), "a node held for a person released"),
    Mutant("E29", E, "            again = (\n                view.in_service\n                and verdict is not None", "            again = (\n                verdict is not None",
           ENGINE, SLURM_REAL, "a node of ours still out of service acted on again"),
    Mutant("E30", E, "                and verdict.action in config.act_on_actions\n            )", "            )",
           ENGINE, SLURM_REAL, "a rebooted node acted on again for an action not acted on"),
    Mutant("E31", E, "        elif not view.in_service or view.other is not None:", "        elif not view.in_service:",
           ENGINE, SLURM_REAL, "a node someone took back into service acted on in the plan that forgets our act"),
    Mutant("E32", E, '            left.append(Left(name, VETO, "do-not-act", _asked(verdict)))\n            continue', '            left.append(Left(name, VETO, "do-not-act", _asked(verdict)))',
           ENGINE, (), "a vetoed node decided on"),
    Mutant("E33", E, "        if verdict.held_seconds < config.hold_seconds:", "        if verdict.held_seconds <= config.hold_seconds:",
           ENGINE, SLURM_REAL, "a verdict that held exactly hold_seconds waits"),
    Mutant("E34", E, "        if verdict.state not in config.act_on_states or verdict.action not in config.act_on_actions:", "        if verdict.state not in config.act_on_states and verdict.action not in config.act_on_actions:",
           ENGINE, (), "and for or in what is acted on"),
    Mutant("E35", E, '            status = HEALTHY if verdict.state == "healthy" else NOT_ACTED_ON', "            status = NOT_ACTED_ON",
           ENGINE, SLURM_REAL, "a healthy node counted as not acted on"),
    Mutant("E36", E, "    for name in sorted(set(seen) - set(nodes)):", "    for name in sorted(set()):",
           ENGINE, (), "a node the scheduler does not know not reported"),
    Mutant("E37", E, "        counted = view.ours is not None", "        counted = False",
           ENGINE, SLURM_REAL, "a node of ours acted on again spends a second place"),
    Mutant("E38", E, 'operation = REBOOT if (action == "reboot" and can_reboot) else QUARANTINE', 'operation = REBOOT if action == "reboot" else QUARANTINE',
           ENGINE, (), "a reboot asked of a backend that cannot"),
    Mutant("E39", E, '        if hold:\n            action = "inspect"', '        if hold:\n            pass',
           ENGINE, (), "the K-th act keeps its action"),
    Mutant("E40", E, "        if view.orphan is not None:\n            forgets.append(", "        if False:\n            forgets.append(",
           ENGINE, SLURM_REAL, "an orphan never forgotten"),
    Mutant("E41", E, "            if verdict is None or verdict.state is None:\n                left.append(Left(name, QUARANTINED", "            if verdict is None:\n                left.append(Left(name, QUARANTINED",
           ENGINE, (), "an untrusted verdict of a node of ours read as a verdict"),
    # --- reconcile.py: the loop -----------------------------------------------------------------
    Mutant("R01", R, 'lead = self.backend.lead() if self.act else Lead(False, "dry-run")', 'lead = self.backend.lead() if self.act else Lead(True, "dry-run")',
           RECONCILE, SLURM_REAL, "dry-run acts"),
    Mutant("R02", R, "                if order.operation != FORGET:\n                    self.backend.would", "                if True:\n                    self.backend.would",
           RECONCILE, SLURM_REAL + KUBE, "dry-run says it would forget"),
    Mutant("R03", R, "                    if not self.backend.release(view, view.ours, now):", "                    if not self.backend.release(view, view.ours, now) and False:",
           RECONCILE, SLURM_REAL, "a release the backend refused counted as done"),
    Mutant("R04", R, "                    ours += 0 if view.ours is not None else 1", "                    ours += 1",
           RECONCILE, SLURM_REAL, "a node of ours acted on again counted twice"),
    Mutant("R05", R, "        result.code = EXIT_ACTED if acted else EXIT_DONE", "        result.code = EXIT_DONE",
           RECONCILE, SLURM_REAL, "exit 0 after acting"),
    Mutant("R06", R, "        acted = [o for o in result.done + result.would if o.operation != FORGET]", "        acted = list(result.done + result.would)",
           RECONCILE, SLURM_REAL, "a forget alone is exit 1"),
    Mutant("R07", R, "        if lead.leader and isinstance(self.backend, Tending):", "        if isinstance(self.backend, Tending):",
           RECONCILE, SLURM_REAL + KUBE, "a follower tends"),
    Mutant("R08", R, "        for problem in sorted(problems - self._current):", "        for problem in sorted(problems):",
           RECONCILE, SLURM_REAL, "a problem said at every reconcile"),
    Mutant("R09", R, "        self._current = set(problems)", "        pass",
           RECONCILE, SLURM_REAL, "problems never remembered"),
    Mutant("R10", R, "        if not self.act or lead.leader == self._leading:", "        if not self.act:",
           RECONCILE, SLURM_REAL, "the lead said at every reconcile"),
    Mutant("R11", R, "            self.tally.plan, self.tally.quarantined = None, None", "            pass",
           RECONCILE, SLURM_REAL, "the gauges of a past reconcile kept when the data cannot be trusted"),
    Mutant("R12", R, "            t.would.clear()", "            pass",
           RECONCILE, SLURM_REAL, "would-act counts of past reconciles kept"),
    Mutant("R13", R, "            if ok:\n                t.last_success = self.clock()", "            if True:\n                t.last_success = self.clock()",
           RECONCILE, SLURM_REAL, "a failed reconcile counted a success"),
    Mutant("R14", R, "        windows = (self.config.hold_seconds, self.config.settle_seconds)", "        windows = (self.config.hold_seconds,)",
           RECONCILE, SLURM_REAL, "the settle window never read"),
    Mutant("R15", R, "_SAID = (engine.UNKNOWN_NODE, engine.UNTRUSTED)", "_SAID = (engine.UNKNOWN_NODE,)",
           RECONCILE, SLURM_REAL, "an untrusted verdict not logged"),
    Mutant("R16", R, "        self._nodes.now(self._node_problems | {", "        self._nodes.now(set() | {",
           RECONCILE, SLURM_REAL, "a target without a node name not logged"),
    Mutant("R17", R, "        self._trust.now(set())\n", "        pass\n",
           RECONCILE, SLURM_REAL, "a problem gone never said gone (and never said again)"),
    Mutant("R18", R, "                self._finish(result, plan, ours, lead, began, ok=False)\n                result.code, result.problem = EXIT_UNTRUSTED, f\"{order.operation}", "                self._finish(result, plan, ours, lead, began, ok=True)\n                result.code, result.problem = EXIT_UNTRUSTED, f\"{order.operation}",
           RECONCILE, SLURM_REAL, "a failed command counted a good reconcile"),
    Mutant("R19", R, "                result.code, result.problem = EXIT_UNTRUSTED, f\"{order.operation}", "                result.code, result.problem = EXIT_DONE, f\"{order.operation}",
           RECONCILE, SLURM_REAL, "a failed command exits 0"),
    Mutant("C01", C, "        backend = open_backend(args.backend, config, dry_run=not args.act)", "        backend = open_backend(args.backend, config, dry_run=args.act)",
           COMMAND, KUBE_MORE, "the backend told dry-run the wrong way round"),
    Mutant("C02", C, "    remediator = Remediator(config, backend, prometheus, act=args.act, fabric=args.fabric)", "    remediator = Remediator(config, backend, prometheus, act=True, fabric=args.fabric)",
           COMMAND, FLEET + KUBE_MORE, "the command acts without --act"),
    Mutant("C03", "fleet/cli.py", '        "--act", action="store_true"', '        "--act", action="store_false"',
           COMMAND, FLEET + KUBE_MORE, "dry-run's default flipped"),
    # --- verdicts.py: reading Prometheus --------------------------------------------------------
    Mutant("V01", V, "        if age > stale_seconds:", "        if age >= stale_seconds:",
           VERDICTS, (), "a verdict exactly stale_seconds old is stale"),
    Mutant("V02", V, "        if state not in STATES or action not in ACTIONS or stamp is None:", "        if state not in STATES or stamp is None:",
           VERDICTS, (), "a verdict with an action no agent writes trusted"),
    Mutant("V03", V, "        if len(found) == 1:", "        if len(found) >= 1:",
           VERDICTS, (), "a target naming two nodes taken as the first"),
    Mutant("V04", V, "        if entry.odd:\n", "        if entry.odd and not entry.series:\n",
           VERDICTS, (), "a target with one odd series beside a good one trusted"),
    Mutant("V05", V, "            if within.get(target) == {(state, action)} and (state, action) in at_start.get(target, set()):", "            if within.get(target) == {(state, action)}:",
           VERDICTS, (), "held over a window without a verdict at its start"),
    Mutant("V06", V, "            if within.get(target) == {(state, action)} and (state, action) in at_start.get(target, set()):", "            if (state, action) in at_start.get(target, set()):",
           VERDICTS, (), "held over a window with another verdict in it"),
    Mutant("V07", V, "            else:\n                break", "            else:\n                continue",
           VERDICTS, (), "a longer window proven after a shorter one failed"),
    Mutant("V08", V, 'prometheus.query(f"last_over_time({VERDICT}{_selector(stale_seconds)})", now - width)', 'prometheus.query(f"last_over_time({VERDICT}{_selector(stale_seconds)})", now)',
           VERDICTS, (), "the window's start read now"),
    Mutant("V09", V, "    partial = prometheus.partial_since(mark)", "    partial = prometheus.partial_since(0)",
           VERDICTS, SLURM_REAL, "a partial answer of an earlier reconcile fails every later one"),
    Mutant("V10", V, '    if partial:\n        raise Partial("; ".join(partial))', "    if False:\n        raise Partial(\"; \".join(partial))",
           VERDICTS, (), "a partial answer trusted"),
    Mutant("V11", V, "_STATUS_ORDER = {2: 0, 3: 1, 1: 2}", "_STATUS_ORDER = {2: 0, 3: 2, 1: 1}",
           VERDICTS, (), "a WARNING before an UNKNOWN in the evidence"),
    Mutant("V12", V, 'if own is not None and own.state == "unhealthy" and weight(own.action) > weight(suspect.action):', 'if own is not None and own.state == "unhealthy" and weight(own.action) >= weight(suspect.action):',
           VERDICTS, (), "a fabric suspect of the same weight loses to the node's own verdict"),
    Mutant("V13", V, 'if own is not None and own.state == "unhealthy" and weight(own.action) > weight(suspect.action):', "if own is not None and weight(own.action) > weight(suspect.action):",
           VERDICTS, (), "a degraded node's heavier action hides the fabric suspect"),
    Mutant("V14", V, "    if not current:\n        raise NoVerdict", "    if False:\n        raise NoVerdict",
           VERDICTS, (), "a Prometheus without verdicts read as a fleet without any"),
    Mutant("V15", V, '        if value is None or int(value) not in _STATUS_ORDER:', '        if value is None:',
           VERDICTS, (), "a check status no agent writes in the evidence"),
    Mutant("V16", V, "        (state, action), stamp = max(entry.series.items(), key=lambda item: item[1])", "        (state, action), stamp = min(entry.series.items(), key=lambda item: item[1])",
           VERDICTS, (), "the older of two verdict series taken"),
    # --- slurm.py: ownership --------------------------------------------------------------------
    Mutant("S01", S, "                if not node.in_service and _reason_is(node.reason, open_act):", "                if _reason_is(node.reason, open_act):",
           SLURM_MODEL, SLURM_REAL, "in service with our reason is ours"),
    Mutant("S02", S, "                if not node.in_service and _reason_is(node.reason, open_act):", "                if not node.in_service and (node.reason or '').startswith(open_act.reason):",
           SLURM_MODEL, SLURM_REAL, "a reason that begins with ours is ours"),
    Mutant("S03", S, "                elif open_act.rebooted and node.in_service and node.reason is None:", "                elif node.in_service and node.reason is None:",
           SLURM_MODEL, SLURM_REAL, "a drain someone resumed still ours"),
    Mutant("S04", S, "            if ours is None and (not node.in_service or orphan is not None):", "            if ours is None and not node.in_service:",
           SLURM_MODEL, SLURM_REAL, "a node someone resumed not said to be someone else's"),
    Mutant("S05", S, "        if current.in_service and act.rebooted and current.reason is None:", "        if current.in_service and current.reason is None:",
           SLURM_MODEL, SLURM_REAL, "a drain someone resumed just before the release closed as recovered"),
    Mutant("S06", S, "        if current.in_service or not _reason_is(current.reason, act):", "        if current.in_service:",
           SLURM_MODEL, SLURM_REAL, "a reason edited just before the release resumed"),
    Mutant("S16", S, "    return act.rebooted and reason == act.reason + REBOOT_ISSUED_SUFFIX", "    return act.rebooted and (reason or '').startswith(act.reason)",
           SLURM_MODEL, SLURM_REAL, "a rebooted node's reason with any suffix is ours"),
    Mutant("S17", S, "    return act.rebooted and reason == act.reason + REBOOT_ISSUED_SUFFIX", "    return False",
           SLURM_MODEL, SLURM_REAL, "Slurm's ' : reboot issued' taken for a take-over"),
    Mutant("S07", S, '            if "did not answer" not in str(err):', "            if True:",
           SLURM_MODEL, SLURM_REAL, "a drain that hung (and may have happened) forgotten"),
    Mutant("S08", S, "                self.ledger.remove(act)", "                pass",
           SLURM_MODEL, SLURM_REAL, "a refused drain kept in the ledger"),
    Mutant("S09", S, 'OUT_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})', 'OUT_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED"})',
           SLURM_MODEL, SLURM_REAL, "a node in maintenance in service"),
    Mutant("S10", S, 'OUT_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})', 'OUT_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINT", "REBOOT_ISSUED"})',
           SLURM_MODEL, SLURM_REAL, "a node waiting for a reboot in service"),
    Mutant("S11", S, 'OUT_STATES = frozenset({"DOWN", "FUTURE", "UNKNOWN"})', 'OUT_STATES = frozenset({"FUTURE", "UNKNOWN"})',
           SLURM_MODEL, SLURM_REAL, "a DOWN node in service"),
    Mutant("S12", S, "veto=any(fnmatch.fnmatchcase(name, pattern) for pattern in self.config.veto),", "veto=any(name.startswith(pattern) for pattern in self.config.veto),",
           SLURM_MODEL, SLURM_REAL, "a veto of n1 vetoes n10"),
    Mutant("S13", S, "                match = pattern.fullmatch(feature)", "                match = pattern.match(feature)",
           SLURM_MODEL, SLURM_REAL, "a feature that begins like a domain's is one"),
    Mutant("S14", S, "            if state.endswith(\"*\"):\n                flagset.add(\"NOT_RESPONDING\")", "            if False:\n                flagset.add(\"NOT_RESPONDING\")",
           SLURM_MODEL, SLURM_REAL, "a node not responding (State=IDLE*) not said so"),
    Mutant("S15", S, '            open_act = next((a for a in reversed(mine) if a.open), None)', '            open_act = next((a for a in mine if a.open), None)',
           SLURM_MODEL, SLURM_REAL, "the oldest open act taken"),
    Mutant("L01", L, "            replace(a, ended=now, outcome=FAILED) if a.open and a.node == act.node else a for a in self.load()", "            replace(a, ended=now, outcome=FAILED) if a.open else a for a in self.load()",
           SLURM_MODEL, SLURM_REAL, "recording an act closes every node's"),
    Mutant("L02", L, "        self.save([a for a in acts if a.open or (a.ended or 0) > now - keep_seconds] + [act])", "        self.save([a for a in acts if a.open or (a.ended or 0) < now - keep_seconds] + [act])",
           SLURM_MODEL, SLURM_REAL, "the recent ended acts dropped, the old ones kept"),
    Mutant("L03", L, "        self.save([a for a in acts if a.open or (a.ended or 0) > now - keep_seconds] + [act])", "        self.save([a for a in acts if (a.ended or 0) > now - keep_seconds] + [act])",
           SLURM_MODEL, SLURM_REAL, "an open act of another node dropped when it is old"),
    Mutant("L04", L, "        or (act.outcome is not None and act.outcome not in OUTCOMES)\n", "",
           SLURM_MODEL, SLURM_REAL, "an outcome no remediator writes read"),
    Mutant("L05", L, "        or (act.ended is None) != (act.outcome is None)\n", "",
           SLURM_MODEL, SLURM_REAL, "an ended act without an outcome read"),
    Mutant("L06", L, "            replace(a, ended=now, outcome=outcome) if _same(a, act) and a.open else a for a in self.load()", "            replace(a, ended=now, outcome=outcome) if a.node == act.node and a.open else a for a in self.load()",
           SLURM_MODEL, SLURM_REAL, "closing an act matched by node alone"),
    # --- kubernetes.py: ownership by annotation, guards, conditions, Lease ----------------------
    Mutant("K01", K, "                if cordoned:\n                    ours = act\n                else:\n                    orphan = act", "                ours = act",
           KUBE, KUBE_MORE, "an uncordoned node with our annotation still ours"),
    Mutant("K02", K, '    return DO_NOT_ACT in annotations and annotations[DO_NOT_ACT].strip().lower() != "false"', '    return DO_NOT_ACT in annotations and annotations[DO_NOT_ACT].strip().lower() == "true"',
           KUBE, KUBE_MORE, "do-not-act only when \"true\""),
    Mutant("K03", K, '    return reason in QUARANTINE_ACTIONS and isinstance(message, str) and message.startswith("clusterhealth:")', '    return isinstance(message, str) and message.startswith("clusterhealth:")',
           KUBE, KUBE_MORE, "a condition whose message looks like ours is ours, whatever its reason"),
    Mutant("K04", K, '    return reason in QUARANTINE_ACTIONS and isinstance(message, str) and message.startswith("clusterhealth:")', "    return reason in QUARANTINE_ACTIONS",
           KUBE, KUBE_MORE, "a condition whose reason is an action is ours, whatever its message"),
    Mutant("K05", K, "        return reason == act.action and message == act.reason", "        return reason == act.action",
           KUBE, KUBE_MORE, "a condition of another act of ours taken for this one's"),
    Mutant("K06", K, "            if _unschedulable(current) or ACT in annotations or vetoed(annotations):", "            if _unschedulable(current) or ACT in annotations:",
           KUBE, KUBE_MORE, "a veto set between the read and the write ignored"),
    Mutant("K07", K, "            if _unschedulable(current) or ACT in annotations or vetoed(annotations):", "            if _unschedulable(current) or vetoed(annotations):",
           KUBE, KUBE_MORE, "an annotation of ours written between the read and the write overwritten"),
    Mutant("K08", K, "            kinds = [k for k in kinds if k not in existing or _ours(existing[k])]", "            kinds = list(kinds)",
           KUBE, KUBE_MORE, "NPD's condition written since the cordon overwritten"),
    Mutant("K09", K, "                what, method, name, body, _content_type=STRATEGIC, field_manager=COMPONENT", "                what, method, name, body, _content_type=\"application/merge-patch+json\", field_manager=COMPONENT",
           KUBE, KUBE_MORE, "a JSON merge patch (the conditions list replaced)"),
    Mutant("K10", K, "        if text is None or not _unschedulable(node):\n            return False", "        if text is None:\n            return False",
           KUBE, KUBE_MORE, "an uncordoned node still ours at the release"),
    Mutant("K11", K, "        return (record.at, record.reason, record.action) == (act.at, act.reason, act.action)", "        return record.at == act.at",
           KUBE, KUBE_MORE, "an annotation someone edited (same time) still ours"),
    Mutant("K12", K, "                if any(t.get(\"key\") == TAINT for t in _taints(current)):\n                    body[\"spec\"][\"taints\"]", "                if False:\n                    body[\"spec\"][\"taints\"]",
           KUBE, KUBE_MORE, "our taint left at the release"),
    Mutant("K13", K, '                    body["spec"] = {"taints": [t for t in _taints(current) if t.get("key") != TAINT]}', '                    body["spec"] = {"taints": [t for t in _taints(current) if t.get("key") != TAINT], "unschedulable": False}',
           KUBE, KUBE_MORE, "forgetting an act uncordons someone's cordon"),
    Mutant("K14", K, "            if holder and holder != self.identity and moment - self._seen_at < duration:", "            if holder != self.identity and moment - self._seen_at < duration:",
           KUBE, KUBE_MORE, "a Lease given up (no holder) waited out"),
    Mutant("K15", K, "            if holder and holder != self.identity and moment - self._seen_at < duration:", "            if holder and holder != self.identity and moment - self._seen_at < 0:",
           KUBE, KUBE_MORE, "a held Lease taken at once"),
    Mutant("K16", K, "        if age > self.lease_seconds * 2 / 3:", "        if age > self.lease_seconds * 2:",
           KUBE, KUBE_MORE, "a leader writes past the renew deadline"),
    Mutant("K17", K, '            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:', "            if lease is None:",
           KUBE, KUBE_MORE, "an ended act written on a Lease someone else holds"),
    Mutant("K18", K, "            keep = [a for a in self._history() if (a.ended or 0) > now - self.config.repeat_window_seconds]", "            keep = self._history()",
           KUBE, KUBE_MORE, "the Lease keeps ended acts past the repeat window"),
    Mutant("K19", K, "        if self.dry_run:\n            # Dry-run takes no Lease; it reads the ledger", "        if False:\n            # Dry-run takes no Lease; it reads the ledger",
           KUBE, KUBE_MORE, "dry-run decides without the ledger of ended acts"),
    Mutant("K20", K, "        if not self.dry_run:\n            return\n        if order.operation == QUARANTINE:", "        if False:\n            return\n        if order.operation == QUARANTINE:",
           KUBE, KUBE_MORE, "a follower of an acting remediator posts what it would do"),
    Mutant("K21", K, "            due = now >= act.at + self.k.evict_after_seconds", "            due = now > act.at + self.k.evict_after_seconds",
           KUBE, KUBE_MORE, "eviction one moment late"),
    Mutant("K22", K, "            if self.k.evict and due and (name in asking or name in self._quarantined):", "            if self.k.evict and due:",
           KUBE, KUBE_MORE, "evictions while the verdict no longer asks for them"),
    Mutant("K23", K, "            if left.status in (QUARANTINED, HELD_FOR_PERSON) and left.action in self.config.act_on_actions", "            if left.status in (QUARANTINED, HELD_FOR_PERSON)",
           KUBE, KUBE_MORE, "evictions on a node whose verdict asks for nothing"),
    Mutant("K24", K, '    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):', '    if (pod.get("status") or {}).get("phase") in ("Succeeded",):',
           KUBE, KUBE_MORE, "a failed pod evicted"),
    Mutant("K25", K, '            if meta.get("deletionTimestamp") or not uses_gpus(pod, self.k.gpu_resources):', "            if not uses_gpus(pod, self.k.gpu_resources):",
           KUBE, KUBE_MORE, "a pod being deleted evicted again"),
    Mutant("K26", K, "                if err.status in (429, 404):", "                if err.status in (404,):",
           KUBE, KUBE_MORE, "a PodDisruptionBudget's 429 fails the reconcile"),
    Mutant("K27", K, '        or not reason.startswith("clusterhealth:")\n', "",
           KUBE, KUBE_MORE, "an annotation whose reason is not our mark read as our act"),
    Mutant("K28", K, "    if k.lease_duration_seconds and k.lease_duration_seconds < 2 * config.interval_seconds:", "    if k.lease_duration_seconds and k.lease_duration_seconds <= 2 * config.interval_seconds:",
           KUBE, KUBE_MORE, "a Lease of exactly twice the interval refused"),
    Mutant("K29", K, "            if node is None or not self._still_ours(node, act):\n                return\n            kinds", "            if node is None:\n                return\n            kinds",
           KUBE, KUBE_MORE, "a heartbeat on a node someone took over"),
    Mutant("K30", K, "        veto = vetoed(annotations) or any(fnmatch.fnmatchcase(name, p) for p in self.config.veto)", "        veto = vetoed(annotations) or any(name.startswith(p) for p in self.config.veto)",
           KUBE, KUBE_MORE, "a veto of gpu-1 vetoes gpu-10"),
    Mutant("K31", K, "                for k, c in existing.items()\n                if k in wanted and not _ours(c)", "                for k, c in existing.items()\n                if k in wanted",
           KUBE, KUBE_MORE, "a stale condition of ours taken for someone else's"),
    Mutant("K32", K, '            transitions += 1 if spec.get("holderIdentity") else 0', "            transitions += 1",
           KUBE, KUBE_MORE, "a Lease taken from nobody counted a transition"),
    # --- metrics.py -----------------------------------------------------------------------------
    Mutant("M01", M, "                max(0, plan.budget.max_unavailable - quarantined),", "                plan.budget.max_unavailable - quarantined,",
           RECONCILE, SLURM_REAL, "a negative budget remaining"),
    Mutant("M02", M, "        mode.add_metric([t.backend], 1 if t.dry_run else 0)", "        mode.add_metric([t.backend], 0 if t.dry_run else 1)",
           RECONCILE, SLURM_REAL + FLEET, "dry_run gauge the wrong way round"),
    Mutant("M03", M, "        for reason in DEFERRED:\n            deferred.add_metric([t.backend, reason], plan.budget.deferred.get(reason, 0))", "        for reason in DEFERRED[:2]:\n            deferred.add_metric([t.backend, reason], plan.budget.deferred.get(reason, 0))",
           RECONCILE, SLURM_REAL, "slow_start left out of the deferred nodes"),
    Mutant("M04", M, "        quarantined = t.quarantined if t.quarantined is not None else plan.ours", "        quarantined = plan.ours",
           RECONCILE, SLURM_REAL, "the quarantined gauge from before the plan was carried out"),
    # --- checks/verdict.py ----------------------------------------------------------------------
    Mutant("D01", VD, "    deciding = [e for e in ranked if e.status == status]", "    deciding = list(ranked)",
           VERDICT, (), "a warning's heavier action over a critical's"),
    Mutant("D02", VD, "    if result.status == Status.UNKNOWN:\n        return base", "    if False:\n        return base",
           VERDICT, (), "an UNKNOWN finding asks for an action"),
    Mutant("D03", VD, "sorted(evidence, key=lambda e: (-e.status.rank, -e.action, SOURCES.index(e.source)))", "sorted(evidence, key=lambda e: (-e.status.rank, e.action, SOURCES.index(e.source)))",
           VERDICT, (), "the lightest action first in the evidence"),
    Mutant("D04", VD, "sorted(evidence, key=lambda e: (-e.status.rank, -e.action, SOURCES.index(e.source)))", "sorted(evidence, key=lambda e: (-e.status.rank, -e.action, -SOURCES.index(e.source)))",
           VERDICT, (), "the sources' precedence reversed"),
    Mutant("D05", VD, "sorted(evidence, key=lambda e: (-e.status.rank, -e.action, SOURCES.index(e.source)))", "sorted(evidence, key=lambda e: (e.status.rank, -e.action, SOURCES.index(e.source)))",
           VERDICT, (), "the mildest status first"),
    Mutant("D06", VD, "    rule = next((r for r in CHECK_RULES if r.check == result.check and r.applies(result, gpu)), None)", "    rule = next((r for r in CHECK_RULES if r.check == result.check), None)",
           VERDICT, (), "a check's first rule whatever applies"),
    Mutant("D07", VD, "    known = [e.since for e in deciding if e.since is not None and e.action == action]", "    known = [e.since for e in deciding if e.since is not None]",
           VERDICT, (), "since from a finding of a lighter action"),
    Mutant("D08", VD, "    return Verdict(STATE_OF[status], action, ranked, checks, min(known) if known else None)", "    return Verdict(STATE_OF[status], action, ranked, checks, max(known) if known else None)",
           VERDICT, (), "since the latest Xid, not the first"),
    Mutant("D09", VD, "            self._since = min(now, verdict.since) if first and verdict.since is not None else now", "            self._since = min(now, verdict.since) if verdict.since is not None else now",
           VERDICT, (), "a later change of verdict dated back to an Xid"),
    Mutant("D10", VD, "            return replace(base, action=UNNAMED_RECOVERY_ACTION)", "            return replace(base, action=Action.NONE)",
           VERDICT, (), "a recovery action finding without a GPU asks for nothing"),
    Mutant("D11", VD, "        events = [e for e in xids.get(result.subject, []) if xid_status(e) == result.status]", "        events = list(xids.get(result.subject, []))",
           VERDICT, (), "a critical Xid finding's action from its warning Xids too"),
    Mutant("D12", VD, "    action = max((e.action for e in deciding), default=Action.NONE)", "    action = deciding[0].action if deciding else Action.NONE",
           VERDICT, (), "the first finding's action, not the heaviest"),
    Mutant("D13", VD, '        return _verdict(_missing(missing) or _missing([Missing("audit", "has not run")]), 0)', "        return _verdict(_missing(missing), 0)",
           VERDICT, (), "no audit run and no collector missing is healthy"),
    Mutant("D14", VD, "        if key != self._current:", "        if key[0] != (self._current or ('',))[0]:",
           VERDICT, (), "the clock follows the state alone"),
    # --- fleet/pairwise.py: pairs() and node_rounds() -------------------------------------------
    Mutant("P01", PW, "            if ratio is not None and (worst is None or ratio < worst):", "            if ratio is not None and (worst is None or ratio > worst):",
           REPORT, (), "a pair's best meeting shown as its worst"),
    Mutant("P02", PW, "            if ratio is not None and (worst is None or ratio < worst):", "            if ratio is not None and ratio < (worst or 0):",
           REPORT, (), "a pair's unknown first meeting stays its worst"),
    Mutant("P03", PW, "            pair.latest = m\n", "            pass\n",
           REPORT, (), "a pair's first meeting shown as its latest"),
    Mutant("P04", PW, "            pair.meetings += 1", "            pass",
           REPORT, (), "a pair's meetings not counted"),
    Mutant("P05", PW, "                rounds[m.round] = min(ratio, rounds.get(m.round, ratio))", "                rounds[m.round] = max(ratio, rounds.get(m.round, ratio))",
           REPORT, (), "a node's best meeting of a round shown"),
    Mutant("P06", PW, "                rounds[m.round] = min(ratio, rounds.get(m.round, ratio))", "                rounds[m.round] = ratio",
           REPORT, (), "a node's last meeting of a round shown"),
    Mutant("P07", PW, "    return 0.0 if m.success is False else None", "    return None",
           REPORT, (), "a failed run shown as unknown"),
    # --- fleet/report/view.py -------------------------------------------------------------------
    Mutant("W01", RV, "    return tuple(int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(name)))", "    return (name,)",
           REPORT, (), "h10 before h2"),
    Mutant("W02", RV, "            return (0, tuple(natural_key(p) for p in place), natural_key(node))\n        return (1, (), natural_key(node))", "            return (1, tuple(natural_key(p) for p in place), natural_key(node))\n        return (0, (), natural_key(node))",
           REPORT, (), "the unplaced nodes before the placed"),
    Mutant("W03", RV, "    size = max(1, math.ceil(len(order) / MAX_GROUPS))", "    size = max(1, len(order) // MAX_GROUPS)",
           REPORT, (), "more than MAX_GROUPS blocks"),
    Mutant("W04", RV, "        if a != b:\n            found.setdefault((b, a), []).append(v)", "        if False:\n            found.setdefault((b, a), []).append(v)",
           REPORT, (), "the view by group one triangle only"),
    Mutant("W05", RV, "            strip[row, c] = ratio if math.isnan(old) else min(old, ratio)", "            strip[row, c] = ratio",
           REPORT, (), "the strip's column shows the last of its rounds, not the worst"),
    Mutant("W06", RV, "        values[a, b] = statistics.median(ratios)", "        values[a, b] = min(ratios)",
           REPORT, (), "the view by group shows the worst pair, not the median"),
    Mutant("W07", RV, "    if newest is not None and history.end - newest > STALE_ROUNDS * history.period:", "    if False:",
           REPORT, (), "a stale history not said"),
    Mutant("W08", RV, "        if gaps:\n", "        if False:\n",
           REPORT, (), "rounds without a meeting not said"),
    Mutant("W09", RV, "    unknown = sum(1 for m in history.meetings if seen_ratio(m) is None)", "    unknown = 0",
           REPORT, (), "meetings without a result not said"),
    Mutant("W10", RV, "            values[p.i, p.j] = values[p.j, p.i] = v", "            values[p.i, p.j] = v",
           REPORT, (), "the matrix one triangle only"),
    # --- fleet/prometheus.py: partial answers ---------------------------------------------------
    Mutant("Q01", PR, '        if document.get("isPartial") is True:\n            self.warnings.append(IS_PARTIAL)', '        if False:\n            self.warnings.append(IS_PARTIAL)',
           PROMETHEUS, PROMETHEUS_MORE, "isPartial ignored"),
    Mutant("Q02", PR, "f\"Prometheus answered with partial data: {text}\" for text in dict.fromkeys(self.warnings[mark:])", "f\"Prometheus answered with partial data: {text}\" for text in dict.fromkeys(self.warnings)",
           PROMETHEUS, PROMETHEUS_MORE, "partial answers before the mark counted"),
    Mutant("Q03", PR, "            self.warnings.extend(str(w) for w in warnings if w)", "            pass",
           PROMETHEUS, PROMETHEUS_MORE, "warnings ignored"),
    Mutant("Q04", PR, 'WHOLE_ANSWER = {"nocache": "1", "deny_partial_response": "1", "partial_response": "false"}', 'WHOLE_ANSWER = {"nocache": "1"}',
           PROMETHEUS, PROMETHEUS_MORE, "a whole answer not asked for"),
)
# fmt: on


def apply(mutant: Mutant) -> str:
    """The file's text, after checking that the mutation applies once; the original is returned."""
    path = ROOT / mutant.path
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise LookupError(f"{mutant.id}: {mutant.path}: the text is there {count} times, expected once")
    return text


def run_tests(tests: tuple[str, ...], timeout: float) -> tuple[bool, str, float]:
    """(a test failed, which, seconds)."""
    began = time.monotonic()
    tests = tuple(t for t in tests if (ROOT / t.partition("::")[0]).exists())  # a tier written later
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rf", *tests]
    process = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return True, f"timed out after {timeout:g} s", time.monotonic() - began
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: nothing of it outlives the audit
        raise
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    if process.returncode == 0:
        return False, "", time.monotonic() - began
    if process.returncode in (1, 2) and failed:
        return True, failed[0], time.monotonic() - began
    tail = " ".join(out.strip().splitlines()[-3:])[:300]
    return True, f"pytest exit {process.returncode}: {tail}", time.monotonic() - began


def _module(path: str) -> str:
    """The module that `path` (under ROOT) is imported as: the repository is the `clusterhealth`
    namespace (pyproject's package-dir)."""
    return "clusterhealth." + path.removesuffix(".py").replace("/", ".")


def imported_from_root(mutants: list[Mutant]) -> list[str]:
    """The mutated files that the tests would not import from ROOT: mutating them proves nothing
    (a copy of the tree run with the venv's editable install imports the original)."""
    modules = sorted({_module(m.path) for m in mutants})
    code = "import importlib, sys\nfor m in sys.argv[1:]: print(importlib.import_module(m).__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code, *modules], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [
        m
        for m, f in zip(modules, out.stdout.split(), strict=True)
        if not Path(f).resolve().is_relative_to(ROOT)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that every mutation applies")
    parser.add_argument("--only", nargs="*", default=(), help="these mutants' ids")
    parser.add_argument("--module", help="the mutants of this file (its path contains it)")
    parser.add_argument("--first-only", action="store_true", help="run the first tier only")
    parser.add_argument("--tests", nargs="*", default=(), help="run these tests in place of the tiers")
    parser.add_argument("--out", default="", help="append a JSON line per mutant here")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    chosen = [
        m
        for m in MUTANTS
        if (not args.only or m.id in args.only) and (not args.module or args.module in m.path)
    ]
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), "duplicate mutant ids"
    bad = 0
    for m in chosen:
        try:
            apply(m)
        except LookupError as err:
            print(err)
            bad += 1
    elsewhere = imported_from_root(chosen)
    for module in elsewhere:
        print(f"{module} is not imported from {ROOT}: set PYTHONPATH to a folder whose clusterhealth is it")
    if args.check or bad or elsewhere:
        print(f"{len(chosen) - bad} of {len(chosen)} mutations apply")
        return 1 if bad or elsewhere else 0
    # A kill must still put the file back: SIGTERM and SIGHUP unwind like Ctrl-C.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    for m in chosen:
        path = ROOT / m.path
        original = apply(m)
        path.write_text(original.replace(m.old, m.new))
        try:
            tiers = [m.first] + ([m.then] if m.then and not args.first_only else [])
            tiers = [tuple(args.tests)] if args.tests else tiers
            caught, by, seconds, tier = False, "", 0.0, 0
            while not caught and tier < len(tiers):
                caught, by, spent = run_tests(tiers[tier], args.timeout)
                seconds, tier = seconds + spent, tier + 1
        finally:
            path.write_text(original)
        verdict = "caught" if caught else "SURVIVED"
        print(f"{m.id} {m.path}: {m.what}: {verdict} {by} (tier {tier}, {seconds:.0f} s)", flush=True)
        if args.out:
            with open(args.out, "a") as out:
                record = {"id": m.id, "path": m.path, "what": m.what, "caught": caught, "by": by,
                          "tier": tier, "seconds": round(seconds, 1)}  # fmt: skip
                out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
