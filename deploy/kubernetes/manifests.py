"""Plain Kubernetes manifests and kustomize bases, rendered from the Helm chart with its defaults.

For clusters that deploy with `kubectl apply -k` (or Argo CD, Flux) rather than Helm:

- `kustomize/base/`: the ServiceAccount, ConfigMap, headless Service and DaemonSet, in namespace
  `monitoring`;
- `kustomize/prometheus-operator/`: the base plus the ServiceMonitor and the PrometheusRule;
- `kustomize/remediator/`: `clusterhealth remediate --backend kubernetes` (dry-run), its RBAC
  (eviction off) and its Service, for the Prometheus at `PROMETHEUS`.

The objects are `helm template clusterhealth <chart> --namespace monitoring` with the chart's
defaults, minus what only Helm uses (the `managed-by: Helm` and `helm.sh/chart` labels, the config
checksum that rolls the pods on `helm upgrade`, the `# Source:` lines); the chart's comments stay.
`make generate` writes them with the helm that `make test` installs; a test keeps them equal to a
fresh rendering.

    python deploy/kubernetes/manifests.py [--helm PATH] [--check]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHART = HERE / "helm" / "clusterhealth"
KUSTOMIZE = HERE / "kustomize"
BASE = KUSTOMIZE / "base" / "clusterhealth.yaml"
OPERATOR = KUSTOMIZE / "prometheus-operator" / "monitoring.yaml"
REMEDIATOR = KUSTOMIZE / "remediator" / "remediator.yaml"
# The Prometheus Operator's Service for a Prometheus in `monitoring`; an overlay changes it.
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
RELEASE = "clusterhealth"
NAMESPACE = "monitoring"

HEADER = (
    "# Generated from deploy/kubernetes/helm/clusterhealth by deploy/kubernetes/manifests.py\n"
    "# (`make generate`): edit the chart, not this file.\n# {what}\n"
)
# What only Helm uses: its ownership labels, and the pod annotation (with its comment) whose
# checksum rolls the pods on `helm upgrade`; the chart has no other pod annotation.
_HELM_ONLY = re.compile(
    r"^ *(app\.kubernetes\.io/managed-by: Helm|helm\.sh/chart: \S+)\n"
    r"|^ *annotations:\n(?: *#.*\n)* *checksum/config: \S+\n",
    re.MULTILINE,
)
_SOURCE = re.compile(r"^# Source: .*\n", re.MULTILINE)


def render(helm: str, *values: str) -> list[str]:
    """The chart's documents as `helm template` prints them, each without Helm's own lines."""
    result = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"helm template failed:\n{result.stderr}")
    documents = ("\n" + result.stdout).split("\n---\n")
    # Each line ends in a newline for the patterns, the document's last one too.
    return [_HELM_ONLY.sub("", _SOURCE.sub("", d + "\n")).strip("\n") for d in documents if d.strip("-\n ")]


def _kind(document: str) -> str:
    match = re.search(r"^kind: (\S+)$", document, re.MULTILINE)
    return match.group(1) if match else ""


def manifests(helm: str) -> dict[Path, str]:
    """The generated files and their contents."""
    core = render(helm, "--set", "serviceMonitor.enabled=false", "--set", "prometheusRule.enabled=false")
    everything = render(helm)
    operator = [d for d in everything if _kind(d) in ("ServiceMonitor", "PrometheusRule")]
    if {_kind(d) for d in core} & {"ServiceMonitor", "PrometheusRule"} or len(operator) != 2:
        raise SystemExit("the chart's serviceMonitor/prometheusRule switches no longer do what this expects")
    remediator = [
        d
        for d in render(
            helm, "--set", "remediator.enabled=true", "--set", f"remediator.prometheus={PROMETHEUS}",
            "--set", "serviceMonitor.enabled=false", "--set", "prometheusRule.enabled=false",
        )
        if "app.kubernetes.io/component: remediator" in d
    ]  # fmt: skip
    if {_kind(d) for d in remediator} != {"ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding",
                                          "Role", "RoleBinding", "Deployment", "Service"}:  # fmt: skip
        raise SystemExit("the chart's remediator objects are no longer those this expects")
    what_core = "The agent's objects; apply with `kubectl apply -k deploy/kubernetes/kustomize/base`."
    what_operator = "The ServiceMonitor and PrometheusRule, for the Prometheus Operator."
    what_remediator = (
        "The remediator, dry-run, eviction off (docs/remediation.md); `kubectl apply -k "
        "deploy/kubernetes/kustomize/remediator`."
    )
    return {
        BASE: HEADER.format(what=what_core) + "---\n" + "\n---\n".join(core) + "\n",
        OPERATOR: HEADER.format(what=what_operator) + "---\n" + "\n---\n".join(operator) + "\n",
        REMEDIATOR: HEADER.format(what=what_remediator) + "---\n" + "\n---\n".join(remediator) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--helm", default=str(Path(sys.executable).parent / "helm"), help="the helm binary")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in manifests(args.helm).items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print("stale, run `make generate`: " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
