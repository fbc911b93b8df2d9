"""The whole simulated node the demo runs, end to end through the real command, against a golden file.

The node is the faulty scenario's GPUs (clock frozen at 600 s, so energy and the GPU that falls off
the bus at 45 s are fixed), the simulated sysfs with its HCA faults, the scenario's kernel log
replayed into a kmsg file, and one probe result (a real nccl-tests capture, after real NCCL INFO
lines, replayed by `cat` through `clusterhealth probe run`), and one meeting of a pairwise group
recorded in the current round. So every family the agent exports is in one golden file, and
promtool lints them all there (the round number, which follows the clock, reads NaN there).

Run with CLUSTERHEALTH_UPDATE_GOLDEN=1 to rewrite the golden file after an intended change (the
test then fails, so that a run in update mode never passes), and review the diff.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from clusterhealth.agent.demo import kmsg_record
from clusterhealth.checks.fabric.rounds import GroupState, SlotResult, group_store
from clusterhealth.checks.fabric.schedule import round_at
from clusterhealth.checks.probes import ProbeOutcome
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import load_scenario

from .conftest import FIXTURES, GOLDEN, SCENARIOS, run_cli, samples, value

GOLDEN_FILE = GOLDEN / "h100-faulty.prom"
JOB = "817304"  # the faulty scenario's Slurm job

# Every GPU and meta metric of SPEC.md with the labels SPEC gives it (per-GPU: gpu and uuid).
SPEC_GPU = {
    "clusterhealth_gpu_up": (),
    "clusterhealth_gpu_info": ("name", "pci_bus_id", "serial", "vbios_version"),
    "clusterhealth_gpu_sm_active_ratio": (),
    "clusterhealth_gpu_sm_occupancy_ratio": (),
    "clusterhealth_gpu_utilization_ratio": (),
    "clusterhealth_gpu_memory_used_bytes": (),
    "clusterhealth_gpu_memory_total_bytes": (),
    "clusterhealth_gpu_sm_clock_hertz": (),
    "clusterhealth_gpu_sm_clock_max_hertz": (),
    "clusterhealth_gpu_memory_clock_hertz": (),
    "clusterhealth_gpu_clocks_event_active": ("reason",),
    "clusterhealth_gpu_performance_state": (),
    "clusterhealth_gpu_temperature_celsius": ("sensor",),
    "clusterhealth_gpu_power_watts": (),
    "clusterhealth_gpu_power_limit_watts": (),
    "clusterhealth_gpu_energy_joules_total": (),
    "clusterhealth_gpu_ecc_errors_total": ("error", "scope"),
    "clusterhealth_gpu_remapped_rows": ("cause",),
    "clusterhealth_gpu_row_remap_pending": (),
    "clusterhealth_gpu_row_remap_failed": (),
    "clusterhealth_gpu_xid_errors_total": ("xid",),
    "clusterhealth_gpu_pcie_link_generation": (),
    "clusterhealth_gpu_pcie_link_generation_max": (),
    "clusterhealth_gpu_pcie_link_width": (),
    "clusterhealth_gpu_pcie_link_width_max": (),
    "clusterhealth_gpu_pcie_replay_errors_total": (),
    "clusterhealth_gpu_tensor_active_ratio": (),
    "clusterhealth_gpu_dram_active_ratio": (),
    "clusterhealth_gpu_fp16_active_ratio": (),
    "clusterhealth_gpu_fp32_active_ratio": (),
    "clusterhealth_gpu_fp64_active_ratio": (),
    "clusterhealth_gpu_pcie_received_bytes_per_second": (),
    "clusterhealth_gpu_pcie_transmitted_bytes_per_second": (),
    "clusterhealth_gpu_nvlink_received_bytes_per_second": (),
    "clusterhealth_gpu_nvlink_transmitted_bytes_per_second": (),
    "clusterhealth_gpu_clocks_event_seconds_total": ("reason",),
    "clusterhealth_gpu_recovery_action": ("action",),
    "clusterhealth_gpu_nvlink_up": ("link",),
    "clusterhealth_gpu_nvlink_errors_total": ("error",),
    "clusterhealth_gpu_nvlink_link_errors_total": ("link", "error"),
}
SPEC_OTHER = {
    "clusterhealth_gpu_driver_info": ("driver_version", "cuda_driver_version"),
    "clusterhealth_node_info": ("node",),
    "clusterhealth_probe_peer_success": ("probe", "peer"),
    "clusterhealth_probe_round": ("probe",),
    "clusterhealth_scrape_collector_success": ("collector",),
    "clusterhealth_scrape_collector_duration_seconds": ("collector",),
    "clusterhealth_build_info": ("version",),
}
SPEC_REASONS = {
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
}


def golden_node(root: Path) -> list[str]:
    """Lay out the golden node under `root` and return the flags that point the command at it.

    Everything it reads is under `root` (the probe's capture is copied there), so the same flags
    work wherever `root` is visible at the same path: here, or inside the container image
    (tests/test_image.py)."""
    data = yaml.safe_load((SCENARIOS / "h100-faulty.yaml").read_text())
    data["frozen_at_seconds"] = 600
    scenario = root / "h100-faulty-frozen.yaml"
    scenario.write_text(yaml.safe_dump(data))
    sim_sysfs.build(root / "sys")
    parsed = load_scenario(scenario)
    kmsg = root / "kmsg"
    kmsg.write_bytes(b"".join(kmsg_record(n, line) for n, (_, line) in enumerate(parsed.kernel_log, 1)))
    capture = root / "nccl-tests.txt"
    shutil.copyfile(FIXTURES / "nccl-tests" / "08_single_node_8x_h100_allreduce.txt", capture)
    # NCCL_DEBUG=INFO lines of a real run on IB (GPUDirect RDMA, P2P inside the nodes), printed
    # before the table as NCCL prints them: the probe's transport is exported, and is no fallback.
    info = root / "nccl-info.log"
    debug_info = FIXTURES / "nccl-tests" / "nccl-debug-info"
    shutil.copyfile(debug_info / "nccl-issue-429_p2p_direct_pointer_and_ib_gdrdma.log", info)
    config = root / "clusterhealth.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                # GPU 0 of the scenario runs a NCCL job: the guard would skip the replayed probe.
                "probing": {"state_dir": str(root / "state"), "check_gpus_idle": False},
                "probes": [
                    {"name": "nccl-allreduce", "argv": ["cat", str(info), str(capture)], "expect": "480 GB/s"}
                ],
                "pairwise_groups": [PAIRWISE],
                # Every family and counter the agent can export, the opt-in ones too.
                "collectors": FULL_DETAIL,
            }
        )
    )
    _record_a_meeting(root / "state")
    # The scenario's Slurm job: its process's cgroup under /proc, its job cgroup under sysfs, and
    # the Prolog's mapping files (which win over the cgroups, and agree with them).
    sim_procfs.build(root / "proc", parsed)
    sim_procfs.build_job_cgroups(root / "sys", parsed)
    (root / "jobs").mkdir()
    for gpu in range(len(parsed.gpus)):
        (root / "jobs" / str(gpu)).write_text(f"{JOB}\n")
    node = ["--config", str(config), "--simulate", str(scenario), "--node-name", "gpu-001"]
    jobs = ["--procfs-root", str(root / "proc"), "--job-mapping-dir", str(root / "jobs")]
    return [*node, "--sysfs-root", str(root / "sys"), "--kmsg-path", str(kmsg), *jobs]


# Every collector's opt-in families, and every counter of the curated ones.
FULL_DETAIL = {
    "gpu": {"include_metrics": ["*"], "clocks_event_counters": ["*"], "clocks_event_reasons": ["*"]},
    "rdma": {"include_metrics": ["*"], "hw_counters": ["*"], "error_counters": ["*"]},
    "pcie_aer": {"include_metrics": ["*"], "drivers": ["nvidia", "mlx5_core"]},
    **{name: {"include_metrics": ["*"]} for name in ("kernel_log", "xid", "audit", "probes")},
}
# What a fleet can afford per node at the default settings (issue 21; benchmarks/series.py prints
# the figures, docs/performance.md records them).
SERIES_BUDGET = 900


@pytest.fixture(scope="module")
def faulty_exposition(tmp_path_factory: pytest.TempPathFactory) -> str:
    node = golden_node(tmp_path_factory.mktemp("golden"))
    probed = run_cli("probe", "run", "nccl-allreduce", *node)
    assert probed.returncode == 0, probed.stdout + probed.stderr
    result = run_cli("scrape", *node)
    assert result.returncode == 0, result.stderr
    return result.stdout


# A pairwise group with one meeting recorded in the current round (a day long, so that the round
# cannot end between recording and scraping but once a day), as the agent's rounds record it; its
# members placed on leaves.
PAIRWISE = {
    "name": "fabric",
    "members": {"gpu-001": "10.0.0.1", "gpu-002": "10.0.0.2"},
    "placement": {
        "gpu-001": {"leaf": "su1-leaf03", "pod": "su1", "rail": "0"},
        "gpu-002": {"leaf": "su1-leaf04"},
    },
    "period_seconds": 86400,
    "server_argv": ["iperf3", "-s", "-1", "-p", "{port}", "-J"],
    "client_argv": ["iperf3", "-c", "{peer}", "-p", "{port}", "-J"],
    "expect": "400 Gb/s",
}


def _record_a_meeting(state_dir: Path) -> None:
    outcome = ProbeOutcome("ok", "iperf3: 391.20 Gbit/s", 391.2e9 / 8, 400e9 / 8)
    now = time.time()
    result = SlotResult(round_at(now, 86400), False, "gpu-002", outcome, now, 10.2, "iperf3 -c 10.0.0.2")

    def change(state: GroupState) -> None:
        state.runs["ok"] += 1
        state.last = state.last_any = state.current = result

    group_store(state_dir, "fabric").update(change)


# The series the golden file leaves out (they change from run to run).
TIMING = {
    "clusterhealth_check_last_run_timestamp_seconds",
    "clusterhealth_node_verdict_since_timestamp_seconds",
    "clusterhealth_probe_last_run_timestamp_seconds",
    "clusterhealth_probe_duration_seconds",
}


def comparable(exposition: str) -> list[str]:
    """The exposition without what changes from run to run: durations, timestamps, the version."""
    lines = []
    for line in exposition.splitlines():
        if line.startswith(
            (
                "clusterhealth_scrape_collector_duration_seconds{",
                "clusterhealth_check_last_run_timestamp_seconds{",
                "clusterhealth_node_verdict_since_timestamp_seconds ",
                "clusterhealth_probe_last_run_timestamp_seconds{",
                "clusterhealth_probe_duration_seconds{",
            )
        ):
            continue
        line = re.sub(r'^(clusterhealth_build_info\{version=)"[^"]*"', r'\1"VERSION"', line)
        lines.append(re.sub(r"^(clusterhealth_probe_round\{.*\}) .*", r"\1 NaN", line))
    return lines


def test_faulty_node_matches_the_golden_exposition(faulty_exposition: str) -> None:
    got = comparable(faulty_exposition)
    if os.environ.get("CLUSTERHEALTH_UPDATE_GOLDEN"):
        GOLDEN_FILE.write_text("\n".join(got) + "\n")
        pytest.fail(
            f"rewrote {GOLDEN_FILE}: review the diff, then run again without CLUSTERHEALTH_UPDATE_GOLDEN"
        )
    want = GOLDEN_FILE.read_text().splitlines()
    for n, (a, b) in enumerate(zip(got, want, strict=False), start=1):
        assert a == b, f"line {n} differs from {GOLDEN_FILE.name}"
    assert len(got) == len(want), f"{len(got)} lines, golden has {len(want)}"


def test_promtool_finds_nothing_to_lint(faulty_exposition: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make test` installs the Debian prometheus package")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=faulty_exposition, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def test_every_spec_gpu_metric_is_exported_with_its_labels(faulty_exposition: str) -> None:
    seen: dict[str, set[str]] = {}
    for name, labels in samples(faulty_exposition):
        seen.setdefault(name, set()).update(k for k, _ in labels)
    for name, extra in SPEC_GPU.items():
        assert name in seen, f"{name} is absent"
        assert {"gpu", "uuid", *extra} <= seen[name], f"{name} lacks labels: {seen[name]}"
    for name, labels in SPEC_OTHER.items():
        assert name in seen, f"{name} is absent"
        assert set(labels) <= seen[name]
    reasons = {
        dict(ls)["reason"]
        for n, ls in samples(faulty_exposition)
        if n == "clusterhealth_gpu_clocks_event_active"
    }
    assert reasons == SPEC_REASONS


def test_no_sample_is_a_placeholder_zero_for_a_missing_value(faulty_exposition: str) -> None:
    # GPU 4's power sensor fails and GPU 6 is lost: their values are absent, not 0.
    names = {(n, dict(ls).get("gpu")) for n, ls in samples(faulty_exposition)}
    assert ("clusterhealth_gpu_power_watts", "4") not in names
    assert ("clusterhealth_gpu_temperature_celsius", "6") not in names
    assert ("clusterhealth_gpu_up", "6") in names


def test_the_scenarios_job_is_named_on_each_gpu_that_answers(faulty_exposition: str) -> None:
    rows = [dict(ls) for n, ls in samples(faulty_exposition) if n == "clusterhealth_gpu_job_info"]
    # GPU 6 never answered: neither its minor number nor its processes are known.
    assert sorted(r["gpu"] for r in rows) == ["0", "1", "2", "3", "4", "5", "7"]
    for row in rows:
        assert row["uuid"].startswith("GPU-")
        assert (row["scheduler"], row["job"], row["source"]) == ("slurm", JOB, "mapping_dir")
        assert (row["namespace"], row["pod"], row["container"]) == ("", "", "")
    assert value(faulty_exposition, "clusterhealth_gpu_job_unattributed_busy_gpus") == 0
    assert value(faulty_exposition, "clusterhealth_gpu_job_conflicting_gpus") == 0
    assert value(faulty_exposition, "clusterhealth_gpu_job_source_success", source="mapping_dir") == 1
    assert value(faulty_exposition, "clusterhealth_gpu_job_source_success", source="cgroup") == 1


def test_golden_metric_names_follow_prometheus_conventions(faulty_exposition: str) -> None:
    units = (
        "_ratio",
        "_bytes",
        "_bytes_per_second",
        "_hertz",
        "_celsius",
        "_watts",
        "_total",
        "_info",
        "_seconds",
    )
    unitless = {
        "clusterhealth_gpu_up",
        "clusterhealth_gpu_clocks_event_active",
        "clusterhealth_gpu_performance_state",
        "clusterhealth_gpu_remapped_rows",
        "clusterhealth_gpu_row_remap_pending",
        "clusterhealth_gpu_row_remap_failed",
        "clusterhealth_gpu_pcie_link_generation",
        "clusterhealth_gpu_pcie_link_generation_max",
        "clusterhealth_gpu_pcie_link_width",
        "clusterhealth_gpu_pcie_link_width_max",
        "clusterhealth_gpu_nvlink_up",
        "clusterhealth_gpu_nvlink_links_down",
        "clusterhealth_gpu_recovery_action",
        "clusterhealth_gpu_sram_ecc_threshold_exceeded",
        "clusterhealth_gpu_repair_pending",
        "clusterhealth_gpu_memory_unrepairable",
        "clusterhealth_gpu_fabric_degraded",
        "clusterhealth_scrape_collector_success",
        "clusterhealth_check_status",
        "clusterhealth_node_verdict",
        "clusterhealth_rdma_port_state_id",
        "clusterhealth_rdma_port_physical_state_id",
        "clusterhealth_rdma_port_pma_saturated",
        "clusterhealth_rdma_port_pma_saturated_counters",
        "clusterhealth_rdma_device_pcie_link_generation",
        "clusterhealth_rdma_device_pcie_link_generation_max",
        "clusterhealth_rdma_device_pcie_link_width",
        "clusterhealth_rdma_device_pcie_link_width_max",
        "clusterhealth_probe_success",
        "clusterhealth_probe_wrong_values",
        "clusterhealth_probe_peer_success",
        "clusterhealth_probe_round",
        "clusterhealth_probe_group_members",
        "clusterhealth_gpu_job_source_success",
        # counts of things, named by what they count
        "clusterhealth_gpu_job_unattributed_busy_gpus",
        "clusterhealth_gpu_job_conflicting_gpus",
        "clusterhealth_gpu_job_mapping_expired_files",
    }
    for name, labels in samples(faulty_exposition):
        assert "hostname" not in dict(labels) and "host" not in dict(labels)
        assert name.endswith(units) or name in unitless, name


def series_count(exposition: str) -> int:
    return sum(1 for line in exposition.splitlines() if line and not line.startswith("#"))


def test_the_node_at_the_default_settings_stays_within_the_series_budget(tmp_path: Path) -> None:
    node = golden_node(tmp_path)
    # The same node, read without a config file: the default settings.
    flags = node[node.index("--simulate") :]
    flags.remove("--node-name")
    flags.remove("gpu-001")
    result = run_cli("scrape", *flags)
    assert result.returncode == 0, result.stderr
    default = {name for name, _ in samples(result.stdout)}
    series = series_count(result.stdout)
    assert series <= SERIES_BUDGET, f"{series} series at the default settings"
    # The detail is opt-in: every default family is in the golden file, not the other way round.
    golden = {name for name, _ in samples(GOLDEN_FILE.read_text())}
    assert default <= golden | {"clusterhealth_scrape_collector_duration_seconds"} | TIMING
    assert {"clusterhealth_gpu_nvlink_link_errors_total", "clusterhealth_gpu_nvlink_up"} <= golden - default


def test_the_healthy_node_at_the_default_settings_stays_within_the_series_budget(tmp_path: Path) -> None:
    # The node without its faults: all eight GPUs answer, so it exports more than the faulty one
    # (whose GPU 6 is off the bus), every default series of every GPU and HCA.
    scenario = SCENARIOS / "h100-healthy.yaml"
    sim_sysfs.build(tmp_path / "sys", faulty=False)
    kmsg = tmp_path / "kmsg"
    lines = load_scenario(scenario).kernel_log
    kmsg.write_bytes(b"".join(kmsg_record(n, line) for n, (_, line) in enumerate(lines, 1)))
    flags = ["--simulate", str(scenario), "--sysfs-root", str(tmp_path / "sys"), "--kmsg-path", str(kmsg)]
    result = run_cli("scrape", *flags)
    assert result.returncode == 0, result.stderr
    assert value(result.stdout, "clusterhealth_gpu_up", gpu="7") == 1
    assert value(result.stdout, "clusterhealth_rdma_port_state_id", device="mlx5_9", port="1") == 4
    series = series_count(result.stdout)
    assert series <= SERIES_BUDGET, f"{series} series at the default settings"
    # SPEC's nine clock-event reasons stay one series each, on every GPU.
    reasons = {
        dict(ls)["reason"] for n, ls in samples(result.stdout) if n == "clusterhealth_gpu_clocks_event_active"
    }
    assert reasons == SPEC_REASONS
