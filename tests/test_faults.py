"""Fault injection: each fault, and that the agent keeps serving the rest and says what failed.

The faults are injected at the hardware boundary only (the simulated NVML library, the sysfs
tree, the kernel log file, the probe commands); everything above runs for real. Where a fault is
covered in a file of its own subject, this index says where:

| fault | where |
| --- | --- |
| every NVML error class on each per-GPU call family | `test_nvml_error_on_a_call_family` here |
| a hung NVML call; SIGTERM and SIGHUP while it hangs | test_wiring.py (`*_hangs_*`, `*_leaks_no_thread`) |
| all GPUs lost; zero GPUs | here |
| NVML missing at start and appearing later | here |
| probe that hangs, crashes, floods stdout, prints garbage, binary missing | here |
| state directory unwritable, or full | here (unwritable also in test_probes_collector.py) |
| 50 SIGHUPs in a row: no thread or fd leak | here |
| kernel log: flood, binary garbage, overlong, absurd numbers, truncated | here (the agent) |
| the same, one by one, and an overrun (EPIPE) | test_kmsg.py, test_kernel_watch.py (the reader) |
| kernel log: a source that closes | here |
| sysfs files vanishing mid-read, turned into directories or FIFOs, garbage, huge or negative | here |
| the same, as damaged trees read by the parser | test_rdma_fuzz.py, test_rdma_parser.py |
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.agent.collectors import collect_once
from clusterhealth.agent.exposition import Exposition
from clusterhealth.exporters.sim import nvml as nvml_sim
from clusterhealth.exporters.sim import sysfs as sim_sysfs

from .conftest import FIXTURES, AgentProcess, run_cli, samples, scenario, value

AgentFactory = Callable[..., AgentProcess]

# The NVML error policy as the README states it, written out here rather than read from the code.
ABSENT = ("NotSupported", "FunctionNotFound", "NotFound", "NoData", "Deprecated")
GPU_GONE = ("GpuIsLost", "ResetRequired", "GpuNotFound")
LIBRARY_UNUSABLE = ("Uninitialized", "LibraryNotFound", "DriverNotLoaded", "LibRmVersionMismatch")
OTHER = ("Unknown", "NoPermission", "Timeout", "InsufficientPower", "CorruptedInforom")

# Every per-GPU call the gpu collector makes, and a series that call feeds (None: the call feeds
# no series of its own, e.g. GPM support, or its failure shows only as absent labels).
CALL_FAMILIES = {
    "nvmlDeviceGetName": None,
    "nvmlDeviceGetPciInfo_v3": None,
    "nvmlDeviceGetSerial": None,
    "nvmlDeviceGetVbiosVersion": None,
    "nvmlDeviceGetUtilizationRates": "clusterhealth_gpu_utilization_ratio",
    "nvmlDeviceGetMemoryInfo": "clusterhealth_gpu_memory_used_bytes",
    "nvmlDeviceGetClockInfo": "clusterhealth_gpu_sm_clock_hertz",
    "nvmlDeviceGetMaxClockInfo": "clusterhealth_gpu_sm_clock_max_hertz",
    "nvmlDeviceGetCurrentClocksEventReasons": "clusterhealth_gpu_clocks_event_active",
    "nvmlDeviceGetPerformanceState": "clusterhealth_gpu_performance_state",
    "nvmlDeviceGetTemperature": "clusterhealth_gpu_temperature_celsius",
    "nvmlDeviceGetFieldValues": None,  # the HBM sensor: one label value of the temperature
    "nvmlDeviceGetPowerUsage": "clusterhealth_gpu_power_watts",
    "nvmlDeviceGetEnforcedPowerLimit": "clusterhealth_gpu_power_limit_watts",
    "nvmlDeviceGetTotalEnergyConsumption": "clusterhealth_gpu_energy_joules_total",
    "nvmlDeviceGetTotalEccErrors": "clusterhealth_gpu_ecc_errors_total",
    "nvmlDeviceGetRemappedRows": "clusterhealth_gpu_row_remap_pending",
    "nvmlDeviceGetCurrPcieLinkGeneration": "clusterhealth_gpu_pcie_link_generation",
    "nvmlDeviceGetMaxPcieLinkGeneration": "clusterhealth_gpu_pcie_link_generation_max",
    "nvmlDeviceGetCurrPcieLinkWidth": "clusterhealth_gpu_pcie_link_width",
    "nvmlDeviceGetMaxPcieLinkWidth": "clusterhealth_gpu_pcie_link_width_max",
    "nvmlDeviceGetPcieReplayCounter": "clusterhealth_gpu_pcie_replay_errors_total",
    "nvmlDeviceGetNvLinkState": "clusterhealth_gpu_nvlink_links_down",
    "nvmlDeviceGetNvLinkErrorCounter": "clusterhealth_gpu_nvlink_errors_total",
    "nvmlGpmQueryDeviceSupport": "clusterhealth_gpu_sm_active_ratio",
    "nvmlGpmSampleGet": "clusterhealth_gpu_sm_active_ratio",
    "nvmlGpmMetricsGet": "clusterhealth_gpu_tensor_active_ratio",
    # One item of a call that answers many: its own return code, under the same policy.
    "nvmlGpmMetricsGet(NVML_GPM_METRIC_ANY_TENSOR_UTIL)": "clusterhealth_gpu_tensor_active_ratio",
    "nvmlGpmMetricsGet(NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC)": (
        "clusterhealth_gpu_nvlink_received_bytes_per_second"
    ),
    "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON)": (
        "clusterhealth_gpu_nvlink_rate_bytes_per_second"
    ),
    # One reason of clocks_event_seconds_total: the other reasons are still exported.
    "nvmlDeviceGetFieldValues(NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN)": None,
    "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)": "clusterhealth_gpu_recovery_action",
    "nvmlDeviceGetSramEccErrorStatus": "clusterhealth_gpu_sram_ecc_threshold_exceeded",
    "nvmlDeviceGetRepairStatus": "clusterhealth_gpu_repair_pending",
    "nvmlDeviceGetUnrepairableMemoryFlag_v1": "clusterhealth_gpu_memory_unrepairable",
    "nvmlDeviceGetGpuFabricInfoV": "clusterhealth_gpu_fabric_degraded",
    "nvmlDeviceGetPlatformInfo": None,  # labels of gpu_info
}
# A GPU that answers every call above, so that each call's series is there to be lost.
EVERY_CALL = {
    "memory_repair_supported": True,
    "platform_info": {"chassis_serial": "1821023000123", "slot": 7, "tray": 3, "host_id": 1, "module_id": 2},
}


@pytest.fixture
def empty_node(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sys").mkdir()
    (tmp_path / "kmsg").write_text("")
    return {"paths.sysfs": str(tmp_path / "sys"), "paths.kmsg": str(tmp_path / "kmsg")}


@pytest.fixture
def scrape_in_process(
    write_scenario: Callable[..., Path], empty_node: dict[str, str]
) -> Iterator[Callable[..., tuple[str, dict[str, Any]]]]:
    """One scrape of a simulated node in this process: (exposition, /healthz-like statuses)."""

    def scrape(data: dict[str, Any], gpm: bool = False) -> tuple[str, dict[str, Any]]:
        overrides = {
            **empty_node,
            "simulate": str(write_scenario(data)),
            # GPM waits between its two samples: only where the test is about GPM.
            "collectors.gpu.gpm": gpm,
            "collectors.gpu.gpm_min_window_seconds": 0.05,
            "probing.state_dir": str(Path(empty_node["paths.kmsg"]).parent / "state"),
        }
        node, samplers = collect_once(configuration.load(None, overrides))
        try:
            text = Exposition(lambda: samplers).render().decode()
            return text, {s.name: s.status() for s in samplers}
        finally:
            node.close()
            nvml_sim.uninstall()

    yield scrape


def _gpu_series(text: str, gpu: str) -> set[str]:
    return {name for name, labels in samples(text) if dict(labels).get("gpu") == gpu}


@pytest.mark.parametrize("call", CALL_FAMILIES)
def test_nvml_error_on_a_call_family(
    scrape_in_process: Callable[..., tuple[str, dict[str, Any]]], call: str
) -> None:
    series = CALL_FAMILIES[call]
    gpm = call.startswith("nvmlGpm")
    healthy, _ = scrape_in_process(scenario(gpu=EVERY_CALL), gpm=gpm)
    for error in (*ABSENT, *GPU_GONE, *LIBRARY_UNUSABLE, *OTHER):
        faulty = scenario(gpu=EVERY_CALL, faults=[{"gpu": 0, "errors": {call: error}}])
        text, statuses = scrape_in_process(faulty, gpm=gpm)
        where = f"{call} answering {error}"
        # Whatever the error, the other collectors go on: the Xid counter and the audits ran.
        assert statuses["xid"].success and statuses["audit"].success, where
        if error in LIBRARY_UNUSABLE:
            assert not statuses["gpu"].success and call in (statuses["gpu"].reason or ""), where
            assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 0, where
            continue
        assert statuses["gpu"].success, where
        assert value(text, "clusterhealth_gpu_up", gpu="1") == 1, where
        assert _gpu_series(text, "1") == _gpu_series(healthy, "1"), f"{where}: GPU 1 changed"
        if error in GPU_GONE:
            assert value(text, "clusterhealth_gpu_up", gpu="0") == 0, where
            # A GPU waiting for a reset is still asked what NVML says to do about it; the
            # recovery-action field answers unless the call that failed is the one that reads it.
            field = "nvmlDeviceGetFieldValues"
            reads_it = (field, f"{field}(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)")
            says = error == "ResetRequired" and call not in reads_it
            recovery = {"clusterhealth_gpu_recovery_action"} if says else set()
            assert _gpu_series(text, "0") == {"clusterhealth_gpu_up", *recovery}, where
            if says:
                assert value(text, "clusterhealth_gpu_recovery_action", gpu="0", action="none") == 1, where
            continue
        assert value(text, "clusterhealth_gpu_up", gpu="0") == 1, where
        errors_family = {"clusterhealth_gpu_nvml_errors_total"}
        assert _gpu_series(text, "0") - errors_family <= _gpu_series(healthy, "0"), where
        # Drivers before R535 lack the clock-event call: its older twin feeds the same series.
        fallback = call == "nvmlDeviceGetCurrentClocksEventReasons" and error == "FunctionNotFound"
        # The HBM sensor still answers through the field values.
        if series is not None and not fallback and call != "nvmlDeviceGetTemperature":
            assert series not in _gpu_series(text, "0"), where
        errors = value(text, "clusterhealth_gpu_nvml_errors_total", gpu="0", call=call, error=error)
        if error in ABSENT:
            assert errors is None, f"{where}: an absent value is not an error"
        else:
            assert errors is not None and errors >= 1, f"{where}: an unexpected error is counted"


def test_every_gpu_lost(
    scrape_in_process: Callable[..., tuple[str, dict[str, Any]]],
    write_scenario: Callable[..., Path],
    empty_node: dict[str, str],
) -> None:
    text, statuses = scrape_in_process(scenario(gpu_count=4, faults=[{"gpu": [0, 1, 2, 3], "lost": True}]))
    assert statuses["gpu"].success
    assert [value(text, "clusterhealth_gpu_up", gpu=str(i)) for i in range(4)] == [0, 0, 0, 0]
    assert value(text, "clusterhealth_gpu_driver_info") == 1
    assert all(
        value(text, "clusterhealth_check_status", check="gpu_lost", subject=str(i)) == 2 for i in range(4)
    )
    result = run_cli(
        "check",
        "--format",
        "line",
        "--simulate",
        str(write_scenario(scenario(gpu_count=4, faults=[{"gpu": [0, 1, 2, 3], "lost": True}]))),
        "--sysfs-root",
        empty_node["paths.sysfs"],
        "--kmsg-path",
        empty_node["paths.kmsg"],
    )
    assert result.returncode == 2 and result.stdout.startswith("unhealthy reboot: CRITICAL: gpu_lost 0: "), (
        result.stdout
    )


def test_zero_gpus(scrape_in_process: Callable[..., tuple[str, dict[str, Any]]]) -> None:
    text, statuses = scrape_in_process(scenario(gpu_count=0))
    assert statuses["gpu"].success and statuses["audit"].success
    assert value(text, "clusterhealth_gpu_driver_info") == 1
    assert not [
        n for n, ls in samples(text) if "gpu" in dict(ls) and n != "clusterhealth_gpu_xid_errors_total"
    ]


def test_nvml_missing_at_start_and_appearing_later(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    empty_node: dict[str, str],
) -> None:
    late = scenario(nvml="driver_not_loaded", nvml_until_seconds=3)
    config = tmp_path / "clusterhealth.yaml"
    config.write_text(
        yaml.safe_dump({"collectors": {"gpu": {"interval_seconds": 0.5}, "audit": {"interval_seconds": 1}}})
    )
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(write_scenario(late)),
        "--sysfs-root",
        empty_node["paths.sysfs"],
        "--kmsg-path",
        empty_node["paths.kmsg"],
    )
    agent.wait_for(lambda: agent.health()["collectors"]["gpu"]["success"] is False, what="NVML missing")
    before = agent.metrics()
    assert "Driver Not Loaded" in agent.health()["collectors"]["gpu"]["reason"]
    assert value(before, "clusterhealth_gpu_up", gpu="0") is None
    assert value(before, "clusterhealth_scrape_collector_success", collector="rdma") == 1
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_gpu_up", gpu="1") == 1, what="NVML appearing"
    )
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_check_status", check="gpu_lost", subject="1") == 0,
        what="the audits judging the GPUs",
    )
    assert agent.health()["collectors"]["gpu"]["success"] is True
    assert agent.log().count("Driver Not Loaded") == 1, agent.log()  # logged once, not every cycle


# --- probes --------------------------------------------------------------------------------------


def _probe_config(tmp_path: Path, argv: list[str], **settings: Any) -> Path:
    data = {
        "probing": {
            "state_dir": str(tmp_path / "state"),
            "check_gpus_idle": False,
            "max_output_bytes": 65536,
        },
        "probes": [{"name": "p", "kind": "nccl-tests", "argv": argv, **settings}],
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _probe_run(config: Path) -> tuple[int, dict[str, Any], str]:
    result = run_cli("probe", "run", "p", "--json", "--config", str(config), timeout=120)
    assert result.stdout, result.stderr
    (run,) = json.loads(result.stdout)
    return result.returncode, run, result.stderr


@pytest.mark.parametrize(
    ("argv", "settings", "result", "reason"),
    [
        (["sh", "-c", "sleep 600"], {"timeout_seconds": 1}, "timeout", "timed out"),
        (["sh", "-c", "kill -SEGV $$"], {}, "failed", "killed by SIGSEGV"),
        (["sh", "-c", "yes all_reduce_perf | head -c 50000000"], {}, "failed", "incomplete"),
        (["sh", "-c", "head -c 200000 /dev/urandom"], {}, "failed", "incomplete"),
        (["/nonexistent/all_reduce_perf"], {}, "failed", "not found"),
    ],
    ids=["hangs", "crashes", "floods stdout", "prints garbage", "binary missing"],
)
def test_a_misbehaving_probe_is_a_clear_result(
    tmp_path: Path, argv: list[str], settings: dict[str, Any], result: str, reason: str
) -> None:
    code, run, stderr = _probe_run(_probe_config(tmp_path, argv, **settings))
    assert run["result"] == result and reason in run["reason"], run
    assert code == 2
    assert "Traceback" not in stderr
    scraped = run_cli(
        "scrape", "--config", str(_probe_config(tmp_path, argv, **settings)), "--kmsg-path", "/dev/null"
    )
    assert value(scraped.stdout, "clusterhealth_probe_runs_total", probe="p", result=result) == 1
    assert value(scraped.stdout, "clusterhealth_probe_success", probe="p") == 0


# Real NCCL INFO lines of a run that fell back to sockets (tests/fixtures/nccl-tests/README.md).
SOCKETS_INFO = (
    FIXTURES / "nccl-tests" / "nccl-debug-info" / "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log"
)


@pytest.mark.parametrize(
    ("argv", "settings", "result", "transport"),
    [
        (["sh", "-c", f"cat {SOCKETS_INFO}; kill -SEGV $$"], {}, "failed", ("Socket", "false", "P2P")),
        (
            ["sh", "-c", f"cat {SOCKETS_INFO}; sleep 600"],
            {"timeout_seconds": 2},
            "timeout",
            ("Socket", "false", "P2P"),
        ),
        (["sh", "-c", "head -c 200000 /dev/urandom"], {}, "failed", None),
        (["/nonexistent/all_reduce_perf"], {}, "failed", None),
    ],
    ids=["crashes after its INFO lines", "hangs after its INFO lines", "prints garbage", "binary missing"],
)
def test_the_transport_of_a_run_that_went_wrong_is_what_its_output_said(
    tmp_path: Path, argv: list[str], settings: dict[str, Any], result: str, transport: tuple[str, ...] | None
) -> None:
    # First a run on IB that says so, then the run that goes wrong: the exported transport is the
    # last run's, what its NCCL said before it failed, or none.
    capture = FIXTURES / "nccl-tests" / "08_single_node_8x_h100_allreduce.txt"
    ib_info = (
        FIXTURES / "nccl-tests" / "nccl-debug-info" / "nccl-issue-429_p2p_direct_pointer_and_ib_gdrdma.log"
    )
    config = _probe_config(tmp_path, ["cat", str(ib_info), str(capture)])
    code, run, _ = _probe_run(config)
    assert (code, run["transport"]) == (0, {"net": "IB", "gdrdma": True, "intra": "P2P"}), run
    scraped = run_cli("scrape", "--config", str(config), "--kmsg-path", "/dev/null").stdout
    info = "clusterhealth_probe_transport_info"
    assert value(scraped, info, probe="p", net="IB", gdrdma="true", intra="P2P") == 1
    config = _probe_config(tmp_path, argv, **settings)
    code, run, stderr = _probe_run(config)
    assert (code, run["result"]) == (2, result), run
    assert "Traceback" not in stderr
    scraped = run_cli("scrape", "--config", str(config), "--kmsg-path", "/dev/null")
    assert scraped.returncode == 0 and "Traceback" not in scraped.stderr, scraped.stderr
    rows = [dict(ls) for n, ls in samples(scraped.stdout) if n == info]
    if transport is None:
        assert rows == [], rows
    else:
        assert rows == [{"probe": "p", "net": transport[0], "gdrdma": transport[1], "intra": transport[2]}]
    assert value(scraped.stdout, "clusterhealth_probe_success", probe="p") == 0
    assert value(scraped.stdout, "clusterhealth_scrape_collector_success", collector="probes") == 1


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled up."""
    mount = tmp_path / "full"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        with (mount / "filler").open("wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 4096)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_state_directory_is_reported(
    tmp_path: Path, full_disk: Path, agent_process: AgentFactory, write_scenario: Callable[..., Path]
) -> None:
    capture = Path(__file__).parent / "fixtures" / "nccl-tests" / "08_single_node_8x_h100_allreduce.txt"
    data = {
        "probing": {"state_dir": str(full_disk), "check_gpus_idle": False},
        "probes": [{"name": "p", "argv": ["cat", str(capture)], "interval_seconds": 1, "jitter_seconds": 0}],
        "collectors": {"probes": {"interval_seconds": 0.5}},
    }
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(data))
    agent = agent_process("--config", str(config), "--simulate", str(write_scenario(scenario())))
    agent.wait_for(
        lambda: (value(agent.metrics(), "clusterhealth_probe_runs_total", probe="p", result="ok") or 0) >= 1,
        what="a run counted",
    )
    agent.wait_for(lambda: agent.health()["collectors"]["probes"]["success"] is False, what="the failure")
    assert "No space left on device" in agent.health()["collectors"]["probes"]["reason"]
    assert value(agent.metrics(), "clusterhealth_probe_success", probe="p") == 1
    assert "Traceback" not in agent.log()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _thread_names(pid: int) -> list[str]:
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
    return sorted(names)


