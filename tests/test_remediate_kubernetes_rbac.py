"""The chart's RBAC for the remediator is what it needs, all of it and no more: its Roles and
ClusterRole, rendered by helm and applied to a real kube-apiserver 1.20, bound to the harness's
`clusterhealth-remediator` identity, under which the remediator runs a whole cycle (the Lease,
a cordon with its conditions and Event, evictions, a release); without any one of the verbs it
grants, that cycle fails."""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterhealth.fleet.remediate.backend import BackendError

from .kube import REMEDIATOR, KubeAPI, condition, helm_template
from .remediate_kube import NAMESPACE, healthy, open_kube, pod, reasons, sick, step

# The least RBAC, as docs/remediation.md lists it: (object, resource, verb).
GRANTS = [
    ("ClusterRole", "nodes", "get"),
    ("ClusterRole", "nodes", "list"),
    ("ClusterRole", "nodes", "patch"),
    ("ClusterRole", "nodes/status", "patch"),
    ("ClusterRole", "pods", "list"),
    ("ClusterRole", "pods/eviction", "create"),
    ("Role", "leases", "create"),
    ("Role", "leases", "get"),
    ("Role", "leases", "update"),
    ("Role", "events", "create"),
]


def rbac(*values: str) -> list[dict[str, Any]]:
    return copy.deepcopy(_rbac(*values))


@functools.cache
def _rbac(*values: str) -> list[dict[str, Any]]:
    objects = helm_template(
        "--namespace", NAMESPACE, "--set", "remediator.enabled=true",
        "--set", "remediator.prometheus=http://prometheus:9090", *values,
    )  # fmt: skip
    return [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io/")]


def grants(objects: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted(
        (o["kind"], resource, verb)
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
        for rule in o["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )


def as_the_harness_identity(kube: KubeAPI, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bindings' subject (the chart's ServiceAccount, whose token no controller here issues)
    becomes the harness's static-token user; the release's namespace is made."""
    kube.admin.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for o in objects:
        if o["kind"].endswith("Binding"):
            o["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": REMEDIATOR}]
    return objects


def test_the_chart_grants_exactly_the_least_rbac() -> None:
    assert grants(rbac("--set", "remediator.config.kubernetes.evict=true")) == sorted(GRANTS)
    # Without evictions, no pod is read or evicted.
    assert grants(rbac()) == sorted(g for g in GRANTS if not g[1].startswith("pods"))
    # The Lease's get and update are limited to its name; events to `default`.
    roles = {o["metadata"]["name"]: o for o in rbac() if o["kind"] == "Role"}
    lease_role = roles["clusterhealth-remediator"]
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert {"resourceNames": ["clusterhealth-remediator"], "verbs": ["get", "update"]}.items() <= next(
        r for r in lease_role["rules"] if "resourceNames" in r
    ).items()
    assert roles["clusterhealth-remediator-events"]["metadata"]["namespace"] == "default"


def cycle(kube: KubeAPI, tmp_path: Path) -> None:
    """Everything the remediator does in a life, under its own identity."""
    kube.create_node("gpu-1")
    kube.create_node("gpu-2")
    pod(kube, "train-0", "gpu-1", namespace="team-a")
    config = chart_config()
    backend = open_kube(
        kube, tmp_path, token=kube.remediator_token,
        kubernetes={**config["kubernetes"], "evict_after_seconds": 0},
    )  # fmt: skip
    now = time.time()
    step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": healthy("gpu-2")}, now)
    step(backend, {"gpu-1": sick("gpu-1"), "gpu-2": healthy("gpu-2")}, now + 1)
    step(backend, {"gpu-1": healthy("gpu-1"), "gpu-2": healthy("gpu-2")}, now + 2)
    backend.close()


@functools.cache
def chart_config() -> dict[str, Any]:
    """The remediator's configuration as the chart's ConfigMap holds it, eviction on."""
    config: dict[str, Any] = yaml.safe_load(
        next(
            o
            for o in helm_template(
                "--namespace", NAMESPACE, "--set", "remediator.enabled=true",
                "--set", "remediator.prometheus=http://prometheus:9090",
                "--set", "remediator.config.kubernetes.evict=true",
                "--show-only", "templates/remediator.yaml",
            )
            if o["kind"] == "ConfigMap"
        )["data"]["remediate.yaml"]
    )  # fmt: skip
    return config


def test_the_remediator_runs_under_the_charts_rbac(kube: KubeAPI, tmp_path: Path) -> None:
    kube.apply(as_the_harness_identity(kube, rbac("--set", "remediator.config.kubernetes.evict=true")))
    cycle(kube, tmp_path)
    node = kube.node("gpu-1")
    assert not node["spec"].get("unschedulable") and condition(node, "GPUProblem") is None
    assert reasons(kube, "gpu-1") == ["Quarantined", "Evicting", "Released"]
    evicted = kube.admin.get("/api/v1/namespaces/team-a/pods/train-0").ok().body
    assert "deletionTimestamp" in evicted["metadata"]
    lease = kube.admin.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/clusterhealth-remediator"
    )
    assert lease.ok().body["metadata"]["annotations"]["remediate.clusterhealth.io/history"]


@pytest.mark.parametrize(("kind", "resource", "verb"), GRANTS, ids=["-".join(g) for g in GRANTS])
def test_without_any_one_verb_the_remediator_fails(
    kube: KubeAPI, tmp_path: Path, kind: str, resource: str, verb: str
) -> None:
    objects = as_the_harness_identity(kube, rbac("--set", "remediator.config.kubernetes.evict=true"))
    for o in objects:
        if o["kind"] == kind:
            for rule in o["rules"]:
                if resource in rule["resources"] and verb in rule["verbs"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != verb]
            o["rules"] = [r for r in o["rules"] if r["verbs"]]
    kube.apply(objects)
    with pytest.raises(BackendError, match=f'cannot {verb} resource "{resource}"'):
        cycle(kube, tmp_path)
