"""The mixin's configuration: every selector, threshold and duration of the rules, as the fields
of `Config` (their defaults are what ships), the short profile the end-to-end tests run, and the
loader of a user's overrides (`mixin.py --config FILE`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Xid codes NVIDIA's catalog gives an immediate action for (reset, reboot, NVLink or ECC
# workflow): checks/xid_catalog.py's CRITICAL_XIDS; and its TICKET_XIDS, the memory-health codes it
# asks no immediate action for (63, 92) or a restart of the application (94), and the NVLink 5
# codes whose fatal events page through the Xid 154 that follows them (144-146, 149). Copies, so
# that regenerating needs no installed package; a test keeps them equal.
CRITICAL_XIDS = (46, 48, 61, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 150, 154, 155,
                 158)  # fmt: skip
TICKET_XIDS = (63, 92, 94, 144, 145, 146, 149)


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
    straggler_throttle_share: float = field(
        default=0.25,
        metadata={
            "doc": "NodeStraggler: a busy GPU whose fault reasons (slowdown_reasons) held its clocks down "
            "for more than this share of slowdown_window, by NVML's time counters"
        },
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
    # What a slow node of a pairwise group costs (docs/cost.md's model, issue 20): the stated
    # workload, a synchronous data-parallel job spanning the node, whose ring all-reduce runs at the
    # node's typical meeting bandwidth instead of its group's reference.
    impact_params: int = field(
        default=7_000_000_000, metadata={"doc": "impact rules: parameters whose gradients the job reduces"}
    )
    impact_bytes_per_param: float = field(
        default=2.0, metadata={"doc": "impact rules: bytes of a gradient element (2: BF16)"}
    )
    impact_gpus: int = field(
        default=64, metadata={"doc": "impact rules: GPUs of the job (its ring's ranks; its GPU-hours)"}
    )
    impact_compute_seconds: float = field(
        default=1.0, metadata={"doc": "impact rules: compute seconds of a step"}
    )
    impact_overlap: float = field(
        default=0.0,
        metadata={
            "doc": "impact rules: share of the shorter of compute and all-reduce hidden under the other"
        },
    )
    # Jobs (clusterhealth_gpu_job_info; docs/runbooks/JobStraggler.md): a GPU of a busy multi-GPU
    # workload well below the workload's median.
    job_straggler_clock_margin: float = field(
        default=0.1, metadata={"doc": "JobStraggler: an SM clock this fraction below its job's median"}
    )
    job_straggler_activity_margin: float = field(
        default=0.5, metadata={"doc": "JobStraggler: SM activity this fraction below its job's median"}
    )
    job_straggler_throttle_margin: float = field(
        default=0.2,
        metadata={
            "doc": "JobStraggler: a share of slowdown_window free of fault throttling this fraction below "
            "its job's median (time counters)"
        },
    )
    job_straggler_min_gpus: int = field(
        default=2, metadata={"doc": "JobStraggler: GPUs a job needs for its median to mean anything"}
    )
    # The remediator (`clusterhealth remediate`, docs/remediation.md): a scrape job of its own.
    remediation_selector: str = field(
        default='job="clusterhealth-remediate"',
        metadata={"doc": "label matchers of the remediator's scrape job"},
    )
    for_remediation: str = field(
        default="5m", metadata={"doc": "the remediator's budget spent while nodes wait, before it pages"}
    )
    remediation_stale_seconds: float = field(
        default=900,
        metadata={"doc": "the remediator's latest successful reconcile older than this is stale"},
    )


# The profile tests/test_end_to_end.py runs: every duration short enough for a test of seconds.
TEST_PROFILE = {
    "for_immediate": "2s",
    "for_sustained": "2s",
    "for_agent": "2s",
    "for_drift": "2s",
    # Prometheus applies its first scrape targets up to 5 s after it starts: `up` is absent until then.
    "for_absent": "30s",
    "for_remediation": "2s",
    "xid_window": "1m",
    "flap_window": "1m",
    "error_window": "1m",
    "rate_window": "20s",
    "slowdown_window": "20s",
}


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
        elif isinstance(default, float | int) and isinstance(value, str):
            # YAML reads 7e9 (no dot) as a string.
            try:
                values[key] = type(default)(float(value))
            except ValueError:
                raise SystemExit(f"{path}: {key}: {value!r} is not a number") from None
    return Config(**values)