def test_a_sigterm_amid_a_storm_of_sighups_stops_the_agent(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], empty_node: dict[str, str]
) -> None:
    """A signal handler runs between any two bytecodes of the main thread, inside another handler
    too: one that takes a lock (an Event's set()) deadlocked when SIGTERM came inside a SIGHUP's,
    and the agent never stopped (systemd would kill it after TimeoutStopSec)."""
    for _ in range(3):
        agent = agent_process(
            "--simulate",
            str(write_scenario(scenario())),
            "--sysfs-root",
            empty_node["paths.sysfs"],
            "--kmsg-path",
            empty_node["paths.kmsg"],
        )
        agent.wait_for(
            lambda agent=agent: agent.health()["collectors"]["gpu"]["success"], what="the gpu collector"
        )
        for n in range(400):
            agent.signal(signal.SIGTERM if n == 200 else signal.SIGHUP)
        try:
            code = agent.proc.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not stop within 20 s of SIGTERM:\n{agent.log()}") from None
        assert code == 0, agent.log()


def test_fifty_sighups_in_a_row_leak_no_thread_or_fd(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    empty_node: dict[str, str],
) -> None:
    config = tmp_path / "clusterhealth.yaml"
    settings = {"collectors": {"gpu": {"interval_seconds": 0.5}, "rdma": {"interval_seconds": 0.5}}}
    config.write_text(yaml.safe_dump(settings))
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(write_scenario(scenario())),
        "--sysfs-root",
        empty_node["paths.sysfs"],
        "--kmsg-path",
        empty_node["paths.kmsg"],
    )
    agent.wait_for(
        lambda: all(c["success"] for c in agent.health()["collectors"].values()), what="every collector"
    )
    pid = agent.proc.pid
    threads, fds = _threads(pid), _fds(pid)
    for n in range(50):
        if n % 2:  # a change every other time, so collectors are rebuilt, not only kept
            settings["collectors"]["rdma"]["interval_seconds"] = 0.5 + n / 100
            config.write_text(yaml.safe_dump(settings))
        agent.signal(signal.SIGHUP)
    agent.wait_for(lambda: agent.log().count("configuration reloaded") >= 1, what="reloads")
    agent.wait_for(
        lambda: all(c["success"] for c in agent.health()["collectors"].values()), what="every collector again"
    )
    # A scrape's connection thread may still be closing: a leak is what stays.
    try:
        agent.wait_for(lambda: _threads(pid) <= threads and _fds(pid) <= fds, timeout=10, what="no leak")
    except AssertionError as error:
        left = f"threads {threads} -> {_threads(pid)} {_thread_names(pid)}, fds {fds} -> {_fds(pid)}"
        raise AssertionError(f"{left}\n{error}") from None
    assert agent.proc.poll() is None


