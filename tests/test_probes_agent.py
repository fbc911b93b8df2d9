"""Probes end to end: `clusterhealth probe run` and the agent's schedule, with real iperf3 on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.checks.probes import ProbeLock
from clusterhealth.checks.probes.settings import parse_bandwidth

from .conftest import ROOT, AgentProcess, require_tool, run_cli, scenario, value
from .prom import free_port

needs_iperf3 = pytest.mark.usefixtures("iperf3")


@pytest.fixture
def iperf3() -> str:
    return require_tool("iperf3")


@pytest.fixture
def iperf3_server(iperf3: str) -> Iterator[int]:
    """A real iperf3 server on loopback, serving any number of tests."""
    port = free_port()
    server = subprocess.Popen([iperf3, "-s", "-B", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield port
    server.terminate()
    server.wait(10)


def write_config(tmp_path: Path, probes: list[dict[str, Any]], **extra: Any) -> Path:
    data = {
        "probing": {"state_dir": str(tmp_path / "state"), **extra.pop("probing", {})},
        "probes": probes,
        "collectors": {
            "kernel_log": {"enabled": False},
            "rdma": {"enabled": False},
            "audit": {"enabled": False},
        },
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def iperf3_probe(port: int, *extra_args: str, **settings: Any) -> dict[str, Any]:
    argv = ["iperf3", "-c", "{peer}", "-p", str(port), "-t", "1", "-J", *extra_args]
    return {"name": "loopback", "kind": "iperf3", "argv": argv, "peers": ["127.0.0.1"], **settings}


def probe_run(config: Path, name: str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    result = run_cli("probe", "run", name, "--json", "--config", str(config), *args, timeout=120)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


@needs_iperf3
def test_iperf3_probe_against_a_real_server(tmp_path: Path, iperf3_server: int) -> None:
    config = write_config(tmp_path, [iperf3_probe(iperf3_server)], collectors={"gpu": {"enabled": False}})
    code, runs = probe_run(config, "loopback")
    assert code == 0, runs
    (run,) = runs
    assert run["result"] == "ok" and run["peer"] == "127.0.0.1"
    assert run["bandwidth_bytes_per_second"] > 1e8  # loopback moves well over 100 MB/s
    assert run["command"].startswith("iperf3 -c 127.0.0.1 -p ")


@needs_iperf3
def test_baseline_persists_across_runs_and_a_slow_run_is_degraded(tmp_path: Path, iperf3_server: int) -> None:
    probing = {"baseline_min_runs": 3}
    config = write_config(
        tmp_path, [iperf3_probe(iperf3_server)], collectors={"gpu": {"enabled": False}}, probing=probing
    )
    for _ in range(3):  # each `probe run` is a new process: the baseline lives in state_dir
        code, runs = probe_run(config, "loopback")
        assert runs[0]["result"] == "ok" and runs[0]["expected_bytes_per_second"] is None
    stored = json.loads((tmp_path / "state" / "probe-baselines.json").read_text())
    assert "loopback" in json.dumps(stored)
    # The same probe, now held to 50 Mbit/s by iperf3's own pacing: far below the learned median.
    slow = write_config(
        tmp_path,
        [iperf3_probe(iperf3_server, "-b", "50M")],
        collectors={"gpu": {"enabled": False}},
        probing=probing,
    )
    code, runs = probe_run(slow, "loopback")
    assert runs[0]["result"] == "degraded", runs
    assert code == 1
    assert runs[0]["bandwidth_bytes_per_second"] < 0.8 * runs[0]["expected_bytes_per_second"]


@needs_iperf3
def test_configured_expectation_is_used_as_is(tmp_path: Path, iperf3_server: int) -> None:
    probe = iperf3_probe(iperf3_server, expect="100000 Gb/s")
    config = write_config(tmp_path, [probe], collectors={"gpu": {"enabled": False}})
    code, runs = probe_run(config, "loopback")
    assert runs[0]["result"] == "degraded" and code == 1
    assert runs[0]["expected_bytes_per_second"] == 12.5e12  # 100000 Gb/s


def test_missing_binary_fails_with_the_reason(tmp_path: Path) -> None:
    probe = {
        "name": "nccl",
        "kind": "nccl-tests",
        "argv": ["/opt/nccl-tests/build/all_reduce_perf", "-g", "8"],
    }
    config = write_config(tmp_path, [probe], collectors={"gpu": {"enabled": False}})
    code, runs = probe_run(config, "nccl")
    assert code == 2
    assert runs[0]["result"] == "failed"
    assert "not found" in runs[0]["reason"]


def test_hung_probe_times_out_and_leaves_no_process(tmp_path: Path) -> None:
    # A duration of this run's own, so that another test run on the machine is not taken for a leak.
    seconds = f"300.{os.getpid()}"
    probe = {
        "name": "hang",
        "kind": "iperf3",
        "argv": ["sh", "-c", f"sleep {seconds} & sleep {seconds}"],
        "timeout_seconds": 1,
    }
    config = write_config(tmp_path, [probe], collectors={"gpu": {"enabled": False}})
    code, runs = probe_run(config, "hang")
    assert runs[0]["result"] == "timeout" and code == 2
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", seconds]]


def test_a_held_lock_makes_the_run_skip(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, [{"name": "p", "kind": "iperf3", "argv": ["true"]}], collectors={"gpu": {"enabled": False}}
    )
    (tmp_path / "state").mkdir()
    with ProbeLock(tmp_path / "state" / "probe.lock", "another-agent"):
        code, runs = probe_run(config, "p")
    assert runs[0]["result"] == "skipped" and code == 3
    assert "another-agent" in runs[0]["reason"]


def test_busy_gpu_makes_the_run_skip(tmp_path: Path, write_scenario: Callable[..., Path]) -> None:
    busy = scenario(gpus={1: {"compute_processes": [{"pid": 48211, "used_memory_mib": 70000}]}})
    config = write_config(tmp_path, [{"name": "p", "kind": "iperf3", "argv": ["true"]}])
    code, runs = probe_run(config, "p", "--simulate", str(write_scenario(busy)))
    assert runs[0]["result"] == "skipped" and code == 3
    assert "GPU 1" in runs[0]["reason"] and "48211" in runs[0]["reason"]


def test_unknown_probe_name_is_a_usage_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, [{"name": "p", "kind": "iperf3", "argv": ["true"]}])
    result = run_cli("probe", "run", "nope", "--config", str(config))
    assert result.returncode == 2
    assert "no probe named 'nope' (probes: p)" in result.stderr


@needs_iperf3
def test_scheduled_probe_runs_inside_the_agent(
    tmp_path: Path,
    iperf3_server: int,
    agent_process: Callable[..., AgentProcess],
    write_scenario: Callable[..., Path],
) -> None:
    probe = iperf3_probe(iperf3_server, interval_seconds=2, jitter_seconds=0)
    config = write_config(tmp_path, [probe])
    agent = agent_process("--config", str(config), "--simulate", str(write_scenario(scenario())))

    def ran() -> bool:
        return (
            value(agent.metrics(), "clusterhealth_probe_runs_total", probe="loopback", result="ok") or 0
        ) >= 1

    agent.wait_for(ran, timeout=30, what="a scheduled probe run")
    text = agent.metrics()
    assert value(text, "clusterhealth_probe_success", probe="loopback") == 1
    assert (
        value(text, "clusterhealth_probe_bandwidth_bytes_per_second", probe="loopback", peer="127.0.0.1")
        > 1e8
    )
    assert value(text, "clusterhealth_probe_runs_total", probe="loopback", result="failed") == 0
    assert value(text, "clusterhealth_probe_last_run_timestamp_seconds", probe="loopback") == pytest.approx(
        time.time(), abs=60
    )
    assert value(text, "clusterhealth_probe_duration_seconds", probe="loopback") > 0


def test_scheduled_probe_skips_while_a_gpu_is_busy(
    tmp_path: Path, agent_process: Callable[..., AgentProcess], write_scenario: Callable[..., Path]
) -> None:
    busy = scenario(gpus={0: {"compute_processes": [{"pid": 4242, "used_memory_mib": 1000}]}})
    probe = {"name": "p", "kind": "iperf3", "argv": ["true"], "interval_seconds": 1, "jitter_seconds": 0}
    agent = agent_process(
        "--config", str(write_config(tmp_path, [probe])), "--simulate", str(write_scenario(busy))
    )
    agent.wait_for(
        lambda: (
            (value(agent.metrics(), "clusterhealth_probe_runs_total", probe="p", result="skipped") or 0) >= 1
        ),
        timeout=30,
        what="a skipped run",
    )
    text = agent.metrics()
    assert value(text, "clusterhealth_probe_runs_total", probe="p", result="ok") == 0
    assert value(text, "clusterhealth_probe_success", probe="p") is None  # skipped runs do not count
    assert any("GPU 0 runs" in line for line in agent.lines)


def test_sample_config_is_valid_and_its_commands_fill_in(tmp_path: Path) -> None:
    config = configuration.load(ROOT / "deploy" / "clusterhealth.yaml")
    # Its pairwise group, enabled, with the sample inventory where the sample looks for it.
    data = yaml.safe_load((ROOT / "deploy" / "clusterhealth.yaml").read_text())
    (group,) = data["pairwise_groups"]
    assert group["members_file"] == "/etc/clusterhealth/members.yaml"
    group.update(enabled=True, members_file=str(ROOT / "deploy" / "members.yaml"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    (fabric,) = configuration.load(tmp_path / "c.yaml").pairwise_groups
    assert len(fabric.members) == 4 and fabric.timing().problem() is None
    names = {p.name for p in config.probes}
    assert {"nccl-allreduce-local", "nccl-allreduce-ib-loopback", "ib-write-bw-loopback"} <= names
    kinds = {p.kind for p in config.probes}
    assert kinds == {"nccl-tests", "ib_write_bw", "iperf3", "nvbandwidth"}
    ib = next(p for p in config.probes if p.name == "ib-write-bw-loopback")
    assert len(ib.peers) == 8
    assert parse_bandwidth(ib.expect) == 48.75e9  # 390 Gb/s
