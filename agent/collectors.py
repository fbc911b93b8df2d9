"""The one table of collectors, and how the agent, `scrape` and `check` run them.

Each entry names a collector (also the key of its settings section, `collectors.<name>`, a
`CollectorSettings`: `enabled`, `interval_seconds`, `timeout_seconds` and its own keys), builds it
from the config and the node, says which settings it is built from (a reload rebuilds it only when
they changed) and which collectors' published results it reads (`after`: its first run waits for
theirs). Adding a collector is its file, one entry here and one settings section
(docs/adding-a-collector.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_type_hints

from clusterhealth.agent.config import CollectorSettings, Config, node_name
from clusterhealth.agent.node import Node
from clusterhealth.agent.sampling import Sampler
from clusterhealth.agent.sampling import Status as SamplerStatus
from clusterhealth.checks.audit_collector import AuditCollector
from clusterhealth.checks.fabric.rounds import GroupRounds
from clusterhealth.checks.kernel_watch import KernelLogCollector
from clusterhealth.checks.probes.collector import ProbeRunner, ProbeService
from clusterhealth.checks.probes.pipeline import Pipeline
from clusterhealth.checks.probes.transport import NodeLinks, read_node_links
from clusterhealth.checks.verdict import Missing, Verdict, decide_run
from clusterhealth.exporters.base import Collector, FamilySelection
from clusterhealth.exporters.gpu import GpuCollector
from clusterhealth.exporters.jobs.collector import JobsCollector
from clusterhealth.exporters.pcie_aer import PcieAerCollector
from clusterhealth.exporters.rdma import RdmaCollector
from clusterhealth.exporters.xid import XidCollector


@dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[Config, Node], Collector]
    # The part of the config the collector is built from: a reload keeps the running collector (its
    # state: GPM samples, the kernel log's position, counters) unless this changed.
    inputs: Callable[[Config], object]
    # What it reads, for the README's table of collectors (a test keeps the two equal).
    source: str
    # Collectors whose published results this one reads: its first run waits for theirs.
    after: tuple[str, ...] = ()

    def settings(self, config: Config) -> CollectorSettings:
        section: CollectorSettings = getattr(config.collectors, self.name)
        return section


def _gpu(config: Config, node: Node) -> GpuCollector:
    gpu = config.collectors.gpu
    return GpuCollector(
        node.session,
        node.directory,
        node.gpus.publish,
        gpm=gpu.gpm,
        gpm_min_window_seconds=gpu.gpm_min_window_seconds,
        on_cycle=node.drain_xid_events if node.one_shot else None,
        clocks_event_counters=gpu.clocks_event_counters,
        clocks_event_reasons=gpu.clocks_event_reasons,
    )


def _kernel_log(config: Config, node: Node) -> KernelLogCollector:
    kernel = config.collectors.kernel_log
    start: Literal["boot", "now"] = "now" if kernel.start == "now" and not node.one_shot else "boot"
    return KernelLogCollector(
        config.paths.kmsg,
        node.ledger,
        lambda: node.gpu_index_of_bus(Path(config.paths.sysfs)),
        start=start,
        max_records_per_cycle=kernel.max_records_per_cycle,
        catch_up=node.one_shot,
        publish=node.kernel_events.publish,
    )


def _rdma(config: Config, node: Node) -> RdmaCollector:
    rdma = config.collectors.rdma
    return RdmaCollector(
        Path(config.paths.sysfs),
        rdma.include_devices,
        rdma.exclude_devices,
        error_counters=rdma.error_counters,
        hw_counters=rdma.hw_counters,
        # The files only opt-in families need are not read unless they are exported.
        families=FamilySelection(RdmaCollector.opt_in, rdma.include_metrics, rdma.exclude_metrics),
    )


def _pcie_aer(config: Config, node: Node) -> PcieAerCollector:
    return PcieAerCollector(Path(config.paths.sysfs), config.collectors.pcie_aer.drivers)


def _xid(config: Config, node: Node) -> XidCollector:
    return XidCollector(node.ledger, node.directory)


def _audit(config: Config, node: Node) -> AuditCollector:
    return AuditCollector(
        config.policy,
        Path(config.paths.sysfs),
        lambda: node.gpu_state(config),
        lambda: node.recent_events(config),
    )


def _jobs(config: Config, node: Node) -> JobsCollector:
    jobs = config.collectors.jobs
    return JobsCollector(
        lambda: node.gpu_state(config),
        node.jobs.publish,
        pod_resources_socket=jobs.pod_resources_socket,
        mapping_dir=jobs.mapping_dir,
        mapping_index=jobs.mapping_index,
        mapping_grace_seconds=jobs.mapping_grace_seconds,
        processes=jobs.processes,
        procfs_root=config.paths.procfs,
        sysfs_root=config.paths.sysfs,
        extra_resources=jobs.extra_resources,
        timeout_seconds=jobs.timeout_seconds,
    )


def node_links(config: Config, node: Node) -> Callable[[], NodeLinks]:
    """What the node offers NCCL, read when a probe run is judged: the RDMA devices the rdma
    collector exports (none known while it is off) and the NVLink links the gpu collector last
    read: the same facts NCCLTransportFallback reads from the exposition."""
    rdma = config.collectors.rdma
    sysfs = Path(config.paths.sysfs) if rdma.enabled else None
    selects = RdmaCollector(Path(config.paths.sysfs), rdma.include_devices, rdma.exclude_devices).selects
    return lambda: read_node_links(sysfs, selects, node.gpu_state(config)[0])


def _probes(config: Config, node: Node) -> ProbeService:
    session = node.session if config.collectors.gpu.enabled else None
    name = node_name(config)
    pipeline = Pipeline.of(config.probing, session, node_links(config, node))
    # Pairwise groups share the probes' pipeline (lock, idle guard, baselines) and families: one
    # collector exports both, since an exposition holds each family once.
    groups = [GroupRounds(g, name, pipeline) for g in config.pairwise_groups if g.enabled]
    return ProbeService(config.probing, config.probes, ProbeRunner(pipeline, session, name), groups)


COLLECTORS: tuple[Entry, ...] = (
    Entry(
        "gpu",
        _gpu,
        inputs=lambda c: c.collectors.gpu,
        source="NVML: `nvmlDeviceGet*` per GPU, GPM samples; `nvmlEventSetWait_v2` (Xid events) "
        "on its own thread",
    ),
    # After the gpu collector, which learns the bus ids an Xid line is matched to; if NVML hangs,
    # the wait ends at the gpu collector's timeout and the lines are counted unmatched.
    Entry(
        "kernel_log",
        _kernel_log,
        inputs=lambda c: (c.collectors.kernel_log, c.paths.kmsg, c.paths.sysfs),
        source="the kernel log, `paths.kmsg` (`/dev/kmsg`); sysfs `bus/pci/devices` to place a GPU "
        "lost before it answered NVML",
        after=("gpu",),
    ),
    Entry(
        "rdma",
        _rdma,
        inputs=lambda c: (c.collectors.rdma, c.paths.sysfs),
        source="sysfs: `class/infiniband/*` (ports, `counters/`, `hw_counters/`), `class/net/*/mtu`, "
        "the HCAs' PCI links",
    ),
    Entry(
        "pcie_aer",
        _pcie_aer,
        inputs=lambda c: (c.collectors.pcie_aer, c.paths.sysfs),
        source="sysfs: `bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}` of the functions "
        "bound to `drivers`",
    ),
    Entry(
        "xid",
        _xid,
        inputs=lambda c: c.collectors.xid,
        source="the Xid ledger, fed by the gpu collector's NVML events and the kernel log (memory only)",
        after=("gpu", "kernel_log"),
    ),
    Entry(
        "audit",
        _audit,
        inputs=lambda c: (
            c.collectors.audit,
            c.collectors.gpu.enabled,
            c.collectors.kernel_log.enabled,
            c.policy,
            c.paths.sysfs,
        ),
        source="sysfs (`class/infiniband`, `class/net`) and what the gpu and kernel_log collectors published",
        after=("gpu", "kernel_log"),
    ),
    # After the gpu collector, whose GPU identities, minor numbers and compute processes it reads.
    Entry(
        "jobs",
        _jobs,
        inputs=lambda c: (c.collectors.jobs, c.collectors.gpu.enabled, c.paths.procfs, c.paths.sysfs),
        source="the kubelet's pod-resources socket (gRPC), the job-mapping directory, "
        "`/proc/<pid>/cgroup` of the GPUs' compute processes; sysfs `fs/cgroup` (running Slurm jobs)",
        after=("gpu",),
    ),
    Entry(
        "probes",
        _probes,
        inputs=lambda c: (
            c.collectors.probes,
            c.collectors.gpu.enabled,
            c.probing,
            c.probes,
            c.pairwise_groups,
            c.node_name,
            # What a run's NCCL transport is judged against (node_links).
            c.collectors.rdma.enabled,
            c.collectors.rdma.include_devices,
            c.collectors.rdma.exclude_devices,
            c.paths.sysfs,
        ),
        source="subprocesses (nccl-tests, ib_write_bw, iperf3, ...) on the probes' schedule and the "
        "pairwise groups' rounds; results kept in `probing.state_dir`; sysfs `class/infiniband` and "
        "the gpu collector's NVLink state, to judge NCCL's transport",
    ),
)
NAMES = tuple(entry.name for entry in COLLECTORS)
# Each collector runs at its own fraction of a second past the multiples of its interval (see
# agent/sampling.py): with whole-second intervals, no two collections start together.
PHASES = {name: position / len(NAMES) for position, name in enumerate(NAMES)}


def collectors_markdown() -> str:
    """The README's table of collectors."""
    defaults = Config()
    lines = [
        "| collector | file | settings | default interval | reads |",
        "| --- | --- | --- | --- | --- |",
    ]
    for entry in COLLECTORS:
        cls = get_type_hints(entry.build)["return"]
        file = cls.__module__.removeprefix("clusterhealth.").replace(".", "/") + ".py"
        interval = entry.settings(defaults).interval_seconds
        lines.append(
            f"| `{entry.name}` | `{file}` | `collectors.{entry.name}` | {interval:g} s | {entry.source} |"
        )
    return "\n".join(lines) + "\n"


