"""The remediator against a real Slurm (tests/slurm.py) and a real Prometheus holding a chosen past.

The verdicts are backfilled (tests/verdict_tsdb.py) along one timeline, and each test reconciles at
moments of it (the remediator's clock), so a verdict has held exactly as long as the test says;
what the remediator does lands on a real slurmctld, where the test reads it back with scontrol.
tests/test_remediate_fleet.py runs it with real agents instead, in real time.

The timeline (T: an hour ago), hold 300 s, settle 900 s:

* n1: unhealthy (reset_gpu) from T-6000 to T-4000, healthy since;
* n2: healthy all along;
* n3 to n7: unhealthy (reset_gpu) from T-2500 to T-1000, healthy since;
* n8: unhealthy (reboot) since T-2500;
* ghost: unhealthy all along, a node Slurm does not know.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterhealth.fleet.prometheus import Prometheus
from clusterhealth.fleet.remediate import metrics
from clusterhealth.fleet.remediate.backend import RECOVERED, TAKEN_OVER, Act
from clusterhealth.fleet.remediate.config import BudgetConfig, RemediateConfig, SlurmConfig
from clusterhealth.fleet.remediate.ledger import Ledger, LedgerError
from clusterhealth.fleet.remediate.reconcile import EXIT_ACTED, EXIT_DONE, EXIT_UNTRUSTED, Remediator, Result
from clusterhealth.fleet.remediate.slurm import SlurmBackend, parse_nodes

from .conftest import samples
from .prom import free_port
from .slurm import SlurmCluster
from .verdict_tsdb import Span, Target, backfill, openmetrics, serve

T = float(math.floor(time.time() / 60) * 60 - 3600)
BEGIN, END = T - 7200, T + 1
REASON_N1 = "clusterhealth: reset_gpu: gpu_xid 3"


def healthy(start: float, end: float) -> Span:
    return Span(start, end, "healthy", "none")


def sick(start: float, end: float, action: str = "reset_gpu") -> Span:
    return Span(start, end, "unhealthy", action)


def _target(node: str, *spans: Span, checks: tuple[tuple[str, str, int], ...] = ()) -> Target:
    return Target(f"{node}:9845", node, spans, checks)


TARGETS = [
    _target(
        "n1",
        healthy(BEGIN, T - 6000),
        sick(T - 6000, T - 4000),
        healthy(T - 4000, END),
        checks=(("gpu_xid", "3", 2),),
    ),
    _target("n2", healthy(BEGIN, END)),
    *(
        _target(f"n{i}", healthy(BEGIN, T - 2500), sick(T - 2500, T - 1000), healthy(T - 1000, END))
        for i in range(3, 8)
    ),
    _target("n8", healthy(BEGIN, T - 2500), sick(T - 2500, END, "reboot")),
    _target("ghost", sick(BEGIN, END)),
]

# Moments of the timeline.
N1_SICK, N1_BACK_600, N1_SETTLED = T - 5000, T - 3400, T - 3000
SIX_SICK, SIX_SICK_LATER, SIX_BACK = T - 1500, T - 1200, T - 50


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("remediate-slurm")
    data = backfill(root, openmetrics(TARGETS))
    with serve(root, data) as url:
        yield url


class Run:
    """One remediator against the test's cluster, reconciling at moments of the timeline."""

    def __init__(self, cluster: SlurmCluster, url: str, state: Path, act: bool = True, **settings: object):
        budget = settings.pop(
            "budget", BudgetConfig(max_unavailable=2, max_unavailable_per_domain=8, slow_start=False)
        )
        slurm = settings.pop("slurm", SlurmConfig(state_dir=str(state), timeout_seconds=10))
        self.config = dataclasses.replace(
            RemediateConfig(hold_seconds=300, settle_seconds=900, stale_seconds=180),
            budget=budget,
            slurm=slurm,
            **settings,  # type: ignore[arg-type]
        )
        self.cluster = cluster
        self.backend = SlurmBackend(self.config, env=cluster.env)
        self.clock = T
        self.remediator = Remediator(
            self.config, self.backend, Prometheus(url), act=act, clock=lambda: self.clock
        )

    def at(self, moment: float) -> Result:
        self.clock = moment
        return self.remediator.reconcile()

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        from prometheus_client import generate_latest

        return samples(generate_latest(metrics.registry(self.remediator.tally)).decode())

    def close(self) -> None:
        self.backend.close()


