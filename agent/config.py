"""The configuration file: one YAML document, validated once into the frozen dataclasses below.

This module declares the keys, each with `setting()` (checks/schema.py): its default, its `doc`
(also what docs/configuration.md is made from) and its bounds. The sections that belong to a part
of checks/ are declared the same way beside it: the audit policy in checks/policy.py, the probes'
in checks/probes/settings.py, the pairwise groups' in checks/fabric/settings.py. `load` reads
the file with agent/yamlfile.py's hardened YAML reader and builds a `Config` with
agent/settings.py's validator: an unknown key, a wrong type or an out-of-range value raises
`ConfigError` naming the file, the key path and what was expected; the command line turns that
into exit code 2.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clusterhealth.agent.settings import ConfigError, from_mapping, reference, to_mapping
from clusterhealth.agent.yamlfile import read_yaml
from clusterhealth.checks.fabric.members import MembershipError, parse_inventory
from clusterhealth.checks.fabric.schedule import check_node_name
from clusterhealth.checks.fabric.settings import PairwiseGroupConfig, check_groups
from clusterhealth.checks.policy import Policy
from clusterhealth.checks.probes.settings import ProbeConfig, ProbingConfig, check_probes
from clusterhealth.checks.schema import setting
from clusterhealth.exporters.gpu import CLOCK_EVENT_COUNTERS_DEFAULT, CLOCK_EVENT_REASONS_DEFAULT
from clusterhealth.exporters.rdma import ERROR_COUNTERS_DEFAULT, HW_COUNTERS_DEFAULT

DEFAULT_PORT = 9845
LOG_LEVELS = ("debug", "info", "warning", "error")


def _check_listen(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    # isdigit() alone accepts "²" and other digits int() refuses.
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or not int(port) < 65536:
        return (
            "HOST:PORT with a port up to 65535 (HOST may be empty for all addresses, port 0 picks a free one)"
        )
    if host.startswith("[") != host.endswith("]"):
        return "HOST:PORT with an IPv6 HOST in brackets, e.g. [::1]:9845"
    return None


@dataclass(frozen=True)
class PathsConfig:
    sysfs: str = setting("/sys", doc="root of the sysfs tree (containers mount the host's /sys here)")
    procfs: str = setting("/proc", doc="root of the procfs tree")
    kmsg: str = setting("/dev/kmsg", doc="kernel log device read by the kernel-log watcher")


# Every collector's runs are timed the same way (agent/sampling.py), so one sentence says it.
_HUNG = "a run that lasts longer is reported hung: success 0 and /healthz says why"
# And every collector's families are switched the same way (exporters/base.py, FamilySelection).
_INCLUDE = (
    "its opt-in metric families to export too, as glob patterns of their names ('*': all; "
    "docs/metrics.md's series table lists them)"
)
_EXCLUDE = (
    "metric families to leave out, as glob patterns of their names (node_exporter's "
    "--no-collector for one family); wins over include_metrics"
)


def _check_globs(patterns: tuple[str, ...]) -> str | None:
    return "non-empty glob patterns such as mlx5_*" if any(not p for p in patterns) else None


@dataclass(frozen=True)
class CollectorSettings:
    """The keys every `collectors.<name>` section has, declared here once.

    A section subclasses this and says, as class arguments, what its collector does (`enabled`),
    its default interval and what happens at that pace (`interval_seconds`), and where they
    differ, the interval's bounds and the default timeout.
    """

    enabled: bool = setting(True, doc="run this collector")
    interval_seconds: float = setting(10.0, doc="how often it runs", min=0.5, max=3600)
    timeout_seconds: float = setting(30.0, doc=_HUNG, min=1, max=3600)
    include_metrics: tuple[str, ...] = setting((), doc=_INCLUDE, check=_check_globs)
    exclude_metrics: tuple[str, ...] = setting((), doc=_EXCLUDE, check=_check_globs)

    def __init_subclass__(
        cls,
        *,
        does: str,
        every: float,
        how_often: str,
        interval_range: tuple[float, float] = (0.5, 3600),
        timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        # The common keys again, on the section, with its defaults and words: @dataclass, applied
        # to the section after this runs, keeps them first, where this class declares them.
        low, high = interval_range
        keys = {
            "enabled": setting(True, doc=does),
            "interval_seconds": setting(every, doc=how_often, min=low, max=high),
            "timeout_seconds": setting(timeout, doc=_HUNG, min=1, max=3600),
            "include_metrics": setting((), doc=_INCLUDE, check=_check_globs),
            "exclude_metrics": setting((), doc=_EXCLUDE, check=_check_globs),
        }
        cls.__annotations__ = {**inspect.get_annotations(CollectorSettings), **inspect.get_annotations(cls)}
        for name, key in keys.items():
            setattr(cls, name, key)


@dataclass(frozen=True)
class GpuConfig(
    CollectorSettings,
    does="export GPU state from NVML",
    every=10.0,
    how_often="how often NVML is sampled in the background",
):
    gpm: bool = setting(
        True,
        doc="read the roofline signals from GPM where the GPU has it (Hopper and newer): SM, tensor-core "
        "and FP16/32/64 activity, SM occupancy, DRAM bandwidth, PCIe and NVLink traffic",
    )
    gpm_min_window_seconds: float = setting(
        1.0,
        doc="shortest window between the two GPM samples when no earlier sample exists (first cycle)",
        min=0.05,
        max=60,
    )
    xid_events: bool = setting(True, doc="count Xid errors from NVML events in a background thread")
    clocks_event_counters: tuple[str, ...] = setting(
        CLOCK_EVENT_COUNTERS_DEFAULT,
        doc="throttle-time reasons exported in clusterhealth_gpu_clocks_event_seconds_total (glob "
        "patterns; '*': also sw_power_cap, sync_boost, board_limit, low_utilization, reliability)",
        check=_check_globs,
    )
    clocks_event_reasons: tuple[str, ...] = setting(
        CLOCK_EVENT_REASONS_DEFAULT,
        doc="sampled reasons exported in clusterhealth_gpu_clocks_event_active (glob patterns; by "
        "default all nine of SPEC)",
        check=_check_globs,
    )


@dataclass(frozen=True)
class KernelLogConfig(
    CollectorSettings,
    does="watch the kernel log (paths.kmsg) for Xid, SXid, PCIe AER, mlx5 errors",
    every=5.0,
    how_often="how often new kernel-log records are read",
):
    start: str = setting(
        "boot",
        doc="read the log from boot (events since boot count) or only from now",
        choices=("boot", "now"),
    )
    max_records_per_cycle: int = setting(
        20000,
        doc="records read per cycle at most; the rest wait in the kernel's buffer",
        min=100,
        max=10_000_000,
    )


@dataclass(frozen=True)
class RdmaConfig(
    CollectorSettings,
    does="export RDMA devices, ports and counters from paths.sysfs",
    every=15.0,
    how_often="how often sysfs is read",
):
    include_devices: tuple[str, ...] = setting(
        (), doc="glob patterns of RDMA devices to export (empty: all)", check=_check_globs
    )
    exclude_devices: tuple[str, ...] = setting(
        (), doc="glob patterns of RDMA devices to leave out; wins over include_devices", check=_check_globs
    )
    error_counters: tuple[str, ...] = setting(
        ERROR_COUNTERS_DEFAULT,
        doc="counters/ error files exported in clusterhealth_rdma_port_errors_total (glob patterns; "
        "'*': every file, also the constraint, switch-relay and VL15 counters)",
        check=_check_globs,
    )
    hw_counters: tuple[str, ...] = setting(
        HW_COUNTERS_DEFAULT,
        doc="hw_counters/ files exported in clusterhealth_rdma_port_hw_events_total (glob patterns; "
        "'*': every driver counter)",
        check=_check_globs,
    )


@dataclass(frozen=True)
class AuditConfig(
    CollectorSettings,
    does="run the node audits and health checks (see policy) and export the results",
    every=60.0,
    how_often="how often the audits run",
    interval_range=(1, 86400),
):
    pass


@dataclass(frozen=True)
class PcieAerConfig(
    CollectorSettings,
    does="export the PCIe AER error counts of the HCAs' (and, on request, the GPUs') PCI functions",
    every=30.0,
    how_often="how often sysfs is read",
):
    drivers: tuple[str, ...] = setting(
        ("mlx5_core",),
        doc="glob patterns of the drivers whose PCI functions are read (nvidia adds the GPUs, whose "
        "link NVML's replay counter watches by default; pcieport adds the switch ports)",
        check=_check_globs,
    )


@dataclass(frozen=True)
class XidConfig(
    CollectorSettings,
    does="export clusterhealth_gpu_xid_errors_total, counted once from NVML events and the kernel log",
    every=5.0,
    how_often="how often the counts are exported (they are kept in memory)",
):
    pass


@dataclass(frozen=True)
class ProbesCollectorConfig(
    CollectorSettings,
    does="schedule the configured probes and export their results",
    every=2.0,
    how_often="how often the probes' latest results are exported",
    timeout=10.0,
):
    pass


@dataclass(frozen=True)
class JobsConfig(
    CollectorSettings,
    does="attribute each GPU to the Slurm job or Kubernetes pod on it (clusterhealth_gpu_job_info)",
    every=15.0,
    how_often="how often the sources are read",
    timeout=10.0,
):
    pod_resources_socket: str | None = setting(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        doc="the kubelet's pod-resources socket (--pod-resources-socket); absent on the node: not read",
    )
    mapping_dir: str | None = setting(
        "/run/clusterhealth/jobs",
        doc="a job-mapping directory in dcgm-exporter's format (--job-mapping-dir), as "
        "deploy/slurm's Prolog writes it; absent on the node: not read",
    )
    mapping_index: str = setting(
        "minor",
        doc="what a mapping file's name counts: the device's minor number (/dev/nvidiaN, as Slurm "
        "numbers GPUs) or NVML's index",
        choices=("minor", "nvml"),
    )
    mapping_grace_seconds: float = setting(
        300.0,
        doc="a mapping file whose job has no cgroup expires once it is this old (the Prolog runs "
        "before the job's cgroup is made)",
        min=0,
        max=86400,
    )
    processes: bool = setting(
        True, doc="attribute GPUs by their compute processes' cgroups under paths.procfs (the fallback)"
    )
    extra_resources: tuple[str, ...] = setting(
        ("nvidia.com/gpu.shared",),
        doc="glob patterns of device-plugin resources that are GPUs, besides nvidia.com/gpu and "
        "nvidia.com/mig-*",
        check=_check_globs,
    )


@dataclass(frozen=True)
class CollectorsConfig:
    gpu: GpuConfig = setting(default_factory=GpuConfig, doc="the NVML GPU exporter")
    kernel_log: KernelLogConfig = setting(default_factory=KernelLogConfig, doc="the kernel-log watcher")
    rdma: RdmaConfig = setting(default_factory=RdmaConfig, doc="the RDMA and network exporter")
    audit: AuditConfig = setting(default_factory=AuditConfig, doc="the node audits")
    xid: XidConfig = setting(default_factory=XidConfig, doc="the Xid counter (NVML events and kernel log)")
    pcie_aer: PcieAerConfig = setting(default_factory=PcieAerConfig, doc="the PCIe AER counters")
    probes: ProbesCollectorConfig = setting(
        default_factory=ProbesCollectorConfig, doc="the fabric probes' schedule and results"
    )
    jobs: JobsConfig = setting(default_factory=JobsConfig, doc="job attribution of the GPUs")


@dataclass(frozen=True)
class Config:
    listen: str = setting(
        f":{DEFAULT_PORT}", doc="HOST:PORT the agent serves /metrics and /healthz on", check=_check_listen
    )
    web_config_file: str | None = setting(
        None,
        doc="TLS and basic auth for /metrics and /healthz, in the Prometheus exporter-toolkit format "
        "(tls_server_config, basic_auth_users); re-read on SIGHUP",
    )
    log_level: str = setting("info", doc="lowest level logged to stderr", choices=LOG_LEVELS)
    node_name: str | None = setting(
        None,
        doc="this node's name in pairwise probe groups and clusterhealth_node_info (--node-name); "
        "default: the NODE_NAME environment variable, else the short hostname",
        check=lambda v: check_node_name(v) if v is not None else None,
    )
    simulate: str | None = setting(
        None, doc="path of a simulated-node scenario (YAML); replaces the NVML library, for demos and tests"
    )
    paths: PathsConfig = setting(default_factory=PathsConfig, doc="roots of the trees the agent reads")
    collectors: CollectorsConfig = setting(default_factory=CollectorsConfig, doc="collectors")
    policy: Policy = setting(default_factory=Policy, doc="what a healthy node looks like (audits)")
    probing: ProbingConfig = setting(default_factory=ProbingConfig, doc="settings shared by the probes")
    probes: tuple[ProbeConfig, ...] = setting(
        (),
        doc="fabric probes run on a schedule when the node is idle (see the sample config)",
        check=check_probes,
    )
    pairwise_groups: tuple[PairwiseGroupConfig, ...] = setting(
        (),
        doc="groups of nodes that measure each other in rotating pairs (docs/fabric.md)",
        check=check_groups,
    )


def load(path: str | Path | None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read and validate a config file (None: defaults), then apply dotted-key overrides (flags)."""
    data: Any = {}
    source = str(path) if path is not None else "<defaults>"
    if path is not None:
        data = read_yaml(path, source)
        if data is None:
            data = {}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        if not isinstance(data, dict):
            break  # reported by from_mapping below
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part)
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        node[leaf] = value
    config = from_mapping(Config, data, source)
    if config.node_name is None:
        config = dataclasses.replace(config, node_name=default_node_name())
    return _with_members(config, source)


