"""clusterhealth's Prometheus recording rules and alerts, generated from one table (a mixin).

The selectors and thresholds are the fields of `Config`; `python deploy/prometheus/mixin.py`
writes the committed files (`make generate`: the rules, the chart's copy, docs/deploy.md's tables,
the Xid runbook's table and the Alertmanager example's inhibitions), and `--config FILE`
regenerates them with a user's own values (a YAML mapping of field names, e.g. `{selector:
'job="gpu-health"', for_sustained: 30m}`). tests/test_prometheus_rules.py regenerates with the
defaults and compares byte for byte.

Conventions (kubernetes-mixin, node-mixin): recording rules are named `level:metric:operations`;
every alert has `severity` (`critical` pages someone now, `warning` is a ticket), a summary
naming the node (`instance`) and the device, a description with the likely cause and the first
action, and a `runbook_url` to docs/runbooks/<Alert>.md.

Metric names are the agent's own (README and SPEC); a test checks each one against the
exposition of a real agent.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
RULES_FILE = ROOT / "deploy" / "prometheus" / "clusterhealth-rules.yaml"
XID_RUNBOOK = ROOT / "docs" / "runbooks" / "GPUXidCritical.md"
# The Helm chart's PrometheusRule is built from this copy (helm reads files inside the chart only).
CHART_RULES_FILE = (
    ROOT / "deploy" / "kubernetes" / "helm" / "clusterhealth" / "files" / "clusterhealth-rules.yaml"
)
XID_TABLE_BEGIN = "<!-- BEGIN GENERATED XID TABLE -->\n"
XID_TABLE_END = "<!-- END GENERATED XID TABLE -->\n"

# Xid codes NVIDIA's catalog gives an immediate action for (reset, reboot, NVLink or ECC
# workflow): checks/xid_catalog.py's CRITICAL_XIDS; and the memory-health codes it asks no
# immediate action for (63, 92) or a restart of the application (94): its TICKET_XIDS. Copies, so
# that regenerating needs no installed package; a test keeps them equal.
CRITICAL_XIDS = (46, 48, 61, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 144, 145, 146, 147,
                 148, 149, 150, 154, 155, 158)  # fmt: skip
TICKET_XIDS = (63, 92, 94)


@dataclass(frozen=True)
class Config:
    """Every selector, threshold and duration of the rules; the defaults are what ships."""

    selector: str = field(
        default='job="clusterhealth"', metadata={"doc": "label matchers of the agent's scrape job"}
    )
    runbook_url: str = field(
        default="https://github.com/clusterhealth/clusterhealth/blob/main/docs/runbooks/{alert}.md",
        metadata={"doc": "runbook link per alert; {alert} is replaced by its name"},
    )
    # How long a condition must hold before the alert fires.
    for_immediate: str = field(default="1m", metadata={"doc": "hardware states: GPU lost, ECC, port down"})
    for_sustained: str = field(default="10m", metadata={"doc": "slowdowns, degraded links, stragglers"})
    for_agent: str = field(default="5m", metadata={"doc": "agent down or a collector failing"})
    for_drift: str = field(default="1h", metadata={"doc": "firmware drift (a roll-out takes a while)"})
    for_absent: str = field(default="15m", metadata={"doc": "no agent scraped at all"})
    # Windows of the counter-based (event) alerts: how long an event keeps its alert firing.
    xid_window: str = field(default="1h", metadata={"doc": "an Xid event alerts this long"})
    flap_window: str = field(default="1h", metadata={"doc": "an RDMA link_downed increment alerts this long"})
    error_window: str = field(default="1h", metadata={"doc": "window of the per-hour RDMA error rates"})
    rate_window: str = field(default="5m", metadata={"doc": "window of the per-second and per-minute rates"})
    critical_xids: tuple[int, ...] = field(
        default=CRITICAL_XIDS, metadata={"doc": "Xid codes that page (checks/xid_catalog.py)"}
    )
    ticket_xids: tuple[int, ...] = field(
        default=TICKET_XIDS, metadata={"doc": "Xid codes that open a ticket (checks/xid_catalog.py)"}
    )
    slowdown_reasons: tuple[str, ...] = field(
        default=(
            "hw_slowdown",
            "hw_thermal_slowdown",
            "sw_thermal_slowdown",
            "hw_power_brake_slowdown",
            "thermal",
        ),
        metadata={
            "doc": "clock-event reasons (flags and time counters) that mean a fault (sw_power_cap under "
            "full load is normal; thermal is older drivers' counter of both thermal slowdowns)"
        },
    )
    slowdown_window: str = field(
        default="10m", metadata={"doc": "window of the share of time a reason held a GPU's clocks down"}
    )
    slowdown_share: float = field(
        default=0.1,
        metadata={"doc": "share of slowdown_window a fault reason may hold the clocks down before it alerts"},
    )
    busy_utilization: float = field(
        default=0.5, metadata={"doc": "a GPU above this utilization ratio counts as busy"}
    )
    rdma_port_selector: str = field(
        default="",
        metadata={"doc": 'extra matchers for ports that must be up, e.g. device=~"mlx5_[0-7]"'},
    )
    symbol_errors_per_second_critical: float = field(
        default=10, metadata={"doc": "symbol_error rate (over rate_window) that pages"}
    )
    symbol_errors_per_hour_warning: float = field(
        default=120, metadata={"doc": "symbol_error increase per error_window that opens a ticket"}
    )
    pcie_replays_per_minute: float = field(
        default=8, metadata={"doc": "GPU PCIe replays a minute that open a ticket (DCGM's limit)"}
    )
    pcie_correctable_errors_per_minute: float = field(
        default=8,
        metadata={"doc": "correctable AER errors a minute that open a ticket (DCGM's PCIe replay limit)"},
    )
    link_error_recovery_per_minute: float = field(
        default=5, metadata={"doc": "link_error_recovery rate that counts as flapping"}
    )
    receive_error_counters: tuple[str, ...] = field(
        default=(
            "port_rcv_errors",
            "port_rcv_remote_physical_errors",
            "local_link_integrity_errors",
            "excessive_buffer_overrun_errors",
        ),
        metadata={"doc": "counters/ files that count damaged packets or link-integrity faults"},
    )
    receive_errors_per_hour_warning: float = field(
        default=10, metadata={"doc": "increase per error_window of those counters (ibcheckerrors' default)"}
    )
    probe_degraded_fraction: float = field(
        default=0.8, metadata={"doc": "bandwidth below this fraction of the expectation is degraded"}
    )
    straggler_margin: float = field(
        default=0.1, metadata={"doc": "a straggler sits this fraction below the medians"}
    )
    straggler_min_nodes: int = field(
        default=3, metadata={"doc": "nodes a probe's fleet median needs before it is trusted"}
    )
    uncovered_checks: tuple[str, ...] = field(
        default=("gpu_count", "hca_count", "rdma_port_rate", "hca_firmware", "gpu_driver", "gpu_vbios"),
        metadata={"doc": "audit checks without an alert of their own, reported by NodeCheckFailing"},
    )
    # Pairwise probe groups (SPEC "Fabric"; docs/fabric.md): FabricBandwidthDegraded names a host
    # whose meetings failed with this many distinct partners within the window, each of which
    # did better than not with its partners overall. The window stands in for "in a row": about
    # four rounds of the groups' period.
    pairwise_host_window: str = field(
        default="1h", metadata={"doc": "window of the pairwise host rule (about 4 rounds of the period)"}
    )
    pairwise_host_partners: int = field(
        default=3, metadata={"doc": "distinct clean partners a pairwise suspect host failed with"}
    )
    # Extra PromQL expressions, one series per suspect host with `instance`, `job` and `probe`
    # labels, joined to the alerts with `or` (e.g. a recording rule of your own).
    fabric_pairwise_host_expr: str = field(
        default="", metadata={"doc": "extra suspect-host expression joined to FabricBandwidthDegraded"}
    )
    straggler_pairwise_host_expr: str = field(
        default="", metadata={"doc": "extra suspect-host expression joined to NodeStraggler"}
    )
    # Jobs (clusterhealth_gpu_job_info; docs/runbooks/JobStraggler.md): a GPU of a busy multi-GPU
    # workload well below the workload's median.
    job_straggler_clock_margin: float = field(
        default=0.1, metadata={"doc": "JobStraggler: an SM clock this fraction below its job's median"}
    )
    job_straggler_activity_margin: float = field(
        default=0.5, metadata={"doc": "JobStraggler: SM activity this fraction below its job's median"}
    )
    job_straggler_min_gpus: int = field(
        default=2, metadata={"doc": "JobStraggler: GPUs a job needs for its median to mean anything"}
    )


# The profile tests/test_end_to_end.py runs: every duration short enough for a test of seconds.
TEST_PROFILE = {
    "for_immediate": "2s",
    "for_sustained": "2s",
    "for_agent": "2s",
    "for_drift": "2s",
    # Prometheus applies its first scrape targets up to 5 s after it starts: `up` is absent until then.
    "for_absent": "30s",
    "xid_window": "1m",
    "flap_window": "1m",
    "error_window": "1m",
    "rate_window": "20s",
    "slowdown_window": "20s",
}


# What an alert is about: the labels that name the thing it concerns in every alert it raises (a
# test checks them against the promtool cases). Alertmanager's inhibitions are generated from them
# (`inhibit_rules`).
SUBJECTS: dict[str, tuple[str, ...]] = {
    "fleet": (),
    "node": ("instance",),
    "gpu": ("instance", "gpu"),
    "rdma_port": ("instance", "device", "port"),
    "hca": ("instance", "device"),
    "pci_function": ("instance", "device"),
    "interface": ("instance", "interface"),
    "firmware": ("instance", "component", "subject"),
    "check": ("instance", "check", "subject"),
    "probe": ("instance", "probe"),
    "collector": ("instance", "collector"),
    # A workload on a node (JobHitByNodeFault): `job` is stored as `exported_job` beside
    # Prometheus's own scrape job.
    "job": ("instance", "scheduler", "exported_job", "namespace", "pod"),
}


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    expr: str
    summary: str
    description: str
    for_: str = "0m"
    about: str = "node"
    """What the alert is about, a key of SUBJECTS: the labels that name it."""


@dataclass(frozen=True)
class Record:
    record: str
    expr: str


@dataclass(frozen=True)
class Group:
    name: str
    rules: Sequence[Alert | Record]


def _matchers(config: Config, *extra: str) -> str:
    return "{" + ",".join(m for m in (config.selector, *extra) if m) + "}"


def _alternation(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def _pairwise_host(c: Config) -> str:
    """Suspect hosts of pairwise groups: a node whose `peer_success` was 0 with at least
    `pairwise_host_partners` distinct partners in the window, each of which was 1 in more than half
    of its samples (a partner of a bad host fails once; a fleet-wide slowdown leaves nobody clean).
    docs/fabric.md explains the rule and what PromQL cannot express of analyze's. Labels: job,
    instance, probe, and pairwise="host"; the value is the number of such partners."""
    success = f"clusterhealth_probe_peer_success{_matchers(c)}"
    window = f"[{c.pairwise_host_window}]"
    node_info = f"clusterhealth_node_info{_matchers(c)}"
    return f"""label_replace(
  count by (job, instance, probe) (
    min_over_time({success}{window}) == 0
    and on (job, probe, peer)
    label_replace(
      (
        sum by (job, instance, probe) (sum_over_time({success}{window}))
        /
        sum by (job, instance, probe) (count_over_time({success}{window}))
        > 0.5
      )
      * on (job, instance) group_left (node) {node_info},
      "peer", "$1", "node", "(.*)"
    )
  ) >= {c.pairwise_host_partners},
  "pairwise", "host", "", ""
)"""


def _xid_events(c: Config, matchers: str) -> str:
    """Xid events of the codes `matchers` select within `xid_window`. A code's first event creates
    its series at 1, which increase() cannot see: the second term catches series younger than the
    window."""
    series = f"clusterhealth_gpu_xid_errors_total{matchers}"
    return f"""increase({series}[{c.xid_window}]) > 0
