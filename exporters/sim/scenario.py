"""The simulated node's scenario format: its GPUs and their faults in time, read from YAML.

A scenario names the GPUs (`gpu_count`, `gpu:` for keys every GPU shares, `gpus:` per index; the
keys are those of `GPU_DEFAULTS`; who runs on a GPU is its `compute_processes`, each a pid with the
line of `/proc/<pid>/cgroup` that places it in a Slurm job or a Kubernetes pod, which
exporters/sim/procfs.py lays out), the driver, and `faults:`, each of which sets keys, loses the
GPU or leaves it waiting for a reset, raises Xid events, makes NVML calls fail with a named error or
hang, from one instant to
another; `kernel_log:` and `tour:` feed the demo. `load_scenario` checks every key once and returns
a frozen `Scenario`, or raises `ScenarioError` naming the file, the key and what was expected.
The simulated library that answers NVML's calls from a scenario is exporters/sim/nvml.py; the
scenarios shipped are in exporters/sim/scenarios/.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
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

# NVML's throttle-time counters, by the clock-event reasons (flags) whose time each one counts;
# the perf-policy limits without a flag of their own count only what a scenario starts them at.
CLOCK_EVENT_COUNTERS = {
    "sw_power_cap": ("sw_power_cap",),
    "sync_boost": ("sync_boost",),
    "sw_thermal_slowdown": ("sw_thermal_slowdown",),
    "hw_thermal_slowdown": ("hw_thermal_slowdown",),
    "hw_power_brake_slowdown": ("hw_power_brake_slowdown",),
    "thermal": ("sw_thermal_slowdown", "hw_thermal_slowdown"),
    "board_limit": (),
    "low_utilization": (),
    "reliability": (),
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

# NVML's recovery actions: the values nvml.h has had since R570, and whatever else the installed
# nvidia-ml-py names (the simulated driver answers values, which the agent names by its pynvml).
RECOVERY_ACTIONS = {
    "none": 0,
    "gpu_reset": 1,
    "node_reboot": 2,
    "drain_p2p": 3,
    "drain_and_reset": 4,
    **{
        name.removeprefix("NVML_GPU_RECOVERY_ACTION_").lower(): getattr(pynvml, name)
        for name in dir(pynvml)
        if name.startswith("NVML_GPU_RECOVERY_ACTION_")
    },
}
FABRIC_STATES = {
    "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
}
# A fabric health-mask condition in its bad state, by the pynvml names of its shift and value.
FABRIC_CONDITION_NAMES = {
    "degraded_bandwidth": ("SHIFT_DEGRADED_BW", "DEGRADED_BW_TRUE"),
    "route_recovery": ("SHIFT_ROUTE_RECOVERY", "ROUTE_RECOVERY_TRUE"),
    "route_unhealthy": ("SHIFT_ROUTE_UNHEALTHY", "ROUTE_UNHEALTHY_TRUE"),
    "access_timeout_recovery": ("SHIFT_ACCESS_TIMEOUT_RECOVERY", "ACCESS_TIMEOUT_RECOVERY_TRUE"),
    "incorrect_configuration": (
        "SHIFT_INCORRECT_CONFIGURATION",
        "INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS",
    ),
    "fabric_manager_disconnected": ("SHIFT_GFM_STATE", "GFM_STATE_DISCONNECTED"),
}
# (shift, value) of each condition the installed nvidia-ml-py has constants for; a scenario may
# name the others, which a release without them cannot express (and the agent does not read).
FABRIC_CONDITIONS = {
    name: (
        getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_{shift}"),
        getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_{bad}"),
    )
    for name, (shift, bad) in FABRIC_CONDITION_NAMES.items()
    if hasattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_{shift}")
    and hasattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_{bad}")
}
PLATFORM_KEYS = {"chassis_serial", "slot", "tray", "host_id", "module_id"}
# GPU keys that may be null, that take one of a few values, or a list of them.
NULLABLE = ("memory_temperature_celsius", "recovery_action", "platform_info")
CHOICES: dict[str, Collection[str]] = {
    "recovery_action": RECOVERY_ACTIONS,
    "fabric_state": FABRIC_STATES,
    "fabric_status": ("Success", *ERROR_CODES),
}
LIST_CHOICES: dict[str, Collection[str]] = {
    "clocks_event_reasons": CLOCK_EVENT_BITS,
    "clocks_event_counters": CLOCK_EVENT_COUNTERS,
    "fabric_conditions": FABRIC_CONDITION_NAMES,
}

# The simulated H100 node's GPU, which a scenario's `gpu:` overrides key by key.
GPU_DEFAULTS: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "vbios_version": "96.00.99.00.01",
    "uuid": None,  # generated per GPU from the seed
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
    # {pid, used_memory_mib, cgroup}: cgroup is the process's /proc/<pid>/cgroup (exporters/sim/procfs.py).
    "compute_processes": [],
    # The device file's minor number (/dev/nvidiaN); None: the GPU's index.
    "minor_number": None,
    # MIG devices, each {gpu_instance_id, uuid}; the uuid is generated when left out. Empty: MIG off.
    "mig_devices": [],
    # GPM (Hopper and newer): activity 0-1 and traffic in bytes per second over a sample interval.
    "tensor_active": 0.0,
    "dram_active": 0.0,
    "fp16_active": 0.0,
    "fp32_active": 0.0,
    "fp64_active": 0.0,
    "pcie_received_bytes_per_second": 0.0,
    "pcie_transmitted_bytes_per_second": 0.0,
    "nvlink_received_bytes_per_second": 0.0,
    "nvlink_transmitted_bytes_per_second": 0.0,
    # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: an NVLink 4 link's speed in one direction, as
    # `nvidia-smi nvlink -s` shows it on an H100 (26.562 GB/s).
    "nvlink_speed_mbps": 26562,
    # The throttle-time counters the driver answers, and what each counted before the node started
    # (seconds); each then grows while a flag it counts is set.
    "clocks_event_counters": list(CLOCK_EVENT_COUNTERS),
    "clocks_event_seconds": {},
    # What NVML says to do (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), as NVML names it in lower case;
    # null: a driver without the field.
    "recovery_action": "none",
    # nvmlDeviceGetSramEccErrorStatus (aggregate counts).
    "sram_ecc_supported": True,
    "sram_ecc_threshold_exceeded": False,
    "sram_ecc_corrected": 0,
    "sram_ecc_uncorrected_parity": 0,
    "sram_ecc_uncorrected_secded": 0,
    # nvmlDeviceGetRepairStatus and nvmlDeviceGetUnrepairableMemoryFlag_v1: Blackwell, not H100.
    "memory_repair_supported": False,
    "channel_repair_pending": False,
    "tpc_repair_pending": False,
    "memory_unrepairable": False,
    # nvmlDeviceGetGpuFabricInfoV on an NVSwitch system: the registration with the fabric manager
    # and the health mask's conditions that are in their bad state.
    "fabric_supported": True,
    "fabric_state": "completed",
    "fabric_status": "Success",
    "fabric_conditions": [],
    "fabric_info_version": 3,  # the newest struct version the driver knows
    # nvmlDeviceGetPlatformInfo (rack-scale systems): null on an HGX H100; else chassis_serial,
    # slot, tray, host_id, module_id.
    "platform_info": None,
    "platform_info_version": 2,
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
    "reset_required",
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
    # Every call about the GPU answers ResetRequired, but the recovery-action field (what NVML says
    # to do about it) still answers.
    reset_required: bool = False

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
        state["serial"] = base["serial"] or str(1654922000000 + 1009 * i)
        state["pci_bus_id"] = base["pci_bus_id"] or (
            DGX_H100_BUS_IDS[i] if i < len(DGX_H100_BUS_IDS) else f"00000000:{0x10 + i:02X}:00.0"
        )
        state.update(_gpu_state(per_gpu.get(i, {}), source, f"gpus.{i}"))
        if state["uuid"] is None:
            state["uuid"] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}/{i}"))
        if state["minor_number"] is None:
            state["minor_number"] = i
        state["mig_devices"] = [
            {
                "uuid": "MIG-"
                + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}/{i}/mig/{m['gpu_instance_id']}")),
                **m,
            }
            for m in state["mig_devices"]
        ]
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
        if key in NULLABLE and value is None:
            out[key] = None  # the GPU has no HBM sensor; the driver has no such field or call
            continue
        if key == "platform_info":
            if not isinstance(value, dict) or set(value) != PLATFORM_KEYS:
                expected = "null or a mapping of " + ", ".join(sorted(PLATFORM_KEYS))
                raise ScenarioError(source, f"{prefix}.{key}", expected, value)
            out[key] = value
            continue
        if key == "minor_number":
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ScenarioError(source, f"{prefix}.{key}", "a device minor number (0, 1, ...)", value)
            out[key] = value
            continue
        if key in _LIST_KEYS:
            out[key] = _records(value, _LIST_KEYS[key], source, f"{prefix}.{key}")
            continue
        _typed(value, kind, source, f"{prefix}.{key}")
        if key in CHOICES and value not in CHOICES[key]:
            raise ScenarioError(source, f"{prefix}.{key}", "one of " + ", ".join(CHOICES[key]), value)
        for item in value if key in LIST_CHOICES else ():
            if item not in LIST_CHOICES[key]:
                expected = "items among " + ", ".join(LIST_CHOICES[key])
                raise ScenarioError(source, f"{prefix}.{key}", expected, item)
        if key == "clocks_event_seconds":
            for reason, seconds in value.items():
                if reason not in CLOCK_EVENT_COUNTERS:
                    expected = "counters among " + ", ".join(CLOCK_EVENT_COUNTERS)
                    raise ScenarioError(source, f"{prefix}.{key}", expected, reason)
                _typed(seconds, (int, float), source, f"{prefix}.{key}.{reason}")
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


# GPU keys that hold lists of records: each record's keys, their types, and which are required.
_LIST_KEYS: dict[str, dict[str, tuple[type, bool]]] = {
    "compute_processes": {"pid": (int, True), "used_memory_mib": (int, False), "cgroup": (str, False)},
    "mig_devices": {"gpu_instance_id": (int, True), "uuid": (str, False)},
}


def _records(value: Any, fields: dict[str, tuple[type, bool]], source: str, key: str) -> list[dict[str, Any]]:
    wanted = ", ".join(f"{name}{'' if required else '?'}" for name, (_, required) in fields.items())
    if not isinstance(value, list):
        raise ScenarioError(source, key, f"a list of mappings of {wanted}", value)
    for n, record in enumerate(value):
        if not isinstance(record, dict) or set(record) - set(fields):
            raise ScenarioError(source, f"{key}[{n}]", f"a mapping of {wanted}", record)
        for name, (kind, required) in fields.items():
            if name in record:
                _typed(record[name], kind, source, f"{key}[{n}].{name}")
            elif required:
                raise ScenarioError(source, f"{key}[{n}].{name}", f"a value (a mapping of {wanted})")
    return [dict(record) for record in value]


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
        reset_required=bool(
            _typed(data.get("reset_required", False), bool, source, f"{prefix}.reset_required")
        ),
        xids=tuple(_typed(x, int, source, f"{prefix}.xid") for x in xids),
        errors=errors,
        hang={
            k: float(_typed(v, (int, float), source, f"{prefix}.hang.{k}"))
            for k, v in (data.get("hang") or {}).items()
        },
        description=str(data.get("description", "")),
        look=str(data.get("look", "")),
    )
