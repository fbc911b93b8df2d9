"""The remediator's Kubernetes backend against a real kube-apiserver 1.20 (tests/kube.py): what it
writes and what it never touches, its ownership rules, its heartbeat and Events, the Lease that
makes one actor of two replicas, and evictions (policy/v1beta1 on 1.20, PodDisruptionBudgets)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from clusterhealth.agent.settings import ConfigError, from_mapping
from clusterhealth.fleet.remediate import kubernetes as k8s
from clusterhealth.fleet.remediate.backend import BackendError
from clusterhealth.fleet.remediate.config import RemediateConfig
from clusterhealth.fleet.remediate.engine import decide
from clusterhealth.fleet.remediate.kubernetes import (
    ACT,
    DO_NOT_ACT,
    HISTORY,
    TAINT,
    conditions_for,
    parse_record,
)

from .conftest import ROOT
from .kube import KubeAPI, condition
from .remediate_kube import (
    NAMESPACE,
    events,
    healthy,
    open_kube,
    pod,
    reasons,
    recovering,
    settings,
    sick,
    step,
)

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"


def ours(node: dict[str, Any]) -> dict[str, Any] | None:
    text = node["metadata"].get("annotations", {}).get(ACT)
    return None if text is None else json.loads(text)


def test_a_sick_node_is_cordoned_annotated_and_conditioned_and_the_kubelets_ready_survives(
    kube: KubeAPI, tmp_path: Path
) -> None:
    before = kube.create_node("gpu-1")
    kube.admin.patch(
        "/api/v1/nodes/gpu-1", {"metadata": {"annotations": {"example.com/owner": "team-a"}}}
    ).ok()
    kube.create_node("gpu-2")
    backend = open_kube(kube, tmp_path)
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": healthy("gpu-2")}, now)

    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    record = ours(node)
    assert record is not None
    assert record["action"] == "reset_gpu" and record["at"] == now
    assert record["reason"] == "clusterhealth: reset_gpu: gpu_xid 3"
    assert record["applied"] == {"cordon": True, "conditions": ["GPUProblem"], "taint": False}
    assert record["before"] == {"unschedulable": False}
    assert record["by"] == backend.identity
    # Our annotation beside the others, never in place of them; under our prefix alone.
    annotations = node["metadata"]["annotations"]
    assert annotations["example.com/owner"] == "team-a"
    assert [k for k in annotations if k.startswith("remediate.clusterhealth.io/")] == [ACT]
    problem = condition(node, "GPUProblem")
    assert problem is not None
    assert (problem["status"], problem["reason"], problem["message"]) == (
        "True", "reset_gpu", "clusterhealth: reset_gpu: gpu_xid 3",
    )  # fmt: skip
    assert condition(node, "RDMAProblem") is None
    # The strategic merge keeps the kubelet's conditions as they were (a JSON merge patch would
    # have replaced the list: Ready gone).
    for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"):
        assert condition(node, kind) == condition(before, kind), kind
    assert "taints" not in node["spec"] or all(t["key"] != TAINT for t in node["spec"]["taints"])
    (event,) = events(kube, "gpu-1")
    assert event["reason"] == "Quarantined" and event["type"] == "Warning"
    assert (
        event["involvedObject"]["kind"] == "Node"
        and event["involvedObject"]["uid"] == node["metadata"]["uid"]
    )
    assert event["message"].startswith("clusterhealth: reset_gpu: gpu_xid 3 (cordoned, condition GPUProblem")
    assert event["source"]["component"] == "clusterhealth-remediate"
    # The healthy node: not a byte changed.
    other = kube.node("gpu-2")
    assert "unschedulable" not in other["spec"] and ACT not in other["metadata"].get("annotations", {})
    assert events(kube, "gpu-2") == []


@pytest.mark.parametrize(
    ("evidence", "kinds"),
    [
        ("gpu_xid 3", ["GPUProblem"]),
        ("rdma_port_state mlx5_0/1, mtu ib0", ["RDMAProblem"]),
        ("gpu_lost 2, hca_firmware mlx5_1", ["GPUProblem", "RDMAProblem"]),
        ("fabric h3: 0.41 of its peers' median", ["RDMAProblem"]),
        ("unhealthy (verdict)", ["GPUProblem"]),
    ],
)
def test_the_condition_follows_the_evidence(evidence: str, kinds: list[str]) -> None:
    assert list(conditions_for(evidence)) == kinds


def test_the_conditions_split_the_checks_as_the_node_problem_detector_plugin_does() -> None:
    plugin = json.loads(
        (ROOT / "deploy" / "kubernetes" / "node-problem-detector-clusterhealth.json").read_text()
    )
    for rule in plugin["rules"]:
        only = rule["args"][rule["args"].index("--only") + 1]
        assert k8s.CONDITION_CHECKS[rule["condition"]] == only


def test_node_problem_detectors_condition_is_never_overwritten_nor_removed(
    kube: KubeAPI, tmp_path: Path
) -> None:
    kube.create_node("gpu-1")
    npd = {
        "type": "GPUProblem", "status": "True", "reason": "GPUCritical",
        "message": "CRITICAL gpu_xid 3: Xid 79", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    kube.admin.patch("/api/v1/nodes/gpu-1/status", {"status": {"conditions": [npd]}}).ok()
    backend = open_kube(kube, tmp_path)
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1", evidence="gpu_xid 3, mtu ib0")}, now)
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert condition(node, "GPUProblem") == npd
    record = ours(node)
    assert record is not None
    assert record["applied"]["conditions"] == ["RDMAProblem"]
    assert record["before"]["conditions"] == {"GPUProblem": "GPUCritical (True)"}
    assert condition(node, "RDMAProblem")["reason"] == "reset_gpu"  # type: ignore[index]
    step(backend, {"gpu-1": healthy("gpu-1")}, now + 5)
    node = kube.node("gpu-1")
    assert not node["spec"].get("unschedulable") and ours(node) is None
    assert condition(node, "GPUProblem") == npd and condition(node, "RDMAProblem") is None


def test_a_healthy_node_of_ours_is_released_and_left_without_a_mark(kube: KubeAPI, tmp_path: Path) -> None:
    before = kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path, kubernetes={"taint": True})
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1", "replace", "gpu_row_remap 4")}, now)
    tainted = kube.node("gpu-1")
    assert {"key": TAINT, "value": "replace", "effect": "NoSchedule"}.items() <= next(
        t for t in tainted["spec"]["taints"] if t["key"] == TAINT
    ).items()
    step(backend, {"gpu-1": healthy("gpu-1")}, now + 60)
    node = kube.node("gpu-1")
    assert not node["spec"].get("unschedulable")
    assert all(t["key"] != TAINT for t in node["spec"].get("taints", []))
    assert not any(
        k.startswith("remediate.clusterhealth.io/") for k in node["metadata"].get("annotations", {})
    )
    assert condition(node, "GPUProblem") is None
    assert node["status"]["conditions"] == before["status"]["conditions"]
    assert reasons(kube, "gpu-1") == ["Quarantined", "Released"]
    # The ledger of ended acts, on the Lease.
    lease = kube.admin.get(f"{LEASES}/clusterhealth-remediator").ok().body
    assert json.loads(lease["metadata"]["annotations"][HISTORY]) == [
        ["gpu-1", "replace", now, now + 60, "recovered", False]
    ]


def test_a_node_cordoned_by_someone_else_is_never_touched_nor_uncordoned(
    kube: KubeAPI, tmp_path: Path
) -> None:
    kube.create_node("gpu-1")
    kube.admin.patch("/api/v1/nodes/gpu-1", {"spec": {"unschedulable": True}}).ok()
    written = kube.node("gpu-1")["metadata"]["resourceVersion"]
    backend = open_kube(kube, tmp_path)
    now = time.time()
    for i, verdict in enumerate((sick, healthy, sick)):
        plan = step(backend, {"gpu-1": verdict("gpu-1")}, now + i)
        assert plan.orders == ()
    assert kube.node("gpu-1")["metadata"]["resourceVersion"] == written
    assert events(kube) == []


def test_an_uncordon_by_someone_else_takes_the_node_over_and_our_marks_go(
    kube: KubeAPI, tmp_path: Path
) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path, kubernetes={"taint": True})
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1")}, now)
    kube.kubectl("uncordon", "gpu-1")
    assert kube.node("gpu-1")["spec"].get("unschedulable") is None
    step(backend, {"gpu-1": healthy("gpu-1")}, now + 5)
    node = kube.node("gpu-1")
    assert not node["spec"].get("unschedulable")
    assert ours(node) is None and condition(node, "GPUProblem") is None
    assert all(t["key"] != TAINT for t in node["spec"].get("taints", []))
    assert reasons(kube, "gpu-1") == ["Quarantined", "TakenOver"]
    lease = kube.admin.get(f"{LEASES}/clusterhealth-remediator").ok().body
    assert json.loads(lease["metadata"]["annotations"][HISTORY])[0][4] == "taken_over"


@pytest.mark.parametrize(
    "edit", [None, "mine now", "another act", "another act at the same moment", "uncordon"]
)
def test_a_release_reads_the_node_again_and_leaves_it_if_our_mark_changed_meanwhile(
    kube: KubeAPI, tmp_path: Path, edit: str | None
) -> None:
    """Between the reconcile's read and the release, a person takes the node over: the release,
    checked against a fresh read, does nothing."""
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path)
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1")}, now)
    assert backend.lead().leader
    view = backend.observe(now + 5).nodes["gpu-1"]
    assert view.ours is not None
    if edit == "uncordon":
        kube.kubectl("uncordon", "gpu-1")
    elif edit and edit.startswith("another act"):  # another remediator's, or ours of another time
        at = now if edit.endswith("same moment") else now + 1
        other = k8s.Act("gpu-1", "replace", at, "clusterhealth: replace: gpu_row_remap 1")
        record = k8s.act_record(other, {"cordon": True, "conditions": []}, {"unschedulable": False}, "other")
        kube.admin.patch("/api/v1/nodes/gpu-1", {"metadata": {"annotations": {ACT: record}}}).ok()
    else:
        kube.admin.patch("/api/v1/nodes/gpu-1", {"metadata": {"annotations": {ACT: edit}}}).ok()
    written = kube.node("gpu-1")
    assert backend.release(view, view.ours, now + 5) is False
    assert kube.node("gpu-1")["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert reasons(kube, "gpu-1") == ["Quarantined"]


@pytest.mark.parametrize("edit", ["removed", "edited"])
def test_our_annotation_removed_or_edited_leaves_the_cordon_to_whoever_did_it(
    kube: KubeAPI, tmp_path: Path, edit: str
) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path, kubernetes={"taint": True})
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1")}, now)
    value = None if edit == "removed" else "kept for the vendor: ticket 4711"
    kube.admin.patch("/api/v1/nodes/gpu-1", {"metadata": {"annotations": {ACT: value}}}).ok()
    for i in range(1, 3):
        step(backend, {"gpu-1": healthy("gpu-1")}, now + i)
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True  # theirs now: never uncordoned
    assert node["metadata"].get("annotations", {}).get(ACT) == value
    assert condition(node, "GPUProblem") is None  # what was left of ours went
    assert all(t["key"] != TAINT for t in node["spec"].get("taints", []))
    assert reasons(kube, "gpu-1") == ["Quarantined", "TakenOver"]


def test_do_not_act_is_reported_and_never_touched(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    kube.create_node("gpu-2")
    kube.admin.patch("/api/v1/nodes/gpu-1", {"metadata": {"annotations": {DO_NOT_ACT: "true"}}}).ok()
    backend = open_kube(kube, tmp_path)
    now = time.time()
    plan = step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": sick("gpu-2")}, now)
    assert [o.node for o in plan.orders] == ["gpu-2"]
    assert [(item.node, item.status) for item in plan.left] == [("gpu-1", "veto")]
    assert not kube.node("gpu-1")["spec"].get("unschedulable")
    # Vetoed once ours: kept as it is, never released.
    kube.admin.patch("/api/v1/nodes/gpu-2", {"metadata": {"annotations": {DO_NOT_ACT: "yes"}}}).ok()
    plan = step(backend, {"gpu-1": healthy("gpu-1"), "gpu-2": healthy("gpu-2")}, now + 5)
    assert plan.orders == ()
    assert kube.node("gpu-2")["spec"]["unschedulable"] is True
    # "false" is no veto.
    kube.admin.patch("/api/v1/nodes/gpu-2", {"metadata": {"annotations": {DO_NOT_ACT: "false"}}}).ok()
    step(backend, {"gpu-1": healthy("gpu-1"), "gpu-2": healthy("gpu-2")}, now + 6)
    assert not kube.node("gpu-2")["spec"].get("unschedulable")


def test_a_cordon_on_a_node_that_changed_since_it_was_read_is_refused_then_retried(
    kube: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the read and the write, someone else labels the node: the write, guarded by the
    resourceVersion read, is refused with 409; the node is read again and the cordon retried,
    keeping their label."""
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path)
    read = backend._read_node
    refused: list[int] = []
    patch = backend._patch

    def read_then_someone_writes(name: str) -> dict[str, Any] | None:
        node = read(name)
        if not refused:
            kube.admin.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {"rack": "r07"}}}).ok()
        return node

    def counting(name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
        try:
            return patch(name, body, status)
        except k8s._Refused as err:
            refused.append(err.status)
            raise

    monkeypatch.setattr(backend, "_read_node", read_then_someone_writes)
    monkeypatch.setattr(backend, "_patch", counting)
    step(backend, {"gpu-1": sick("gpu-1")}, time.time())
    assert refused == [409]
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True and ours(node) is not None
    assert node["metadata"]["labels"]["rack"] == "r07"


def _another_act() -> str:
    other = k8s.Act("gpu-1", "replace", 1.0, "clusterhealth: replace: gpu_row_remap 1")
    return k8s.act_record(other, {"cordon": False, "conditions": []}, {"unschedulable": False}, "other")


@pytest.mark.parametrize(
    "edit",
    [
        {"spec": {"unschedulable": True}},
        {"metadata": {"annotations": {DO_NOT_ACT: "true"}}},
        {"metadata": {"annotations": {ACT: _another_act()}}},
    ],
    ids=["cordoned", "vetoed", "another act's annotation"],
)
def test_a_node_cordoned_by_someone_between_the_read_and_the_write_is_left_alone(
    kube: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: dict[str, Any]
) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path)
    read = backend._read_node
    calls: list[str] = []

    def read_then_a_person_edits(name: str) -> dict[str, Any] | None:
        node = read(name)
        if not calls:
            kube.admin.patch(f"/api/v1/nodes/{name}", edit).ok()
        calls.append(name)
        return node

    monkeypatch.setattr(backend, "_read_node", read_then_a_person_edits)
    with pytest.raises(BackendError, match="changed since it was read"):
        step(backend, {"gpu-1": sick("gpu-1")}, time.time())
    node = kube.node("gpu-1")
    assert node["spec"].get("unschedulable") is edit.get("spec", {}).get("unschedulable")
    assert node["metadata"].get("annotations", {}).get(ACT) == edit.get("metadata", {}).get(
        "annotations", {}
    ).get(ACT)
    assert condition(node, "GPUProblem") is None
    assert events(kube) == []


