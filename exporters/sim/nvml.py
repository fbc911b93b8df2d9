"""A simulated NVML library for demos and tests on machines without a GPU.

The simulator sits where `libnvidia-ml.so.1` sits: `install()` puts a `SimulatedLibrary` in
`pynvml.nvmlLib`, so the agent's real pynvml calls run unchanged. pynvml still builds the ctypes
arguments, still checks the return codes and still raises its own `NVMLError_*` classes; the
simulator answers the C functions by name, filling the same ctypes out-parameters the driver fills.
A function the simulated driver lacks is missing from the library, which pynvml reports as
`NVMLError_FunctionNotFound`, exactly as on an old driver.

A scenario (YAML) describes the GPUs and the faults in time; see exporters/sim/scenarios/ and the
README's "Simulated node" section.
"""

from __future__ import annotations

import ctypes
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import yaml

SCENARIO_DIR = Path(__file__).parent / "scenarios"

CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

NVLINK_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}

# Error names as pynvml spells its classes without the prefix: "GpuIsLost" -> 15.
ERROR_CODES = {
    cls.__name__.removeprefix("NVMLError_"): code for code, cls in pynvml.NVMLError._valClassMapping.items()
}

# The simulated H100 node's GPU, which a scenario's `gpu:` overrides key by key.
GPU_DEFAULTS: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "vbios_version": "96.00.99.00.01",
    "serial": None,  # generated per GPU
    "pci_bus_id": None,  # generated per GPU
    "memory_total_mib": 81559,
    "memory_used_mib": 4,
    "utilization": 0.0,
    "sm_active": 0.0,
    "sm_occupancy": 0.0,
    "gpm_supported": True,
    "sm_clock_mhz": 1980,
    "sm_clock_max_mhz": 1980,
    "memory_clock_mhz": 2619,
    "clocks_event_reasons": ["gpu_idle"],
    "performance_state": 0,
    "temperature_celsius": 31,
    "memory_temperature_celsius": 38,
    "power_watts": 72.5,
    "power_limit_watts": 700.0,
    "energy_joules": 1.0e6,
    "ecc_corrected_volatile": 0,
    "ecc_uncorrected_volatile": 0,
    "ecc_corrected_aggregate": 0,
    "ecc_uncorrected_aggregate": 0,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remap_pending": False,
    "remap_failed": False,
    "pcie_generation": 5,
    "pcie_generation_max": 5,
    "pcie_width": 16,
    "pcie_width_max": 16,
    "pcie_replays": 0,
    "nvlinks": 18,
    "nvlink_down": [],
    "nvlink_errors": {},
    "compute_processes": [],
}

# PCI bus ids of the eight GPUs of a DGX H100, in NVML index order.
DGX_H100_BUS_IDS = [
    "00000000:1B:00.0",
    "00000000:43:00.0",
    "00000000:52:00.0",
    "00000000:61:00.0",
    "00000000:9D:00.0",
    "00000000:C3:00.0",
    "00000000:D1:00.0",
    "00000000:DF:00.0",
]

TOP_KEYS = {
    "nvml_until_seconds",
    "system_hang",
    "description",
    "driver_version",
    "cuda_driver_version",
    "nvml",
    "frozen_at_seconds",
    "seed",
    "gpu_count",
    "gpu",
    "gpus",
    "faults",
    "kernel_log",
    "tour",
}
TOUR_KEYS = {"at_seconds", "description", "look"}
FAULT_KEYS = {
    "description",
    "look",
    "gpu",
    "from_seconds",
    "until_seconds",
    "set",
    "lost",
    "xid",
    "errors",
    "hang",
}
NVML_STATES = ("ok", "library_missing", "driver_not_loaded")


class ScenarioError(Exception):
    """A scenario file that does not describe a node; names the file, the key and what was expected."""

    def __init__(self, source: str, key: str, expected: str, got: object = None):
        text = f"{source}: {key}: expected {expected}"
        if got is not None:
            text += f", got {got!r}"
        super().__init__(text)