def _selection(collector: Collector, settings: CollectorSettings) -> FamilySelection:
    """The families of `collector` its settings export: all but its opt-in ones, plus
    `include_metrics`, minus `exclude_metrics`."""
    return FamilySelection(
        getattr(collector, "opt_in", frozenset()), settings.include_metrics, settings.exclude_metrics
    )


def _with_dependencies(names: Collection[str]) -> set[str]:
    wanted, entries = set(names), {e.name: e for e in COLLECTORS}
    for entry in reversed(COLLECTORS):  # `after` only names earlier entries (a test checks)
        if entry.name in wanted:
            wanted |= set(entries[entry.name].after)
    return wanted


class Collectors:
    """The collectors a config enables, each run by its `Sampler`."""

    def __init__(self, node: Node, on_snapshot: Callable[[], None] = lambda: None):
        self.node = node
        self._on_snapshot = on_snapshot
        self._samplers: dict[str, Sampler] = {}  # every sampler made, kept to reuse its thread
        self._inputs: dict[str, object] = {}
        self.active: list[Sampler] = []

    def apply(self, config: Config, *, only: Collection[str] | None = None, start: bool = True) -> None:
        """Build, keep, reconfigure or stop each collector for `config`; with `start`, run them."""
        wanted = _with_dependencies(only) if only is not None else set(NAMES)
        active: dict[str, Sampler] = {}
        for entry in COLLECTORS:
            settings = entry.settings(config)
            sampler = self._samplers.get(entry.name)
            if not settings.enabled or entry.name not in wanted:
                if sampler is not None:
                    sampler.stop()
                    self._inputs.pop(entry.name, None)
                continue
            after = [active[name] for name in entry.after if name in active]
            inputs = entry.inputs(config)
            if sampler is None:
                collector = entry.build(config, self.node)
                sampler = Sampler(
                    collector,
                    settings.interval_seconds,
                    settings.timeout_seconds,
                    self._on_snapshot,
                    after,
                    _selection(collector, settings),
                    phase=PHASES[entry.name],
                )
                self._samplers[entry.name] = sampler
            else:
                rebuilt = self._inputs.get(entry.name) != inputs
                collector = entry.build(config, self.node) if rebuilt else sampler.collector
                sampler.reconfigure(
                    collector,
                    settings.interval_seconds,
                    settings.timeout_seconds,
                    after,
                    _selection(collector, settings),
                )
            self._inputs[entry.name] = inputs
            active[entry.name] = sampler
            if start:
                sampler.start()
        self.active = list(active.values())

    def run_once(self) -> None:
        """Each active collector once, in table order (so after what it reads), each bounded by its
        timeout: a hung NVML call makes the gpu collector report hung, not the command hang."""
        for sampler in self.active:
            sampler.run_once(timeout=sampler.timeout)

    def stop(self, wait: float = 2.0) -> None:
        """Stop every sampler at once and give them `wait` seconds together to end (each closes
        its collector as it ends; one hung in a driver call is left behind)."""
        samplers = list(self._samplers.values())
        for sampler in samplers:
            sampler.stop()
        deadline = time.monotonic() + wait
        for sampler in samplers:
            sampler.join(deadline)