NPD_CONDITION = {
    "type": "GPUProblem", "status": "True", "reason": "GPUCritical", "message": "CRITICAL gpu_xid 3: Xid 79",
    "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
}  # fmt: skip


def test_a_condition_written_between_our_cordon_and_our_conditions_is_kept(
    kube: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node-problem-detector writes GPUProblem just after our cordon: our conditions' write,
    guarded by the cordon's resourceVersion, is refused; read again, the kind is theirs."""
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path)
    patch = backend._patch

    def cordon_then_npd_writes(name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
        written = patch(name, body, status)
        if not status and (body.get("spec") or {}).get("unschedulable"):
            kube.admin.patch(f"/api/v1/nodes/{name}/status", {"status": {"conditions": [NPD_CONDITION]}}).ok()
        return written

    monkeypatch.setattr(backend, "_patch", cordon_then_npd_writes)
    step(backend, {"gpu-1": sick("gpu-1")}, time.time())
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True and ours(node) is not None
    assert condition(node, "GPUProblem") == NPD_CONDITION


@pytest.mark.parametrize(
    ("reason", "message"),
    [("reboot", "bob: waiting for the vendor"), ("GPUCritical", "clusterhealth: reset_gpu: gpu_xid 3")],
    ids=["an action for its reason, not our mark", "our mark, not an action for its reason"],
)
def test_a_condition_that_only_half_looks_like_ours_is_someone_elses(
    kube: KubeAPI, tmp_path: Path, reason: str, message: str
) -> None:
    kube.create_node("gpu-1")
    theirs = {**NPD_CONDITION, "reason": reason, "message": message}
    kube.admin.patch("/api/v1/nodes/gpu-1/status", {"status": {"conditions": [theirs]}}).ok()
    backend = open_kube(kube, tmp_path)
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1")}, now)
    node = kube.node("gpu-1")
    record = ours(node)
    assert node["spec"]["unschedulable"] is True and record is not None
    assert condition(node, "GPUProblem") == theirs and record["applied"]["conditions"] == []
    step(backend, {"gpu-1": healthy("gpu-1")}, now + 5)
    node = kube.node("gpu-1")
    assert not node["spec"].get("unschedulable") and condition(node, "GPUProblem") == theirs


def test_our_condition_someone_rewrote_is_theirs_at_the_release(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path)
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1")}, now)
    mine = condition(kube.node("gpu-1"), "GPUProblem")
    assert mine is not None
    rewritten = {**mine, "message": "bob: keep this until the RMA"}
    kube.admin.patch("/api/v1/nodes/gpu-1/status", {"status": {"conditions": [rewritten]}}).ok()
    step(backend, {"gpu-1": healthy("gpu-1")}, now + 5)
    node = kube.node("gpu-1")
    assert not node["spec"].get("unschedulable") and ours(node) is None  # the cordon was ours
    assert condition(node, "GPUProblem") == rewritten


def heartbeat(kube: KubeAPI, node: str) -> tuple[str, str]:
    c = condition(kube.node(node), "GPUProblem")
    assert c is not None
    return c["lastHeartbeatTime"], c["lastTransitionTime"]


def test_the_heartbeat_moves_while_the_remediator_runs_and_stops_with_it(
    kube: KubeAPI, tmp_path: Path
) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path, settle_seconds=3600)
    start = float(int(time.time()))
    step(backend, {"gpu-1": sick("gpu-1")}, start)
    assert heartbeat(kube, "gpu-1") == (k8s._now_text(start), k8s._now_text(start))
    step(backend, {"gpu-1": sick("gpu-1")}, start + 60)
    step(backend, {"gpu-1": recovering("gpu-1", 60)}, start + 120)  # still settling: kept, beating
    assert heartbeat(kube, "gpu-1") == (k8s._now_text(start + 120), k8s._now_text(start))
    # A follower (another replica) never beats for it: the heartbeat shows the leader stopped.
    follower = open_kube(kube, tmp_path)
    step(follower, {"gpu-1": sick("gpu-1")}, start + 180)
    assert heartbeat(kube, "gpu-1") == (k8s._now_text(start + 120), k8s._now_text(start))