def _with_members(config: Config, source: str) -> Config:
    """Check the group names against the probes' and read each group's members file.

    The members are read with the rest of the file, so that a bad inventory stops the agent at
    start (exit 2) and a bad one on SIGHUP leaves the running configuration in place.
    """
    probe_names = {p.name for p in config.probes}
    groups = []
    for i, group in enumerate(config.pairwise_groups):
        key = f"pairwise_groups[{i}]"
        if group.name in probe_names:
            raise ConfigError(
                source, f"{key}.name", "a name no probe has (both are the probe label)", group.name
            )
        if group.members_file is not None and group.enabled:
            path = group.members_file
            try:
                text = Path(path).read_text()
            except (OSError, UnicodeDecodeError) as err:
                why = getattr(err, "strerror", None) or str(err)
                raise ConfigError(
                    source, f"{key}.members_file", f"a readable members file ({path}: {why})"
                ) from err
            try:
                inventory = parse_inventory(text)
            except MembershipError as err:
                raise ConfigError(
                    source, f"{key}.members_file", f"a members file of 'name: address' lines ({path}: {err})"
                ) from err
            placement = {node: place.labels() for node, place in inventory.placement.items()}
            placement = {node: {k: v for k, v in place.items() if v} for node, place in placement.items()}
            group = dataclasses.replace(group, members=inventory.addresses, placement=placement)
        groups.append(group)
    return dataclasses.replace(config, pairwise_groups=tuple(groups))


def default_node_name() -> str:
    """The node's name when neither the file nor --node-name gives one: `NODE_NAME` (a DaemonSet
    sets it from the downward API, spec.nodeName), else the short hostname."""
    from_env = os.environ.get("NODE_NAME")
    if from_env is not None:
        if (problem := check_node_name(from_env)) is not None:
            raise ConfigError("the environment", "NODE_NAME", problem, from_env)
        return from_env
    hostname = socket.gethostname().split(".", 1)[0]
    if (problem := check_node_name(hostname)) is not None:
        raise ConfigError("the host name", "node_name", f"{problem}; set --node-name", hostname)
    return hostname


def node_name(config: Config) -> str:
    """The node's name: the config's (load() fills it in), else the default."""
    return config.node_name if config.node_name is not None else default_node_name()


def dump(config: Config) -> str:
    return yaml.safe_dump(to_mapping(config), sort_keys=False, default_flow_style=False)


def reference_markdown() -> str:
    """The configuration reference table of docs/configuration.md."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{key}` | `{default}` | {doc} |" for key, default, doc in reference(Config)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
