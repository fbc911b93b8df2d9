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
    HEALTHY,
    HELD_FOR_PERSON,
    HOLDING,
    MAX_REASON,
    NO_VERDICT,
    NOT_ACTED_ON,
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
    assert status(plan, "n1") == (HEALTHY if state == "healthy" else NOT_ACTED_ON)


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
    # What `remediate` prints for each: why there is nothing to go by.
    detail = {item.node: item.detail for item in plan.left}
    assert (detail["n3"], detail["n4"]) == ("stale", "no verdict in Prometheus")


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


# --- boundaries and the plan's own releases and take-overs (found by tests/mutation_audit.py) ---


def test_a_mark_of_exactly_max_reason_characters_is_kept_whole() -> None:
    head = "clusterhealth: replace: "
    text = reason("replace", "x" * (MAX_REASON - len(head)))
    assert len(text) == MAX_REASON and not text.endswith("...")
    assert reason("replace", "x" * (MAX_REASON - len(head) + 1)).endswith("...")


def test_a_verdict_that_held_exactly_the_hold_is_acted_on() -> None:
    plan = decide(NOW, config(), verdicts(sick("n1", held=300)), fleet("n1"))
    assert orders(plan, QUARANTINE) == ["n1"]


def test_a_node_of_ours_sick_for_longer_than_the_settle_time_is_kept() -> None:
    """Only a healthy verdict releases: one that has held long is not enough."""
    plan = decide(NOW, config(), verdicts(sick("n1", held=10 * HOUR)), fleet(n1=ours("n1")))
    assert plan.orders == ()
    assert status(plan, "n1") == QUARANTINED


def test_an_act_exactly_at_the_deadline_is_judged_a_failure_not_in_flight() -> None:
    assert slow_start_width([act(NOW - HOUR)], NOW, 16, HOUR) == (1, 0)
    assert slow_start_width([act(NOW - HOUR + 1)], NOW, 16, HOUR) == (1, 1)


def test_acts_are_taken_in_the_order_they_were_judged_not_the_ledgers() -> None:
    """A failure judged before a recovery leaves the width the recovery earned, whatever order the
    ledger lists them in."""
    recovered = act(NOW - 5000, NOW - 100, RECOVERED)
    taken = act(NOW - 4000, NOW - 3000, TAKEN_OVER)
    assert slow_start_width([recovered, taken], NOW, 16, HOUR) == (2, 0)
    assert slow_start_width([taken, recovered], NOW, 16, HOUR) == (2, 0)


def test_an_act_taken_over_in_this_plan_sets_the_slow_start_back_to_one() -> None:
    """Three recoveries earned a width of 8; the act someone resumed in this plan is a failure (the
    width falls to one) and no longer in flight (one act may go)."""
    back = tuple(act(NOW - 9000 + i, NOW - 8000 + i, RECOVERED) for i in range(3))
    mine = Act("n9", "reset_gpu", NOW - 60, "clusterhealth: reset_gpu: gpu_xid 3")
    nodes = started(["n1", "n2", "n3"])
    nodes["n9"] = NodeView("n9", True, orphan=mine, other="back in service", history=(*back, mine))
    plan = decide(NOW, config(slow_start=True), verdicts(sick("n1"), sick("n2"), sick("n3")), nodes)
    assert [(o.node, o.operation) for o in plan.orders] == [("n9", FORGET), ("n1", QUARANTINE)]
    assert (plan.budget.width, plan.budget.in_flight) == (1, 1)


def test_a_release_of_an_act_past_its_deadline_frees_no_place_in_flight() -> None:
    """An act exactly at the deadline was already judged (a failure, not in flight); its release
    doubles the width to 2 and must not count as one act fewer in flight."""
    nodes = started(["n2", "n3", "n4"])
    nodes["n1"] = ours("n1", at=NOW - HOUR)
    seen = verdicts(healthy("n1"), sick("n2"), sick("n3"), sick("n4"))
    plan = decide(NOW, config(slow_start=True), seen, nodes)
    assert orders(plan, QUARANTINE) == ["n2", "n3"]
    assert (plan.budget.width, plan.budget.in_flight) == (2, 2)


