"""The Kubernetes backend of `clusterhealth remediate` driven against the real API of tests/kube.py:
a backend opened on a kubeconfig, and one reconcile carried out as the remediator's loop does it
(lead, observe, decide, the orders, tend), with verdicts given by the test."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterhealth.agent.settings import from_mapping
from clusterhealth.fleet.remediate.backend import FORGET, RELEASE, TAKEN_OVER, Lead
from clusterhealth.fleet.remediate.config import RemediateConfig
from clusterhealth.fleet.remediate.engine import Plan, Seen, decide
from clusterhealth.fleet.remediate.kubernetes import KubernetesBackend, open_backend

from .kube import KubeAPI

NAMESPACE = "clusterhealth"
FOREVER = 1e9


def settings(**overrides: Any) -> dict[str, Any]:
    """A configuration that acts at once: no hold, no settle, no slow start, a wide budget."""
    data: dict[str, Any] = {
        "interval_seconds": 1,
        "hold_seconds": 0,
        "settle_seconds": 0,
        "budget": {"max_unavailable": 50, "max_unavailable_per_domain": 50, "slow_start": False},
        "kubernetes": {"namespace": NAMESPACE},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def open_kube(
    kube: KubeAPI, tmp_path: Path, *, token: str | None = None, dry_run: bool = False, **overrides: Any
) -> KubernetesBackend:
    """A backend on the test's API, as the admin unless told a token."""
    kube.admin.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})  # 409 when there
    path = tmp_path / f"kubeconfig-{len(list(tmp_path.glob('kubeconfig-*')))}"
    kube.kubeconfig(path, token)
    data = settings(**overrides)
    data["kubernetes"] = {**data["kubernetes"], "kubeconfig": str(path)}
    config = from_mapping(RemediateConfig, data, "test")
    return open_backend(config, dry_run)


def sick(node: str, action: str = "reset_gpu", evidence: str = "gpu_xid 3") -> Seen:
    return Seen(node, "unhealthy", action, FOREVER, evidence)


def healthy(node: str) -> Seen:
    return Seen(node, "healthy", "none", FOREVER)


def recovering(node: str, seconds: float) -> Seen:
    """Healthy for that long: not yet settled."""
    return Seen(node, "healthy", "none", seconds)


def step(backend: KubernetesBackend, seen: Mapping[str, Seen], now: float) -> Plan:
    """One reconcile as the remediator carries it out (fleet/remediate/reconcile.py), with the
    verdicts given: dry-run takes no Lease and says what it would do; a follower acts on nothing."""
    lead = backend.lead() if not backend.dry_run else Lead(False, "dry-run")
    observation = backend.observe(now)
    plan = decide(now, backend.config, seen, observation.nodes, backend.can_reboot)
    for order in plan.orders:
        view = observation.nodes[order.node]
        if not lead.leader:
            if order.operation != FORGET:
                backend.would(view, order, now)
        elif order.operation == FORGET:
            assert view.orphan is not None
            backend.forget(view.orphan, TAKEN_OVER, now)
        elif order.operation == RELEASE:
            assert view.ours is not None
            backend.release(view, view.ours, now)
        else:
            backend.quarantine(view, order, now)
    if lead.leader:
        backend.tend(plan, now)
    return plan


def events(kube: KubeAPI, node: str | None = None) -> list[dict[str, Any]]:
    items = kube.admin.get("/api/v1/namespaces/default/events").ok().body["items"]
    return [e for e in items if node is None or e["involvedObject"]["name"] == node]


def reasons(kube: KubeAPI, node: str | None = None) -> list[str]:
    return [e["reason"] for e in sorted(events(kube, node), key=lambda e: e["metadata"]["name"])]


def pod(
    kube: KubeAPI, name: str, node: str, *, namespace: str = "default", gpus: int = 1,
    labels: dict[str, str] | None = None, phase: str = "Running",
) -> dict[str, Any]:  # fmt: skip
    """A pod on the node, as the scheduler placed it and the kubelet reported it."""
    kube.admin.post("/api/v1/namespaces", {"metadata": {"name": namespace}})
    resources = {"limits": {"nvidia.com/gpu": str(gpus)} if gpus else {"cpu": "4", "memory": "16Gi"}}
    body = {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "train", "image": "trainer", "resources": resources}],
        },
    }
    kube.admin.post(f"/api/v1/namespaces/{namespace}/pods", body).ok()
    status = {"status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}}
    created: dict[str, Any] = (
        kube.admin.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", status).ok().body
    )
    return created