@dataclass(frozen=True)
class Fault:
    gpus: tuple[int, ...]
    from_seconds: float
    until_seconds: float | None
    set: Mapping[str, Any]
    lost: bool
    xids: tuple[int, ...]
    errors: Mapping[str, int]
    hang: Mapping[str, float]
    description: str
    look: str  # where the fault shows in the exposition, for the demo's tour

    def active(self, t: float) -> bool:
        return self.from_seconds <= t and (self.until_seconds is None or t < self.until_seconds)


@dataclass(frozen=True)
class Scenario:
    source: str
    description: str
    driver_version: str
    cuda_driver_version: int
    nvml: str
    frozen_at_seconds: float | None
    gpus: tuple[Mapping[str, Any], ...]
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    # (seconds after start, message): lines the demo's simulated /dev/kmsg prints.
    kernel_log: tuple[tuple[float, str], ...] = ()
    # (seconds after start, description, series): more stops of the demo's tour.
    tour: tuple[tuple[float, str, str], ...] = ()
    # Calls that concern no GPU (nvmlInitWithFlags, nvmlDeviceGetCount_v2, ...) -> seconds they block.
    system_hang: Mapping[str, float] = field(default_factory=dict)
    # When `nvml` is not ok: the time it becomes ok (the driver is loaded late); None: never.
    nvml_until_seconds: float | None = None


