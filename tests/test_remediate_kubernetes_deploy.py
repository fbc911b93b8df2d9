"""The remediator as the chart and the kustomize variant ship it: off by default, dry-run until told
to act, every object valid for Kubernetes (kubernetes-validate, offline) and the Prometheus
Operator, a configuration the remediator accepts, pods no selector of the agent's picks up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from clusterhealth.fleet.remediate import config as remediate_config

from .conftest import ROOT
from .test_kubernetes import KUBERNETES_VERSION, kustomize, render, validate_crds

ON = ("--set", "remediator.enabled=true", "--set", "remediator.prometheus=http://prometheus:9090")


def remediator(*args: str) -> dict[str, dict[str, Any]]:
    objects = [
        o
        for o in render(*ON, *args)
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "remediator"
    ]
    by_kind = {o["kind"]: o for o in objects if o["kind"] not in ("Role", "RoleBinding")}
    for o in objects:
        if o["kind"] in ("Role", "RoleBinding"):
            by_kind[f"{o['kind']}/{o['metadata']['name']}"] = o
    return by_kind


def test_the_remediator_is_off_by_default() -> None:
    assert not [o for o in render() if "remediator" in o["metadata"]["name"]]


def test_every_remediator_object_validates() -> None:
    objects = remediator("--set", "remediator.act=true", "--set", "remediator.config.kubernetes.evict=true")
    name = "gpu-health-clusterhealth-remediator"
    assert set(objects) == {
        "ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
        "ServiceMonitor", f"Role/{name}", f"RoleBinding/{name}",
        f"Role/{name}-events", f"RoleBinding/{name}-events",
    }  # fmt: skip
    for name, obj in objects.items():
        if name != "ServiceMonitor":
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    result = validate_crds([objects["ServiceMonitor"]])
    assert result.returncode == 0 and json.loads(result.stdout)["valid"], result.stdout + result.stderr


def test_dry_run_until_act_then_two_replicas_holding_one_lease() -> None:
    dry = remediator()["Deployment"]
    pod = dry["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:2] == ["remediate", "--backend=kubernetes"]
    assert "--prometheus=http://prometheus:9090" in container["args"] and "--act" not in container["args"]
    assert dry["spec"]["replicas"] == 1  # dry-run takes no Lease: a second would post every Event again
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == "gpu-health-clusterhealth-remediator"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    acting = remediator("--set", "remediator.act=true")["Deployment"]
    assert "--act" in acting["spec"]["template"]["spec"]["containers"][0]["args"]
    assert acting["spec"]["replicas"] == 2


def test_the_configmap_is_a_configuration_the_remediator_accepts(tmp_path: Path) -> None:
    objects = remediator("--set", "remediator.config.kubernetes.taint=true")
    path = tmp_path / "remediate.yaml"
    path.write_text(objects["ConfigMap"]["data"]["remediate.yaml"])
    loaded = remediate_config.load(path)
    assert loaded.kubernetes.lease_name == "gpu-health-clusterhealth-remediator"
    assert loaded.kubernetes.taint is True and loaded.kubernetes.evict is False
    assert loaded.budget.max_unavailable == 1
    mount = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["mountPath"] + "/remediate.yaml" == remediate_config.DEFAULT_PATH
    # The Lease the Role lets it renew is the one its configuration names.
    lease_rule = next(
        r for r in objects["Role/gpu-health-clusterhealth-remediator"]["rules"] if "resourceNames" in r
    )
    assert lease_rule["resourceNames"] == [loaded.kubernetes.lease_name]


def test_no_selector_of_the_agents_picks_up_the_remediators_pods() -> None:
    """The agent's headless Service (scraped on 9845) and DaemonSet would otherwise count the
    remediator's pods as agents: a target down for Prometheus."""
    everything = {o["kind"] + "/" + o["metadata"]["name"]: o for o in render(*ON)}
    pod_labels = everything["Deployment/gpu-health-clusterhealth-remediator"]["spec"]["template"]["metadata"][
        "labels"
    ]
    agent_service = everything["Service/gpu-health-clusterhealth"]["spec"]["selector"]
    agent_pods = everything["DaemonSet/gpu-health-clusterhealth"]["spec"]["selector"]["matchLabels"]
    monitor = everything["ServiceMonitor/gpu-health-clusterhealth"]["spec"]["selector"]["matchLabels"]
    remediator_service = everything["Service/gpu-health-clusterhealth-remediator"]["metadata"]["labels"]
    assert not agent_service.items() <= pod_labels.items()
    assert not agent_pods.items() <= pod_labels.items()
    assert not monitor.items() <= remediator_service.items()
    own = everything["Service/gpu-health-clusterhealth-remediator"]["spec"]["selector"]
    assert own.items() <= pod_labels.items()


