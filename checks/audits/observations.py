"""What the checks compare with the policy: the node as the collectors last read it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from clusterhealth.checks.audits.status import NODE, CheckResult, Status
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.exporters.gpu import GpuReading
from clusterhealth.exporters.infiniband import RdmaDevice


@dataclass(frozen=True)
class Observations:
    """None means "could not be read", and the `*_unreadable` field says why; the checks that need
    it report UNKNOWN with that reason, never OK. A node without such hardware has an empty list.
    """

    gpus: Sequence[GpuReading] | None  # sorted by index
    driver_version: str | None
    rdma: Sequence[RdmaDevice] | None
    netdev_mtus: Mapping[str, int] | None
    # The kernel-log events the watcher kept and the counted Xids (both sources), newest last.
    kernel_events: Sequence[SeenEvent] | None
    # Time since boot on the events' clock (CLOCK_MONOTONIC, `time.monotonic()`).
    now_boot_seconds: float
    gpus_unreadable: str = "NVML could not be read"
    kernel_events_unreadable: str = "the kernel log could not be read"

    @classmethod
    def of(
        cls,
        *,
        gpus: Sequence[GpuReading] | None,
        driver_version: str | None,
        rdma: Sequence[RdmaDevice] | None,
        netdev_mtus: Mapping[str, int] | None,
        kernel_events: Sequence[SeenEvent] | None,
        now_boot_seconds: float,
        gpus_unreadable: str | None = None,
        kernel_events_unreadable: str | None = None,
    ) -> Observations:
        return cls(
            gpus=sorted(gpus, key=lambda g: g.index) if gpus is not None else None,
            driver_version=driver_version,
            rdma=rdma,
            netdev_mtus=netdev_mtus,
            kernel_events=kernel_events,
            now_boot_seconds=now_boot_seconds,
            gpus_unreadable=gpus_unreadable or cls.gpus_unreadable,
            kernel_events_unreadable=kernel_events_unreadable or cls.kernel_events_unreadable,
        )


def gpus_unreadable(check: str, obs: Observations) -> list[CheckResult]:
    return [CheckResult(check, NODE, Status.UNKNOWN, f"{obs.gpus_unreadable}, so no GPU was checked")]


def lost(check: str, gpu: GpuReading) -> CheckResult:
    return CheckResult(
        check, str(gpu.index), Status.UNKNOWN, f"GPU {gpu.index} does not answer NVML (see gpu_lost)"
    )


def each_gpu(check: str, obs: Observations, judge: Callable[[GpuReading], CheckResult]) -> list[CheckResult]:
    """`judge` on every GPU that answers NVML: the per-GPU checks' one treatment of unreadable NVML
    (one UNKNOWN for the node) and of a lost GPU (UNKNOWN, see gpu_lost)."""
    if obs.gpus is None:
        return gpus_unreadable(check, obs)
    return [judge(gpu) if gpu.up else lost(check, gpu) for gpu in obs.gpus]
