#!/usr/bin/env python3
"""The GPU check's Python part: benchmarks/gpu_check.sh runs it one step at a time, each step a
subcommand with its own time limit, so that a step that hangs or fails leaves the others' results
(docs/gpu-check.md says what is checked and how to run it on a lent GPU).

  install     the project and whatever its requirements the machine lacks, from carried wheels,
              into a target folder (that machine reaches no package registry)
  scenario    an H200-like simulated GPU with the values an `nvidia-smi -q -x` capture shows
              (the dry run's GPU, and the real run's reference for which series to expect)
  nvml-table  one `clusterhealth scrape` in this process with every pynvml function traced: each
              NVML call, field and GPM metric the agent used, and its answer; the calls the code
              names but did not make this time are then made directly
  load        bf16 matrix products with torch on the GPU for a while (the real run's load)
  analyze     the agent's values against nvidia-smi's, the series against the simulator's, the
              rise under load, the NVML table: results.json, summary.md, nvml-table.md

Nothing here imports clusterhealth at module level: `install` runs before it is importable, and
`nvml-table` must wrap pynvml before the agent's modules take references to its functions.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import ctypes
import functools
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import types
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

# -- install -----------------------------------------------------------------------------------


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = HeaderParser().parsestr(z.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def install(wheels: Path, target: Path, report: Path) -> int:
    """Install the project's wheel, and for each requirement the machine's python does not already
    satisfy, the carried wheel (and, in turn, its own unmet requirements), with pip --no-index.

    The machine's own copy is kept wherever it fits the range pyproject allows: the check is of the
    agent as it would run there, and a second copy of, say, protobuf beside torch's helps nobody.
    """
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    carried: dict[str, tuple[str, Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        carried[canonicalize_name(name)] = (str(version), wheel)
    result: dict[str, Any] = {"python": sys.version.split()[0], "wheels": str(wheels), "packages": []}
    if "clusterhealth" not in carried:
        result.update(ok=False, error=f"no clusterhealth wheel in {wheels} (make gpu-check-carry builds it)")
        report.write_text(json.dumps(result, indent=1))
        return 1
    chosen = {"clusterhealth": carried["clusterhealth"][1]}
    queue = [Requirement(r) for r in _wheel_requirements(carried["clusterhealth"][1])]
    unmet = []
    while queue:
        req = queue.pop(0)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in chosen:
            continue
        try:
            have: str | None = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        entry = {"name": name, "wanted": str(req.specifier) or "any", "machine": have}
        if have is not None and req.specifier.contains(have, prereleases=True):
            result["packages"].append({**entry, "action": "the machine's"})
            continue
        version, wheel = carried.get(name, (None, None))
        if wheel is None or not req.specifier.contains(version, prereleases=True):
            unmet.append(name)
            result["packages"].append(
                {**entry, "action": f"MISSING: no carried wheel fits (carried: {version})"}
            )
            continue
        chosen[name] = wheel
        result["packages"].append({**entry, "action": f"carried {version}"})
        queue.extend(Requirement(r) for r in _wheel_requirements(wheel))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    pip += ["--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(target)]
    done = subprocess.run([*pip, *map(str, chosen.values())], capture_output=True, text=True)
    result["pip"] = {"rc": done.returncode, "stderr": done.stderr[-2000:]}
    probe = (
        "import json, importlib.metadata as m, clusterhealth.agent.cli as c; "
        "print(json.dumps({'file': c.__file__, 'version': m.version('clusterhealth')}))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    where = json.loads(imported.stdout) if imported.returncode == 0 else {"error": imported.stderr[-2000:]}
    result["imported"] = where
    # An older copy of the project on the machine's path must not be what runs.
    from_target = str(where.get("file", "")).startswith(str(target.resolve()))
    result["ok"] = done.returncode == 0 and from_target and not unmet
    result["command"] = str(target / "bin" / "clusterhealth")
    report.write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


# -- nvidia-smi -q -x --------------------------------------------------------------------------

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
# Tag suffixes nvidia-smi has given the clock-event reasons, against the agent's reason names.
_REASON_TAGS = {"display_clocks_setting": "display_clock_setting"}
# The throttle-time counters' tags (µs), against the agent's reason names.
_COUNTER_TAGS = {
    "sw_power_cap": "sw_power_cap",
    "sync_boost": "sync_boost",
    "sw_therm_slowdown": "sw_thermal_slowdown",
    "hw_therm_slowdown": "hw_thermal_slowdown",
    "hw_power_brake": "hw_power_brake_slowdown",
}


def _number(text: str | None) -> float | None:
    """The leading number of a value ("27 C", "67.03 W", "16x", "4000 KB/s"); None for N/A, "Not
    Supported", "Requested functionality has been deprecated" and the like."""
    m = _NUMBER.match(text or "")
    return float(m.group(1)) if m else None