def requests_of(backend: k8s.KubernetesBackend) -> list[str]:
    """The requests the backend's client sends from now on, as ``METHOD path`` (no query)."""
    sent: list[str] = []
    rest = backend.core.api_client.rest_client
    original = rest.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(f"{method} {url.split('://', 1)[1].split('/', 1)[1].split('?')[0]}")
        return original(method, url, *args, **kwargs)

    rest.request = request
    return sent


def test_a_steady_reconcile_reads_no_node_one_by_one_and_beats_once_per_held_node(
    kube: KubeAPI, tmp_path: Path
) -> None:
    """At 16,384 nodes with 1 % held, a GET per held node each reconcile (and a second status
    write for each node just quarantined) was a third of the API's requests (docs/performance.md,
    "The remediator"): the list observe() reads is enough to guard the heartbeat's write."""
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        kube.create_node(name)
    backend = open_kube(kube, tmp_path, settle_seconds=3600)
    sent = requests_of(backend)
    start = float(int(time.time()))
    seen = {"gpu-1": sick("gpu-1"), "gpu-2": sick("gpu-2"), "gpu-3": healthy("gpu-3")}
    step(backend, seen, start)
    for name in ("gpu-1", "gpu-2"):
        # One read before the cordon (guarded by it), one write of the conditions with their
        # heartbeat: no second one in the same reconcile.
        assert sent.count(f"GET api/v1/nodes/{name}") == 1, sent
        assert sent.count(f"PATCH api/v1/nodes/{name}/status") == 1, sent
    sent.clear()
    step(backend, seen, start + 60)
    assert [r for r in sent if r.startswith("GET api/v1/nodes/")] == [], sent
    assert sorted(r for r in sent if r.startswith("PATCH")) == [
        "PATCH api/v1/nodes/gpu-1/status",
        "PATCH api/v1/nodes/gpu-2/status",
    ]
    assert heartbeat(kube, "gpu-1") == (k8s._now_text(start + 60), k8s._now_text(start))
    assert heartbeat(kube, "gpu-2") == (k8s._now_text(start + 60), k8s._now_text(start))


