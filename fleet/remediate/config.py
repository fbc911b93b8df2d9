"""The remediator's configuration file: one YAML document, validated once into the dataclasses below.

Declared like the agent's (agent/config.py): every key with `setting()` (checks/schema.py), read
with agent/yamlfile.py's hardened reader and checked by agent/settings.py's validator, so that a
bad file exits 2 naming the file, the key and what was expected. docs/remediation.md's reference
table is made from these declarations (`reference_markdown`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterhealth.agent.settings import from_mapping, reference
from clusterhealth.agent.yamlfile import read_yaml
from clusterhealth.checks.schema import setting
from clusterhealth.checks.verdict import STATES

DEFAULT_PATH = "/etc/clusterhealth/remediate.yaml"
DAY = 86400.0
# The actions that take a node out of service: `none` asks for nothing and `restart_job` leaves the
# node in service (docs/remediation.md's table).
QUARANTINE_ACTIONS = ("reset_gpu", "reboot", "inspect", "replace")
_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]*?!]+")


def _check_states(states: tuple[str, ...]) -> str | None:
    bad = [s for s in states if s not in STATES or s in ("healthy", "unknown")]
    if bad or not states:
        return "a list of verdict states to act on: unhealthy and/or degraded (never healthy or unknown)"
    return None


def _check_actions(actions: tuple[str, ...]) -> str | None:
    if not actions or any(a not in QUARANTINE_ACTIONS for a in actions):
        return "a list of actions that take a node out of service: " + ", ".join(QUARANTINE_ACTIONS)
    return None


def _check_names(names: tuple[str, ...]) -> str | None:
    if any(not _NAME.fullmatch(n) for n in names):
        return "node names or glob patterns of them (n[1-4] is a glob's character class, n1 to n4)"
    return None


def _check_domains(domains: Mapping[str, Mapping[str, str]]) -> str | None:
    for kind, members in domains.items():
        named = all(name and domain for name, domain in members.items())
        if not re.fullmatch(r"[a-z][a-z0-9_]*", kind) or not named:
            return "a mapping of domain kinds (rack, leaf, nvlink) to mappings of node name to domain name"
    return None


def _check_features(features: Mapping[str, str]) -> str | None:
    for kind, pattern in features.items():
        try:
            groups = re.compile(pattern).groups
        except re.error as err:
            return f"regular expressions with one group, by domain kind ({kind}: {err})"
        if groups != 1 or not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
            return "a mapping of domain kinds to regular expressions with one group, e.g. rack: 'rack-(.+)'"
    return None


@dataclass(frozen=True)
class BudgetConfig:
    max_unavailable: int = setting(
        1,
        doc="most nodes out of service by the remediator at once; past it, it adds none and says so "
        "(RemediationBudgetExhausted) until one comes back",
        min=0,
        max=1_000_000,
    )
    max_unavailable_per_domain: int = setting(
        1,
        doc="most nodes out of service by the remediator at once in any one failure domain (domains)",
        min=0,
        max=1_000_000,
    )
    slow_start: bool = setting(
        True,
        doc="one act in flight at first; the width doubles each time a node acted on comes back "
        "healthy and is released, and falls back to one when one does not",
    )
    slow_start_deadline_seconds: float = setting(
        3600.0,
        doc="how long a node acted on has to come back healthy and be released before it counts as "
        "not recovered (the slow start falls back to one)",
        min=1,
        max=30 * DAY,
    )


@dataclass(frozen=True)
class SlurmConfig:
    scontrol: str = setting("scontrol", doc="the scontrol command (a path, or a name found on PATH)")
    timeout_seconds: float = setting(
        30.0, doc="a scontrol call that lasts longer is stopped and the reconcile ends there", min=1, max=600
    )
    state_dir: str = setting(
        "/var/lib/clusterhealth/remediate",
        doc="where the ledger (ledger.json) and the lock (lock) live, on the controller host",
    )
    reboot: bool = setting(
        False,
        doc="carry out a verdict of reboot as scontrol reboot ASAP nextstate=RESUME (slurm.conf's "
        "RebootProgram); off: it drains the node like the other actions",
    )
    domain_features: dict[str, str] = setting(
        default_factory=dict,
        doc="failure domains from node features: domain kind -> a regular expression with one group "
        "matched against each feature, e.g. {rack: 'rack-(.+)'}",
        check=_check_features,
    )


def _check_labels(labels: Mapping[str, str]) -> str | None:
    if any(not re.fullmatch(r"[a-z][a-z0-9_]*", kind) or not label for kind, label in labels.items()):
        return (
            "a mapping of domain kinds (rack, leaf, nvlink) to node label keys, "
            "e.g. {zone: topology.kubernetes.io/zone}"
        )
    return None


def _check_resources(names: tuple[str, ...]) -> str | None:
    if not names or any(not re.fullmatch(r"[A-Za-z0-9.\-/*]+", n) for n in names):
        return "a list of extended resource names or glob patterns of them, e.g. nvidia.com/gpu"
    return None


@dataclass(frozen=True)
class KubernetesConfig:
    kubeconfig: str = setting(
        "",
        doc="a kubeconfig file to reach the API with; empty: the pod's service account (in a cluster), "
        "else $KUBECONFIG or ~/.kube/config",
    )
    context: str = setting("", doc="the kubeconfig's context to use; empty: its current context")
    namespace: str = setting(
        "",
        doc="where the Lease lives (leader election, and the ledger of ended acts); empty: the pod's own "
        "namespace, else default",
    )
    lease_name: str = setting("clusterhealth-remediator", doc="the Lease's name: one actor per Lease")
    lease_duration_seconds: float = setting(
        0.0,
        doc="a leader that has not renewed the Lease for this long is replaced; it is renewed once per "
        "reconcile, so at least twice interval_seconds; 0: three times interval_seconds",
        min=0,
        max=DAY,
    )
    taint: bool = setting(
        False,
        doc="also taint the nodes it quarantines with remediate.clusterhealth.io/quarantined:NoSchedule "
        "(for schedulers that do not read the cordon)",
    )
    evict: bool = setting(
        False,
        doc="evict the pods that use a quarantined node's GPUs (the Eviction API: PodDisruptionBudgets "
        "hold them) once evict_after_seconds have passed; the chart then grants pods list and "
        "pods/eviction create",
    )
    evict_after_seconds: float = setting(
        600.0,
        doc="the grace period between the cordon and the evictions, for the jobs to checkpoint",
        min=0,
        max=30 * DAY,
    )
    gpu_resources: tuple[str, ...] = setting(
        ("nvidia.com/gpu", "nvidia.com/mig-*"),
        doc="the extended resources that make a pod one that uses the node's GPUs (names or globs)",
        check=_check_resources,
    )
    domain_labels: dict[str, str] = setting(
        default_factory=dict,
        doc="failure domains from node labels: domain kind -> label key, e.g. "
        "{zone: topology.kubernetes.io/zone}",
        check=_check_labels,
    )
    timeout_seconds: float = setting(
        30.0,
        doc="an API request that lasts longer (or cannot connect) is tried once more, then fails the "
        "reconcile",
        min=1,
        max=600,
    )


@dataclass(frozen=True)
class FabricConfig:
    window_seconds: float = setting(
        6 * 3600.0, doc="how far back --fabric reads the pairwise group's results", min=60, max=30 * DAY
    )
    step_seconds: float | None = setting(
        None,
        doc="the width of the windows the history is read in, as analyze's --step (default: an eighth "
        "of the group's round)",
        min=0.1,
        max=DAY,
    )
    action: str = setting(
        "inspect",
        doc="the action a host that analyze names as a suspect gets (its link, cable or switch port "
        "is for a person to look at)",
        choices=QUARANTINE_ACTIONS,
    )


@dataclass(frozen=True)
class RemediateConfig:
    interval_seconds: float = setting(60.0, doc="how often it reconciles", min=1, max=DAY)
    hold_seconds: float = setting(
        300.0,
        doc="how long a node's verdict (its state and action) must have held in Prometheus before "
        "it is acted on",
        min=0,
        max=30 * DAY,
    )
    settle_seconds: float = setting(
        900.0,
        doc="how long a node of ours must have been healthy before it is put back in service",
        min=0,
        max=30 * DAY,
    )
    stale_seconds: float = setting(
        180.0,
        doc="a verdict whose latest sample is older than this is not acted on (its series stopped)",
        min=1,
        max=DAY,
    )
    act_on_states: tuple[str, ...] = setting(
        ("unhealthy",), doc="the verdict states acted on", check=_check_states
    )
    act_on_actions: tuple[str, ...] = setting(
        QUARANTINE_ACTIONS,
        doc="the verdict actions acted on (each takes the node out of service)",
        check=_check_actions,
    )
    repeat_limit: int = setting(
        3,
        doc="the act that makes this many on one node within repeat_window_seconds is an inspect, "
        "and the node is never put back in service automatically",
        min=1,
        max=1000,
    )
    repeat_window_seconds: float = setting(
        7 * DAY, doc="the window repeat_limit counts acts in (and the ledger keeps)", min=60, max=365 * DAY
    )
    veto: tuple[str, ...] = setting(
        (),
        doc="nodes never touched (do-not-act): names or glob patterns; they are reported",
        check=_check_names,
    )
    domains: dict[str, dict[str, str]] = setting(
        default_factory=dict,
        doc="failure domains: kind (rack, leaf, nvlink) -> node name -> domain name; wins over what "
        "the backend reads",
        check=_check_domains,
    )
    prometheus_timeout_seconds: float = setting(
        30.0, doc="a Prometheus query that lasts longer fails the reconcile (no action)", min=1, max=600
    )
    log_level: str = setting(
        "info", doc="lowest level logged to stderr", choices=("debug", "info", "warning", "error")
    )
    budget: BudgetConfig = setting(default_factory=BudgetConfig, doc="the fleet budget")
    fabric: FabricConfig = setting(default_factory=FabricConfig, doc="--fabric's reading of analyze")
    slurm: SlurmConfig = setting(default_factory=SlurmConfig, doc="the Slurm backend")
    kubernetes: KubernetesConfig = setting(default_factory=KubernetesConfig, doc="the Kubernetes backend")


def load(path: str | Path | None) -> RemediateConfig:
    """Read and validate the file (None: the defaults); ConfigError naming file, key and
    expectation."""
    if path is None:
        return RemediateConfig()
    source = str(path)
    data: Any = read_yaml(path, source)
    return from_mapping(RemediateConfig, {} if data is None else data, source)


def reference_markdown() -> str:
    """The remediator's configuration reference (docs/remediation.md)."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{key}` | `{default}` | {doc} |" for key, default, doc in reference(RemediateConfig)]
    return "\n".join(lines) + "\n"


REFERENCE_BEGIN = (
    "<!-- BEGIN GENERATED REMEDIATE REFERENCE: fleet/remediate/config.py (reference_markdown) -->\n"
)
REFERENCE_END = "<!-- END GENERATED REMEDIATE REFERENCE -->"


def with_reference(page: str) -> str:
    """``page`` with the reference between its markers replaced by the declarations'."""
    begin = page.index(REFERENCE_BEGIN) + len(REFERENCE_BEGIN)
    return page[:begin] + reference_markdown() + page[page.index(REFERENCE_END, begin) :]


if __name__ == "__main__":
    # `make generate`: python -m clusterhealth.fleet.remediate.config docs/remediation.md
    import sys

    (doc,) = sys.argv[1:]
    Path(doc).write_text(with_reference(Path(doc).read_text()))
