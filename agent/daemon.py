"""Wiring: builds the collectors a config asks for, runs them, serves them, reloads on SIGHUP."""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from clusterhealth.agent import config as configuration
from clusterhealth.agent import log as logsetup
from clusterhealth.agent.exposition import Exposition
from clusterhealth.agent.http import Server
from clusterhealth.agent.probing import ProbeRunner, ProbeService
from clusterhealth.agent.sampling import Sampler
from clusterhealth.checks.audit_collector import NO_GPUS, AuditCollector
from clusterhealth.checks.kernel_watch import KernelLogCollector, SeenEvent, recent_xid_events
from clusterhealth.exporters.gpu import GpuCollector, GpuState
from clusterhealth.exporters.nvml import NvmlSession
from clusterhealth.exporters.rdma import RdmaCollector
from clusterhealth.exporters.sim import nvml as nvml_sim
from clusterhealth.exporters.xid import NvmlXidWatcher, XidCollector, XidLedger

log = logging.getLogger("clusterhealth.agent")

# Audits read what the other collectors found: give them their first cycle.
AUDIT_START_DELAY_SECONDS = 5.0
# Probe results change at most once a run; reading them is a dictionary walk.
PROBE_METRICS_INTERVAL_SECONDS = 2.0
# The Xid ledger is read from memory; an event shows within the kernel log's own interval.
XID_INTERVAL_SECONDS = 5.0


@dataclass
class Node:
    """What outlives a config reload: the NVML session, the Xid ledger and its event thread.

    Counters such as `clusterhealth_gpu_xid_errors_total` live here so a reload never resets them.
    """

    session: NvmlSession = field(default_factory=NvmlSession)
    ledger: XidLedger = field(default_factory=XidLedger)
    simulator: nvml_sim.SimulatedLibrary | None = None
    xid_watcher: NvmlXidWatcher | None = None
    # Kept across reloads: its position in the kernel log and its counters must not start over.
    kernel_log: KernelLogCollector | None = None
    gpu_collector: GpuCollector | None = None

    def gpu_state(self, config: configuration.Config) -> GpuState | None:
        """The GPUs as the gpu collector last read them; None while NVML is unusable."""
        if not config.collectors.gpu.enabled:
            return NO_GPUS
        return self.gpu_collector.latest if self.gpu_collector is not None else None

    def recent_events(self, config: configuration.Config) -> list[SeenEvent] | None:
        """Counted Xids (both sources) and other kernel-log events; None if the log is unreadable."""
        events = recent_xid_events(self.ledger)
        if config.collectors.kernel_log.enabled:
            if self.kernel_log is None or self.kernel_log.readable is False:
                return None
            events += self.kernel_log.recent_events()
        return events

    @classmethod
    def create(cls, config: configuration.Config) -> Node:
        node = cls()
        if config.simulate:
            node.simulator = nvml_sim.install(nvml_sim.load_scenario(config.simulate))
        return node

    def sync_xid_watcher(self, config: configuration.Config, start: bool = True) -> None:
        wanted = config.collectors.gpu.enabled and config.collectors.gpu.xid_events
        if wanted and self.xid_watcher is None:
            self.xid_watcher = NvmlXidWatcher(self.session, self.ledger)
            if start:
                self.xid_watcher.start()
        elif not wanted and self.xid_watcher is not None:
            self.xid_watcher.stop()
            self.xid_watcher = None

    def drain_waiting_xid_events(self, config: configuration.Config) -> None:
        """For one-shot commands: count the Xid events NVML already holds, without a thread.

        A real driver holds none (it delivers events after registration only); a simulated node
        delivers its past faults, as `scrape` and `check` then both show.
        """
        self.sync_xid_watcher(config, start=False)
        if self.xid_watcher is not None:
            self.xid_watcher.drain()

    def close(self) -> None:
        if self.xid_watcher is not None:
            self.xid_watcher.stop()
        if self.kernel_log is not None:
            self.kernel_log.close()
        self.session.shutdown()


