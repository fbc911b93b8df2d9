"""Who runs on each GPU: the sources' claims merged by one stated precedence.

Three sources claim GPUs for workloads:

1. `pod_resources`, the kubelet's record of the devices it allocated to each container;
2. `mapping_dir`, the files the Slurm Prolog writes for the GPUs it allocated to a job;
3. `cgroup`, the cgroup of each process NVML sees computing on a GPU.

The first two say what the scheduler allocated; the third what runs now, which misses a job
between its steps and cannot name a pod (only its UID). So for each GPU the claims of the first
source in that order that claims it are the GPU's workloads (several when jobs share it); the
others are only compared with them. A lower source's workload that contradicts every workload of
the winner makes the GPU a conflict: another scheduler, another Slurm job, another pod UID. A pod
named by pod-resources and a pod UID from a cgroup cannot be compared and never conflict; nor can
a Slurm array task or heterogeneous component as a site's mapping files may name it (`4242_7`,
`4243+1`) and the job id of a cgroup: each task and component has a job id of its own
(SLURM_JOB_ID, `job_<id>` in its cgroup), which that notation does not say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

PRECEDENCE = ("pod_resources", "mapping_dir", "cgroup")
# A Slurm job id as SLURM_JOB_ID and the cgroup's `job_<id>` give it; `4242_7` (array job 4242,
# task 7) and `4243+1` (heterogeneous job 4243, component 1) are other notations of a job.
_SLURM_JOB_ID = re.compile(r"\d+")


def is_slurm_job_id(job: str) -> bool:
    """Whether `job` is a Slurm job id itself, the one in its cgroup (not an array task's or a
    heterogeneous component's notation, which names its job some other way)."""
    return _SLURM_JOB_ID.fullmatch(job) is not None


@dataclass(frozen=True, order=True)
class Workload:
    """A Slurm job (`job`: its id) or a Kubernetes pod (`namespace`, `pod`, `container` when the
    kubelet named it; `job`: its UID when only a cgroup did). Labels that do not apply are empty."""

    scheduler: str
    job: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""

    def describe(self) -> str:
        if self.scheduler == "slurm":
            return f"Slurm job {self.job}"
        if self.pod:
            where = f"{self.namespace}/{self.pod}"
            return f"pod {where}" + (f" ({self.container})" if self.container else "")
        return f"pod UID {self.job}"


@dataclass(frozen=True, order=True)
class Claim:
    gpu: int
    workload: Workload
    source: str


def _contradicts(winner: Workload, other: Workload) -> bool:
    if winner.scheduler != other.scheduler:
        return True
    if winner.scheduler == "slurm":
        if is_slurm_job_id(winner.job) != is_slurm_job_id(other.job):
            return False  # `4242_7` against `job_4249`: the notation does not say the task's own id
        return winner.job != other.job
    if bool(winner.pod) != bool(other.pod):
        return False  # a pod's name against a pod UID: nothing to compare
    if winner.pod:
        return (winner.namespace, winner.pod) != (other.namespace, other.pod)
    return winner.job != other.job


@dataclass(frozen=True)
class Attribution:
    """The merged claims: each attributed GPU's workloads and the source they came from."""

    claims: tuple[Claim, ...] = ()
    conflicts: Mapping[int, tuple[Claim, ...]] = field(default_factory=dict)  # GPU -> the lower claims

    def workloads(self, gpu: int) -> list[Workload]:
        return [c.workload for c in self.claims if c.gpu == gpu]

    def gpus(self) -> set[int]:
        return {c.gpu for c in self.claims}


def merge(claims: Iterable[Claim]) -> Attribution:
    by_gpu: dict[int, dict[str, set[Workload]]] = {}
    for claim in claims:
        by_gpu.setdefault(claim.gpu, {}).setdefault(claim.source, set()).add(claim.workload)
    kept: list[Claim] = []
    conflicts: dict[int, tuple[Claim, ...]] = {}
    for gpu, sources in sorted(by_gpu.items()):
        ranked = [s for s in PRECEDENCE if s in sources]
        winner = ranked[0]
        kept += [Claim(gpu, w, winner) for w in sorted(sources[winner])]
        against = [
            Claim(gpu, w, source)
            for source in ranked[1:]
            for w in sorted(sources[source])
            if all(_contradicts(mine, w) for mine in sources[winner])
        ]
        if against:
            conflicts[gpu] = tuple(against)
    return Attribution(tuple(kept), conflicts)


__all__ = ["PRECEDENCE", "Attribution", "Claim", "Workload", "is_slurm_job_id", "merge"]