or
(
  {series}
  unless
  {series} offset {c.xid_window}
)"""


def _joined(expr: str, extra: str) -> str:
    """`expr`, or `expr` or `extra` when a hook expression is set."""
    if not extra:
        return expr
    return f"(\n{_indent(expr)}\n)\nor\n(\n{_indent(extra.strip())}\n)"


def _indent(text: str) -> str:
    return "\n".join("  " + line if line else line for line in text.splitlines())


# A GPU lost before it ever answered has no uuid (the label is empty).
GPU = "GPU {{ $labels.gpu }}{{ if $labels.uuid }} ({{ $labels.uuid }}){{ end }} on {{ $labels.instance }}"
PORT = "RDMA port {{ $labels.device }}/{{ $labels.port }} on {{ $labels.instance }}"


def groups(c: Config) -> list[Group]:
    def m(*extra: str) -> str:
        return _matchers(c, *extra)

    port = c.rdma_port_selector
    xids = m(f'xid=~"{_alternation(c.critical_xids)}"')
    ticket_xids = m(f'xid=~"{_alternation(c.ticket_xids)}"')
    slowdown = m(f'reason=~"{_alternation(c.slowdown_reasons)}"')
    receive = m(f'counter=~"{_alternation(c.receive_error_counters)}"')
    uncovered = m(f'check=~"{_alternation(c.uncovered_checks)}"')
    local = m('peer=""')
    needs_recovery = m('action!="none"')
    fraction = c.probe_degraded_fraction
    below = round(1 - c.straggler_margin, 6)

    recording = Group(
        "clusterhealth.rules",
        [
            # Stragglers: the SM clock of busy GPUs, with the GPU model (`name`) so that medians
            # compare like with like.
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
            # Exact throttle time: the share of slowdown_window each clock-event reason held the
            # clocks down (NVML's time counters, not a sampled flag), and the share of any fault
            # reason (overlapping reasons count once at most: the share is capped at 1).
            Record(
                "instance_gpu_reason:clusterhealth_gpu_clocks_event_seconds_total:rate",
                f"rate(clusterhealth_gpu_clocks_event_seconds_total{m()}[{c.slowdown_window}])",
            ),
            Record(
                "instance_gpu:clusterhealth_gpu_clocks_event_seconds_total:slowdown_rate",
                "clamp_max(sum without (reason) "
                f"(instance_gpu_reason:clusterhealth_gpu_clocks_event_seconds_total:rate{slowdown}), 1)",
            ),
            # Firmware drift: each version with the board (HCA board_id) or model (GPU name) it
            # runs on, then how many devices of the fleet run each version.
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
                "count by (job, component, model, version) "
                "(instance_subject:clusterhealth_firmware_info:model)",
            ),
            Record(
                "job_component_model:clusterhealth_firmware_info:max_count",
                "max by (job, component, model) "
                "(job_component_model_version:clusterhealth_firmware_info:count)",
            ),
            # MTU drift: how many nodes run each MTU on an interface of a given name.
            Record(
                "job_interface_mtu:clusterhealth_netdev_mtu_bytes:count",
                f'count_values by (job, interface) ("mtu", clusterhealth_netdev_mtu_bytes{m()})',
            ),
            Record(
                "job_interface:clusterhealth_netdev_mtu_bytes:max_count",
                "max by (job, interface) (job_interface_mtu:clusterhealth_netdev_mtu_bytes:count)",
            ),
            # The fleet overview's health matrix: the worst status per node and check.
            Record(
                "instance_check:clusterhealth_check_status:max",
                f"max by (instance, job, check) (clusterhealth_check_status{m()})",
            ),
        ],
    )

    degraded_probe = f"""clusterhealth_probe_bandwidth_bytes_per_second{m()}
