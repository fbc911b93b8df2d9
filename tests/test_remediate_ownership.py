"""Ownership, as a property: whatever a person does to the nodes between its reconciles (drains,
reason edits, resumes), the remediator never undoes what it did not do, and never leaves its marks
behind when it undoes.

A hypothesis state machine interleaves the verdicts turning sick and healthy, time passing, the
remediator's reconciles and a person's scontrol commands, and keeps the truth on the side: who
set each node's drain. Every scontrol command the remediator's Slurm backend issues is checked
against it as it goes: a RESUME only of a drain the remediator set and nobody touched since, a
DRAIN only of a node in service. After each reconcile, its ledger and the nodes agree: an act is
open exactly while its node is drained with its reason.

It runs the real backend (fleet/remediate/slurm.py: parsing, ownership, ledger) and the real
engine and loop (Remediator.step) against two Slurms: an in-memory model of slurmctld's node
states as scontrol shows and changes them (many sequences), and, for fewer sequences, the real
slurmctld of tests/slurm.py, which keeps the model honest.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from clusterhealth.fleet.prometheus import Prometheus
from clusterhealth.fleet.remediate.backend import BackendError
from clusterhealth.fleet.remediate.config import BudgetConfig, RemediateConfig, SlurmConfig
from clusterhealth.fleet.remediate.engine import Seen
from clusterhealth.fleet.remediate.reconcile import Remediator
from clusterhealth.fleet.remediate.slurm import SlurmBackend, parse_nodes

from .slurm import SlurmCluster

NODES = ("n1", "n2", "n3", "n4")
HOLD, SETTLE = 60.0, 120.0
PERSON = ("admin: bad DIMM", "admin: RMA 4711", "clusterhealth: a reason that looks like ours")


class SlurmModel:
    """slurmctld's node states as `scontrol show node -o` shows them and `scontrol update` changes
    them, for the commands the remediator and a person use here (checked against the real one by
    `test_ownership_on_a_real_slurm`): a drain sets the reason (replacing any), a reason alone
    changes a drained node's and is ignored on one in service, a resume clears drain and reason
    and is refused on a node in service."""

    def __init__(self, names: tuple[str, ...]):
        self.drained = dict.fromkeys(names, False)
        self.reason: dict[str, str | None] = dict.fromkeys(names)

    def __call__(self, *args: str) -> str:
        if args[:3] == ("show", "node", "-o"):
            names = args[3:] or tuple(self.drained)
            return "".join(self._line(n) for n in names if n in self.drained)
        if args[0] == "update":
            fields = dict(a.split("=", 1) for a in args[1:])
            node = fields["NodeName"]
            if node not in self.drained:
                raise BackendError("slurm_update error: Invalid node name specified")
            state = fields.get("State")
            if state == "DRAIN":
                self.drained[node], self.reason[node] = True, fields["Reason"]
            elif state == "RESUME":
                if not self.drained[node]:
                    raise BackendError("slurm_update error: Invalid node state specified")
                self.drained[node], self.reason[node] = False, None
            elif "Reason" in fields and self.drained[node]:
                self.reason[node] = fields["Reason"]
            return ""
        raise AssertionError(f"the model does not know scontrol {args}")

    def _line(self, name: str) -> str:
        state = "IDLE+DRAIN" if self.drained[name] else "IDLE"
        line = f"NodeName={name} Arch=x86_64 AvailableFeatures=(null) State={state} Partitions=all"
        if self.reason[name] is not None:
            line += f" Reason={self.reason[name]} [root@2026-01-01T00:00:00]"
        return line + "\n"


class Watched(SlurmBackend):
    """The real backend, its scontrol calls checked against the truth before they run (on the
    model, or through the backend's own runner on the real Slurm)."""

    def __init__(
        self, config: RemediateConfig, truth: dict[str, str | None], model: SlurmModel | None, env: Any
    ):
        super().__init__(config, env=env)
        self.model = model
        self.truth = truth  # node -> who set its drain: "us", "person", None (in service)

    def scontrol(self, *args: str) -> str:
        if args[0] == "update":
            fields = dict(a.split("=", 1) for a in args[1:])
            node, state = fields["NodeName"], fields.get("State")
            if state == "RESUME":
                assert self.truth[node] == "us", f"resumed {node}, drained by {self.truth[node]}"
            elif state == "DRAIN":
                assert self.truth[node] is None, f"drained {node} over {self.truth[node]}'s drain"
            else:
                raise AssertionError(f"the remediator changed only a reason: {args}")
        out = self.model(*args) if self.model is not None else super().scontrol(*args)
        if args[0] == "update":
            self.truth[node] = "us" if state == "DRAIN" else None
        return out


class Ownership(RuleBasedStateMachine):
    slurm: Any = None  # a SlurmCluster, or None for the model
    state_dir: Path

    @initialize()
    def start(self) -> None:
        self.truth: dict[str, str | None] = dict.fromkeys(NODES)
        model = SlurmModel(NODES) if self.slurm is None else None
        if self.slurm is not None:
            self.slurm.reset()
        self.scheduler: Any = model if model is not None else self.slurm.scontrol
        run = len(list(self.state_dir.iterdir())) if self.state_dir.exists() else 0
        config = RemediateConfig(
            hold_seconds=HOLD,
            settle_seconds=SETTLE,
            repeat_limit=1000,
            budget=BudgetConfig(max_unavailable=3, max_unavailable_per_domain=3, slow_start=False),
            slurm=SlurmConfig(state_dir=str(self.state_dir / f"run{run}"), timeout_seconds=20),
        )
        self.backend = Watched(config, self.truth, model, None if self.slurm is None else self.slurm.env)
        self.remediator = Remediator(config, self.backend, Prometheus("http://127.0.0.1:9"), act=True)
        self.sick = dict.fromkeys(NODES, False)
        self.now = 1_800_000_000.0

    def teardown(self) -> None:
        if hasattr(self, "backend"):
            self.backend.close()

    def _nodes(self) -> dict[str, Any]:
        """The nodes of the test (the real cluster has more, which it leaves alone)."""
        return {n: v for n, v in parse_nodes(self.scheduler("show", "node", "-o")).items() if n in NODES}

    # --- the world -------------------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES), sick=st.booleans())
    def verdict(self, node: str, sick: bool) -> None:
        self.sick[node] = sick

    @rule()
    def reconcile(self) -> None:
        # Verdicts that have held past both the hold and the settle time.
        seen = {
            n: Seen(n, "unhealthy", "reset_gpu", math.inf, "gpu_xid 3")
            if sick
            else Seen(n, "healthy", "none", math.inf)
            for n, sick in self.sick.items()
        }
        self.now += SETTLE + 1
        result = self.remediator.step(seen, self.now)
        assert result.problem is None, result.problem
        # Every act it keeps open is one whose mark is on its node: a mark someone changed or
        # removed is forgotten at once.
        nodes = self._nodes()
        for act in self.backend.ledger.load():
            if act.open:
                assert self.truth[act.node] == "us" and nodes[act.node].reason == act.reason

    # --- a person --------------------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES), reason=st.sampled_from(PERSON))
    def person_drains(self, node: str, reason: str) -> None:
        self.scheduler("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
        self.truth[node] = "person"

    @precondition(lambda self: any(v is not None for v in self.truth.values()))
    @rule(data=st.data(), reason=st.sampled_from(PERSON))
    def person_edits_the_reason(self, data: st.DataObject, reason: str) -> None:
        node = data.draw(st.sampled_from(sorted(n for n, who in self.truth.items() if who)))
        self.scheduler("update", f"NodeName={node}", f"Reason={reason}")
        self.truth[node] = "person"

    @precondition(lambda self: any(v is not None for v in self.truth.values()))
    @rule(data=st.data())
    def person_resumes(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(n for n, who in self.truth.items() if who)))
        self.scheduler("update", f"NodeName={node}", "State=RESUME")
        self.truth[node] = None

    # --- what must hold --------------------------------------------------------------------------

    @invariant()
    def ours_carry_our_mark_and_the_rest_none(self) -> None:
        if not hasattr(self, "backend"):
            return
        nodes = self._nodes()
        open_acts = {a.node: a for a in self.backend.ledger.load() if a.open}
        for name, node in nodes.items():
            if self.truth[name] == "us":
                assert "DRAIN" in node.flags and name in open_acts and node.reason == open_acts[name].reason
            elif self.truth[name] is None:
                # Back in service, by us or by the person: no mark of ours left on it.
                assert node.in_service and node.reason is None


def _run(slurm: SlurmCluster | None, state_dir: Path, examples: int, steps: int) -> None:
    Ownership.slurm = slurm
    Ownership.state_dir = state_dir
    run_state_machine_as_test(
        Ownership, settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None)
    )


