"""clusterhealth's Grafana dashboards as code, with Grafana's foundation SDK.

`python -m clusterhealth.dashboards.build` (`make generate`) writes the committed JSON beside this
file: a fleet overview, a node view and a fabric view. Each has fixed uid, the `clusterhealth`
tag, variables for the data source, the job and the node, and `$__rate_interval` in its rates.
The tests regenerate them byte for byte, validate them against Grafana's dashboard JSON schema,
check every `clusterhealth_*` name against the agent's exposition and the recording rules, and run
every query on a real Prometheus that scraped simulated nodes.

The SDK is a development dependency (the `test` extra); the agent never imports this module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

HERE = Path(__file__).resolve().parent
# The SDK's enums are enum.StrEnum (Python 3.11), which mypy, set to the project's 3.10, reads as
# plain str: the `type: ignore[arg-type]` below are for that alone.
TAGS = ["clusterhealth", "gpu", "rdma"]
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'job="$job",instance=~"$node"'
RATE = "$__rate_interval"

# clusterhealth_check_status and friends: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
STATUS_MAPPINGS: list[dm.ValueMapping] = [
    dm.ValueMap(
        options={
            "0": dm.ValueMappingResult(text="OK", color="green", index=0),
            "1": dm.ValueMappingResult(text="WARNING", color="orange", index=1),
            "2": dm.ValueMappingResult(text="CRITICAL", color="red", index=2),
            "3": dm.ValueMappingResult(text="UNKNOWN", color="purple", index=3),
        }
    )
]
PORT_STATE_MAPPINGS: list[dm.ValueMapping] = [
    dm.ValueMap(
        options={
            "1": dm.ValueMappingResult(text="DOWN", color="red", index=0),
            "2": dm.ValueMappingResult(text="INIT", color="orange", index=1),
            "3": dm.ValueMappingResult(text="ARMED", color="orange", index=2),
            "4": dm.ValueMappingResult(text="ACTIVE", color="green", index=3),
        }
    )
]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


def target(q: Query, ref: str) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(q.expr).ref_id(ref).datasource(DATASOURCE)
    if q.legend:
        query = query.legend_format(q.legend)
    query = query.instant().format(pm.PromQueryFormat.TABLE) if q.instant else query.range()
    return query


def with_targets(panel: Builder[dm.Panel], queries: Sequence[Query]) -> Builder[dm.Panel]:
    for n, q in enumerate(queries):
        panel.with_target(target(q, chr(ord("A") + n)))  # type: ignore[attr-defined]
    return panel


def graph(
    title: str, description: str, queries: Sequence[Query], unit: str = "short", w: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(w)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .legend(
            gc.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)  # type: ignore[arg-type]
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
    )
    with_targets(panel, queries)
    return panel


def grid(
    title: str,
    description: str,
    queries: Sequence[Query],
    w: int = 12,
    h: int = 8,
    mappings: list[dm.ValueMapping] | None = None,
    transformations: Sequence[dm.DataTransformerConfig] = (),
    unit: str = "short",
) -> table.Panel:
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(h)
        .span(w)
        .unit(unit)
    )
    if mappings:
        panel = panel.mappings(mappings).cell_options(
            common.TableColoredBackgroundCellOptions(
                mode=common.TableCellBackgroundDisplayMode.BASIC  # type: ignore[arg-type]
            )
        )
    for transformation in transformations:
        panel = panel.with_transformation(transformation)
    with_targets(panel, queries)
    return panel


def number(title: str, description: str, query: Query, w: int = 4, unit: str = "short") -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(4)
        .span(w)
        .unit(unit)
        .graph_mode(common.BigValueGraphMode.NONE)
    )
    with_targets(panel, [query])
    return panel


def timeline(title: str, description: str, queries: Sequence[Query], w: int = 12) -> statetimeline.Panel:
    panel = (
        statetimeline.Panel().title(title).description(description).datasource(DATASOURCE).height(8).span(w)
    )
    with_targets(panel, queries)
    return panel


def organize(exclude: Sequence[str]) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(
        id_val="organize", options={"excludeByName": dict.fromkeys(exclude, True)}
    )


MERGE = dm.DataTransformerConfig(id_val="merge", options={})
HIDE_META = organize(["Time", "__name__", "job"])


def variables(node_multi: bool) -> list[Builder[dm.VariableModel]]:
    node = (
        gd.QueryVariable("node")
        .label("node")
        .description("The agent's instance (host:port)")
        .datasource(DATASOURCE)
        .query('label_values(clusterhealth_build_info{job="$job"}, instance)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
    )
    if node_multi:
        node = node.multi(True).include_all(True).all_value(".*")
    return [
        gd.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        gd.QueryVariable("job")
        .label("job")
        .datasource(DATASOURCE)
        .query("label_values(clusterhealth_build_info, job)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC),
        node,
    ]


def base(uid: str, title: str, description: str, node_multi: bool) -> gd.Dashboard:
    return (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .variables(variables(node_multi))
        .link(
            gd.DashboardLink("clusterhealth")
            .type(dm.DashboardLinkType.DASHBOARDS)  # type: ignore[arg-type]
            .tags(["clusterhealth"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


def fleet() -> gd.Dashboard:
    fleet_sel = 'job="$job"'
    return (
        base(
            "clusterhealth-fleet",
            "clusterhealth / Fleet overview",
            "Every node's health at a glance: checks per node, firing alerts, firmware and MTU drift, "
            "stragglers.",
            node_multi=True,
        )
        .with_row(gd.Row("Health"))
        .with_panel(number("Agents up", "Agents Prometheus scrapes.", Query(f"sum(up{{{fleet_sel}}})")))
        .with_panel(
            number(
                "Agents down",
                "Agents Prometheus cannot scrape (ClusterHealthAgentDown).",
                Query(f"count(up{{{fleet_sel}}} == 0) or vector(0)"),
            )
        )
        .with_panel(
            number(
                "Firing alerts",
                "clusterhealth alerts firing now.",
                Query(f'count(ALERTS{{alertstate="firing",{fleet_sel}}}) or vector(0)'),
            )
        )
        .with_panel(
            number(
                "GPUs lost",
                "GPUs that do not answer NVML (GPUFellOffBus).",
                Query(f"count(clusterhealth_gpu_up{{{SEL}}} == 0) or vector(0)"),
            )
        )
        .with_panel(
            number(
                "RDMA ports not ACTIVE",
                "Ports whose state is not ACTIVE (RDMAPortDown).",
                Query(f"count(clusterhealth_rdma_port_state_id{{{SEL}}} != 4) or vector(0)"),
            )
        )
        .with_panel(
            number(
                "Collectors failing",
                "Collector runs that failed or hang (CollectorFailing).",
                Query(f"count(clusterhealth_scrape_collector_success{{{SEL}}} == 0) or vector(0)"),
            )
        )
        .with_panel(
            grid(
                "Nodes × checks",
                "The worst status of each check on each node (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN), "
                "from the recording rule instance_check:clusterhealth_check_status:max.",
                [Query(f"instance_check:clusterhealth_check_status:max{{{SEL}}}", instant=True)],
                w=24,
                h=10,
                mappings=STATUS_MAPPINGS,
                transformations=[
                    dm.DataTransformerConfig(
                        id_val="groupingToMatrix",
                        options={"rowField": "instance", "columnField": "check", "valueField": "Value"},
                    )
                ],
            )
        )
        .with_panel(
            grid(
                "Firing alerts",
                "clusterhealth alerts firing now, with their device labels.",
                [Query(f'ALERTS{{alertstate="firing",{fleet_sel}}}', instant=True)],
                w=24,
                h=8,
                transformations=[organize(["Time", "__name__", "Value", "alertstate", "job"])],
            )
        )
        .with_row(gd.Row("Drift"))
        .with_panel(
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
            )
        )
        .with_panel(
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
            )
        )
        .with_panel(
            grid(
                "MTU by interface",
                "How many nodes run each MTU on each interface name (MTUMismatch flags the minority).",
                [Query('job_interface_mtu:clusterhealth_netdev_mtu_bytes:count{job="$job"}', instant=True)],
                transformations=[HIDE_META],
            )
        )
        .with_panel(
            grid(
                "Driver versions",
                "GPU driver and CUDA driver versions per node.",
                [Query(f"clusterhealth_gpu_driver_info{{{SEL}}}", instant=True)],
                transformations=[organize(["Time", "__name__", "Value", "job"])],
            )
        )
        .with_row(gd.Row("Stragglers"))
        .with_panel(
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
            )
        )
        .with_panel(
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
            )
        )
        .with_panel(
            graph(
                "GPUs held back by faults",
                "GPUs per node with a fault clock-event reason active (HW slowdown, thermal, power brake).",
                [
                    Query(
                        "sum by (instance) (clusterhealth_gpu_clocks_event_active{"
                        + SEL
                        + ',reason=~"hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|'
                        + 'hw_power_brake_slowdown"})',
                        "{{instance}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "Critical Xid events",
                "Xid events per node and code.",
                [
                    Query(
                        "sum by (instance, xid) "
                        f"(increase(clusterhealth_gpu_xid_errors_total{{{SEL}}}[{RATE}]))",
                        "{{instance}} Xid {{xid}}",
                    )
                ],
            )
        )
    )


def node() -> gd.Dashboard:
    gpu = f"{SEL}"
    return (
        base(
            "clusterhealth-node",
            "clusterhealth / Node",
            "One node's GPUs and HCAs: activity, clocks and their events, temperatures, power, memory "
            "health, Xid, NVLink, PCIe; RDMA port state, rate, throughput, errors and congestion.",
            node_multi=False,
        )
        .with_row(gd.Row("GPU"))
        .with_panel(
            graph(
                "SM activity against utilization",
                "Utilization is 1 whenever a kernel runs, including NCCL waiting for a straggler; SM "
                "activity says how much of the SMs' time was really busy.",
                [
                    Query(f"clusterhealth_gpu_sm_active_ratio{{{gpu}}}", "GPU {{gpu}} SM active"),
                    Query(f"clusterhealth_gpu_utilization_ratio{{{gpu}}}", "GPU {{gpu}} utilization"),
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            graph(
                "SM clock against its maximum",
                "A busy GPU below its maximum clock is held back: see the clock-event reasons.",
                [
                    Query(f"clusterhealth_gpu_sm_clock_hertz{{{gpu}}}", "GPU {{gpu}}"),
                    Query(f"max(clusterhealth_gpu_sm_clock_max_hertz{{{gpu}}})", "maximum"),
                ],
                unit="hertz",
            )
        )
        .with_panel(
            timeline(
                "Clock-event reasons",
                "GPUs with each clock-event (throttle) reason active, over time.",
                [
                    Query(
                        "sum by (reason) "
                        f'(clusterhealth_gpu_clocks_event_active{{{gpu},reason!="gpu_idle"}})',
                        "{{reason}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "Temperatures",
                "GPU and HBM temperatures.",
                [Query(f"clusterhealth_gpu_temperature_celsius{{{gpu}}}", "GPU {{gpu}} {{sensor}}")],
                unit="celsius",
            )
        )
        .with_panel(
            graph(
                "Power against the limit",
                "Power draw of each GPU and its enforced limit.",
                [
                    Query(f"clusterhealth_gpu_power_watts{{{gpu}}}", "GPU {{gpu}}"),
                    Query(f"max(clusterhealth_gpu_power_limit_watts{{{gpu}}})", "limit"),
                ],
                unit="watt",
            )
        )
        .with_panel(
            graph(
                "ECC errors since the driver loaded",
                "Volatile ECC error counts; any uncorrected error pages (GPUUncorrectableECC).",
                [
                    Query(
                        f'clusterhealth_gpu_ecc_errors_total{{{gpu},scope="volatile"}}',
                        "GPU {{gpu}} {{error}}",
                    )
                ],
            )
        )
        .with_panel(
            grid(
                "Row remapping",
                "Remapped rows per cause, and whether a remap is pending (reset) or failed (replace).",
                [
                    Query(f"clusterhealth_gpu_remapped_rows{{{gpu}}}", instant=True),
                    Query(f"clusterhealth_gpu_row_remap_pending{{{gpu}}}", instant=True),
                    Query(f"clusterhealth_gpu_row_remap_failed{{{gpu}}}", instant=True),
                ],
                transformations=[HIDE_META],
            )
        )
        .with_panel(
            graph(
                "Xid by code",
                "Xid events per GPU and code (NVML events and the kernel log, counted once).",
                [
                    Query(
                        f"sum by (gpu, xid) (increase(clusterhealth_gpu_xid_errors_total{{{gpu}}}[{RATE}]))",
                        "GPU {{gpu}} Xid {{xid}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "NVLinks down",
                "NVLinks that are not up, per GPU.",
                [Query(f"sum by (gpu) (1 - clusterhealth_gpu_nvlink_up{{{gpu}}})", "GPU {{gpu}}")],
            )
        )
        .with_panel(
            graph(
                "NVLink errors",
                "NVLink CRC, replay and recovery errors per second.",
                [
                    Query(
                        f"sum by (gpu, error) (rate(clusterhealth_gpu_nvlink_errors_total{{{gpu}}}[{RATE}]))",
                        "GPU {{gpu}} {{error}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "PCIe link width against its maximum",
                "Lanes each GPU's PCIe link trained at; below the maximum is GPUPCIeLinkDegraded.",
                [
                    Query(f"clusterhealth_gpu_pcie_link_width{{{gpu}}}", "GPU {{gpu}} width"),
                    Query(f"clusterhealth_gpu_pcie_link_generation{{{gpu}}}", "GPU {{gpu}} generation"),
                    Query(f"max(clusterhealth_gpu_pcie_link_width_max{{{gpu}}})", "maximum width"),
                ],
            )
        )
        .with_panel(
            graph(
                "PCIe replays",
                "PCIe replay errors per second: a marginal link.",
                [
                    Query(
                        f"rate(clusterhealth_gpu_pcie_replay_errors_total{{{gpu}}}[{RATE}])",
                        "GPU {{gpu}}",
                    )
                ],
            )
        )
        .with_row(gd.Row("RDMA"))
        .with_panel(
            grid(
                "Ports",
                "State (4 ACTIVE), physical state (5 LinkUp) and negotiated rate of each port.",
                [
                    Query(f"clusterhealth_rdma_port_state_id{{{SEL}}}", instant=True),
                    Query(f"clusterhealth_rdma_port_physical_state_id{{{SEL}}}", instant=True),
                    Query(f"clusterhealth_rdma_port_rate_bytes_per_second{{{SEL}}}", instant=True),
                ],
                w=12,
                mappings=PORT_STATE_MAPPINGS,
                transformations=[HIDE_META],
            )
        )
        .with_panel(
            graph(
                "Throughput",
                "Data received and transmitted per port.",
                [
                    Query(
                        f"rate(clusterhealth_rdma_port_data_received_bytes_total{{{SEL}}}[{RATE}])",
                        "{{device}}/{{port}} received",
                    ),
                    Query(
                        f"rate(clusterhealth_rdma_port_data_transmitted_bytes_total{{{SEL}}}[{RATE}])",
                        "{{device}}/{{port}} transmitted",
                    ),
                ],
                unit="Bps",
            )
        )
        .with_panel(
            graph(
                "Port errors",
                "Error counters per second, per port and counter.",
                [
                    Query(
                        f"sum by (device, port, counter) "
                        f"(rate(clusterhealth_rdma_port_errors_total{{{SEL}}}[{RATE}])) > 0 "
                        "or sum by (device, port) "
                        f"(rate(clusterhealth_rdma_port_errors_total{{{SEL}}}[{RATE}]))",
                        "{{device}}/{{port}} {{counter}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "Saturated counters",
                "Error counters pinned at their maximum: their rate is unknown (RDMAPortErrorsUnknown).",
                [
                    Query(
                        f"max by (device, port) (clusterhealth_rdma_port_pma_saturated{{{SEL}}})",
                        "{{device}}/{{port}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "Congestion",
                "Transmit wait ticks, and the RoCE congestion counters (CNPs sent and handled, ECN "
                "marks, receive buffer overflows) per second.",
                [
                    Query(
                        f"rate(clusterhealth_rdma_port_xmit_wait_total{{{SEL}}}[{RATE}])",
                        "{{device}}/{{port}} xmit_wait",
                    ),
                    Query(
                        f"rate(clusterhealth_rdma_port_hw_events_total{{{SEL},"
                        f'counter=~"np_cnp_sent|rp_cnp_handled|np_ecn_marked_roce_packets|out_of_buffer"}}[{RATE}])',
                        "{{device}}/{{port}} {{counter}}",
                    ),
                ],
            )
        )
        .with_panel(
            graph(
                "HCA PCIe link width",
                "Lanes each HCA's PCIe link trained at, against its maximum (RDMAPCIeLinkDegraded).",
                [
                    Query(f"clusterhealth_rdma_device_pcie_link_width{{{SEL}}}", "{{device}}"),
                    Query(f"max(clusterhealth_rdma_device_pcie_link_width_max{{{SEL}}})", "maximum"),
                ],
            )
        )
        .with_row(gd.Row("Node"))
        .with_panel(
            grid(
                "Checks",
                "Every audit and health check of the node (clusterhealth check).",
                [Query(f"clusterhealth_check_status{{{SEL}}}", instant=True)],
                mappings=STATUS_MAPPINGS,
                transformations=[HIDE_META],
            )
        )
        .with_panel(
            graph(
                "Kernel events",
                "Kernel-log events other than Xid: PCIe AER, mlx5, SXid, machine checks.",
                [
                    Query(
                        f"sum by (event) (increase(clusterhealth_kernel_events_total{{{SEL}}}[{RATE}]))",
                        "{{event}}",
                    )
                ],
            )
        )
        .with_panel(
            graph(
                "PCIe AER errors",
                "AER errors the GPUs' and HCAs' PCI functions reported, by class: correctable ones "
                "rising mark a marginal riser, cable or slot (the kernel log's AER events, counted).",
                [
                    Query(
                        f"sum by (device, driver, class) "
                        f"(increase(clusterhealth_pcie_aer_errors_total{{{SEL}}}[{RATE}]))",
                        "{{device}} ({{driver}}) {{class}}",
                    )
                ],
            )
        )
        .with_panel(
            grid(
                "Interfaces' MTU",
                "MTU of the RDMA netdevs and audited interfaces.",
                [Query(f"clusterhealth_netdev_mtu_bytes{{{SEL}}}", instant=True)],
                transformations=[HIDE_META],
            )
        )
        .with_panel(
            graph(
                "Collectors",
                "Each collector's last run: success (1) and duration.",
                [
                    Query(f"clusterhealth_scrape_collector_success{{{SEL}}}", "{{collector}} success"),
                    Query(
                        f"clusterhealth_scrape_collector_duration_seconds{{{SEL}}}", "{{collector}} seconds"
                    ),
                ],
            )
        )
    )


def fabric() -> gd.Dashboard:
    return (
        base(
            "clusterhealth-fabric",
            "clusterhealth / Fabric",
            "Fabric probes (nccl-tests, ib_write_bw, iperf3) by node and by pair against their "
            "expectation, probe results, and the fleet's RDMA error rates.",
            node_multi=True,
        )
        .with_row(gd.Row("Bandwidth"))
        .with_panel(
            graph(
                "Probe bandwidth by node",
                "Each node-local probe's headline bandwidth (nccl-tests: bus bandwidth at the large "
                "message sizes) and its expectation.",
                [
                    Query(
                        f'clusterhealth_probe_bandwidth_bytes_per_second{{{SEL},peer=""}}',
                        "{{instance}} {{probe}}",
                    ),
                    Query(
                        f"clusterhealth_probe_expected_bandwidth_bytes_per_second{{{SEL}}}",
                        "{{instance}} {{probe}} expected",
                    ),
                ],
                unit="Bps",
            )
        )
        .with_panel(
            graph(
                "Probe bandwidth by pair",
                "Probes with a peer: the bandwidth between this node and each partner.",
                [
                    Query(
                        f'clusterhealth_probe_bandwidth_bytes_per_second{{{SEL},peer!=""}}',
                        "{{instance}} → {{peer}} {{probe}}",
                    )
                ],
                unit="Bps",
            )
        )
        .with_panel(
            graph(
                "Bandwidth against expectation",
                "Measured over expected; below 0.8 is degraded (FabricBandwidthDegraded).",
                [
                    Query(
                        f"clusterhealth_probe_bandwidth_bytes_per_second{{{SEL}}} "
                        "/ on (instance, job, probe) group_left () "
                        f"clusterhealth_probe_expected_bandwidth_bytes_per_second{{{SEL}}}",
                        "{{instance}} {{probe}} {{peer}}",
                    )
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            graph(
                "Fleet median by probe",
                "The median of the node-local probes across the fleet (NodeStraggler compares with it).",
                [
                    Query(
                        'job_probe:clusterhealth_probe_bandwidth_bytes_per_second:median{job="$job"}',
                        "{{probe}}",
                    )
                ],
                unit="Bps",
            )
        )
        .with_row(gd.Row("Results"))
        .with_panel(
            timeline(
                "Probe success",
                "1 when the probe's last run completed and met its expectation.",
                [Query(f"clusterhealth_probe_success{{{SEL}}}", "{{instance}} {{probe}}")],
            )
        )
        .with_panel(
            graph(
                "Probe runs by result",
                "Runs per result: ok, degraded, failed, timeout, skipped (busy GPUs).",
                [
                    Query(
                        f"sum by (probe, result) (increase(clusterhealth_probe_runs_total{{{SEL}}}[{RATE}]))",
                        "{{probe}} {{result}}",
                    )
                ],
            )
        )
        .with_panel(
            grid(
                "Last runs",
                "When each probe last ran, how long it took, and nccl-tests' wrong values.",
                [
                    Query(f"time() - clusterhealth_probe_last_run_timestamp_seconds{{{SEL}}}", instant=True),
                    Query(f"clusterhealth_probe_duration_seconds{{{SEL}}}", instant=True),
                    Query(f"clusterhealth_probe_wrong_values{{{SEL}}}", instant=True),
                ],
                transformations=[HIDE_META],
            )
        )
        .with_row(gd.Row("RDMA errors"))
        .with_panel(
            graph(
                "Link errors across the fleet",
                "The ports with the most symbol errors, receive errors, recoveries and link-downs per "
                "second.",
                [
                    Query(
                        "topk(10, sum by (instance, device, port) (rate(clusterhealth_rdma_port_errors_total{"
                        + SEL
                        + ',counter=~"symbol_error|port_rcv_errors|link_error_recovery|link_downed"}['
                        + RATE
                        + "])))",
                        "{{instance}} {{device}}/{{port}}",
                    )
                ],
                w=24,
            )
        )
    )


DASHBOARDS = {
    "clusterhealth-fleet.json": fleet,
    "clusterhealth-node.json": node,
    "clusterhealth-fabric.json": fabric,
}


def render(build: gd.Dashboard) -> str:
    built = build.build()
    # Stable panel ids in reading order: links to a panel (viewPanel=N) survive a regeneration.
    for n, panel in enumerate(built.panels or [], start=1):
        panel.id_val = n
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else HERE
    for name, make in DASHBOARDS.items():
        (out / name).write_text(render(make()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
