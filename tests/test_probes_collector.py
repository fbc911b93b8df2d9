"""The probes as a collector: results kept in the state directory for `scrape` and a restarted
agent, a state directory that cannot be written, and the agent's idle guard. Real commands."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .conftest import FIXTURES, AgentProcess, run_cli, scenario, value

CAPTURE = FIXTURES / "nccl-tests" / "08_single_node_8x_h100_allreduce.txt"
REPLAY = {"name": "replay", "kind": "nccl-tests", "argv": ["cat", str(CAPTURE)], "expect": "400 GB/s"}


def config_file(tmp_path: Path, probes: list[dict[str, Any]], **probing: Any) -> Path:
    data = {
        "probing": {"state_dir": str(tmp_path / "state"), **probing},
        "probes": probes,
        "collectors": {
            "kernel_log": {"enabled": False},
            "rdma": {"enabled": False},
            "audit": {"enabled": False},
        },
    }
    path = tmp_path / "clusterhealth.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def probe_run(config: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = run_cli("probe", "run", "--json", "--config", str(config), *args, timeout=120)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def test_scrape_shows_the_last_results_of_a_probe(tmp_path: Path) -> None:
    config = config_file(tmp_path, [REPLAY])
    empty = run_cli("scrape", "--config", str(config), "--simulate", _idle_scenario(tmp_path))
    assert value(empty.stdout, "clusterhealth_probe_runs_total", probe="replay", result="ok") == 0
    assert value(empty.stdout, "clusterhealth_probe_success", probe="replay") is None

    code, runs, _ = probe_run(config, "replay", "--simulate", _idle_scenario(tmp_path))
    assert code == 0 and runs[0]["result"] == "ok", runs

    scraped = run_cli("scrape", "--config", str(config), "--simulate", _idle_scenario(tmp_path)).stdout
    assert value(scraped, "clusterhealth_scrape_collector_success", collector="probes") == 1
    assert value(scraped, "clusterhealth_probe_success", probe="replay") == 1
    assert value(scraped, "clusterhealth_probe_runs_total", probe="replay", result="ok") == 1
    assert (
        value(scraped, "clusterhealth_probe_bandwidth_bytes_per_second", probe="replay", peer="") == 469.715e9
    )
    assert value(scraped, "clusterhealth_probe_expected_bandwidth_bytes_per_second", probe="replay") == 400e9


def _idle_scenario(tmp_path: Path) -> str:
    path = tmp_path / "idle.yaml"
    path.write_text(yaml.safe_dump(scenario()))
    return str(path)


def test_an_unwritable_state_dir_is_a_failed_run_with_its_reason(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")  # even root cannot create a directory beneath a regular file
    probe = {**REPLAY, "interval_seconds": 1, "jitter_seconds": 0}
    config = config_file(tmp_path, [probe], state_dir=str(blocker / "state"), check_gpus_idle=False)

    code, runs, stderr = probe_run(config, "replay")
    assert code == 2, runs
    assert runs[0]["result"] == "failed" and "cannot take the probe lock" in runs[0]["reason"], runs
    assert "Traceback" not in stderr

    agent = agent_process("--config", str(config), "--simulate", _idle_scenario(tmp_path))
    agent.wait_for(
        lambda: (
            (value(agent.metrics(), "clusterhealth_probe_runs_total", probe="replay", result="failed") or 0)
            >= 2
        ),
        what="failed runs counted",
    )
    probes = agent.health()["collectors"]["probes"]
    assert probes["success"] is False and "cannot save probe results" in probes["reason"], probes
    assert agent.health()["status"] == "degraded"
    text = agent.metrics()
    assert value(text, "clusterhealth_scrape_collector_success", collector="probes") == 0
    assert value(text, "clusterhealth_probe_success", probe="replay") == 0  # still exported
    assert "Traceback" not in agent.log()
    assert agent.log().count("cannot save probe results") == 1  # once, not once per run


def test_check_gpus_idle_false_lets_a_probe_run_beside_a_job(
    tmp_path: Path, write_scenario: Callable[..., Path]
) -> None:
    busy = write_scenario(scenario(gpus={0: {"compute_processes": [{"pid": 4242, "used_memory_mib": 1000}]}}))
    guarded = config_file(tmp_path, [REPLAY])
    code, runs, _ = probe_run(guarded, "replay", "--simulate", str(busy))
    assert (code, runs[0]["result"]) == (3, "skipped")
    unguarded = config_file(tmp_path, [REPLAY], check_gpus_idle=False)
    code, runs, _ = probe_run(unguarded, "replay", "--simulate", str(busy))
    assert (code, runs[0]["result"]) == (0, "ok"), runs


def test_the_idle_guard_asks_again_right_before_launch(tmp_path: Path) -> None:
    # The busy command answers "idle" the first time and "busy" (a job arrived meanwhile) after.
    calls = tmp_path / "calls"
    script = tmp_path / "busy"
    script.write_text(f'#!/bin/sh\necho x >> {calls}\n[ "$(wc -l < {calls})" -ge 2 ]\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    config = config_file(tmp_path, [REPLAY], check_gpus_idle=False, busy_command=[str(script)])
    code, runs, _ = probe_run(config, "replay")
    assert (code, runs[0]["result"]) == (3, "skipped"), runs
    assert "busy command exited 0" in runs[0]["reason"]
    assert calls.read_text().count("x") == 2


# NCCL's transport. No capture holds both a whole table and a fallback: each probe prints the real
# INFO lines of one output, then capture 08's real table, as NCCL prints them (INFO lines first).
DEBUG_INFO = FIXTURES / "nccl-tests" / "nccl-debug-info"
SYSFS = FIXTURES / "sysfs" / "cluster-node" / "sys"  # mlx5_0..mlx5_9 and irdma0
SOCKETS = DEBUG_INFO / "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log"
SHM = DEBUG_INFO / "nccl-tests-issue-228_shm_on_nvswitch.log"
TRANSPORT_PROBES = [
    {"name": "sockets", "kind": "nccl-tests", "argv": ["cat", str(SOCKETS), str(CAPTURE)]},
    {"name": "shm", "kind": "nccl-tests", "argv": ["cat", str(SHM), str(CAPTURE)]},
    {"name": "quiet", "kind": "nccl-tests", "argv": ["cat", str(CAPTURE)]},
]


def transport_config(tmp_path: Path, rdma: bool) -> Path:
    path = config_file(tmp_path, TRANSPORT_PROBES)
    data = yaml.safe_load(path.read_text())
    data["collectors"]["rdma"] = {"enabled": rdma}
    data["paths"] = {"sysfs": str(SYSFS)}
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_run_that_fell_back_is_degraded_and_exports_its_transport(tmp_path: Path) -> None:
    config = transport_config(tmp_path, rdma=True)
    idle = _idle_scenario(tmp_path)  # 2 H100s with 18 NVLinks each

    code, runs, _ = probe_run(config, "sockets", "--simulate", idle)
    assert (code, runs[0]["result"]) == (1, "degraded"), runs
    assert (
        "NCCL used sockets (NET/Socket) although the node has RDMA devices (irdma0, mlx5_0"
        in (runs[0]["reason"])
    )
    assert runs[0]["transport"] == {"net": "Socket", "gdrdma": False, "intra": "P2P"}
    code, runs, _ = probe_run(config, "shm", "--simulate", idle)
    assert (code, runs[0]["result"]) == (1, "degraded"), runs
    assert "shared memory (SHM) although the node has 36 NVLink links up" in runs[0]["reason"]
    code, runs, _ = probe_run(config, "quiet", "--simulate", idle)
    assert (code, runs[0]["result"]) == (0, "ok"), runs

    scraped = run_cli("scrape", "--config", str(config), "--simulate", idle).stdout
    info = "clusterhealth_probe_transport_info"
    assert value(scraped, info, probe="sockets", net="Socket", gdrdma="false", intra="P2P") == 1
    assert value(scraped, info, probe="shm", net="", gdrdma="", intra="SHM") == 1
    assert not [line for line in scraped.splitlines() if line.startswith(info) and 'probe="quiet"' in line]
    assert value(scraped, "clusterhealth_probe_success", probe="sockets") == 0
    assert value(scraped, "clusterhealth_probe_runs_total", probe="shm", result="degraded") == 1


def test_what_the_agent_does_not_know_the_node_has_is_no_fallback(
    tmp_path: Path, write_scenario: Callable[..., Path]
) -> None:
    # The rdma collector off (NCCLTransportFallback cannot see the devices either) and GPUs
    # without NVLink: sockets and shared memory are what the node has.
    config = transport_config(tmp_path, rdma=False)
    pcie = write_scenario(scenario(gpus={0: {"nvlinks": 0}, 1: {"nvlinks": 0}}))
    for name in ("sockets", "shm"):
        code, runs, _ = probe_run(config, name, "--simulate", str(pcie))
        assert (code, runs[0]["result"]) == (0, "ok"), runs
        assert runs[0]["transport"]["intra"] in ("P2P", "SHM")


def test_the_agent_judges_its_scheduled_runs_by_the_nvlinks_its_gpu_collector_read(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    shm = {**TRANSPORT_PROBES[1], "interval_seconds": 1, "jitter_seconds": 0}
    config = config_file(tmp_path, [shm], check_gpus_idle=False)
    agent = agent_process("--config", str(config), "--simulate", _idle_scenario(tmp_path))
    agent.wait_for(
        lambda: (
            (value(agent.metrics(), "clusterhealth_probe_runs_total", probe="shm", result="degraded") or 0)
            >= 1
        ),
        what="a degraded run",
    )
    text = agent.metrics()
    assert value(text, "clusterhealth_probe_transport_info", probe="shm", intra="SHM") == 1
    assert "36 NVLink links up" in agent.log()
