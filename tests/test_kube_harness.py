"""The real Kubernetes API of tests/kube.py does what the tests built on it rely on: Nodes with a
kubelet's status, patches of the kind a client chooses (a strategic-merge patch of the status
keeps the kubelet's Ready condition, a JSON merge patch would not), writes guarded by the
resourceVersion, RBAC that refuses the remediator's identity until applied manifests allow it,
and two APIs side by side, each leaving nothing behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from .kube import REMEDIATOR, KubeAPI, condition, helm_template

GPU_PROBLEM = {
    "type": "GPUProblem",
    "status": "True",
    "reason": "reset_gpu",
    "message": "gpu 3: Xid 79",
    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def rbac(verbs: list[str]) -> list[dict[str, Any]]:
    role = "clusterhealth-test-nodes"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": verbs}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": REMEDIATOR}],
        },
    ]


def test_a_strategic_merge_patch_of_the_status_keeps_the_kubelets_ready_condition(kube: KubeAPI) -> None:
    node = kube.create_node("gpu-1")
    ready = condition(node, "Ready")
    assert ready is not None and ready["status"] == "True" and ready["reason"] == "KubeletReady"
    patched = kube.admin.patch("/api/v1/nodes/gpu-1/status", {"status": {"conditions": [GPU_PROBLEM]}}).ok()
    assert condition(patched.body, "Ready") == ready
    assert condition(patched.body, "GPUProblem") == GPU_PROBLEM
    assert len(patched.body["status"]["conditions"]) == 5
    # What the strategic merge is for: a JSON merge patch replaces the list, Ready and all.
    kube.create_node("gpu-2")
    merged = kube.admin.patch(
        "/api/v1/nodes/gpu-2/status", {"status": {"conditions": [GPU_PROBLEM]}}, patch_type="merge"
    ).ok()
    assert condition(merged.body, "Ready") is None


def test_a_write_with_a_stale_resource_version_is_refused(kube: KubeAPI) -> None:
    node = kube.create_node("gpu-1")
    stale = dict(node)
    kube.admin.patch("/api/v1/nodes/gpu-1", {"spec": {"unschedulable": True}}).ok()
    stale["spec"] = {"unschedulable": False}
    refused = kube.admin.put("/api/v1/nodes/gpu-1", stale)
    assert refused.status == 409, refused.body
    assert kube.node("gpu-1")["spec"]["unschedulable"] is True


def test_the_remediator_may_do_only_what_applied_rbac_grants(kube: KubeAPI) -> None:
    kube.create_node("gpu-1")
    refused = kube.remediator.get("/api/v1/nodes")
    assert refused.status == 403, refused.body
    assert f'User "{REMEDIATOR}" cannot list resource "nodes"' in refused.body["message"]
    kube.apply(rbac(["get", "list"]))
    allowed = kube.remediator.get("/api/v1/nodes").ok()
    assert [n["metadata"]["name"] for n in allowed.body["items"]] == ["gpu-1"]
    assert kube.remediator.patch("/api/v1/nodes/gpu-1", {"spec": {"unschedulable": True}}).status == 403
    # kubectl under the remediator's token sees the same.
    done = kube.kubectl("auth", "can-i", "patch", "nodes", token=kube.remediator_token)
    assert done.stdout.strip() == "no"
    # The reset between tests takes the applied RBAC away again.
    kube.reset()
    assert kube.remediator.get("/api/v1/nodes").status == 403


def test_the_charts_rendered_objects_apply(kube: KubeAPI) -> None:
    kube.admin.post("/api/v1/namespaces", {"metadata": {"name": "monitoring"}})
    objects = helm_template("--namespace", "monitoring", "--show-only", "templates/serviceaccount.yaml")
    kube.apply(objects)
    name = objects[0]["metadata"]["name"]
    account = kube.admin.get(f"/api/v1/namespaces/monitoring/serviceaccounts/{name}").ok().body
    assert account["automountServiceAccountToken"] is False


def processes_of(api: KubeAPI) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(api.base).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_two_apis_run_at_once_and_stopping_one_leaves_nothing(kube: KubeAPI, tmp_path: Path) -> None:
    other = KubeAPI(tmp_path / "other")
    with other:
        assert other.server != kube.server and other.startup_seconds < 120
        other.create_node("only-here")
        assert [n["metadata"]["name"] for n in kube.admin.get("/api/v1/nodes").ok().body["items"]] == []
        assert processes_of(other)
        port = int(other.server.rsplit(":", 1)[1])
    assert processes_of(other) == []
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
