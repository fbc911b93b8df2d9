"""The GPU check (benchmarks/gpu_check.sh and .py, docs/gpu-check.md) without a GPU: its reading of
real `nvidia-smi -q -x` captures, its comparison and absence rules, and its dry run against the
simulator, which must produce the summary and the NVML table and flag a planted disagreement."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .conftest import FIXTURES, GOLDEN, ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
A100 = FIXTURES / "nvidia-smi" / "a100-sxm4-80gb-535.xml"
ADA = FIXTURES / "nvidia-smi" / "rtx-4000-sff-ada-595.xml"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gc = _load()


def test_the_v12_capture_of_an_a100_reads_as_it_shows() -> None:
    doc = gc.parse_smi(A100.read_text())
    assert (doc["driver_version"], doc["cuda_version"]) == ("535.54.03", "12.2")
    (g,) = doc["gpus"]
    assert g["bus_id"] == "00000000:01:00.0"
    assert (g["name"], g["serial"], g["vbios_version"]) == (
        "NVIDIA A100-SXM4-80GB",
        "1650522003820",
        "92.00.36.00.02",
    )
    assert g["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert (g["temperature_gpu"], g["temperature_memory"]) == (27, 44)
    assert (g["power_draw"], g["power_average"], g["power_instant"], g["power_limit"]) == (
        67.03,
        None,
        None,
        500,
    )
    assert (g["sm_clock"], g["memory_clock"], g["sm_clock_max"], g["performance_state"]) == (
        1275,
        1593,
        1410,
        0,
    )
    assert (g["memory_total"], g["memory_used"], g["memory_reserved"]) == (81920, 50, 869)
    assert (g["pcie_generation"], g["pcie_generation_max"], g["pcie_width"], g["pcie_width_max"]) == (
        4,
        4,
        16,
        16,
    )
    assert g["ecc_corrected_volatile"] == g["ecc_uncorrected_aggregate"] == 0
    # MIG is on: no utilization and no remapped rows to show.
    assert (g["utilization"], g["remapped_correctable"], g["remap_pending"]) == (None, None, None)
    assert g["clocks_event_reasons"] == dict.fromkeys(
        [
            "gpu_idle",
            "applications_clocks_setting",
            "sw_power_cap",
            "hw_slowdown",
            "hw_thermal_slowdown",
            "hw_power_brake_slowdown",
            "sync_boost",
            "sw_thermal_slowdown",
            "display_clock_setting",
        ],
        False,
    )
    assert (g["persistence_mode"], g["mig_mode"], g["fabric_state"]) == ("Disabled", "Enabled", None)


def test_the_v13_capture_reads_its_newer_elements() -> None:
    (g,) = gc.parse_smi(ADA.read_text())["gpus"]
    assert (g["power_average"], g["power_instant"], g["power_draw"], g["power_limit"]) == (
        8.81,
        8.44,
        None,
        70,
    )
    assert (g["pcie_generation"], g["pcie_generation_max"], g["performance_state"]) == (1, 4, 8)
    assert g["clocks_event_reasons"]["gpu_idle"] is True
    assert g["clocks_event_seconds"]["sw_power_cap"] == pytest.approx(4251.825415)
    assert g["clocks_event_seconds"]["hw_thermal_slowdown"] == 0
    assert (
        g["remapped_correctable"],
        g["remapped_uncorrectable"],
        g["remap_pending"],
        g["remap_failed"],
    ) == (
        0,
        0,
        False,
        False,
    )
    # ECC is off: its counts are N/A, not 0.
    assert g["ecc_corrected_volatile"] is None and g["ecc_mode"] == "Disabled"
    assert (g["recovery_action"], g["temperature_memory"], g["utilization"]) == ("None", None, 0)


def _agent_view(smi: dict[str, Any]) -> dict[str, Any]:
    """What an agent that agrees with nvidia-smi exports, in agent_gpus' terms."""
    agent = {k: v for k, v in smi.items() if v is not None and not k.startswith("power")}
    agent["power"] = smi["power_draw"]
    agent["power_limit"] = smi["power_limit"]
    agent["recovery_action"] = "none"
    return agent


