"""A simulated NVML library for demos and tests on machines without a GPU.

The simulator sits where `libnvidia-ml.so.1` sits: `install()` puts a `SimulatedLibrary` in
`pynvml.nvmlLib`, so the agent's real pynvml calls run unchanged. pynvml still builds the ctypes
arguments, still checks the return codes and still raises its own `NVMLError_*` classes; the
simulator answers the C functions by name, filling the same ctypes out-parameters the driver fills.
A function the simulated driver lacks is missing from the library, which pynvml reports as
`NVMLError_FunctionNotFound`, exactly as on an old driver.

A scenario (YAML, read by exporters/sim/scenario.py) describes the GPUs and the faults in time;
see exporters/sim/scenarios/ and docs/simulator.md.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from clusterhealth.exporters.sim.scenario import (
    CLOCK_EVENT_BITS,
    CLOCK_EVENT_COUNTERS,
    ERROR_CODES,
    FABRIC_CONDITIONS,
    FABRIC_STATES,
    NVLINK_COUNTERS,
    RECOVERY_ACTIONS,
    Scenario,
)

_HANDLE_BASE = 0x1000  # handles are opaque pointers: never 0, never dereferenced by pynvml
# A MIG device's handle: its GPU's index and its slot, above every GPU handle.
_MIG_HANDLE_BASE = 0x10000
_MIG_SLOTS = 8  # nvmlDeviceGetMaxMigDeviceCount of an H100 (7 instances) rounded up

# The field id of each throttle-time counter (nanoseconds, unsigned 64-bit), as the installed
# nvidia-ml-py numbers them (the agent asks for those); a counter it has no name for is not answered.
_CLOCK_EVENT_FIELDS = {
    counter: getattr(pynvml, name)
    for counter, name in (
        ("sw_power_cap", "NVML_FI_DEV_PERF_POLICY_POWER"),
        ("sync_boost", "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
        ("sw_thermal_slowdown", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"),
        ("hw_thermal_slowdown", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
        ("hw_power_brake_slowdown", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN"),
        ("thermal", "NVML_FI_DEV_PERF_POLICY_THERMAL"),
        ("board_limit", "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
        ("low_utilization", "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION"),
        ("reliability", "NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
    )
    if hasattr(pynvml, name)
}
# The recovery action's field (230 in nvml.h since R570); nvidia-ml-py 12.535 has no name for it.
_RECOVERY_ACTION_FIELD = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
# The versions of the structs, as nvml.h defines them (older nvidia-ml-py releases lack some names).
_SRAM_V1 = 0x1000068
_REPAIR_V1 = 0x100000C
_FABRIC_VERSIONS = {0x02000024: 2, 0x3000028: 3}
_PLATFORM_VERSIONS = {0x100002C: 1, 0x200002C: 2}


def _address(ptr: Any) -> int:
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def _set_pointer(ptr: Any, address: int) -> None:
    ctypes.cast(ctypes.pointer(ptr), ctypes.POINTER(ctypes.c_void_p))[0] = address


def _out(ref: Any, value: Any) -> None:
    """Write an out-parameter passed as byref(c_uint()) and the like."""
    ref._obj.value = value


def _mig_of(handle: Any) -> tuple[int, int] | None:
    """(GPU index, slot) of a MIG device handle; None for any other handle."""
    address = _address(handle) - _MIG_HANDLE_BASE
    return divmod(address, _MIG_SLOTS) if address >= 0 else None


def _device_call(fn: Callable[..., int]) -> Callable[..., int]:
    """Resolve the handle, apply the faults of this call, then answer with the GPU's state."""
    name = fn.__name__

    def call(self: SimulatedLibrary, handle: Any, *args: Any) -> int:
        index = _address(handle) - _HANDLE_BASE
        if not 0 <= index < len(self.scenario.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        rc = self._fault_code(index, name)
        if rc:
            return rc
        return fn(self, index, self.state(index), *args)

    call.__name__ = name
    return call


class SimulatedLibrary:
    """Answers NVML's C functions by name, for the GPUs and faults of a scenario."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] = time.monotonic):
        self.scenario = scenario
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._next_id = 1
        self._gpm_samples: dict[int, tuple[int, float] | None] = {}
        self._event_sets: dict[int, dict[str, Any]] = {}
        self.missing_functions: set[str] = set()
        major = int(scenario.driver_version.split(".")[0]) if scenario.driver_version[:1].isdigit() else 999
        if major < 535:
            # The clock-event call arrived with R535; older drivers only have the throttle call.
            self.missing_functions.add("nvmlDeviceGetCurrentClocksEventReasons")

    # -- time and state -----------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the simulated node started (or the scenario's frozen instant)."""
        if self.scenario.frozen_at_seconds is not None:
            return self.scenario.frozen_at_seconds
        return self._clock() - self._start

    def state(self, index: int) -> dict[str, Any]:
        return self._state_at(index, self.now())

    def _state_at(self, index: int, t: float) -> dict[str, Any]:
        state = dict(self.scenario.gpus[index])
        for fault in self.scenario.faults:
            if index in fault.gpus and fault.active(t):
                state.update(fault.set)
        state["energy_joules"] = state["energy_joules"] + state["power_watts"] * t
        return state

    def clocks_event_seconds(self, index: int) -> dict[str, float]:
        """Each throttle-time counter: its start value, plus the time since the node started during
        which a flag it counts was set (integrated over the faults' intervals)."""
        t = self.now()
        edges = {0.0, t}
        for fault in self.scenario.faults:
            if index in fault.gpus:
                edges.update(
                    e for e in (fault.from_seconds, fault.until_seconds) if e is not None and 0 < e < t
                )
        ordered = sorted(edges)
        held = {
            c: float(self.scenario.gpus[index]["clocks_event_seconds"].get(c, 0))
            for c in CLOCK_EVENT_COUNTERS
        }
        for start, end in itertools.pairwise(ordered):
            active = set(self._state_at(index, (start + end) / 2)["clocks_event_reasons"])
            for counter, flags in CLOCK_EVENT_COUNTERS.items():
                if active.intersection(flags):
                    held[counter] += end - start
        return held

    def _lost(self, index: int) -> bool:
        t = self.now()
        return any(f.lost and index in f.gpus and f.active(t) for f in self.scenario.faults)

    def _reset_required(self, index: int) -> bool:
        t = self.now()
        return any(f.reset_required and index in f.gpus and f.active(t) for f in self.scenario.faults)

    def _fault_code(self, index: int, call: str) -> int:
        t = self.now()
        for fault in self.scenario.faults:
            if index in fault.gpus and fault.active(t) and call in fault.hang:
                time.sleep(fault.hang[call])
        if self._lost(index):
            return pynvml.NVML_ERROR_GPU_IS_LOST
        # Field values answer field by field (_item_code): the recovery action still answers.
        if self._reset_required(index) and call != "nvmlDeviceGetFieldValues":
            return pynvml.NVML_ERROR_RESET_REQUIRED
        for fault in self.scenario.faults:
            if index in fault.gpus and fault.active(t) and call in fault.errors:
                return fault.errors[call]
        return pynvml.NVML_SUCCESS

    def _item_code(self, index: int, call: str, item: int) -> int:
        """A fault on one item of a call that answers many (a GPM metric, a field value): a fault's
        `errors` names it `call(NVML_CONSTANT_NAME)`, any of pynvml's names for that id. A GPU that
        waits for a reset answers only its recovery action."""
        t = self.now()
        if self._reset_required(index) and not (
            call == "nvmlDeviceGetFieldValues" and item == _RECOVERY_ACTION_FIELD
        ):
            return pynvml.NVML_ERROR_RESET_REQUIRED
        for fault in self.scenario.faults:
            if index not in fault.gpus or not fault.active(t):
                continue
            for key, code in fault.errors.items():
                named = key.startswith(call + "(") and key.endswith(")")
                if named and getattr(pynvml, key[len(call) + 1 : -1], None) == item:
                    return code
        return pynvml.NVML_SUCCESS

    def _new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return 0x100000 + self._next_id

    # -- library and system -------------------------------------------------------------------

    def _system_call(self, call: str) -> None:
        """A call that concerns no GPU: block as long as the scenario says (a wedged driver)."""
        seconds = self.scenario.system_hang.get(call)
        if seconds:
            time.sleep(seconds)

    def nvmlInitWithFlags(self, flags: Any) -> int:
        self._system_call("nvmlInitWithFlags")
        until = self.scenario.nvml_until_seconds
        if until is not None and self.now() >= until:
            return pynvml.NVML_SUCCESS
        if self.scenario.nvml == "library_missing":
            return pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
        if self.scenario.nvml == "driver_not_loaded":
            return pynvml.NVML_ERROR_DRIVER_NOT_LOADED
        return pynvml.NVML_SUCCESS

    def nvmlShutdown(self) -> int:
        self._system_call("nvmlShutdown")
        return pynvml.NVML_SUCCESS

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        self._system_call("nvmlSystemGetDriverVersion")
        buf.value = self.scenario.driver_version.encode()
        return pynvml.NVML_SUCCESS

    def nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:
        _out(ref, self.scenario.cuda_driver_version)
        return pynvml.NVML_SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        return self.nvmlSystemGetCudaDriverVersion_v2(ref)

    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        self._system_call("nvmlDeviceGetCount_v2")
        _out(ref, len(self.scenario.gpus))
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        self._system_call("nvmlDeviceGetHandleByIndex_v2")
        i = index.value
        if not 0 <= i < len(self.scenario.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if self._lost(i):
            return pynvml.NVML_ERROR_GPU_IS_LOST
        _set_pointer(ref._obj, _HANDLE_BASE + i)
        return pynvml.NVML_SUCCESS

    # -- identity -----------------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetIndex(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, index)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        mig = self._mig(handle)
        if mig is not None:
            buf.value = mig["uuid"].encode()
            return pynvml.NVML_SUCCESS
        return self._gpu_uuid(handle, buf, size)

    def _uuid_of_gpu(self, index: int, state: dict[str, Any], buf: Any, size: Any) -> int:
        buf.value = state["uuid"].encode()
        return pynvml.NVML_SUCCESS

    # Under the NVML name, so that a scenario's faults of nvmlDeviceGetUUID apply to GPU handles.
    _uuid_of_gpu.__name__ = "nvmlDeviceGetUUID"
    _gpu_uuid: Callable[..., int] = _device_call(_uuid_of_gpu)

    @_device_call
    def nvmlDeviceGetMinorNumber(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["minor_number"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetName(self, index: int, state: dict[str, Any], buf: Any, size: Any) -> int:
        buf.value = state["name"].encode()
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetSerial(self, index: int, state: dict[str, Any], buf: Any, size: Any) -> int:
        buf.value = state["serial"].encode()
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetVbiosVersion(self, index: int, state: dict[str, Any], buf: Any, size: Any) -> int:
        buf.value = state["vbios_version"].encode()
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetPciInfo_v3(self, index: int, state: dict[str, Any], ref: Any) -> int:
        info = ref._obj
        bus_id = state["pci_bus_id"]
        domain, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = 0x233010DE
        info.pciSubSystemId = 0x16C110DE
        return pynvml.NVML_SUCCESS

    # -- activity, memory, clocks -------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetUtilizationRates(self, index: int, state: dict[str, Any], ref: Any) -> int:
        ref._obj.gpu = round(state["utilization"] * 100)
        ref._obj.memory = round(state["utilization"] * 40)
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetMemoryInfo(self, index: int, state: dict[str, Any], ref: Any) -> int:
        total, used = state["memory_total_mib"] << 20, state["memory_used_mib"] << 20
        ref._obj.total, ref._obj.used, ref._obj.free = total, used, total - used
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetClockInfo(self, index: int, state: dict[str, Any], kind: Any, ref: Any) -> int:
        key = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "memory_clock_mhz"}.get(
            kind.value
        )
        if key is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _out(ref, state[key])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetMaxClockInfo(self, index: int, state: dict[str, Any], kind: Any, ref: Any) -> int:
        key = {pynvml.NVML_CLOCK_SM: "sm_clock_max_mhz", pynvml.NVML_CLOCK_MEM: "memory_clock_mhz"}.get(
            kind.value
        )
        if key is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _out(ref, state[key])
        return pynvml.NVML_SUCCESS

    def _reasons(self, state: dict[str, Any]) -> int:
        bits = 0
        for reason in state["clocks_event_reasons"]:
            bits |= CLOCK_EVENT_BITS[reason]
        return bits

    @_device_call
    def nvmlDeviceGetCurrentClocksEventReasons(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, self._reasons(state))
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, self._reasons(state))
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetPerformanceState(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["performance_state"])
        return pynvml.NVML_SUCCESS

    # -- temperature, power -------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetTemperature(self, index: int, state: dict[str, Any], sensor: Any, ref: Any) -> int:
        if sensor.value != pynvml.NVML_TEMPERATURE_GPU:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _out(ref, state["temperature_celsius"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetFieldValues(self, index: int, state: dict[str, Any], n: Any, ref: Any) -> int:
        values = ref._obj
        answers = self._field_answers(index, state)
        for i in range(n.value):
            v = values[i]
            v.timestamp = int(time.time() * 1e6)
            v.nvmlReturn = self._item_code(index, "nvmlDeviceGetFieldValues", v.fieldId)
            if v.nvmlReturn:
                continue
            answer = answers.get(v.fieldId)
            if answer is None:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            v.valueType, member, value = answer
            setattr(v.value, member, value)
        return pynvml.NVML_SUCCESS

    def _field_answers(self, index: int, state: dict[str, Any]) -> dict[int, tuple[int, str, Any]]:
        """field id -> (NVML_VALUE_TYPE_*, the nvmlValue_t member, the value) of the fields this GPU has."""
        answers: dict[int, tuple[int, str, Any]] = {}
        if state["memory_temperature_celsius"] is not None:
            answers[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                "uiVal",
                state["memory_temperature_celsius"],
            )
        if state["nvlinks"]:
            answers[pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON] = (
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                "uiVal",
                state["nvlink_speed_mbps"],
            )
        if state["recovery_action"] is not None:
            answers[_RECOVERY_ACTION_FIELD] = (
                pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                "uiVal",
                RECOVERY_ACTIONS[state["recovery_action"]],
            )
        held = self.clocks_event_seconds(index)
        for counter in state["clocks_event_counters"]:
            if counter not in _CLOCK_EVENT_FIELDS:
                continue
            answers[_CLOCK_EVENT_FIELDS[counter]] = (
                pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                "ullVal",
                round(held[counter] * 1e9),
            )
        return answers

    @_device_call
    def nvmlDeviceGetPowerUsage(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, round(state["power_watts"] * 1000))
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetEnforcedPowerLimit(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, round(state["power_limit_watts"] * 1000))
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetTotalEnergyConsumption(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, round(state["energy_joules"] * 1000))
        return pynvml.NVML_SUCCESS

    # -- memory errors ------------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetTotalEccErrors(
        self, index: int, state: dict[str, Any], error_type: Any, counter_type: Any, ref: Any
    ) -> int:
        kind = "corrected" if error_type.value == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        scope = "volatile" if counter_type.value == pynvml.NVML_VOLATILE_ECC else "aggregate"
        _out(ref, state[f"ecc_{kind}_{scope}"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetRemappedRows(
        self, index: int, state: dict[str, Any], corr: Any, unc: Any, pending: Any, failed: Any
    ) -> int:
        _out(corr, state["remapped_rows_correctable"])
        _out(unc, state["remapped_rows_uncorrectable"])
        _out(pending, int(state["remap_pending"]))
        _out(failed, int(state["remap_failed"]))
        return pynvml.NVML_SUCCESS

    # -- PCIe and NVLink ----------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetCurrPcieLinkGeneration(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["pcie_generation"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetMaxPcieLinkGeneration(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["pcie_generation_max"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetCurrPcieLinkWidth(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["pcie_width"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetMaxPcieLinkWidth(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["pcie_width_max"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetPcieReplayCounter(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, state["pcie_replays"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetNvLinkState(self, index: int, state: dict[str, Any], link: int, ref: Any) -> int:
        if state["nvlinks"] == 0:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        if not 0 <= link < state["nvlinks"]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        down = link in state["nvlink_down"]
        _out(ref, pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED)
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetNvLinkErrorCounter(
        self, index: int, state: dict[str, Any], link: int, counter: int, ref: Any
    ) -> int:
        if not 0 <= link < state["nvlinks"]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        names = {v: k for k, v in NVLINK_COUNTERS.items()}
        if counter not in names:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        errors = state["nvlink_errors"].get(link, {})
        _out(ref, errors.get(names[counter], 0))
        return pynvml.NVML_SUCCESS

    # -- what NVML says to do: SRAM ECC, memory repair, fabric health, platform ----------------

    @_device_call
    def nvmlDeviceGetSramEccErrorStatus(self, index: int, state: dict[str, Any], ref: Any) -> int:
        if not state["sram_ecc_supported"]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        status = ref._obj
        if status.version != _SRAM_V1:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        parity, secded = state["sram_ecc_uncorrected_parity"], state["sram_ecc_uncorrected_secded"]
        status.aggregateUncParity = status.volatileUncParity = parity
        status.aggregateUncSecDed = status.volatileUncSecDed = secded
        status.aggregateCor = status.volatileCor = state["sram_ecc_corrected"]
        status.aggregateUncBucketSm = parity + secded
        status.bThresholdExceeded = int(state["sram_ecc_threshold_exceeded"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetRepairStatus(self, index: int, state: dict[str, Any], ref: Any) -> int:
        if not state["memory_repair_supported"]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        status = ref._obj
        if status.version != _REPAIR_V1:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        status.bChannelRepairPending = int(state["channel_repair_pending"])
        status.bTpcRepairPending = int(state["tpc_repair_pending"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetUnrepairableMemoryFlag_v1(self, index: int, state: dict[str, Any], ref: Any) -> int:
        if not state["memory_repair_supported"]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        ref._obj.unrepairableMemory = int(state["memory_unrepairable"])
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetGpuFabricInfoV(self, index: int, state: dict[str, Any], ref: Any) -> int:
        if not state["fabric_supported"]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        info = ref._obj
        if _FABRIC_VERSIONS.get(info.version, 99) > state["fabric_info_version"]:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        info.state = FABRIC_STATES[state["fabric_state"]]
        info.status = 0 if state["fabric_status"] == "Success" else ERROR_CODES[state["fabric_status"]]
        info.cliqueId = 1
        mask = 0
        # Every condition is reported, false unless the scenario sets it (its FALSE is 2, except
        # the configuration's NONE and the fabric manager's CONNECTED, which are 1).
        for name, (shift, bad) in FABRIC_CONDITIONS.items():
            fine = 1 if name in ("incorrect_configuration", "fabric_manager_disconnected") else 2
            mask |= (bad if name in state["fabric_conditions"] else fine) << shift
        info.healthMask = mask
        if hasattr(info, "healthSummary"):  # version 3
            conditions = set(state["fabric_conditions"])
            # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY, _UNHEALTHY, _LIMITED_CAPACITY in nvml.h.
            info.healthSummary = 1 if not conditions else 3 if conditions == {"degraded_bandwidth"} else 2
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetPlatformInfo(self, index: int, state: dict[str, Any], ref: Any) -> int:
        platform = state["platform_info"]
        if platform is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        info = ref._obj
        if _PLATFORM_VERSIONS.get(info.version, 99) > state["platform_info_version"]:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if hasattr(info, "chassisSerialNumber"):  # version 2
            info.chassisSerialNumber = str(platform["chassis_serial"]).encode()
            info.slotNumber, info.trayIndex = bytes([platform["slot"]]), bytes([platform["tray"]])
            info.hostId = bytes([platform["host_id"]])
        else:
            info.chassisPhysicalSlotNumber = bytes([platform["slot"]])
            info.computeSlotIndex, info.nodeIndex = bytes([platform["tray"]]), bytes([platform["host_id"]])
        info.moduleId = bytes([platform["module_id"]])
        return pynvml.NVML_SUCCESS

    # -- processes ----------------------------------------------------------------------------

    @_device_call
    def nvmlDeviceGetComputeRunningProcesses_v3(
        self, index: int, state: dict[str, Any], count_ref: Any, procs: Any
    ) -> int:
        running = state["compute_processes"]
        if procs is None:
            _out(count_ref, len(running))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if running else pynvml.NVML_SUCCESS
        if count_ref._obj.value < len(running):
            _out(count_ref, len(running))
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, proc in enumerate(running):
            procs[i].pid = proc.get("pid", 0)
            procs[i].usedGpuMemory = int(proc.get("used_memory_mib", 0)) << 20
            procs[i].gpuInstanceId = 0xFFFFFFFF
            procs[i].computeInstanceId = 0xFFFFFFFF
        _out(count_ref, len(running))
        return pynvml.NVML_SUCCESS

    # -- MIG ----------------------------------------------------------------------------------

    def _mig(self, handle: Any) -> dict[str, Any] | None:
        """The scenario's record of a MIG device handle (None for a GPU's handle)."""
        place = _mig_of(handle)
        if place is None or not 0 <= place[0] < len(self.scenario.gpus):
            return None
        devices = self.state(place[0])["mig_devices"]
        return devices[place[1]] if place[1] < len(devices) else None

    @_device_call
    def nvmlDeviceGetMigMode(self, index: int, state: dict[str, Any], current: Any, pending: Any) -> int:
        enabled = pynvml.NVML_DEVICE_MIG_ENABLE if state["mig_devices"] else pynvml.NVML_DEVICE_MIG_DISABLE
        _out(current, enabled)
        _out(pending, enabled)
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetMaxMigDeviceCount(self, index: int, state: dict[str, Any], ref: Any) -> int:
        _out(ref, _MIG_SLOTS if state["mig_devices"] else 0)
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, index: int, state: dict[str, Any], slot: Any, ref: Any
    ) -> int:
        if not state["mig_devices"]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if slot.value >= len(state["mig_devices"]):
            return pynvml.NVML_ERROR_NOT_FOUND  # an empty slot, as the driver answers
        _set_pointer(ref._obj, _MIG_HANDLE_BASE + index * _MIG_SLOTS + slot.value)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT  # not a MIG device, as the driver answers
        _out(ref, mig["gpu_instance_id"])
        return pynvml.NVML_SUCCESS

    # -- GPM (Hopper and newer) ---------------------------------------------------------------

    @_device_call
    def nvmlGpmQueryDeviceSupport(self, index: int, state: dict[str, Any], ref: Any) -> int:
        ref._obj.isSupportedDevice = int(state["gpm_supported"])
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleAlloc(self, ref: Any) -> int:
        sample = self._new_id()
        self._gpm_samples[sample] = None
        _set_pointer(ref._obj, sample)
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        if self._gpm_samples.pop(_address(sample), "absent") == "absent":
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        index = _address(handle) - _HANDLE_BASE
        key = _address(sample)
        if key not in self._gpm_samples or not 0 <= index < len(self.scenario.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        rc = self._fault_code(index, "nvmlGpmSampleGet")
        if rc:
            return rc
        if not self.state(index)["gpm_supported"]:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        self._gpm_samples[key] = (index, self._clock())
        return pynvml.NVML_SUCCESS

    def nvmlGpmMetricsGet(self, ref: Any) -> int:
        request = ref._obj
        first = self._gpm_samples.get(_address(request.sample1))
        second = self._gpm_samples.get(_address(request.sample2))
        if first is None or second is None or first[0] != second[0] or second[1] <= first[1]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        index = second[0]
        rc = self._fault_code(index, "nvmlGpmMetricsGet")
        if rc:
            return rc
        state = self.state(index)
        mib = float(1 << 20)
        values = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: state["utilization"] * 100,
            pynvml.NVML_GPM_METRIC_SM_UTIL: state["sm_active"] * 100,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: state["sm_occupancy"] * 100,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: state["tensor_active"] * 100,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: state["dram_active"] * 100,
            pynvml.NVML_GPM_METRIC_FP16_UTIL: state["fp16_active"] * 100,
            pynvml.NVML_GPM_METRIC_FP32_UTIL: state["fp32_active"] * 100,
            pynvml.NVML_GPM_METRIC_FP64_UTIL: state["fp64_active"] * 100,
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: state["pcie_received_bytes_per_second"] / mib,
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: state["pcie_transmitted_bytes_per_second"] / mib,
        }
        if state["nvlinks"]:  # a PCIe card has no NVLink metrics
            values[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = (
                state["nvlink_received_bytes_per_second"] / mib
            )
            values[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = (
                state["nvlink_transmitted_bytes_per_second"] / mib
            )
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.nvmlReturn = self._item_code(index, "nvmlGpmMetricsGet", metric.metricId)
            if metric.nvmlReturn:
                continue
            if metric.metricId in values:
                metric.value = values[metric.metricId]
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return pynvml.NVML_SUCCESS

    # -- events -------------------------------------------------------------------------------

    def nvmlEventSetCreate(self, ref: Any) -> int:
        key = self._new_id()
        self._event_sets[key] = {"devices": {}, "delivered": set()}
        _set_pointer(ref._obj, key)
        return pynvml.NVML_SUCCESS

    def nvmlEventSetFree(self, event_set: Any) -> int:
        self._event_sets.pop(_address(event_set), None)
        return pynvml.NVML_SUCCESS

    @_device_call
    def nvmlDeviceRegisterEvents(self, index: int, state: dict[str, Any], types: Any, event_set: Any) -> int:
        registered = self._event_sets.get(_address(event_set))
        if registered is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        registered["devices"][index] = types.value
        return pynvml.NVML_SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, ref: Any, timeout_ms: Any) -> int:
        registered = self._event_sets.get(_address(event_set))
        if registered is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        deadline = self._clock() + timeout_ms.value / 1000
        while True:
            t = self.now()
            for n, fault in enumerate(self.scenario.faults):
                for g in fault.gpus:
                    if not registered["devices"].get(g, 0) & pynvml.nvmlEventTypeXidCriticalError:
                        continue
                    for k, xid in enumerate(fault.xids):
                        key = (n, g, k)
                        if key in registered["delivered"] or fault.from_seconds > t:
                            continue
                        registered["delivered"].add(key)
                        data = ref._obj
                        data.device = ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + g), pynvml.c_nvmlDevice_t)
                        data.eventType = pynvml.nvmlEventTypeXidCriticalError
                        data.eventData = xid
                        data.gpuInstanceId = 0xFFFFFFFF
                        data.computeInstanceId = 0xFFFFFFFF
                        return pynvml.NVML_SUCCESS
            remaining = deadline - self._clock()
            if remaining <= 0:
                return pynvml.NVML_ERROR_TIMEOUT
            # Sleep until the next event is due or the wait times out, as the driver blocks.
            upcoming = [f.from_seconds - t for f in self.scenario.faults if f.xids and f.from_seconds > t]
            time.sleep(min([remaining, *upcoming]) + 0.001)


class _LibraryView:
    """What pynvml sees as the loaded library: the simulator minus the functions its driver lacks."""

    def __init__(self, library: SimulatedLibrary):
        self._library = library

    def __getattr__(self, name: str) -> Any:
        if name in self._library.missing_functions or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._library, name)


def install(scenario: Scenario, clock: Callable[[], float] = time.monotonic) -> SimulatedLibrary:
    """Put a simulated library where pynvml keeps the loaded libnvidia-ml, before any nvmlInit."""
    library = SimulatedLibrary(scenario, clock)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = _LibraryView(library)
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return library


def uninstall() -> None:
    """Forget the simulated library (tests switch scenarios within one process)."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