def load_scenario(path: str | Path, frozen_at_seconds: float | None = None) -> Scenario:
    """Read a scenario file, checking every key; `frozen_at_seconds` overrides the file's clock."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ScenarioError(source, "<file>", "a readable scenario file", err.strerror) from err
    except yaml.YAMLError as err:
        raise ScenarioError(source, "<file>", "valid YAML", str(err).splitlines()[0]) from err
    return parse_scenario(data, source, frozen_at_seconds)


def parse_scenario(data: Any, source: str, frozen_at_seconds: float | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(source, "<top level>", "a mapping")
    _known(data, TOP_KEYS, source, "")
    count = _typed(data.get("gpu_count", 8), int, source, "gpu_count")
    if not 0 <= count <= 64:
        raise ScenarioError(source, "gpu_count", "an integer between 0 and 64", count)
    base = dict(GPU_DEFAULTS)
    base.update(_gpu_state(data.get("gpu", {}), source, "gpu"))
    per_gpu = data.get("gpus", {}) or {}
    if not isinstance(per_gpu, dict):
        raise ScenarioError(source, "gpus", "a mapping of GPU index to GPU keys")
    seed = str(data.get("seed", "clusterhealth-simulated-node"))
    gpus = []
    for i in range(count):
        state = dict(base)
        state["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}/{i}"))
        state["serial"] = base["serial"] or str(1654922000000 + 1009 * i)
        state["pci_bus_id"] = base["pci_bus_id"] or (
            DGX_H100_BUS_IDS[i] if i < len(DGX_H100_BUS_IDS) else f"00000000:{0x10 + i:02X}:00.0"
        )
        state.update(_gpu_state(per_gpu.get(i, {}), source, f"gpus.{i}"))
        gpus.append(state)
    for key in per_gpu:
        if not isinstance(key, int) or not 0 <= key < count:
            raise ScenarioError(source, f"gpus.{key}", f"a GPU index below gpu_count ({count})")
    faults = tuple(
        _fault(f, source, f"faults[{n}]", count) for n, f in enumerate(data.get("faults", []) or [])
    )
    nvml = data.get("nvml", "ok")
    if nvml not in NVML_STATES:
        raise ScenarioError(source, "nvml", "one of " + ", ".join(NVML_STATES), nvml)
    frozen = data.get("frozen_at_seconds") if frozen_at_seconds is None else frozen_at_seconds
    if frozen is not None:
        frozen = float(_typed(frozen, (int, float), source, "frozen_at_seconds"))
    kernel_log = []
    for n, entry in enumerate(data.get("kernel_log", []) or []):
        key = f"kernel_log[{n}]"
        if not isinstance(entry, dict) or set(entry) - {"at_seconds", "message"} or "message" not in entry:
            raise ScenarioError(source, key, "a mapping with message and optional at_seconds", entry)
        at = float(_typed(entry.get("at_seconds", 0), (int, float), source, f"{key}.at_seconds"))
        kernel_log.append((at, str(_typed(entry["message"], str, source, f"{key}.message"))))
    tour = []
    for n, entry in enumerate(data.get("tour", []) or []):
        key = f"tour[{n}]"
        if not isinstance(entry, dict):
            raise ScenarioError(source, key, "a mapping of " + ", ".join(sorted(TOUR_KEYS)), entry)
        _known(entry, TOUR_KEYS, source, key)
        at = float(_typed(entry.get("at_seconds", 0), (int, float), source, f"{key}.at_seconds"))
        tour.append((at, str(entry.get("description", "")), str(entry.get("look", ""))))
    return Scenario(
        source=source,
        description=str(data.get("description", "")),
        driver_version=str(_typed(data.get("driver_version", "550.90.07"), str, source, "driver_version")),
        cuda_driver_version=_typed(
            data.get("cuda_driver_version", 12040), int, source, "cuda_driver_version"
        ),
        nvml=nvml,
        frozen_at_seconds=frozen,
        gpus=tuple(gpus),
        faults=faults,
        kernel_log=tuple(sorted(kernel_log)),
        tour=tuple(tour),
        system_hang=_system_hang(data.get("system_hang"), source),
        nvml_until_seconds=_optional_seconds(data.get("nvml_until_seconds"), source, "nvml_until_seconds"),
    )


def _optional_seconds(value: Any, source: str, key: str) -> float | None:
    return None if value is None else float(_typed(value, (int, float), source, key))


SYSTEM_CALLS = (
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
)


def _system_hang(data: Any, source: str) -> dict[str, float]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ScenarioError(source, "system_hang", "a mapping of NVML function name to seconds", data)
    for call in data:
        if call not in SYSTEM_CALLS:
            raise ScenarioError(source, f"system_hang.{call}", "one of " + ", ".join(SYSTEM_CALLS), call)
    return {k: float(_typed(v, (int, float), source, f"system_hang.{k}")) for k, v in data.items()}


def _known(data: Mapping[str, Any], known: set[str], source: str, prefix: str) -> None:
    for key in data:
        if key not in known:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise ScenarioError(source, where, "one of " + ", ".join(sorted(known)), key)


def _typed(value: Any, kind: type | tuple[type, ...], source: str, key: str) -> Any:
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ScenarioError(source, key, f"a value of type {names}", value)
    return value


def _gpu_state(data: Any, source: str, prefix: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ScenarioError(source, prefix, "a mapping of GPU keys")
    _known(data, set(GPU_DEFAULTS), source, prefix)
    out: dict[str, Any] = {}
    for key, value in data.items():
        default = GPU_DEFAULTS[key]
        kind: type | tuple[type, ...] = (
            (int, float) if isinstance(default, float) else type(default) if default is not None else str
        )
        if key == "memory_temperature_celsius" and value is None:
            out[key] = None  # the GPU has no HBM sensor
            continue
        _typed(value, kind, source, f"{prefix}.{key}")
        if key == "clocks_event_reasons":
            for reason in value:
                if reason not in CLOCK_EVENT_BITS:
                    raise ScenarioError(
                        source, f"{prefix}.{key}", "reasons among " + ", ".join(CLOCK_EVENT_BITS), reason
                    )
        if key == "nvlink_errors":
            for link, counters in value.items():
                if not isinstance(counters, dict) or set(counters) - set(NVLINK_COUNTERS):
                    raise ScenarioError(
                        source,
                        f"{prefix}.{key}.{link}",
                        "a mapping of " + ", ".join(NVLINK_COUNTERS) + " to counts",
                        counters,
                    )
        out[key] = value
    return out


def _fault(data: Any, source: str, prefix: str, count: int) -> Fault:
    if not isinstance(data, dict):
        raise ScenarioError(source, prefix, "a mapping")
    _known(data, FAULT_KEYS, source, prefix)
    gpu = data.get("gpu")
    gpus = tuple(gpu) if isinstance(gpu, list) else (gpu,)
    for g in gpus:
        if not isinstance(g, int) or not 0 <= g < count:
            raise ScenarioError(source, f"{prefix}.gpu", f"a GPU index (or a list) below {count}", g)
    xid = data.get("xid", [])
    xids = tuple(xid) if isinstance(xid, list) else (xid,)
    errors = {}
    for call, name in (data.get("errors") or {}).items():
        if name not in ERROR_CODES:
            raise ScenarioError(
                source, f"{prefix}.errors.{call}", "an NVML error name such as NotSupported", name
            )
        errors[call] = ERROR_CODES[name]
    until = data.get("until_seconds")
    return Fault(
        gpus=gpus,
        from_seconds=float(
            _typed(data.get("from_seconds", 0), (int, float), source, f"{prefix}.from_seconds")
        ),
        until_seconds=None
        if until is None
        else float(_typed(until, (int, float), source, f"{prefix}.until_seconds")),
        set=_gpu_state(data.get("set", {}), source, f"{prefix}.set"),
        lost=bool(_typed(data.get("lost", False), bool, source, f"{prefix}.lost")),
        xids=tuple(_typed(x, int, source, f"{prefix}.xid") for x in xids),
        errors=errors,
        hang={
            k: float(_typed(v, (int, float), source, f"{prefix}.hang.{k}"))
            for k, v in (data.get("hang") or {}).items()
        },
        description=str(data.get("description", "")),
        look=str(data.get("look", "")),
    )


# ---------------------------------------------------------------------------------------------
# The library

_HANDLE_BASE = 0x1000  # handles are opaque pointers: never 0, never dereferenced by pynvml


def _address(ptr: Any) -> int:
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def _set_pointer(ptr: Any, address: int) -> None:
    ctypes.cast(ctypes.pointer(ptr), ctypes.POINTER(ctypes.c_void_p))[0] = address


def _out(ref: Any, value: Any) -> None:
    """Write an out-parameter passed as byref(c_uint()) and the like."""
    ref._obj.value = value


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
        state = dict(self.scenario.gpus[index])
        t = self.now()
        for fault in self.scenario.faults:
            if index in fault.gpus and fault.active(t):
                state.update(fault.set)
        state["energy_joules"] = state["energy_joules"] + state["power_watts"] * t
        return state

    def _lost(self, index: int) -> bool:
        t = self.now()
        return any(f.lost and index in f.gpus and f.active(t) for f in self.scenario.faults)

    def _fault_code(self, index: int, call: str) -> int:
        t = self.now()
        for fault in self.scenario.faults:
            if index in fault.gpus and fault.active(t) and call in fault.hang:
                time.sleep(fault.hang[call])
        if self._lost(index):
            return pynvml.NVML_ERROR_GPU_IS_LOST
        for fault in self.scenario.faults:
            if index in fault.gpus and fault.active(t) and call in fault.errors:
                return fault.errors[call]
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

    @_device_call
    def nvmlDeviceGetUUID(self, index: int, state: dict[str, Any], buf: Any, size: Any) -> int:
        buf.value = state["uuid"].encode()
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
        for i in range(n.value):
            v = values[i]
            v.timestamp = int(time.time() * 1e6)
            if (
                v.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP
                and state["memory_temperature_celsius"] is not None
            ):
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                v.value.uiVal = state["memory_temperature_celsius"]
                v.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return pynvml.NVML_SUCCESS

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
        state = self.state(second[0])
        values = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: state["utilization"] * 100,
            pynvml.NVML_GPM_METRIC_SM_UTIL: state["sm_active"] * 100,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: state["sm_occupancy"] * 100,
        }
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in values:
                metric.value = values[metric.metricId]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
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
