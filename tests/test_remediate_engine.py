"""The remediator's decisions (fleet/remediate/engine.py), rule by rule, on pictures of a fleet.

Each test is one situation an operator would recognise: a node sick long enough, a node an admin
drained, a veto, a budget spent, the slow start. The engine is pure, so these need no scheduler;
tests/test_remediate_slurm.py runs the same rules against a real Slurm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest

from clusterhealth.fleet.remediate.backend import (
    FORGET,
    QUARANTINE,
    REBOOT,
    RECOVERED,
    RELEASE,
    TAKEN_OVER,
    Act,
    NodeView,
)
from clusterhealth.fleet.remediate.config import BudgetConfig, RemediateConfig
from clusterhealth.fleet.remediate.engine import (
    BUDGET,
    DOMAIN,
    HELD_FOR_PERSON,
    HOLDING,
    MAX_REASON,
    NO_VERDICT,
    OTHER,
    QUARANTINED,
    SLOW_START,
    UNKNOWN_NODE,
    UNTRUSTED,
    VETO,
    Plan,
    Seen,
    decide,
    reason,
    slow_start_width,
)

NOW = 1_800_000_000.0
HOUR = 3600.0


def config(
    max_unavailable: int = 8, per_domain: int = 8, slow_start: bool = False, **kw: object
) -> RemediateConfig:
    budget = BudgetConfig(
        max_unavailable=max_unavailable, max_unavailable_per_domain=per_domain, slow_start=slow_start
    )
    return dataclasses.replace(RemediateConfig(hold_seconds=300, settle_seconds=900), budget=budget, **kw)  # type: ignore[arg-type]


def sick(node: str, action: str = "reset_gpu", held: float = 600, evidence: str = "gpu_xid 3") -> Seen:
    return Seen(node, "unhealthy", action, held, evidence)


def healthy(node: str, held: float = 1000) -> Seen:
    return Seen(node, "healthy", "none", held)


def fleet(*names: str, **views: NodeView) -> dict[str, NodeView]:
    nodes = {name: NodeView(name, in_service=True) for name in names}
    nodes.update(views)
    return nodes


def ours(name: str, at: float = NOW - HOUR, hold: bool = False, **kw: object) -> NodeView:
    act = Act(name, "reset_gpu", at, "clusterhealth: reset_gpu: gpu_xid 3", hold=hold)
    return NodeView(name, in_service=False, ours=act, history=(act,), **kw)  # type: ignore[arg-type]


def orders(plan: Plan, operation: str | None = None) -> list[str]:
    return [o.node for o in plan.orders if operation is None or o.operation == operation]


def status(plan: Plan, node: str) -> str:
    (found,) = [item.status for item in plan.left if item.node == node]
    return found


def verdicts(*seen: Seen) -> dict[str, Seen]:
    return {s.node: s for s in seen}


# --- acting on a verdict -------------------------------------------------------------------------


def test_a_node_unhealthy_past_the_hold_is_quarantined_with_our_reason() -> None:
    plan = decide(NOW, config(), verdicts(sick("n1"), healthy("n2")), fleet("n1", "n2"))
    (order,) = plan.orders
    assert (order.node, order.operation, order.action) == ("n1", QUARANTINE, "reset_gpu")
    assert order.reason == "clusterhealth: reset_gpu: gpu_xid 3"
    assert not order.hold


def test_a_verdict_younger_than_the_hold_waits() -> None:
    plan = decide(NOW, config(), verdicts(sick("n1", held=299)), fleet("n1"))
    assert plan.orders == ()
    assert status(plan, "n1") == HOLDING


@pytest.mark.parametrize(
    ("state", "action"),
    [("degraded", "inspect"), ("unhealthy", "restart_job"), ("unhealthy", "none"), ("healthy", "none")],
)
def test_verdicts_the_configuration_does_not_act_on_are_left(state: str, action: str) -> None:
    plan = decide(NOW, config(), verdicts(Seen("n1", state, action, 10 * HOUR)), fleet("n1"))
    assert plan.orders == ()


def test_degraded_is_acted_on_when_configured() -> None:
    c = config(act_on_states=("unhealthy", "degraded"))
    plan = decide(NOW, c, verdicts(Seen("n1", "degraded", "inspect", HOUR)), fleet("n1"))
    assert orders(plan, QUARANTINE) == ["n1"]


def test_an_untrusted_or_missing_verdict_is_neither_healthy_nor_sick() -> None:
    seen = verdicts(Seen("n1", None, None, problem="its latest sample is 600 s old"))
    nodes = fleet("n1", "n2", n3=ours("n3"), n4=ours("n4"))
    seen["n3"] = Seen("n3", None, None, problem="stale")
    plan = decide(NOW, config(), seen, nodes)
    assert plan.orders == ()  # neither a quarantine (n1, n2) nor a release (n3, n4)
    assert (status(plan, "n1"), status(plan, "n2")) == (UNTRUSTED, NO_VERDICT)
    assert (status(plan, "n3"), status(plan, "n4")) == (QUARANTINED, QUARANTINED)


def test_reboot_is_a_reboot_only_where_the_backend_can() -> None:
    seen, nodes = verdicts(sick("n1", "reboot")), fleet("n1")
    assert decide(NOW, config(), seen, nodes).orders[0].operation == QUARANTINE
    assert decide(NOW, config(), seen, nodes, can_reboot=True).orders[0].operation == REBOOT


def test_the_reason_is_one_short_printable_line() -> None:
    text = reason("replace", "gpu_ecc\nuncorrectable 7:\x1b[31m " + "x" * 500)
    assert text.startswith("clusterhealth: replace: gpu_ecc uncorrectable 7:")
    assert len(text) <= MAX_REASON and text.isprintable() and "\n" not in text


# --- ownership -----------------------------------------------------------------------------------


def test_a_node_out_of_service_for_someone_else_is_never_touched() -> None:
    admin = NodeView("n1", in_service=False, other="root: bad DIMM")
    plan = decide(NOW, config(), verdicts(sick("n1"), healthy("n2")), fleet(n1=admin, n2=admin))
    assert plan.orders == ()
    assert status(plan, "n1") == OTHER


def test_an_act_whose_mark_someone_changed_is_forgotten_and_the_node_left() -> None:
    act = Act("n1", "reset_gpu", NOW - HOUR, "clusterhealth: reset_gpu: x")
    changed = NodeView("n1", in_service=False, orphan=act, other="admin: RMA ticket 123", history=(act,))
    plan = decide(NOW, config(), verdicts(healthy("n1")), fleet(n1=changed))
    assert [(o.node, o.operation) for o in plan.orders] == [("n1", FORGET)]  # no release
    assert status(plan, "n1") == OTHER


def test_a_node_of_ours_is_released_only_after_the_settle_time_healthy() -> None:
    nodes = fleet(n1=ours("n1"), n2=ours("n2"), n3=ours("n3"))
    seen = verdicts(healthy("n1", held=900), healthy("n2", held=899), sick("n3"))
    plan = decide(NOW, config(), seen, nodes)
    assert orders(plan) == ["n1"]
    assert plan.orders[0].operation == RELEASE
    assert plan.orders[0].reason == nodes["n1"].ours.reason  # type: ignore[union-attr]
    assert (status(plan, "n2"), status(plan, "n3")) == (QUARANTINED, QUARANTINED)


def test_a_vetoed_node_is_reported_and_never_touched() -> None:
    nodes = fleet(n1=NodeView("n1", True, veto=True), n2=dataclasses.replace(ours("n2"), veto=True))
    plan = decide(NOW, config(), verdicts(sick("n1"), healthy("n2")), nodes)
    assert plan.orders == ()
    assert (status(plan, "n1"), status(plan, "n2")) == (VETO, VETO)
    assert [item.action for item in plan.left] == ["reset_gpu", "none"]


def test_a_node_prometheus_names_and_the_scheduler_does_not_know_is_reported_alone() -> None:
    plan = decide(NOW, config(), verdicts(sick("ghost"), sick("n1")), fleet("n1"))
    assert orders(plan) == ["n1"]
    assert status(plan, "ghost") == UNKNOWN_NODE


# --- K acts within the window --------------------------------------------------------------------


def history(name: str, *ages: float) -> tuple[Act, ...]:
    return tuple(
        Act(name, "reset_gpu", NOW - age, "r", ended=NOW - age + 60, outcome=RECOVERED) for age in ages
    )


def test_the_kth_act_within_the_window_is_an_inspect_held_for_a_person() -> None:
    c = config(repeat_limit=3, repeat_window_seconds=7 * 86400)
    two_recent = NodeView("n1", True, history=history("n1", 86400, 2 * 86400))
    one_old = NodeView("n2", True, history=history("n2", 86400, 8 * 86400))
    plan = decide(NOW, c, verdicts(sick("n1"), sick("n2")), fleet(n1=two_recent, n2=one_old))
    by_node = {o.node: o for o in plan.orders}
    assert (by_node["n1"].action, by_node["n1"].hold) == ("inspect", True)
    assert by_node["n1"].reason.startswith("clusterhealth: inspect: ")
    assert (by_node["n2"].action, by_node["n2"].hold) == ("reset_gpu", False)


def test_a_node_held_for_a_person_is_never_released_automatically() -> None:
    plan = decide(NOW, config(), verdicts(healthy("n1", held=30 * 86400)), fleet(n1=ours("n1", hold=True)))
    assert plan.orders == ()
    assert status(plan, "n1") == HELD_FOR_PERSON


# --- the budget ----------------------------------------------------------------------------------


def test_past_the_budget_nothing_is_added_and_it_says_so() -> None:
    seen = verdicts(*(sick(f"n{i}") for i in range(1, 7)))
    plan = decide(NOW, config(max_unavailable=2), seen, fleet(*(f"n{i}" for i in range(1, 9))))
    assert len(orders(plan, QUARANTINE)) == 2
    assert plan.budget.remaining == 0 and plan.budget.exhausted
    assert plan.budget.deferred == {BUDGET: 4}


def test_the_budget_counts_the_nodes_already_ours() -> None:
    nodes = fleet("n3", "n4", n1=ours("n1"), n2=ours("n2"))
    plan = decide(NOW, config(max_unavailable=2), verdicts(sick("n1"), sick("n2"), sick("n3")), nodes)
    assert orders(plan) == []
    assert status(plan, "n3") == BUDGET


def test_the_budget_frees_itself_and_acts_on_current_verdicts_only() -> None:
    """No latch and no replay: once a node of ours is released the next sick node is taken, and a
    node that was deferred while the budget was spent but is healthy now is not."""
    c = config(max_unavailable=1)
    nodes = fleet("n2", "n3", n1=ours("n1"))
    spent = decide(NOW, c, verdicts(sick("n1"), sick("n2"), sick("n3")), nodes)
    assert orders(spent) == [] and spent.budget.exhausted
    # n1 healthy again (released in the same plan), n2 healthy now, n3 still sick.
    freed = decide(NOW + 900, c, verdicts(healthy("n1"), healthy("n2"), sick("n3")), nodes)
    assert [(o.node, o.operation) for o in freed.orders] == [("n1", RELEASE), ("n3", QUARANTINE)]
    assert not freed.budget.exhausted


def test_a_budget_of_zero_acts_on_nothing() -> None:
    plan = decide(NOW, config(max_unavailable=0), verdicts(sick("n1")), fleet("n1"))
    assert plan.orders == () and status(plan, "n1") == BUDGET


def test_a_failure_domain_takes_at_most_its_share() -> None:
    racks = {
        f"n{i}": NodeView(f"n{i}", True, domains={"rack": "r1" if i <= 3 else "r2"}) for i in range(1, 6)
    }
    seen = verdicts(*(sick(f"n{i}") for i in range(1, 6)))
    plan = decide(NOW, config(per_domain=1), seen, racks)
    assert orders(plan, QUARANTINE) == ["n1", "n4"]
    assert plan.budget.deferred == {DOMAIN: 3}


def test_the_heaviest_then_the_longest_held_go_first() -> None:
    seen = verdicts(sick("n1", "reset_gpu", 5000), sick("n2", "replace", 400), sick("n3", "reset_gpu", 9000))
    plan = decide(NOW, config(max_unavailable=2), seen, fleet("n1", "n2", "n3"))
    assert orders(plan) == ["n2", "n3"]


# --- the slow start ------------------------------------------------------------------------------


def act(at: float, ended: float | None = None, outcome: str | None = None) -> Act:
    return Act("x", "reset_gpu", at, "r", ended=ended, outcome=outcome)


def test_slow_start_widens_on_recoveries_and_falls_back_to_one() -> None:
    deadline = HOUR
    assert slow_start_width([], NOW, 16, deadline) == (1, 0)
    recovered = [act(NOW - 5000 + i, NOW - 4000 + i, RECOVERED) for i in range(3)]
    assert slow_start_width(recovered, NOW, 16, deadline) == (8, 0)
    assert slow_start_width(recovered, NOW, 4, deadline) == (4, 0)  # never past the budget
    stuck = act(NOW - 2 * HOUR)  # not back after the deadline: judged at at + deadline
    assert slow_start_width([*recovered, stuck], NOW, 16, deadline) == (1, 0)
    taken = act(NOW - 3000, NOW - 100, TAKEN_OVER)
    assert slow_start_width([*recovered, taken], NOW, 16, deadline) == (1, 0)
    assert slow_start_width([*recovered, act(NOW - 60)], NOW, 16, deadline) == (8, 1)


def started(names: Iterable[str], acts: dict[str, tuple[Act, ...]] | None = None) -> dict[str, NodeView]:
    return {n: NodeView(n, True, history=(acts or {}).get(n, ())) for n in names}


def test_slow_start_acts_on_one_node_at_a_time_at_first() -> None:
    seen = verdicts(*(sick(f"n{i}") for i in range(1, 6)))
    plan = decide(NOW, config(slow_start=True), seen, started(f"n{i}" for i in range(1, 6)))
    assert len(orders(plan, QUARANTINE)) == 1
    assert plan.budget.deferred == {SLOW_START: 4}
    assert not plan.budget.exhausted  # pacing, not a spent budget


def test_slow_start_waits_while_an_act_is_in_flight() -> None:
    nodes = started(["n2", "n3"])
    nodes["n1"] = ours("n1", at=NOW - 60)
    plan = decide(NOW, config(slow_start=True), verdicts(sick("n1"), sick("n2"), sick("n3")), nodes)
    assert orders(plan) == []
    assert plan.budget.in_flight == 1


def test_slow_start_widens_after_nodes_came_back_healthy() -> None:
    back = {"n9": tuple(act(NOW - 9000 + i, NOW - 8000 + i, RECOVERED) for i in range(2))}
    names = [f"n{i}" for i in range(1, 10)]
    seen = verdicts(*(sick(f"n{i}") for i in range(1, 9)))
    plan = decide(NOW, config(slow_start=True), seen, started(names, back))
    assert len(orders(plan, QUARANTINE)) == 4


def test_a_release_in_the_plan_counts_as_a_recovery_for_the_slow_start() -> None:
    nodes = started(["n2", "n3"])
    nodes["n1"] = ours("n1", at=NOW - 1000)
    plan = decide(NOW, config(slow_start=True), verdicts(healthy("n1"), sick("n2"), sick("n3")), nodes)
    assert [(o.node, o.operation) for o in plan.orders] == [
        ("n1", RELEASE),
        ("n2", QUARANTINE),
        ("n3", QUARANTINE),
    ]