@pytest.mark.parametrize(
    ("item", "change"),
    [
        ("GPU temperature (C)", {"temperature_gpu": 30}),
        ("power draw (W)", {"power": 67.03 + 16}),
        ("enforced power limit (W)", {"power_limit": 501}),
        ("SM clock (MHz)", {"sm_clock": 1275 + 70}),
        ("PCIe width (lanes)", {"pcie_width": 8}),
        ("ECC uncorrected, volatile", {"ecc_uncorrected_volatile": 1}),
        ("UUID", {"uuid": "GPU-00000000-0000-0000-0000-000000000000"}),
        ("clock event hw_slowdown", {"clocks_event_reasons": {"hw_slowdown": True}}),
        ("memory used (MiB)", {"memory_used": 50 + 869 + 65}),
    ],
)
def test_a_value_the_agent_exports_differently_is_flagged(item: str, change: dict[str, Any]) -> None:
    doc = gc.parse_smi(A100.read_text())
    (smi,) = doc["gpus"]
    smi.update(driver_version=doc["driver_version"], cuda_version=doc["cuda_version"])
    agent = _agent_view(smi)
    agreed = gc.compare(agent, [smi], "idle", "0")
    assert [r["item"] for r in agreed if r["verdict"] == gc.FAIL] == []
    assert sum(r["verdict"] == gc.PASS for r in agreed) >= 30
    flagged = gc.compare({**agent, **change}, [smi], "idle", "0")
    assert [r["item"] for r in flagged if r["verdict"] == gc.FAIL] == [item]


def test_a_value_between_two_readings_agrees() -> None:
    (smi,) = gc.parse_smi(A100.read_text())["gpus"]
    later = {**smi, "temperature_gpu": 40}
    rows = gc.compare({"temperature_gpu": 35.0}, [smi, later], "load", "0")
    assert next(r for r in rows if r["item"] == "GPU temperature (C)")["verdict"] == gc.PASS
    rows = gc.compare({"temperature_gpu": 43.0}, [smi, later], "load", "0")
    assert next(r for r in rows if r["item"] == "GPU temperature (C)")["verdict"] == gc.FAIL


def test_every_gpu_family_the_agent_can_export_has_a_known_source() -> None:
    families = gc._families((GOLDEN / "h100-faulty.prom").read_text())
    from clusterhealth.exporters.gpu import GPM_METRICS

    gpm = {"clusterhealth_gpu_" + attr for attr, _, _ in GPM_METRICS}
    assert families - gpm - set(gc.SOURCES) == set()


def _trace(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "records": records,
        "fields": {"82": "NVML_FI_DEV_MEMORY_TEMP"},
        "gpm_metrics": {},
        "gpm_families": {},
    }


def test_a_missing_family_is_known_only_when_its_nvml_answer_was_an_error() -> None:
    power = "clusterhealth_gpu_power_watts"
    refused = _trace([{"call": "nvmlDeviceGetPowerUsage", "gpu": 0, "args": [], "error": "NotSupported"}])
    assert gc.explain_absence(power, refused) == (
        gc.PASS,
        "knowingly absent: nvmlDeviceGetPowerUsage answered NotSupported",
    )
    answered = _trace([{"call": "nvmlDeviceGetPowerUsage", "gpu": 0, "args": [], "value": 71000}])
    assert gc.explain_absence(power, answered)[0] == gc.FAIL
    assert gc.explain_absence(power, _trace([]))[0] == gc.FAIL
    field = _trace(
        [
            {
                "call": "nvmlDeviceGetFieldValues",
                "gpu": 0,
                "args": [],
                "items": [{"id": 82, "error": "NotSupported"}],
            }
        ]
    )
    assert gc.explain_absence("clusterhealth_gpu_temperature_celsius", field)[0] == gc.FAIL  # the GPU sensor
    assert gc.explain_absence("clusterhealth_gpu_unheard_of", field)[0] == gc.FAIL


def test_the_calls_the_agent_names_are_found_in_its_code_and_not_in_the_simulator() -> None:
    calls = gc.static_calls([ROOT / "agent", ROOT / "exporters", ROOT / "checks"])
    for name in (
        "nvmlDeviceGetPowerUsage",
        "nvmlGpmMetricsGet",
        "nvmlEventSetWait_v2",
        "nvmlDeviceGetRepairStatus",
    ):
        assert name in calls
    assert calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == ["exporters/gpu.py"]
    assert "nvmlDeviceGetIndex" not in calls  # the simulator answers it; the agent never asks


