"""GPU alerts (group `clusterhealth.gpu`): a GPU lost, its memory, its Xid events, its clocks,
its PCIe link and its NVLinks. Cases: gpu_cases.py; runbooks: docs/runbooks/<Alert>.md."""

from __future__ import annotations

from .config import Config
from .lib import GPU, Alert, Group, alternation, indent, matchers, selector


def group(c: Config) -> Group:
    return Group(
        "clusterhealth.gpu",
        [
            gpu_fell_off_bus(c),
            gpu_uncorrectable_ecc(c),
            gpu_row_remap_failed(c),
            gpu_row_remap_pending(c),
            gpu_recovery_action_required(c),
            gpu_xid_critical(c),
            gpu_xid_ticket(c),
            gpu_thermal_or_power_slowdown(c),
            gpu_pcie_link_degraded(c),
            gpu_pcie_replays(c),
            nvlink_down(c),
        ],
    )


def xid_events(c: Config, codes: str) -> str:
    """Xid events of the codes the matchers `codes` select within `xid_window`. A code's first
    event creates its series at 1, which increase() cannot see: the second term catches series
    younger than the window."""
    series = f"clusterhealth_gpu_xid_errors_total{codes}"
    return f"""increase({series}[{c.xid_window}]) > 0
or
(
  {series}
  unless
  {series} offset {c.xid_window}
)"""


def gpu_fell_off_bus(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "GPUFellOffBus",
        "critical",
        f"clusterhealth_gpu_up{m()} == 0",
        f"{GPU} fell off the bus: NVML cannot reach it.",
        "The GPU no longer answers NVML (Xid 79 in the kernel log is the usual sign): a PCIe "
        "link, power or thermal fault took it away and every job on it has failed. Drain the "
        "node, then reset the GPU or reboot; reseat or replace it if it comes back.",
        c.for_immediate,
        about="gpu",
    )


def gpu_uncorrectable_ecc(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "GPUUncorrectableECC",
        "critical",
        "clusterhealth_gpu_ecc_errors_total" + m('error="uncorrected"', 'scope="volatile"') + " > 0",
        f"{GPU} had uncorrectable ECC errors since its driver loaded.",
        "{{ $value }} uncorrectable memory errors (Xid 48, 94 or 95): data on the GPU was "
        "lost and the jobs using it got errors. Drain the GPU and reset it so the row remap "
        "takes effect; replace it if the remap fails or the errors return.",
        c.for_immediate,
        about="gpu",
    )


def gpu_row_remap_failed(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "GPURowRemapFailed",
        "critical",
        f"clusterhealth_gpu_row_remap_failed{m()} == 1",
        f"{GPU} failed to remap a memory row: it needs replacing.",
        "The GPU ran out of spare memory rows (Xid 64): a failing row can no longer be "
        "repaired. Drain the node and open an RMA for the GPU.",
        c.for_immediate,
        about="gpu",
    )


def gpu_row_remap_pending(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "GPURowRemapPending",
        "warning",
        f"clusterhealth_gpu_row_remap_pending{m()} == 1",
        f"{GPU} has a row remap waiting for a GPU reset.",
        "After memory errors the GPU scheduled a row remap (Xid 63) that takes effect only at "
        "the next GPU reset. Drain the GPU when its jobs end and reset it.",
        c.for_immediate,
        about="gpu",
    )


def gpu_recovery_action_required(c: Config) -> Alert:
    m = selector(c)
    needs_recovery = m('action!="none"')
    return Alert(
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
    )


def gpu_xid_critical(c: Config) -> Alert:
    xids = matchers(c, f'xid=~"{alternation(c.critical_xids)}"')
    return Alert(
        "GPUXidCritical",
        "critical",
        xid_events(c, xids),
        f"{GPU} reported critical Xid {{{{ $labels.xid }}}}.",
        "Xid {{ $labels.xid }} is one NVIDIA's catalog answers with a GPU reset, a reboot, "
        "or an ECC or NVLink workflow (the runbook lists each code). Run `clusterhealth check "
        "--only gpu_xid` on the node for the code's meaning and action; usually drain, then "
        "reset the GPU.",
        # As long as the GPU's other hardware alerts wait: one incident, one notification.
        c.for_immediate,
        about="gpu",
    )


