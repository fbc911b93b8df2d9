"""What communication costs a synchronous data-parallel job: the communication-wall models.

Pure functions of measured or stated inputs, in base units (bytes, seconds, bytes per second).
They are the arithmetic behind `clusterhealth model` and behind the `impact` that `analyze`
puts on every suspect and on a fleet-wide slowdown (``impact`` below).

The conventions are nccl-tests' (doc/PERFORMANCE.md in NVIDIA/nccl-tests):

- algorithm bandwidth: algbw = S / t, for a collective over S bytes that took t seconds;
- bus bandwidth: busbw = algbw · factor(n), the factor making busbw comparable with a link's
  rate whatever the rank count: all-reduce 2(n−1)/n; all-gather, reduce-scatter and all-to-all
  (n−1)/n; broadcast, reduce and send/receive 1.

The ring all-reduce (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters
of workstations", JPDC 2009) sends 2(n−1) messages of S/n bytes per rank over the slowest link of
the ring: t = 2(n−1)/n · S/B + 2(n−1)·α, α the per-message latency. Its busbw is therefore B, the
bottleneck link's bandwidth, which is why a probe's bus bandwidth is the B of this model.

A training step overlaps part of its communication with its compute (gradient buckets are
reduced while the backward pass goes on): T = τ_comp + τ_comm − η·min(τ_comp, τ_comm), η the
overlap fraction (0 = none, 1 = perfect). γ = τ_comm / τ_comp says whether the job is compute-
(γ < 1) or communication-bound (γ > 1). Accumulating gradients over k micro-batches before one
all-reduce multiplies the compute per synchronisation by k and so divides γ by k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

# Bus-bandwidth factor of each collective as a function of the rank count n (nccl-tests).
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
COLLECTIVES = tuple(_BUS_FACTORS)


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw/algbw factor of `collective` over `ranks` ranks (≥ 1)."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, not {ranks}")
    try:
        return float(_BUS_FACTORS[collective](ranks))
    except KeyError:
        raise ValueError(f"unknown collective {collective!r} (one of {', '.join(COLLECTIVES)})") from None


def algorithm_bandwidth(size_bytes: float, seconds: float) -> float:
    """algbw = S / t in bytes per second."""
    return size_bytes / seconds


def bus_bandwidth(size_bytes: float, seconds: float, collective: str, ranks: int) -> float:
    """busbw = algbw · factor(n) in bytes per second, as nccl-tests prints it."""
    return algorithm_bandwidth(size_bytes, seconds) * bus_factor(collective, ranks)


def ring_allreduce_seconds(
    size_bytes: float, ranks: int, bandwidth: float, latency_seconds: float = 0.0
) -> float:
    """Seconds a ring all-reduce of `size_bytes` takes over `ranks` ranks whose slowest link
    carries `bandwidth` bytes per second: 2(n−1)/n · S/B + 2(n−1)·α. One rank moves nothing."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, not {bandwidth}")
    return bus_factor("all_reduce", ranks) * size_bytes / bandwidth + 2 * (ranks - 1) * latency_seconds


def step_seconds(compute_seconds: float, comm_seconds: float, overlap: float = 0.0) -> float:
    """T = τ_comp + τ_comm − η·min(τ_comp, τ_comm): the time of one synchronised step."""
    _check_fraction("overlap", overlap)
    return compute_seconds + comm_seconds - overlap * min(compute_seconds, comm_seconds)


def comm_compute_ratio(comm_seconds: float, compute_seconds: float, accumulation: int = 1) -> float:
    """γ = τ_comm / (k·τ_comp): above 1 the job waits on the network more than it computes."""
    return comm_seconds / (accumulation * compute_seconds)


def scaling_efficiency(compute_seconds: float, step: float) -> float:
    """The share of a step spent computing: the step time one GPU alone would take over the step
    time the synchronised job takes (1 = communication costs nothing)."""
    return compute_seconds / step


def comm_budget_seconds(compute_seconds: float, overlap: float, target_efficiency: float) -> float:
    """The longest communication time that still keeps scaling efficiency at `target_efficiency`
    (the inverse of `step_seconds` for a given compute time; math.inf when any will do)."""
    _check_fraction("overlap", overlap)
    if not 0 < target_efficiency <= 1:
        raise ValueError(f"target efficiency must be in (0, 1], not {target_efficiency}")
    allowed_step = compute_seconds / target_efficiency
    # While comm ≤ compute, T = C + (1 − η)·comm; beyond, T = comm + (1 − η)·C. Both increase
    # with comm, so the budget is where T reaches the allowed step.
    within = math.inf if overlap == 1 else (allowed_step - compute_seconds) / (1 - overlap)
    if within <= compute_seconds:
        return within
    return allowed_step - (1 - overlap) * compute_seconds


