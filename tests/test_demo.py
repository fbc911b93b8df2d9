"""`clusterhealth demo`: the real command serves the simulated node and points at its faults."""

from __future__ import annotations

from .conftest import run_cli


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