< on (instance, job, probe) group_left ()
(clusterhealth_probe_expected_bandwidth_bytes_per_second{m()} * {fraction})"""
    # A pairwise group's single meetings alert nowhere: a bad host's partners each fall short once,
    # and a path is `clusterhealth analyze`'s to name. Its host rule alerts instead.
    not_pairwise = f"unless on (instance, job, probe)\nclusterhealth_probe_round{m()}"
    pairwise_host = _pairwise_host(c)
    # NCCL fell back: sockets where the node exports RDMA devices, shared memory where its GPUs have
    # an NVLink up; the facts checks/probes/transport.py judges a run by, so the probe's result is
    # degraded whenever this fires. Links up: a GPU's NVLink rate (its links up times one link's
    # speed) by default, the per-link flags where they are exported (opt-in); on a driver without
    # the speed field and without the per-link flags, the degraded run shows as ProbeFailing.
    fallback = f"""clusterhealth_probe_transport_info{m('net="Socket"')}
  and on (instance, job) clusterhealth_rdma_device_info{m()}
or
clusterhealth_probe_transport_info{m('intra=~"SHM|mixed"')}
  and on (instance, job)
  (
    clusterhealth_gpu_nvlink_rate_bytes_per_second{m()} > 0
    or
    clusterhealth_gpu_nvlink_up{m()} == 1
  )"""
    # The fallback is the run's problem to fix; its low bandwidth or failed result is the symptom.
    not_fallback = f"unless on (instance, job, probe)\n(\n{_indent(fallback)}\n)"

    gpu = Group(
        "clusterhealth.gpu",
        [
            Alert(
                "GPUFellOffBus",
                "critical",
                f"clusterhealth_gpu_up{m()} == 0",
                f"{GPU} fell off the bus: NVML cannot reach it.",
                "The GPU no longer answers NVML (Xid 79 in the kernel log is the usual sign): a PCIe "
                "link, power or thermal fault took it away and every job on it has failed. Drain the "
                "node, then reset the GPU or reboot; reseat or replace it if it comes back.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPUUncorrectableECC",
                "critical",
                "clusterhealth_gpu_ecc_errors_total" + m('error="uncorrected"', 'scope="volatile"') + " > 0",
                f"{GPU} had uncorrectable ECC errors since its driver loaded.",
                "{{ $value }} uncorrectable memory errors (Xid 48, 94 or 95): data on the GPU was "
                "lost and the jobs using it got errors. Drain the GPU and reset it so the row remap "
                "takes effect; replace it if the remap fails or the errors return.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPURowRemapFailed",
                "critical",
                f"clusterhealth_gpu_row_remap_failed{m()} == 1",
                f"{GPU} failed to remap a memory row: it needs replacing.",
                "The GPU ran out of spare memory rows (Xid 64): a failing row can no longer be "
                "repaired. Drain the node and open an RMA for the GPU.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPURowRemapPending",
                "warning",
                f"clusterhealth_gpu_row_remap_pending{m()} == 1",
                f"{GPU} has a row remap waiting for a GPU reset.",
                "After memory errors the GPU scheduled a row remap (Xid 63) that takes effect only at "
                "the next GPU reset. Drain the GPU when its jobs end and reset it.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPURecoveryActionRequired",
                "critical",
                f"clusterhealth_gpu_recovery_action{needs_recovery} == 1",
                f"{GPU} needs recovery: NVML asks for {{{{ $labels.action }}}}.",
                "NVML states that the GPU cannot be used as it is until {{ $labels.action }} is done "
                "(gpu_reset, node_reboot, drain_p2p, drain_and_reset, ...), whenever the fault that "
                "caused it happened, even while the agent was down. Drain the GPU and do what NVML "
                "asks; `clusterhealth check --only gpu_recovery_action` on the node says how.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPUXidCritical",
                "critical",
                _xid_events(c, xids),
                f"{GPU} reported critical Xid {{{{ $labels.xid }}}}.",
                "Xid {{ $labels.xid }} is one NVIDIA's catalog answers with a GPU reset, a reboot, "
                "or an ECC or NVLink workflow (the runbook lists each code). Run `clusterhealth check "
                "--only gpu_xid` on the node for the code's meaning and action; usually drain, then "
                "reset the GPU.",
                # As long as the GPU's other hardware alerts wait: one incident, one notification.
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPUXidCritical",
                "warning",
                _xid_events(c, ticket_xids),
                f"{GPU} reported memory-health Xid {{{{ $labels.xid }}}}.",
                "Xid {{ $labels.xid }}: NVIDIA's catalog asks for no immediate action (or only a "
                "restart of the affected job), but the GPU's memory is wearing or a repair waits for a "
                "GPU reset. Check nvidia-smi -q -d ECC,ROW_REMAPPER and reset the GPU at the next "
                "maintenance; neither page nor drain.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPUThermalOrPowerSlowdown",
                "warning",
                # NVML's time counters where the driver has them; else the sampled flag, held the
                # whole window.
                f"""instance_gpu_reason:clusterhealth_gpu_clocks_event_seconds_total:rate{slowdown}
  > {c.slowdown_share:g}