def build_samplers(
    config: configuration.Config, node: Node, on_snapshot: Callable[[], None] = lambda: None
) -> list[Sampler]:
    samplers = []
    gpu = config.collectors.gpu
    if gpu.enabled:
        collector = GpuCollector(
            node.session,
            gpm=gpu.gpm,
            gpm_min_window_seconds=gpu.gpm_min_window_seconds,
        )
        samplers.append(Sampler(collector, gpu.interval_seconds, gpu.timeout_seconds, on_snapshot))
        node.gpu_collector = collector
    kernel = config.collectors.kernel_log
    if kernel.enabled:
        if node.kernel_log is None or node.kernel_log.path != config.paths.kmsg:
            if node.kernel_log is not None:
                node.kernel_log.close()
            node.kernel_log = KernelLogCollector(
                config.paths.kmsg,
                node.ledger,
                node.session.gpu_bus_ids,
                start="now" if kernel.start == "now" else "boot",
                max_records_per_cycle=kernel.max_records_per_cycle,
            )
        samplers.append(
            Sampler(node.kernel_log, kernel.interval_seconds, kernel.timeout_seconds, on_snapshot)
        )
    rdma = config.collectors.rdma
    if rdma.enabled:
        rdma_collector = RdmaCollector(Path(config.paths.sysfs), rdma.include_devices, rdma.exclude_devices)
        samplers.append(Sampler(rdma_collector, rdma.interval_seconds, rdma.timeout_seconds, on_snapshot))
    audit = config.collectors.audit
    if audit.enabled:
        audit_collector = AuditCollector(
            config.policy,
            Path(config.paths.sysfs),
            lambda: node.gpu_state(config),
            lambda: node.recent_events(config),
        )
        samplers.append(
            Sampler(
                audit_collector,
                audit.interval_seconds,
                audit.timeout_seconds,
                on_snapshot,
                start_delay=AUDIT_START_DELAY_SECONDS,
            )
        )
    if gpu.enabled or kernel.enabled:
        # Last, so that a one-shot scrape sees what the two sources above just recorded.
        xid = XidCollector(node.ledger, node.session.uuids)
        samplers.append(Sampler(xid, XID_INTERVAL_SECONDS, XID_INTERVAL_SECONDS * 10, on_snapshot))
    return samplers


def build_probes(config: configuration.Config, node: Node) -> ProbeService | None:
    if not config.probes:
        return None
    session = node.session if config.collectors.gpu.enabled else None
    return ProbeService(config.probing, config.probes, ProbeRunner(config.probing, session))


class Agent:
    def __init__(self, config_path: str | None, overrides: Mapping[str, Any], config: configuration.Config):
        self.config_path, self.overrides, self.config = config_path, overrides, config
        self.loaded_at = time.time()
        self.node = Node.create(config)
        self.samplers: list[Sampler] = []
        self.probes: ProbeService | None = None
        self.exposition = Exposition(lambda: self.samplers)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.server = Server(config.listen, self.exposition, lambda: self.samplers, self._health_extra)

    def _health_extra(self) -> dict[str, Any]:
        return {
            "config": {
                "file": self.config_path,
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at)),
                "simulate": self.config.simulate,
            }
        }

    def run(self) -> int:
        # Hand the GIL to scrape threads sooner than the default 5 ms while a collection runs.
        sys.setswitchinterval(0.0005)
        # Everything allocated so far lives as long as the agent: keep the cycle collector off it,
        # and let a collection's short-lived objects go without a full pass each time.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        self._start_collection()
        self.server.start()
        host, port = self.server.address[:2]
        log.info("serving /metrics and /healthz on %s:%d", host, port)
        while not self._stop.is_set():
            self._reload.wait(5)  # the signal handlers set it; the timeout is only a safety net
            if self._reload.is_set():
                self._reload.clear()
                self.reload()
        log.info("shutting down")
        self.server.stop()
        for sampler in self.samplers:
            sampler.stop()
        if self.probes is not None:
            self.probes.stop()
        self.node.close()
        return 0

    def stop(self) -> None:
        self._stop.set()
        self._reload.set()

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

    def _on_reload(self, signum: int, frame: FrameType | None) -> None:
        self._reload.set()

    def _start_collection(self) -> None:
        self.node.sync_xid_watcher(self.config)
        # Render on the sampler's thread right after each snapshot, so no scrape waits for it.
        samplers = build_samplers(self.config, self.node, self.exposition.refresh)
        self.probes = build_probes(self.config, self.node)
        if self.probes is not None:
            samplers.append(Sampler(self.probes, PROBE_METRICS_INTERVAL_SECONDS, 10, self.exposition.refresh))
            self.probes.start()
        self.samplers = samplers
        for sampler in self.samplers:
            sampler.start()

    def reload(self) -> bool:
        """Apply the config file again; a bad file is reported and the running config kept."""
        if self._stop.is_set():
            return False
        try:
            new = configuration.load(self.config_path, self.overrides)
        except configuration.ConfigError as err:
            log.error("reload failed, keeping the running configuration: %s", err)
            return False
        if new.listen != self.config.listen:
            log.warning("listen address changed to %s; it takes effect on restart", new.listen)
        if new.simulate != self.config.simulate:
            log.warning("simulate changed to %s; it takes effect on restart", new.simulate)
        logsetup.set_level(new.log_level)
        old = self.samplers
        for sampler in old:
            sampler.stop(wait=0)
        if self.probes is not None:
            self.probes.stop()
        self.config, self.loaded_at = new, time.time()
        self._start_collection()
        log.info("configuration reloaded from %s", self.config_path or "defaults")
        return True


def scrape_once(config: configuration.Config) -> bytes:
    """One collection of every enabled collector, rendered; for `clusterhealth scrape`."""
    node = Node.create(config)
    try:
        node.drain_waiting_xid_events(config)
        samplers = build_samplers(config, node)
        for sampler in samplers:
            sampler.run_once()
        return Exposition(lambda: samplers).render()
    finally:
        node.close()


def default_scenario(name: str) -> Path:
    return nvml_sim.SCENARIO_DIR / f"{name}.yaml"
