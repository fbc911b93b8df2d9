"""The Helm chart: `helm lint` is clean, `helm template` renders it, every object validates against
Kubernetes' own schemas (kubernetes-validate, offline) or the Prometheus Operator's CRD schemas
(@kubernetes-models/prometheus-operator, under node), and the rendered objects hold what a GPU node
needs. The kustomize bases are the chart's rendering, as `kubectl kustomize` builds them."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .conftest import CLUSTERHEALTH
from .dist import VERSION
from .mixin import ROOT, mixin

CHART = ROOT / "deploy" / "kubernetes" / "helm" / "clusterhealth"
K8S_TOOLS = ROOT / "tests" / "k8s"
KUBERNETES_VERSION = "1.33.0"


def helm() -> str:
    path = Path(sys.executable).parent / "helm"
    if not path.exists():
        pytest.fail("helm is missing: `make test` installs it (make k8s-tools)")
    return str(path)


def render(*args: str) -> list[dict[str, Any]]:
    return render_release("gpu-health", *args)


def render_release(release: str, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [helm(), "template", release, str(CHART), "--namespace", "monitoring", *args],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    rendered = render()
    by_kind = {o["kind"]: o for o in rendered}
    assert len(by_kind) == len(rendered)
    return by_kind


def test_helm_lint_is_clean() -> None:
    result = subprocess.run([helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, result.stdout + result.stderr


def test_the_chart_renders_the_objects_a_daemonset_needs(objects: dict[str, dict[str, Any]]) -> None:
    assert set(objects) == {
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "DaemonSet",
        "ServiceMonitor",
        "PrometheusRule",
    }


def test_core_objects_validate_against_the_kubernetes_schemas(objects: dict[str, dict[str, Any]]) -> None:
    for obj in objects.values():
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)  # raises on an error


def test_the_kubernetes_schema_check_can_fail(objects: dict[str, dict[str, Any]]) -> None:
    broken = json.loads(json.dumps(objects["DaemonSet"]))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def validate_crds(objects: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None or not (K8S_TOOLS / "node_modules").is_dir():
        pytest.fail("node or tests/k8s/node_modules is missing: `make test` installs them (make k8s-tools)")
    return subprocess.run(
        [node, "validate.mjs"], input=json.dumps(objects), capture_output=True, text=True, cwd=K8S_TOOLS
    )


def test_operator_objects_validate_against_the_prometheus_operator_crds(
    objects: dict[str, dict[str, Any]],
) -> None:
    result = validate_crds([objects["ServiceMonitor"], objects["PrometheusRule"]])
    assert result.returncode == 0, result.stdout + result.stderr
    assert [json.loads(line)["valid"] for line in result.stdout.splitlines()] == [True, True]


def test_the_crd_check_can_fail(objects: dict[str, dict[str, Any]]) -> None:
    broken = json.loads(json.dumps(objects["PrometheusRule"]))
    broken["spec"]["groups"][0]["rules"][0]["record"] = 7
    result = validate_crds([broken])
    assert result.returncode == 1 and "must be string" in result.stdout


def test_the_daemonset_mounts_the_host_read_only_and_reaches_the_gpus(
    objects: dict[str, dict[str, Any]],
) -> None:
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["sys"]["hostPath"] == {"path": "/sys", "type": "Directory"}
    assert mounts["sys"] == {"name": "sys", "mountPath": "/host/sys", "readOnly": True}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mounts["kmsg"]["readOnly"] is True and mounts["config"]["readOnly"] is True
    assert "--sysfs-root=/host/sys" in container["args"] and "--kmsg-path=/dev/kmsg" in container["args"]
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    # A monitoring agent must not take a GPU away from jobs.
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert container["resources"]["requests"] == {"cpu": "20m", "memory": "64Mi"}
    assert container["resources"]["limits"]["memory"] == "256Mi"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["automountServiceAccountToken"] is False


def test_job_attribution_mounts_the_kubelet_socket_and_the_hosts_proc_read_only(
    objects: dict[str, dict[str, Any]],
) -> None:
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["pod-resources"]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "Directory",
    }
    # At the kubelet's own path, where the agent's --pod-resources-socket default looks.
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    assert volumes["proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert mounts["proc"] == {"name": "proc", "mountPath": "/host/proc", "readOnly": True}
    assert "--procfs-root=/host/proc" in container["args"]
    off = next(
        o
        for o in render("--set", "jobs.podResources=false", "--set", "jobs.hostProc=false")
        if o["kind"] == "DaemonSet"
    )
    (bare,) = off["spec"]["template"]["spec"]["containers"]
    assert {m["name"] for m in bare["volumeMounts"]}.isdisjoint({"pod-resources", "proc"})
    assert not any(a.startswith("--procfs-root") for a in bare["args"])
    kubernetes_validate.validate(off, KUBERNETES_VERSION, strict=True)


def test_the_default_image_is_the_one_make_image_builds(objects: dict[str, dict[str, Any]]) -> None:
    """repository:tag = clusterhealth:<appVersion> = make image's default IMAGE for the package version."""
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    database = subprocess.run(["make", "-s", "-n", "-p", "-C", str(ROOT)], capture_output=True, text=True)
    (image,) = [
        line.split(" = ", 1)[1] for line in database.stdout.splitlines() if line.startswith("IMAGE = ")
    ]
    assert image.replace("$(VERSION)", VERSION) == container["image"] == f"clusterhealth:{VERSION}"
    assert "pip install clusterhealth" not in (CHART / "values.yaml").read_text()


