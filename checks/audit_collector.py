"""The `audit` collector: runs the node audits on an interval and exports their results.

It reads sysfs itself (RDMA devices, interface MTUs) and takes the GPU readings and recent events
from the collectors that already have them, so an audit never queries NVML a second time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from clusterhealth.checks.audits import CheckResult, Observations, firmware_inventory, run_audits
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.checks.policy import Policy
from clusterhealth.exporters.gpu import GpuState
from clusterhealth.exporters.infiniband import NO_COUNTERS, RdmaDevice, read_rdma_devices
from clusterhealth.exporters.netdev import read_netdev_mtus

log = logging.getLogger("clusterhealth.audit")


@dataclass(frozen=True)
class AuditRun:
    results: list[CheckResult]
    firmware: list[tuple[str, str, str]]
    finished_at: float  # wall clock
    # What the results judged, with which policy: the verdict (checks/verdict.py) reads the GPUs
    # and Xids behind each result from it.
    observations: Observations
    policy: Policy


class AuditCollector:
    name = "audit"

    def __init__(
        self,
        policy: Policy,
        sysfs_root: Path,
        gpu_state: Callable[[], tuple[GpuState | None, str]],
        events: Callable[[], tuple[Sequence[SeenEvent] | None, str]],
    ):
        """`gpu_state` and `events` give what the collectors published, or None and why not."""
        self.policy, self.sysfs_root = policy, sysfs_root
        self._gpu_state, self._events = gpu_state, events
        self.last: AuditRun | None = None

    def run(self) -> AuditRun:
        gpu, gpus_unreadable = self._gpu_state()
        events, events_unreadable = self._events()
        rdma = self._rdma()
        try:
            mtus: dict[str, int] | None = read_netdev_mtus(self.sysfs_root)
        except OSError as err:
            log.debug("interface MTUs unreadable: %s", err)
            mtus = None
        observations = Observations.of(
            gpus=gpu.readings if gpu is not None else None,
            driver_version=gpu.driver_version if gpu is not None else None,
            rdma=rdma,
            netdev_mtus=mtus,
            kernel_events=events,
            now_boot_seconds=time.monotonic(),
            gpus_unreadable=gpus_unreadable,
            kernel_events_unreadable=events_unreadable,
        )
        results = run_audits(self.policy, observations)
        inventory = firmware_inventory(
            gpu.readings if gpu else None, gpu.driver_version if gpu else None, rdma
        )
        self.last = AuditRun(results, inventory, time.time(), observations, self.policy)
        return self.last

    def _rdma(self) -> list[RdmaDevice] | None:
        try:
            # The audits read ports, firmware and links, no counter.
            return read_rdma_devices(self.sysfs_root, counters=NO_COUNTERS)
        except FileNotFoundError:
            return []  # no RDMA hardware: nothing to audit, not unknown
        except OSError as err:
            log.debug("RDMA devices unreadable: %s", err)
            return None

    def collect(self) -> list[Metric]:
        run = self.run()
        status = GaugeMetricFamily(
            "clusterhealth_check_status",
            "Audit and health check result: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.",
            labels=["check", "subject"],
        )
        last_run = GaugeMetricFamily(
            "clusterhealth_check_last_run_timestamp_seconds",
            "When the check last ran (Unix time).",
            labels=["check"],
        )
        firmware = GaugeMetricFamily(
            "clusterhealth_firmware_info",
            "Firmware, VBIOS and driver versions, value 1: compare across nodes to find drift.",
            labels=["component", "subject", "version"],
        )
        for result in run.results:
            status.add_metric([result.check, result.subject], float(result.status))
        for check in dict.fromkeys(r.check for r in run.results):
            last_run.add_metric([check], run.finished_at)
        for component, subject, version in run.firmware:
            firmware.add_metric([component, subject, version], 1.0)
        return [family for family in (status, last_run, firmware) if family.samples]
