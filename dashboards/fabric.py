"""The fabric view: probe bandwidth by node and by pair, what each node of a pairwise group costs,
probe results, the fleet's RDMA errors."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as dm

from clusterhealth.dashboards.panels import (
    MERGE,
    RATE,
    SEL,
    Query,
    base,
    columns,
    graph,
    grid,
    organize,
    timeline,
    with_rows,
)


def dashboard() -> gd.Dashboard:
    return with_rows(
        base(
            "clusterhealth-fabric",
            "clusterhealth / Fabric",
            "Fabric probes (nccl-tests, ib_write_bw, iperf3) by node and by pair against their "
            "expectation, a pairwise group's nodes by leaf switch, what each node costs a job, probe "
            "results, and the fleet's RDMA error rates.",
            node_multi=True,
        ),
        [
            ("Bandwidth", bandwidth_row()),
            ("Leaves", leaves_row()),
            ("Cost", cost_row()),
            ("Results", results_row()),
            ("RDMA errors", rdma_errors_row()),
        ],
    )


# The impact recording rules (deploy/prometheus/clusterhealth_mixin/recording.py), per node of a
# pairwise group, for the rules generator's stated workload (impact_* parameters).
_NODE_BANDWIDTH = "instance_probe:clusterhealth_probe_bandwidth_bytes_per_second:"
IMPACT = {
    _NODE_BANDWIDTH + "pairwise_ratio": "bandwidth ratio r",
    _NODE_BANDWIDTH + "pairwise_allreduce_slowdown": "all-reduce slowdown 1/r",
    _NODE_BANDWIDTH + "pairwise_step_slowdown": "step slowdown",
    _NODE_BANDWIDTH + "pairwise_gpu_hours_lost_per_day": "GPU-hours lost a day",
}


PLACEMENT = "clusterhealth_probe_placement_info"
# Sorted by place: a leaf's nodes side by side.
# Grafana's sortBy sorts by the first field it is given and ignores the rest; its sort is stable, so
# one transformation a key, the least significant first, orders the rows by pod, spine, leaf, node.
BY_PLACE = [
    dm.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": field}]})
    for field in ("instance", "leaf", "spine", "pod")
]


def leaves_row() -> list[Builder[dm.Panel]]:
    ratio = _NODE_BANDWIDTH + "pairwise_ratio"
    return [
        graph(
            "Bandwidth ratio by leaf",
            "Per leaf switch of a pairwise group (the members file's leaf, as "
            "clusterhealth_probe_placement_info exports it): the mean over its nodes of r, each "
            "node's typical meeting bandwidth over the group's reference. A whole leaf falling while "
            "the others hold is its uplink or the leaf itself (`clusterhealth analyze` tells which: "
            "an uplink's nodes are fine with each other); one node falling inside a leaf that holds "
            "is a host (docs/fabric.md).",
            [
                Query(
                    f"avg by (probe, leaf) ({ratio}{{{SEL}}} * on (job, instance, probe) group_left (leaf) "
                    f"{PLACEMENT}{{{SEL}}})",
                    "{{leaf}} {{probe}}",
                )
            ],
        ),
        grid(
            "Where each node sits",
            "Each node's place in a pairwise group's fabric, as its members file says (leaf, spine "
            "group, pod, rail), by place.",
            [
                Query(
                    f"max by (instance, node, probe, leaf, spine, pod, rail) ({PLACEMENT}{{{SEL}}} "
                    f"* on (job, instance) group_left (node) clusterhealth_node_info{{{SEL}}})",
                    instant=True,
                )
            ],
            transformations=[organize(["Time", "Value"]), *BY_PLACE],
        ),
    ]


def cost_row() -> list[Builder[dm.Panel]]:
    columns = {f"Value #{chr(ord('A') + n)}": title for n, title in enumerate(IMPACT.values())}
    placed = f"Value #{chr(ord('A') + len(IMPACT))}"
    return [
        grid(
            "What each node costs",
            "Per node of a pairwise group: r, its typical meeting bandwidth over the group's reference "
            "(the median of its nodes'); the slowdown of a ring all-reduce through it (1/r); and, for "
            "the rules' stated workload (by default a 64-GPU job reducing 7B BF16 gradients with 1 s "
            "of compute a step), how much slower its steps run and the GPU-hours a day it loses "
            "(docs/cost.md). FabricBandwidthDegraded and NodeStraggler quote the same numbers. By "
            "leaf where the members file places the nodes.",
            # Aggregated, so that each query drops its __name__ and the merge makes one row a node.
            [
                *(Query(f"max by (instance, probe) ({record}{{{SEL}}})", instant=True) for record in IMPACT),
                Query(f"max by (instance, probe, leaf) ({PLACEMENT}{{{SEL}}})", instant=True),
            ],
            w=12,
            transformations=[
                MERGE,
                dm.DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": dict.fromkeys(["Time", "job", placed], True),
                        "renameByName": columns,
                    },
                ),
                dm.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": "leaf"}]}),
            ],
        ),
        graph(
            "GPU-hours lost a day, by node",
            "What a job of the stated workload spanning the node loses a day against the group's "
            "reference bandwidth (0 at or above it).",
            [
                Query(
                    f"instance_probe:clusterhealth_probe_bandwidth_bytes_per_second:pairwise_gpu_hours_lost_per_day{{{SEL}}}",
                    "{{instance}} {{probe}}",
                )
            ],
        ),
    ]


def bandwidth_row() -> list[Builder[dm.Panel]]:
    return [
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
        ),
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
        ),
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
        ),
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
        ),
    ]


PROBE = "instance, job, probe"


def results_row() -> list[Builder[dm.Panel]]:
    return [
        timeline(
            "Probe success",
            "1 when the probe's last run completed and met its expectation.",
            [Query(f"clusterhealth_probe_success{{{SEL}}}", "{{instance}} {{probe}}")],
        ),
        graph(
            "Probe runs by result",
            "Runs per result: ok, degraded, failed, timeout, skipped (busy GPUs).",
            [
                Query(
                    f"sum by (probe, result) (increase(clusterhealth_probe_runs_total{{{SEL}}}[{RATE}]))",
                    "{{probe}} {{result}}",
                )
            ],
        ),
        grid(
            "Last runs",
            "When each probe last ran, how long its last completed run took, and nccl-tests' wrong "
            "values, one row a probe.",
            [
                Query(
                    f"max by ({PROBE}) (time() - clusterhealth_probe_last_run_timestamp_seconds{{{SEL}}})",
                    instant=True,
                ),
                Query(f"max by ({PROBE}) (clusterhealth_probe_duration_seconds{{{SEL}}})", instant=True),
                Query(f"max by ({PROBE}) (clusterhealth_probe_wrong_values{{{SEL}}})", instant=True),
            ],
            transformations=[
                MERGE,
                columns(
                    {"Value #A": "seconds since it ran", "Value #B": "duration", "Value #C": "wrong values"}
                ),
            ],
        ),
    ]


def rdma_errors_row() -> list[Builder[dm.Panel]]:
    return [
        graph(
            "Link errors across the fleet",
            "The ports with the most symbol errors, receive errors, recoveries and link-downs per second.",
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
        ),
    ]