# --- kernel log ----------------------------------------------------------------------------------

XID_79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid=0, name=, GPU has fallen off the bus."


def _record(seq: int, message: str) -> bytes:
    return b"4,%d,%d,-;%s\n" % (seq, 5_000_000 + seq, message.encode())


def test_kernel_log_garbage_floods_and_truncation_leave_the_agent_serving(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    empty_node: dict[str, str],
) -> None:
    kmsg = Path(empty_node["paths.kmsg"])
    noise = os.urandom(64 * 1024).replace(b"\n", b"")  # binary garbage, one overlong "line"
    absurd = b"6," + b"9" * 5000 + b",1,-;no kernel prints this\n"
    flood = b"".join(_record(n, f"usb 1-1: new device {n}") for n in range(2, 30_002))
    kmsg.write_bytes(noise + b"\n" + absurd + _record(1, XID_79) + flood)
    config = tmp_path / "clusterhealth.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "collectors": {
                    "kernel_log": {
                        "interval_seconds": 0.5,
                        "max_records_per_cycle": 5000,
                        "include_metrics": ["clusterhealth_kernel_log_records_total"],
                    }
                }
            }
        )
    )
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(write_scenario(scenario())),
        "--sysfs-root",
        empty_node["paths.sysfs"],
        "--kmsg-path",
        str(kmsg),
    )
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_kernel_log_records_total") == 30_001,
        timeout=60,
        what="the flood read in bounded cycles",
    )
    text = agent.metrics()
    assert value(text, "clusterhealth_gpu_xid_errors_total", xid="79") == 1
    assert value(text, "clusterhealth_kernel_log_malformed_records_total") >= 2
    assert value(text, "clusterhealth_scrape_collector_success", collector="kernel_log") == 1
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 1
    # Truncated and written again (logrotate's copytruncate): followed, nothing counted twice.
    kmsg.write_bytes(_record(1, XID_79) + _record(30_002, XID_79.replace("1b:00", "43:00")))
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_gpu_xid_errors_total", xid="79", gpu="1") == 1,
        what="the line written after the truncation",
    )
    assert value(agent.metrics(), "clusterhealth_gpu_xid_errors_total", xid="79", gpu="0") == 1