or
(
  min_over_time(clusterhealth_gpu_clocks_event_active{slowdown}[{c.slowdown_window}]) == 1
  unless on (instance, job, gpu, uuid)
  clusterhealth_gpu_clocks_event_seconds_total{m()}
)""",
                f"{GPU} was clocked down by {{{{ $labels.reason }}}} for more than {c.slowdown_share:.0%} "
                f"of the last {c.slowdown_window}.",
                "The GPU held its clocks down because of heat or a power fault ({{ $labels.reason "
                "}}), so it slows every synchronous job step. Check its temperatures, fans or "
                "airflow and the power supplies; drain it if it persists.",
                c.for_immediate,
                about="gpu",
            ),
            Alert(
                "GPUPCIeLinkDegraded",
                "warning",
                f"""clusterhealth_gpu_pcie_link_width{m()} < clusterhealth_gpu_pcie_link_width_max{m()}
or
(
  clusterhealth_gpu_pcie_link_generation{m()} < clusterhealth_gpu_pcie_link_generation_max{m()}
  and on (instance, job, gpu, uuid)
  clusterhealth_gpu_utilization_ratio{m()} > {c.busy_utilization}
)""",
                f"{GPU} runs its PCIe link below its maximum width or generation.",
                "The link trained narrower than the slot, or runs a lower generation under load: "
                "host-device copies run at a fraction of their speed. Usually a badly seated "
                "GPU or riser; reseat it at the next maintenance.",
                c.for_sustained,
                about="gpu",
            ),
            Alert(
                "GPUPCIeReplays",
                "warning",
                f"""rate(clusterhealth_gpu_pcie_replay_errors_total{m()}[{c.rate_window}]) * 60
  > {c.pcie_replays_per_minute:g}""",
                f"{GPU} retransmits on its PCIe link more than {c.pcie_replays_per_minute:g} times a minute.",
                "{{ $value | humanize }} PCIe replays a minute: the link layer resends packets the "
                "other end received damaged, a marginal riser, slot or cable. Host-device copies slow "
                "down, and the link may train down or fail next. Reseat the GPU at the next "
                "maintenance.",
                c.for_sustained,
                about="gpu",
            ),
            Alert(
                "NVLinkDown",
                "critical",
                f"clusterhealth_gpu_nvlink_links_down{m()} > 0",
                f"{{{{ $value }}}} NVLink(s) of {GPU} are down.",
                "An NVLink is down (often after Xid 74 CRC and replay errors): collectives on the "
                "node fall back to slower paths or fail. Drain the node and reset the GPUs (or "
                "reboot); replace the GPU or baseboard if the link stays down.",
                c.for_immediate,
                about="gpu",
            ),
        ],
    )

    rdma = Group(
        "clusterhealth.rdma",
        [
            Alert(
                "RDMAPortDown",
                "critical",
                f"""clusterhealth_rdma_port_state_id{m(port)} != 4
or on (instance, job, device, port)
clusterhealth_rdma_port_physical_state_id{m(port)} != 5""",
                f"{PORT} is not ACTIVE and LinkUp.",
                "The port lost its link, or waits for the subnet manager: traffic on this rail "
                "stops or moves to the others. Check the cable and the switch port (ibstat, "
                "mlxlink); reseat or replace the cable or transceiver.",
                c.for_immediate,
                about="rdma_port",
            ),
            Alert(
                "RDMALinkFlapping",
                "warning",
                f"""increase(
  clusterhealth_rdma_port_errors_total{m('counter="link_downed"')}[{c.flap_window}]
) > 0
or
rate(clusterhealth_rdma_port_errors_total{m('counter="link_error_recovery"')}[{c.rate_window}]) * 60
  > {c.link_error_recovery_per_minute}""",
                f"{PORT} is flapping ({{{{ $labels.counter }}}}).",
                "The link went down or retrained recently: every flap stalls the collectives that "
                "use it. Usually a marginal cable or transceiver; check it with mlxlink and replace "
                "it if the counters keep rising.",
                about="rdma_port",
            ),
            Alert(
                "RDMAPortErrors",
                "critical",
                f"""rate(clusterhealth_rdma_port_errors_total{m('counter="symbol_error"')}[{c.rate_window}])
  > {c.symbol_errors_per_second_critical}""",
                f"{PORT} counts more than {c.symbol_errors_per_second_critical:g} symbol errors per second.",
                "{{ $value | humanize }} symbol errors per second: the link is corrupting data and "
                "retransmitting. Drain the node (or disable the port) and replace the cable or "
                "transceiver.",
                c.for_immediate,
                about="rdma_port",
            ),
            Alert(
                "RDMAPortErrors",
                "warning",
                f"""increase(clusterhealth_rdma_port_errors_total{m('counter="symbol_error"')}[{c.error_window}])
  > {c.symbol_errors_per_hour_warning:g}
or
increase(clusterhealth_rdma_port_errors_total{receive}[{c.error_window}])
  > {c.receive_errors_per_hour_warning:g}""",
                f"{PORT} counts {{{{ $labels.counter }}}} errors.",
                "{{ $value | humanize }} {{ $labels.counter }} errors in " + c.error_window + ": a "
                "marginal cable, transceiver or port. Check the link with mlxlink or ibdiagnet and "
                "replace the cable at the next maintenance.",
                about="rdma_port",
            ),
            Alert(
                "RDMAPortErrorsUnknown",
                "warning",
                f"clusterhealth_rdma_port_pma_saturated_counters{m()} > 0",
                f"{PORT}: {{{{ $value }}}} error counter(s) saturated, its error rates are unknown.",
                "Fixed-width PMA counters sit at their maximum (65535 for the 16-bit ones such as "
                "symbol_error, 255 for link_downed) and no longer count, so RDMAPortErrors and "
                "RDMALinkFlapping cannot see new errors on this port (and the link has had many). "
                "Check the link, then clear the port's counters (perfquery -R) so they count again.",
                about="rdma_port",
            ),
            Alert(
                "RDMAPCIeLinkDegraded",
                "warning",
                f"""clusterhealth_rdma_device_pcie_link_width{m()}
  < clusterhealth_rdma_device_pcie_link_width_max{m()}
