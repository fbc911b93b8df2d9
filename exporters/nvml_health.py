"""NVML's newer health surface: what NVML says a GPU needs, and the flags of the 2026 drivers.

Each call is guarded by the one error policy (exporters/nvml.py): a driver or GPU without it
leaves its value absent, never an error for the collector. The recovery action is a field value,
read with the GPU's other fields by exporters/gpu.py; the calls here fill versioned structs
(pynvml's ctypes layouts), newest version first. An nvidia-ml-py release without a call, struct or
constant leaves what it would read absent as well (exporters/nvml.py `optional`, said once).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from clusterhealth.exporters.nvml import NvmlSession, error_name, optional, text

# NVML's recovery actions by value, named as NVML names them, lower case ("gpu_reset"). The names
# beyond drain_and_reset differ between nvidia-ml-py releases (13.580 calls 5 GPU_RESET_BUS; 13.615
# calls 5 RECOVER_IMEX_DOMAIN and adds BUS_RESET and SYSTEM_REBOOT): the installed one names them.
RECOVERY_ACTIONS = {
    getattr(pynvml, name): name.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_GPU_RECOVERY_ACTION_")
}
# The field that holds it (nvidia-ml-py 12.570 on).
RECOVERY_ACTION_FIELD: int | None = optional("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "the GPU recovery action")

_FABRIC = "conditions of the GPU fabric health mask"


def _condition(
    name: str, shift: str, width: str, bad: Callable[[int], set[int]] | str
) -> tuple[str, int, int, set[int]] | None:
    """One condition of the fabric health mask as (name, shift, width, the values that mean
    trouble), or None where this nvidia-ml-py lacks its constants."""
    found = [optional(f"NVML_GPU_FABRIC_HEALTH_MASK_{n}", _FABRIC) for n in (shift, width)]
    value = optional(f"NVML_GPU_FABRIC_HEALTH_MASK_{bad}", _FABRIC) if isinstance(bad, str) else None
    shift_value, width_value = found
    if shift_value is None or width_value is None:
        return None
    if callable(bad):
        return name, shift_value, width_value, bad(width_value)
    return None if value is None else (name, shift_value, width_value, {value})


# The conditions of the GPU fabric health mask (NVLink-switch systems), as (name, shift, width,
# the values that mean trouble). A condition the GPU does not report reads 0 (not supported); one
# this nvidia-ml-py has no constants for is not read.
FABRIC_CONDITIONS = tuple(
    condition
    for condition in (
        _condition("degraded_bandwidth", "SHIFT_DEGRADED_BW", "WIDTH_DEGRADED_BW", "DEGRADED_BW_TRUE"),
        _condition("route_recovery", "SHIFT_ROUTE_RECOVERY", "WIDTH_ROUTE_RECOVERY", "ROUTE_RECOVERY_TRUE"),
        _condition(
            "route_unhealthy", "SHIFT_ROUTE_UNHEALTHY", "WIDTH_ROUTE_UNHEALTHY", "ROUTE_UNHEALTHY_TRUE"
        ),
        _condition(
            "access_timeout_recovery",
            "SHIFT_ACCESS_TIMEOUT_RECOVERY",
            "WIDTH_ACCESS_TIMEOUT_RECOVERY",
            "ACCESS_TIMEOUT_RECOVERY_TRUE",
        ),
        # Everything but "not supported" (0) and "none" (1) names a misconfiguration.
        _condition(
            "incorrect_configuration",
            "SHIFT_INCORRECT_CONFIGURATION",
            "WIDTH_INCORRECT_CONFIGURATION",
            lambda width: set(range(2, width + 1)),
        ),
        _condition(
            "fabric_manager_disconnected", "SHIFT_GFM_STATE", "WIDTH_GFM_STATE", "GFM_STATE_DISCONNECTED"
        ),
    )
    if condition is not None
)
FABRIC_UNHEALTHY_SUMMARIES = {
    value: name
    for value, name in (
        (optional("NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY", _FABRIC), "unhealthy"),
        (optional("NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY", _FABRIC), "limited_capacity"),
    )
    if value is not None
}
# The calls and their structs, newest version first (a driver that knows only an older one answers
# ArgumentVersionMismatch to the newer). nvidia-ml-py 12.570 and 12.575 call the version-2 fabric
# struct c_nvmlGpuFabricInfoV_t; 12.535 has none of these.
_SRAM_CALL = optional("nvmlDeviceGetSramEccErrorStatus", "the SRAM ECC threshold flag")
_SRAM_STRUCT = optional("c_nvmlEccSramErrorStatus_v1_t", "the SRAM ECC threshold flag")
_REPAIR_CALL = optional("nvmlDeviceGetRepairStatus", "the memory repair status")
_UNREPAIRABLE_CALL = optional("nvmlDeviceGetUnrepairableMemoryFlag_v1", "the unrepairable-memory flag")
_FABRIC_CALL = optional("nvmlDeviceGetGpuFabricInfoV", "the GPU fabric health")
_FABRIC_STRUCTS = [
    struct
    for struct in (
        getattr(pynvml, "c_nvmlGpuFabricInfo_v3_t", None),
        getattr(pynvml, "c_nvmlGpuFabricInfo_v2_t", None) or getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None),
    )
    if struct is not None
]
_PLATFORM_CALL = optional("nvmlDeviceGetPlatformInfo", "the platform labels of gpu_info")
_PLATFORM_V2 = getattr(pynvml, "c_nvmlPlatformInfo_v2_t", None)
_PLATFORM_V1 = getattr(pynvml, "c_nvmlPlatformInfo_v1_t", None)
_PLATFORM_STRUCTS = [struct for struct in (_PLATFORM_V2, _PLATFORM_V1) if struct is not None]
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
    """SRAM ECC, memory repair, fabric health and platform info of one GPU. Raises GpuGone. A
    call this nvidia-ml-py lacks is not made (its value stays None)."""
    r = NvmlHealth()
    q = s.query
    if _SRAM_CALL is not None and _SRAM_STRUCT is not None:
        sram = _SRAM_STRUCT()
        if q(index, "nvmlDeviceGetSramEccErrorStatus", _SRAM_CALL, handle, ctypes.byref(sram)) is not None:
            r.sram_ecc_threshold_exceeded = bool(sram.bThresholdExceeded)
    if _REPAIR_CALL is not None:
        repair = q(index, "nvmlDeviceGetRepairStatus", _REPAIR_CALL, handle)
        if repair is not None:
            r.repair_pending = any(bool(flag) for flag in repair)
    if _UNREPAIRABLE_CALL is not None:
        unrepairable = q(index, "nvmlDeviceGetUnrepairableMemoryFlag_v1", _UNREPAIRABLE_CALL, handle)
        if unrepairable is not None:
            r.memory_unrepairable = bool(unrepairable)
    if _FABRIC_CALL is not None and _FABRIC_STRUCTS:
        fabric = _versioned(
            s,
            index,
            "nvmlDeviceGetGpuFabricInfoV",
            lambda info: _FABRIC_CALL(handle, ctypes.byref(info)),
            _FABRIC_STRUCTS,
        )
        if fabric is not None:
            r.fabric_degraded, r.fabric_problems = fabric_health(fabric)
    if _PLATFORM_CALL is not None and _PLATFORM_STRUCTS:
        platform = _versioned(
            s,
            index,
            "nvmlDeviceGetPlatformInfo",
            lambda info: _PLATFORM_CALL(handle, ctypes.byref(info)),
            _PLATFORM_STRUCTS,
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
    if _PLATFORM_V2 is not None and isinstance(info, _PLATFORM_V2):
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
