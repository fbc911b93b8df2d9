"""`clusterhealth demo`: the real command serves the simulated node and points at its faults."""

from __future__ import annotations

import re
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from clusterhealth.exporters.sim import sysfs as sim_sysfs

from .conftest import CLUSTERHEALTH, ROOT, SCENARIOS, run_cli, value
from .mixin import mixin
from .prom import Prometheus, wait_for


def test_demo_shows_gpu_rdma_and_kernel_log_faults() -> None:
    result = run_cli("demo", "--listen", "127.0.0.1:0", "--interval", "1", "--duration", "8", timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "metrics   http://localhost:" in out
    assert 'clusterhealth_gpu_pcie_link_width{gpu="1",' in out and "} 8.0" in out
    assert 'clusterhealth_gpu_clocks_event_active{gpu="3",reason="hw_thermal_slowdown"' in out
    assert 'clusterhealth_rdma_port_state_id{device="mlx5_3",port="1"} 1.0' in out
    assert 'clusterhealth_netdev_mtu_bytes{interface="enp170s0f1np1"} 1500.0' in out
    assert 'clusterhealth_kernel_events_total{event="pcie_aer_corrected"} 1.0' in out
    assert "(not in the exposition yet)" not in out
    assert "  policy    " in out and out.split("  policy    ", 1)[1].startswith(str(ROOT / "deploy"))


def test_demo_on_a_busy_port_says_so_in_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("demo", "--listen", f"127.0.0.1:{port}", "--duration", "5", timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith(f"clusterhealth: cannot listen on 127.0.0.1:{port}: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_make_demo_listens_where_the_readme_says() -> None:
    """README's "Try it": `make demo LISTEN=HOST:PORT` passes the address to `demo --listen`."""
    (command,) = re.findall(r"`(make demo LISTEN=\S+)`", (ROOT / "README.md").read_text())
    listen = command.split("LISTEN=", 1)[1]
    planned = subprocess.run(
        ["make", "-s", "-n", "-C", str(ROOT), *command.split()[1:]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert planned.stdout.splitlines()[-1].endswith(f"/clusterhealth demo --listen {listen}")
    default = subprocess.run(["make", "-s", "-n", "-C", str(ROOT), "demo"], capture_output=True, text=True)
    assert default.stdout.splitlines()[-1].endswith("/clusterhealth demo --listen 127.0.0.1:9845")


SEVERITY = {2: "critical", 1: "warning"}


def test_the_demos_mtu_fault_alerts_at_the_severity_check_gives_it(tmp_path: Path) -> None:
    """The demo runs the sample config's policy: its RoCE port left at MTU 1500 is a `check`
    result, and a real Prometheus with the generated rules raises MTUMismatch at that severity."""
    demo = subprocess.Popen(
        [CLUSTERHEALTH, "demo", "--listen", "127.0.0.1:0", "--interval", "1", "--duration", "90"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert demo.stdout is not None
        address = ""
        for line in demo.stdout:
            if line.startswith("  metrics   http://localhost:"):
                address = line.split("http://localhost:", 1)[1].split("/", 1)[0]
                break
        url = f"http://127.0.0.1:{address}/metrics"

        def mtu_status() -> float | None:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            return value(text, "clusterhealth_check_status", check="mtu", subject="enp170s0f1np1")

        wait_for(lambda: mtu_status() is not None, 30, "the demo's mtu check")
        status = int(mtu_status() or 0)
        assert status in SEVERITY
        rules = tmp_path / "rules.yaml"
        rules.write_text(mixin.render(mixin.load_config(None, mixin.TEST_PROFILE)))
        scrape = [{"job_name": "clusterhealth", "static_configs": [{"targets": [f"127.0.0.1:{address}"]}]}]
        with Prometheus(tmp_path / "prometheus", scrape, [rules]) as prometheus:

            def mtu_alerts() -> list[dict[str, Any]]:
                return [
                    a
                    for a in prometheus.alerts()
                    if a["labels"]["alertname"] == "MTUMismatch" and a["state"] == "firing"
                ]

            wait_for(lambda: mtu_alerts() != [], 60, "MTUMismatch firing")
            (alert,) = mtu_alerts()
            assert alert["labels"]["interface"] == "enp170s0f1np1"
            assert alert["labels"]["severity"] == SEVERITY[status]
    finally:
        demo.terminate()
        demo.wait(20)
    # `check` on the same simulated node with the same policy names the same fault at that severity.
    sim_sysfs.build(tmp_path / "sys")
    checked = run_cli(
        "check",
        "--only",
        "mtu",
        "--config",
        str(ROOT / "deploy" / "clusterhealth.yaml"),
        "--simulate",
        str(SCENARIOS / "h100-faulty.yaml"),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--kmsg-path",
        "/dev/null",
    )
    assert checked.returncode == status, checked.stdout
    assert f"{SEVERITY[status].upper()}" in checked.stdout and "enp170s0f1np1" in checked.stdout