def test_ownership_on_a_model_of_slurm(tmp_path: Path) -> None:
    _run(None, tmp_path, examples=150, steps=30)


def test_ownership_on_a_real_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    _run(slurm, tmp_path, examples=15, steps=20)


@pytest.mark.parametrize("drained", [False, True])
def test_the_model_answers_as_the_real_slurm_does(slurm: SlurmCluster, drained: bool) -> None:
    """The model's answers to the commands above, beside the real slurmctld's."""
    model = SlurmModel(("n1",))
    for scheduler in (model, slurm.scontrol):
        if drained:
            scheduler("update", "NodeName=n1", "State=DRAIN", "Reason=admin: x")
        scheduler("update", "NodeName=n1", "Reason=admin: y")
    (real,) = [n for name, n in parse_nodes(slurm.scontrol("show", "node", "-o")).items() if name == "n1"]
    mine = parse_nodes(model("show", "node", "-o"))["n1"]
    assert (mine.in_service, mine.reason) == (real.in_service, real.reason)
    refused = [False, False]
    for i, scheduler in enumerate((model, slurm.scontrol)):
        try:
            scheduler("update", "NodeName=n1", "State=RESUME")
        except (BackendError, RuntimeError):
            refused[i] = True
    assert refused[0] == refused[1] == (not drained)
