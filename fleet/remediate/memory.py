"""A scheduler held in memory: nodes that are in service or out of it, and a ledger in a list.

Not a ``--backend`` of the command line: it stands for a fleet with no scheduler to ask, where what
matters is what the remediator decides. `clusterhealth lab` runs the remediator in dry-run over its
hosts with it (the lab's hosts are nobody's nodes), and benchmarks/remediate_scale.py times a
reconcile of 16,384 nodes with it, so that the figures are the remediator's and Prometheus's, not a
scheduler's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from clusterhealth.fleet.remediate.backend import (
    FAILED,
    RECOVERED,
    Act,
    Lead,
    NodeView,
    Observation,
    Order,
)


class MemoryBackend:
    name = "memory"
    can_reboot = False

    def __init__(self, nodes: Iterable[str]):
        self.out: dict[str, str | None] = dict.fromkeys(nodes)  # node -> our reason when drained
        self.acts: list[Act] = []
        self.would_orders: list[Order] = []

    def lead(self) -> Lead:
        return Lead(True)

    def observe(self, now: float) -> Observation:
        open_acts = {a.node: a for a in self.acts if a.open}
        history: dict[str, list[Act]] = {}
        for act in self.acts:
            history.setdefault(act.node, []).append(act)
        return Observation(
            {
                name: NodeView(
                    name,
                    in_service=reason is None,
                    ours=open_acts.get(name),
                    history=tuple(history.get(name, ())),
                )
                for name, reason in self.out.items()
            }
        )

    def quarantine(self, node: NodeView, order: Order, now: float) -> Act:
        self.acts = [
            replace(a, ended=now, outcome=FAILED) if a.open and a.node == node.name else a for a in self.acts
        ]
        act = Act(order.node, order.action, now, order.reason, hold=order.hold)
        self.acts.append(act)
        self.out[order.node] = order.reason
        return act

    def reboot(self, node: NodeView, order: Order, now: float) -> Act:
        return self.quarantine(node, order, now)

    def release(self, node: NodeView, act: Act, now: float) -> bool:
        self.out[node.name] = None
        self.forget(act, RECOVERED, now)
        return True

    def forget(self, act: Act, outcome: str, now: float) -> None:
        self.acts = [replace(a, ended=now, outcome=outcome) if a == act else a for a in self.acts]

    def would(self, node: NodeView, order: Order, now: float) -> None:
        self.would_orders.append(order)

    def close(self) -> None:
        pass