or
clusterhealth_rdma_device_pcie_link_generation{m()}
  < clusterhealth_rdma_device_pcie_link_generation_max{m()}""",
                "HCA {{ $labels.device }} on {{ $labels.instance }} runs its PCIe link below its maximum.",
                "The HCA's PCIe link trained narrower or slower than it can: it cannot feed its "
                "port at line rate. Usually a badly seated card or riser; reseat it at the next "
                "maintenance.",
                c.for_sustained,
                about="hca",
            ),
            # PCIe AER of the GPUs' and HCAs' PCI functions (the pcie_aer collector): counts since
            # boot, so only an increase alerts.
            Alert(
                "PCIeAERErrors",
                "critical",
                f"""increase(
  clusterhealth_pcie_aer_errors_total{m('class=~"nonfatal|fatal"')}[{c.error_window}]
) > 0""",
                "PCI function {{ $labels.device }} ({{ $labels.driver }}) on {{ $labels.instance }} "
                "reported {{ $labels.class }} PCIe errors.",
                "{{ $value | humanize }} uncorrectable ({{ $labels.class }}) AER errors in "
                + c.error_window
                + ": the link lost or poisoned a transaction, and a fatal error usually takes the "
                "device off the bus (a GPU then reports Xid 79). Drain the node; reseat or replace "
                "the device or its riser if it happens again.",
                about="pci_function",
            ),
            Alert(
                "PCIeAERErrors",
                "warning",
                f"""rate(clusterhealth_pcie_aer_errors_total{m('class="correctable"')}[{c.rate_window}]) * 60
  > {c.pcie_correctable_errors_per_minute:g}""",
                "PCI function {{ $labels.device }} ({{ $labels.driver }}) on {{ $labels.instance }} "
                "counts many correctable PCIe errors.",
                "{{ $value | humanize }} correctable AER errors a minute (bad TLPs or DLLPs, replays, "
                f"receiver errors), above {c.pcie_correctable_errors_per_minute:g}: the link is "
                "marginal and retransmits, which costs bandwidth, and it may train down or fail "
                "next. Reseat the device or its riser at the next maintenance.",
                c.for_sustained,
                about="pci_function",
            ),
            # At the severity `check` gives the node's own policy (a rule's `severity`), so that the
            # Slurm health check and the alert judge one fault alike; a fleet outlier is a warning.
            Alert(
                "MTUMismatch",
                "critical",
                f"""label_replace(
  clusterhealth_check_status{m('check="mtu"')}, "interface", "$1", "subject", "(.*)"
) == 2""",
                "Interface {{ $labels.interface }} on {{ $labels.instance }} has an MTU unlike its policy.",
                "The MTU differs from the node's policy, whose rule makes this CRITICAL (check mtu): "
                "jumbo frames are dropped or fragmented and RoCE or IPoIB throughput falls. Fix the "
                "interface's network configuration.",
                c.for_sustained,
                about="interface",
            ),
            Alert(
                "MTUMismatch",
                "warning",
                f"""label_replace(
  clusterhealth_check_status{m('check="mtu"')}, "interface", "$1", "subject", "(.*)"
) == 1
or on (instance, job, interface)
(
  count_values without () ("mtu", clusterhealth_netdev_mtu_bytes{m()})
  * on (job, interface, mtu) group_left ()
  job_interface_mtu:clusterhealth_netdev_mtu_bytes:count
  < on (job, interface) group_left ()
  job_interface:clusterhealth_netdev_mtu_bytes:max_count
)""",
                "Interface {{ $labels.interface }} on {{ $labels.instance }} has an MTU unlike its "
                "policy or its peers.",
                "The MTU differs from the node's policy (check mtu) or from the MTU most nodes use "
                "on this interface: jumbo frames are dropped or fragmented and RoCE or IPoIB "
                "throughput falls. Fix the interface's network configuration.",
                c.for_sustained,
                about="interface",
            ),
        ],
    )

    fleet = Group(
        "clusterhealth.fleet",
        [
            Alert(
                "FirmwareDrift",
                "warning",
                """instance_subject:clusterhealth_firmware_info:model
* on (job, component, model, version) group_left ()
(
  job_component_model_version:clusterhealth_firmware_info:count
  < on (job, component, model) group_left ()
  job_component_model:clusterhealth_firmware_info:max_count
)""",
                "{{ $labels.component }} {{ $labels.subject }} on {{ $labels.instance }} runs "
                "{{ $labels.version }}, not the fleet's most common version.",
                "{{ $value }} device(s) of this component and model run {{ $labels.version }} in the "
                "fleet, fewer than run the most common version: the node missed a roll-out, or got a "
                "part with other firmware. Mixed firmware causes hard-to-trace collective slowdowns; "
                "update it to the fleet's version.",
                c.for_drift,
                about="firmware",
            ),
            Alert(
                "FabricBandwidthDegraded",
                "warning",
                _joined(
                    _joined(f"{degraded_probe}\n{not_pairwise}\n{not_fallback}", pairwise_host),
                    c.fabric_pairwise_host_expr,
                ),
                "{{ if $labels.pairwise }}{{ $labels.instance }} is a suspect host of pairwise group "
                "{{ $labels.probe }}.{{ else }}Probe {{ $labels.probe }}{{ if $labels.peer }} to "
                "{{ $labels.peer }}{{ end }} on {{ $labels.instance }} measured below its expected "
                "bandwidth.{{ end }}",
                "{{ if $labels.pairwise }}Its meetings failed or fell short with {{ $value }} partners "
                f"within {c.pairwise_host_window}, each of which did fine with its other partners: the "
                "node, not the paths, is the likely culprit (its NIC or HCA, PCIe link, cable to the "
                "leaf). `clusterhealth analyze --probe {{ $labels.probe }}` shows the meetings."
                "{{ else }}The last run measured {{ $value | humanize1024 }}B/s, below "
                f"{fraction:.0%} of the probe's expectation: a slow link, HCA or GPU on this node "
                "(or its peer). Run `clusterhealth probe run {{ $labels.probe }}` on the node and "
                "compare its HCAs' counters.{{ end }}",
                c.for_immediate,
                about="probe",
            ),
            Alert(
                "NodeStraggler",
                "warning",
                _joined(
                    _joined(
                        f"""instance_gpu:clusterhealth_gpu_sm_clock_hertz:busy
  < on (instance, job, name) group_left ()
  (instance:clusterhealth_gpu_sm_clock_hertz:busy_median * {below})
  < on (job, name) group_left ()
  (job:clusterhealth_gpu_sm_clock_hertz:busy_median * {below})