@pytest.fixture
def run(slurm: SlurmCluster, prometheus: str, tmp_path: Path) -> Iterator[type[Run]]:
    made: list[Run] = []

    def make(act: bool = True, **settings: object) -> Run:
        r = Run(slurm, prometheus, tmp_path / f"state{len(made)}", act, **settings)
        made.append(r)
        return r

    yield make  # type: ignore[misc]
    for r in made:
        r.close()


def drained(cluster: SlurmCluster) -> dict[str, str | None]:
    return {name: node.reason for name, node in cluster.nodes().items() if node.drained}


def metric(run: Run, name: str, **labels: str) -> float | None:
    return run.metrics().get((name, frozenset({"backend": "slurm", **labels}.items())))


# --- one node, sick then healthy -----------------------------------------------------------------


def test_a_sick_node_is_drained_with_our_reason_and_resumed_once_settled(
    run: type[Run], slurm: SlurmCluster
) -> None:
    r = run()
    assert r.at(N1_SICK).code == EXIT_ACTED
    assert drained(slurm) == {"n1": REASON_N1}
    assert r.at(N1_BACK_600).code == EXIT_DONE  # healthy for 600 s of the 900
    assert drained(slurm) == {"n1": REASON_N1}
    assert r.at(N1_SETTLED).code == EXIT_ACTED
    slurm.wait_node("n1", lambda n: n.available, what="n1 resumed")
    assert drained(slurm) == {}
    (act,) = r.backend.ledger.load()
    assert (act.node, act.reason, act.outcome) == ("n1", REASON_N1, RECOVERED)
    assert metric(r, "clusterhealth_remediation_actions_total", action="quarantine", result="ok") == 1
    assert metric(r, "clusterhealth_remediation_actions_total", action="release", result="ok") == 1
    assert metric(r, "clusterhealth_remediation_quarantined_nodes") == 0


def test_dry_run_decides_and_touches_nothing(run: type[Run], slurm: SlurmCluster) -> None:
    r = run(act=False)
    result = r.at(N1_SICK)
    assert result.code == EXIT_ACTED  # it would act
    assert [(o.node, o.operation) for o in result.would] == [("n1", "quarantine")]
    assert drained(slurm) == {}
    assert not Path(r.config.slurm.state_dir).exists()  # no ledger, no lock
    assert metric(r, "clusterhealth_remediation_would_act_nodes", action="quarantine") == 1
    assert metric(r, "clusterhealth_remediation_actions_total", action="quarantine", result="dry_run") == 1
    assert metric(r, "clusterhealth_remediation_actions_total", action="quarantine", result="ok") == 0
    # n1 healthy and settled: nothing it would do now, whatever it would have done before.
    assert r.at(N1_SETTLED).code == EXIT_DONE
    assert metric(r, "clusterhealth_remediation_would_act_nodes", action="quarantine") == 0


# --- someone else's nodes ------------------------------------------------------------------------


def test_a_node_an_admin_drained_stays_drained(run: type[Run], slurm: SlurmCluster) -> None:
    slurm.drain("n1", "admin: bad DIMM")  # sick too: still not ours to drain again
    slurm.drain("n2", "clusterhealth: gpu_xid 3: the health check's drain")  # healthy, our prefix
    r = run()
    assert r.at(N1_SICK).code == EXIT_DONE
    assert r.at(N1_SETTLED).code == EXIT_DONE
    assert drained(slurm) == {
        "n1": "admin: bad DIMM",
        "n2": "clusterhealth: gpu_xid 3: the health check's drain",
    }
    assert r.backend.ledger.load() == []