def bandwidth_for_comm_seconds(
    size_bytes: float, ranks: int, comm_seconds: float, latency_seconds: float = 0.0
) -> float:
    """The bottleneck bandwidth at which a ring all-reduce of `size_bytes` takes `comm_seconds`
    (math.inf when the latency alone takes longer; 0 when one rank has nothing to move)."""
    volume = bus_factor("all_reduce", ranks) * size_bytes
    if volume == 0:
        return 0.0
    if math.isinf(comm_seconds):
        return 0.0
    transfer = comm_seconds - 2 * (ranks - 1) * latency_seconds
    return math.inf if transfer <= 0 else volume / transfer


@dataclass(frozen=True)
class Workload:
    """A synchronous data-parallel job: what it reduces each step and how long it computes."""

    params: float
    bytes_per_param: float
    gpus: int
    compute_seconds: float  # per micro-batch, on one GPU
    overlap: float = 0.0
    accumulation: int = 1
    latency_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.params <= 0 or self.bytes_per_param <= 0:
            raise ValueError("params and bytes per param must be positive")
        if self.gpus < 1:
            raise ValueError(f"gpus must be at least 1, not {self.gpus}")
        if self.compute_seconds <= 0:
            raise ValueError(f"compute seconds must be positive, not {self.compute_seconds}")
        if self.accumulation < 1:
            raise ValueError(f"accumulation must be at least 1, not {self.accumulation}")
        if self.latency_seconds < 0:
            raise ValueError(f"latency must not be negative, not {self.latency_seconds}")
        _check_fraction("overlap", self.overlap)

    @property
    def gradient_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def compute_per_step(self) -> float:
        """Compute between two all-reduces: k micro-batches."""
        return self.accumulation * self.compute_seconds


@dataclass(frozen=True)
class Estimate:
    """The model's answer for one workload at one bandwidth; the keys of `model --json`."""

    gradient_bytes: float
    bandwidth_bytes_per_second: float
    allreduce_seconds: float
    compute_seconds: float
    step_seconds: float
    comm_compute_ratio: float
    scaling_efficiency: float
    bandwidth_for_target_bytes_per_second: float | None
    target_efficiency: float | None

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self).items()}


def estimate(workload: Workload, bandwidth: float, target_efficiency: float | None = None) -> Estimate:
    """Step time, γ and efficiency of `workload` when its slowest link carries `bandwidth`."""
    comm = ring_allreduce_seconds(workload.gradient_bytes, workload.gpus, bandwidth, workload.latency_seconds)
    compute = workload.compute_per_step
    step = step_seconds(compute, comm, workload.overlap)
    needed = None
    if target_efficiency is not None:
        budget = comm_budget_seconds(compute, workload.overlap, target_efficiency)
        needed = bandwidth_for_comm_seconds(
            workload.gradient_bytes, workload.gpus, budget, workload.latency_seconds
        )
    return Estimate(
        gradient_bytes=workload.gradient_bytes,
        bandwidth_bytes_per_second=bandwidth,
        allreduce_seconds=comm,
        compute_seconds=compute,
        step_seconds=step,
        comm_compute_ratio=comm_compute_ratio(comm, workload.compute_seconds, workload.accumulation),
        scaling_efficiency=scaling_efficiency(compute, step),
        bandwidth_for_target_bytes_per_second=needed,
        target_efficiency=target_efficiency,
    )


def slowdown(workload: Workload, reference_bandwidth: float, bandwidth: float) -> float:
    """How many times longer a step of `workload` takes when its slowest link carries `bandwidth`
    instead of `reference_bandwidth` (1 = no cost)."""
    before = estimate(workload, reference_bandwidth).step_seconds
    return estimate(workload, bandwidth).step_seconds / before


