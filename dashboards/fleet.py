"""The fleet overview: every node's checks, firing alerts, firmware and MTU drift, stragglers."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as dm

from clusterhealth.dashboards.panels import (
    HIDE_META,
    SEL,
    STATUS_MAPPINGS,
    Query,
    base,
    graph,
    grid,
    number,
    organize,
    with_rows,
    xid_events,
)


def dashboard() -> gd.Dashboard:
    return with_rows(
        base(
            "clusterhealth-fleet",
            "clusterhealth / Fleet overview",
            "Every node's health at a glance: checks per node, firing alerts, firmware and MTU drift, "
            "stragglers.",
            node_multi=True,
        ),
        [("Health", health_row()), ("Drift", drift_row()), ("Stragglers", stragglers_row())],
    )


def health_row() -> list[Builder[dm.Panel]]:
    fleet_sel = 'job="$job"'
    return [
        number("Agents up", "Agents Prometheus scrapes.", Query(f"sum(up{{{fleet_sel}}})")),
        number(
            "Agents down",
            "Agents Prometheus cannot scrape (ClusterHealthAgentDown).",
            Query(f"count(up{{{fleet_sel}}} == 0) or vector(0)"),
        ),
        number(
            "Firing alerts",
            "clusterhealth alerts firing now.",
            Query(f'count(ALERTS{{alertstate="firing",{fleet_sel}}}) or vector(0)'),
        ),
        number(
            "GPUs lost",
            "GPUs that do not answer NVML (GPUFellOffBus).",
            Query(f"count(clusterhealth_gpu_up{{{SEL}}} == 0) or vector(0)"),
        ),
        number(
            "RDMA ports not ACTIVE",
            "Ports whose state is not ACTIVE (RDMAPortDown).",
            Query(f"count(clusterhealth_rdma_port_state_id{{{SEL}}} != 4) or vector(0)"),
        ),
        number(
            "Collectors failing",
            "Collector runs that failed or hang (CollectorFailing).",
            Query(f"count(clusterhealth_scrape_collector_success{{{SEL}}} == 0) or vector(0)"),
        ),
        grid(
            "Nodes × checks",
            "The worst status of each check on each node: CRITICAL where any of its subjects is "
            "critical, else the highest of UNKNOWN, WARNING and OK (the recording rule "
            "instance_check:clusterhealth_check_status:max, whose UNKNOWN, a lost GPU's, would hide a "
            "critical GPU beside it).",
            [
                Query(
                    f"max by (instance, job, check) (clusterhealth_check_status{{{SEL}}} == 2) "
                    f"or instance_check:clusterhealth_check_status:max{{{SEL}}}",
                    instant=True,
                )
            ],
            w=24,
            h=10,
            mappings=STATUS_MAPPINGS,
            transformations=[
                dm.DataTransformerConfig(
                    id_val="groupingToMatrix",
                    options={"rowField": "instance", "columnField": "check", "valueField": "Value"},
                )
            ],
        ),
        grid(
            "Firing alerts",
            "clusterhealth alerts firing now, with their device labels.",
            [Query(f'ALERTS{{alertstate="firing",{fleet_sel}}}', instant=True)],
            w=24,
            h=8,
            transformations=[organize(["Time", "__name__", "Value", "alertstate", "job"])],
        ),
    ]


def drift_row() -> list[Builder[dm.Panel]]:
    return [
        grid(
            "Firmware versions by component and model",
            "How many devices of the fleet run each version (FirmwareDrift flags the minority).",
            [
                Query(
                    'job_component_model_version:clusterhealth_firmware_info:count{job="$job"}',
                    instant=True,
                )
            ],
            transformations=[HIDE_META],
        ),
        grid(
            "Devices off the fleet's firmware",
            "Devices whose version is not the most common one for their component and model.",
            [
                Query(
                    'instance_subject:clusterhealth_firmware_info:model{job="$job"} '
                    "* on (job, component, model, version) group_left () "
                    '(job_component_model_version:clusterhealth_firmware_info:count{job="$job"} '
                    "< on (job, component, model) group_left () "
                    'job_component_model:clusterhealth_firmware_info:max_count{job="$job"})',
                    instant=True,
                )
            ],
            transformations=[HIDE_META],
        ),
        grid(
            "MTU by interface",
            "How many nodes run each MTU on each interface name (MTUMismatch flags the minority).",
            [Query('job_interface_mtu:clusterhealth_netdev_mtu_bytes:count{job="$job"}', instant=True)],
            transformations=[HIDE_META],
        ),
        grid(
            "Driver versions",
            "GPU driver and CUDA driver versions per node.",
            [Query(f"clusterhealth_gpu_driver_info{{{SEL}}}", instant=True)],
            transformations=[organize(["Time", "__name__", "Value", "job"])],
        ),
    ]


# A GPU busy-waiting on communication: a kernel always running (NCCL's), its SMs and tensor cores
# nearly idle.
BUSY_WAIT = {"utilization_above": 0.9, "sm_active_below": 0.2, "tensor_active_below": 0.1}


def stragglers_row() -> list[Builder[dm.Panel]]:
    on_gpu = "on (instance, job, gpu, uuid)"
    return [
        grid(
            "Busy GPUs waiting on others",
            f"GPUs whose utilization is above {BUSY_WAIT['utilization_above']:.0%} while their SM "
            f"activity is below {BUSY_WAIT['sm_active_below']:.0%} and their tensor activity below "
            f"{BUSY_WAIT['tensor_active_below']:.0%} (GPM): a kernel runs, but it waits (a collective "
            "waiting for a straggler or a slow link, or data loading). Their SM activity is shown.",
            [
                Query(
                    f"clusterhealth_gpu_sm_active_ratio{{{SEL}}} < {BUSY_WAIT['sm_active_below']} "
                    f"and {on_gpu} clusterhealth_gpu_utilization_ratio{{{SEL}}} > "
                    f"{BUSY_WAIT['utilization_above']} "
                    f"and {on_gpu} clusterhealth_gpu_tensor_active_ratio{{{SEL}}} < "
                    f"{BUSY_WAIT['tensor_active_below']}",
                    instant=True,
                )
            ],
            unit="percentunit",
            transformations=[organize(["Time", "__name__", "job", "uuid"])],
        ),
        graph(
            "Busy GPUs' SM clock against the fleet median",
            "SM clock of each busy GPU divided by the fleet's median for its model; below 0.9 is a "
            "straggler (NodeStraggler).",
            [
                Query(
                    'bottomk(10, instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy{job="$job"} '
                    "/ on (job, name) group_left () "
                    'job:clusterhealth_gpu_sm_clock_hertz:busy_median{job="$job"})',
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            unit="percentunit",
        ),
        graph(
            "Probe bandwidth against the fleet median",
            "Each node's node-local probe bandwidth divided by the fleet's median for the same probe.",
            [
                Query(
                    'bottomk(10, clusterhealth_probe_bandwidth_bytes_per_second{job="$job",peer=""} '
                    "/ on (job, probe) group_left () "
                    'job_probe:clusterhealth_probe_bandwidth_bytes_per_second:median{job="$job"})',
                    "{{instance}} {{probe}}",
                )
            ],
            unit="percentunit",
        ),
        graph(
            "GPUs held back by faults",
            "GPUs per node with a fault clock-event reason active (HW slowdown, thermal, power brake); "
            "a GPU held by two reasons counts once.",
            [
                Query(
                    "sum by (instance) (max by (instance, job, gpu) (clusterhealth_gpu_clocks_event_active{"
                    + SEL
                    + ',reason=~"hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|'
                    + 'hw_power_brake_slowdown"}))',
                    "{{instance}}",
                )
            ],
        ),
        graph(
            "Critical Xid events",
            "Xid events per node and code, the first of a code on a GPU included.",
            [Query(xid_events("instance, xid"), "{{instance}} Xid {{xid}}")],
        ),
    ]