def test_the_heartbeat_lands_on_a_node_changed_since_the_list_and_skips_one_deleted(
    kube: KubeAPI, tmp_path: Path
) -> None:
    for name in ("gpu-1", "gpu-2"):
        kube.create_node(name)
    backend = open_kube(kube, tmp_path, settle_seconds=3600)
    start = float(int(time.time()))
    seen = {"gpu-1": sick("gpu-1"), "gpu-2": sick("gpu-2")}
    step(backend, seen, start)
    # The next reconcile, by hand: between its list and its heartbeat someone labels gpu-1 (its
    # resourceVersion moves on: the write guarded by the listed one is refused with 409) and
    # deletes gpu-2 (404).
    assert backend.lead().leader
    observation = backend.observe(start + 60)
    plan = decide(start + 60, backend.config, seen, observation.nodes, backend.can_reboot)
    assert not plan.orders
    kube.admin.patch("/api/v1/nodes/gpu-1", {"metadata": {"labels": {"example.com/pool": "a"}}}).ok()
    kube.admin.delete("/api/v1/nodes/gpu-2").ok()
    backend.tend(plan, start + 60)
    node = kube.node("gpu-1")
    assert node["metadata"]["labels"]["example.com/pool"] == "a"
    assert heartbeat(kube, "gpu-1") == (k8s._now_text(start + 60), k8s._now_text(start))
    assert condition(node, "Ready") is not None and node["spec"]["unschedulable"] is True