def test_a_kernel_log_source_that_closes(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    empty_node: dict[str, str],
) -> None:
    # A FIFO fed by a forwarder that goes away and comes back (a log shipper restarting).
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    keep_open = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # so the agent's open does not wait
    config = tmp_path / "clusterhealth.yaml"
    records = ["clusterhealth_kernel_log_records_total"]
    config.write_text(
        yaml.safe_dump({"collectors": {"kernel_log": {"interval_seconds": 0.5, "include_metrics": records}}})
    )
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(write_scenario(scenario())),
        "--sysfs-root",
        empty_node["paths.sysfs"],
        "--kmsg-path",
        str(fifo),
    )
    try:
        os.write(keep_open, _record(1, XID_79))
        agent.wait_for(
            lambda: value(agent.metrics(), "clusterhealth_gpu_xid_errors_total", xid="79") == 1,
            what="the Xid",
        )
    finally:
        os.close(keep_open)  # the writer goes away: end of file, not an error
    agent.wait_for(
        lambda: (value(agent.metrics(), "clusterhealth_kernel_log_records_total") or 0) >= 1, what="a read"
    )
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # and comes back
    try:
        os.write(writer, _record(2, XID_79.replace("1b:00", "43:00")))
        agent.wait_for(
            lambda: value(agent.metrics(), "clusterhealth_gpu_xid_errors_total", xid="79", gpu="1") == 1,
            what="the Xid after the writer came back",
        )
    finally:
        os.close(writer)
    assert value(agent.metrics(), "clusterhealth_scrape_collector_success", collector="kernel_log") == 1