def gpu_xid_ticket(c: Config) -> Alert:
    ticket_xids = matchers(c, f'xid=~"{alternation(c.ticket_xids)}"')
    return Alert(
        "GPUXidCritical",
        "warning",
        xid_events(c, ticket_xids),
        f"{GPU} reported Xid {{{{ $labels.xid }}}}, which needs a look but no page.",
        "Xid {{ $labels.xid }}: NVIDIA's catalog asks for no immediate action (or only a restart "
        "of the affected job), but the GPU's memory is wearing or a repair waits for a GPU reset "
        "(63, 92, 94: check nvidia-smi -q -d ECC,ROW_REMAPPER and reset the GPU at the next "
        "maintenance), or an NVLink 5 unit reported an error whose action its message decodes "
        "(144-146, 149: a fatal one is followed by Xid 154 and GPURecoveryActionRequired, which "
        "page; a non-fatal one needs nothing unless it repeats on the same link). Neither page nor "
        "drain; `clusterhealth check --only gpu_xid` gives the code's action.",
        c.for_immediate,
        about="gpu",
    )


# The time counters that time a sampled flag's reason besides its own (exporters/gpu.py): drivers
# before the split counters count both thermal slowdowns in `thermal`. A flag no counter times
# (`hw_slowdown`: NVML has none for it) is judged by its samples on every driver.
FLAG_ALSO_TIMED_BY = {"sw_thermal_slowdown": ("thermal",), "hw_thermal_slowdown": ("thermal",)}


def timed_reasons(c: Config) -> str:
    """Each GPU's time counters, as the flags' reasons they time: the flag of a reason with a
    counter is judged by the counter, never by its samples."""
    m = selector(c)
    timed = [f"clusterhealth_gpu_clocks_event_seconds_total{m()}"]
    for flag, counters in FLAG_ALSO_TIMED_BY.items():
        if flag not in c.slowdown_reasons:
            continue
        for counter in counters:
            series = "clusterhealth_gpu_clocks_event_seconds_total" + m('reason="' + counter + '"')
            timed.append(f'label_replace({series}, "reason", "{flag}", "", "")')
    return "\nor\n".join(timed)


def gpu_thermal_or_power_slowdown(c: Config) -> Alert:
    """NVML's time counters where the driver has them; else the sampled flag, held the whole
    window. Per reason: a driver with counters still has no counter for `hw_slowdown`."""
    m = selector(c)
    slowdown = m(f'reason=~"{alternation(c.slowdown_reasons)}"')
    return Alert(
        "GPUThermalOrPowerSlowdown",
        "warning",
        f"""instance_gpu_reason:clusterhealth_gpu_clocks_event_seconds_total:rate{slowdown}
  > {c.slowdown_share:g}
or
(
  min_over_time(clusterhealth_gpu_clocks_event_active{slowdown}[{c.slowdown_window}]) == 1
  unless on (instance, job, gpu, uuid, reason)
  (
{indent(indent(timed_reasons(c)))}
  )
)""",
        f"{GPU} was clocked down by {{{{ $labels.reason }}}} for more than {c.slowdown_share:.0%} "
        f"of the last {c.slowdown_window}.",
        "The GPU held its clocks down because of heat or a power fault ({{ $labels.reason "
        "}}), so it slows every synchronous job step. Check its temperatures, fans or "
        "airflow and the power supplies; drain it if it persists.",
        c.for_immediate,
        about="gpu",
    )


def gpu_pcie_link_degraded(c: Config) -> Alert:
    m = selector(c)
    return Alert(
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
    )


def gpu_pcie_replays(c: Config) -> Alert:
    m = selector(c)
    return Alert(
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
    )


def nvlink_down(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "NVLinkDown",
        "critical",
        f"clusterhealth_gpu_nvlink_links_down{m()} > 0",
        f"{{{{ $value }}}} NVLink(s) of {GPU} are down.",
        "An NVLink is down (often after Xid 74 CRC and replay errors): collectives on the "
        "node fall back to slower paths or fail. Drain the node and reset the GPUs (or "
        "reboot); replace the GPU or baseboard if the link stays down.",
        c.for_immediate,
        about="gpu",
    )