def test_the_dry_run_writes_the_table_and_summary_and_flags_a_planted_disagreement(tmp_path: Path) -> None:
    # nvidia-smi's answer says 47 C where the simulated GPU, built from the true capture, says 27 C.
    planted = tmp_path / "planted.xml"
    planted.write_text(A100.read_text().replace("<gpu_temp>27 C</gpu_temp>", "<gpu_temp>47 C</gpu_temp>"))
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "TMPDIR": str(tmp_path),
        "GPU_CHECK_PYTHON": sys.executable,
        "GPU_CHECK_WHEELS": str(tmp_path / "wheels"),
        "GPU_CHECK_SCENARIO_XML": str(A100),
        "GPU_CHECK_SMI_XML": str(planted),
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", str(SCRIPT), "dry-run"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu-check.tar.gz",
        "nvml-table.md",
        "results.json",
        "summary.md",
    ]
    result = json.loads((out / "results.json").read_text())
    assert result["mode"] == "dry-run" and result["install"]["ok"]
    assert result["versions"]["driver"] == "535.54.03"
    failed = [(i["group"], i["item"]) for i in result["items"] if i["verdict"] == gc.FAIL]
    assert failed == [("nvidia-smi idle", "GPU 0: values both show agree")]
    wrong = [(c["item"], c["agent"], c["smi"]) for c in result["comparisons"] if c["verdict"] == gc.FAIL]
    assert wrong == [("GPU temperature (C)", 27.0, 47.0)]
    passed = {i["item"] for i in result["items"] if i["verdict"] == gc.PASS}
    assert {"sm_active_ratio rises", "tensor_active_ratio rises", "power rises"} <= passed
    summary = (out / "summary.md").read_text()
    assert (
        "DRY RUN against the simulator" in summary
        and "| GPU temperature (C) | 27.0 | 47.0 | FAIL |" in summary
    )
    table = (out / "nvml-table.md").read_text()
    assert "DRY RUN against the simulator" in table and "not called in this run" not in table
    calls = gc.static_calls([ROOT / "agent", ROOT / "exporters", ROOT / "checks"])
    assert [c for c in calls if f"| `{c}` |" not in table] == []
    assert "| `nvmlDeviceGetFieldValues` | NVML_FI_DEV_MEMORY_TEMP (82) | 44 |" in table


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal wheel of one empty module, with these requirements."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}_marker.py": "",
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        + f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for file, text in files.items():
            z.writestr(file, text)
    return path


def test_install_keeps_what_fits_carries_the_rest_and_says_what_is_missing(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(
        wheels,
        "clusterhealth",
        "0.0.1",
        ["pyyaml>=6,<7", "gpucheck-dep-a>=2", "gpucheck-dep-b; extra == 'x'"],
    )
    _wheel(wheels, "gpucheck_dep_a", "2.0", ["gpucheck-dep-c"])
    report = tmp_path / "install.json"
    assert gc.install(wheels, tmp_path / "site", report) == 1
    result = json.loads(report.read_text())
    actions = {p["name"]: p["action"] for p in result["packages"]}
    assert actions == {
        "pyyaml": "the machine's",
        "gpucheck-dep-a": "carried 2.0",
        "gpucheck-dep-c": "MISSING: no carried wheel fits (carried: None)",
    }
    assert result["pip"]["rc"] == 0 and (tmp_path / "site" / "gpucheck_dep_a_marker.py").exists()
    assert result["ok"] is False
    # With every requirement met, this stand-in (which has no agent) still fails: the agent that
    # would run is the one this virtualenv has, not the carried one.
    _wheel(wheels, "gpucheck_dep_c", "1.0", [])
    assert gc.install(wheels, tmp_path / "site", report) == 1
    result = json.loads(report.read_text())
    assert {p["name"]: p["action"] for p in result["packages"]}["gpucheck-dep-c"] == "carried 1.0"
    assert result["pip"]["rc"] == 0 and result["imported"]["file"] == str(ROOT / "agent" / "cli.py")
    assert result["ok"] is False


# Deletes from the installed pynvml the names an older release lacks (as
# tests/test_nvidia_ml_py_releases.py does), then runs the check's Python part.
OLD_RELEASE = """
import importlib.util, sys
import pynvml
lacks = set(open(sys.argv[1]).read().split())
classes = {n: getattr(pynvml, n) for n in dir(pynvml) if isinstance(getattr(pynvml, n), type)}
kept = {id(cls) for n, cls in classes.items() if n not in lacks}
for name in lacks:
    if hasattr(pynvml, name) and id(getattr(pynvml, name)) not in kept:
        delattr(pynvml, name)
spec = importlib.util.spec_from_file_location("gpu_check", sys.argv[2])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.exit(module.main(sys.argv[3:]))
"""


def test_the_nvml_table_on_an_older_nvidia_ml_py_says_which_calls_it_lacks(tmp_path: Path) -> None:
    import yaml

    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(gc.scenario_from_smi(gc.parse_smi(A100.read_text()))))
    out = tmp_path / "nvml.json"
    lacks = FIXTURES / "nvidia-ml-py" / "lacks-12.535.161.txt"
    args = ["nvml-table", "--phase", "idle", "--out", str(out), "--", "--simulate", str(scenario)]
    script = ROOT / "benchmarks" / "gpu_check.py"
    done = subprocess.run(
        [sys.executable, "-c", OLD_RELEASE, str(lacks), str(script), *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    trace = json.loads(out.read_text())
    assert "nvmlDeviceGetRepairStatus" in trace["missing_in_pynvml"]
    rows, tally = gc.nvml_rows(trace, None)
    left_out = {row[0] for row in rows if row[2] == "not in this nvidia-ml-py: left out"}
    assert left_out == {f"`{name}`" for name in trace["missing_in_pynvml"]}
    assert tally["not called"] == 0 and tally["answered"] > 60