def verdict_inputs() -> tuple[str, ...]:
    """The collectors the verdict reads: the audit, and what the audit reads (its `after`)."""
    (audit,) = [entry for entry in COLLECTORS if entry.name == "audit"]
    return (audit.name, *audit.after)


def node_verdict(current: Sequence[tuple[Sampler, SamplerStatus]]) -> Verdict:
    """The node's verdict from the audit's last run, unknown while one of `verdict_inputs` cannot
    deliver: a hung gpu collector leaves the audit judging the GPUs as they were before it hung."""
    inputs = verdict_inputs()
    run, missing = None, []
    for sampler, status in current:
        if sampler.name not in inputs:
            continue
        if sampler.name == "audit" and isinstance(sampler.collector, AuditCollector):
            run = sampler.collector.last
        if status.pending:
            missing.append(Missing(sampler.name, "has not finished its first run"))
        elif not status.success:
            missing.append(Missing(sampler.name, f"is failing: {status.reason}"))
    if not any(sampler.name == "audit" for sampler, _ in current):
        missing.append(Missing("audit", "is switched off (collectors.audit.enabled)"))
    return decide_run(run, missing)


def collect_once(config: Config, only: Collection[str] | None = None) -> tuple[Node, Sequence[Sampler]]:
    """For `scrape` and `check`: a node, and its collectors run once. The caller closes the node."""
    node = Node(config, one_shot=True)
    collectors = Collectors(node)
    collectors.apply(config, only=only, start=False)
    collectors.run_once()
    return node, collectors.active


__all__ = [
    "COLLECTORS",
    "NAMES",
    "Collectors",
    "Entry",
    "collect_once",
    "collectors_markdown",
    "node_links",
    "node_verdict",
    "verdict_inputs",
]
