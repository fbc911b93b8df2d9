"""GPU state from NVML: read into typed records (units converted once, here), then mapped to metrics.

Reading and exporting are separate: `read_gpu` turns NVML answers into a `GpuReading` whose fields
carry their unit in their name; `GpuCollector.collect` maps readings to metric families. Every NVML
call goes through `NvmlSession` (exporters/nvml.py), which owns the error policy.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clusterhealth.exporters.nvml import (
    Device,
    GpuGone,
    NvmlSession,
    error_name,
    optional,
    say_missing_names_once,
    text,
)
from clusterhealth.exporters.nvml_health import (
    PLATFORM_LABELS,
    RECOVERY_ACTION_FIELD,
    NvmlHealth,
    read_health,
    recovery_action,
)

log = logging.getLogger("clusterhealth.gpu")

# Clock-event (formerly "throttle") reasons, as named in SPEC, with NVML's bit for each.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", pynvml.nvmlClocksEventReasonGpuIdle),
    ("applications_clocks_setting", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
    ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
    ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
    ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
    ("sw_thermal_slowdown", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
    ("hw_thermal_slowdown", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
    ("hw_power_brake_slowdown", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ("display_clock_setting", pynvml.nvmlClocksEventReasonDisplayClockSetting),
)
# NVML's clock-event (throttle) time counters: how long each reason has held the clocks down
# since the driver loaded, in nanoseconds, as (reason, field id). The reasons with a flag of
# their own keep its name; the older perf-policy counters keep theirs. The power-cap and
# sync-boost counters are the perf-policy fields 74 and 76 under their newer names (nvidia-ml-py
# 12.575 on); the three slowdown counters are new with it, and absent before.
_SLOWDOWN_COUNTERS = "the SW/HW thermal and power-brake throttle-time counters"
CLOCK_EVENT_COUNTERS = tuple(
    (reason, field_id)
    for reason, field_id in (
        ("sw_power_cap", pynvml.NVML_FI_DEV_PERF_POLICY_POWER),
        ("sync_boost", pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST),
        (
            "sw_thermal_slowdown",
            optional("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", _SLOWDOWN_COUNTERS),
        ),
        (
            "hw_thermal_slowdown",
            optional("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", _SLOWDOWN_COUNTERS),
        ),
        (
            "hw_power_brake_slowdown",
            optional("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", _SLOWDOWN_COUNTERS),
        ),
        # Drivers before the three slowdown counters count thermal slowdowns here, SW and HW together.
        ("thermal", pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL),
        ("board_limit", pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT),
        ("low_utilization", pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION),
        ("reliability", pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY),
    )
    if field_id is not None
)
# The throttle-time reasons exported by default: what explains a slow GPU (heat, the power brake;
# thermal on drivers without the split counters). The others (the power cap, which is how a busy
# GPU runs at its limit rather than a fault, and its sampled flag says when; sync boost, board
# limit, low utilization, reliability) are read too, and exported with
# `collectors.gpu.clocks_event_counters`.
CLOCK_EVENT_COUNTERS_DEFAULT = (
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "thermal",
)
# The sampled clock-event flags: every reason of SPEC by default (`clocks_event_reasons` narrows).
CLOCK_EVENT_REASONS_DEFAULT = ("*",)
NVLINK_ERRORS = (
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)
ECC_KINDS = (
    ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
)
ECC_SCOPES = (("volatile", pynvml.NVML_VOLATILE_ECC), ("aggregate", pynvml.NVML_AGGREGATE_ECC))
MHZ = 1e6
PERCENT = 1e-2
MIB = float(1 << 20)

# GPM metrics over one sampling interval, as (GpuReading field, NVML metric id, factor to base
# units): GPM reports activity in percent and bandwidth in MiB/s.
GPM_METRICS = (
    ("sm_active_ratio", pynvml.NVML_GPM_METRIC_SM_UTIL, PERCENT),
    ("sm_occupancy_ratio", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, PERCENT),
    ("tensor_active_ratio", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, PERCENT),
    ("dram_active_ratio", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, PERCENT),
    ("fp16_active_ratio", pynvml.NVML_GPM_METRIC_FP16_UTIL, PERCENT),
    ("fp32_active_ratio", pynvml.NVML_GPM_METRIC_FP32_UTIL, PERCENT),
    ("fp64_active_ratio", pynvml.NVML_GPM_METRIC_FP64_UTIL, PERCENT),
    ("pcie_received_bytes_per_second", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, MIB),
    ("pcie_transmitted_bytes_per_second", pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, MIB),
    ("nvlink_received_bytes_per_second", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, MIB),
    ("nvlink_transmitted_bytes_per_second", pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, MIB),
)
# The names pynvml gives the metric ids, for the `call` label of an error on one metric.
GPM_METRIC_NAMES = {
    getattr(pynvml, name): name
    for name in dir(pynvml)
    if name.startswith("NVML_GPM_METRIC_") and name != "NVML_GPM_METRIC_MAX"
}


@dataclass
class NvlinkReading:
    link: int
    up: bool
    errors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (GPU instance) of a GPU in MIG mode: how pod-resources and the mapping files name it."""

    uuid: str  # MIG-<uuid>
    gpu_instance_id: int | None