or
clusterhealth_probe_bandwidth_bytes_per_second{local}
  < on (job, probe) group_left ()
  (job_probe:clusterhealth_probe_bandwidth_bytes_per_second:median * {below})
  and on (job, probe)
  job_probe:clusterhealth_probe_bandwidth_bytes_per_second:nodes >= {c.straggler_min_nodes}""",
                        # The pairwise host rule, as FabricBandwidthDegraded has it: a host its
                        # group's meetings single out is the fabric's straggler.
                        pairwise_host,
                    ),
                    c.straggler_pairwise_host_expr,
                ),
                "{{ if $labels.gpu }}" + GPU + " is a straggler: its SM clock sits below its node's and "
                "its fleet's.{{ else }}{{ if $labels.pairwise }}{{ $labels.instance }} is the straggler "
                "of pairwise group {{ $labels.probe }}.{{ else }}{{ $labels.instance }} is a straggler "
                "in probe {{ $labels.probe }}.{{ end }}{{ end }}",
                "{{ if $labels.gpu }}Busy at {{ $value | humanize }}Hz, more than "
                f"{c.straggler_margin:.0%} below the median of the node's and the fleet's busy GPUs "
                "of the same model: every synchronous job step waits for it. Look for clock events "
                "(thermal, power) and drain it if it persists.{{ else }}{{ if $labels.pairwise }}Its "
                "meetings failed or fell short with {{ $value }} partners within "
                f"{c.pairwise_host_window}, each of which did fine with its other partners: every "
                "collective it joins runs at "
                "its pace. `clusterhealth analyze --probe {{ $labels.probe }}` shows the meetings; "
                "drain it and check its HCAs, PCIe links and cables.{{ else }}The node's last run "
                "measured {{ $value | humanize1024 }}B/s, more than "
                f"{c.straggler_margin:.0%} below the fleet's median for the same probe: the node "
                "slows every job it joins. Compare its GPUs' clocks and HCAs' counters with a healthy "
                "node.{{ end }}{{ end }}",
                c.for_sustained,
                about="node",
            ),
            Alert(
                "ProbeFailing",
                "warning",
                f"""clusterhealth_probe_success{m()} == 0
unless on (instance, job, probe)
(
{_indent(degraded_probe)}
)
{not_pairwise}
{not_fallback}""",
                "Probe {{ $labels.probe }} on {{ $labels.instance }} failed its last run.",
                "The probe did not complete (non-zero exit, wrong results, garbage output or a "
                "timeout). Run `clusterhealth probe run {{ $labels.probe }}` on the node to see "
                "why; a failed collective often points at a GPU or HCA fault.",
                c.for_immediate,
                about="probe",
            ),
            Alert(
                "NCCLTransportFallback",
                "warning",
                fallback,
                "NCCL in probe {{ $labels.probe }} on {{ $labels.instance }} fell back to sockets or "
                "shared memory (net {{ $labels.net }}, intra-node {{ $labels.intra }}).",
                "The probe's last run used net={{ $labels.net }}, intra={{ $labels.intra }}, "
                "gdrdma={{ $labels.gdrdma }}, although the node exports RDMA devices (then Socket is a "
                "fallback: libibverbs missing in the probe's container, NCCL_IB_DISABLE, HCAs not "
                "visible) or NVLink links up (then SHM, or mixed, means peer access between its GPUs "
                "is off: NCCL_P2P_DISABLE, GPUs in separate containers, ACS). Jobs on this node fall "
                "back the same way and run slower. `clusterhealth probe run {{ $labels.probe }}` on "
                "the node shows the run's reason; its NCCL INFO lines show the channels.",
                c.for_immediate,
                about="probe",
            ),
            Alert(
                "NodeCheckFailing",
                "critical",
                f"clusterhealth_check_status{uncovered} == 2",
                "Check {{ $labels.check }} of {{ $labels.subject }} on {{ $labels.instance }} is CRITICAL.",
                "The node's audit fails against its policy (a GPU or HCA missing, a port below its "
                "rate, a version other than the pinned one). Run `clusterhealth check --only "
                "{{ $labels.check }}` on the node for the detail and drain it if devices are "
                "missing.",
                c.for_immediate,
                about="check",
            ),
            Alert(
                "NodeCheckFailing",
                "warning",
                f"clusterhealth_check_status{uncovered} == 1",
                "Check {{ $labels.check }} of {{ $labels.subject }} on {{ $labels.instance }} is WARNING.",
                "The node's audit found something to fix (an extra device, a version unlike its "
                "siblings'). Run `clusterhealth check --only {{ $labels.check }}` on the node for "
                "the detail.",
                c.for_sustained,
                about="check",
            ),
            Alert(
                "NodeCheckUnknown",
                "warning",
                # A lost GPU's other checks are UNKNOWN too; GPUFellOffBus already says so.
                f"""clusterhealth_check_status{m()} == 3