def test_unprivileged_mode_keeps_only_the_syslog_and_ipc_lock_capabilities() -> None:
    daemonset = next(o for o in render("--set", "privileged=false") if o["kind"] == "DaemonSet")
    context = daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG", "IPC_LOCK"]}
    kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def deploy_doc_command(heading: str) -> list[str]:
    """The helm command of a section of docs/deploy.md, as argv after `helm install|upgrade`."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split(f"\n### {heading}\n", 1)[1].split("\n#", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[0] == "helm" and argv[1] in ("install", "upgrade"), argv
    return [a for a in argv[2:] if a != "--install"]


def test_the_documented_unprivileged_install_runs_the_agent_without_the_kernel_log(tmp_path: Path) -> None:
    """docs/deploy.md, "Privileged, or not": its command renders a container with no privilege but
    SYSLOG and IPC_LOCK, and a config the agent accepts with the kernel-log collector off."""
    release, chart, *args = deploy_doc_command("Privileged, or not")
    assert Path(ROOT / chart) == CHART
    by_kind = {o["kind"]: o for o in render_release(release, *args)}
    context = by_kind["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG", "IPC_LOCK"]}
    config = tmp_path / "clusterhealth.yaml"
    config.write_text(by_kind["ConfigMap"]["data"]["clusterhealth.yaml"])
    printed = subprocess.run(
        [CLUSTERHEALTH, "agent", "--config", str(config), "--print-config"], capture_output=True, text=True
    )
    assert printed.returncode == 0, printed.stderr
    effective = yaml.safe_load(printed.stdout)
    assert effective["collectors"]["kernel_log"]["enabled"] is False
    assert effective["collectors"]["gpu"]["enabled"] is True
    # By default: privileged, the kernel log on.
    default = {o["kind"]: o for o in render_release(release)}
    assert default["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"]
    assert "kernel_log" not in default["ConfigMap"]["data"]["clusterhealth.yaml"]


def test_the_documented_host_network_switch_gives_the_pods_the_nodes_network() -> None:
    release, _chart, *args = deploy_doc_command("The host's network")
    daemonset = next(o for o in render_release(release, *args) if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def test_service_and_servicemonitor_select_the_daemonsets_pods(objects: dict[str, dict[str, Any]]) -> None:
    pod_labels = objects["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    service = objects["Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9845, "targetPort": "metrics", "protocol": "TCP"}
    ]
    monitor = objects["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["endpoints"][0]["port"] == "metrics"
    # The job label comes from the Service's app.kubernetes.io/name: job="clusterhealth", the
    # job the rules select, whatever the release is called ("gpu-health" here).
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "clusterhealth"
    assert mixin.Config().selector == 'job="clusterhealth"'


def test_the_prometheusrule_holds_the_generated_rules(objects: dict[str, dict[str, Any]]) -> None:
    chart_copy = CHART / "files" / "clusterhealth-rules.yaml"
    assert chart_copy.read_text() == mixin.RULES_FILE.read_text(), "run `make generate`"
    assert objects["PrometheusRule"]["spec"] == yaml.safe_load(mixin.RULES_FILE.read_text())


def test_the_configmap_is_a_config_the_agent_accepts(
    objects: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    config = tmp_path / "clusterhealth.yaml"
    config.write_text(objects["ConfigMap"]["data"]["clusterhealth.yaml"])
    result = subprocess.run(
        [CLUSTERHEALTH, "agent", "--config", str(config), "--print-config"], capture_output=True
    )
    assert result.returncode == 0, result.stderr
    mounted = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--config=/etc/clusterhealth/clusterhealth.yaml" in mounted


def test_a_pairwise_group_gets_the_hosts_network_and_its_members_file(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "hostNetwork": True,
                "members": {"gpu-001": "10.1.0.1", "gpu-002": "10.1.0.2"},
                "config": {
                    "pairwise_groups": [
                        {
                            "name": "fabric",
                            "members_file": "/etc/clusterhealth/members.yaml",
                            "server_argv": ["iperf3", "-s", "-1", "-B", "{address}", "-p", "{port}", "-J"],
                            "client_argv": [
                                "iperf3",
                                "-c",
                                "{peer}",
                                "-B",
                                "{address}",
                                "-p",
                                "{port}",
                                "-J",
                            ],
                        }
                    ]
                },
            }
        )
    )
    by_kind = {o["kind"]: o for o in render("--values", str(values))}
    for kind in ("DaemonSet", "ConfigMap"):
        kubernetes_validate.validate(by_kind[kind], KUBERNETES_VERSION, strict=True)
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/clusterhealth"
    data = by_kind["ConfigMap"]["data"]
    # The agent accepts the rendered pair of files, as gpu-001 (the members file at its mount path).
    (tmp_path / "members.yaml").write_text(data["members.yaml"])
    config = yaml.safe_load(data["clusterhealth.yaml"])
    config["pairwise_groups"][0]["members_file"] = str(tmp_path / "members.yaml")
    (tmp_path / "clusterhealth.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [CLUSTERHEALTH, "agent", "--config", str(tmp_path / "clusterhealth.yaml"), "--print-config"],
        capture_output=True,
        text=True,
        env={**os.environ, "NODE_NAME": "gpu-001"},
    )
    assert result.returncode == 0, result.stderr
    assert "gpu-002: 10.1.0.2" in result.stdout and "node_name: gpu-001" in result.stdout
    # Without a group, the pods keep their own network.
    plain = {o["kind"]: o for o in render()}["DaemonSet"]["spec"]["template"]["spec"]
    assert "hostNetwork" not in plain


def test_monitoring_objects_can_be_left_out() -> None:
    kinds = {o["kind"] for o in render("--set", "serviceMonitor.enabled=false,prometheusRule.enabled=false")}
    assert kinds == {"ServiceAccount", "ConfigMap", "Service", "DaemonSet"}


def test_a_web_config_secret_secures_the_endpoint_and_its_probes() -> None:
    secured = render(
        "--set",
        "webConfig.secretName=clusterhealth-web,webConfig.scheme=HTTPS,serviceMonitor.scheme=https",
        "--set",
        "serviceMonitor.tlsConfig.ca.secret.name=clusterhealth-web,serviceMonitor.tlsConfig.ca.secret.key=ca.crt",
        "--set",
        "serviceMonitor.basicAuth.username.name=scrape,serviceMonitor.basicAuth.username.key=user",
        "--set",
        "serviceMonitor.basicAuth.password.name=scrape,serviceMonitor.basicAuth.password.key=password",
    )
    by_kind = {o["kind"]: o for o in secured}
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--web-config-file=/etc/clusterhealth/web/web-config.yml" in container["args"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "web-config")
    assert mount == {"name": "web-config", "mountPath": "/etc/clusterhealth/web", "readOnly": True}
    volume = next(v for v in pod["volumes"] if v["name"] == "web-config")
    assert volume["secret"] == {"secretName": "clusterhealth-web", "defaultMode": 0o400}
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    endpoint = by_kind["ServiceMonitor"]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "clusterhealth-web", "key": "ca.crt"}}}
    assert endpoint["basicAuth"]["password"] == {"name": "scrape", "key": "password"}
    kubernetes_validate.validate(by_kind["DaemonSet"], KUBERNETES_VERSION, strict=True)
    result = validate_crds([by_kind["ServiceMonitor"]])
    assert result.returncode == 0 and json.loads(result.stdout)["valid"], result.stdout + result.stderr
    default = next(o for o in render() if o["kind"] == "DaemonSet")
    plain = default["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--web-config-file") for a in plain["args"])


def kubectl() -> str:
    path = Path(sys.executable).parent / "kubectl"
    if not path.exists():
        pytest.fail("kubectl is missing: `make test` installs it (make k8s-tools)")
    return str(path)


def kustomize(folder: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "deploy" / "kubernetes" / "kustomize" / folder)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def without_helm(obj: dict[str, Any]) -> dict[str, Any]:
    """A chart object as the kustomize bases hold it: without Helm's labels and config checksum."""
    obj = json.loads(json.dumps(obj))
    metadatas = [obj["metadata"]]
    if obj["kind"] == "DaemonSet":
        metadatas.append(obj["spec"]["template"]["metadata"])
        del obj["spec"]["template"]["metadata"]["annotations"]
    for metadata in metadatas:
        metadata["labels"].pop("app.kubernetes.io/managed-by", None)
        metadata["labels"].pop("helm.sh/chart", None)
    return obj