@pytest.mark.parametrize("takeover", ["edit the reason", "drain again", "resume"])
def test_a_node_an_admin_took_over_is_never_resumed_by_us(
    run: type[Run], slurm: SlurmCluster, takeover: str
) -> None:
    r = run()
    r.at(N1_SICK)
    if takeover == "edit the reason":
        slurm.scontrol("update", "NodeName=n1", "Reason=clusterhealth: reset_gpu: gpu_xid 3 -- mine now, bob")
    elif takeover == "drain again":
        slurm.drain("n1", "admin: RMA")
    else:
        slurm.resume("n1")
    before = drained(slurm)
    assert r.at(N1_SETTLED).code == EXIT_DONE
    assert drained(slurm) == before
    (act,) = r.backend.ledger.load()
    assert act.outcome == TAKEN_OVER  # forgotten: the node is theirs


def test_a_sick_node_someone_resumed_is_theirs_in_the_reconcile_that_forgets_our_act(
    run: type[Run], slurm: SlurmCluster
) -> None:
    r = run()
    r.at(N1_SICK)
    slurm.resume("n1")
    result = r.at(N1_SICK + 60)  # still sick
    assert result.plan is not None and [(o.node, o.operation) for o in result.plan.orders] == [
        ("n1", "forget")
    ]
    assert drained(slurm) == {}
    (act,) = r.backend.ledger.load()
    assert act.outcome == TAKEN_OVER


def test_a_vetoed_node_is_reported_and_never_touched(run: type[Run], slurm: SlurmCluster) -> None:
    r = run(veto=("n[13]",))
    assert r.at(N1_SICK).code == EXIT_DONE
    assert drained(slurm) == {}
    assert metric(r, "clusterhealth_remediation_nodes", status="veto") == 2


