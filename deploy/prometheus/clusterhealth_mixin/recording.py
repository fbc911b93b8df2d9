"""The recording rules the alerts and dashboards read (group `clusterhealth.rules`), named
`level:metric:operations`. The job rules record their own (jobs.py)."""

from __future__ import annotations

from .config import Config
from .lib import Group, Record, alternation, selector


def group(c: Config) -> Group:
    return Group(
        "clusterhealth.rules",
        [*stragglers(c), *throttle_time(c), *firmware(c), *mtu(c), *checks(c)],
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
