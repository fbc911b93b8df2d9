"""The recording rules the alerts and dashboards read (group `clusterhealth.rules`), named
`level:metric:operations`. The job rules record their own (jobs.py)."""

from __future__ import annotations

from .config import Config
from .lib import Group, Record, alternation, selector


def group(c: Config) -> Group:
    return Group(
        "clusterhealth.rules",
        [
            *stragglers(c),
            *clock_slowdown(c),
            *throttle_time(c),
            *impact(c),
            *firmware(c),
            *mtu(c),
            *checks(c),
        ],
    )


def stragglers(c: Config) -> list[Record]:
    """The SM clock of busy GPUs, with the GPU model (`name`) so that medians compare like with
    like, and the fleet's median of each node-local probe."""
    m = selector(c)
    local = m('peer=""')
    return [
        Record(
            "instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy",
            f"""(
  clusterhealth_gpu_sm_clock_hertz{m()}
  * on (instance, job, gpu, uuid) group_left (name)
  clusterhealth_gpu_info{m()}
)
and on (instance, job, gpu, uuid)
clusterhealth_gpu_utilization_ratio{m()} > {c.busy_utilization}""",
        ),
        Record(
            "instance:clusterhealth_gpu_sm_clock_hertz:busy_median",
            "quantile by (instance, job, name) (0.5, instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy)",
        ),
        Record(
            "job:clusterhealth_gpu_sm_clock_hertz:busy_median",
            "quantile by (job, name) (0.5, instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy)",
        ),
        Record(
            "job_probe:clusterhealth_probe_bandwidth_bytes_per_second:median",
            f"quantile by (job, probe) (0.5, clusterhealth_probe_bandwidth_bytes_per_second{local})",
        ),
        Record(
            "job_probe:clusterhealth_probe_bandwidth_bytes_per_second:nodes",
            f"count by (job, probe) (clusterhealth_probe_bandwidth_bytes_per_second{local})",
        ),
    ]


def clock_slowdown(c: Config) -> list[Record]:
    """f_max / f_eff of each busy GPU: its maximum SM clock over its SM clock. A synchronous job's
    compute on that GPU takes about this many times as long as at the maximum (issue 20); JobStraggler
    quotes it."""
    m = selector(c)
    return [
        Record(
            CLOCK_SLOWDOWN,
            f"""clusterhealth_gpu_sm_clock_max_hertz{m()}
/ on (instance, job, gpu, uuid)
instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy""",
        )
    ]


CLOCK_SLOWDOWN = "instance_gpu:clusterhealth_gpu_sm_clock_max_hertz:over_busy_sm_clock"

# The impact of each node of a pairwise group (issue 20; docs/cost.md's model, which `analyze`
# applies to its suspects): what a ring all-reduce through the node, and a step of the stated
# workload, cost against the group's reference.
MEETINGS = "instance_probe:clusterhealth_probe_bandwidth_bytes_per_second:pairwise_median"
REFERENCE = "job_probe:clusterhealth_probe_bandwidth_bytes_per_second:pairwise_reference"
RATIO = "instance_probe:clusterhealth_probe_bandwidth_bytes_per_second:pairwise_ratio"
_NODE_BANDWIDTH = "instance_probe:clusterhealth_probe_bandwidth_bytes_per_second:"
ALLREDUCE_SLOWDOWN = _NODE_BANDWIDTH + "pairwise_allreduce_slowdown"
STEP_SLOWDOWN = _NODE_BANDWIDTH + "pairwise_step_slowdown"
GPU_HOURS_LOST = _NODE_BANDWIDTH + "pairwise_gpu_hours_lost_per_day"


def ring_bytes(c: Config) -> float:
    """What each rank of a ring all-reduce of the workload's gradients moves through its slowest
    link: 2(n-1)/n of the gradient bytes (the seconds it takes are this over the bandwidth)."""
    return 2 * (c.impact_gpus - 1) / c.impact_gpus * (c.impact_params * c.impact_bytes_per_param)


def number(value: float) -> str:
    """A PromQL literal of `value` that parses back to the same float."""
    text = repr(float(value))
    return text.removesuffix(".0") if abs(value) < 1e16 else text


def step(c: Config, allreduce: str) -> str:
    """T = compute + comm - overlap * min(compute, comm), with comm the expression `allreduce`
    (without its last term when nothing overlaps)."""
    compute = number(c.impact_compute_seconds)
    if not c.impact_overlap:
        return f"{compute} + {allreduce}"
    return f"{compute} + {allreduce} - {number(c.impact_overlap)} * clamp_max({allreduce}, {compute})"