def test_the_kustomize_variant_is_the_charts_rendering_and_validates() -> None:
    generator = ROOT / "deploy" / "kubernetes" / "manifests.py"
    result = subprocess.run([sys.executable, str(generator), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + "run `make generate`"
    objects = kustomize("remediator")
    assert sorted(o["kind"] for o in objects) == sorted(
        ["ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role", "Role", "RoleBinding",
         "RoleBinding", "Deployment", "Service"]
    )  # fmt: skip
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert "app.kubernetes.io/managed-by" not in obj["metadata"]["labels"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert "--act" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    rules = next(o for o in objects if o["kind"] == "ClusterRole")["rules"]
    assert all(not r["resources"][0].startswith("pods") for r in rules)


def test_the_documented_overlay_points_at_another_prometheus_and_acts(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "remediation.md").read_text()
    start = text.index("# kustomization.yaml of your remediator overlay")
    overlay = text[start : text.index("```", start)]
    (tmp_path / "clusterhealth").symlink_to(ROOT)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(overlay)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), "kustomize", str(tmp_path / "mine")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    objects = {o["kind"] + "/" + o["metadata"]["name"]: o for o in yaml.safe_load_all(result.stdout) if o}
    (container,) = objects["Deployment/clusterhealth-remediator"]["spec"]["template"]["spec"]["containers"]
    assert "--act" in container["args"]
    assert "--prometheus=http://prometheus.example.svc:9090" in container["args"]
    assert objects["Deployment/clusterhealth-remediator"]["spec"]["replicas"] == 2
    assert objects["Role/clusterhealth-remediator-events"]["metadata"]["namespace"] == "default"
    kubernetes_validate.validate(
        objects["Deployment/clusterhealth-remediator"], KUBERNETES_VERSION, strict=True
    )


def test_the_remediators_image_is_the_one_make_image_remediator_builds_with_the_client_pinned() -> None:
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    (container,) = remediator()["Deployment"]["spec"]["template"]["spec"]["containers"]
    database = subprocess.run(["make", "-s", "-n", "-p", "-C", str(ROOT)], capture_output=True, text=True)
    (image,) = [
        line.split(" = ", 1)[1]
        for line in database.stdout.splitlines()
        if line.startswith("REMEDIATOR_IMAGE = ")
    ]
    chart = yaml.safe_load(
        (ROOT / "deploy" / "kubernetes" / "helm" / "clusterhealth" / "Chart.yaml").read_text()
    )
    version = chart["appVersion"]
    assert image.replace("$(VERSION)", version) == container["image"] == f"clusterhealth-remediate:{version}"
    recipe = subprocess.run(
        ["make", "-s", "-n", "-C", str(ROOT), "image-remediator", "BUILDAH=echo buildah"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "--build-arg EXTRAS=[kubernetes]" in recipe
    assert '"clusterhealth${EXTRAS}==${VERSION}"' in (ROOT / "Containerfile").read_text()
    pins = {}
    for line in (ROOT / "deploy" / "container" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split()[0].split("==")
            pins[canonicalize_name(name)] = version
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "kubernetes"
    ]
    for spec in extra:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins and requirement.specifier.contains(pins[name]), spec