def test_the_budget_remaining_is_never_below_zero() -> None:
    """The budget lowered under the nodes already ours: none left, not a negative count."""
    nodes = fleet("n3", n1=ours("n1"), n2=ours("n2"))
    plan = decide(NOW, config(max_unavailable=1), verdicts(sick("n3")), nodes)
    assert (plan.budget.used, plan.budget.remaining) == (2, 0)


def rebooted(name: str, **kw: object) -> NodeView:
    """A node of ours whose reboot the scheduler carried out: back in service, the act still open."""
    act = Act(name, "reboot", NOW - HOUR, "clusterhealth: reboot: gpu_xid 79", rebooted=True)
    return NodeView(name, in_service=True, ours=act, history=(act,), **kw)  # type: ignore[arg-type]


def test_a_rebooted_node_still_sick_is_acted_on_again_with_the_budget_spent() -> None:
    """Its place in the budget and in its domain is its own: a spent budget does not defer it."""
    nodes = fleet("n3", n1=rebooted("n1", domains={"rack": "r1"}), n2=ours("n2", domains={"rack": "r1"}))
    seen = verdicts(sick("n1", "reboot"), sick("n3"))
    plan = decide(NOW, config(max_unavailable=2), seen, nodes)
    assert orders(plan, QUARANTINE) == ["n1"]
    assert status(plan, "n3") == BUDGET
    by_domain = decide(NOW, config(per_domain=2), seen, nodes)
    assert orders(by_domain, QUARANTINE) == ["n1", "n3"]  # n3 has no domain: only n1's is spent
    racked = {**nodes, "n3": NodeView("n3", True, domains={"rack": "r1"})}
    plan = decide(NOW, config(per_domain=2), seen, racked)
    assert orders(plan, QUARANTINE) == ["n1"]
    assert status(plan, "n3") == DOMAIN


def test_a_rebooted_node_whose_verdict_asks_for_no_act_stays_ours() -> None:
    plan = decide(
        NOW, config(), verdicts(Seen("n1", "unhealthy", "restart_job", HOUR)), fleet(n1=rebooted("n1"))
    )
    assert plan.orders == ()
    assert status(plan, "n1") == QUARANTINED


def test_a_node_released_in_this_plan_frees_its_domain() -> None:
    nodes = {"n1": ours("n1", domains={"rack": "r1"}), "n2": NodeView("n2", True, domains={"rack": "r1"})}
    plan = decide(NOW, config(per_domain=1), verdicts(healthy("n1"), sick("n2")), nodes)
    assert [(o.node, o.operation) for o in plan.orders] == [("n1", RELEASE), ("n2", QUARANTINE)]


def test_an_act_exactly_a_window_ago_is_out_of_the_window() -> None:
    c = config(repeat_limit=2, repeat_window_seconds=86400)
    at_edge = NodeView("n1", True, history=history("n1", 86400))
    inside = NodeView("n2", True, history=history("n2", 86399))
    plan = decide(NOW, c, verdicts(sick("n1"), sick("n2")), fleet(n1=at_edge, n2=inside))
    by_node = {o.node: o for o in plan.orders}
    assert (by_node["n1"].hold, by_node["n2"].hold) == (False, True)


def test_a_node_someone_resumed_is_theirs_in_the_plan_that_forgets_our_act() -> None:
    """Back in service by someone's hand, sick: the plan closes our act and leaves the node to
    them (no new quarantine in the same reconcile)."""
    act_ = Act("n1", "reset_gpu", NOW - HOUR, "clusterhealth: reset_gpu: x")
    resumed = NodeView("n1", in_service=True, orphan=act_, other="back in service", history=(act_,))
    plan = decide(NOW, config(), verdicts(sick("n1")), fleet(n1=resumed))
    assert [(o.node, o.operation) for o in plan.orders] == [("n1", FORGET)]
    assert status(plan, "n1") == OTHER
