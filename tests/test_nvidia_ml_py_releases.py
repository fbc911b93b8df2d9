"""The agent on the older nvidia-ml-py releases pyproject allows: what a release lacks is absent,
said once, and never an error for the collector.

A release is emulated by deleting from the installed pynvml, before the agent is imported, the
names the agent reads that the release lacks (tests/fixtures/nvidia-ml-py/, which says how they
were found from the real wheels). pynvml's constants are read when the agent's modules are
imported, so each run is a fresh `clusterhealth scrape` process.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import yaml

from clusterhealth.agent.demo import kmsg_record
from clusterhealth.exporters import nvml
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import load_scenario

from .conftest import FIXTURES, SCENARIOS, samples, value

RELEASES = FIXTURES / "nvidia-ml-py"

# Deletes the names, but keeps a class another kept name still refers to (13.615 makes
# c_nvmlGpuFabricInfoV_t an alias of c_nvmlGpuFabricInfo_v2_t; 12.575 has it as a class of its own).
EMULATE = """
import sys
import pynvml

lacks = set(open(sys.argv[1]).read().split())
classes = {n: getattr(pynvml, n) for n in dir(pynvml) if isinstance(getattr(pynvml, n), type)}
kept = {id(cls) for n, cls in classes.items() if n not in lacks}
for name in lacks:
    if hasattr(pynvml, name) and id(getattr(pynvml, name)) not in kept:
        delattr(pynvml, name)
from clusterhealth.agent.cli import main

sys.exit(main(sys.argv[2:]))
"""

SLOWDOWN = {"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
# release: (what its warning names, the throttle-time reasons exported, recovery action and fabric
# health read)
EXPECTED = {
    "13.580.65": (["the unrepairable-memory flag"], SLOWDOWN, True),
    "12.575.51": (["the memory repair status", "the unrepairable-memory flag"], SLOWDOWN, True),
    "12.570.86": (["the SW/HW thermal and power-brake throttle-time counters"], {"thermal"}, True),
    "12.535.161": (
        ["the GPU recovery action", "the GPU fabric health", "the SW/HW thermal and power-brake"],
        {"thermal"},
        False,
    ),
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The golden node's GPUs and HCAs (the faulty scenario at 600 s), at the default settings."""
    root = tmp_path_factory.mktemp("node")
    data = yaml.safe_load((SCENARIOS / "h100-faulty.yaml").read_text())
    data["frozen_at_seconds"] = 600
    scenario = root / "h100-faulty.yaml"
    scenario.write_text(yaml.safe_dump(data))
    sim_sysfs.build(root / "sys")
    kmsg = root / "kmsg"
    lines = load_scenario(scenario).kernel_log
    kmsg.write_bytes(b"".join(kmsg_record(n, line) for n, (_, line) in enumerate(lines, 1)))
    return ["--simulate", str(scenario), "--sysfs-root", str(root / "sys"), "--kmsg-path", str(kmsg)]


def scrape_as(release: str, node: list[str]) -> subprocess.CompletedProcess[str]:
    lacks = RELEASES / f"lacks-{release}.txt"
    return subprocess.run(
        [sys.executable, "-c", EMULATE, str(lacks), "scrape", *node],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("release", EXPECTED)
def test_an_older_release_leaves_out_what_it_lacks_and_says_so_once(release: str, node: list[str]) -> None:
    said, counters, recovery = EXPECTED[release]
    result = scrape_as(release, node)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "collector gpu failed" not in result.stderr, result.stderr
    text = result.stdout
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 1
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 1
    assert value(text, "clusterhealth_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.04)
    warnings = [line for line in result.stderr.splitlines() if "predates names the agent reads" in line]
    assert len(warnings) == 1, result.stderr
    for what in said:
        assert what in warnings[0], warnings[0]
    reasons = {
        dict(labels)["reason"]
        for name, labels in samples(text)
        if name == "clusterhealth_gpu_clocks_event_seconds_total" and dict(labels)["gpu"] == "3"
    }
    assert reasons == counters
    # SPEC's nine sampled reasons are there whatever the release.
    assert value(text, "clusterhealth_gpu_clocks_event_active", gpu="3", reason="hw_thermal_slowdown") == 1
    if recovery:
        assert value(text, "clusterhealth_gpu_recovery_action", gpu="4", action="gpu_reset") == 1
        assert value(text, "clusterhealth_gpu_fabric_degraded", gpu="2") == 1
    else:
        assert "clusterhealth_gpu_recovery_action" not in text
        assert "clusterhealth_gpu_fabric_degraded" not in text
        assert value(text, "clusterhealth_check_status", check="gpu_recovery_action", subject="4") is None


def test_what_a_release_lacks_is_said_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(
        nvml, "MISSING_NAMES", {"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": "the GPU recovery action"}
    )
    monkeypatch.setattr(nvml, "_missing_said", False)
    log = logging.getLogger("clusterhealth.test")
    with caplog.at_level(logging.WARNING, logger="clusterhealth.test"):
        for _ in range(3):  # three cycles of the gpu collector
            nvml.say_missing_names_once(log)
    assert len(caplog.records) == 1
    assert "the GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)" in caplog.records[0].getMessage()