def test_a_node_slurm_does_not_know_is_said_once_and_nothing_else_changes(
    run: type[Run], slurm: SlurmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    r = run()
    with caplog.at_level(logging.INFO, logger="clusterhealth.remediate"):
        r.at(N1_SICK)
        r.at(N1_SICK + 60)
    assert drained(slurm) == {"n1": REASON_N1}
    assert sum("ghost" in m for m in caplog.messages) == 1


# --- the budget ----------------------------------------------------------------------------------


def test_six_sick_at_once_the_budget_holds_at_its_cap_and_frees_itself(
    run: type[Run], slurm: SlurmCluster
) -> None:
    r = run()
    result = r.at(SIX_SICK)
    assert result.plan is not None and result.plan.budget.exhausted
    # The heaviest action first (n8: reboot), then by name.
    assert sorted(drained(slurm)) == ["n3", "n8"]
    assert metric(r, "clusterhealth_remediation_budget_remaining") == 0
    assert metric(r, "clusterhealth_remediation_deferred_nodes", reason="budget") == 4
    r.at(SIX_SICK_LATER)
    assert sorted(drained(slurm)) == ["n3", "n8"]  # it stops adding and keeps saying so
    # n3 is back and settled: resumed, which frees one place; n4 to n7 are healthy now, so the
    # place stays free: the verdicts they had while the budget was spent are not replayed.
    result = r.at(SIX_BACK)
    assert [(o.node, o.operation) for o in result.done] == [("n3", "release")]
    slurm.wait_node("n3", lambda n: n.available, what="n3 resumed")
    assert sorted(drained(slurm)) == ["n8"]
    assert metric(r, "clusterhealth_remediation_budget_remaining") == 1
    assert metric(r, "clusterhealth_remediation_deferred_nodes", reason="budget") == 0


def test_a_failure_domain_from_node_features_or_the_config_takes_its_share(
    run: type[Run], slurm: SlurmCluster, tmp_path: Path
) -> None:
    r = run(
        budget=BudgetConfig(max_unavailable=8, max_unavailable_per_domain=1, slow_start=False),
        domains={"rack": {"n3": "r1", "n4": "r1", "n5": "r1", "n6": "r2", "n7": "r2", "n8": "r3"}},
    )
    r.at(SIX_SICK)
    assert sorted(drained(slurm)) == ["n3", "n6", "n8"]
    assert metric(r, "clusterhealth_remediation_deferred_nodes", reason="domain") == 3


def test_the_kth_act_within_a_week_holds_the_node_for_a_person(run: type[Run], slurm: SlurmCluster) -> None:
    r = run(repeat_limit=2)
    earlier = Act(
        "n1",
        "reset_gpu",
        N1_SICK - 2 * 86400,
        "clusterhealth: reset_gpu: x",
        ended=N1_SICK - 86400,
        outcome=RECOVERED,
    )
    r.backend.ledger.save([earlier])
    r.at(N1_SICK)
    assert drained(slurm) == {"n1": "clusterhealth: inspect: gpu_xid 3"}
    assert r.at(N1_SETTLED).code == EXIT_DONE  # healthy and settled, held for a person all the same
    assert drained(slurm) == {"n1": "clusterhealth: inspect: gpu_xid 3"}
    assert metric(r, "clusterhealth_remediation_nodes", status="held_for_person") == 1


# --- trust ---------------------------------------------------------------------------------------


def test_prometheus_unreachable_is_no_action(run: type[Run], slurm: SlurmCluster) -> None:
    r = run()
    assert r.at(T - 6400).code == EXIT_DONE  # everyone healthy: nothing to do
    assert metric(r, "clusterhealth_remediation_budget_remaining") == 2
    r.remediator.prometheus = Prometheus(f"http://127.0.0.1:{free_port()}")
    result = r.at(N1_SICK)
    assert result.code == EXIT_UNTRUSTED and "cannot reach" in (result.problem or "")
    assert drained(slurm) == {}
    # What it knew before is not known now: the budget and the nodes are withdrawn, not 0.
    assert metric(r, "clusterhealth_remediation_budget_remaining") is None
    assert metric(r, "clusterhealth_remediation_nodes", status="healthy") is None
    assert metric(r, "clusterhealth_remediation_reconciles_total", result="untrusted") == 1


def test_a_hung_slurmctld_is_said_once_and_the_next_reconcile_acts(
    run: type[Run], slurm: SlurmCluster, caplog: pytest.LogCaptureFixture
) -> None:
    r = run(slurm=SlurmConfig(state_dir=str(Path(slurm.base) / "hung-state"), timeout_seconds=2))
    ctld = slurm._slurmctld
    assert ctld is not None
    os.kill(ctld.pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.INFO, logger="clusterhealth.remediate"):
            assert r.at(N1_SICK).code == EXIT_UNTRUSTED
            assert r.at(N1_SICK + 30).code == EXIT_UNTRUSTED
        assert sum("did not answer" in m for m in caplog.messages) == 1
    finally:
        os.kill(ctld.pid, signal.SIGCONT)
    assert r.at(N1_SICK + 60).code == EXIT_ACTED
    assert drained(slurm) == {"n1": REASON_N1}


def test_a_refused_command_stops_the_reconcile_there(
    run: type[Run], slurm: SlurmCluster, tmp_path: Path
) -> None:
    """scontrol refusing to drain n3 (a wrapper that fails that one call, as a slurmctld that
    refuses it would): n8, next in line, is not touched; the next reconcile tries again."""
    refuse = tmp_path / "refuse"
    wrapper = tmp_path / "scontrol"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ -e {refuse} ] && [ "$1 $2" = "update NodeName=n3" ]; then\n'
        '  echo "slurm_update error: Access denied" >&2; exit 1\n'
        "fi\n"
        f'exec {shutil.which("scontrol")} "$@"\n'
    )
    wrapper.chmod(0o755)
    refuse.touch()
    r = run(
        budget=BudgetConfig(max_unavailable=8, slow_start=False),
        slurm=SlurmConfig(
            scontrol=str(wrapper), state_dir=str(tmp_path / "state-refused"), timeout_seconds=10
        ),
    )
    result = r.at(SIX_SICK)
    assert result.code == EXIT_UNTRUSTED and "Access denied" in (result.problem or "")
    assert metric(r, "clusterhealth_remediation_last_success_timestamp_seconds") is None
    assert metric(r, "clusterhealth_remediation_reconciles_total", result="failed") == 1
    # n8 (reboot, the heaviest) went first; n3 was refused; n4 to n7 were not tried.
    assert sorted(drained(slurm)) == ["n8"]
    assert [a.node for a in r.backend.ledger.load()] == ["n8"]  # the refused act is not recorded
    refuse.unlink()
    r.at(SIX_SICK_LATER)
    assert sorted(drained(slurm)) == ["n3", "n4", "n5", "n6", "n7", "n8"]


