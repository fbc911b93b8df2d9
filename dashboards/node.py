"""The node view: one node's GPUs, RDMA ports and HCAs, checks, kernel events and collectors."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm

from clusterhealth.dashboards.panels import (
    HIDE_META,
    MERGE,
    PHYSICAL_STATE_MAPPINGS,
    PORT_STATE_MAPPINGS,
    RATE,
    SEL,
    STATUS_MAPPINGS,
    Query,
    base,
    coloured,
    columns,
    graph,
    grid,
    timeline,
    with_rows,
    xid_events,
)


def dashboard() -> gd.Dashboard:
    return with_rows(
        base(
            "clusterhealth-node",
            "clusterhealth / Node",
            "One node's GPUs and HCAs: activity, clocks and their events, temperatures, power, memory "
            "health, Xid, NVLink, PCIe; RDMA port state, rate, throughput, errors and congestion.",
            node_multi=False,
        ),
        [("GPU", gpu_row()), ("RDMA", rdma_row()), ("Node", node_row())],
    )


# The labels of one GPU, for joining its series; of one RDMA port.
GPU_LABELS = "instance, job, gpu, uuid"
ON_GPU = f"on ({GPU_LABELS})"
PORT_LABELS = "instance, job, device, port"
# A PCIe lane's payload rate in one direction: 8 GT/s with 128b/130b encoding is 0.985 GB/s at
# generation 3, doubling with each generation (within 2% of 0.25 and 0.5 GB/s for generations 1
# and 2, and of generation 6's FLIT rate).
PCIE_LANE_BYTES_PER_SECOND_GEN3 = 8e9 * 128 / 130 / 8


def which_wall() -> Builder[dm.Panel]:
    """Per GPU, how close each resource is to its peak: a compute-bound GPU has its tensor column
    high, a memory-bound one its DRAM column, a communication-bound one a link column."""
    gpu = SEL
    nvlink_peak = f"2 * clusterhealth_gpu_nvlink_rate_bytes_per_second{{{gpu}}}"
    pcie_peak = (
        f"2 * clusterhealth_gpu_pcie_link_width{{{gpu}}} * {ON_GPU} "
        f"({PCIE_LANE_BYTES_PER_SECOND_GEN3:.6g} * 2 ^ (clusterhealth_gpu_pcie_link_generation{{{gpu}}} - 3))"
    )
    rdma_ports = f"on (instance, job, device, port) clusterhealth_rdma_port_state_id{{{SEL}}} == 4"
    rdma_node = (
        "sum by (instance, job) ("
        f"rate(clusterhealth_rdma_port_data_received_bytes_total{{{SEL}}}[{RATE}]) "
        f"+ rate(clusterhealth_rdma_port_data_transmitted_bytes_total{{{SEL}}}[{RATE}]))"
        " / on (instance, job) "
        f"(2 * sum by (instance, job) (clusterhealth_rdma_port_rate_bytes_per_second{{{SEL}}} "
        f"and {rdma_ports} "
        f"and on (instance, job, device, port) clusterhealth_rdma_port_data_received_bytes_total{{{SEL}}}))"
    )
    queries = [
        # Aggregated, so that each query drops its __name__ and the merge makes one row a GPU.
        Query(
            f"max by (instance, job, gpu, uuid) (clusterhealth_gpu_tensor_active_ratio{{{gpu}}})",
            instant=True,
        ),
        Query(
            f"max by (instance, job, gpu, uuid) (clusterhealth_gpu_dram_active_ratio{{{gpu}}})", instant=True
        ),
        Query(
            f"(clusterhealth_gpu_nvlink_received_bytes_per_second{{{gpu}}} + {ON_GPU} "
            f"clusterhealth_gpu_nvlink_transmitted_bytes_per_second{{{gpu}}}) / {ON_GPU} ({nvlink_peak})",
            instant=True,
        ),
        Query(
            f"(clusterhealth_gpu_pcie_received_bytes_per_second{{{gpu}}} + {ON_GPU} "
            f"clusterhealth_gpu_pcie_transmitted_bytes_per_second{{{gpu}}}) / {ON_GPU} ({pcie_peak})",
            instant=True,
        ),
        # The HCAs serve the node, not one GPU: each GPU's row shows the node's RDMA share.
        Query(
            f"(clusterhealth_gpu_up{{{gpu}}} == 1) * on (instance, job) group_left () ({rdma_node})",
            instant=True,
        ),
    ]
    columns = {
        "Value #A": "tensor cores",
        "Value #B": "DRAM bandwidth",
        "Value #C": "NVLink",
        "Value #D": "PCIe",
        "Value #E": "RDMA (node)",
    }
    return (
        grid(
            "Which wall",
            "Per GPU, each resource's use against its peak over the last GPM interval: tensor-core "
            "activity, DRAM bandwidth, NVLink traffic against its rate (a link's speed times the links up), "
            "PCIe traffic against its width and generation, and the node's RDMA traffic against its "
            "active ports' rates. A compute-bound GPU fills the tensor column, a memory-bound one the "
            "DRAM column, a communication-bound one a link column; a GPU low everywhere while its "
            "utilization is 1 waits on others.",
            queries,
            w=24,
            unit="percentunit",
            transformations=[
                MERGE,
                dm.DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": dict.fromkeys(["Time", "job", "instance", "uuid"], True),
                        "renameByName": columns,
                    },
                ),
            ],
        )
        .min(0)
        .max(1)
        .cell_options(
            common.TableBarGaugeCellOptions(
                mode=common.BarGaugeDisplayMode.GRADIENT  # type: ignore[arg-type]
            )
        )
    )


def gpu_row() -> list[Builder[dm.Panel]]:
    gpu = f"{SEL}"
    held = f"rate(clusterhealth_gpu_clocks_event_seconds_total{{{gpu}}}[{RATE}])"
    return [
        which_wall(),
        graph(
            "SM activity against utilization",
            "Utilization is 1 whenever a kernel runs, including NCCL waiting for a straggler; SM "
            "activity says how much of the SMs' time was really busy.",
            [
                Query(f"clusterhealth_gpu_sm_active_ratio{{{gpu}}}", "GPU {{gpu}} SM active"),
                Query(f"clusterhealth_gpu_utilization_ratio{{{gpu}}}", "GPU {{gpu}} utilization"),
            ],
            unit="percentunit",
        ),
        graph(
            "SM clock against its maximum",
            "A busy GPU below its maximum clock is held back: see the clock-event reasons.",
            [
                Query(f"clusterhealth_gpu_sm_clock_hertz{{{gpu}}}", "GPU {{gpu}}"),
                Query(f"max(clusterhealth_gpu_sm_clock_max_hertz{{{gpu}}})", "maximum"),
            ],
            unit="hertz",
        ),
        timeline(
            "Clock-event reasons",
            "GPUs with each clock-event (throttle) reason active, over time.",
            [
                Query(
                    f'sum by (reason) (clusterhealth_gpu_clocks_event_active{{{gpu},reason!="gpu_idle"}})',
                    "{{reason}}",
                )
            ],
        ),
        graph(
            "Time held back, by reason",
            "Share of the time each clock-event reason held a GPU's clocks down, from NVML's time "
            "counters (exact, where the flags above are sampled); only the GPUs and reasons that "
            "held any time show. Thermal and power-brake time alerts (GPUThermalOrPowerSlowdown).",
            [
                Query(f"{held} > 0", "GPU {{gpu}} {{reason}}"),
                # A reason no GPU was held by, once at 0: the panel says "none" rather than nothing.
                Query(f"max by (reason) ({held}) == 0", "{{reason}}: none"),
            ],
            unit="percentunit",
        ),
        graph(
            "Temperatures",
            "GPU and HBM temperatures.",
            [Query(f"clusterhealth_gpu_temperature_celsius{{{gpu}}}", "GPU {{gpu}} {{sensor}}")],
            unit="celsius",
        ),
        graph(
            "Power against the limit",
            "Power draw of each GPU and its enforced limit.",
            [
                Query(f"clusterhealth_gpu_power_watts{{{gpu}}}", "GPU {{gpu}}"),
                Query(f"max(clusterhealth_gpu_power_limit_watts{{{gpu}}})", "limit"),
            ],
            unit="watt",
        ),
        graph(
            "ECC errors since the driver loaded",
            "Volatile ECC error counts; any uncorrected error pages (GPUUncorrectableECC).",
            [
                Query(
                    f'clusterhealth_gpu_ecc_errors_total{{{gpu},scope="volatile"}}',
                    "GPU {{gpu}} {{error}}",
                )
            ],
        ),
        grid(
            "Row remapping",
            "Remapped rows per cause, and whether a remap is pending (reset) or failed (replace), "
            "one row a GPU.",
            [
                Query(f"max by ({GPU_LABELS}) ({query})", instant=True)
                for query in (
                    f'clusterhealth_gpu_remapped_rows{{{gpu},cause="correctable"}}',
                    f'clusterhealth_gpu_remapped_rows{{{gpu},cause="uncorrectable"}}',
                    f"clusterhealth_gpu_row_remap_pending{{{gpu}}}",
                    f"clusterhealth_gpu_row_remap_failed{{{gpu}}}",
                )
            ],
            transformations=[
                MERGE,
                columns(
                    {
                        "Value #A": "rows remapped (correctable)",
                        "Value #B": "rows remapped (uncorrectable)",
                        "Value #C": "remap pending",
                        "Value #D": "remap failed",
                    },
                    exclude=["Time", "job", "instance", "uuid"],
                ),
            ],
        ),
        graph(
            "Xid by code",
            "Xid events per GPU and code (NVML events and the kernel log, counted once), the first "
            "of a code on a GPU included.",
            [Query(xid_events("gpu, xid"), "GPU {{gpu}} Xid {{xid}}")],
        ),
        graph(
            "NVLinks down",
            "NVLinks that are not active, per GPU (NVLinkDown). Which ones: nvidia-smi nvlink -s, or "
            "the per-link clusterhealth_gpu_nvlink_up (opt-in).",
            [Query(f"clusterhealth_gpu_nvlink_links_down{{{gpu}}}", "GPU {{gpu}}")],
        ),
        graph(
            "NVLink errors",
            "NVLink CRC, replay and recovery errors per second.",
            [
                Query(
                    f"sum by (gpu, error) (rate(clusterhealth_gpu_nvlink_errors_total{{{gpu}}}[{RATE}]))",
                    "GPU {{gpu}} {{error}}",
                )
            ],
        ),
        graph(
            "PCIe link width against its maximum",
            "Lanes each GPU's PCIe link trained at; below the maximum is GPUPCIeLinkDegraded.",
            [
                Query(f"clusterhealth_gpu_pcie_link_width{{{gpu}}}", "GPU {{gpu}} width"),
                Query(f"clusterhealth_gpu_pcie_link_generation{{{gpu}}}", "GPU {{gpu}} generation"),
                Query(f"max(clusterhealth_gpu_pcie_link_width_max{{{gpu}}})", "maximum width"),
            ],
        ),
        graph(
            "PCIe replays",
            "PCIe replay errors per second: a marginal link.",
            [
                Query(
                    f"rate(clusterhealth_gpu_pcie_replay_errors_total{{{gpu}}}[{RATE}])",
                    "GPU {{gpu}}",
                )
            ],
        ),
    ]


def rdma_row() -> list[Builder[dm.Panel]]:
    return [
        grid(
            "Ports",
            "State (ACTIVE when up), physical state (LinkUp) and negotiated rate of each port, one "
            "row a port.",
            [
                Query(f"max by ({PORT_LABELS}) ({metric}{{{SEL}}})", instant=True)
                for metric in (
                    "clusterhealth_rdma_port_state_id",
                    "clusterhealth_rdma_port_physical_state_id",
                    "clusterhealth_rdma_port_rate_bytes_per_second",
                )
            ],
            w=12,
            transformations=[
                MERGE,
                columns(
                    {"Value #A": "state", "Value #B": "physical state", "Value #C": "rate"},
                    exclude=["Time", "job", "instance"],
                ),
            ],
        )
        .override_by_name("state", coloured(PORT_STATE_MAPPINGS))
        .override_by_name("physical state", coloured(PHYSICAL_STATE_MAPPINGS))
        .override_by_name("rate", [dm.DynamicConfigValue(id_val="unit", value="Bps")]),
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
        ),
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
        ),
        graph(
            "Saturated counters",
            "Error counters pinned at their maximum, per port: their rate is unknown "
            "(RDMAPortErrorsUnknown). Which ones: those of Port errors at 65535, 255 or 15, or the "
            "per-counter clusterhealth_rdma_port_pma_saturated (opt-in).",
            [
                Query(
                    f"clusterhealth_rdma_port_pma_saturated_counters{{{SEL}}}",
                    "{{device}}/{{port}}",
                )
            ],
        ),
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
        ),
        graph(
            "HCA PCIe links",
            "The audit's hca_pcie_link check of each HCA: 0 its link at its maximum width (and "
            "generation, where the policy asks), 1 WARNING, 2 CRITICAL, 3 UNKNOWN "
            "(RDMAPCIeLinkDegraded). The lanes themselves are opt-in: "
            "collectors.rdma.include_metrics: [clusterhealth_rdma_device_pcie_*].",
            [Query(f'clusterhealth_check_status{{{SEL},check="hca_pcie_link"}}', "{{subject}}")],
        ),
    ]


def node_row() -> list[Builder[dm.Panel]]:
    return [
        grid(
            "Checks",
            "Every audit and health check of the node (clusterhealth check).",
            [Query(f"clusterhealth_check_status{{{SEL}}}", instant=True)],
            mappings=STATUS_MAPPINGS,
            transformations=[HIDE_META],
        ),
        graph(
            "Kernel events",
            "Kernel-log events other than Xid: PCIe AER, mlx5, SXid, machine checks.",
            [
                Query(
                    f"sum by (event) (increase(clusterhealth_kernel_events_total{{{SEL}}}[{RATE}]))",
                    "{{event}}",
                )
            ],
        ),
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
        ),
        grid(
            "Interfaces' MTU",
            "MTU of the RDMA netdevs and audited interfaces.",
            [Query(f"clusterhealth_netdev_mtu_bytes{{{SEL}}}", instant=True)],
            transformations=[HIDE_META],
        ),
        graph(
            "Collectors",
            "Each collector's last run: success (1) and duration.",
            [
                Query(f"clusterhealth_scrape_collector_success{{{SEL}}}", "{{collector}} success"),
                Query(f"clusterhealth_scrape_collector_duration_seconds{{{SEL}}}", "{{collector}} seconds"),
            ],
        ),
    ]
