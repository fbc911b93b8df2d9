"""End to end on Kubernetes: verdicts in a real Prometheus → `clusterhealth remediate --backend
kubernetes --once` (the command, as a process) under the chart's RBAC → a real kube-apiserver 1.20,
where the test reads back the cordon, the condition, the Events and the eviction of the pod that
uses the node's GPUs.

The verdicts are backfilled up to now (tests/verdict_tsdb.py), so the command reads them with its
own clock: gpu-1 unhealthy (reset_gpu, its gpu_xid check CRITICAL) for the last 20 minutes, gpu-2
healthy, and ghost, a node the API does not know, unhealthy."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .conftest import CLUSTERHEALTH
from .kube import KubeAPI, condition
from .remediate_kube import NAMESPACE, events, pod
from .test_remediate_kubernetes_rbac import as_the_harness_identity, rbac
from .verdict_tsdb import Span, Target, backfill, openmetrics, serve


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Up to now, when the test runs (not when the module is collected): the command's clock is real.
    now = time.time()
    begin, end = now - 3600, now + 1
    targets = [
        Target(
            "gpu-1:9845", "gpu-1",
            (Span(begin, now - 1200, "healthy", "none"), Span(now - 1200, end, "unhealthy", "reset_gpu")),
            checks=(("gpu_xid", "3", 2),),
        ),
        Target("gpu-2:9845", "gpu-2", (Span(begin, end, "healthy", "none"),)),
        Target("ghost:9845", "ghost", (Span(begin, end, "unhealthy", "replace"),)),
    ]  # fmt: skip
    root = tmp_path_factory.mktemp("remediate-kube")
    with serve(root, backfill(root, openmetrics(targets))) as url:
        yield url


def remediate(url: str, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLUSTERHEALTH, "remediate", "--prometheus", url, "--backend", "kubernetes", "--config", str(config),
         "--once", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_verdict_in_prometheus_cordons_the_node_with_its_condition_and_event(
    kube: KubeAPI, tmp_path: Path, prometheus: str
) -> None:
    kube.create_node("gpu-1")
    kube.create_node("gpu-2")
    pod(kube, "train-0", "gpu-1", namespace="team-a")
    kube.apply(as_the_harness_identity(kube, rbac("--set", "remediator.config.kubernetes.evict=true")))
    config = tmp_path / "remediate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "hold_seconds": 300,
                "kubernetes": {
                    "kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig", kube.remediator_token)),
                    "namespace": NAMESPACE,
                    "lease_name": "clusterhealth-remediator",
                    "evict": True,
                    "evict_after_seconds": 0,
                },
            }
        )
    )
    before = kube.node("gpu-1")["metadata"]["resourceVersion"]

    dry = remediate(prometheus, config)
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert (
        "deletionTimestamp"
        not in kube.admin.get("/api/v1/namespaces/team-a/pods/train-0").ok().body["metadata"]
    )
    assert "would quarantine gpu-1: clusterhealth: reset_gpu: gpu_xid 3" in dry.stdout
    assert "unknown_node ghost" in dry.stdout
    assert kube.node("gpu-1")["metadata"]["resourceVersion"] == before
    assert [e["reason"] for e in events(kube, "gpu-1")] == ["WouldQuarantine"]

    done = remediate(prometheus, config, "--act")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "quarantine gpu-1: clusterhealth: reset_gpu: gpu_xid 3" in done.stdout
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    problem = condition(node, "GPUProblem")
    assert problem is not None
    assert (problem["status"], problem["reason"], problem["message"]) == (
        "True", "reset_gpu", "clusterhealth: reset_gpu: gpu_xid 3",
    )  # fmt: skip
    assert condition(node, "Ready")["status"] == "True"  # type: ignore[index]
    assert sorted(e["reason"] for e in events(kube, "gpu-1")) == [
        "Evicting",
        "Quarantined",
        "WouldQuarantine",
    ]
    # The reconcile tended its act: no grace asked, the pod on the node's GPUs evicted.
    evicted = kube.admin.get("/api/v1/namespaces/team-a/pods/train-0").ok().body
    assert "deletionTimestamp" in evicted["metadata"]
    assert not kube.node("gpu-2")["spec"].get("unschedulable")
    # The command gave the Lease up as it ended.
    lease = kube.admin.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/clusterhealth-remediator"
    )
    assert "holderIdentity" not in lease.ok().body["spec"]

    # Again: nothing more to do (the node is ours, still sick) but the heartbeat.
    again = remediate(prometheus, config, "--act")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "quarantined gpu-1" in again.stdout
    beat = condition(kube.node("gpu-1"), "GPUProblem")
    assert beat is not None and beat["lastTransitionTime"] == problem["lastTransitionTime"]
    assert beat["lastHeartbeatTime"] >= problem["lastHeartbeatTime"]
    assert kube.node("gpu-1")["spec"]["unschedulable"] is True