def test_dry_run_touches_nothing_and_posts_what_it_would_do_once(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    kube.create_node("gpu-2")
    kube.admin.patch("/api/v1/nodes/gpu-2", {"spec": {"unschedulable": True}}).ok()
    versions = {n: kube.node(n)["metadata"]["resourceVersion"] for n in ("gpu-1", "gpu-2")}
    backend = open_kube(kube, tmp_path, dry_run=True)
    now = time.time()
    for i in range(3):
        step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": sick("gpu-2")}, now + i)
    assert {n: kube.node(n)["metadata"]["resourceVersion"] for n in versions} == versions
    (event,) = events(kube)
    assert event["reason"] == "WouldQuarantine" and event["involvedObject"]["name"] == "gpu-1"
    assert event["message"] == "clusterhealth: reset_gpu: gpu_xid 3 (dry-run: would cordon)"
    # A changed verdict is a new Event.
    step(backend, {"gpu-1": sick("gpu-1", "replace", "gpu_row_remap 1")}, now + 4)
    assert reasons(kube, "gpu-1") == ["WouldQuarantine", "WouldQuarantine"]
    assert {n: kube.node(n)["metadata"]["resourceVersion"] for n in versions} == versions


def lease(kube: KubeAPI) -> dict[str, Any]:
    body: dict[str, Any] = kube.admin.get(f"{LEASES}/clusterhealth-remediator").ok().body
    return body


def test_two_replicas_one_lease_only_the_leader_acts(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    kube.create_node("gpu-2")
    first = open_kube(kube, tmp_path)
    second = open_kube(kube, tmp_path)
    now = time.time()
    assert first.lead().leader
    for i, verdicts in enumerate(
        ({"gpu-1": sick("gpu-1")}, {"gpu-1": sick("gpu-1"), "gpu-2": sick("gpu-2")}, {"gpu-2": sick("gpu-2")})
    ):
        assert not second.lead().leader
        step(second, verdicts, now + i)
        step(first, verdicts, now + i)
    assert [ours(kube.node(n))["by"] for n in ("gpu-1", "gpu-2")] == [first.identity] * 2  # type: ignore[index]
    assert sorted(reasons(kube)) == ["Quarantined", "Quarantined"]
    assert lease(kube)["spec"]["holderIdentity"] == first.identity
    # A follower is refused every write, whatever calls it.
    view = second.observe(now)
    with pytest.raises(BackendError, match="not the leader"):
        second.release(view.nodes["gpu-1"], view.nodes["gpu-1"].ours, now)  # type: ignore[arg-type]
    # The leader gives the Lease up as it stops: the other takes it at once.
    first.close()
    assert second.lead().leader
    assert not first.lead().leader


def test_a_leader_that_stops_renewing_is_replaced_after_the_leases_duration(
    kube: KubeAPI, tmp_path: Path
) -> None:
    first = open_kube(kube, tmp_path, kubernetes={"lease_duration_seconds": 2})
    second = open_kube(kube, tmp_path, kubernetes={"lease_duration_seconds": 2})
    assert first.lead().leader
    began = time.monotonic()
    while not second.lead().leader:  # first crashed: it never renews nor gives the Lease up
        assert time.monotonic() - began < 30
        time.sleep(0.2)
    assert time.monotonic() - began >= 2
    assert lease(kube)["spec"]["holderIdentity"] == second.identity
    assert lease(kube)["spec"]["leaseTransitions"] == 1
    # The one that was replaced finds out at its next renewal, and writes nothing more.
    assert not first.lead().leader
    with pytest.raises(BackendError, match="not the leader"):
        first._may_act()


def test_a_lease_that_would_expire_between_two_renewals_is_a_bad_configuration(tmp_path: Path) -> None:
    config = from_mapping(
        RemediateConfig, {"interval_seconds": 60, "kubernetes": {"lease_duration_seconds": 90}}, "test"
    )
    with pytest.raises(ConfigError, match=r"kubernetes.lease_duration_seconds: expected at least twice"):
        k8s.open_backend(config, dry_run=True)


def pdb(kube: KubeAPI, namespace: str, labels: dict[str, str], allowed: int | None = None) -> None:
    """A PodDisruptionBudget; `allowed`: its status as the disruption controller (which this API
    does not run) would write it. Without it the API refuses every eviction it covers."""
    path = f"/apis/policy/v1beta1/namespaces/{namespace}/poddisruptionbudgets"
    body = {"metadata": {"name": "keep"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}
    created = kube.admin.post(path, body)
    budget = created.body if created.status == 201 else kube.admin.get(f"{path}/keep").ok().body
    if allowed is not None:
        budget["status"] = {
            "observedGeneration": budget["metadata"]["generation"], "disruptionsAllowed": allowed,
            "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2,
        }  # fmt: skip
        kube.admin.put(f"{path}/keep/status", budget).ok()


def deleting(kube: KubeAPI, namespace: str, name: str) -> bool:
    """Evicted: the pod is being deleted (no kubelet here finishes it)."""
    return (
        "deletionTimestamp"
        in kube.admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}").ok().body["metadata"]
    )


def test_evictions_after_the_grace_period_hold_to_pod_disruption_budgets(
    kube: KubeAPI, tmp_path: Path
) -> None:
    kube.create_node("gpu-1")
    kube.create_node("gpu-2")
    pod(kube, "train-0", "gpu-1", namespace="team-a")
    pod(kube, "notebook", "gpu-1", namespace="team-a", gpus=0)
    pod(kube, "serve-0", "gpu-1", namespace="team-b", labels={"app": "serve"})
    pod(kube, "done", "gpu-1", namespace="team-a", phase="Succeeded")
    pod(kube, "elsewhere", "gpu-2", namespace="team-a")
    pdb(kube, "team-b", {"app": "serve"})
    backend = open_kube(kube, tmp_path, kubernetes={"evict": True, "evict_after_seconds": 600})
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": healthy("gpu-2")}, now)
    assert not deleting(kube, "team-a", "train-0")  # the grace period, for checkpoints
    step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": healthy("gpu-2")}, now + 601)
    assert deleting(kube, "team-a", "train-0")
    assert backend._eviction_version == "policy/v1beta1"  # 1.20 has no policy/v1 Eviction
    assert not deleting(kube, "team-b", "serve-0")  # its budget says not now (429)
    assert not any(deleting(kube, "team-a", p) for p in ("notebook", "done", "elsewhere"))
    (evicting,) = [e for e in events(kube, "gpu-1") if e["reason"] == "Evicting"]
    assert "evicted 1 pod(s) using its GPUs (team-a/train-0)" in evicting["message"]
    assert "1 held by a PodDisruptionBudget now (team-b/serve-0), tried again" in evicting["message"]
    # The disruption controller would now allow one: the next reconcile evicts it.
    pdb(kube, "team-b", {"app": "serve"}, allowed=1)
    step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": healthy("gpu-2")}, now + 661)
    assert deleting(kube, "team-b", "serve-0")
    budget = kube.admin.get("/apis/policy/v1beta1/namespaces/team-b/poddisruptionbudgets/keep").ok().body
    assert budget["status"]["disruptionsAllowed"] == 0  # the API's own part of the arithmetic


def test_no_eviction_while_the_verdict_no_longer_asks_for_it(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    pod(kube, "train-0", "gpu-1")
    backend = open_kube(
        kube, tmp_path, settle_seconds=3600, kubernetes={"evict": True, "evict_after_seconds": 600}
    )
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1")}, now)
    step(backend, {"gpu-1": recovering("gpu-1", 100)}, now + 700)
    assert kube.node("gpu-1")["spec"]["unschedulable"] is True
    assert not deleting(kube, "default", "train-0")
    step(backend, {}, now + 800)  # no verdict at all: nothing to go on
    assert not deleting(kube, "default", "train-0")


def test_dry_run_asks_the_server_whether_it_would_evict_and_evicts_nothing(
    kube: KubeAPI, tmp_path: Path
) -> None:
    kube.create_node("gpu-1")
    pod(kube, "train-0", "gpu-1", namespace="team-a")
    pod(kube, "serve-0", "gpu-1", namespace="team-b", labels={"app": "serve"})
    pdb(kube, "team-b", {"app": "serve"})
    backend = open_kube(kube, tmp_path, dry_run=True, kubernetes={"evict": True})
    step(backend, {"gpu-1": sick("gpu-1")}, time.time())
    assert not deleting(kube, "team-a", "train-0") and not deleting(kube, "team-b", "serve-0")
    assert not kube.node("gpu-1")["spec"].get("unschedulable")
    (event,) = events(kube, "gpu-1")
    assert event["reason"] == "WouldQuarantine"
    assert "would evict 1 pod(s) using its GPUs (team-a/train-0)" in event["message"]
    assert "1 held by a PodDisruptionBudget now (team-b/serve-0)" in event["message"]


class _PolicyV1(BaseHTTPRequestHandler):
    """A stand-in for an API server that has policy/v1 (none runs here: 1.20 lacks it): it
    accepts any Eviction and records what it was sent."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "body": body})
        answer = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_server_with_policy_v1_gets_a_policy_v1_eviction(tmp_path: Path) -> None:
    """The unit-level half of the fallback (no API server here serves policy/v1: the real 1.20 of
    the test above covers the fallback to policy/v1beta1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PolicyV1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = tmp_path / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "c",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                }
            )
        )
        data = settings(kubernetes={"kubeconfig": str(config)})
        backend = k8s.open_backend(from_mapping(RemediateConfig, data, "test"), dry_run=False)
        assert backend._evict("team-a", "train-0", dry_run=False) == 201
    finally:
        server.shutdown()
    (request,) = _PolicyV1.seen
    assert request["path"] == "/api/v1/namespaces/team-a/pods/train-0/eviction"
    assert request["body"]["apiVersion"] == "policy/v1" and request["body"]["kind"] == "Eviction"
    assert backend._eviction_version == "policy/v1"


def test_the_ledger_of_ended_acts_feeds_the_repeat_rule(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path, repeat_limit=3)
    now = time.time()
    for i in range(2):
        step(backend, {"gpu-1": sick("gpu-1")}, now + 10 * i)
        step(backend, {"gpu-1": healthy("gpu-1")}, now + 10 * i + 5)
    # A fresh process reads the same ledger from the Lease.
    backend.close()
    again = open_kube(kube, tmp_path, repeat_limit=3)
    plan = step(again, {"gpu-1": sick("gpu-1")}, now + 30)
    (order,) = plan.orders
    assert order.action == "inspect" and order.hold
    record = parse_record("gpu-1", kube.node("gpu-1")["metadata"]["annotations"][ACT])
    assert record.act.hold and record.act.action == "inspect"
    plan = step(again, {"gpu-1": healthy("gpu-1")}, now + 100)
    assert plan.orders == () and kube.node("gpu-1")["spec"]["unschedulable"] is True


def test_a_ledger_someone_edited_stops_every_act_until_mended(kube: KubeAPI, tmp_path: Path) -> None:
    kube.create_node("gpu-1")
    backend = open_kube(kube, tmp_path)
    assert backend.lead().leader
    body = lease(kube)
    body["metadata"]["annotations"] = {HISTORY: "lost"}
    kube.admin.put(f"{LEASES}/clusterhealth-remediator", body).ok()
    with pytest.raises(BackendError, match=r"history is not the ledger we write"):
        step(backend, {"gpu-1": sick("gpu-1")}, time.time())
    assert not kube.node("gpu-1")["spec"].get("unschedulable")


@pytest.mark.parametrize("server", ["closed", "silent"])
def test_an_api_that_cannot_be_reached_or_never_answers_fails_the_read_after_one_retry(
    tmp_path: Path, server: str
) -> None:
    """A refused connection, or an API that accepts and never answers (timeout_seconds): the
    backend says so (BackendError: the reconcile acts on nothing, exit 3) after one retry per
    request, and writes nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    if server == "closed":
        listener.close()
    else:
        listener.listen(16)

        def accept() -> None:
            with contextlib.suppress(OSError):
                while True:
                    accepted.append(listener.accept()[0])  # and never a byte back

        threading.Thread(target=accept, daemon=True).start()
    try:
        config = tmp_path / "kubeconfig"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1", "kind": "Config", "current-context": "c",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                }
            )
        )  # fmt: skip
        data = settings(kubernetes={"kubeconfig": str(config), "timeout_seconds": 1})
        backend = k8s.open_backend(from_mapping(RemediateConfig, data, "test"), dry_run=False)
        with pytest.raises(BackendError, match="the Kubernetes API did not answer GET Lease"):
            backend.lead()
        with pytest.raises(BackendError, match="the Kubernetes API did not answer GET nodes"):
            backend.observe(time.time())
        if server == "silent":
            assert len(accepted) == 4  # two requests, each tried twice
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


def test_failure_domains_come_from_node_labels_and_the_configuration_wins(
    kube: KubeAPI, tmp_path: Path
) -> None:
    for name, zone in (("gpu-1", "r07"), ("gpu-2", "r07"), ("gpu-3", "r08"), ("gpu-9", "r09")):
        kube.create_node(name, labels={"topology.kubernetes.io/zone": zone})
    backend = open_kube(
        kube, tmp_path, veto=["gpu-9*"], domains={"zone": {"gpu-3": "r07"}},
        budget={"max_unavailable_per_domain": 1},
        kubernetes={"domain_labels": {"zone": "topology.kubernetes.io/zone"}},
    )  # fmt: skip
    assert backend.lead().leader
    views = backend.observe(time.time()).nodes
    assert {n: dict(v.domains) for n, v in views.items()} == {
        "gpu-1": {"zone": "r07"}, "gpu-2": {"zone": "r07"},
        "gpu-3": {"zone": "r07"}, "gpu-9": {"zone": "r09"},
    }  # fmt: skip
    assert [n for n, v in views.items() if v.veto] == ["gpu-9"]
    plan = step(backend, {n: sick(n) for n in views}, time.time())
    assert [o.node for o in plan.orders] == ["gpu-1"]  # one per zone: r07 holds three
    assert sorted((item.node, item.status) for item in plan.left) == [
        ("gpu-2", "domain"), ("gpu-3", "domain"), ("gpu-9", "veto"),
    ]  # fmt: skip