def test_the_kustomize_bases_are_the_charts_current_rendering() -> None:
    generator = ROOT / "deploy" / "kubernetes" / "manifests.py"
    result = subprocess.run(
        [sys.executable, str(generator), "--helm", helm(), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr + "run `make generate`"


def test_the_kustomize_base_holds_the_charts_objects_and_validates() -> None:
    base = kustomize("base")
    chart = [o for o in render_release("clusterhealth") if not o["apiVersion"].startswith("monitoring.")]
    assert sorted(o["kind"] for o in base) == sorted(o["kind"] for o in chart)
    by_kind = {o["kind"]: o for o in base}
    for obj in chart:
        assert by_kind[obj["kind"]] == without_helm(obj), obj["kind"]
    for obj in base:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        assert obj["metadata"]["namespace"] == "monitoring"
        assert "app.kubernetes.io/managed-by" not in obj["metadata"]["labels"]


def test_the_prometheus_operator_overlay_adds_the_monitor_and_the_rules() -> None:
    objects = {o["kind"]: o for o in kustomize("prometheus-operator")}
    assert set(objects) == {o["kind"] for o in render()}
    assert objects["PrometheusRule"]["spec"] == yaml.safe_load(mixin.RULES_FILE.read_text())
    result = validate_crds([objects["ServiceMonitor"], objects["PrometheusRule"]])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_deploy_pages_overlay_sets_the_image_and_the_config(tmp_path: Path) -> None:
    readme = (ROOT / "docs" / "deploy.md").read_text()
    start = readme.index("# kustomization.yaml of your overlay")
    overlay = readme[start : readme.index("```", start)]
    checkout = tmp_path / "clusterhealth"
    checkout.symlink_to(ROOT)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(overlay)
    result = subprocess.run([kubectl(), "kustomize", str(tmp_path / "mine")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    objects = {o["kind"]: o for o in yaml.safe_load_all(result.stdout) if o}
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/clusterhealth:0.2.0"
    config = tmp_path / "clusterhealth.yaml"
    config.write_text(objects["ConfigMap"]["data"]["clusterhealth.yaml"])
    accepted = subprocess.run(
        [CLUSTERHEALTH, "agent", "--config", str(config), "--print-config"], capture_output=True, text=True
    )
    assert accepted.returncode == 0, accepted.stderr
    kubernetes_validate.validate(objects["DaemonSet"], KUBERNETES_VERSION, strict=True)