def _text(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return None if value in ("", "N/A") else value


def _sum(node: ET.Element, paths: Iterable[str]) -> float | None:
    """The sum of the numbers at `paths` that the document has; None when it shows none of them."""
    values = [v for v in (_number(_text(node, p)) for p in paths) if v is not None]
    return sum(values) if values else None


def _yes(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() in ("yes", "active", "enabled")


def parse_smi(text: str) -> dict[str, Any]:
    """The values of an `nvidia-smi -q -x` document that the agent also exports (and a few it does
    not), per GPU, in the units the document uses. Reads the v12 and v13 schemas and the older
    `power_readings` / `clocks_throttle_reasons` / `single_bit` forms."""
    root = ET.fromstring(text)
    doc: dict[str, Any] = {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "gpus": [],
    }
    for gpu in root.findall("gpu"):
        g: dict[str, Any] = {
            "bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
            "name": _text(gpu, "product_name"),
            "architecture": _text(gpu, "product_architecture"),
            "uuid": _text(gpu, "uuid"),
            "serial": _text(gpu, "serial"),
            "vbios_version": _text(gpu, "vbios_version"),
            "minor_number": _number(_text(gpu, "minor_number")),
            "persistence_mode": _text(gpu, "persistence_mode"),
            "mig_mode": _text(gpu, "mig_mode/current_mig"),
            "ecc_mode": _text(gpu, "ecc_mode/current_ecc"),
            "compute_mode": _text(gpu, "compute_mode"),
            "recovery_action": _text(gpu, "gpu_recovery_action"),
            "fabric_state": _text(gpu, "fabric/state"),
            "temperature_gpu": _number(_text(gpu, "temperature/gpu_temp")),
            "temperature_memory": _number(_text(gpu, "temperature/memory_temp")),
            "power_average": _number(_text(gpu, "gpu_power_readings/average_power_draw")),
            "power_instant": _number(_text(gpu, "gpu_power_readings/instant_power_draw")),
            "power_draw": _number(
                _text(gpu, "gpu_power_readings/power_draw") or _text(gpu, "power_readings/power_draw")
            ),
            "power_limit": _number(
                _text(gpu, "gpu_power_readings/current_power_limit")
                or _text(gpu, "power_readings/enforced_power_limit")
            ),
            "sm_clock": _number(_text(gpu, "clocks/sm_clock")),
            "memory_clock": _number(_text(gpu, "clocks/mem_clock")),
            "sm_clock_max": _number(_text(gpu, "max_clocks/sm_clock")),
            "utilization": _number(_text(gpu, "utilization/gpu_util")),
            "memory_total": _number(_text(gpu, "fb_memory_usage/total")),
            "memory_used": _number(_text(gpu, "fb_memory_usage/used")),
            "memory_reserved": _number(_text(gpu, "fb_memory_usage/reserved")),
            "pcie_generation": _number(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "pcie_generation_max": _number(_text(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "pcie_width": _number(_text(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
            "pcie_width_max": _number(_text(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
            "pcie_replays": _number(_text(gpu, "pci/replay_counter")),
            "remapped_correctable": _number(_text(gpu, "remapped_rows/remapped_row_corr")),
            "remapped_uncorrectable": _number(_text(gpu, "remapped_rows/remapped_row_unc")),
            "remap_pending": _yes(_text(gpu, "remapped_rows/remapped_row_pending")),
            "remap_failed": _yes(_text(gpu, "remapped_rows/remapped_row_failure")),
        }
        state = _text(gpu, "performance_state")
        g["performance_state"] = int(state[1:]) if state and re.fullmatch(r"P\d+", state) else None
        for scope in ("volatile", "aggregate"):
            base = f"ecc_errors/{scope}"
            g[f"ecc_corrected_{scope}"] = _sum(
                gpu, [f"{base}/sram_correctable", f"{base}/dram_correctable", f"{base}/single_bit/total"]
            )
            g[f"ecc_uncorrected_{scope}"] = _sum(
                gpu,
                [
                    f"{base}/sram_uncorrectable",
                    f"{base}/sram_uncorrectable_parity",
                    f"{base}/sram_uncorrectable_secded",
                    f"{base}/dram_uncorrectable",
                    f"{base}/double_bit/total",
                ],
            )
        reasons: dict[str, bool] = {}
        for section in ("clocks_event_reasons", "clocks_throttle_reasons"):
            for child in gpu.findall(section + "/*"):
                name = child.tag.removeprefix("clocks_event_reason_").removeprefix("clocks_throttle_reason_")
                flag = _yes((child.text or "").strip() or None)
                if flag is not None and (child.text or "").strip() in ("Active", "Not Active"):
                    reasons[_REASON_TAGS.get(name, name)] = flag
        g["clocks_event_reasons"] = reasons
        counters: dict[str, float] = {}
        for child in gpu.findall("clocks_event_reasons_counters/*"):
            name = _COUNTER_TAGS.get(child.tag.removeprefix("clocks_event_reasons_counters_"))
            microseconds = _number(child.text)
            if name is not None and microseconds is not None:
                counters[name] = microseconds * 1e-6
        g["clocks_event_seconds"] = counters
        doc["gpus"].append(g)
    return doc


def normal_bus_id(bus_id: str | None) -> str | None:
    """`00000000:1B:00.0` whatever the case and the domain's width."""
    if not bus_id:
        return None
    parts = bus_id.strip().split(":")
    if len(parts) != 3:
        return bus_id.strip().upper()
    return f"{parts[0][-8:].zfill(8)}:{parts[1]}:{parts[2]}".upper()


# -- the simulated GPU built from a capture ------------------------------------------------------

# An H200 SXM as the simulator's GPU before a capture's values are laid over it: what nvidia-smi
# does not show (NVLink, GPM, the SRAM, repair and fabric calls) stays that of an H200. Memory and
# clocks are those seen on the lent H200 (device README's KINDS.md); the rest is the H100's.
H200_BASE: dict[str, Any] = {
    "name": "NVIDIA H200",
    "memory_total_mib": 143771,
    "sm_clock_max_mhz": 1980,
    "memory_clock_mhz": 3201,
    "power_limit_watts": 700.0,
    "gpm_supported": True,
    "nvlinks": 18,
}
# What the dry run's busy GPU does under bf16 matrix products: set by hand for the simulator (the
# real run measures it); only the direction of each change matters to the checks.
BUSY: dict[str, Any] = {
    "utilization": 1.0,
    "sm_active": 0.97,
    "sm_occupancy": 0.22,
    "tensor_active": 0.85,
    "dram_active": 0.35,
    "clocks_event_reasons": ["sw_power_cap"],
    "performance_state": 0,
}
# Scenario keys the simulator takes as integers (nvidia-smi's numbers are parsed as floats).
_INTEGER_KEYS = {
    "memory_total_mib",
    "memory_used_mib",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "memory_clock_mhz",
    "performance_state",
    "temperature_celsius",
    "pcie_generation",
    "pcie_generation_max",
    "pcie_width",
    "pcie_width_max",
    "pcie_replays",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    *(f"ecc_{kind}_{scope}" for kind in ("corrected", "uncorrected") for scope in ("volatile", "aggregate")),
}
_RECOVERY_NAMES = {
    "none": "none",
    "reset": "gpu_reset",
    "gpu reset": "gpu_reset",
    "reboot": "node_reboot",
    "node reboot": "node_reboot",
    "drain p2p": "drain_p2p",
    "drain and reset": "drain_and_reset",
}


def scenario_from_smi(doc: dict[str, Any], busy: bool = False) -> dict[str, Any]:
    """A simulator scenario (exporters/sim/scenario.py's format) whose GPUs answer NVML with the
    values `doc` (parse_smi) shows, each on an H200-like GPU; `busy`: as under bf16 matmuls."""
    cuda = doc.get("cuda_version") or "12.4"
    major, _, minor = cuda.partition(".")
    gpus = {}
    for i, g in enumerate(doc["gpus"]):
        state: dict[str, Any] = dict(H200_BASE)
        put = {
            "name": g["name"],
            "uuid": g["uuid"],
            "serial": g["serial"],
            "vbios_version": g["vbios_version"],
            "pci_bus_id": normal_bus_id(g["bus_id"]),
            "memory_total_mib": g["memory_total"],
            "memory_used_mib": g["memory_used"],
            "utilization": None if g["utilization"] is None else g["utilization"] / 100,
            "sm_clock_mhz": g["sm_clock"],
            "sm_clock_max_mhz": g["sm_clock_max"],
            "memory_clock_mhz": g["memory_clock"],
            "performance_state": g["performance_state"],
            "temperature_celsius": g["temperature_gpu"],
            "power_watts": g["power_average"] or g["power_draw"] or g["power_instant"],
            "power_limit_watts": g["power_limit"],
            "pcie_generation": g["pcie_generation"],
            "pcie_generation_max": g["pcie_generation_max"],
            "pcie_width": g["pcie_width"],
            "pcie_width_max": g["pcie_width_max"],
            "pcie_replays": g["pcie_replays"],
            "remapped_rows_correctable": g["remapped_correctable"],
            "remapped_rows_uncorrectable": g["remapped_uncorrectable"],
            "remap_pending": g["remap_pending"],
            "remap_failed": g["remap_failed"],
        }
        for scope in ("volatile", "aggregate"):
            put[f"ecc_corrected_{scope}"] = g[f"ecc_corrected_{scope}"]
            put[f"ecc_uncorrected_{scope}"] = g[f"ecc_uncorrected_{scope}"]
        for key, value in put.items():
            if value is not None:
                state[key] = int(value) if key in _INTEGER_KEYS else value
        memory = g["temperature_memory"]
        state["memory_temperature_celsius"] = None if memory is None else int(memory)
        state["clocks_event_reasons"] = [r for r, active in g["clocks_event_reasons"].items() if active]
        if g["clocks_event_seconds"]:
            state["clocks_event_seconds"] = g["clocks_event_seconds"]
        if g["recovery_action"] is not None:
            state["recovery_action"] = _RECOVERY_NAMES.get(g["recovery_action"].lower(), "none")
        fabric = (g["fabric_state"] or "").lower()
        state["fabric_supported"] = fabric not in ("", "not supported")
        if fabric in ("not started", "in progress", "completed"):
            state["fabric_state"] = fabric.replace(" ", "_")
        if busy:
            state.update(BUSY)
            state["sm_clock_mhz"] = state["sm_clock_max_mhz"]
            state["power_watts"] = round(0.9 * state["power_limit_watts"], 1)
            state["temperature_celsius"] = state.get("temperature_celsius", 30) + 25
            if state["memory_temperature_celsius"] is not None:
                state["memory_temperature_celsius"] += 20
            state["memory_used_mib"] = state.get("memory_used_mib", 0) + 2048
            # A later instant of the same node: the energy counter has moved on.
            state["energy_joules"] = 1.0e6 + 60 * state["power_watts"]
        gpus[i] = state
    return {
        "description": "H200-like GPUs with the values of an nvidia-smi -q -x capture"
        + (", busy" if busy else ""),
        "driver_version": doc.get("driver_version") or "550.90.07",
        "cuda_driver_version": int(major) * 1000 + int(minor or 0) * 10,
        "gpu_count": len(gpus),
        "gpus": gpus,
    }


# -- tracing pynvml ----------------------------------------------------------------------------


def _json_value(value: Any, depth: int = 0) -> Any:
    """An NVML answer as JSON: numbers and text as they are, a struct as its scalar fields."""
    if isinstance(value, ctypes._Pointer):
        return "handle"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, ctypes.Structure) and depth < 2:
        out = {}
        for field in value._fields_:
            name = field[0]
            item = getattr(value, name)
            if isinstance(item, ctypes.Array) and not isinstance(item, (bytes, str)):
                continue
            out[name] = _json_value(item, depth + 1)
        return out
    if type(value).__name__ == "nvmlFriendlyObject" and depth < 2:  # e.g. a compute process
        return {k: _json_value(v, depth + 1) for k, v in vars(value).items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v, depth + 1) for v in value[:8]] + (
            [f"... {len(value)} in all"] if len(value) > 8 else []
        )
    return type(value).__name__


def _address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


# Positional arguments shown by the name of the pynvml constant they hold, per call and position.
_ARGUMENT_NAMES = {
    "nvmlDeviceGetClockInfo": {1: "NVML_CLOCK_"},
    "nvmlDeviceGetMaxClockInfo": {1: "NVML_CLOCK_"},
    "nvmlDeviceGetTemperature": {1: "NVML_TEMPERATURE_"},
    "nvmlDeviceGetTotalEccErrors": {
        1: "NVML_MEMORY_ERROR_TYPE_",
        2: ("NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"),
    },
    "nvmlDeviceGetNvLinkErrorCounter": {2: "NVML_NVLINK_ERROR_DL_"},
    "nvmlDeviceRegisterEvents": {1: "nvmlEventTypeXid"},
}
# Calls with a link argument (position 1): one table row for all links.
_PER_LINK = ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter")


class Tracer:
    """Wraps every pynvml function so that each call the agent makes is recorded with its answer:
    the value (a struct as its fields), or the error pynvml raised. Only the outermost pynvml call
    is recorded (pynvml's functions call each other)."""

    def __init__(self) -> None:
        import pynvml

        self.pynvml = pynvml
        self.records: list[dict[str, Any]] = []
        self.enabled = True
        self.probing = False
        self._lock = threading.Lock()
        self._local = threading.local()
        self._gpus: dict[int, int] = {}  # handle address -> GPU index

    def install(self) -> None:
        for name in dir(self.pynvml):
            fn = getattr(self.pynvml, name)
            if name.startswith("nvml") and isinstance(fn, types.FunctionType):
                setattr(self.pynvml, name, self._wrap(name, fn))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False) or not self.enabled:
                return fn(*args, **kwargs)
            self._local.inside = True
            try:
                result = fn(*args, **kwargs)
            except self.pynvml.NVMLError as err:
                self._local.inside = False
                self._record(name, args, None, err)
                raise
            self._local.inside = False
            self._record(name, args, result, None)
            return result

        return traced

    def _gpu(self, args: Sequence[Any]) -> int:
        if args and isinstance(args[0], ctypes._Pointer):
            # -2: a pointer that is no GPU's handle (a MIG device, a GPM sample, an event set).
            return self._gpus.get(_address(args[0]) or 0, -2)
        return -1

    def _arguments(self, name: str, args: Sequence[Any]) -> list[Any]:
        shown: list[Any] = []
        hints = _ARGUMENT_NAMES.get(name, {})
        for i, arg in enumerate(args):
            if i == 0 and isinstance(arg, ctypes._Pointer):
                continue
            if isinstance(arg, int) and i in hints:
                prefixes = hints[i] if isinstance(hints[i], tuple) else (hints[i],)
                names = [
                    n
                    for n in dir(self.pynvml)
                    if n.startswith(prefixes) and getattr(self.pynvml, n) == arg and "COUNT" not in n
                ]
                shown.append(min(names, key=len) if names else arg)
            elif isinstance(arg, (int, str)):
                shown.append(arg)
            elif isinstance(arg, list):
                shown.append(f"[{len(arg)} ids]")
            elif hasattr(arg, "_obj"):  # byref(struct)
                shown.append(f"&{type(arg._obj).__name__.removeprefix('c_')}")
            else:
                shown.append(type(arg).__name__.removeprefix("LP_struct_").removeprefix("c_"))
        return shown

    def _record(self, name: str, args: Sequence[Any], result: Any, err: Exception | None) -> None:
        p = self.pynvml
        if name.startswith("nvmlDeviceGetHandleByIndex") and err is None and args:
            self._gpus[_address(result) or 0] = int(args[0])
        gpu = int(args[0]) if name.startswith("nvmlDeviceGetHandleByIndex") else self._gpu(args)
        record: dict[str, Any] = {
            "call": name,
            "gpu": gpu,
            "args": self._arguments(name, args),
            "probe": self.probing,
        }
        if err is not None:
            record["error"] = type(err).__name__.removeprefix("NVMLError_")
            if type(err) is p.NVMLError:
                record["error"] = f"error {getattr(err, 'value', '?')}"
        else:
            value = result
            # Calls that fill a struct passed by reference answer only a return code.
            for arg in args:
                if hasattr(arg, "_obj") and isinstance(arg._obj, ctypes.Structure):
                    value = arg._obj
            record["value"] = _json_value(value)
        if name == "nvmlDeviceGetFieldValues" and err is None:
            record["items"] = [self._field(v) for v in result]
            record["value"] = f"{len(record['items'])} fields"
        if name == "nvmlGpmMetricsGet" and err is None:
            record["items"] = [
                {
                    "id": int(result.metrics[i].metricId),
                    **(
                        {"value": float(result.metrics[i].value)}
                        if result.metrics[i].nvmlReturn == p.NVML_SUCCESS
                        else {"error": self._error_name(result.metrics[i].nvmlReturn)}
                    ),
                }
                for i in range(result.numMetrics)
            ]
            record["value"] = f"{result.numMetrics} metrics"
        with self._lock:
            self.records.append(record)

    def _error_name(self, code: int) -> str:
        cls = self.pynvml.NVMLError._valClassMapping.get(code)
        return cls.__name__.removeprefix("NVMLError_") if cls is not None else f"error {code}"

    def _field(self, answer: Any) -> dict[str, Any]:
        p = self.pynvml
        out: dict[str, Any] = {"id": int(answer.fieldId)}
        if answer.nvmlReturn != p.NVML_SUCCESS:
            out["error"] = self._error_name(answer.nvmlReturn)
            return out
        members = {
            p.NVML_VALUE_TYPE_DOUBLE: "dVal",
            p.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            p.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            p.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            p.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            p.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }
        member = members.get(answer.valueType)
        out["value"] = getattr(answer.value, member) if member else f"value type {answer.valueType}"
        return out


def static_calls(package_dirs: Iterable[Path]) -> dict[str, list[str]]:
    """Every pynvml function the agent's code names (`pynvml.nvmlX`, or `"nvmlX"` where a release
    may lack it: `optional("nvmlX", ...)`, `getattr(pynvml, "nvmlX")`, and the call labels the
    error policy counts under), by the files that name it. The simulator is left out: it answers
    NVML, it does not call it."""
    import pynvml

    # Functions only: pynvml also has classes and constants spelled like calls (nvmlFriendlyObject).
    functions = {
        n for n in dir(pynvml) if n.startswith("nvml") and isinstance(getattr(pynvml, n), types.FunctionType)
    }
    found: dict[str, set[str]] = {}
    for folder in package_dirs:
        for path in sorted(folder.rglob("*.py")):
            if "sim" in path.relative_to(folder).parts:
                continue
            tree = ast.parse(path.read_text())
            where = f"{folder.name}/{path.relative_to(folder)}"
            for node in ast.walk(tree):
                name = None
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    if node.value.id == "pynvml" and node.attr in functions:
                        name = node.attr
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                    first = node.args[0]
                    if node.func.id == "optional" and isinstance(first, ast.Constant):
                        # A call this nvidia-ml-py may lack (then it is not in `functions`).
                        text = str(first.value)
                        if text.startswith("nvml") and (text in functions or not hasattr(pynvml, text)):
                            name = text
                elif isinstance(node, ast.Constant) and node.value in functions:
                    name = str(node.value)
                if name is not None:
                    found.setdefault(name, set()).add(where)
    return {name: sorted(files) for name, files in sorted(found.items())}


def _probes(pynvml: Any, handle: Any) -> dict[str, Callable[[], Any]]:
    """Direct calls for what the agent calls only in some states (MIG on, an old driver, a GPU
    waiting for a reset): each made once, as the agent would make it."""
    return {
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(
            handle
        ),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(
            handle
        ),
        "nvmlDeviceGetMigMode": lambda: pynvml.nvmlDeviceGetMigMode(handle),
        "nvmlDeviceGetMaxMigDeviceCount": lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(handle),
        "nvmlDeviceGetMigDeviceHandleByIndex": lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0),
        "nvmlDeviceGetGpuInstanceId": lambda: pynvml.nvmlDeviceGetGpuInstanceId(handle),
        "nvmlGpmQueryDeviceSupport": lambda: pynvml.nvmlGpmQueryDeviceSupport(handle),
        "nvmlDeviceGetNvLinkState": lambda: pynvml.nvmlDeviceGetNvLinkState(handle, 0),
        "nvmlSystemGetCudaDriverVersion_v2": lambda: pynvml.nvmlSystemGetCudaDriverVersion_v2(),
    }


def nvml_table(phase: str, out: Path, cli: Sequence[str]) -> int:
    tracer = Tracer()
    tracer.install()
    import pynvml

    from clusterhealth.agent.cli import main
    from clusterhealth.exporters import gpu as gpu_module
    from clusterhealth.exporters.nvml import PYNVML_VERSION

    written = io.BytesIO()
    exposition = io.TextIOWrapper(written, encoding="utf-8")
    with contextlib.redirect_stdout(exposition):
        rc = main(["scrape", *cli])
    exposition.flush()
    tracer.enabled = False
    packages = [Path(m.__path__[0]) for m in _packages()]
    static = static_calls(packages)
    versions: dict[str, Any] = {"nvidia-ml-py": PYNVML_VERSION}
    try:
        _versions_and_probes(tracer, static, versions)
    except pynvml.NVMLError as err:
        # The table still says what the scrape's calls answered; the versions say why no more.
        versions.setdefault("driver", type(err).__name__.removeprefix("NVMLError_"))
    tracer.enabled = False
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()
    result = {
        "phase": phase,
        "scrape_rc": rc,
        "versions": versions,
        "records": tracer.records,
        "static_calls": static,
        # Names the code reads through `optional` that this nvidia-ml-py lacks: the agent leaves
        # them out (exporters/nvml.py), so they are not made.
        "missing_in_pynvml": sorted(c for c in static if not hasattr(pynvml, c)),
        "fields": {str(k): v for k, v in gpu_module.FIELDS.items()},
        "gpm_metrics": {
            str(mid): gpu_module.GPM_METRIC_NAMES.get(mid, str(mid)) for _, mid, _ in gpu_module.GPM_METRICS
        },
        "gpm_families": {
            "clusterhealth_gpu_" + attr: gpu_module.GPM_METRIC_NAMES.get(mid, str(mid))
            for attr, mid, _ in gpu_module.GPM_METRICS
        },
        "exposition_bytes": len(written.getvalue()),
    }
    out.write_text(json.dumps(result, indent=1))
    return 0


def _versions_and_probes(tracer: Tracer, static: dict[str, list[str]], versions: dict[str, Any]) -> None:
    """The driver's, NVML's and CUDA's versions, and the calls and fields the code names that the
    scrape did not make, made once directly (and recorded as probes)."""
    import pynvml

    from clusterhealth.exporters import gpu as gpu_module

    traced = {r["call"] for r in tracer.records}
    pynvml.nvmlInit()
    for key, call in (
        ("driver", pynvml.nvmlSystemGetDriverVersion),
        ("nvml", pynvml.nvmlSystemGetNVMLVersion),
        ("cuda", pynvml.nvmlSystemGetCudaDriverVersion_v2),
    ):
        try:
            versions[key] = _json_value(call())
        except pynvml.NVMLError as err:
            versions[key] = type(err).__name__.removeprefix("NVMLError_")
    if isinstance(versions.get("cuda"), int):
        versions["cuda"] = f"{versions['cuda'] // 1000}.{versions['cuda'] % 1000 // 10}"
    if pynvml.nvmlDeviceGetCount() == 0:
        return
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    tracer._gpus[_address(handle) or 0] = 0
    versions["gpu"] = _json_value(pynvml.nvmlDeviceGetName(handle))
    tracer.enabled, tracer.probing = True, True
    for name, call in _probes(pynvml, handle).items():
        if name in static and name not in traced and hasattr(pynvml, name):
            with contextlib.suppress(pynvml.NVMLError):
                call()
    fields_read = {
        i["id"] for r in tracer.records if r["call"] == "nvmlDeviceGetFieldValues" for i in r.get("items", [])
    }
    for field_id in gpu_module.FIELDS:
        if field_id not in fields_read:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlDeviceGetFieldValues(handle, [field_id])


def _packages() -> list[types.ModuleType]:
    import clusterhealth.agent
    import clusterhealth.checks
    import clusterhealth.exporters

    return [clusterhealth.agent, clusterhealth.exporters, clusterhealth.checks]


# -- load ----------------------------------------------------------------------------------------


def load(seconds: float, ready: Path, report: Path) -> int:
    """bf16 8192³ matrix products for `seconds` (after a warm-up), saying when they have started."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        c = a @ b
    torch.cuda.synchronize()
    info = {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
    }
    ready.write_text(json.dumps(info))
    products, start, said = 0, time.monotonic(), 0.0
    while time.monotonic() - start < seconds:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        products += 20
        elapsed = time.monotonic() - start
        if elapsed - said < 1:
            continue
        said = elapsed
        report.write_text(
            json.dumps(
                {
                    **info,
                    "products": products,
                    "seconds": elapsed,
                    "tflops": products * 2 * 8192**3 / elapsed / 1e12,
                }
            )
        )
    del c
    return 0


# -- analyze -------------------------------------------------------------------------------------

PASS, FAIL, SKIP, INFO = "PASS", "FAIL", "SKIP", "INFO"


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        families[name] = [
            (dict(s.labels), float(s.value)) for s in family.samples if s.name in (name, family.name)
        ]
    return families


def agent_gpus(families: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, dict[str, Any]]:
    """The agent's values per GPU index, in nvidia-smi's units, named as parse_smi names them."""
    gpus: dict[str, dict[str, Any]] = {}

    def each(name: str, **match: str) -> Iterable[tuple[str, float, dict[str, str]]]:
        for labels, value in families.get(name, []):
            if all(labels.get(k) == v for k, v in match.items()):
                yield labels["gpu"], value, labels

    for labels, _ in families.get("clusterhealth_gpu_info", []):
        gpus.setdefault(labels["gpu"], {}).update(
            uuid=labels["uuid"],
            name=labels["name"],
            serial=labels["serial"] or None,
            vbios_version=labels["vbios_version"],
            bus_id=normal_bus_id(labels["pci_bus_id"]),
        )
    scalar = {
        "temperature_gpu": ("clusterhealth_gpu_temperature_celsius", {"sensor": "gpu"}, 1),
        "temperature_memory": ("clusterhealth_gpu_temperature_celsius", {"sensor": "memory"}, 1),
        "power": ("clusterhealth_gpu_power_watts", {}, 1),
        "power_limit": ("clusterhealth_gpu_power_limit_watts", {}, 1),
        "sm_clock": ("clusterhealth_gpu_sm_clock_hertz", {}, 1e-6),
        "memory_clock": ("clusterhealth_gpu_memory_clock_hertz", {}, 1e-6),
        "sm_clock_max": ("clusterhealth_gpu_sm_clock_max_hertz", {}, 1e-6),
        "utilization": ("clusterhealth_gpu_utilization_ratio", {}, 100),
        "memory_total": ("clusterhealth_gpu_memory_total_bytes", {}, 1 / 2**20),
        "memory_used": ("clusterhealth_gpu_memory_used_bytes", {}, 1 / 2**20),
        "performance_state": ("clusterhealth_gpu_performance_state", {}, 1),
        "pcie_generation": ("clusterhealth_gpu_pcie_link_generation", {}, 1),
        "pcie_generation_max": ("clusterhealth_gpu_pcie_link_generation_max", {}, 1),
        "pcie_width": ("clusterhealth_gpu_pcie_link_width", {}, 1),
        "pcie_width_max": ("clusterhealth_gpu_pcie_link_width_max", {}, 1),
        "pcie_replays": ("clusterhealth_gpu_pcie_replay_errors_total", {}, 1),
        "remapped_correctable": ("clusterhealth_gpu_remapped_rows", {"cause": "correctable"}, 1),
        "remapped_uncorrectable": ("clusterhealth_gpu_remapped_rows", {"cause": "uncorrectable"}, 1),
        "remap_pending": ("clusterhealth_gpu_row_remap_pending", {}, 1),
        "remap_failed": ("clusterhealth_gpu_row_remap_failed", {}, 1),
        "energy": ("clusterhealth_gpu_energy_joules_total", {}, 1),
        "fabric_degraded": ("clusterhealth_gpu_fabric_degraded", {}, 1),
    }
    for scope in ("volatile", "aggregate"):
        for kind in ("corrected", "uncorrected"):
            scalar[f"ecc_{kind}_{scope}"] = (
                "clusterhealth_gpu_ecc_errors_total",
                {"error": kind, "scope": scope},
                1,
            )
    for key, (family, match, factor) in scalar.items():
        for gpu, value, _ in each(family, **match):
            gpus.setdefault(gpu, {})[key] = value * factor
    for family in families:
        if family.endswith("_ratio") and family.startswith("clusterhealth_gpu_"):
            for gpu, value, _ in each(family):
                gpus.setdefault(gpu, {})[family.removeprefix("clusterhealth_gpu_")] = value
    for gpu, value, labels in each("clusterhealth_gpu_clocks_event_active"):
        gpus.setdefault(gpu, {}).setdefault("clocks_event_reasons", {})[labels["reason"]] = bool(value)
    for gpu, value, labels in each("clusterhealth_gpu_clocks_event_seconds_total"):
        gpus.setdefault(gpu, {}).setdefault("clocks_event_seconds", {})[labels["reason"]] = value
    for gpu, _, labels in each("clusterhealth_gpu_recovery_action"):
        gpus.setdefault(gpu, {})["recovery_action"] = labels["action"]
    driver = families.get("clusterhealth_gpu_driver_info", [])
    for gpu in gpus.values():
        if driver:
            gpu["driver_version"] = driver[0][0]["driver_version"]
            gpu["cuda_version"] = driver[0][0]["cuda_driver_version"]
    return gpus


# What the agent and nvidia-smi both show: (item, the agent's key, nvidia-smi's keys (the first it
# shows), absolute tolerance, relative tolerance). nvidia-smi is read before and after the agent,
# and a value agrees when it lies within the two readings' span, widened by the tolerance.
NUMERIC = (
    ("GPU temperature (C)", "temperature_gpu", ("temperature_gpu",), 2, 0),
    ("memory temperature (C)", "temperature_memory", ("temperature_memory",), 2, 0),
    # NVML's power usage is a 1 s average on Ampere and newer (GA100 excepted): nvidia-smi's
    # average_power_draw where it shows one, else its power_draw, else the instant reading.
    ("power draw (W)", "power", ("power_average", "power_draw", "power_instant"), 15, 0.10),
    ("enforced power limit (W)", "power_limit", ("power_limit",), 0.5, 0),
    ("SM clock (MHz)", "sm_clock", ("sm_clock",), 30, 0.05),
    ("memory clock (MHz)", "memory_clock", ("memory_clock",), 10, 0.02),
    ("max SM clock (MHz)", "sm_clock_max", ("sm_clock_max",), 1, 0),
    ("GPU utilization (%)", "utilization", ("utilization",), 15, 0),
    ("memory total (MiB)", "memory_total", ("memory_total",), 2, 0),
    ("performance state (P)", "performance_state", ("performance_state",), 0, 0),
    ("PCIe generation", "pcie_generation", ("pcie_generation",), 0, 0),
    ("PCIe max generation", "pcie_generation_max", ("pcie_generation_max",), 0, 0),
    ("PCIe width (lanes)", "pcie_width", ("pcie_width",), 0, 0),
    ("PCIe max width (lanes)", "pcie_width_max", ("pcie_width_max",), 0, 0),
    ("PCIe replays", "pcie_replays", ("pcie_replays",), 0, 0),
    ("ECC corrected, volatile", "ecc_corrected_volatile", ("ecc_corrected_volatile",), 0, 0),
    ("ECC uncorrected, volatile", "ecc_uncorrected_volatile", ("ecc_uncorrected_volatile",), 0, 0),
    ("ECC corrected, aggregate", "ecc_corrected_aggregate", ("ecc_corrected_aggregate",), 0, 0),
    ("ECC uncorrected, aggregate", "ecc_uncorrected_aggregate", ("ecc_uncorrected_aggregate",), 0, 0),
    ("remapped rows, correctable", "remapped_correctable", ("remapped_correctable",), 0, 0),
    ("remapped rows, uncorrectable", "remapped_uncorrectable", ("remapped_uncorrectable",), 0, 0),
    ("row remap pending", "remap_pending", ("remap_pending",), 0, 0),
    ("row remap failed", "remap_failed", ("remap_failed",), 0, 0),
)
TEXT = (
    ("name", "name"),
    ("UUID", "uuid"),
    ("serial", "serial"),
    ("VBIOS", "vbios_version"),
    ("driver version", "driver_version"),
    ("CUDA version", "cuda_version"),
)
# Shown by nvidia-smi, not exported by the agent: recorded beside the comparisons.
SMI_ONLY = ("persistence_mode", "mig_mode", "ecc_mode", "compute_mode", "architecture", "minor_number")


def _span(samples: Sequence[dict[str, Any]], keys: Sequence[str]) -> tuple[float, float] | None:
    values = []
    for key in keys:
        values = [float(s[key]) for s in samples if s.get(key) is not None]
        if values:
            break
    return (min(values), max(values)) if values else None


def compare(
    agent: dict[str, Any], smi: Sequence[dict[str, Any]], phase: str, gpu: str
) -> list[dict[str, Any]]:
    """One GPU's values as the agent exported them against nvidia-smi's readings taken around it."""
    out: list[dict[str, Any]] = []

    def row(item: str, verdict: str, agent_value: Any, smi_value: Any, detail: str = "") -> None:
        out.append(
            {
                "phase": phase,
                "gpu": gpu,
                "item": item,
                "verdict": verdict,
                "agent": agent_value,
                "smi": smi_value,
                "detail": detail,
            }
        )

    for item, key, smi_keys, absolute, relative in NUMERIC:
        mine, span = agent.get(key), _span(smi, smi_keys)
        if mine is not None and isinstance(mine, bool):
            mine = float(mine)
        if span is None and mine is None:
            row(item, INFO, None, None, "neither shows it")
        elif span is None:
            row(item, INFO, mine, None, "nvidia-smi does not show it")
        elif mine is None:
            row(item, FAIL, None, span[0], "the agent does not export it")
        else:
            tolerance = max(absolute, relative * max(abs(span[0]), abs(span[1])))
            shown = span[0] if span[0] == span[1] else f"{span[0]:g}–{span[1]:g}"
            ok = span[0] - tolerance <= mine <= span[1] + tolerance
            row(item, PASS if ok else FAIL, round(mine, 3), shown, f"± {tolerance:g}")
    # The agent's used memory is NVML's version-1 answer, which counts the driver's reservation
    # that nvidia-smi shows apart (`reserved`).
    used = _span(smi, ("memory_used",))
    reserved = _span(smi, ("memory_reserved",))
    mine = agent.get("memory_used")
    if used is not None and mine is not None:
        top = used[1] + (reserved[1] if reserved else 0)
        ok = used[0] - 64 <= mine <= top + 64
        row(
            "memory used (MiB)",
            PASS if ok else FAIL,
            round(mine, 1),
            f"{used[0]:g}–{top:g}",
            "used to used+reserved, ± 64",
        )
    for item, key in TEXT:
        theirs = {s.get(key) for s in smi if s.get(key) is not None}
        mine = agent.get(key)
        if not theirs:
            row(item, INFO, mine, None, "nvidia-smi does not show it")
        elif mine is None:
            row(item, FAIL, None, sorted(theirs)[0], "the agent does not export it")
        else:
            ok = str(mine).lower() in {str(t).lower() for t in theirs}
            row(item, PASS if ok else FAIL, mine, sorted(theirs)[0])
    reasons = agent.get("clocks_event_reasons", {})
    for reason in sorted({r for s in smi for r in s.get("clocks_event_reasons", {})} | set(reasons)):
        theirs = {
            s["clocks_event_reasons"][reason] for s in smi if reason in s.get("clocks_event_reasons", {})
        }
        mine = reasons.get(reason)
        if not theirs or mine is None:
            row(f"clock event {reason}", INFO, mine, None, "shown by one side only")
        else:
            row(f"clock event {reason}", PASS if mine in theirs else FAIL, mine, sorted(theirs))
    held = agent.get("clocks_event_seconds", {})
    for reason, seconds in sorted(held.items()):
        span = _span([s.get("clocks_event_seconds", {}) for s in smi], (reason,))
        if span is None:
            row(
                f"clock event time {reason} (s)", INFO, round(seconds, 3), None, "nvidia-smi does not show it"
            )
        else:
            ok = span[0] - 1 <= seconds <= span[1] + 1
            row(
                f"clock event time {reason} (s)",
                PASS if ok else FAIL,
                round(seconds, 3),
                f"{span[0]:g}–{span[1]:g}",
                "± 1",
            )
    theirs = {(s.get("recovery_action") or "").lower() for s in smi if s.get("recovery_action")}
    mine = agent.get("recovery_action")
    if theirs:
        expected = {_RECOVERY_NAMES.get(t, t.replace(" ", "_")) for t in theirs}
        row("recovery action", PASS if mine in expected else FAIL, mine, sorted(theirs)[0])
    states = {(s.get("fabric_state") or "n/a").lower() for s in smi}
    registered = "completed" in states
    exported = agent.get("fabric_degraded") is not None
    row(
        "fabric health exported iff registered",
        PASS if registered == exported else FAIL,
        agent.get("fabric_degraded"),
        sorted(states)[0],
    )
    for key in SMI_ONLY:
        values = {str(s.get(key)) for s in smi if s.get(key) is not None}
        if values:
            row(key.replace("_", " "), INFO, None, sorted(values)[0], "nvidia-smi only")
    return out


# The NVML answers each GPU family is made from: `call:` a function, `field:` a field value,
# `gpm:` a GPM metric; `none:` a family that is absent when nothing happened. Drawn from
# exporters/gpu.py and exporters/nvml_health.py (tests/test_gpu_check.py checks that every GPU
# family of the golden exposition has an entry).
SOURCES: dict[str, tuple[str, ...]] = {
    "clusterhealth_gpu_up": ("call:nvmlDeviceGetUUID",),
    "clusterhealth_gpu_info": ("call:nvmlDeviceGetName",),
    "clusterhealth_gpu_driver_info": ("call:nvmlSystemGetDriverVersion",),
    "clusterhealth_gpu_utilization_ratio": ("call:nvmlDeviceGetUtilizationRates",),
    "clusterhealth_gpu_memory_used_bytes": ("call:nvmlDeviceGetMemoryInfo",),
    "clusterhealth_gpu_memory_total_bytes": ("call:nvmlDeviceGetMemoryInfo",),
    "clusterhealth_gpu_sm_clock_hertz": ("call:nvmlDeviceGetClockInfo",),
    "clusterhealth_gpu_memory_clock_hertz": ("call:nvmlDeviceGetClockInfo",),
    "clusterhealth_gpu_sm_clock_max_hertz": ("call:nvmlDeviceGetMaxClockInfo",),
    "clusterhealth_gpu_clocks_event_active": ("call:nvmlDeviceGetCurrentClocksEventReasons",),
    "clusterhealth_gpu_clocks_event_seconds_total": (
        "field:NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
        "field:NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
        "field:NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
        "field:NVML_FI_DEV_PERF_POLICY_THERMAL",
    ),
    "clusterhealth_gpu_performance_state": ("call:nvmlDeviceGetPerformanceState",),
    "clusterhealth_gpu_temperature_celsius": ("call:nvmlDeviceGetTemperature",),
    "clusterhealth_gpu_power_watts": ("call:nvmlDeviceGetPowerUsage",),
    "clusterhealth_gpu_power_limit_watts": ("call:nvmlDeviceGetEnforcedPowerLimit",),
    "clusterhealth_gpu_energy_joules_total": ("call:nvmlDeviceGetTotalEnergyConsumption",),
    "clusterhealth_gpu_ecc_errors_total": ("call:nvmlDeviceGetTotalEccErrors",),
    "clusterhealth_gpu_remapped_rows": ("call:nvmlDeviceGetRemappedRows",),
    "clusterhealth_gpu_row_remap_pending": ("call:nvmlDeviceGetRemappedRows",),
    "clusterhealth_gpu_row_remap_failed": ("call:nvmlDeviceGetRemappedRows",),
    "clusterhealth_gpu_pcie_link_generation": ("call:nvmlDeviceGetCurrPcieLinkGeneration",),
    "clusterhealth_gpu_pcie_link_generation_max": ("call:nvmlDeviceGetMaxPcieLinkGeneration",),
    "clusterhealth_gpu_pcie_link_width": ("call:nvmlDeviceGetCurrPcieLinkWidth",),
    "clusterhealth_gpu_pcie_link_width_max": ("call:nvmlDeviceGetMaxPcieLinkWidth",),
    "clusterhealth_gpu_pcie_replay_errors_total": ("call:nvmlDeviceGetPcieReplayCounter",),
    "clusterhealth_gpu_nvlink_links_down": ("call:nvmlDeviceGetNvLinkState",),
    "clusterhealth_gpu_nvlink_up": ("call:nvmlDeviceGetNvLinkState",),
    "clusterhealth_gpu_nvlink_errors_total": (
        "call:nvmlDeviceGetNvLinkState",
        "call:nvmlDeviceGetNvLinkErrorCounter",
    ),
    "clusterhealth_gpu_nvlink_link_errors_total": (
        "call:nvmlDeviceGetNvLinkState",
        "call:nvmlDeviceGetNvLinkErrorCounter",
    ),
    "clusterhealth_gpu_nvlink_rate_bytes_per_second": (
        "call:nvmlDeviceGetNvLinkState",
        "field:NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON",
    ),
    "clusterhealth_gpu_recovery_action": ("field:NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",),
    "clusterhealth_gpu_sram_ecc_threshold_exceeded": ("call:nvmlDeviceGetSramEccErrorStatus",),
    "clusterhealth_gpu_repair_pending": ("call:nvmlDeviceGetRepairStatus",),
    "clusterhealth_gpu_memory_unrepairable": ("call:nvmlDeviceGetUnrepairableMemoryFlag_v1",),
    "clusterhealth_gpu_fabric_degraded": ("call:nvmlDeviceGetGpuFabricInfoV",),
    "clusterhealth_gpu_xid_errors_total": ("none:no Xid event happened",),
    "clusterhealth_gpu_nvml_errors_total": ("none:no NVML call failed unexpectedly",),
    "clusterhealth_gpu_job_info": ("none:no job runs on the GPU",),
    "clusterhealth_gpu_job_conflicting_gpus": ("none:the jobs collector found no sources",),
    "clusterhealth_gpu_job_source_success": ("none:the jobs collector found no sources",),
    "clusterhealth_gpu_job_unattributed_busy_gpus": ("none:the jobs collector found no sources",),
    "clusterhealth_gpu_job_mapping_expired_files": ("none:no job-mapping file expired",),
}


def _outcomes(trace: dict[str, Any], source: str, gpu: int = 0) -> list[tuple[str | None, Any]]:
    """What NVML answered for one source of a family on one GPU: (error name or None, value)."""
    kind, _, name = source.partition(":")
    answers: list[tuple[str | None, Any]] = []
    for record in trace.get("records", []):
        if record["gpu"] not in (gpu, -1):
            continue
        if kind == "call" and record["call"] == name:
            answers.append((record.get("error"), record.get("value")))
            continue
        table = {"field": ("nvmlDeviceGetFieldValues", "fields"), "gpm": ("nvmlGpmMetricsGet", "gpm_metrics")}
        if kind in table and record["call"] == table[kind][0]:
            wanted = {int(i) for i, n in trace.get(table[kind][1], {}).items() if n == name}
            answers += [
                (i.get("error"), i.get("value")) for i in record.get("items", []) if i["id"] in wanted
            ]
    return answers


def explain_absence(family: str, trace: dict[str, Any]) -> tuple[str, str]:
    """Why a family the simulator exports is absent on the real GPU: (verdict, reason). Knowingly
    absent when the NVML answer it is made from was an error, or says there is nothing to report."""
    sources = SOURCES.get(family)
    if sources is None and family in trace.get("gpm_families", {}):
        sources = ("call:nvmlGpmQueryDeviceSupport", f"gpm:{trace['gpm_families'][family]}")
    if sources is None:
        return FAIL, "absent, and no NVML source is known for it (benchmarks/gpu_check.py SOURCES)"
    reasons = []
    for source in sources:
        kind, _, name = source.partition(":")
        if kind == "none":
            return PASS, f"knowingly absent: {name}"
        answers = _outcomes(trace, source)
        errors = sorted({error for error, _ in answers if error})
        values = [value for error, value in answers if not error]
        if errors:
            return PASS, f"knowingly absent: {name} answered {', '.join(errors)}"
        if name == "nvmlGpmQueryDeviceSupport" and any(
            isinstance(v, dict) and not v.get("isSupportedDevice") for v in values
        ):
            return PASS, "knowingly absent: nvmlGpmQueryDeviceSupport says the GPU has no GPM"
        completed = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
        if name == "nvmlDeviceGetGpuFabricInfoV" and any(
            isinstance(v, dict) and v.get("state") != completed for v in values
        ):
            return (
                PASS,
                "knowingly absent: the GPU's fabric registration has not completed (no fabric manager)",
            )
        reasons.append(f"{name} answered {_short(values[0])}" if values else f"{name} was not called")
    return FAIL, "absent although " + "; ".join(reasons)


def _families(text: str) -> set[str]:
    return {f for f in parse_exposition(text) if f.startswith("clusterhealth_gpu_")}


def _item(items: list[dict[str, Any]], group: str, name: str, verdict: str, detail: str = "") -> None:
    items.append({"group": group, "item": name, "verdict": verdict, "detail": detail})


def _read(path: Path) -> str | None:
    return path.read_text(errors="replace") if path.is_file() and path.stat().st_size else None


def _json(path: Path) -> Any:
    text = _read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def rise_and_plausibility(idle: dict[str, Any], busy: dict[str, Any], items: list[dict[str, Any]]) -> None:
    """Under load the GPM activity, utilization and power rise; clocks, power and temperatures
    stay within what the hardware can show."""

    def check(group: str, name: str, ok: bool | None, detail: str) -> None:
        _item(items, group, name, SKIP if ok is None else PASS if ok else FAIL, detail)

    def pair(key: str) -> tuple[float | None, float | None]:
        return idle.get(key), busy.get(key)

    rises = (
        ("sm_active_ratio", lambda a, b: b >= 0.5 and b - a >= 0.3, "≥ 0.5 and up by ≥ 0.3"),
        ("sm_occupancy_ratio", lambda a, b: b > a + 0.05, "up by > 0.05"),
        (
            "tensor_active_ratio",
            lambda a, b: b >= 0.2 and b > a + 0.1,
            "≥ 0.2 and up by > 0.1 (bf16 runs on the tensor cores)",
        ),
        ("dram_active_ratio", lambda a, b: b > a, "up"),
        ("utilization", lambda a, b: b >= 90, "≥ 90 %"),
        ("power", lambda a, b: b >= a + 50, "up by ≥ 50 W"),
        ("memory_used", lambda a, b: b >= a + 256, "up by ≥ 256 MiB (the products' matrices)"),
        ("energy", lambda a, b: b > a, "the counter moved on"),
    )
    for key, rule, text in rises:
        a, b = pair(key)
        check(
            "under load",
            f"{key} rises",
            None if a is None or b is None else rule(a, b),
            f"idle {a}, load {b}: {text}",
        )
    for phase, values in (("idle", idle), ("load", busy)):
        sm, top = values.get("sm_clock"), values.get("sm_clock_max")
        check(
            "plausible",
            f"{phase}: SM clock ≤ max",
            None if sm is None or top is None else sm <= top * 1.01,
            f"{sm} of {top} MHz",
        )
        power, limit = values.get("power"), values.get("power_limit")
        check(
            "plausible",
            f"{phase}: 0 < power ≤ limit",
            None if power is None or limit is None else 0 < power <= limit * 1.05,
            f"{power} of {limit} W",
        )
        t = values.get("temperature_gpu")
        check("plausible", f"{phase}: GPU temperature 5–95 C", None if t is None else 5 <= t <= 95, f"{t} C")
        t = values.get("temperature_memory")
        check(
            "plausible",
            f"{phase}: memory temperature 5–105 C",
            None if t is None else 5 <= t <= 105,
            f"{t} C",
        )
        mem = values.get("memory_clock")
        check("plausible", f"{phase}: memory clock > 0", None if mem is None else mem > 0, f"{mem} MHz")
        for what in ("pcie_generation", "pcie_width"):
            now, most = values.get(what), values.get(what + "_max")
            check(
                "plausible",
                f"{phase}: {what} ≤ max",
                None if now is None or most is None else now <= most,
                f"{now} of {most}",
            )
    sm, top = busy.get("sm_clock"), busy.get("sm_clock_max")
    check(
        "under load",
        "SM clock ≥ half its max",
        None if sm is None or top is None else sm >= top / 2,
        f"{sm} of {top} MHz",
    )


def nvml_rows(
    idle: dict[str, Any] | None, busy: dict[str, Any] | None
) -> tuple[list[list[str]], Counter[str]]:
    """The NVML table: one row per call and arguments (links folded into one row), per field, per
    GPM metric, with GPU 0's answer idle and under load; and a count of the idle answers by kind
    (answered, an error's name, not called)."""

    def key_of(record: dict[str, Any]) -> tuple[str, str]:
        args = list(record["args"])
        if record["call"] in _PER_LINK and args:
            args[0] = "link"
        where = {-1: "system", -2: "no GPU handle"}.get(record["gpu"], "")
        return record["call"], ", ".join(map(str, args)) + (f" ({where})" if where else "")

    def fold(records: list[dict[str, Any]]) -> tuple[str, str]:
        answers: dict[str, list[int]] = {}
        for r in records:
            text = r.get("error") or _short(r.get("value"))
            answers.setdefault(text, []).append(r["args"][0] if r["call"] in _PER_LINK and r["args"] else -1)
        parts = []
        for text, links in answers.items():
            if links and links[0] != -1:
                parts.append(f"{text} (link{'s' if len(links) > 1 else ''} {_ranges(links)})")
            else:
                parts.append(text + (f" ×{len(links)}" if len(links) > 1 else ""))
        probed = " (probed)" if all(r.get("probe") for r in records) else ""
        errors = {r.get("error") for r in records}
        kind = "answered" if None in errors else min(e for e in errors if e)
        return "; ".join(parts) + probed, kind

    def table(trace: dict[str, Any] | None) -> dict[tuple[str, str], tuple[str, str]]:
        if trace is None:
            return {}
        grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in trace["records"]:
            if r["gpu"] not in (0, -1, -2):
                continue
            grouped.setdefault(key_of(r), []).append(r)
            names = trace["fields"] if r["call"] == "nvmlDeviceGetFieldValues" else trace["gpm_metrics"]
            for item in r.get("items", []):
                label = (r["call"], f"{names.get(str(item['id']), '?')} ({item['id']})")
                answer = {k: item[k] for k in ("value", "error") if k in item}
                grouped.setdefault(label, []).append(
                    {"call": r["call"], "args": [], "gpu": r["gpu"], "probe": r.get("probe"), **answer}
                )
        return {k: fold(v) for k, v in grouped.items()}

    first, second = table(idle), table(busy)
    static = (idle or busy or {}).get("static_calls", {})
    keys = sorted(set(first) | set(second))
    rows: list[list[str]] = []
    tally: Counter[str] = Counter()
    for call, args in keys:
        if call not in static:
            continue  # pynvml's own helpers, called by the calls above
        a, kind = first.get((call, args), ("—", "not called"))
        b, _ = second.get((call, args), ("—", ""))
        tally[kind] += 1
        rows.append([f"`{call}`", args, a, b, ", ".join(static.get(call, []))])
    called = {call for call, _ in keys}
    lacking = set((idle or busy or {}).get("missing_in_pynvml", []))
    for call, files in static.items():
        if call in lacking:
            tally["not in nvidia-ml-py"] += 1
            rows.append([f"`{call}`", "", "not in this nvidia-ml-py: left out", "—", ", ".join(files)])
        elif call not in called:
            tally["not called"] += 1
            rows.append([f"`{call}`", "", "not called in this run", "—", ", ".join(files)])
    return rows, tally


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 90 else text[:87] + "..."


def _ranges(numbers: Iterable[int]) -> str:
    ordered = sorted(set(numbers))
    spans, start = [], None
    for i, n in enumerate(ordered):
        if start is None:
            start = n
        if i + 1 == len(ordered) or ordered[i + 1] != n + 1:
            spans.append(f"{start}" if start == n else f"{start}–{n}")
            start = None
    return ", ".join(spans)


def analyze(folder: Path, mode: str) -> int:
    items: list[dict[str, Any]] = []
    steps = []
    for line in (_read(folder / "steps.tsv") or "").splitlines():
        name, rc, seconds, *note = line.split("\t")
        steps.append({"step": name, "rc": rc, "seconds": float(seconds), "note": note[0] if note else ""})
    installed = _json(folder / "install.json")
    _item(
        items,
        "install",
        "project and requirements from carried wheels",
        PASS if installed and installed.get("ok") else FAIL,
        "; ".join(f"{p['name']} {p['wanted']}: {p['action']}" for p in (installed or {}).get("packages", []))
        or "no install.json",
    )
    for step in steps:
        if step["step"] == "load" and step["rc"] == "failed":
            _item(items, "under load", "bf16 matrix products started", FAIL, "load.log says why")
        elif step["rc"] == "skipped":
            _item(items, "steps", step["step"], SKIP, step["note"])
        elif step["rc"] in ("124", "137"):
            _item(items, "steps", step["step"], FAIL, f"ran past its limit ({step['seconds']:.0f} s)")
    exposition = {p: _read(folder / f"scrape-{p}.prom") for p in ("idle", "load")}
    traces = {p: _json(folder / f"nvml-{p}.json") for p in ("idle", "load")}
    values = {p: agent_gpus(parse_exposition(t)) if t else {} for p, t in exposition.items()}
    comparisons: list[dict[str, Any]] = []
    for phase in ("idle", "load"):
        if exposition[phase] is None:
            ran = any(step["step"] == f"scrape-{phase}" for step in steps)
            _item(
                items,
                f"scrape {phase}",
                "clusterhealth scrape",
                FAIL if ran else SKIP,
                "no exposition" if ran else "not run",
            )
            continue
        families = _families(exposition[phase] or "")
        collectors = parse_exposition(exposition[phase] or "").get(
            "clusterhealth_scrape_collector_success", []
        )
        gpu_ok = [value for labels, value in collectors if labels.get("collector") == "gpu"]
        _item(
            items,
            f"scrape {phase}",
            "clusterhealth scrape: the gpu collector succeeded",
            PASS if gpu_ok == [1.0] and values[phase] else FAIL,
            f"{len(families)} GPU families, {len(values[phase])} GPUs"
            + ("" if gpu_ok == [1.0] else "; the gpu collector failed (scrape's stderr says why)"),
        )
        check = _json(folder / f"check-{phase}.json")
        ran = any(step["step"] == f"check-{phase}" for step in steps)
        if check is None:
            _item(
                items,
                f"check {phase}",
                "clusterhealth check --json",
                FAIL if ran else SKIP,
                "no JSON" if ran else "not run",
            )
        else:
            # The GPU checks must find a healthy GPU healthy; the others (kernel log, RDMA) are the
            # machine's business and only reported.
            off = [r for r in check.get("results", []) if r.get("status") != "OK"]
            gpu_off = [r for r in off if str(r.get("check", "")).startswith("gpu_")]
            _item(
                items,
                f"check {phase}",
                "clusterhealth check --json: the GPU checks say OK",
                FAIL if gpu_off else PASS,
                f"{check.get('summary')}"
                + "".join(f"; {r.get('check')} {r.get('status')}: {r.get('message')}" for r in off),
            )
        samples = [_read(folder / f"smi-{phase}-{when}.xml") for when in ("before", "after")]
        docs = [parse_smi(s) for s in samples if s]
        if not docs:
            _item(
                items,
                f"nvidia-smi {phase}",
                "values both show agree",
                SKIP,
                "no nvidia-smi reading for this phase",
            )
            continue
        by_bus = {}
        for doc in docs:
            for g in doc["gpus"]:
                g.setdefault("driver_version", doc["driver_version"])
                g.setdefault("cuda_version", doc["cuda_version"])
                by_bus.setdefault(normal_bus_id(g["bus_id"]), []).append(g)
        if not values[phase]:
            _item(items, f"nvidia-smi {phase}", "values both show agree", FAIL, "the agent exported no GPU")
        for gpu, mine in sorted(values[phase].items()):
            theirs = by_bus.get(mine.get("bus_id"), [])
            if not theirs:
                _item(
                    items,
                    f"nvidia-smi {phase}",
                    f"GPU {gpu}",
                    FAIL,
                    f"nvidia-smi shows no GPU at {mine.get('bus_id')}",
                )
                continue
            rows = compare(mine, theirs, phase, gpu)
            comparisons += rows
            wrong = [r for r in rows if r["verdict"] == FAIL]
            _item(
                items,
                f"nvidia-smi {phase}",
                f"GPU {gpu}: values both show agree",
                FAIL if wrong else PASS,
                "; ".join(
                    f"{r['item']}: agent {r['agent']}, nvidia-smi {r['smi']} {r['detail']}" for r in wrong
                )
                or f"{sum(r['verdict'] == PASS for r in rows)} values agree",
            )
    reference = _read(folder / "scrape-reference.prom")
    series: dict[str, Any] = {}
    if reference and exposition["idle"]:
        expected, got = _families(reference), _families(exposition["idle"] or "")
        series = {"missing": {}, "extra": sorted(got - expected)}
        for family in sorted(expected - got):
            verdict, why = explain_absence(family, traces["idle"] or {})
            series["missing"][family] = {"verdict": verdict, "why": why}
            _item(items, "series", family, verdict, why)
        _item(
            items,
            "series",
            "every GPU family of the simulated H200 present or knowingly absent",
            FAIL if any(m["verdict"] == FAIL for m in series["missing"].values()) else PASS,
            f"{len(expected & got)} present, {len(expected - got)} absent, {len(got - expected)} extra: "
            + (", ".join(series["extra"]) or "none"),
        )
    else:
        _item(items, "series", "against the simulator's", SKIP, "no reference or no idle scrape")
    gpu0 = {p: values[p].get("0", {}) for p in values}
    if exposition["load"]:
        rise_and_plausibility(gpu0["idle"], gpu0["load"], items)
    torch = _json(folder / "load.json")
    if torch:
        _item(
            items,
            "under load",
            "bf16 matrix products",
            INFO,
            f"{torch.get('tflops', 0):.0f} TFLOP/s over {torch.get('seconds', 0):.0f} s "
            f"({torch.get('device')}, torch {torch.get('torch')}, CUDA runtime {torch.get('cuda_runtime')})",
        )
    rows, tally = nvml_rows(traces["idle"], traces["load"])
    if traces["idle"] is not None:
        _item(
            items,
            "nvml",
            "every NVML call and field the agent uses, with its answer",
            FAIL if tally["not called"] else PASS,
            ", ".join(f"{n} {k}" for k, n in sorted(tally.items())),
        )
    else:
        _item(items, "nvml", "the NVML table", FAIL, "no trace")
    for kind in ("all_reduce", "sendrecv"):
        parsed = _json(folder / f"nccl-{kind}.json")
        raw = _read(folder / f"nccl-{kind}.txt")
        if raw is None and parsed is None:
            continue
        verdict = (parsed or {}).get("verdict")
        _item(
            items,
            "nccl-tests",
            f"{kind}_perf through probe parse",
            PASS if parsed and verdict == "ok" and parsed.get("rows") else FAIL,
            f"verdict {verdict}, {len((parsed or {}).get('rows') or [])} rows, peak bus bandwidth "
            f"{(parsed or {}).get('peak_bus_bandwidth_gbps')} GB/s",
        )
    versions = (traces["idle"] or {}).get("versions", {})
    result = {
        "mode": mode,
        "versions": versions,
        "install": installed,
        "steps": steps,
        "items": items,
        "comparisons": comparisons,
        "series": series,
        "values": gpu0,
        "torch": torch,
    }
    (folder / "results.json").write_text(json.dumps(result, indent=1))
    (folder / "summary.md").write_text(summary_markdown(result))
    (folder / "nvml-table.md").write_text(nvml_markdown(versions, rows, mode))
    return 1 if any(i["verdict"] == FAIL for i in items) else 0


def _header(mode: str, versions: dict[str, Any]) -> str:
    """Which GPU, driver, NVML, CUDA and nvidia-ml-py the results are of; a dry run says it is one."""
    said = {}
    for key in ("gpu", "driver", "nvml", "cuda", "nvidia-ml-py"):
        value = versions.get(key)
        said[key] = "?" if value is None else f"not answered ({value})" if _is_error(str(value)) else value
    text = (
        f"GPU {said['gpu']}; driver {said['driver']}; NVML {said['nvml']}; CUDA {said['cuda']} (the "
        f"driver's); nvidia-ml-py {said['nvidia-ml-py']}."
    )
    if mode == "real":
        return text
    return (
        "**DRY RUN against the simulator: no GPU was involved. The values are the simulated GPU's (an\n"
        "H200-like GPU with the values of a captured `nvidia-smi -q -x`), not a driver's.**\n\n" + text
    )


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def summary_markdown(result: dict[str, Any]) -> str:
    counts = Counter(i["verdict"] for i in result["items"])
    lines = [
        "# GPU check: summary",
        "",
        _header(result["mode"], result["versions"]),
        "",
        " · ".join(f"{counts[k]} {k}" for k in (PASS, FAIL, SKIP, INFO) if counts[k]),
        "",
        "| group | item | verdict | detail |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {i['group']} | {i['item']} | {i['verdict']} | {_cell(i['detail'])} |" for i in result["items"]
    ]
    lines += ["", "## Steps", "", "| step | exit | seconds | note |", "| --- | --- | --- | --- |"]
    lines += [
        f"| {s['step']} | {s['rc']} | {s['seconds']:.0f} | {_cell(s['note'])} |" for s in result["steps"]
    ]
    lines += ["", "## The agent against nvidia-smi", ""]
    lines += ["| phase | GPU | value | agent | nvidia-smi | verdict | tolerance |", "| --- " * 7 + "|"]
    for c in result["comparisons"]:
        cells = (c["phase"], c["gpu"], c["item"], c["agent"], c["smi"], c["verdict"], c["detail"])
        lines.append("| " + " | ".join(map(_cell, cells)) + " |")
    return "\n".join(lines) + "\n"


def nvml_markdown(versions: dict[str, Any], rows: list[list[str]], mode: str) -> str:
    lines = [
        "# NVML calls and fields the agent uses, and what they answered",
        "",
        _header(mode, versions),
        "",
        "GPU 0's answers to one `clusterhealth scrape`, idle and under bf16 load; `(probed)`: the agent "
        "makes that call only in another state (MIG on, an older driver), so it was made once directly.",
        "",
        "| call | arguments | idle | under load | used in |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _is_error(answer: str) -> bool:
    """An NVML error as the trace names it (NotSupported, FunctionNotFound, error 999)."""
    return bool(re.fullmatch(r"(?:[A-Z][a-z]+)+(?:V\d)?|error -?\d+", answer))


# -- the command line --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install")
    p.add_argument("--wheels", type=Path, required=True)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--report", type=Path, required=True)
    p = sub.add_parser("scenario")
    p.add_argument("--smi-xml", type=Path, required=True)
    p.add_argument("--idle", type=Path, required=True, help="the scenario of the idle GPU")
    p.add_argument("--busy", type=Path, required=True, help="the same GPU under bf16 load")
    p = sub.add_parser("nvml-table")
    p.add_argument("--phase", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("cli", nargs=argparse.REMAINDER, help="after --: the scrape's options")
    p = sub.add_parser("load")
    p.add_argument("--seconds", type=float, default=45)
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument("--report", type=Path, required=True)
    p = sub.add_parser("analyze")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--mode", choices=("real", "dry-run"), required=True)
    args = parser.parse_args(argv)
    if args.command == "install":
        return install(args.wheels, args.target, args.report)
    if args.command == "scenario":
        import yaml

        doc = parse_smi(args.smi_xml.read_text())
        args.idle.write_text(yaml.safe_dump(scenario_from_smi(doc), sort_keys=False))
        args.busy.write_text(yaml.safe_dump(scenario_from_smi(doc, busy=True), sort_keys=False))
        return 0
    if args.command == "nvml-table":
        cli = [a for a in args.cli if a != "--"]
        return nvml_table(args.phase, args.out, cli)
    if args.command == "load":
        return load(args.seconds, args.ready, args.report)
    return analyze(args.dir, args.mode)


if __name__ == "__main__":
    sys.exit(main())