unless on (instance, job, subject)
clusterhealth_check_status{m('check="gpu_lost"')} > 0""",
                "Check {{ $labels.check }} of {{ $labels.subject }} on {{ $labels.instance }} is UNKNOWN.",
                "The agent could not read what the check needs (NVML unusable, the kernel log "
                "unreadable), so this part of the node is not watched. Run `clusterhealth check` "
                "on the node and fix the access.",
                c.for_sustained,
                about="check",
            ),
        ],
    )

    agent = Group(
        "clusterhealth.agent",
        [
            Alert(
                "ClusterHealthAgentDown",
                "warning",
                f"up{m()} == 0",
                "The clusterhealth agent on {{ $labels.instance }} cannot be scraped.",
                "Prometheus cannot scrape the agent: the node is down, or the agent stopped or "
                "hangs. Its GPUs and HCAs are not watched (their alerts are inhibited meanwhile). "
                "Check `systemctl status clusterhealth` or the DaemonSet pod on the node.",
                c.for_agent,
                about="node",
            ),
            Alert(
                "ClusterHealthAgentDown",
                "critical",
                f"absent(up{m()})",
                "No clusterhealth agent is scraped by Prometheus.",
                "No target of the clusterhealth job exists: the scrape configuration or service "
                "discovery lost the agents, and no GPU node is watched. Check the scrape job, the "
                "ServiceMonitor or the DaemonSet.",
                c.for_absent,
                about="fleet",
            ),
            Alert(
                "CollectorFailing",
                "warning",
                f"clusterhealth_scrape_collector_success{m()} == 0",
                "Collector {{ $labels.collector }} of the agent on {{ $labels.instance }} is failing.",
                "The collector's last run failed or hangs (NVML unusable, sysfs or the kernel log "
                "unreadable): its series are missing, so alerts on them cannot fire. Read the "
                "agent's log and /healthz on the node.",
                c.for_agent,
                about="collector",
            ),
        ],
    )
    return [recording, gpu, rdma, fleet, agent, *job_groups(c)]


@dataclass(frozen=True)
class JobSignal:
    """A GPU series JobStraggler compares with the median of the GPU's job: the `signal` label of
    its alerts, the series, and how far below the median counts (a Config field's value)."""

    name: str
    metric: str
    margin: float


# The job a series is about (its Prometheus job, and the workload labels of clusterhealth_gpu_job_info
# without `container` and `source`): a Slurm job, or a pod. `job` in the agent's exposition reaches
# Prometheus as `exported_job`, its own `job` label being the scrape job's.
WORKLOAD = "job, scheduler, exported_job, namespace, pod"
JOB_OF = (
    "{{ if $labels.pod }}pod {{ $labels.namespace }}/{{ $labels.pod }}{{ else }}{{ $labels.scheduler }} "
    "job {{ $labels.exported_job }}{{ end }}"
)


def job_signals(c: Config) -> list[JobSignal]:
    """What JobStraggler looks at: one entry per signal (more, such as throttle time, are one
    entry each)."""
    return [
        JobSignal("sm_clock", "clusterhealth_gpu_sm_clock_hertz", c.job_straggler_clock_margin),
        JobSignal("sm_active", "clusterhealth_gpu_sm_active_ratio", c.job_straggler_activity_margin),
    ]


def _join(metric: str) -> str:
    return f"instance_gpu_workload:{metric}:join"


def job_groups(c: Config) -> list[Group]:
    """Job attribution's rules: GPU series joined with the job on each GPU, per-job medians,
    JobStraggler and JobHitByNodeFault (docs/deploy.md, "Jobs")."""

    def m(*extra: str) -> str:
        return _matchers(c, *extra)

    joined = [s.metric for s in job_signals(c)] + ["clusterhealth_gpu_utilization_ratio"]
    records: list[Alert | Record] = []
    for metric in dict.fromkeys(joined):
        # One result per GPU and workload on it (a shared GPU has several), with the workload's labels.
        records.append(
            Record(
                _join(metric),
                f"""{metric}{m()}
* on (instance, job, gpu, uuid) group_right ()
clusterhealth_gpu_job_info{m()}""",
            )
        )
        records.append(
            Record(f"workload:{metric}:median", f"quantile by ({WORKLOAD}) (0.5, {_join(metric)})")
        )
    records.append(
        Record(
            "workload:clusterhealth_gpu_job_info:gpus",
            f"count by ({WORKLOAD}) (clusterhealth_gpu_job_info{m()})",
        )
    )
    below = "\nor\n".join(
        f"""label_replace(
  {_join(s.metric)}
  / on ({WORKLOAD}) group_left ()
  workload:{s.metric}:median
  < {round(1 - s.margin, 6)},
  "signal", "{s.name}", "", ""
)"""
        for s in job_signals(c)
    )
    busy_jobs = f"""workload:clusterhealth_gpu_utilization_ratio:median > {c.busy_utilization}
and
workload:clusterhealth_gpu_job_info:gpus >= {c.job_straggler_min_gpus}"""
    alerts = [
        Alert(
            "JobStraggler",
            "warning",
            f"""(
{_indent(below)}
)
and on ({WORKLOAD})
(
{_indent(busy_jobs)}
)""",
            f"{GPU} holds back {JOB_OF}: its {{{{ $labels.signal }}}} is far below the job's median.",
            "Its {{ $labels.signal }} is at {{ $value | humanizePercentage }} of the median of the "
            "job's GPUs (an alert below "
            + ", ".join(f"{1 - s.margin:.0%} for {s.name}" for s in job_signals(c))
            + ") while the job is busy (its GPUs' median utilization above "
            + f"{c.busy_utilization:g}). A synchronous job runs at the pace of its slowest rank: a low clock "
            "is heat, power or a clock setting on this GPU; low SM activity is a rank starved of "
            "input or stalled. Look for GPUThermalOrPowerSlowdown on the GPU, then drain it or tell "
            "the job's owner.",
            c.for_sustained,
            about="gpu",
        ),
        Alert(
            "JobHitByNodeFault",
            "critical",
            # A GPU's critical alert hurts the jobs on that GPU, and carries its `gpu` so that
            # Alertmanager's grouping by (instance, gpu) puts it in the GPU's own page; any other
            # critical alert of a node hurts every job on the node.
            f"""group by ({WORKLOAD}, instance, gpu) (clusterhealth_gpu_job_info{m()})
* on (job, instance, gpu) group_left ()
count by (job, instance, gpu) (
  ALERTS{m('alertstate="firing"', 'severity="critical"', 'gpu!=""', 'alertname!="JobHitByNodeFault"')}
)
or
group by ({WORKLOAD}, instance) (clusterhealth_gpu_job_info{m()})
* on (job, instance) group_left ()
count by (job, instance) (
  ALERTS{m('alertstate="firing"', 'severity="critical"', 'gpu=""', 'alertname!="JobHitByNodeFault"')}
)""",
            f"{JOB_OF} runs on {{{{ $labels.instance }}}}"
            "{{ if $labels.gpu }} GPU {{ $labels.gpu }}{{ end }}, which has a critical alert.",
            "{{ $value }} critical alert(s) fire on the GPU or node this job runs on: the job has likely "
            "failed or hangs (a collective waits for the rank on that node). The node's own alerts say "
            "what broke; drain the node and requeue or restart the job.",
            about="job",
        ),
    ]
    return [Group("clusterhealth.jobs.rules", records), Group("clusterhealth.jobs", alerts)]


def alerts(config: Config) -> list[Alert]:
    return [rule for group in groups(config) for rule in group.rules if isinstance(rule, Alert)]


def rule_file(config: Config) -> dict[str, Any]:
    """The Prometheus rule file as data (a PrometheusRule's `spec` has the same shape)."""
    out = []
    for group in groups(config):
        rules: list[dict[str, Any]] = []
        for rule in group.rules:
            if isinstance(rule, Record):
                rules.append({"record": rule.record, "expr": rule.expr})
                continue
            entry: dict[str, Any] = {"alert": rule.name, "expr": rule.expr}
            if rule.for_ not in ("0m", "0s"):
                entry["for"] = rule.for_
            entry["labels"] = {"severity": rule.severity}
            entry["annotations"] = {
                "summary": rule.summary,
                "description": rule.description,
                "runbook_url": config.runbook_url.format(alert=rule.name),
            }
            rules.append(entry)
        out.append({"name": group.name, "rules": rules})
    return {"groups": out}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: Any, header: str = "") -> str:
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100_000, allow_unicode=True)
    return header + text


HEADER = "# Generated by deploy/prometheus/mixin.py (`make generate`); edit the generator, not this file.\n"


def render(config: Config) -> str:
    return dump(rule_file(config), HEADER)


# -- the Alertmanager example's inhibitions, from the alerts' own labels ----------------------

ALERTMANAGER_FILE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
INHIBIT_BEGIN = "# BEGIN GENERATED INHIBIT RULES: deploy/prometheus/mixin.py (`make generate`)\n"
INHIBIT_END = "# END GENERATED INHIBIT RULES\n"
AGENT_DOWN = "ClusterHealthAgentDown"
CHECK_FAILING = "NodeCheckFailing"
NOUNS = {
    "gpu": "a GPU",
    "rdma_port": "an RDMA port",
    "pci_function": "a PCI function",
    "check": "a node's check",
    "job": "a job on a node",
}
# An audit check and the firmware component whose version it checks (checks/audits/firmware.py):
# NodeCheckFailing of the check and FirmwareDrift of the component are the same finding.
FIRMWARE_CHECKS = (("hca_firmware", "hca"), ("gpu_vbios", "gpu_vbios"), ("gpu_driver", "gpu_driver"))


def _names(alerts: Iterable[Alert]) -> str:
    return _alternation(sorted({a.name for a in alerts}))


