"""Ownership on Kubernetes, as a property: random interleavings of the remediator's reconciles, of
verdicts that change, and of a person's cordons, uncordons, edits and removals of our annotation
and vetoes, on a real kube-apiserver 1.20. Whatever the order, the remediator never undoes what it
did not do (a cordon, an annotation, a taint or a condition someone else set), and when it undoes
its own act it leaves none of its marks behind."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterhealth.fleet.remediate.kubernetes import ACT, CONDITIONS, DO_NOT_ACT, PREFIX, TAINT, parse_record

from .kube import KubeAPI
from .remediate_kube import healthy, open_kube, sick, step

NODES = ("gpu-0", "gpu-1", "gpu-2")
PERSON = {"example.com/owner": "team-a"}
PERSON_TAINT = {"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"}
NPD = {
    "type": "RDMAProblem", "status": "False", "reason": "RDMAHealthy",
    "message": "clusterhealth finds no critical RDMA or network problem",
    "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
}  # fmt: skip

node_names = st.sampled_from(NODES)
moves = st.one_of(
    st.tuples(st.just("reconcile")),
    st.tuples(st.just("sick"), node_names, st.sampled_from(["gpu_xid 3", "rdma_port_state mlx5_0/1"])),
    st.tuples(st.just("healthy"), node_names),
    st.tuples(st.sampled_from(["cordon", "uncordon", "drop", "edit", "veto", "unveto"]), node_names),
)


@dataclass
class World:
    """What the test knows: who set each node's cordon last, and whether our annotation is still
    the one the remediator wrote."""

    verdicts: dict[str, str] = field(default_factory=lambda: dict.fromkeys(NODES, "healthy"))
    evidence: dict[str, str] = field(default_factory=lambda: dict.fromkeys(NODES, ""))
    cordoned_by: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(NODES))
    intact: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(NODES, False))


def ours(node: dict[str, Any]) -> bool:
    text = node["metadata"].get("annotations", {}).get(ACT)
    if text is None:
        return False
    try:
        parse_record(node["metadata"]["name"], text)
    except ValueError:
        return False
    return True


def marks(node: dict[str, Any]) -> list[str]:
    """Our marks on a node: our annotation, our taint, our conditions."""
    found = [k for k in node["metadata"].get("annotations", {}) if k.startswith(PREFIX) and k != DO_NOT_ACT]
    found += [t["key"] for t in node["spec"].get("taints", []) if t["key"] == TAINT]
    found += [
        c["type"]
        for c in node["status"]["conditions"]
        if c["type"] in CONDITIONS and c["message"].startswith("clusterhealth:")
    ]
    return found


def not_ours(node: dict[str, Any]) -> dict[str, Any]:
    """What on a node belongs to someone else: never changed by the remediator."""
    annotations = node["metadata"].get("annotations", {})
    return {
        "annotations": {k: v for k, v in annotations.items() if not k.startswith(PREFIX) or k == DO_NOT_ACT},
        "edited": annotations.get(ACT) if not ours(node) else None,
        "taints": [t for t in node["spec"].get("taints", []) if t["key"] != TAINT],
        "conditions": [
            c
            for c in node["status"]["conditions"]
            if c["type"] not in CONDITIONS or not c["message"].startswith("clusterhealth:")
        ],
        "labels": node["metadata"].get("labels"),
    }


def person(kube: KubeAPI, world: World, move: str, name: str) -> None:
    path = f"/api/v1/nodes/{name}"
    if move == "cordon":
        if not kube.node(name)["spec"].get("unschedulable"):  # kubectl cordon: "already cordoned"
            kube.admin.patch(path, {"spec": {"unschedulable": True}}).ok()
            world.cordoned_by[name] = "person"
    elif move == "uncordon":
        kube.admin.patch(path, {"spec": {"unschedulable": None}}).ok()
        world.cordoned_by[name] = None
    elif move in ("drop", "edit"):
        value = None if move == "drop" else "mine now: RMA 4711"
        if ACT in kube.node(name)["metadata"].get("annotations", {}):
            kube.admin.patch(path, {"metadata": {"annotations": {ACT: value}}}).ok()
            world.intact[name] = False
    elif move == "veto":
        kube.admin.patch(path, {"metadata": {"annotations": {DO_NOT_ACT: "true"}}}).ok()
    elif move == "unveto":
        kube.admin.patch(path, {"metadata": {"annotations": {DO_NOT_ACT: None}}}).ok()


def reconcile(kube: KubeAPI, world: World, backend: Any, now: float) -> None:
    before = {n: kube.node(n) for n in NODES}
    seen = {
        n: sick(n, evidence=world.evidence[n]) if world.verdicts[n] == "sick" else healthy(n) for n in NODES
    }
    step(backend, seen, now)
    for name in NODES:
        old, new = before[name], kube.node(name)
        was, now_cordoned = bool(old["spec"].get("unschedulable")), bool(new["spec"].get("unschedulable"))
        # Never a change to what is someone else's.
        assert not_ours(new) == not_ours(old), name
        if was and not now_cordoned:
            # An uncordon only of its own cordon, its annotation as it wrote it, the node not vetoed.
            assert world.cordoned_by[name] == "remediator" and world.intact[name], name
            assert DO_NOT_ACT not in old["metadata"].get("annotations", {}), name
            assert marks(new) == [], f"{name} released with marks left: {marks(new)}"
            world.cordoned_by[name], world.intact[name] = None, False
        elif now_cordoned and not was:
            assert DO_NOT_ACT not in old["metadata"].get("annotations", {}), name
            assert ours(new), name
            world.cordoned_by[name], world.intact[name] = "remediator", True
        elif was and now_cordoned and world.cordoned_by[name] == "person":
            assert not ours(new), f"{name}: a person's cordon taken for ours"
        # Nothing of ours is left without its ledger, nor a ledger on a node in service.
        if marks(new):
            assert ours(new) and now_cordoned, f"{name}: {marks(new)} left"


@settings(max_examples=400 if os.environ.get("CLUSTERHEALTH_FUZZ") == "explore" else 20)
@given(script=st.lists(moves, min_size=4, max_size=14))
def test_the_remediator_never_undoes_what_it_did_not_do(
    kube: KubeAPI, tmp_path: Path, script: list[tuple[str, ...]]
) -> None:
    kube.reset()
    for name in NODES:
        kube.create_node(name)
        kube.admin.patch(f"/api/v1/nodes/{name}", {"metadata": {"annotations": PERSON}}).ok()
        kube.admin.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": [PERSON_TAINT]}}).ok()
    kube.admin.patch("/api/v1/nodes/gpu-2/status", {"status": {"conditions": [NPD]}}).ok()
    backend = open_kube(kube, tmp_path, kubernetes={"taint": True})
    world = World()
    now = time.time()
    for i, (move, *args) in enumerate([*script, ("reconcile",)]):
        if move == "reconcile":
            reconcile(kube, world, backend, now + i)
        elif move == "sick":
            world.verdicts[args[0]], world.evidence[args[0]] = "sick", args[1]
        elif move == "healthy":
            world.verdicts[args[0]] = "healthy"
        else:
            person(kube, world, move, args[0])
    backend.close()
    # The ledger of ended acts stays what the remediator writes.
    lease = kube.admin.get(
        "/apis/coordination.k8s.io/v1/namespaces/clusterhealth/leases/clusterhealth-remediator"
    )
    history = lease.ok().body["metadata"].get("annotations", {}).get(PREFIX + "history", "[]")
    assert all(item[4] in ("recovered", "taken_over") for item in json.loads(history))
