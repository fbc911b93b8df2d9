"""Current GPU health: GPUs present and answering, uncorrectable ECC (HBM, and SRAM past NVIDIA's
threshold), row remaps, recent Xids, and the recovery action NVML states."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from clusterhealth.checks.audits.network import count_result
from clusterhealth.checks.audits.observations import Observations, each_gpu, gpus_unreadable, lost
from clusterhealth.checks.audits.status import NODE, SEVERITY_STATUS, CheckResult, Status, natural
from clusterhealth.checks.kernel_log import normalize_pci_bus_id
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.checks.policy import Policy
from clusterhealth.checks.xid_catalog import describe
from clusterhealth.exporters.gpu import GpuReading


def gpu_count(policy: Policy, obs: Observations) -> list[CheckResult]:
    expected = policy.gpu_count
    if expected is None:
        return []
    if obs.gpus is None:
        return [
            CheckResult(
                "gpu_count",
                NODE,
                Status.UNKNOWN,
                f"{obs.gpus_unreadable}, so the {expected} GPUs were not counted",
            )
        ]
    up = sum(1 for g in obs.gpus if g.up)
    lost = [str(g.index) for g in obs.gpus if not g.up]
    text = f"{up} GPUs answer NVML, expected {expected}"
    if lost:
        text += f" (lost: GPU {', '.join(lost)})"
    return [count_result("gpu_count", NODE, expected, up, text)]


def gpu_lost(policy: Policy, obs: Observations) -> list[CheckResult]:
    if obs.gpus is None:
        return gpus_unreadable("gpu_lost", obs)
    results = []
    for gpu in obs.gpus:
        subject = str(gpu.index)
        if gpu.up:
            results.append(CheckResult("gpu_lost", subject, Status.OK, f"GPU {subject} answers NVML"))
        else:
            uuid = f" ({gpu.uuid})" if gpu.uuid else ""
            results.append(
                CheckResult(
                    "gpu_lost",
                    subject,
                    Status.CRITICAL,
                    f"GPU {subject}{uuid} does not answer NVML: {gpu.down_reason or 'no reason given'}. "
                    "Drain the node and reboot it; if the GPU stays lost, check the kernel log for Xid 79 "
                    "and PCIe errors and have the GPU replaced",
                )
            )
    return results


def gpu_ecc_uncorrectable(policy: Policy, obs: Observations) -> list[CheckResult]:
    def judge(gpu: GpuReading) -> CheckResult:
        subject = str(gpu.index)
        volatile = gpu.ecc_errors.get(("uncorrected", "volatile"))
        if gpu.health.sram_ecc_threshold_exceeded:
            # NVIDIA's GPU Memory Error Management, "RMA Policy": the SRAM Threshold Exceeded flag
            # is the RMA criterion for SRAM uncorrectable errors (more than 4 unique uncorrectable
            # events in an address bank of a parity-protected SRAM, more than 2 of a SEC-DED one).
            hbm = f"; {volatile} uncorrectable HBM ECC errors since the driver loaded" if volatile else ""
            return CheckResult(
                "gpu_ecc_uncorrectable",
                subject,
                Status.CRITICAL,
                f"GPU {subject}: its SRAM uncorrectable ECC errors passed NVIDIA's threshold (SRAM "
                f"Threshold Exceeded){hbm}: that meets NVIDIA's RMA criteria. Drain the GPU, confirm "
                "with NVIDIA's field diagnostic and have it replaced (nvidia-smi -q -d ECC shows the counts)",
            )
        if volatile is None:
            return CheckResult(
                "gpu_ecc_uncorrectable",
                subject,
                Status.UNKNOWN,
                f"GPU {subject}: ECC counters unavailable (ECC disabled, not supported, or NVML failed)",
            )
        if volatile > 0:
            aggregate = gpu.ecc_errors.get(("uncorrected", "aggregate"))
            lifetime = f" ({aggregate} over its lifetime)" if aggregate is not None else ""
            return CheckResult(
                "gpu_ecc_uncorrectable",
                subject,
                Status.CRITICAL,
                f"GPU {subject} had {volatile} uncorrectable ECC errors since the driver loaded"
                f"{lifetime}: "
                "drain it, reset it so the bad rows are remapped, and check "
                "nvidia-smi -q -d ECC,ROW_REMAPPER",
            )
        return CheckResult(
            "gpu_ecc_uncorrectable",
            subject,
            Status.OK,
            f"GPU {subject}: no uncorrectable ECC error since the driver loaded",
        )

    return each_gpu("gpu_ecc_uncorrectable", obs, judge)


def gpu_row_remap(policy: Policy, obs: Observations) -> list[CheckResult]:
    def judge(gpu: GpuReading) -> CheckResult:
        subject = str(gpu.index)
        rows = gpu.remapped_rows
        remapped = (
            f" ({rows.get('uncorrectable', 0)} rows remapped for uncorrectable errors, "
            f"{rows.get('correctable', 0)} for correctable ones)"
            if rows
            else ""
        )
        status: Status
        if gpu.row_remap_failed:
            status, message = (
                Status.CRITICAL,
                f"GPU {subject}: a row remap failed{remapped}: the memory has no spare rows left; "
                "drain the node and replace the GPU",
            )
        elif gpu.row_remap_pending:
            status, message = (
                SEVERITY_STATUS[policy.gpu_health.row_remap_pending],
                f"GPU {subject}: a row remap is pending{remapped}: drain the GPU and reset it "
                "(nvidia-smi -r, or reboot) to apply it",
            )
        elif gpu.row_remap_failed is None or gpu.row_remap_pending is None:
            status, message = (
                Status.UNKNOWN,
                f"GPU {subject}: row-remap state unavailable (not supported before Ampere, or NVML failed)",
            )
        else:
            status, message = Status.OK, f"GPU {subject}: no pending or failed row remap{remapped}"
        return CheckResult("gpu_row_remap", subject, status, message)

    return each_gpu("gpu_row_remap", obs, judge)


# What to do for each recovery action NVML states (nvmlDeviceGpuRecoveryAction_t), by the names
# nvidia-ml-py gives them (13.580 names value 5 gpu_reset_bus, 13.615 recover_imex_domain; see
# exporters/nvml_health.py). NVIDIA's GPU Memory Error Management, "Error Recovery and Response
# Flags", says what the first five mean.
RECOVERY_ADVICE = {
    "gpu_reset": "drain the GPU, end its processes and reset it (nvidia-smi -r)",
    "node_reboot": "drain the node and reboot it: the fault may have left the OS inconsistent",
    "drain_p2p": "end the processes that use the GPU's peer-to-peer traffic and disable UVM persistence "
    "mode, then read the recovery action again",
    "drain_and_reset": "end the processes that use its peer-to-peer traffic, then reset the GPU "
    "(nvidia-smi -r)",
    "gpu_reset_bus": "drain the GPU and reset it through its PCIe bus",
    "recover_imex_domain": "recover the node's IMEX domain (multi-node NVLink)",
    "bus_reset": "drain the GPU and reset it through its PCIe bus",
    "system_reboot": "drain the node and reboot it",
}


def gpu_recovery_action(policy: Policy, obs: Observations) -> list[CheckResult]:
    """The recovery action NVML states for each GPU: CRITICAL unless it is `none`. A driver without
    the field has nothing to say, so such a GPU has no result."""
    if obs.gpus is None:
        return gpus_unreadable("gpu_recovery_action", obs)
    results = []
    for gpu in obs.gpus:
        subject = str(gpu.index)
        if not gpu.up and gpu.recovery_action in (None, "none"):
            results.append(lost("gpu_recovery_action", gpu))
        elif gpu.recovery_action == "none":
            results.append(
                CheckResult(
                    "gpu_recovery_action", subject, Status.OK, f"GPU {subject}: NVML asks for no recovery"
                )
            )
        elif gpu.recovery_action is not None:
            advice = RECOVERY_ADVICE.get(gpu.recovery_action, "see NVIDIA's documentation of the action")
            # A GPU that waits for a reset answers nothing else, but still says what to do.
            down = "" if gpu.up else f" (it answers NVML nothing else: {gpu.down_reason})"
            results.append(
                CheckResult(
                    "gpu_recovery_action",
                    subject,
                    Status.CRITICAL,
                    f"GPU {subject}: NVML's recovery action is {gpu.recovery_action}{down}: {advice}. "
                    "It stays until done, whenever the fault (an Xid) happened",
                )
            )
    return results


_XID_STATUS = {"critical": Status.CRITICAL, "warning": Status.WARNING, "info": Status.OK}


def xid_status(event: SeenEvent) -> Status:
    """What one Xid makes `gpu_xid`: its catalog severity as a status."""
    return _XID_STATUS[describe(event.code or 0).severity]


def gpu_xid(policy: Policy, obs: Observations) -> list[CheckResult]:
    window, now = policy.gpu_health.xid_window_seconds, obs.now_boot_seconds
    recent = recent_xids(policy, obs)
    if recent is None:
        return [
            CheckResult(
                "gpu_xid", NODE, Status.UNKNOWN, f"{obs.kernel_events_unreadable}, so Xid errors are unknown"
            )
        ]
    subjects = [str(g.index) for g in obs.gpus or ()]
    subjects += sorted((s for s in recent if s not in subjects), key=natural)
    return [_xid_result(subject, recent.get(subject, []), window, now) for subject in subjects]


def recent_xids(policy: Policy, obs: Observations) -> dict[str, list[SeenEvent]] | None:
    """The Xids within `xid_window_seconds`, by the subject `gpu_xid` reports them under (the GPU's
    index, else its bus id, else "unknown"); None when the events could not be read."""
    window, now, events = policy.gpu_health.xid_window_seconds, obs.now_boot_seconds, obs.kernel_events
    if events is None:
        return None
    subject_of = _xid_subject_resolver(obs.gpus)
    recent: dict[str, list[SeenEvent]] = defaultdict(list)
    for event in events:
        if event.kind == "xid" and event.code is not None and now - event.boot_seconds <= window:
            recent[subject_of(event)].append(event)
    return dict(recent)


def _xid_subject_resolver(gpus: Sequence[GpuReading] | None) -> Callable[[SeenEvent], str]:
    by_bus: dict[str, int] = {}
    for gpu in gpus or ():
        if gpu.pci_bus_id:
            try:
                by_bus[normalize_pci_bus_id(gpu.pci_bus_id)] = gpu.index
            except ValueError:
                continue

    def subject(event: SeenEvent) -> str:
        if event.gpu is not None and event.gpu >= 0:
            return str(event.gpu)
        # The watcher may have seen the line before NVML told it the GPUs' bus ids.
        if event.pci:
            try:
                bus = normalize_pci_bus_id(event.pci)
            except ValueError:
                return event.pci
            return str(by_bus[bus]) if bus in by_bus else bus
        return "unknown"

    return subject


def _xid_result(subject: str, events: Sequence[SeenEvent], window: float, now: float) -> CheckResult:
    if subject.isdigit():
        gpu = f"GPU {subject}"
    else:
        gpu = "an unidentified GPU" if subject == "unknown" else f"the GPU at {subject}"
    if not events:
        return CheckResult("gpu_xid", subject, Status.OK, f"{gpu}: no Xid in the last {window:g} s")
    status_of = {e: xid_status(e) for e in events}
    status = max(status_of.values(), key=lambda s: s.rank)
    # The latest of the worst events is the one to act on.
    latest = max((e for e in events if status_of[e] == status), key=lambda e: e.boot_seconds)
    info = describe(latest.code or 0)
    codes = Counter(e.code for e in events)
    tally = ", ".join(f"Xid {code}" + (f" ×{n}" if n > 1 else "") for code, n in sorted(codes.items()))
    summary = f"{len(events)} Xid event{'s' if len(events) > 1 else ''} in the last {window:g} s: {tally}"
    if status == Status.OK:
        return CheckResult(
            "gpu_xid",
            subject,
            Status.OK,
            f"{gpu}: only informational Xids ({summary}), the usual fallout of a killed process",
        )
    ago = max(0.0, now - latest.boot_seconds)
    return CheckResult(
        "gpu_xid",
        subject,
        status,
        f"{gpu}: Xid {info.code} ({info.name}) {ago:.0f} s ago: {info.meaning} "
        f"Action: {info.action} ({summary})",
    )
