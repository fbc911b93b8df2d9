"""NVML's newer health surface: what NVML says a GPU needs, and the flags of the 2026 drivers.

Each call is guarded by the one error policy (exporters/nvml.py): a driver or GPU without it
leaves its value absent, never an error for the collector. The recovery action is a field value,
read with the GPU's other fields by exporters/gpu.py; the calls here fill versioned structs
(pynvml's ctypes layouts), newest version first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from clusterhealth.exporters.nvml import NvmlSession, error_name, text

# NVML's recovery actions by value, named as NVML names them, lower case ("gpu_reset").
RECOVERY_ACTIONS = {
    getattr(pynvml, name): name.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_GPU_RECOVERY_ACTION_")
}
# The conditions of the GPU fabric health mask (NVLink-switch systems), as (name, shift, width,
# the values that mean trouble). A condition the GPU does not report reads 0 (not supported).
FABRIC_CONDITIONS = (
    (
        "degraded_bandwidth",
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW,
        {pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE},
    ),
    (
        "route_recovery",
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_RECOVERY,
        {pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE},
    ),
    (
        "route_unhealthy",
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY,
        {pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE},
    ),
    (
        "access_timeout_recovery",
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ACCESS_TIMEOUT_RECOVERY,
        {pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE},
    ),
    (
        "incorrect_configuration",
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION,
        # Everything but "not supported" (0) and "none" (1) names a misconfiguration.
        set(range(2, pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION + 1)),
    ),
    (
        "fabric_manager_disconnected",
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE,
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_GFM_STATE,
        {pynvml.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_DISCONNECTED},
    ),
)
FABRIC_UNHEALTHY_SUMMARIES = {
    pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY: "unhealthy",
    pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY: "limited_capacity",
}
# Where the GPU sits in a rack-scale system (nvmlDeviceGetPlatformInfo), labels of gpu_info.
PLATFORM_LABELS = ("chassis_serial", "slot", "tray", "host_id", "module_id")


@dataclass
class NvmlHealth:
    """What the calls said (None: this GPU or driver does not say)."""

    sram_ecc_threshold_exceeded: bool | None = None
    repair_pending: bool | None = None  # a channel or TPC repair waits for a reset
    memory_unrepairable: bool | None = None
    fabric_degraded: bool | None = None
    fabric_problems: tuple[str, ...] = ()  # why fabric_degraded is True
    platform: dict[str, str] | None = None  # PLATFORM_LABELS -> value


def recovery_action(value: int) -> str:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value as NVML names it ("gpu_reset")."""
    return RECOVERY_ACTIONS.get(value, f"unknown_{value}")


def read_health(s: NvmlSession, index: int, handle: Any) -> NvmlHealth:
    """SRAM ECC, memory repair, fabric health and platform info of one GPU. Raises GpuGone."""
    r = NvmlHealth()
    q = s.query
    sram = pynvml.c_nvmlEccSramErrorStatus_v1_t()
    if (
        q(
            index,
            "nvmlDeviceGetSramEccErrorStatus",
            pynvml.nvmlDeviceGetSramEccErrorStatus,
            handle,
            ctypes.byref(sram),
        )
        is not None
    ):
        r.sram_ecc_threshold_exceeded = bool(sram.bThresholdExceeded)
    repair = q(index, "nvmlDeviceGetRepairStatus", pynvml.nvmlDeviceGetRepairStatus, handle)
    if repair is not None:
        r.repair_pending = any(bool(flag) for flag in repair)
    unrepairable = q(
        index, "nvmlDeviceGetUnrepairableMemoryFlag_v1", pynvml.nvmlDeviceGetUnrepairableMemoryFlag_v1, handle
    )
    if unrepairable is not None:
        r.memory_unrepairable = bool(unrepairable)
    fabric = _versioned(
        s,
        index,
        "nvmlDeviceGetGpuFabricInfoV",
        lambda info: pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info)),
        [pynvml.c_nvmlGpuFabricInfo_v3_t, pynvml.c_nvmlGpuFabricInfo_v2_t],
    )
    if fabric is not None:
        r.fabric_degraded, r.fabric_problems = fabric_health(fabric)
    platform = _versioned(
        s,
        index,
        "nvmlDeviceGetPlatformInfo",
        lambda info: pynvml.nvmlDeviceGetPlatformInfo(handle, ctypes.byref(info)),
        [pynvml.c_nvmlPlatformInfo_v2_t, pynvml.c_nvmlPlatformInfo_v1_t],
    )
    if platform is not None:
        r.platform = platform_labels(platform)
    return r


def _versioned(
    s: NvmlSession, index: int, call: str, fn: Callable[[Any], object], structs: Sequence[type]
) -> Any | None:
    """A call that fills a versioned struct, newest version first: a driver that knows only an
    older one answers ArgumentVersionMismatch to the newer."""
    for struct in structs:
        info = struct()
        try:
            fn(info)
        except pynvml.NVMLError as err:
            if err.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH and struct is not structs[-1]:
                continue
            s.failed(index, call, err)
            return None
        return info
    return None


def fabric_health(info: Any) -> tuple[bool | None, tuple[str, ...]]:
    """(degraded, why) from nvmlGpuFabricInfo: None until the GPU's registration with the fabric
    manager has completed; degraded when it failed, when the health summary is not healthy, or when
    a condition of the health mask is in its bad state."""
    if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return None, ()
    problems = []
    if info.status != pynvml.NVML_SUCCESS:
        problems.append(f"registration_failed_{error_name(pynvml.NVMLError(info.status))}")
    mask = info.healthMask
    for name, shift, width, bad in FABRIC_CONDITIONS:
        if ((mask >> shift) & width) in bad:
            problems.append(name)
    summary = FABRIC_UNHEALTHY_SUMMARIES.get(getattr(info, "healthSummary", 0))
    if summary is not None and not problems:
        problems.append(summary)
    return bool(problems), tuple(problems)


def platform_labels(info: Any) -> dict[str, str]:
    """PLATFORM_LABELS of nvmlPlatformInfo: version 2 names the chassis by serial number and the
    slot and tray; version 1 has a rack GUID instead of a serial and calls them the chassis
    physical slot and the compute slot."""
    if isinstance(info, pynvml.c_nvmlPlatformInfo_v2_t):
        chassis, slot, tray, host = info.chassisSerialNumber, info.slotNumber, info.trayIndex, info.hostId
    else:
        chassis, slot, tray, host = b"", info.chassisPhysicalSlotNumber, info.computeSlotIndex, info.nodeIndex
    return {
        "chassis_serial": text(chassis).strip(),
        "slot": str(ord(slot)),
        "tray": str(ord(tray)),
        "host_id": str(ord(host)),
        "module_id": str(ord(info.moduleId)),
    }