def _check_fraction(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be between 0 and 1, not {value}")


# --- the price of a suspect (analyze's `impact`) ---------------------------------------------

# The stated workload a suspect is priced for when no job attribution names the real jobs: a
# 7B-parameter model's BF16 gradients reduced once a step by a 64-GPU data-parallel job computing
# 1 s a step, nothing overlapped (docs/cost.md, docs/fabric.md). analyze's flags change it.
IMPACT_WORKLOAD = Workload(params=7e9, bytes_per_param=2, gpus=64, compute_seconds=1.0, overlap=0.0)
HOURS_PER_DAY = 24


@dataclass(frozen=True)
class Job:
    """A workload of clusterhealth_gpu_job_info on a suspect's node, with its GPUs everywhere."""

    scheduler: str
    job: str
    namespace: str
    pod: str
    gpus: int


@dataclass(frozen=True)
class Impact:
    """What a bandwidth at ``bandwidth_ratio`` of the reference costs a job whose ring crosses it."""

    bandwidth_ratio: float
    reference_bandwidth: float  # bytes/s
    workload: Workload
    step_slowdown: float  # math.inf when no bandwidth is left (the collective never completes)
    gpu_hours_per_day: float
    jobs: tuple[tuple[Job, float, float], ...] | None = None  # (job, step slowdown, GPU-hours/day)

    @property
    def allreduce_slowdown(self) -> float:
        return math.inf if self.bandwidth_ratio <= 0 else 1 / self.bandwidth_ratio

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        document: dict[str, Any] = {
            "bandwidth_ratio": self.bandwidth_ratio,
            "allreduce_slowdown": _finite(self.allreduce_slowdown),
            "step_slowdown": _finite(self.step_slowdown),
            "gpu_hours_per_day": self.gpu_hours_per_day,
            "workload": {
                "params": w.params,
                "bytes_per_param": w.bytes_per_param,
                "gpus": w.gpus,
                "compute_seconds": w.compute_seconds,
                "overlap": w.overlap,
            },
            "reference_bandwidth_bytes_per_second": self.reference_bandwidth,
        }
        if self.jobs is not None:
            document["jobs"] = [
                {
                    "scheduler": job.scheduler,
                    "job": job.job,
                    "namespace": job.namespace,
                    "pod": job.pod,
                    "gpus": job.gpus,
                    "step_slowdown": _finite(step),
                    "gpu_hours_per_day": lost,
                }
                for job, step, lost in self.jobs
            ]
        return document


def step_slowdown(workload: Workload, ratio: float, reference_bandwidth: float) -> float:
    """step(M_ref / r) / step(M_ref), M_ref the ring all-reduce of the workload's gradients at the
    reference bandwidth (no latency term: a bandwidth ratio says nothing about latency).
    math.inf when r is 0 and the ring moves anything (a job of one GPU reduces nothing: 1)."""
    if ratio < 0 or reference_bandwidth <= 0:
        raise ValueError(f"ratio must not be negative ({ratio}) and the reference must be positive")
    if workload.gpus == 1:
        return 1.0
    if ratio == 0:
        return math.inf
    return slowdown(replace(workload, latency_seconds=0.0), reference_bandwidth, ratio * reference_bandwidth)


def gpu_hours_per_day(gpus: int, slowdown: float) -> float:
    """GPU-hours a day a job of ``gpus`` GPUs loses when each step takes ``slowdown`` times longer:
    it does in a day what it would have done in 24/slowdown hours."""
    return gpus * HOURS_PER_DAY * (1 - 1 / slowdown)


def impact(
    ratio: float,
    reference_bandwidth: float,
    workload: Workload = IMPACT_WORKLOAD,
    jobs: Sequence[Job] | None = None,
) -> Impact:
    """The price of a suspect at ``ratio`` of the reference: for the stated workload, and for each
    of ``jobs`` (the real ones on its nodes, each with its own GPU count) when given, in which
    case the GPU-hours per day are theirs, summed."""
    slowdown = step_slowdown(workload, ratio, reference_bandwidth)
    lost = gpu_hours_per_day(workload.gpus, slowdown)
    priced = None
    if jobs is not None:
        rows = []
        for job in jobs:
            own = replace(workload, gpus=job.gpus)
            s = step_slowdown(own, ratio, reference_bandwidth)
            rows.append((job, s, gpu_hours_per_day(job.gpus, s)))
        priced = tuple(
            sorted(
                rows, key=lambda row: (-row[2], row[0].scheduler, row[0].job, row[0].namespace, row[0].pod)
            )
        )
        lost = sum(row[2] for row in priced)
    return Impact(ratio, reference_bandwidth, workload, slowdown, lost, priced)


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value
