"""The `jobs` collector: which workload runs on each GPU, as one join series per (GPU, workload).

It reads three sources (exporters/jobs/attribution.py says their precedence), each with its own
outcome: read, absent from this node (no kubelet socket, no mapping directory: not a failure, said
once at info level), or failed (a kubelet that hangs or answers garbage, an unreadable or malformed
mapping file, /proc unreadable). A failed source fails the run (`clusterhealth_scrape_collector_success`
0, the reasons in /healthz, logged once by the sampler when they change) while everything the other
sources read is still exported.

It never calls NVML: the GPUs' identities, minor numbers, MIG devices and compute processes come
from what the gpu collector published this cycle. A GPU that stops answering keeps the minor
number and MIG devices it last had, so the job on a GPU that fell off the bus is still named.

Exported:

- `clusterhealth_gpu_job_info{gpu, uuid, scheduler, job, namespace, pod, container, source}` 1;
- `clusterhealth_gpu_job_source_success{source}`: 1 read, 0 failed (absent sources: no series);
- `clusterhealth_gpu_job_unattributed_busy_gpus`: GPUs with compute processes no source attributes;
- `clusterhealth_gpu_job_conflicting_gpus`: GPUs about which two sources disagree (absent while
  fewer than two sources are on the node);
- `clusterhealth_gpu_job_mapping_expired_files`: mapping files whose jobs have no cgroup any more.

Job labels go on the info series only, never on GPU series: a series per (GPU, workload) costs one
series per GPU and job, where a `job` label on every GPU series would multiply them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.base import CollectorFailed, NoData
from clusterhealth.exporters.gpu import GpuReading, GpuState, MigDevice
from clusterhealth.exporters.jobs.attribution import (
    PRECEDENCE,
    Attribution,
    Claim,
    Workload,
    is_slurm_job_id,
    merge,
)
from clusterhealth.exporters.jobs.cgroup import read_owner, slurm_jobs
from clusterhealth.exporters.jobs.mapping import read_mapping_dir
from clusterhealth.exporters.jobs.podresources import (
    GpuIds,
    PodResourcesClient,
    SourceAbsent,
    SourceFailed,
    gpu_of,
    is_gpu_resource,
)

log = logging.getLogger("clusterhealth.jobs")

INFO_LABELS = ["gpu", "uuid", "scheduler", "job", "namespace", "pod", "container", "source"]


@dataclass
class SourceResult:
    source: str
    claims: list[Claim] = field(default_factory=list)
    absent: bool = False
    problems: list[str] = field(default_factory=list)  # any: the source failed
    notes: list[str] = field(default_factory=list)  # worth a log line once, not a failure
    expired_files: int | None = None


@dataclass(frozen=True)
class _Known:
    uuid: str
    minor_number: int | None
    mig_devices: tuple[MigDevice, ...]


# What the collector hands `check` after each run: the merged attribution, or None and why not.
Publish = Callable[[Attribution | None, str | None], None]


def _ended(job: str, running: set[str]) -> bool:
    """Whether the job a mapping file names has ended, by the Slurm jobs that have a cgroup here.

    A cgroup is named by the job's own id, so only that id can be looked up. An array task (`4242_7`)
    or a heterogeneous component (`4243+1`) has an id of its own too (task 7 may run as job 4249, and
    job 4242 is another task), which that notation does not say: it has ended only when no Slurm job
    at all runs on the node.
    """
    if is_slurm_job_id(job):
        return job not in running
    return not running


class JobsCollector:
    name = "jobs"

    def __init__(
        self,
        gpu_state: Callable[[], tuple[GpuState | None, str]],
        publish: Publish = lambda attribution, reason: None,
        *,
        pod_resources_socket: str | None,
        mapping_dir: str | None,
        mapping_index: str = "minor",
        mapping_grace_seconds: float = 300.0,
        processes: bool = True,
        procfs_root: str = "/proc",
        sysfs_root: str = "/sys",
        extra_resources: Sequence[str] = (),
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
    ):
        self._gpu_state, self._publish = gpu_state, publish
        self.client = PodResourcesClient(pod_resources_socket) if pod_resources_socket else None
        self.mapping_dir, self.mapping_index = mapping_dir, mapping_index
        self.mapping_grace_seconds = mapping_grace_seconds
        self.processes, self.procfs_root, self.sysfs_root = processes, procfs_root, sysfs_root
        self.extra_resources = tuple(extra_resources)
        # Half the collector's timeout: a kubelet that hangs fails its source in time for the
        # others to be exported by the same run.
        self.call_timeout = max(0.5, timeout_seconds / 2)
        self._clock = clock
        self._known: dict[int, _Known] = {}
        # What was logged, per source, so that each message is said once while it lasts.
        self._said: dict[str, set[str]] = {}

    # -- sources ------------------------------------------------------------------------------

    def _pod_resources(self, ids: GpuIds) -> SourceResult:
        result = SourceResult("pod_resources")
        if self.client is None:
            result.absent = True
            return result
        try:
            assignments = self.client.list(self.call_timeout)
        except SourceAbsent as absent:
            result.absent = True
            result.notes.append(str(absent))
            return result
        except SourceFailed as failed:
            result.problems.append(str(failed))
            return result
        for a in assignments:
            if not is_gpu_resource(a.resource, self.extra_resources):
                continue
            gpu = gpu_of(a.device_id, ids)
            if gpu is None:
                result.notes.append(
                    f"device {a.device_id} ({a.resource}) of {a.namespace}/{a.pod} is no GPU here"
                )
                continue
            workload = Workload("kubernetes", namespace=a.namespace, pod=a.pod, container=a.container)
            result.claims.append(Claim(gpu, workload, result.source))
        return result

    def _mapping(self, ids: GpuIds, known: dict[int, _Known], readings: Sequence[GpuReading]) -> SourceResult:
        result = SourceResult("mapping_dir")
        if not self.mapping_dir:
            result.absent = True
            return result
        try:
            read = read_mapping_dir(self.mapping_dir)
        except OSError as error:
            result.problems.append(f"{self.mapping_dir}: {sysfs.errno_name(error)}")
            return result
        if read is None:
            result.absent = True
            result.notes.append(f"no job-mapping directory at {self.mapping_dir}")
            return result
        result.problems += [f"{self.mapping_dir}/{p}" for p in read.problems]
        running = slurm_jobs(self.sysfs_root) if read.files else None
        now = self._clock()
        result.expired_files = 0
        for f in read.files:
            gpu = ids.by_minor.get(f.index) if self.mapping_index == "minor" else f.index
            if gpu is None or gpu not in known:
                what = "minor number" if self.mapping_index == "minor" else "index"
                message = f"{self.mapping_dir}/{f.name}: no GPU with {what} {f.index} here"
                if len(known) < len(readings):
                    # A GPU lost before it told its minor number may be the one the file names.
                    result.notes.append(message + " (or it is a GPU that never answered NVML)")
                else:
                    result.problems.append(message)
                continue
            jobs = f.jobs
            # The Prolog writes a file before slurmstepd makes the job's cgroup: a young file stays.
            if running is not None and now - f.modified > self.mapping_grace_seconds:
                jobs = tuple(j for j in jobs if not _ended(j, running))
                if f.jobs and not jobs:
                    result.expired_files += 1
                    result.notes.append(f"{self.mapping_dir}/{f.name}: job {', '.join(f.jobs)} has ended")
            result.claims += [Claim(gpu, Workload("slurm", job=job), result.source) for job in jobs]
        return result

    def _cgroups(self, readings: Sequence[GpuReading]) -> SourceResult:
        result = SourceResult("cgroup")
        if not self.processes:
            result.absent = True
            return result
        for r in readings:
            for pid in r.compute_pids or ():
                owner = read_owner(self.procfs_root, pid)
                if isinstance(owner, sysfs.Failure):
                    if owner.reason != "ENOENT":  # ENOENT: the process exited since NVML listed it
                        result.problems.append(f"{self.procfs_root}/{pid}/cgroup: {owner.reason}")
                    continue
                if owner is None:
                    continue
                if owner.scheduler == "slurm":
                    workload = Workload("slurm", job=owner.job)
                else:
                    workload = Workload("kubernetes", job=owner.pod_uid)
                result.claims.append(Claim(r.index, workload, result.source))
        return result

    # -- one run ------------------------------------------------------------------------------

    def _identities(self, readings: Sequence[GpuReading]) -> tuple[dict[int, _Known], GpuIds]:
        for r in readings:
            if r.up and r.uuid:
                self._known[r.index] = _Known(r.uuid, r.minor_number, r.mig_devices)
        known = {}
        for r in readings:
            was = self._known.get(r.index)
            # A lost GPU keeps what it told while it answered, if it is still the same GPU.
            if was is not None and (r.up or r.uuid in ("", was.uuid)):
                known[r.index] = was
        ids = GpuIds()
        for index, k in known.items():
            ids.by_uuid[k.uuid] = index
            if k.minor_number is not None:
                ids.by_minor[k.minor_number] = index
            for mig in k.mig_devices:
                ids.by_mig_uuid[mig.uuid] = index
        return known, ids

    def collect(self) -> list[Metric]:
        state, why = self._gpu_state()
        if state is None:
            # The gpu collector's own failure says why (once): no second alarm from here.
            self._publish(None, why)
            raise NoData(f"the GPUs are unknown: {why}")
        if not state.readings:
            self._publish(Attribution(), None)
            raise NoData("no GPU on this node")
        known, ids = self._identities(state.readings)
        results = [
            self._pod_resources(ids),
            self._mapping(ids, known, state.readings),
            self._cgroups(state.readings),
        ]
        attribution = merge(c for r in results for c in r.claims)
        self._publish(attribution, None)
        self._tell(results, attribution)
        families = self._families(state.readings, known, results, attribution)
        failed = [f"{r.source}: {'; '.join(r.problems)}" for r in results if r.problems]
        if failed:
            raise CollectorFailed(" | ".join(failed), families)
        return families

    def _tell(self, results: Sequence[SourceResult], attribution: Attribution) -> None:
        """Log each note and conflict once, when it first appears. (A failed source's reasons make
        the run's failure, which the sampler logs once and /healthz shows.)"""
        for r in results:
            said = self._said.get(r.source, set())
            for message in r.notes:
                if message not in said:
                    log.info("job attribution, %s: %s", r.source, message)
            self._said[r.source] = set(r.notes)
        current = {
            f"GPU {gpu}: {c.source} names {c.workload.describe()}, against "
            + ", ".join(w.describe() for w in attribution.workloads(gpu))
            for gpu, claims in attribution.conflicts.items()
            for c in claims
        }
        for message in sorted(current - self._said.get("conflicts", set())):
            log.warning("job attribution conflict: %s", message)
        self._said["conflicts"] = current

    def _families(
        self,
        readings: Sequence[GpuReading],
        known: dict[int, _Known],
        results: Sequence[SourceResult],
        attribution: Attribution,
    ) -> list[Metric]:
        info = GaugeMetricFamily(
            "clusterhealth_gpu_job_info",
            "The workload (Slurm job or Kubernetes container) on a GPU, value 1: one series per GPU and "
            "workload, to join onto GPU series with * on (instance, gpu, uuid) group_left (...).",
            labels=INFO_LABELS,
        )
        for claim in attribution.claims:
            w = claim.workload
            uuid = known[claim.gpu].uuid if claim.gpu in known else ""
            info.add_metric(
                [str(claim.gpu), uuid, w.scheduler, w.job, w.namespace, w.pod, w.container, claim.source], 1.0
            )
        success = GaugeMetricFamily(
            "clusterhealth_gpu_job_source_success",
            "1 if the attribution source was read, 0 if it failed (a source absent from the node has no "
            "series).",
            labels=["source"],
        )
        for r in sorted(results, key=lambda r: PRECEDENCE.index(r.source)):
            if not r.absent:
                success.add_metric([r.source], 0.0 if r.problems else 1.0)
        busy = [r for r in readings if r.up and r.compute_pids]
        unattributed = GaugeMetricFamily(
            "clusterhealth_gpu_job_unattributed_busy_gpus",
            "GPUs with compute processes that no source attributes to a workload.",
        )
        if all(r.compute_pids is not None for r in readings if r.up):
            unattributed.add_metric([], float(len({r.index for r in busy} - attribution.gpus())))
        conflicting = GaugeMetricFamily(
            "clusterhealth_gpu_job_conflicting_gpus",
            "GPUs about which two attribution sources name different workloads (the higher source wins).",
        )
        # A conflict takes two sources: with one read, the count could only ever be 0.
        if sum(1 for r in results if not r.absent) >= 2:
            conflicting.add_metric([], float(len(attribution.conflicts)))
        expired = GaugeMetricFamily(
            "clusterhealth_gpu_job_mapping_expired_files",
            "Job-mapping files left out because their jobs have no cgroup any more (an Epilog did not "
            "remove them).",
        )
        for r in results:
            if r.expired_files is not None:
                expired.add_metric([], float(r.expired_files))
        return [f for f in (info, success, unattributed, conflicting, expired) if f.samples]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


__all__ = ["JobsCollector"]
