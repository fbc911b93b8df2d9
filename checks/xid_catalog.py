"""What NVIDIA Xid and NVSwitch SXid codes mean, how bad they are, and what to do about them.

Sources (paraphrased, not copied):

- Xid: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer),
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html — the mnemonic, the
  description and the "resolution buckets" (immediate / investigatory action) of each code, read
  through the copy of its spreadsheet generated into leptonai/gpud
  (components/accelerator/nvidia/xid/catalog_generated.go, October 2025). Codes that catalog lists
  as unused on current GPUs (61, 123) are described from NVIDIA's earlier Xid table (r555),
  https://docs.nvidia.com/deploy/xid-errors/index.html.
- SXid: NVIDIA, "Fabric Manager for NVIDIA NVSwitch Systems" user guide, DU-09883-001_v1.3
  (October 2023), appendix "NVSwitch SXid errors",
  https://docs.nvidia.com/datacenter/tesla/pdf/fabric-manager-user-guide.pdf — read through its
  transcription in leptonai/gpud (components/accelerator/nvidia/sxid/sxid.go); only codes found
  there are listed.

Severity is this project's call, read from NVIDIA's immediate action:

- ``critical``: the GPU, switch or node needs an operator now: NVIDIA's immediate action is a GPU
  reset, a node restart or an NVLink/ECC workflow. `clusterhealth check` reports it CRITICAL (the
  Slurm health check drains on it) and GPUXidCritical pages. `CRITICAL_XIDS` is this set.
- ``warning``: NVIDIA's immediate action is none or a restart of the application. Most are one
  program's fault (restart the job); the memory-health codes 63, 92 and 94 (`TICKET_XIDS`) leave
  the GPU running but mean a repair waits for a reset or the memory is wearing, so they open a
  ticket (GPUXidCritical at warning), without paging or draining. So do the NVLink 5 codes 144,
  145, 146 and 149, whose action NVIDIA decodes from the message: a fatal one needs a reset and
  pages through the Xid 154 that follows it, a non-fatal one mostly needs none (see below).
- ``info``: normal fallout of another event, no action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Severity = Literal["critical", "warning", "info"]

XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
SXID_GUIDE_URL = "https://docs.nvidia.com/datacenter/tesla/pdf/fabric-manager-user-guide.pdf"


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    """NVIDIA's mnemonic for the code (the NVSwitch guide's short title for an SXid)."""
    meaning: str
    severity: Severity
    action: str
    immediate: str = ""
    """NVIDIA's resolution bucket for the code, its catalog's "immediate action" (RESTART_APP,
    RESET_GPU, RESTART_BM, WORKFLOW_XID_48, IGNORE, ...), which checks/verdict.py turns into the
    node's recommended action; empty for an SXid (Fabric Manager's guide has no buckets) and an
    unknown code."""
    known: bool = True
    """False for the placeholder `describe` returns for a code missing from the catalog."""


_RESET = "Drain the GPU and reset it (reboot the node if the reset fails); open a support case if it recurs."

_XIDS: tuple[XidInfo, ...] = (
    XidInfo(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "A channel stopped making progress and the driver timed it out: the GPU stopped processing "
        "that work.",
        "warning",
        "Restart the application; if the same GPU keeps doing it, open a support case.",
        immediate="RESTART_APP",
    ),
    XidInfo(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY",
        "The graphics/compute engine raised an exception for a running program: usually an "
        "out-of-bounds access, an illegal instruction or register, occasionally failing hardware.",
        "warning",
        "Restart the job and debug the application (compute-sanitizer). If the same SM/TPC/GPC "
        "faults across different jobs, run DCGM diagnostics, then NVIDIA's field diagnostics.",
        immediate="RESTART_APP",
    ),
    XidInfo(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault: a program used a GPU virtual address with no valid mapping. Almost "
        "always an application or framework bug, rarely the driver or the hardware.",
        "warning",
        "Restart the job and check its memory accesses; if known-good code faults on one GPU "
        "only, test that GPU with DCGM diagnostics.",
        immediate="RESTART_APP",
    ),
    XidInfo(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "The push-buffer DMA engine received an invalid or corrupted command stream.",
        "warning",
        "Restart the application and check the application/CUDA stack; repeats with good software "
        "point at PCIe or memory corruption (look for AER errors).",
        immediate="RESTART_APP",
    ),
    XidInfo(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "The driver reset one channel after that program's own fault; the GPU stays healthy and "
        "other programs are unaffected.",
        "info",
        "Nothing to do on the node; the application must handle its error. Open a support case "
        "only if it recurs with known-good software.",
        immediate="IGNORE",
    ),
    XidInfo(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "The driver tore a channel down early: the process exited or was killed, or an earlier "
        "error on the GPU (double-bit ECC, NVLink, ...) took its work down.",
        "info",
        "Act on the Xid logged just before it on the same GPU, if any. Alone it usually follows a "
        "killed job; NVIDIA's catalog suggests restarting Fabric Manager if it keeps appearing alone "
        "on an NVSwitch system.",
        immediate="WORKFLOW_XID_45",
    ),
    XidInfo(
        46,
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "The GPU timed out and stopped processing work.",
        "critical",
        _RESET,
        immediate="RESET_GPU",
    ),
    XidInfo(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "Uncorrectable (double-bit) ECC error in GPU memory: the affected data is lost and the "
        "programs using it get an error.",
        "critical",
        "Drain the GPU and restart its jobs; reset the GPU so the page retirement or row remap "
        "takes effect, then check nvidia-smi -q -d ECC,ROW_REMAPPER. Replace the GPU if the remap "
        "fails or the errors return (NVIDIA's Xid 48 workflow).",
        immediate="WORKFLOW_XID_48",
    ),
    XidInfo(
        61,
        "PMU_BREAKPOINT",
        "An internal micro-controller (PMU) hit a breakpoint or raised a warning. NVIDIA's current "
        "catalog lists the code as unused on Ampere and newer; on older GPUs an internal engine "
        "stops working.",
        "critical",
        "Reset the GPU and report the event to NVIDIA support.",
        immediate="CONTACT_SUPPORT",
    ),
    XidInfo(
        62,
        "PMU_HALT_ERROR",
        "An internal micro-controller (PMU) on the GPU halted.",
        "critical",
        _RESET,
        immediate="RESET_GPU",
    ),
    XidInfo(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "The GPU recorded a memory repair in its InfoROM after a memory error: a page retirement "
        "(Volta and older) or a row remap (Ampere and newer). A row remap only takes effect after "
        "the GPU is reset.",
        "warning",
        "Reset the GPU when its jobs end (at the next maintenance) so the pending remap is applied; "
        "confirm with nvidia-smi -q -d ROW_REMAPPER. NVIDIA's catalog asks for no immediate action: "
        "the remap itself succeeded.",
        immediate="IGNORE",
    ),
    XidInfo(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "The GPU could not record a page retirement or row remap, so failing memory could not be fenced off.",
        "critical",
        "Drain and reset the GPU; if it happens again the GPU needs replacing (open a support case).",
        immediate="RESET_GPU",
    ),
    XidInfo(
        68,
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        "Exception in the NVDEC0 video decode engine.",
        "warning",
        "Restart the application; open a support case if it recurs.",
        immediate="RESTART_APP",
    ),
    XidInfo(
        69,
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "The graphics engine rejected a command (class error), usually because of an application "
        "or library bug.",
        "warning",
        "Restart the application and check the application/CUDA stack.",
        immediate="RESTART_APP",
    ),
    XidInfo(
        74,
        "NVLINK_ERROR",
        "An NVLink error on one of the GPU's links; the message names the link and the error "
        "registers. A fatal link error stops traffic to the GPU's peers too.",
        "critical",
        "Drain; check link state and error counters (nvidia-smi nvlink -s, -e); reset the GPU, and "
        "on NVSwitch systems the switches, following NVIDIA's NVLink workflow. If the same link "
        "fails again, have the GPU board or cabling serviced.",
        immediate="WORKFLOW_NVLINK_ERR",
    ),
    XidInfo(
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "The GPU stopped answering on PCIe (fallen off the bus): the driver cannot reach it any more.",
        "critical",
        "Drain and reboot the node (a GPU reset is not enough). Check PCIe AER errors on the "
        "upstream port, power and cooling; replace the GPU or riser if it recurs.",
        immediate="RESTART_BM",
    ),
    XidInfo(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "The GPU reports corrected single-bit ECC errors at a high rate; data is still correct, but "
        "the memory is degrading.",
        "warning",
        "No immediate action is needed for running jobs; schedule a check of the GPU's ECC and "
        "row-remap counters and open a support case (NVIDIA's investigatory action).",
        immediate="IGNORE",
    ),
    XidInfo(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "An uncorrectable memory error was contained (Ampere and newer): only the programs using "
        "the affected memory were stopped; the GPU keeps serving others.",
        "warning",
        "Restart the affected jobs (NVIDIA's immediate action). The bad row is remapped only after a "
        "GPU reset: reset it when its jobs end and check nvidia-smi -q -d ROW_REMAPPER.",
        immediate="RESTART_APP",
    ),
    XidInfo(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "An uncorrectable memory error could not be contained: every program on the GPU may have "
        "been affected.",
        "critical",
        "Drain and reset the GPU now; replace it if the error returns.",
        immediate="RESET_GPU",
    ),
    XidInfo(
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "A context switch on the GPU timed out.",
        "critical",
        _RESET,
        immediate="RESET_GPU",
    ),
    XidInfo(
        110,
        "SEC_FAULT_ERROR",
        "The GPU raised a security fault.",
        "critical",
        "Drain and reset the GPU; check that driver and firmware versions match NVIDIA's support matrix.",
        immediate="RESET_GPU",
    ),
    XidInfo(
        119,
        "GSP_RPC_TIMEOUT",
        "The driver timed out waiting for the GPU System Processor (GSP) firmware to answer a request.",
        "critical",
        "Drain and reset the GPU (reboot if that fails); if it recurs, update the driver or "
        "investigate driver/firmware with NVIDIA.",
        immediate="RESET_GPU",
    ),
    XidInfo(
        120,
        "GSP_ERROR",
        "The GPU System Processor (GSP) firmware reported an error.",
        "critical",
        "Drain and reset the GPU (reboot if that fails); if it recurs, update the driver or "
        "investigate driver/firmware with NVIDIA.",
        immediate="RESET_GPU",
    ),
    XidInfo(
        121,
        "C2C_ERROR",
        "Error on the chip-to-chip (C2C) link between the Grace CPU and the GPU.",
        "warning",
        "NVIDIA lists no immediate action; open a support case if it recurs.",
        immediate="IGNORE",
    ),
    XidInfo(
        123,
        "SPI_PMU_RPC_WRITE_FAIL",
        "A write to the GPU's SPI flash through the PMU failed. NVIDIA's current catalog lists the "
        "code as unused on Ampere and newer.",
        "warning",
        "Reset the GPU and report it to NVIDIA support (earlier Xid table).",
        immediate="CONTACT_SUPPORT",
    ),
    XidInfo(
        136,
        "ALI_TRAINING_FAIL",
        "NVLink link training failed.",
        "critical",
        "Drain and reset the GPU; if the link fails again, investigate its signal integrity "
        "(connectors, cables, board).",
        immediate="RESET_GPU",
    ),
    XidInfo(
        137,
        "NVLINK_PRIV_ERR",
        "NVLink (fabric address) privilege error: an access over NVLink was refused.",
        "warning",
        "NVIDIA lists no immediate action; investigate with its Xid 137 flow if it recurs.",
        immediate="IGNORE",
    ),
    XidInfo(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "An uncorrectable ECC error escaped containment and could not be recovered.",
        "critical",
        _RESET,
        immediate="RESET_GPU",
    ),
    XidInfo(
        143,
        "GPU_INIT_ERROR",
        "The GPU failed to initialize.",
        "critical",
        _RESET,
        immediate="RESET_GPU",
    ),
)

# Xid 144-150 are NVLink 5 (Blackwell) errors, one per unit of the link. NVIDIA's catalog answers
# them all with WORKFLOW_NVLINK5_ERR: decode the message's interrupt status and error status in its
# "XID 144-150 Decode" table, which gives each (unit, status) its recovery. There, every item of
# 150 (MSE degraded, MSE watchdog) is fatal and needs RESET_GPU; the fatal items of 144, 145, 146 and
# 149 (most of 149's link-down events) need RESET_GPU, the non-fatal ones IGNORE, or follow the
# Xid 154 that comes with them (XID_154_EVAL); every item of 147 (TREX) and 148 (NVLPW_CTRL) is
# IGNORE. The count of a code cannot tell a fatal event from a non-fatal one, but a fatal one is
# followed by an Xid 154 naming the recovery (the catalog's Xid 154 linkage, from driver R565) and
# sets NVML's recovery action: those page. So: 150 pages; 144, 145, 146 and 149 open a ticket; 147
# and 148 neither.
_NVLINK5_DECODE = "decode the message's interrupt and error status with NVIDIA's XID 144-150 table"
_NVLINK5_UNITS = {
    144: ("SAW", "NVLINK_SAW_ERROR"),
    145: ("RLW", "NVLINK_RLW_ERROR"),
    146: ("TLW", "NVLINK_TLW_ERROR"),
    147: ("TREX", "NVLINK_TREX_ERROR"),
    148: ("NVLPW_CTRL", "NVLINK_NVLPW_CTRL_ERROR"),
    149: ("NETIR", "NVLINK_NETIR_ERROR"),
    150: ("MSE", "NVLINK_MSE_ERROR"),
}
# The bucket of a code whose decode items all share one (147 and 148: IGNORE; 150: RESET_GPU);
# the others keep the catalog's WORKFLOW_NVLINK5_ERR: the code alone does not say.
_NVLINK5_BUCKET = {147: "IGNORE", 148: "IGNORE", 150: "RESET_GPU"}
_NVLINK5_LEVEL: dict[int, tuple[Severity, str]] = {
    **dict.fromkeys(
        (144, 145, 146, 149),
        (
            "warning",
            "A fatal one needs a GPU reset: the Xid 154 that follows it names the recovery "
            "(GPUXidCritical and GPURecoveryActionRequired page for it); a non-fatal one needs no "
            f"action unless it repeats on the same link ({_NVLINK5_DECODE}).",
        ),
    ),
    **dict.fromkeys(
        (147, 148),
        (
            "warning",
            f"NVIDIA lists no action for any of this unit's errors ({_NVLINK5_DECODE}); report it if it "
            "repeats.",
        ),
    ),
    150: (
        "critical",
        "Drain and reset the GPU: both of the unit's errors (MSE degraded, MSE watchdog) are fatal "
        "firmware faults that NVIDIA answers with a GPU reset; contact support if it recurs.",
    ),
}
_NVLINK5 = tuple(
    XidInfo(
        code,
        name,
        f"NVLink 5 error reported by the link's {unit} unit; the message says Fatal or Non-fatal "
        "and carries the interrupt status that NVIDIA's decode table interprets.",
        _NVLINK5_LEVEL[code][0],
        _NVLINK5_LEVEL[code][1],
        immediate=_NVLINK5_BUCKET.get(code, "WORKFLOW_NVLINK5_ERR"),
    )
    for code, (unit, name) in _NVLINK5_UNITS.items()
)

_LATER = (
    XidInfo(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "The driver changed the recovery the GPU needs (none, GPU reset, node reboot, drain P2P, "
        "drain and reset) because of another Xid; the message gives the old and new action.",
        "critical",
        "Carry out the new recovery action the message names; the cause is the Xid logged just before it.",
        immediate="XID_154",
    ),
    XidInfo(
        155,
        "NVLINK_SW_DEFINED_ERROR",
        "NVLink error raised by driver software.",
        "critical",
        "Drain and reset the GPU; if it recurs, investigate the software stack and the job.",
        immediate="RESET_GPU",
    ),
    XidInfo(
        158,
        "GPU_FATAL_TIMEOUT",
        "A fatal timeout inside the GPU.",
        "critical",
        _RESET,
        immediate="RESET_GPU",
    ),
)

XID_CATALOG: Mapping[int, XidInfo] = MappingProxyType({x.code: x for x in (*_XIDS, *_NVLINK5, *_LATER)})
CRITICAL_XIDS: frozenset[int] = frozenset(c for c, x in XID_CATALOG.items() if x.severity == "critical")
# Warnings about the GPU rather than one program: a ticket, not a page or a drain. The memory-health
# codes, and the NVLink 5 codes whose fatal events page through the Xid 154 that follows them.
TICKET_XIDS: frozenset[int] = frozenset({63, 92, 94, 144, 145, 146, 149})


def describe(code: int) -> XidInfo:
    """The catalog entry for an Xid code, or an "unknown Xid" entry (severity warning)."""
    info = XID_CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        "UNKNOWN_XID",
        f"Xid {code} is not in clusterhealth's catalog.",
        "warning",
        f"Look the code up in NVIDIA's Xid catalog ({XID_CATALOG_URL}) for this driver and GPU; "
        "keep the full kernel-log line for a support case.",
        known=False,
    )


# NVSwitch SXids. Fabric Manager's guide sorts them into non-fatal ones, which the switch corrects
# or which affect throughput only, and fatal ones, after which the port's traffic is lost until the
# GPUs and switches are reset. The guide lists these codes as single-bit ECC errors that the switch
# corrects.
_SXID_SBE: tuple[int, ...] = (
    *(11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055),
    *(19057, 19059, 19062, 19065, 19068, 19071, 24001, 24002, 24003),
)
_SXID_FATAL_PORT = {
    11001: "Ingress invalid command",
    11009: "Ingress invalid VCSet",
    11013: "Ingress header DBE",
    11018: "Ingress RID DBE",
    11019: "Ingress RLAN DBE",
    11020: "Ingress control parity",
    12001: "Egress crossbar overflow",
    12002: "Egress packet route",
    12022: "Egress input ECC DBE error",
}
_SXID_FATAL_ACTION = (
    "Fatal for the port's traffic (the GPU may report it as Xid 74): drain, then reset the GPUs and "
    "NVSwitches (reboot the node on bare metal); if the same SXid returns, have the NVSwitch "
    "baseboard inspected."
)

_SXIDS: tuple[XidInfo, ...] = (
    *(
        XidInfo(
            code,
            "Single bit ECC error",
            "A single-bit ECC error inside the NVSwitch, corrected by the switch hardware.",
            "info",
            "None; watch for a rising rate.",
        )
        for code in _SXID_SBE
    ),
    XidInfo(
        11004,
        "Ingress invalid ACL",
        "Ingress access-control failure, which only a wrong Fabric Manager partition configuration "
        "causes: the GPU's NVLink traffic stalls and CUDA jobs are aborted with Xid 45.",
        "critical",
        "Validate the fabric partition routing (NVIDIA's nvswitch-audit tool) and restart the "
        "affected partition or node.",
    ),
    XidInfo(
        12028,
        "Egress non-posted PRIV error",
        "Egress non-posted PRIV error on a switch port: the GPU's NVLink traffic stalls and CUDA "
        "jobs are aborted with Xid 45.",
        "critical",
        "Drain and reset the GPUs and NVSwitches (reboot the node on bare metal).",
    ),
    XidInfo(
        19084,
        "AN1 Heartbeat Timeout Error",
        "AN1 heartbeat timeout on the switch; it usually comes with a fatal SXid that stops the "
        "GPU's NVLink traffic.",
        "critical",
        "Drain, then reset all GPUs and all NVSwitches (reboot the node).",
    ),
    XidInfo(
        20001,
        "TX Replay Error",
        "An NVLink packet had to be retransmitted; the port's throughput may drop.",
        "warning",
        "None for a few; a steady rate points at a bad link or cable.",
    ),
    XidInfo(
        20012,
        "Broken/inconsistent connection",
        "A link came up inconsistently, e.g. after an uncoordinated shutdown of one side.",
        "warning",
        "If no uncoordinated shutdown explains it, check the link's mechanical connections.",
    ),
    XidInfo(
        20034,
        "LTSSM Fault Up",
        "A link went down from the active state; usually seen together with other NVLink errors.",
        "critical",
        _SXID_FATAL_ACTION,
    ),
    XidInfo(
        22013,
        "Minion Link DLREQ interrupt",
        "Link-management (MINION) DL request interrupt; the guide says it can be ignored.",
        "info",
        "None.",
    ),
    *(
        XidInfo(code, name, f"{name} on an NVSwitch port.", "critical", _SXID_FATAL_ACTION)
        for code, name in _SXID_FATAL_PORT.items()
    ),
)

SXID_CATALOG: Mapping[int, XidInfo] = MappingProxyType({x.code: x for x in _SXIDS})
CRITICAL_SXIDS: frozenset[int] = frozenset(c for c, x in SXID_CATALOG.items() if x.severity == "critical")


def describe_sxid(code: int) -> XidInfo:
    """The catalog entry for an NVSwitch SXid code, or an "unknown SXid" entry (severity warning)."""
    info = SXID_CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        "UNKNOWN_SXID",
        f"SXid {code} is not in clusterhealth's catalog.",
        "warning",
        f"Look the code up in NVIDIA's Fabric Manager user guide ({SXID_GUIDE_URL}), appendix "
        '"NVSwitch SXid errors"; keep the full kernel-log line for a support case.',
        known=False,
    )