def impact(c: Config) -> list[Record]:
    """Per node of a pairwise group (a probe that exports clusterhealth_probe_round):

    - its typical meeting bandwidth B: the median, over its partners, of each meeting's median
      over `pairwise_host_window` (a failed meeting measures nothing and is left out);
    - the group's reference B_ref: the median of its nodes' B (one bad node of three or more
      leaves it where the others are, as analyze's reference that leaves the slow out does);
    - r = B / B_ref; the all-reduce slowdown 1/r;
    - the step slowdown step(V/B) / step(V/B_ref), V the bytes a rank moves (`ring_bytes`);
    - the GPU-hours a day the job of `impact_gpus` GPUs loses: gpus · 24 · (1 - 1/slowdown),
      none for a node at or above the reference."""
    m = selector(c)
    meetings = "clusterhealth_probe_bandwidth_bytes_per_second" + m('peer!=""')
    volume = number(ring_bytes(c))
    return [
        Record(
            MEETINGS,
            f"""quantile by (job, instance, probe) (
  0.5,
  quantile_over_time(0.5, {meetings}[{c.pairwise_host_window}])
  and on (instance, job, probe)
  clusterhealth_probe_round{m()}
)""",
        ),
        Record(REFERENCE, f"quantile by (job, probe) (0.5, {MEETINGS})"),
        Record(RATIO, f"{MEETINGS}\n/ on (job, probe) group_left ()\n{REFERENCE}"),
        Record(ALLREDUCE_SLOWDOWN, f"1 / {RATIO}"),
        Record(
            STEP_SLOWDOWN,
            f"""(
  {step(c, f"{volume} / {MEETINGS}")}
)
/ on (job, probe) group_left ()
(
  {step(c, f"{volume} / {REFERENCE}")}
)""",
        ),
        Record(GPU_HOURS_LOST, f"clamp_min({c.impact_gpus * 24} * (1 - 1 / {STEP_SLOWDOWN}), 0)"),
    ]


def throttle_time(c: Config) -> list[Record]:
    """Exact throttle time: the share of slowdown_window each clock-event reason held the clocks
    down (NVML's time counters, not a sampled flag), and the share of any fault reason
    (overlapping reasons count once at most: the share is capped at 1)."""
    m = selector(c)
    slowdown = m(f'reason=~"{alternation(c.slowdown_reasons)}"')
    return [
        Record(
            "instance_gpu_reason:clusterhealth_gpu_clocks_event_seconds_total:rate",
            f"rate(clusterhealth_gpu_clocks_event_seconds_total{m()}[{c.slowdown_window}])",
        ),
        Record(
            "instance_gpu:clusterhealth_gpu_clocks_event_seconds_total:slowdown_rate",
            "clamp_max(sum without (reason) "
            f"(instance_gpu_reason:clusterhealth_gpu_clocks_event_seconds_total:rate{slowdown}), 1)",
        ),
        # The share of the window free of them: what JobStraggler compares within a job.
        Record(
            "instance_gpu:clusterhealth_gpu_clocks_event_seconds_total:unthrottled_rate",
            "1 - instance_gpu:clusterhealth_gpu_clocks_event_seconds_total:slowdown_rate",
        ),
    ]


def firmware(c: Config) -> list[Record]:
    """Firmware drift: each version with the board (HCA board_id) or model (GPU name) it runs on,
    then how many devices of the fleet run each version."""
    m = selector(c)
    return [
        Record(
            "instance_subject:clusterhealth_firmware_info:model",
            f"""clusterhealth_firmware_info{m('component="hca"')}
  * on (instance, job, subject) group_left (model)
  label_replace(
    label_replace(clusterhealth_rdma_device_info{m()}, "subject", "$1", "device", "(.*)"),
    "model", "$1", "board_id", "(.*)"
  )
or
clusterhealth_firmware_info{m('component="gpu_vbios"')}
  * on (instance, job, subject) group_left (model)
  label_replace(
    label_replace(clusterhealth_gpu_info{m()}, "subject", "$1", "gpu", "(.*)"),
    "model", "$1", "name", "(.*)"
  )
or
clusterhealth_firmware_info{m('component!~"hca|gpu_vbios"')}""",
        ),
        Record(
            "job_component_model_version:clusterhealth_firmware_info:count",
            "count by (job, component, model, version) (instance_subject:clusterhealth_firmware_info:model)",
        ),
        Record(
            "job_component_model:clusterhealth_firmware_info:max_count",
            "max by (job, component, model) (job_component_model_version:clusterhealth_firmware_info:count)",
        ),
    ]


def mtu(c: Config) -> list[Record]:
    """MTU drift: how many nodes run each MTU on an interface of a given name."""
    m = selector(c)
    return [
        Record(
            "job_interface_mtu:clusterhealth_netdev_mtu_bytes:count",
            f'count_values by (job, interface) ("mtu", clusterhealth_netdev_mtu_bytes{m()})',
        ),
        Record(
            "job_interface:clusterhealth_netdev_mtu_bytes:max_count",
            "max by (job, interface) (job_interface_mtu:clusterhealth_netdev_mtu_bytes:count)",
        ),
    ]


def checks(c: Config) -> list[Record]:
    """The fleet overview's health matrix: the worst status per node and check."""
    m = selector(c)
    return [
        Record(
            "instance_check:clusterhealth_check_status:max",
            f"max by (instance, job, check) (clusterhealth_check_status{m()})",
        ),
    ]