# --- one actor -----------------------------------------------------------------------------------


def test_a_second_remediator_only_says_what_it_would_do(
    run: type[Run], slurm: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = run()
    assert first.backend.lead().leader
    second = run(slurm=first.config.slurm)
    with caplog.at_level(logging.INFO, logger="clusterhealth.remediate"):
        result = second.at(N1_SICK)
        second.at(N1_SICK + 60)
    assert sum("another remediator acts" in m for m in caplog.messages) == 1  # said once
    assert [o.node for o in result.would] == ["n1"] and result.done == []
    assert drained(slurm) == {}
    assert metric(second, "clusterhealth_remediation_leader") == 0
    first.close()
    second.at(N1_SICK)
    assert drained(slurm) == {"n1": REASON_N1}


# --- reboot --------------------------------------------------------------------------------------


def test_reboot_when_enabled_is_slurms_reboot_with_our_reason(
    run: type[Run], slurm: SlurmCluster, tmp_path: Path
) -> None:
    slurm.set(RebootProgram="/bin/true", ResumeTimeout="300")
    r = run(slurm=SlurmConfig(state_dir=str(tmp_path / "state-reboot"), reboot=True, timeout_seconds=10))
    result = r.at(SIX_SICK)
    assert ("n8", "reboot") in [(o.node, o.operation) for o in result.done]
    (act,) = [a for a in r.backend.ledger.load() if a.node == "n8"]
    assert act.rebooted and act.open
    assert act.reason == "clusterhealth: reboot: unhealthy (verdict)"
    # slurmctld sends the reboot once the node is idle (it is) and appends to the reason what it
    # did: the drain is still ours, not an admin's takeover.
    node = slurm.wait_node("n8", lambda n: "REBOOT_ISSUED" in n.flags, timeout=60)
    assert node.reason == "clusterhealth: reboot: unhealthy (verdict) : reboot issued"
    view = r.backend.observe(time.time()).nodes["n8"]
    assert view.ours == act and view.orphan is None and view.other is None
    # Only Slurm's own words: an admin who adds to the reason has taken the node over.
    slurm.scontrol("update", "NodeName=n8", f"Reason={node.reason}, PSU swap, keep out")
    view = r.backend.observe(time.time()).nodes["n8"]
    assert view.ours is None and view.orphan == act
    slurm.scontrol("update", "NodeName=n8", "State=RESUME")  # what a real reboot ends with, for reset()


# --- the scontrol output it reads ----------------------------------------------------------------


def test_parse_nodes_reads_states_reasons_and_features() -> None:
    text = (
        "NodeName=a1 Arch=x86_64 AvailableFeatures=rack-r7,ib ActiveFeatures=rack-r7 State=MIXED+DRAIN "
        "Partitions=all Reason=admin: a=b [root@2026-01-02T03:04:05]\n"
        "NodeName=a2 AvailableFeatures=(null) State=IDLE* Partitions=all\n"
        "NodeName=a3 State=DOWN+DRAIN+NOT_RESPONDING Reason=Not responding [slurm@2026-01-02T03:04:05]\n"
        "garbage line\n"
    )
    nodes = parse_nodes(text)
    assert set(nodes) == {"a1", "a2", "a3"}
    a1, a2, a3 = nodes["a1"], nodes["a2"], nodes["a3"]
    assert (a1.state, a1.flags, a1.reason, a1.reason_user) == ("MIXED", {"DRAIN"}, "admin: a=b", "root")
    assert a1.features == ("rack-r7", "ib") and not a1.in_service
    assert (a2.flags, a2.in_service, a2.reason) == ({"NOT_RESPONDING"}, True, None)
    assert not a3.in_service


def test_a_ledger_that_cannot_be_read_stops_every_act(run: type[Run], slurm: SlurmCluster) -> None:
    r = run()
    Path(r.config.slurm.state_dir).mkdir(parents=True)
    (Path(r.config.slurm.state_dir) / "ledger.json").write_text(
        json.dumps({"format": 1, "acts": [{"node": 3}]})
    )
    result = r.at(N1_SICK)
    assert result.code == EXIT_UNTRUSTED and "ledger" in (result.problem or "")
    assert drained(slurm) == {}


def test_a_reason_edited_between_the_look_and_the_resume_is_left(run: type[Run], slurm: SlurmCluster) -> None:
    r = run()
    r.at(N1_SICK)
    view = r.backend.observe(N1_SETTLED).nodes["n1"]
    assert view.ours is not None
    slurm.scontrol("update", "NodeName=n1", "Reason=admin: keep it, bob")
    assert not r.backend.release(view, view.ours, N1_SETTLED)
    assert drained(slurm) == {"n1": "admin: keep it, bob"}
    assert r.backend.ledger.load()[0].open  # the next observe finds it taken over


# --- found by tests/mutation_audit.py ------------------------------------------------------------


def test_dry_run_neither_forgets_nor_says_it_would(run: type[Run], slurm: SlurmCluster) -> None:
    """An act of ours whose node is back in service (someone resumed it): an acting remediator
    closes it; a dry-run one leaves the ledger as it is and has nothing to say it would do."""
    r = run(act=False)
    mine = Act("n2", "reset_gpu", T - 7000, "clusterhealth: reset_gpu: x")
    r.backend.ledger.save([mine])
    result = r.at(T - 6400)
    assert result.plan is not None and [o.operation for o in result.plan.orders] == ["forget"]
    assert (result.code, result.would, result.done) == (EXIT_DONE, [], [])
    assert r.backend.ledger.load() == [mine]
    assert metric(r, "clusterhealth_remediation_actions_total", action="forget", result="dry_run") is None


def test_a_reason_edited_during_the_reconcile_is_not_counted_resumed(
    run: type[Run], slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The reason changes between the reconcile's look and its resume (a wrapper edits it as the
    release reads n1 again, as an admin could): nothing is resumed or counted done, n1 stays
    counted among the nodes out of service, and the next reconcile forgets the act."""
    edit = tmp_path / "edit"
    wrapper = tmp_path / "scontrol"
    real = shutil.which("scontrol")
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ -e {edit} ] && [ "$*" = "show node -o n1" ]; then\n'
        f'  rm {edit}; {real} update NodeName=n1 "Reason=admin: keep it, bob"\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    r = run(
        slurm=SlurmConfig(scontrol=str(wrapper), state_dir=str(tmp_path / "state-edit"), timeout_seconds=10)
    )
    r.at(N1_SICK)
    edit.touch()
    result = r.at(N1_SETTLED)
    assert not edit.exists()  # the edit happened, during the release
    assert (result.code, result.done) == (EXIT_DONE, [])
    assert drained(slurm) == {"n1": "admin: keep it, bob"}
    assert metric(r, "clusterhealth_remediation_actions_total", action="release", result="skipped") == 1
    assert metric(r, "clusterhealth_remediation_actions_total", action="release", result="ok") == 0
    assert metric(r, "clusterhealth_remediation_quarantined_nodes") == 1
    r.at(N1_SETTLED + 60)
    (act,) = r.backend.ledger.load()
    assert act.outcome == TAKEN_OVER


def test_a_node_rebooted_and_still_sick_is_acted_on_again_and_counted_once(
    run: type[Run], slurm: SlurmCluster, tmp_path: Path
) -> None:
    slurm.set(RebootProgram="/bin/true", ResumeTimeout="300")
    r = run(
        budget=BudgetConfig(max_unavailable=1, slow_start=False),
        slurm=SlurmConfig(state_dir=str(tmp_path / "state-again"), reboot=True, timeout_seconds=10),
    )
    r.at(SIX_SICK)
    assert metric(r, "clusterhealth_remediation_quarantined_nodes") == 1
    slurm.scontrol("update", "NodeName=n8", "State=RESUME")  # the reboot done, back in service
    slurm.wait_node("n8", lambda n: n.available, what="n8 back in service")
    result = r.at(SIX_SICK_LATER)
    assert [(o.node, o.operation) for o in result.done] == [("n8", "reboot")]
    assert metric(r, "clusterhealth_remediation_quarantined_nodes") == 1
    first, again = [a for a in r.backend.ledger.load() if a.node == "n8"]
    assert (first.outcome, again.open) == ("failed", True)
    slurm.scontrol("update", "NodeName=n8", "State=RESUME")


# --- the ledger ----------------------------------------------------------------------------------


def test_the_ledger_keeps_open_acts_and_the_recent_ended_ones(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.json")
    day = 86400.0
    old_open = Act("n1", "reset_gpu", T - 30 * day, "clusterhealth: reset_gpu: a")
    recent = Act(
        "n2", "reset_gpu", T - 3 * day, "clusterhealth: reset_gpu: b", ended=T - 2 * day, outcome=RECOVERED
    )
    old = Act(
        "n3", "reset_gpu", T - 10 * day, "clusterhealth: reset_gpu: c", ended=T - 9 * day, outcome=RECOVERED
    )
    ledger.save([old_open, recent, old])
    new = Act("n4", "reboot", T, "clusterhealth: reboot: d")
    ledger.record(new, 7 * day, T)
    assert ledger.load() == [old_open, recent, new]


def test_an_act_is_closed_only_by_itself(tmp_path: Path) -> None:
    """Matched by node, time and reason: an act read earlier and since replaced closes nothing."""
    ledger = Ledger(tmp_path / "ledger.json")
    current = Act("n1", "reset_gpu", T, "clusterhealth: reset_gpu: b")
    ledger.save([current])
    ledger.close(dataclasses.replace(current, at=T - 600), RECOVERED, T + 60)
    assert ledger.load() == [current]
    ledger.close(current, RECOVERED, T + 60)
    assert ledger.load() == [dataclasses.replace(current, ended=T + 60, outcome=RECOVERED)]


@pytest.mark.parametrize(
    "act",
    [
        {"node": "n1", "action": "reset_gpu", "at": 1.0, "reason": "r", "ended": 2.0, "outcome": "exploded"},
        {"node": "n1", "action": "reset_gpu", "at": 1.0, "reason": "r", "ended": 2.0},
        {"node": "n1", "action": "reset_gpu", "at": 1.0, "reason": "r", "outcome": RECOVERED},
    ],
    ids=["an outcome no remediator writes", "ended without an outcome", "an outcome without an end"],
)
def test_a_ledger_act_no_remediator_writes_is_not_read(tmp_path: Path, act: dict[str, object]) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"format": 1, "acts": [act]}))
    with pytest.raises(LedgerError, match=r"acts\[0\]: expected an act"):
        Ledger(path).load()