# --- sysfs ---------------------------------------------------------------------------------------


def test_a_sysfs_tree_damaged_while_the_agent_reads_it(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    empty_node: dict[str, str],
) -> None:
    """A thread damages mlx5_5's counters while the agent reads the tree every half second: files
    vanish, come back as directories, FIFOs, garbage, thousands of digits or negative numbers.
    The other devices' values stay exact and the collector keeps succeeding."""
    sys_root = tmp_path / "sys"
    sim_sysfs.build(sys_root, faulty=False)
    config = tmp_path / "clusterhealth.yaml"
    config.write_text(yaml.safe_dump({"collectors": {"rdma": {"interval_seconds": 0.5}}}))
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(write_scenario(scenario())),
        "--sysfs-root",
        str(sys_root),
        "--kmsg-path",
        empty_node["paths.kmsg"],
    )
    agent.wait_for(
        lambda: all(c["success"] for c in agent.health()["collectors"].values()), what="a first read of all"
    )
    intact = {(n, ls): v for (n, ls), v in samples(agent.metrics()).items() if ("device", "mlx5_0") in ls}
    counters = sys_root / "class" / "infiniband" / "mlx5_5" / "ports" / "1" / "counters"
    files = sorted(p.name for p in counters.iterdir())
    damage = [
        lambda p: p.unlink(),
        lambda p: (p.unlink(), p.mkdir()),
        lambda p: (p.unlink(), os.mkfifo(p)),
        lambda p: p.write_bytes(os.urandom(64)),
        lambda p: p.write_text("9" * 5000 + "\n"),
        lambda p: p.write_text("-42\n"),
        lambda p: p.write_text(""),
    ]
    stop = threading.Event()

    def vandal() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            path = counters / rng.choice(files)
            with contextlib.suppress(OSError):
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    rng.choice(damage)(path)
                else:
                    path.write_text("7\n")
            time.sleep(0.001)

    thread = threading.Thread(target=vandal, daemon=True)
    thread.start()
    reads = []
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            text = agent.metrics()
            reads.append(value(text, "clusterhealth_scrape_collector_duration_seconds", collector="rdma"))
            assert value(text, "clusterhealth_scrape_collector_success", collector="rdma") == 1
            assert value(text, "clusterhealth_gpu_up", gpu="0") == 1
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(5)
    assert len(set(reads)) >= 3, "the collector should have read the tree several times meanwhile"
    now = samples(agent.metrics())
    assert {k: now.get(k) for k in intact} == intact
    assert agent.health()["status"] == "ok"