@dataclass
class GpuReading:
    """One GPU at one instant. None means NVML could not tell; the series is then absent."""

    index: int
    uuid: str
    up: bool
    down_reason: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    # GPM, averaged over the interval between two samples (None: no GPM on this GPU).
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    fp16_active_ratio: float | None = None
    fp32_active_ratio: float | None = None
    fp64_active_ratio: float | None = None
    pcie_received_bytes_per_second: float | None = None
    pcie_transmitted_bytes_per_second: float | None = None
    nvlink_received_bytes_per_second: float | None = None
    nvlink_transmitted_bytes_per_second: float | None = None
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    sm_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clocks_event_reasons: int | None = None  # NVML bitmask
    clocks_event_seconds: dict[str, float] = field(default_factory=dict)  # reason -> seconds held
    performance_state: int | None = None
    temperature_gpu_celsius: float | None = None
    temperature_memory_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    ecc_errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (error, scope) -> count
    remapped_rows: dict[str, int] = field(default_factory=dict)  # cause -> rows
    row_remap_pending: bool | None = None
    row_remap_failed: bool | None = None
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_replay_errors: int | None = None
    nvlinks: list[NvlinkReading] = field(default_factory=list)
    # Who runs on the GPU, for job attribution (exporters/jobs/): the minor number of its device
    # file (/dev/nvidiaN, how Slurm and GKE number GPUs), the pids of its compute processes
    # (None: unreadable) and its MIG devices.
    minor_number: int | None = None
    compute_pids: tuple[int, ...] | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    nvlink_speed_bytes_per_second: float | None = None  # one active link, one direction
    # What NVML says to do (None: the driver does not say), and its newer health flags.
    recovery_action: str | None = None  # "none", "gpu_reset", ... (exporters/nvml_health.py)
    health: NvmlHealth = field(default_factory=NvmlHealth)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def read_gpu(s: NvmlSession, index: int, handle: Any, uuid: str) -> GpuReading:
    """Everything but GPM (which needs two samples) about one GPU. Raises GpuGone."""
    q = s.query
    r = GpuReading(index=index, uuid=uuid, up=True)
    r.name = text(q(index, "nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
    pci = q(index, "nvmlDeviceGetPciInfo_v3", pynvml.nvmlDeviceGetPciInfo_v3, handle)
    r.pci_bus_id = text(pci.busId) if pci is not None else None
    r.serial = text(q(index, "nvmlDeviceGetSerial", pynvml.nvmlDeviceGetSerial, handle))
    r.vbios_version = text(q(index, "nvmlDeviceGetVbiosVersion", pynvml.nvmlDeviceGetVbiosVersion, handle))

    util = q(index, "nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, handle)
    r.utilization_ratio = util.gpu / 100 if util is not None else None
    mem = q(index, "nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
    if mem is not None:
        r.memory_used_bytes, r.memory_total_bytes = int(mem.used), int(mem.total)

    clock = pynvml.nvmlDeviceGetClockInfo
    r.sm_clock_hertz = _scaled(q(index, "nvmlDeviceGetClockInfo", clock, handle, pynvml.NVML_CLOCK_SM), MHZ)
    r.memory_clock_hertz = _scaled(
        q(index, "nvmlDeviceGetClockInfo", clock, handle, pynvml.NVML_CLOCK_MEM), MHZ
    )
    max_clock = pynvml.nvmlDeviceGetMaxClockInfo
    r.sm_clock_max_hertz = _scaled(
        q(index, "nvmlDeviceGetMaxClockInfo", max_clock, handle, pynvml.NVML_CLOCK_SM), MHZ
    )
    r.clocks_event_reasons = s.query_first(
        index,
        [
            ("nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons),
            # Drivers before R535 only know the older name of the same bitmask.
            ("nvmlDeviceGetCurrentClocksThrottleReasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons),
        ],
        handle,
    )
    pstate = q(index, "nvmlDeviceGetPerformanceState", pynvml.nvmlDeviceGetPerformanceState, handle)
    r.performance_state = pstate if pstate is not None and 0 <= pstate <= 15 else None

    r.temperature_gpu_celsius = q(
        index,
        "nvmlDeviceGetTemperature",
        pynvml.nvmlDeviceGetTemperature,
        handle,
        pynvml.NVML_TEMPERATURE_GPU,
    )
    fields = _field_values(s, index, handle)
    memory_temperature = fields.get(pynvml.NVML_FI_DEV_MEMORY_TEMP)
    r.temperature_memory_celsius = memory_temperature.value if memory_temperature else None
    speed = fields.get(pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)
    r.nvlink_speed_bytes_per_second = speed.value * 1e6 if speed else None
    r.clocks_event_seconds = clock_event_seconds(fields)
    action = fields.get(RECOVERY_ACTION_FIELD) if RECOVERY_ACTION_FIELD is not None else None
    if action is not None:
        r.recovery_action = recovery_action(int(action.value))
    r.health = read_health(s, index, handle)
    r.power_watts = _scaled(q(index, "nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, handle), 1e-3)
    r.power_limit_watts = _scaled(
        q(index, "nvmlDeviceGetEnforcedPowerLimit", pynvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1e-3
    )
    r.energy_joules = _scaled(
        q(index, "nvmlDeviceGetTotalEnergyConsumption", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle),
        1e-3,
    )

    for kind, kind_id in ECC_KINDS:
        for scope, scope_id in ECC_SCOPES:
            count = q(
                index,
                "nvmlDeviceGetTotalEccErrors",
                pynvml.nvmlDeviceGetTotalEccErrors,
                handle,
                kind_id,
                scope_id,
            )
            if count is not None:
                r.ecc_errors[(kind, scope)] = int(count)
    remap = q(index, "nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, handle)
    if remap is not None:
        correctable, uncorrectable, pending, failed = remap
        r.remapped_rows = {"correctable": int(correctable), "uncorrectable": int(uncorrectable)}
        r.row_remap_pending, r.row_remap_failed = bool(pending), bool(failed)

    r.pcie_link_generation = q(
        index, "nvmlDeviceGetCurrPcieLinkGeneration", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle
    )
    r.pcie_link_generation_max = q(
        index, "nvmlDeviceGetMaxPcieLinkGeneration", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle
    )
    r.pcie_link_width = q(
        index, "nvmlDeviceGetCurrPcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle
    )
    r.pcie_link_width_max = q(
        index, "nvmlDeviceGetMaxPcieLinkWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle
    )
    r.pcie_replay_errors = q(
        index, "nvmlDeviceGetPcieReplayCounter", pynvml.nvmlDeviceGetPcieReplayCounter, handle
    )
    r.nvlinks = _read_nvlinks(s, index, handle)
    r.minor_number = q(index, "nvmlDeviceGetMinorNumber", pynvml.nvmlDeviceGetMinorNumber, handle)
    processes = q(
        index,
        "nvmlDeviceGetComputeRunningProcesses",
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        handle,
    )
    r.compute_pids = tuple(sorted({int(p.pid) for p in processes})) if processes is not None else None
    r.mig_devices = _read_mig_devices(s, index, handle)
    return r


def _read_mig_devices(s: NvmlSession, index: int, handle: Any) -> tuple[MigDevice, ...]:
    """The MIG devices of a GPU in MIG mode; none for a GPU without MIG or with MIG off."""
    mode = s.query(index, "nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle)
    if mode is None or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        return ()
    slots = s.query(index, "nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
    found = []
    for slot in range(slots or 0):
        # An empty slot answers NotFound, which the policy reads as absent.
        mig = s.query(
            index,
            "nvmlDeviceGetMigDeviceHandleByIndex",
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex,
            handle,
            slot,
        )
        if mig is None:
            continue
        uuid = text(s.query(index, "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig))
        instance = s.query(index, "nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig)
        if uuid:
            found.append(MigDevice(uuid, instance))
    return tuple(found)


# The field values read for each GPU, in one nvmlDeviceGetFieldValues call, by the name NVML gives
# them (the `call` label of an error on one field).
FIELDS: dict[int, str] = {}
for _names in (
    ("NVML_FI_DEV_MEMORY_TEMP",),
    ("NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON",),
    # The newest name of the field where this nvidia-ml-py has it (the ids stay the same).
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", "NVML_FI_DEV_PERF_POLICY_POWER"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",),
    ("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",),
    ("NVML_FI_DEV_PERF_POLICY_THERMAL",),
    ("NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT",),
    ("NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION",),
    ("NVML_FI_DEV_PERF_POLICY_RELIABILITY",),
    ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",),
):
    _name = next((n for n in _names if hasattr(pynvml, n)), None)
    if _name is not None:  # else left out, and said once (exporters/nvml.py `optional`)
        FIELDS[getattr(pynvml, _name)] = _name
_VALUE_MEMBERS = {
    value_type: member
    for value_type, member in (
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal"),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal"),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal"),
        # nvidia-ml-py 12.535 has neither the name nor the union member; no field read here has it.
        (getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", None), "usVal"),
    )
    if value_type is not None
}


@dataclass(frozen=True)
class FieldValue:
    value_type: int  # NVML_VALUE_TYPE_*
    value: float


def _field_values(s: NvmlSession, index: int, handle: Any) -> dict[int, FieldValue]:
    """Every field of FIELDS the driver answers. A field it does not have is absent; any other
    answer for one field goes through the error policy as a call of its own would."""
    ids = list(FIELDS)
    values = s.query(index, "nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, handle, ids)
    if values is None:
        return {}
    out: dict[int, FieldValue] = {}
    for field_id, v in zip(ids, values, strict=True):
        if v.nvmlReturn != pynvml.NVML_SUCCESS:
            s.failed(index, f"nvmlDeviceGetFieldValues({FIELDS[field_id]})", pynvml.NVMLError(v.nvmlReturn))
            continue
        value = _decoded(v)
        if value is not None:
            out[field_id] = FieldValue(v.valueType, value)
    return out


def _decoded(answer: Any) -> float | None:
    """A field value's number, from the union member its type names; None for a type we do not read."""
    member = _VALUE_MEMBERS.get(answer.valueType)
    if member is None or not hasattr(answer.value, member):
        return None
    return float(getattr(answer.value, member))


def recovery_action_of_a_gpu_waiting_for_reset(handle: Any) -> str | None:
    """NVML's recovery action for a GPU that answers ResetRequired: the field says what to do about
    just that state, so it is asked for alone even then. None when NVML does not answer it (then
    the GPU is only down); the GPU's other answers are already known to be errors, so none of this
    one's is counted."""
    if RECOVERY_ACTION_FIELD is None or handle is None:
        return None
    try:
        (answer,) = pynvml.nvmlDeviceGetFieldValues(handle, [RECOVERY_ACTION_FIELD])
    except pynvml.NVMLError:
        return None
    value = _decoded(answer) if answer.nvmlReturn == pynvml.NVML_SUCCESS else None
    return None if value is None else recovery_action(int(value))


def clock_event_seconds(fields: dict[int, FieldValue]) -> dict[str, float]:
    """The throttle-time counters in seconds. A nanosecond counter is 64 bits wide: an answer of
    another type at one of these ids is another field (NVML renumbered the three slowdown counters
    between releases), and is left out."""
    seconds = {
        reason: fields[field_id].value * 1e-9
        for reason, field_id in CLOCK_EVENT_COUNTERS
        if field_id in fields and fields[field_id].value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    }
    # Where the SW and HW thermal counters exist, the older one counts the same time again.
    if "sw_thermal_slowdown" in seconds or "hw_thermal_slowdown" in seconds:
        seconds.pop("thermal", None)
    return seconds


def _read_nvlinks(s: NvmlSession, index: int, handle: Any) -> list[NvlinkReading]:
    links = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as err:
            # Past the GPU's last link NVML answers InvalidArgument; a GPU without NVLink NotSupported.
            if err.value in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED):
                break
            s.failed(index, "nvmlDeviceGetNvLinkState", err)
            continue
        reading = NvlinkReading(link=link, up=active == pynvml.NVML_FEATURE_ENABLED)
        for name, counter in NVLINK_ERRORS:
            value = s.query(
                index,
                "nvmlDeviceGetNvLinkErrorCounter",
                pynvml.nvmlDeviceGetNvLinkErrorCounter,
                handle,
                link,
                counter,
            )
            if value is not None:
                reading.errors[name] = int(value)
        links.append(reading)
    return links


@dataclass(frozen=True)
class GpuState:
    """Every GPU as one cycle of the gpu collector read it: what the audits judge."""

    readings: Sequence[GpuReading]
    driver_version: str | None


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    pci_bus_id: str | None


class GpuDirectory:
    """Who each GPU is (NVML index, UUID, PCI bus id), as last learned from NVML.

    Kept when a GPU stops answering, so a GPU that fell off the bus keeps its uuid label and the
    kernel log's lines about it are still matched to it. The gpu collector writes it; the Xid and
    kernel-log collectors read it and never ask NVML themselves, so a hung NVML call cannot stop
    them from counting an Xid 79.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_index: dict[int, GpuIdentity] = {}
        self._never_answered: set[int] = set()

    def learn(self, readings: Iterable[GpuReading]) -> None:
        with self._lock:
            for r in readings:
                if not r.up:
                    # A lost GPU tells nothing; what it told before stays.
                    if r.index not in self._by_index:
                        self._never_answered.add(r.index)
                    continue
                self._never_answered.discard(r.index)
                known = self._by_index.get(r.index)
                bus = r.pci_bus_id or (known.pci_bus_id if known and known.uuid == r.uuid else None)
                self._by_index[r.index] = GpuIdentity(r.index, r.uuid, bus)

    def uuid(self, index: int) -> str:
        with self._lock:
            known = self._by_index.get(index)
        return known.uuid if known else ""

    def count(self) -> int:
        """How many GPUs have ever answered: a GPU that vanishes from NVML's count is still reported."""
        with self._lock:
            return max(self._by_index, default=-1) + 1

    def bus_ids(self) -> dict[str, int]:
        """NVML's PCI bus id -> GPU index."""
        with self._lock:
            return {i.pci_bus_id: i.index for i in self._by_index.values() if i.pci_bus_id}

    def never_answered(self) -> set[int]:
        """The indices of GPUs NVML counts but that were down every time they were read: lost
        before the agent started, so neither their UUID nor their bus id is known."""
        with self._lock:
            return set(self._never_answered)


# What the collector hands its readers after each cycle: the whole state, or None and why not.
Publish = Callable[[GpuState | None, str | None], None]


@dataclass
class _GpmSample:
    uuid: str
    sample: Any


class GpuCollector:
    """The `gpu` collector: every GPU metric of SPEC, one GPU's failure never hiding the others.

    At the end of each cycle the whole `GpuState` is published (never a half-read one, and the
    previous one stays current while a cycle runs); None is published, with the reason, only when
    NVML cannot be used.
    """

    name = "gpu"
    # Off unless a config asks: the per-link NVLink detail (per-GPU totals are exported instead),
    # and the SRAM ECC threshold flag (the audit's gpu_ecc_uncorrectable turns CRITICAL on it).
    opt_in = frozenset(
        {
            "clusterhealth_gpu_nvlink_up",
            "clusterhealth_gpu_nvlink_link_errors_total",
            "clusterhealth_gpu_sram_ecc_threshold_exceeded",
        }
    )

    def __init__(
        self,
        session: NvmlSession,
        directory: GpuDirectory,
        publish: Publish = lambda state, reason: None,
        *,
        gpm: bool = True,
        gpm_min_window_seconds: float = 1.0,
        on_cycle: Callable[[], object] | None = None,
        clocks_event_counters: Sequence[str] = ("*",),
        clocks_event_reasons: Sequence[str] = ("*",),
    ):
        self.session, self.directory, self._publish = session, directory, publish
        # Run at the end of each successful cycle, on this thread (one-shot commands drain the
        # NVML Xid events already waiting here, where NVML is known to answer).
        self._on_cycle = on_cycle
        self.gpm, self.gpm_min_window_seconds = gpm, gpm_min_window_seconds
        # The throttle-time reasons exported (glob patterns; the rest are read and left out).
        self.clocks_event_counters = tuple(clocks_event_counters)
        # The sampled flags exported (glob patterns), likewise.
        self.clocks_event_reasons = tuple(clocks_event_reasons)
        self._down: dict[int, str] = {}
        self._fabric_problems: dict[int, tuple[str, ...]] = {}
        self._gpm_support: dict[str, bool] = {}
        self._gpm_previous: dict[int, _GpmSample] = {}

    def collect(self) -> list[Metric]:
        try:
            state, cuda = self._read_all()
        except Exception as err:
            self._publish(None, f"NVML could not be read ({err})")
            raise
        self._publish(state, None)
        if self._on_cycle is not None:
            self._on_cycle()
        return self._families(state.readings, state.driver_version, cuda)

    def _read_all(self) -> tuple[GpuState, int | None]:
        s = self.session
        devices = s.devices(expected=self.directory.count())
        say_missing_names_once(log)
        driver = text(s.system("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
        cuda = s.system("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2)
        handles: dict[int, Any] = {}
        readings = [self._read(device, handles) for device in devices]
        if self.gpm:
            self._read_gpm(readings, handles)
        self.directory.learn(readings)
        for message in s.take_new_errors():
            log.warning("%s", message)
        return GpuState(readings, driver), cuda

    def close(self) -> None:
        for previous in self._gpm_previous.values():
            self.session.query(-1, "nvmlGpmSampleFree", pynvml.nvmlGpmSampleFree, previous.sample)
        self._gpm_previous.clear()

    def _read(self, device: Device, handles: dict[int, Any]) -> GpuReading:
        s, index = self.session, device.index
        try:
            if device.gone is not None:
                raise device.gone
            handle = device.handle
            uuid = text(s.require(index, "nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle)) or ""
            reading = read_gpu(s, index, handle, uuid)
            handles[index] = handle
        except GpuGone as gone:
            down = GpuReading(index=index, uuid=self.directory.uuid(index), up=False)
            self._mark_down(down, gone, device.handle)
            return down
        if index in self._down:
            log.info("GPU %d (%s) answers NVML again", index, uuid)
            del self._down[index]
        # The gauge says the fabric is degraded; the log says how, once per change.
        problems = reading.health.fabric_problems
        if problems != self._fabric_problems.get(index, ()):
            if problems:
                log.warning("GPU %d (%s): NVLink fabric degraded: %s", index, uuid, ", ".join(problems))
            self._fabric_problems[index] = problems
        return reading

    def _gpm_supported(self, reading: GpuReading, handle: Any) -> bool:
        """Whether the GPU has GPM; the first time it has none, the log says why, once."""
        if reading.uuid not in self._gpm_support:
            try:
                support = pynvml.nvmlGpmQueryDeviceSupport(handle)
            except pynvml.NVMLError as err:
                # Applies the policy: a lost GPU or an unusable library raises from here.
                self.session.failed(reading.index, "nvmlGpmQueryDeviceSupport", err)
                why = f"nvmlGpmQueryDeviceSupport answered {error_name(err)}"
                if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    why = "the driver has no GPM (before R520)"
                supported = False
            else:
                supported = bool(support.isSupportedDevice)
                why = "the GPU has no GPM (GPUs before Hopper)"
            self._gpm_support[reading.uuid] = supported
            if not supported:
                log.info(
                    "GPU %d (%s): %s, so its SM, tensor, FP, DRAM, PCIe and NVLink activity are not exported",
                    reading.index,
                    reading.uuid,
                    why,
                )
        return self._gpm_support[reading.uuid]

    def _sample(self, reading: GpuReading, handle: Any) -> Any:
        s = self.session
        sample = s.query(reading.index, "nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        if s.query(reading.index, "nvmlGpmSampleGet", pynvml.nvmlGpmSampleGet, handle, sample) is None:
            s.query(reading.index, "nvmlGpmSampleFree", pynvml.nvmlGpmSampleFree, sample)
            return None
        return sample

    def _read_gpm(self, readings: Sequence[GpuReading], handles: dict[int, Any]) -> None:
        """GPM metrics (SM, tensor and FP pipes, DRAM, PCIe, NVLink) between the previous cycle's
        GPM sample and a new one.

        Over a whole interval the figures are averages of what the GPU did, not a glimpse. On the
        first cycle (or for a GPU that came back) there is no earlier sample, so one is taken and
        the collector waits `gpm_min_window_seconds` once for all such GPUs.
        """
        due: list[GpuReading] = []
        fresh = False
        for r in readings:
            if not r.up:
                continue
            handle = handles[r.index]
            try:
                if not self._gpm_supported(r, handle):
                    continue
                previous = self._gpm_previous.get(r.index)
                if previous is None or previous.uuid != r.uuid:
                    sample = self._sample(r, handle)
                    if sample is None:
                        continue
                    self._gpm_previous[r.index] = _GpmSample(r.uuid, sample)
                    fresh = True
                due.append(r)
            except GpuGone as gone:
                self._mark_down(r, gone, handles[r.index])
        if fresh:
            time.sleep(self.gpm_min_window_seconds)
        for r in due:
            try:
                self._gpm_metrics(r, handles[r.index])
            except GpuGone as gone:
                self._mark_down(r, gone, handles[r.index])

    def _gpm_metrics(self, r: GpuReading, handle: Any) -> None:
        s = self.session
        previous = self._gpm_previous[r.index]
        current = self._sample(r, handle)
        if current is None:
            return
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = previous.sample, current
        for i, (_, metric_id, _) in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        result = s.query(r.index, "nvmlGpmMetricsGet", pynvml.nvmlGpmMetricsGet, request)
        s.query(r.index, "nvmlGpmSampleFree", pynvml.nvmlGpmSampleFree, previous.sample)
        self._gpm_previous[r.index] = _GpmSample(r.uuid, current)
        if result is None:
            return
        for i, (attr, metric_id, factor) in enumerate(GPM_METRICS):
            metric = result.metrics[i]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                setattr(r, attr, metric.value * factor)
            else:
                # One metric the GPU lacks (NVLink on a PCIe card) is absent; the policy decides
                # about any other answer, as for a call of its own.
                name = GPM_METRIC_NAMES.get(metric_id, str(metric_id))
                s.failed(r.index, f"nvmlGpmMetricsGet({name})", pynvml.NVMLError(metric.nvmlReturn))

    def _counts(self, reason: str) -> bool:
        return any(fnmatch.fnmatchcase(reason, pattern) for pattern in self.clocks_event_counters)

    def _flags(self, reason: str) -> bool:
        return any(fnmatch.fnmatchcase(reason, pattern) for pattern in self.clocks_event_reasons)

    def _mark_down(self, r: GpuReading, gone: GpuGone, handle: Any) -> None:
        """A GPU that does not answer (before its reading, or after it was taken): what it said is
        dropped, except what NVML says to do about a GPU waiting for a reset; logged once a change."""
        reason = f"{gone.call}: {gone.error}"
        action = recovery_action_of_a_gpu_waiting_for_reset(handle) if gone.error == "ResetRequired" else None
        if action is not None:
            reason += f" (NVML's recovery action: {action})"
        if self._down.get(r.index) != reason:
            log.error("GPU %d (%s) is down: %s", r.index, r.uuid or "uuid unknown", reason)
        self._down[r.index] = reason
        self._gpm_previous.pop(r.index, None)
        r.up, r.down_reason, r.recovery_action = False, reason, action

    # -- mapping to metrics ------------------------------------------------------------------

    def _families(self, readings: Sequence[GpuReading], driver: str | None, cuda: int | None) -> list[Metric]:
        f = _FamilyBuilder(["gpu", "uuid"])
        up = f.gauge("clusterhealth_gpu_up", "1 if the GPU answered NVML, 0 if it is lost or failing.")
        info = f.gauge(
            "clusterhealth_gpu_info",
            "GPU identity and, on rack-scale systems, where it sits; value 1.",
            ["name", "pci_bus_id", "serial", "vbios_version", *PLATFORM_LABELS],
        )
        for r in readings:
            base = [str(r.index), r.uuid]
            up.add_metric(base, 1.0 if r.up else 0.0)
            if not r.up:
                continue
            platform = r.health.platform or {}
            info.add_metric(
                [
                    *base,
                    r.name or "",
                    r.pci_bus_id or "",
                    r.serial or "",
                    r.vbios_version or "",
                    *(platform.get(label, "") for label in PLATFORM_LABELS),
                ],
                1.0,
            )
        simple = (
            (
                "clusterhealth_gpu_sm_active_ratio",
                "sm_active_ratio",
                "Fraction of time at least one warp was active on an SM, averaged over SMs (GPM).",
            ),
            (
                "clusterhealth_gpu_sm_occupancy_ratio",
                "sm_occupancy_ratio",
                "Resident warps over the SMs' maximum (GPM).",
            ),
            (
                "clusterhealth_gpu_tensor_active_ratio",
                "tensor_active_ratio",
                "Fraction of time the SMs ran any tensor-core instruction (GPM).",
            ),
            (
                "clusterhealth_gpu_dram_active_ratio",
                "dram_active_ratio",
                "DRAM bandwidth used over its theoretical maximum (GPM).",
            ),
            (
                "clusterhealth_gpu_fp16_active_ratio",
                "fp16_active_ratio",
                "Fraction of time the SMs ran non-tensor FP16 math (GPM).",
            ),
            (
                "clusterhealth_gpu_fp32_active_ratio",
                "fp32_active_ratio",
                "Fraction of time the SMs ran non-tensor FP32 math (GPM).",
            ),
            (
                "clusterhealth_gpu_fp64_active_ratio",
                "fp64_active_ratio",
                "Fraction of time the SMs ran non-tensor FP64 math (GPM).",
            ),
            (
                "clusterhealth_gpu_pcie_received_bytes_per_second",
                "pcie_received_bytes_per_second",
                "PCIe traffic into the GPU (GPM).",
            ),
            (
                "clusterhealth_gpu_pcie_transmitted_bytes_per_second",
                "pcie_transmitted_bytes_per_second",
                "PCIe traffic out of the GPU (GPM).",
            ),
            (
                "clusterhealth_gpu_nvlink_received_bytes_per_second",
                "nvlink_received_bytes_per_second",
                "NVLink traffic into the GPU, all links (GPM).",
            ),
            (
                "clusterhealth_gpu_nvlink_transmitted_bytes_per_second",
                "nvlink_transmitted_bytes_per_second",
                "NVLink traffic out of the GPU, all links (GPM).",
            ),
            (
                "clusterhealth_gpu_utilization_ratio",
                "utilization_ratio",
                "Fraction of the sample period a kernel ran (NVML utilization; 1 while busy-waiting).",
            ),
            ("clusterhealth_gpu_memory_used_bytes", "memory_used_bytes", "Frame-buffer memory in use."),
            ("clusterhealth_gpu_memory_total_bytes", "memory_total_bytes", "Frame-buffer memory installed."),
            ("clusterhealth_gpu_sm_clock_hertz", "sm_clock_hertz", "Current SM clock."),
            ("clusterhealth_gpu_sm_clock_max_hertz", "sm_clock_max_hertz", "Maximum SM clock."),
            ("clusterhealth_gpu_memory_clock_hertz", "memory_clock_hertz", "Current memory clock."),
            (
                "clusterhealth_gpu_performance_state",
                "performance_state",
                "Performance state: 0 for P0 (maximum) to 15 for P15.",
            ),
            ("clusterhealth_gpu_power_watts", "power_watts", "Power draw."),
            ("clusterhealth_gpu_power_limit_watts", "power_limit_watts", "Enforced power limit."),
            (
                "clusterhealth_gpu_pcie_link_generation",
                "pcie_link_generation",
                "Current PCIe link generation (drops while idle on power-saving links).",
            ),
            (
                "clusterhealth_gpu_pcie_link_generation_max",
                "pcie_link_generation_max",
                "Maximum PCIe link generation of the GPU and system.",
            ),
            ("clusterhealth_gpu_pcie_link_width", "pcie_link_width", "Current PCIe link width in lanes."),
            (
                "clusterhealth_gpu_pcie_link_width_max",
                "pcie_link_width_max",
                "Maximum PCIe link width in lanes.",
            ),
        )
        for name, attr, doc in simple:
            fam = f.gauge(name, doc)
            for r in readings:
                value = getattr(r, attr)
                if r.up and value is not None:
                    fam.add_metric([str(r.index), r.uuid], float(value))
        energy = f.counter(
            "clusterhealth_gpu_energy_joules_total", "Energy consumed since the driver was loaded."
        )
        replays = f.counter(
            "clusterhealth_gpu_pcie_replay_errors_total", "PCIe replays (link-level retransmissions)."
        )
        reasons = f.gauge(
            "clusterhealth_gpu_clocks_event_active",
            "1 while the clock-event (throttle) reason holds the clocks down.",
            ["reason"],
        )
        held = f.counter(
            "clusterhealth_gpu_clocks_event_seconds_total",
            "Time the clock-event (throttle) reason held the clocks down since the driver loaded.",
            ["reason"],
        )
        temperature = f.gauge("clusterhealth_gpu_temperature_celsius", "Temperature by sensor.", ["sensor"])
        ecc = f.counter("clusterhealth_gpu_ecc_errors_total", "ECC errors.", ["error", "scope"])
        remapped = f.gauge("clusterhealth_gpu_remapped_rows", "Rows remapped, by cause.", ["cause"])
        pending = f.gauge(
            "clusterhealth_gpu_row_remap_pending", "1 when a GPU reset is needed to apply a row remap."
        )
        failed = f.gauge(
            "clusterhealth_gpu_row_remap_failed", "1 when a row remap failed: the GPU needs replacing."
        )
        recovery = f.gauge(
            "clusterhealth_gpu_recovery_action",
            "What NVML says the GPU needs before it is used again (none, gpu_reset, node_reboot, ...); 1.",
            ["action"],
        )
        flags = (
            (
                f.gauge(
                    "clusterhealth_gpu_sram_ecc_threshold_exceeded",
                    "1 when the GPU's SRAM uncorrectable ECC errors passed NVIDIA's threshold (its RMA "
                    "criterion).",
                ),
                "sram_ecc_threshold_exceeded",
            ),
            (
                f.gauge(
                    "clusterhealth_gpu_repair_pending",
                    "1 when a memory channel or TPC repair waits for a GPU reset.",
                ),
                "repair_pending",
            ),
            (
                f.gauge(
                    "clusterhealth_gpu_memory_unrepairable",
                    "1 when NVML flags the GPU's memory unrepairable (no spare left for a repair).",
                ),
                "memory_unrepairable",
            ),
            (
                f.gauge(
                    "clusterhealth_gpu_fabric_degraded",
                    "1 when the GPU's NVLink fabric (NVSwitch systems) is degraded by its health mask or "
                    "summary, or its registration failed.",
                ),
                "fabric_degraded",
            ),
        )
        links_down = f.gauge("clusterhealth_gpu_nvlink_links_down", "NVLinks of the GPU that are not active.")
        nvlink_rate = f.gauge(
            "clusterhealth_gpu_nvlink_rate_bytes_per_second",
            "The GPU's NVLink rate in one direction: one active link's speed times the links up.",
        )
        nvlink_errors = f.counter(
            "clusterhealth_gpu_nvlink_errors_total",
            "NVLink data-link errors, summed over the GPU's links.",
            ["error"],
        )
        # Per-link detail, opt-in (GpuCollector.opt_in).
        nvlink_up = f.gauge("clusterhealth_gpu_nvlink_up", "1 if the NVLink link is active.", ["link"])
        link_errors = f.counter(
            "clusterhealth_gpu_nvlink_link_errors_total",
            "NVLink data-link errors of one link.",
            ["link", "error"],
        )
        for r in readings:
            base = [str(r.index), r.uuid]
            if r.recovery_action is not None:
                # Also for a GPU that is down waiting for a reset: that is when it matters.
                recovery.add_metric([*base, r.recovery_action], 1.0)
            if not r.up:
                continue
            if r.energy_joules is not None:
                energy.add_metric(base, r.energy_joules)
            if r.pcie_replay_errors is not None:
                replays.add_metric(base, float(r.pcie_replay_errors))
            if r.clocks_event_reasons is not None:
                for reason, bit in CLOCK_EVENT_REASONS:
                    if self._flags(reason):
                        reasons.add_metric([*base, reason], 1.0 if r.clocks_event_reasons & bit else 0.0)
            for reason, seconds in r.clocks_event_seconds.items():
                if self._counts(reason):
                    held.add_metric([*base, reason], seconds)
            for sensor, value in (
                ("gpu", r.temperature_gpu_celsius),
                ("memory", r.temperature_memory_celsius),
            ):
                if value is not None:
                    temperature.add_metric([*base, sensor], float(value))
            for (kind, scope), count in r.ecc_errors.items():
                ecc.add_metric([*base, kind, scope], float(count))
            for cause, rows in r.remapped_rows.items():
                remapped.add_metric([*base, cause], float(rows))
            if r.row_remap_pending is not None:
                pending.add_metric(base, float(r.row_remap_pending))
            if r.row_remap_failed is not None:
                failed.add_metric(base, float(r.row_remap_failed))
            for family, attr in flags:
                flag = getattr(r.health, attr)
                if flag is not None:
                    family.add_metric(base, float(flag))
            if r.nvlinks:
                up_links = sum(1 for link in r.nvlinks if link.up)
                links_down.add_metric(base, float(len(r.nvlinks) - up_links))
                if r.nvlink_speed_bytes_per_second is not None:
                    nvlink_rate.add_metric(base, r.nvlink_speed_bytes_per_second * up_links)
            summed: dict[str, int] = {}
            for link in r.nvlinks:
                nvlink_up.add_metric([*base, str(link.link)], 1.0 if link.up else 0.0)
                for error, count in link.errors.items():
                    link_errors.add_metric([*base, str(link.link), error], float(count))
                    summed[error] = summed.get(error, 0) + count
            for error, count in summed.items():
                nvlink_errors.add_metric([*base, error], float(count))

        errors = f.counter(
            "clusterhealth_gpu_nvml_errors_total",
            "NVML calls that failed with an unexpected error (the series they feed are absent).",
            ["call", "error"],
        )
        for (gpu, call, error), count in sorted(self.session.call_errors.items()):
            gpu_label = str(gpu) if gpu >= 0 else ""
            uuid = self.directory.uuid(gpu) if gpu >= 0 else ""
            errors.add_metric([gpu_label, uuid, call, error], float(count))

        driver_info = GaugeMetricFamily(
            "clusterhealth_gpu_driver_info",
            "NVIDIA driver and the CUDA version it supports, value 1.",
            labels=["driver_version", "cuda_driver_version"],
        )
        if driver is not None or cuda is not None:
            cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
            driver_info.add_metric([driver or "", cuda_text], 1.0)
        return [fam for fam in [*f.families, driver_info] if fam.samples]


class _FamilyBuilder:
    """Creates families that all start with the same labels, in the order they are declared."""

    def __init__(self, base_labels: Sequence[str]):
        self.base_labels = list(base_labels)
        self.families: list[Metric] = []

    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=self.base_labels + list(labels))
        self.families.append(fam)
        return fam

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=self.base_labels + list(labels))
        self.families.append(fam)
        return fam


__all__ = ["GpuCollector", "GpuReading", "MigDevice", "error_name", "read_gpu"]