def inhibit_rules(config: Config) -> list[tuple[str, dict[str, Any]]]:
    """(why, inhibit rule) for the Alertmanager example, from each alert's `about` labels:

    - while a node's agent is down, its alerts (every alert with an `instance`) wait for it;
    - a page about a thing (a GPU, an RDMA port, ...) makes the tickets about the same thing
      redundant: one incident pages once;
    - a node's firmware check, failing, makes the fleet's FirmwareDrift for the same device
      redundant (the check fires first: `for_sustained` is shorter than `for_drift`)."""
    every = alerts(config)
    on_nodes = [a for a in every if "instance" in SUBJECTS[a.about] and a.name != AGENT_DOWN]
    rules: list[tuple[str, dict[str, Any]]] = [
        (
            "While a node's agent cannot be scraped, its alerts describe a state nobody can see: the "
            "agent-down alert stands for them until the agent is back.",
            {
                "source_matchers": [f'alertname="{AGENT_DOWN}"'],
                "target_matchers": [f'alertname=~"{_names(on_nodes)}"'],
                "equal": ["instance"],
            },
        )
    ]
    for about, labels in SUBJECTS.items():
        noun = NOUNS.get(about, about)
        pages = [a for a in every if a.about == about and a.severity == "critical"]
        tickets = [a for a in every if a.about == about and a.severity == "warning"]
        if not (pages and tickets and labels):
            continue
        rules.append(
            (
                f"A page about {noun} stands for the tickets about the same one: one incident, one page.",
                {
                    "source_matchers": ['severity="critical"', f'alertname=~"{_names(pages)}"'],
                    "target_matchers": ['severity="warning"', f'alertname=~"{_names(tickets)}"'],
                    "equal": list(labels),
                },
            )
        )
    drift = _names(a for a in every if a.about == "firmware")
    shared = [label for label in SUBJECTS["check"] if label in SUBJECTS["firmware"]]
    for check, component in FIRMWARE_CHECKS:
        if check not in config.uncovered_checks or not drift:
            continue
        rules.append(
            (
                f"Check {check} failing and the fleet's drift of {component} firmware on the same "
                "device are one finding.",
                {
                    "source_matchers": [f'alertname="{CHECK_FAILING}"', f'check="{check}"'],
                    "target_matchers": [f'alertname=~"{drift}"', f'component="{component}"'],
                    "equal": shared,
                },
            )
        )
    return rules


def inhibitions_yaml(config: Config) -> str:
    """The `inhibit_rules` block of the Alertmanager example, each rule after a comment saying why."""

    def quoted(items: list[str]) -> str:
        return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"

    lines = ["inhibit_rules:"]
    for why, rule in inhibit_rules(config):
        lines += ["  # " + line for line in textwrap.wrap(why, 96, break_on_hyphens=False)]
        lines += [
            f"  - source_matchers: {quoted(rule['source_matchers'])}",
            f"    target_matchers: {quoted(rule['target_matchers'])}",
            f"    equal: [{', '.join(rule['equal'])}]",
        ]
    return "\n".join(lines) + "\n"


def with_inhibitions(text: str, config: Config) -> str:
    """The Alertmanager example with its generated block refreshed."""
    head, _, rest = text.partition(INHIBIT_BEGIN)
    _, _, tail = rest.partition(INHIBIT_END)
    return head + INHIBIT_BEGIN + inhibitions_yaml(config) + INHIBIT_END + tail


def xid_runbook(text: str, config: Config) -> str:
    """The GPUXidCritical runbook with its table of codes refreshed from the Xid catalog: each
    code's alert (page, ticket or none) and what `clusterhealth check` makes of it (CRITICAL drains
    a Slurm node)."""
    from clusterhealth.checks.xid_catalog import XID_CATALOG

    audit = {"critical": "CRITICAL (drains)", "warning": "WARNING", "info": "OK"}
    rows = ["| Xid | name | alert | check | meaning | action |", "| --- | --- | --- | --- | --- | --- |"]
    for code, info in sorted(XID_CATALOG.items()):
        if code in config.critical_xids:
            alert = "critical (page)"
        elif code in config.ticket_xids:
            alert = "warning (ticket)"
        else:
            alert = "none"
        cells = (str(code), f"`{info.name}`", alert, audit[info.severity], info.meaning, info.action)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    head, _, rest = text.partition(XID_TABLE_BEGIN)
    _, _, tail = rest.partition(XID_TABLE_END)
    return head + XID_TABLE_BEGIN + "\n".join(rows) + "\n" + XID_TABLE_END + tail


DOC_FILE = ROOT / "docs" / "deploy.md"
DOC_BEGIN = "<!-- BEGIN GENERATED RULES REFERENCE -->\n"
DOC_END = "<!-- END GENERATED RULES REFERENCE -->\n"


def reference_markdown(config: Config) -> str:
    """The alert table and the parameter table of docs/deploy.md."""

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    lines = ["| alert | severity | for | expression |", "| --- | --- | --- | --- |"]
    for alert in alerts(config):
        lines.append(
            f"| [{alert.name}](runbooks/{alert.name}.md) | {alert.severity} | {alert.for_} | "
            f"`{cell(alert.expr)}` |"
        )
    lines += ["", "| parameter | default | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(Config):
        default = getattr(config, f.name)
        shown = ", ".join(str(v) for v in default) if isinstance(default, tuple) else str(default)
        lines.append(f"| `{f.name}` | `{cell(shown) or '(empty)'}` | {cell(f.metadata['doc'])} |")
    return "\n".join(lines) + "\n"


def with_reference(text: str, config: Config) -> str:
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    return head + DOC_BEGIN + reference_markdown(config) + DOC_END + tail


def load_config(path: Path | None, profile: dict[str, Any] | None = None) -> Config:
    values: dict[str, Any] = dict(profile or {})
    if path is not None:
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise SystemExit(f"{path}: expected a mapping of Config fields")
        values.update(loaded)
    known = {f.name: f for f in dataclasses.fields(Config)}
    for key, value in values.items():
        if key not in known:
            raise SystemExit(f"{path}: {key}: unknown; known: {', '.join(sorted(known))}")
        default = known[key].default
        if isinstance(default, tuple):
            values[key] = tuple(value)
    return Config(**values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="YAML mapping of Config fields to override")
    parser.add_argument("--output", type=Path, default=RULES_FILE, help=f"default {RULES_FILE}")
    parser.add_argument("--test-profile", action="store_true", help="short durations, for tests")
    args = parser.parse_args(argv)
    config = load_config(args.config, TEST_PROFILE if args.test_profile else None)
    args.output.write_text(render(config))
    if args.output == RULES_FILE:
        CHART_RULES_FILE.write_text(render(config))
        DOC_FILE.write_text(with_reference(DOC_FILE.read_text(), config))
        XID_RUNBOOK.write_text(xid_runbook(XID_RUNBOOK.read_text(), config))
        ALERTMANAGER_FILE.write_text(with_inhibitions(ALERTMANAGER_FILE.read_text(), config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
