"""`clusterhealth agent` as a real process: serving, reloading, shutting down, surviving NVML faults."""

from __future__ import annotations

import ctypes.util
import gzip
import signal
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import AgentProcess, scenario, value

AgentFactory = Callable[..., AgentProcess]


def config_file(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "clusterhealth.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fast_gpu(**extra: Any) -> dict[str, Any]:
    return {
        "collectors": {
            "gpu": {"interval_seconds": 0.5, "gpm_min_window_seconds": 0.05, **extra},
            "kernel_log": {"enabled": False},
        }
    }


def test_serves_metrics_and_healthz(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    agent = agent_process(
        "--config", str(config_file(tmp_path, fast_gpu())), "--simulate", str(write_scenario(scenario()))
    )
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    text = agent.metrics()
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 1
    assert value(text, "clusterhealth_gpu_up", gpu="1") == 1
    health = agent.health()
    assert health["status"] == "ok"
    gpu = health["collectors"]["gpu"]
    assert gpu["success"] is True and gpu["reason"] is None
    assert gpu["last_success"].endswith("Z")
    assert 0 <= gpu["last_success_age_seconds"] < 5
    status, _, _ = agent.get("/")
    assert status == 200
    with pytest.raises(urllib.error.HTTPError) as missing:
        agent.get("/nope")
    assert missing.value.code == 404


def test_metrics_are_gzipped_for_scrapers_that_ask(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    agent = agent_process(
        "--config", str(config_file(tmp_path, fast_gpu())), "--simulate", str(write_scenario(scenario()))
    )
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    request = urllib.request.Request(agent.url + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"clusterhealth_gpu_up" in gzip.decompress(response.read())


def test_sighup_applies_a_changed_config(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    path = config_file(tmp_path, fast_gpu())
    agent = agent_process("--config", str(path), "--simulate", str(write_scenario(scenario())))
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    path.write_text(yaml.safe_dump({"collectors": {"gpu": {"enabled": False}}}))
    agent.signal(signal.SIGHUP)
    agent.wait_for(lambda: "clusterhealth_gpu_up" not in agent.metrics(), what="GPU series to go")
    assert 'collector="gpu"' not in agent.metrics()
    assert any("configuration reloaded" in line for line in agent.lines)
    assert agent.proc.poll() is None


def test_bad_reload_keeps_the_running_config(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    path = config_file(tmp_path, fast_gpu())
    agent = agent_process("--config", str(path), "--simulate", str(write_scenario(scenario())))
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    path.write_text("collectors:\n  gpu:\n    interval_seconds: never\n")
    agent.signal(signal.SIGHUP)
    agent.wait_for(lambda: any("reload failed" in line for line in agent.lines), what="the reload error")
    error = next(line for line in agent.lines if "reload failed" in line)
    assert "level=error" in error
    assert "collectors.gpu.interval_seconds: expected a number" in error
    assert value(agent.metrics(), "clusterhealth_gpu_up", gpu="0") == 1
    assert agent.health()["collectors"]["gpu"]["interval_seconds"] == 0.5
    assert agent.proc.poll() is None


def test_sigterm_shuts_down_cleanly(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    agent = agent_process(
        "--config", str(config_file(tmp_path, fast_gpu())), "--simulate", str(write_scenario(scenario()))
    )
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    assert agent.stop() == 0
    assert any("shutting down" in line for line in agent.lines)
    assert not any("Traceback" in line for line in agent.lines)


def test_hung_nvml_call_does_not_block_metrics(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    # From 2 s on, every temperature query on GPU 0 blocks for 60 s, as a wedged driver does.
    hung = scenario(faults=[{"gpu": 0, "from_seconds": 2, "hang": {"nvmlDeviceGetTemperature": 60}}])
    config = config_file(tmp_path, fast_gpu(timeout_seconds=1))
    agent = agent_process("--config", str(config), "--simulate", str(write_scenario(hung)))
    agent.wait_for(lambda: "clusterhealth_gpu_up" in agent.metrics(), what="GPU series")
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_scrape_collector_success", collector="gpu") == 0,
        what="the hung collection to be reported",
    )
    # Each scrape answers while the call stays hung (60 s, past the client's 5 s timeout); how fast
    # it answers is benchmarks/fault_latency.py's business.
    assert all(agent.get("/metrics")[0] == 200 for _ in range(5))
    text = agent.metrics()
    assert "clusterhealth_gpu_up" not in text  # stale series are withheld, not served as current
    assert value(text, "clusterhealth_build_info") == 1
    health = agent.health()
    assert health["status"] == "degraded"
    assert "running for" in health["collectors"]["gpu"]["reason"]


def test_same_failure_is_logged_once(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    broken = scenario(faults=[{"gpu": 1, "errors": {"nvmlDeviceGetPowerUsage": "Unknown"}}])
    agent = agent_process(
        "--config", str(config_file(tmp_path, fast_gpu())), "--simulate", str(write_scenario(broken))
    )
    errors = "clusterhealth_gpu_nvml_errors_total"
    agent.wait_for(
        lambda: (value(agent.metrics(), errors, gpu="1", call="nvmlDeviceGetPowerUsage") or 0) >= 4,
        what="several failing cycles",
    )
    assert sum("nvmlDeviceGetPowerUsage" in line for line in agent.lines) == 1


def test_gpu_falling_off_the_bus_while_running(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    lost = scenario(faults=[{"gpu": 1, "from_seconds": 2, "lost": True, "xid": [79]}])
    agent = agent_process(
        "--config", str(config_file(tmp_path, fast_gpu())), "--simulate", str(write_scenario(lost))
    )
    agent.wait_for(lambda: value(agent.metrics(), "clusterhealth_gpu_up", gpu="1") == 1, what="GPU 1 up")
    agent.wait_for(lambda: value(agent.metrics(), "clusterhealth_gpu_up", gpu="1") == 0, what="GPU 1 down")
    text = agent.metrics()
    # The uuid learnt before the loss stays on the series, and NVML's Xid 79 event is counted.
    up_line = next(line for line in text.splitlines() if line.startswith('clusterhealth_gpu_up{gpu="1"'))
    assert 'uuid="GPU-' in up_line
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_gpu_xid_errors_total", gpu="1", xid="79") == 1,
        what="Xid 79",
    )
    assert value(agent.metrics(), "clusterhealth_gpu_up", gpu="0") == 1
    assert value(agent.metrics(), "clusterhealth_scrape_collector_success", collector="gpu") == 1
    assert sum("GPU 1" in line and "is down" in line for line in agent.lines) == 1


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has a real NVML")
def test_without_nvml_library_the_agent_keeps_serving(agent_process: AgentFactory, tmp_path: Path) -> None:
    # No --simulate: the real pynvml looks for libnvidia-ml.so.1, which this machine lacks.
    agent = agent_process("--config", str(config_file(tmp_path, fast_gpu())))
    agent.wait_for(lambda: 'collector="gpu"' in agent.metrics(), what="a first collection")
    text = agent.metrics()
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 0
    assert "clusterhealth_gpu_up" not in text
    reason = agent.health()["collectors"]["gpu"]["reason"]
    assert "NVML Shared Library Not Found" in reason
    agent.wait_for(lambda: agent.health()["collectors"]["gpu"]["last_duration_seconds"] is not None)
    with ThreadPoolExecutor(4) as pool:
        assert all(status == 200 for status, _, _ in pool.map(lambda _: agent.get("/metrics"), range(8)))
    # Logged once, not on every 0.5 s cycle.
    assert sum("NVML Shared Library Not Found" in line for line in agent.lines) == 1


def test_the_agent_raises_its_open_file_limit_within_the_hard_limit(
    agent_process: AgentFactory, write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    agent = agent_process(
        "--config",
        str(config_file(tmp_path, fast_gpu())),
        "--simulate",
        str(write_scenario(scenario())),
        preexec_fn=limit,
    )
    limits = Path(f"/proc/{agent.proc.pid}/limits").read_text()
    (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3:5] == ["4096", "4096"], line
