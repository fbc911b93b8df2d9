"""Node audits and health checks on the sysfs fixture trees and on hand-built GPU readings.

The RDMA side is read from tests/fixtures/sysfs/cluster-node (a DGX H100-class node with a down
port, an x8 HCA, a firmware outlier and an MTU outlier), copied to a temporary directory when a
test repairs or breaks a file. The GPU side is `GpuReading` records, the typed boundary of NVML.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.checks.audits import (
    CRITICAL,
    OK,
    UNKNOWN,
    WARNING,
    CheckResult,
    Observations,
    firmware_inventory,
    run_audits,
    worst,
)
from clusterhealth.checks.audits.gpu_health import RECOVERY_ADVICE
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.checks.policy import (
    CHECK_NAMES,
    FirmwarePolicy,
    GpuHealthPolicy,
    HcaCountRule,
    MtuRule,
    PciePolicy,
    Policy,
    RdmaPortRule,
)
from clusterhealth.exporters.gpu import CLOCK_EVENT_REASONS, GpuReading
from clusterhealth.exporters.infiniband import RdmaDevice, read_rdma_devices
from clusterhealth.exporters.netdev import read_netdev_mtus
from clusterhealth.exporters.nvml_health import RECOVERY_ACTIONS, NvmlHealth

CLUSTER = Path(__file__).parent / "fixtures" / "sysfs" / "cluster-node" / "sys"
GPU_IDLE = dict(CLOCK_EVENT_REASONS)["gpu_idle"]
H100 = "NVIDIA H100 80GB HBM3"
# The PCI functions of a DGX H100's eight GPUs.
H100_BUSES = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")
IB_DEVICES = [f"mlx5_{i}" for i in range(8)]
NOW = 10_000.0  # seconds since boot


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of cluster-node/sys that a test may change."""
    copy = tmp_path / "sys"
    shutil.copytree(CLUSTER, copy, symlinks=True)
    return copy


def write(path: Path, text: str) -> None:
    # Files in class/ are reached through the tree's relative symlinks, so this edits the copy.
    path.write_text(text + "\n")


def h100(index: int, **changes: Any) -> GpuReading:
    """One healthy, busy H100 SXM as NVML reads it."""
    reading = GpuReading(
        index=index,
        uuid=f"GPU-5c2a7e1d-0000-4000-8000-00000000000{index}",
        up=True,
        name=H100,
        pci_bus_id=f"00000000:{H100_BUSES[index]}:00.0",
        serial=f"165322001234{index}",
        vbios_version="96.00.99.00.01",
        utilization_ratio=0.97,
        clocks_event_reasons=0,
        performance_state=0,
        ecc_errors={
            ("corrected", "volatile"): 0,
            ("corrected", "aggregate"): 12,
            ("uncorrected", "volatile"): 0,
            ("uncorrected", "aggregate"): 0,
        },
        remapped_rows={"correctable": 1, "uncorrectable": 0},
        row_remap_pending=False,
        row_remap_failed=False,
        pcie_link_generation=5,
        pcie_link_generation_max=5,
        pcie_link_width=16,
        pcie_link_width_max=16,
    )
    return dataclasses.replace(reading, **changes)


def healthy_node(**changed: GpuReading) -> list[GpuReading]:
    """Eight healthy H100s, with some replaced: healthy_node(gpu3=h100(3, up=False))."""
    gpus = [h100(i) for i in range(8)]
    for name, reading in changed.items():
        gpus[int(name.removeprefix("gpu"))] = reading
    return gpus


def lost(index: int) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-5c2a7e1d-0000-4000-8000-00000000000{index}",
        up=False,
        down_reason="nvmlDeviceGetHandleByIndex: GPU is lost",
    )


def audit(
    policy: Policy | None = None,
    *,
    gpus: Sequence[GpuReading] | None = (),
    driver_version: str | None = "550.90.07",
    rdma: Sequence[RdmaDevice] | None = (),
    netdev_mtus: Mapping[str, int] | None = None,
    events: Sequence[SeenEvent] | None = (),
    now: float = NOW,
) -> list[CheckResult]:
    """run_audits with no hardware unless told: only the sources a test gives produce results."""
    return run_audits(
        policy or Policy(),
        Observations.of(
            gpus=gpus,
            driver_version=driver_version,
            rdma=rdma,
            netdev_mtus={} if netdev_mtus is None else netdev_mtus,
            kernel_events=events,
            now_boot_seconds=now,
        ),
    )


def of(results: Sequence[CheckResult], check: str) -> dict[str, CheckResult]:
    found = [r for r in results if r.check == check]
    by_subject = {r.subject: r for r in found}
    assert len(by_subject) == len(found), f"duplicate subjects in {check}"
    return by_subject


def of_all(results: Sequence[CheckResult], check: str) -> list[CheckResult]:
    return [r for r in results if r.check == check]


def statuses(results: Sequence[CheckResult], check: str) -> dict[str, int]:
    return {subject: r.status for subject, r in of(results, check).items()}


def not_ok(results: Sequence[CheckResult]) -> list[tuple[str, str, int]]:
    return [(r.check, r.subject, r.status) for r in results if r.status != OK]


# --- mtu -----------------------------------------------------------------------------------------

MTU_POLICY = Policy(mtu=(MtuRule("ibp.*", 4092), MtuRule("enp170s0f[01]np[01]", 9000)))


def test_mtu_finds_the_roce_port_left_at_1500() -> None:
    results = audit(MTU_POLICY, netdev_mtus=read_netdev_mtus(CLUSTER))
    assert statuses(results, "mtu") == {
        "enp170s0f0np0": OK,
        "enp170s0f1np1": CRITICAL,
        **{name: OK for name in ("ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0")},
        **{name: OK for name in ("ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0")},
    }
    assert [r.subject for r in results][:3] == ["enp170s0f0np0", "enp170s0f1np1", "ibp24s0"]
    message = of(results, "mtu")["enp170s0f1np1"].message
    assert message.startswith("enp170s0f1np1 MTU 1500, expected 9000 (pattern enp170s0f[01]np[01])")


def test_mtu_passes_once_the_port_is_set_to_9000(tree: Path) -> None:
    write(tree / "class" / "net" / "enp170s0f1np1" / "mtu", "9000")
    results = audit(MTU_POLICY, netdev_mtus=read_netdev_mtus(tree))
    assert len(results) == 10 and not not_ok(results)
    assert (
        of(results, "mtu")["enp170s0f1np1"].message == "enp170s0f1np1 MTU 9000 (pattern enp170s0f[01]np[01])"
    )


def test_the_first_matching_mtu_rule_wins_and_unmatched_interfaces_are_not_checked() -> None:
    policy = Policy(
        mtu=(
            MtuRule("enp170s0f1np1", 1500, severity="warning"),
            MtuRule("enp.*", 9000, severity="warning"),
        )
    )
    results = audit(policy, netdev_mtus=read_netdev_mtus(CLUSTER))
    assert statuses(results, "mtu") == {"enp170s0f0np0": OK, "enp170s0f1np1": OK, "enp177s0f0": OK}
    results = audit(Policy(mtu=(MtuRule(".*", 9000, severity="warning"),)), netdev_mtus={"lo": 65536})
    assert statuses(results, "mtu") == {"lo": WARNING}


def test_read_netdev_mtus_reads_every_interface_and_skips_garbage(tree: Path) -> None:
    assert read_netdev_mtus(CLUSTER) == {
        "eno3": 1500,
        "enp170s0f0np0": 9000,
        "enp170s0f1np1": 1500,
        "enp177s0f0": 9000,
        **dict.fromkeys(("ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"), 4092),
        **dict.fromkeys(("ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0"), 4092),
        "lo": 65536,
    }
    net = tree / "class" / "net"
    write(net / "eno3" / "mtu", "not a number")
    (net / "lo" / "mtu").unlink()
    write(net / "bonding_masters", "bond0")
    mtus = read_netdev_mtus(tree)
    assert "eno3" not in mtus and "lo" not in mtus and "bonding_masters" not in mtus
    assert len(mtus) == 11
    shutil.rmtree(net)
    with pytest.raises(FileNotFoundError):
        read_netdev_mtus(tree)


# --- RDMA ports ----------------------------------------------------------------------------------

PORT_POLICY = Policy(
    rdma_ports=(
        RdmaPortRule("mlx5_[0-7]", link_layer="InfiniBand", rate_gbps=400),
        RdmaPortRule("mlx5_.*", link_layer="Ethernet", rate_gbps=200),
    )
)


def test_the_down_port_is_critical_and_its_rate_unknown() -> None:
    results = audit(PORT_POLICY, rdma=read_rdma_devices(CLUSTER))
    subjects = [f"mlx5_{i}/1" for i in range(10)]
    assert statuses(results, "rdma_port_state") == {s: CRITICAL if s == "mlx5_3/1" else OK for s in subjects}
    assert statuses(results, "rdma_port_rate") == {s: UNKNOWN if s == "mlx5_3/1" else OK for s in subjects}
    down = of(results, "rdma_port_state")["mlx5_3/1"].message
    assert down.startswith("mlx5_3 port 1 (ibp94s0) is DOWN, physical state Polling; expected ACTIVE, LinkUp")
    assert "check the cable" in down
    assert (
        of(results, "rdma_port_rate")["mlx5_0/1"].message
        == "mlx5_0 port 1 (ibp24s0) runs at 400 Gb/s (4X NDR)"
    )
    assert "irdma0/1" not in of(results, "rdma_port_state")  # no rule matches it


def test_the_ports_pass_once_the_link_comes_up(tree: Path) -> None:
    port = tree / "class" / "infiniband" / "mlx5_3" / "ports" / "1"
    write(port / "state", "4: ACTIVE")
    write(port / "phys_state", "5: LinkUp")
    write(port / "rate", "400 Gb/sec (4X NDR)")
    results = audit(PORT_POLICY, rdma=read_rdma_devices(tree))
    ports = of_all(results, "rdma_port_state") + of_all(results, "rdma_port_rate")
    assert len(ports) == 20 and not not_ok(ports)


def test_a_port_up_at_a_lower_speed_fails_the_rate(tree: Path) -> None:
    write(tree / "class" / "infiniband" / "mlx5_5" / "ports" / "1" / "rate", "200 Gb/sec (2X NDR)")
    results = audit(PORT_POLICY, rdma=read_rdma_devices(tree))
    rate = of(results, "rdma_port_rate")["mlx5_5/1"]
    assert rate.status == CRITICAL
    assert rate.message.startswith("mlx5_5 port 1 (ibp192s0) runs at 200 Gb/s (2X NDR), expected 400 Gb/s")
    assert of(results, "rdma_port_state")["mlx5_5/1"].status == OK


def test_a_linked_port_the_subnet_manager_did_not_activate_points_at_the_sm(tree: Path) -> None:
    write(tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state", "2: INIT")
    result = of(audit(PORT_POLICY, rdma=read_rdma_devices(tree)), "rdma_port_state")["mlx5_0/1"]
    assert result.status == CRITICAL and "subnet manager" in result.message


def test_the_link_layer_filter_picks_the_roce_ports() -> None:
    policy = Policy(rdma_ports=(RdmaPortRule("mlx5_.*", link_layer="Ethernet", rate_gbps=400),))
    results = audit(policy, rdma=read_rdma_devices(CLUSTER))
    assert statuses(results, "rdma_port_state") == {"mlx5_8/1": OK, "mlx5_9/1": OK}
    assert statuses(results, "rdma_port_rate") == {"mlx5_8/1": CRITICAL, "mlx5_9/1": CRITICAL}
    assert "runs at 200 Gb/s (4X HDR), expected 400 Gb/s" in of(results, "rdma_port_rate")["mlx5_8/1"].message


# --- counts --------------------------------------------------------------------------------------


def test_hca_count_passes_with_eight_compute_hcas() -> None:
    results = audit(Policy(hca_count=(HcaCountRule("mlx5_[0-7]", 8),)), rdma=read_rdma_devices(CLUSTER))
    assert of_all(results, "hca_count") == [
        CheckResult(
            "hca_count",
            "mlx5_[0-7]",
            OK,
            "8 RDMA devices match mlx5_[0-7] (mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, "
            "mlx5_7), expected 8",
        )
    ]


def test_hca_count_is_critical_when_an_hca_disappears(tree: Path) -> None:
    (tree / "class" / "infiniband" / "mlx5_6").unlink()
    results = audit(
        Policy(hca_count=(HcaCountRule("mlx5_[0-7]", 8), HcaCountRule(".*", 9))),
        rdma=read_rdma_devices(tree),
    )
    assert statuses(results, "hca_count") == {"mlx5_[0-7]": CRITICAL, ".*": WARNING}
    assert of(results, "hca_count")["mlx5_[0-7]"].message.startswith("7 RDMA devices match mlx5_[0-7] (")
    assert "expected 8" in of(results, "hca_count")["mlx5_[0-7]"].message
    assert "10 RDMA devices match .*" in of(results, "hca_count")[".*"].message


def test_gpu_count() -> None:
    policy = Policy(gpu_count=8)
    assert statuses(audit(policy, gpus=healthy_node()), "gpu_count") == {"node": OK}
    result = of(audit(policy, gpus=healthy_node(gpu3=lost(3))), "gpu_count")["node"]
    assert result.status == CRITICAL
    assert result.message.startswith("7 GPUs answer NVML, expected 8 (lost: GPU 3)")
    # NVML counts only the GPUs it still sees when the agent starts after the loss.
    assert of(audit(policy, gpus=healthy_node()[:6]), "gpu_count")["node"].status == CRITICAL
    assert of(audit(Policy(gpu_count=4), gpus=healthy_node()), "gpu_count")["node"].status == WARNING


# --- firmware ------------------------------------------------------------------------------------


def test_the_firmware_outlier_is_found_without_a_policy() -> None:
    results = audit(rdma=read_rdma_devices(CLUSTER))
    # irdma0 has no board_id; mlx5_8 and mlx5_9 are the two functions of one storage card.
    assert statuses(results, "hca_firmware") == {
        **{name: OK for name in IB_DEVICES if name != "mlx5_7"},
        "mlx5_7": WARNING,
        "mlx5_8": OK,
        "mlx5_9": OK,
    }
    assert of(results, "hca_firmware")["mlx5_7"].message.startswith(
        "mlx5_7 runs firmware 28.36.1010 while 7 other HCAs of board MT_0000000838 on this node run "
        "28.39.1002"
    )


def test_a_pinned_hca_firmware_version(tree: Path) -> None:
    policy = Policy(
        firmware=FirmwarePolicy(hca={"MT_0000000838": "28.39.1002"}, uniform=False, severity="critical")
    )
    results = audit(policy, rdma=read_rdma_devices(CLUSTER))
    assert statuses(results, "hca_firmware") == {
        name: CRITICAL if name == "mlx5_7" else OK for name in IB_DEVICES
    }
    assert of(results, "hca_firmware")["mlx5_7"].message.startswith(
        "mlx5_7 (MT_0000000838) runs firmware 28.36.1010, expected 28.39.1002"
    )
    write(tree / "class" / "infiniband" / "mlx5_7" / "fw_ver", "28.39.1002")
    results = of_all(audit(policy, rdma=read_rdma_devices(tree)), "hca_firmware")
    assert len(results) == 8 and not not_ok(results)


def test_two_hcas_of_a_board_on_different_firmware_are_both_reported(tree: Path) -> None:
    write(tree / "class" / "infiniband" / "mlx5_9" / "fw_ver", "28.40.1000")
    result = of(audit(rdma=read_rdma_devices(tree)), "hca_firmware")
    assert result["mlx5_8"].status == result["mlx5_9"].status == WARNING
    assert "28.39.1002 on mlx5_8; 28.40.1000 on mlx5_9" in result["mlx5_8"].message


def test_gpu_driver() -> None:
    policy = Policy(firmware=FirmwarePolicy(gpu_driver="550.90.07"))
    assert of(audit(policy, driver_version="550.90.07"), "gpu_driver")["driver"].status == OK
    result = of(audit(policy, driver_version="535.161.08"), "gpu_driver")["driver"]
    assert result.status == WARNING
    assert result.message.startswith("NVIDIA driver 535.161.08, expected 550.90.07")
    assert not of(audit(driver_version="535.161.08"), "gpu_driver")  # not pinned: not checked


def test_gpu_vbios_pinned_and_uniform() -> None:
    pinned = Policy(firmware=FirmwarePolicy(gpu_vbios={H100: "96.00.99.00.01"}))
    assert statuses(audit(pinned, gpus=healthy_node()), "gpu_vbios") == {str(i): OK for i in range(8)}
    old = healthy_node(gpu5=h100(5, vbios_version="96.00.74.00.01"))
    result = of(audit(pinned, gpus=old), "gpu_vbios")["5"]
    assert result.status == WARNING
    assert result.message.startswith(f"GPU 5 ({H100}) runs VBIOS 96.00.74.00.01, expected 96.00.99.00.01")
    result = of(audit(gpus=old), "gpu_vbios")["5"]
    assert result.status == WARNING
    assert result.message.startswith(
        f"GPU 5 runs VBIOS 96.00.74.00.01 while 7 other GPUs of model {H100} on this node run 96.00.99.00.01"
    )


# --- PCIe ----------------------------------------------------------------------------------------


def test_the_hca_trained_at_x8_is_critical() -> None:
    results = audit(rdma=read_rdma_devices(CLUSTER))
    expected = {name: OK for name in ["irdma0", *IB_DEVICES, "mlx5_8", "mlx5_9"]}
    assert statuses(results, "hca_pcie_link") == {**expected, "mlx5_4": CRITICAL}
    assert of(results, "hca_pcie_link")["mlx5_4"].message.startswith(
        "mlx5_4 (0000:9a:00.0) PCIe link x8 of x16: drain the node and reseat the HCA"
    )


def test_hca_pcie_passes_once_the_link_retrains_and_checks_generation_on_request(tree: Path) -> None:
    device = tree / "class" / "infiniband"
    write(device / "mlx5_4" / "device" / "current_link_width", "16")
    write(device / "mlx5_0" / "device" / "current_link_speed", "16.0 GT/s PCIe")
    rdma = read_rdma_devices(tree)
    assert not not_ok(of_all(audit(rdma=rdma), "hca_pcie_link"))
    results = audit(Policy(pcie=PciePolicy(hca_generation=True)), rdma=rdma)
    assert not_ok(of_all(results, "hca_pcie_link")) == [("hca_pcie_link", "mlx5_0", CRITICAL)]
    assert "PCIe link Gen4 of Gen5 while busy" in of(results, "hca_pcie_link")["mlx5_0"].message


def test_a_gpu_at_x8_is_critical() -> None:
    results = audit(gpus=healthy_node(gpu4=h100(4, pcie_link_width=8)))
    assert statuses(results, "gpu_pcie_link") == {str(i): CRITICAL if i == 4 else OK for i in range(8)}
    assert of(results, "gpu_pcie_link")["4"].message.startswith(
        "GPU 4 (00000000:9D:00.0) PCIe link x8 of x16: drain the node and reseat the GPU"
    )
    assert of(results, "gpu_pcie_link")["0"].message == "GPU 0 (00000000:1B:00.0) PCIe link x16"


def test_an_idle_gpu_at_a_lower_generation_is_ok() -> None:
    idle = h100(0, pcie_link_generation=1, clocks_event_reasons=GPU_IDLE, utilization_ratio=0.0)
    busy = h100(1, pcie_link_generation=4)
    unknown = h100(2, pcie_link_generation=3, clocks_event_reasons=None)
    gpus = healthy_node(gpu0=idle, gpu1=busy, gpu2=unknown)
    # By default only the width is checked.
    assert not not_ok(of_all(audit(gpus=gpus), "gpu_pcie_link"))
    results = of(audit(Policy(pcie=PciePolicy(gpu_generation=True)), gpus=gpus), "gpu_pcie_link")
    assert (results["0"].status, results["1"].status, results["2"].status) == (OK, CRITICAL, WARNING)
    assert (
        results["0"].message
        == "GPU 0 (00000000:1B:00.0) PCIe link x16, Gen1 of Gen5 while idle (power saving)"
    )
    assert results["1"].message.startswith("GPU 1 (00000000:43:00.0) PCIe link Gen4 of Gen5 while busy")
    assert "could not tell whether it is idle" in results["2"].message
    assert results["3"].message == "GPU 3 (00000000:61:00.0) PCIe link x16, Gen5"


def test_an_unreadable_pcie_link_is_unknown() -> None:
    results = of(audit(gpus=healthy_node(gpu6=h100(6, pcie_link_width_max=None))), "gpu_pcie_link")
    assert results["6"].status == UNKNOWN and "width could not be read" in results["6"].message


# --- current GPU health --------------------------------------------------------------------------


def test_a_healthy_node_is_ok_everywhere() -> None:
    results = audit(gpus=healthy_node())
    assert {r.check for r in results} == {
        "gpu_vbios",
        "gpu_pcie_link",
        "gpu_lost",
        "gpu_ecc_uncorrectable",
        "gpu_row_remap",
        "gpu_xid",
    }
    assert len(results) == 6 * 8 and not not_ok(results) and worst(results) == OK


def test_a_lost_gpu_is_critical_with_its_reason() -> None:
    results = audit(gpus=healthy_node(gpu3=lost(3)))
    result = of(results, "gpu_lost")["3"]
    assert result.status == CRITICAL
    assert result.message.startswith(
        "GPU 3 (GPU-5c2a7e1d-0000-4000-8000-000000000003) does not answer NVML: "
        "nvmlDeviceGetHandleByIndex: GPU is lost. Drain the node and reboot it"
    )
    # What NVML cannot read about it is unknown, never OK.
    assert not_ok(results) == [
        ("gpu_vbios", "3", UNKNOWN),
        ("gpu_pcie_link", "3", UNKNOWN),
        ("gpu_lost", "3", CRITICAL),
        ("gpu_ecc_uncorrectable", "3", UNKNOWN),
        ("gpu_row_remap", "3", UNKNOWN),
        ("gpu_recovery_action", "3", UNKNOWN),
    ]
    assert worst(results) == CRITICAL


def test_uncorrectable_ecc_errors_are_critical() -> None:
    ecc = {
        ("corrected", "volatile"): 3,
        ("corrected", "aggregate"): 40,
        ("uncorrected", "volatile"): 2,
        ("uncorrected", "aggregate"): 5,
    }
    results = audit(gpus=healthy_node(gpu2=h100(2, ecc_errors=ecc)))
    assert not_ok(results) == [("gpu_ecc_uncorrectable", "2", CRITICAL)]
    message = of(results, "gpu_ecc_uncorrectable")["2"].message
    assert message.startswith(
        "GPU 2 had 2 uncorrectable ECC errors since the driver loaded (5 over its lifetime): "
        "drain it, reset it"
    )
    # Errors from before the last reset are history, not current health.
    old = {**ecc, ("uncorrected", "volatile"): 0}
    assert not not_ok(audit(gpus=healthy_node(gpu2=h100(2, ecc_errors=old))))
    assert of(audit(gpus=[h100(0, ecc_errors={})]), "gpu_ecc_uncorrectable")["0"].status == UNKNOWN


def test_a_pending_row_remap_needs_a_reset() -> None:
    pending = h100(1, row_remap_pending=True, remapped_rows={"correctable": 0, "uncorrectable": 1})
    results = audit(gpus=healthy_node(gpu1=pending))
    assert not_ok(results) == [("gpu_row_remap", "1", WARNING)]
    assert of(results, "gpu_row_remap")["1"].message.startswith(
        "GPU 1: a row remap is pending (1 rows remapped for uncorrectable errors, 0 for correctable ones): "
        "drain the GPU and reset it"
    )
    strict = Policy(gpu_health=GpuHealthPolicy(row_remap_pending="critical"))
    assert of(audit(strict, gpus=[pending]), "gpu_row_remap")["1"].status == CRITICAL


def test_a_failed_row_remap_means_replacing_the_gpu() -> None:
    failed = h100(7, row_remap_failed=True, remapped_rows={"correctable": 0, "uncorrectable": 512})
    results = audit(gpus=healthy_node(gpu7=failed))
    assert not_ok(results) == [("gpu_row_remap", "7", CRITICAL)]
    message = of(results, "gpu_row_remap")["7"].message
    assert "a row remap failed (512 rows remapped" in message and "replace the GPU" in message
    unsupported = h100(0, row_remap_pending=None, row_remap_failed=None, remapped_rows={})
    assert of(audit(gpus=[unsupported]), "gpu_row_remap")["0"].status == UNKNOWN


def xid(code: int, gpu: int | None, seconds_ago: float, pci: str | None = None) -> SeenEvent:
    bus = pci or (f"PCI:0000:{H100_BUSES[gpu].lower()}:00" if gpu is not None else None)
    return SeenEvent("xid", code, bus, gpu, NOW - seconds_ago, f"NVRM: Xid ({bus}): {code}, pid=1234")


def test_a_recent_critical_xid_is_critical_with_the_catalog_action() -> None:
    events = [xid(13, 2, 900), xid(79, 2, 300), xid(13, 2, 100), xid(48, 5, 4000)]
    results = audit(gpus=healthy_node(), events=events)
    assert statuses(results, "gpu_xid") == {str(i): CRITICAL if i == 2 else OK for i in range(8)}
    message = of(results, "gpu_xid")["2"].message
    assert message.startswith(
        "GPU 2: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) 300 s ago: The GPU stopped answering"
    )
    assert "Action: Drain and reboot the node" in message
    assert message.endswith("(3 Xid events in the last 3600 s: Xid 13 ×2, Xid 79)")
    # Xid 48 on GPU 5 was 4000 s ago, outside the default hour; a wider window catches it.
    wide = Policy(gpu_health=GpuHealthPolicy(xid_window_seconds=7200))
    assert of(audit(wide, gpus=healthy_node(), events=events), "gpu_xid")["5"].status == CRITICAL
    assert of(audit(gpus=healthy_node(), events=events), "gpu_xid")["5"].message == (
        "GPU 5: no Xid in the last 3600 s"
    )


def test_recent_non_critical_xids_warn_and_informational_ones_do_not() -> None:
    results = of(
        audit(gpus=healthy_node(), events=[xid(13, 0, 60), xid(45, 1, 60), xid(43, 1, 50)]), "gpu_xid"
    )
    assert results["0"].status == WARNING
    assert results["0"].message.startswith("GPU 0: Xid 13 (ROBUST_CHANNEL_GR_EXCEPTION")
    assert "Restart the job" in results["0"].message
    assert results["1"].status == OK and "only informational Xids" in results["1"].message
    unknown = of(audit(gpus=healthy_node(), events=[xid(999, 4, 10)]), "gpu_xid")["4"]
    assert unknown.status == WARNING and "Xid 999 is not in clusterhealth's catalog" in unknown.message


def test_an_xid_the_watcher_could_not_map_is_placed_by_its_bus_id() -> None:
    # The watcher saw the line before NVML told it the bus ids (gpu -1, UNKNOWN_GPU).
    events = [
        xid(94, -1, 30, pci="PCI:0000:c3:00"),
        xid(119, -1, 20, pci="PCI:0000:ab:00"),
        xid(46, None, 10, pci=None),
    ]
    results = audit(gpus=healthy_node(), events=events)
    # Xid 94 (a contained ECC error: restart the job) warns; it does not drain.
    assert statuses(results, "gpu_xid") == {
        **{str(i): WARNING if i == 5 else OK for i in range(8)},
        "0000:ab:00.0": CRITICAL,
        "unknown": CRITICAL,
    }
    assert of(results, "gpu_xid")["0000:ab:00.0"].message.startswith("the GPU at 0000:ab:00.0: Xid 119")
    # Other kernel events are not Xids.
    sxid = SeenEvent("sxid", 12028, "0000:05:00.0", None, NOW - 5, "nvidia-nvswitch0: SXid ...: 12028")
    assert not not_ok(audit(gpus=healthy_node(), events=[sxid]))


# --- unreadable sources --------------------------------------------------------------------------

FULL = Policy(
    mtu=(MtuRule("ibp.*", 4092),),
    rdma_ports=(RdmaPortRule("mlx5_[0-7]", rate_gbps=400),),
    hca_count=(HcaCountRule("mlx5_[0-7]", 8),),
    gpu_count=8,
    firmware=FirmwarePolicy(hca={"MT_0000000838": "28.39.1002"}, gpu_driver="550.90.07"),
)


def test_sources_that_could_not_be_read_are_unknown_never_ok() -> None:
    results = run_audits(
        FULL,
        Observations.of(
            gpus=None,
            driver_version=None,
            rdma=None,
            netdev_mtus=None,
            kernel_events=None,
            now_boot_seconds=NOW,
        ),
    )
    assert [(r.check, r.subject, r.status) for r in results] == [
        ("mtu", "ibp.*", UNKNOWN),
        ("rdma_port_state", "mlx5_[0-7]", UNKNOWN),
        ("rdma_port_rate", "mlx5_[0-7]", UNKNOWN),
        ("hca_count", "mlx5_[0-7]", UNKNOWN),
        ("gpu_count", "node", UNKNOWN),
        ("hca_firmware", "node", UNKNOWN),
        ("gpu_driver", "driver", UNKNOWN),
        ("gpu_vbios", "node", UNKNOWN),
        ("gpu_pcie_link", "node", UNKNOWN),
        ("hca_pcie_link", "node", UNKNOWN),
        ("gpu_lost", "node", UNKNOWN),
        ("gpu_ecc_uncorrectable", "node", UNKNOWN),
        ("gpu_row_remap", "node", UNKNOWN),
        ("gpu_xid", "node", UNKNOWN),
        ("gpu_recovery_action", "node", UNKNOWN),
    ]
    assert [r.check for r in results] == list(CHECK_NAMES)
    assert of(results, "mtu")["ibp.*"].message == (
        "interface MTUs could not be read (class/net), so interfaces matching ibp.* were not checked"
    )
    assert "NVML could not be read" in of(results, "gpu_lost")["node"].message
    assert worst(results) == UNKNOWN


def test_a_node_without_gpus_or_rdma_has_nothing_to_report_without_a_policy() -> None:
    assert audit(gpus=[], rdma=[], netdev_mtus={"lo": 65536}, events=[]) == []


def test_an_incomplete_or_invalid_rule_is_unknown() -> None:
    policy = Policy(
        mtu=(MtuRule(interfaces="ibp.*"), MtuRule("ibp[", 4092)),
        hca_count=(HcaCountRule("mlx5_.*"),),
        rdma_ports=(RdmaPortRule("(mlx5"),),
    )
    results = audit(policy, netdev_mtus={"ibp24s0": 4092}, rdma=read_rdma_devices(CLUSTER))
    assert not_ok([r for r in results if r.check in ("mtu", "hca_count", "rdma_port_state")]) == [
        ("mtu", "rule1", UNKNOWN),
        ("mtu", "ibp[", UNKNOWN),
        ("rdma_port_state", "(mlx5", UNKNOWN),
        ("hca_count", "mlx5_.*", UNKNOWN),
    ]
    assert (
        of(results, "mtu")["rule1"].message == "policy: MTU rule 1 needs both interfaces (a pattern) and mtu"
    )


def test_disabled_checks_are_left_out() -> None:
    policy = Policy(disabled_checks=("gpu_row_remap", "hca_pcie_link"))
    results = audit(policy, gpus=healthy_node(), rdma=read_rdma_devices(CLUSTER))
    assert {r.check for r in results}.isdisjoint({"gpu_row_remap", "hca_pcie_link"})
    assert of(results, "gpu_lost")


# --- the whole node ------------------------------------------------------------------------------


def test_the_cluster_node_fixture_under_a_full_policy() -> None:
    """What `clusterhealth check` would say on cluster-node with eight H100s, one of them lost."""
    policy = Policy(
        mtu=(MtuRule("ibp.*", 4092), MtuRule("enp170s0f[01]np[01]", 9000)),
        rdma_ports=(
            RdmaPortRule("mlx5_[0-7]", link_layer="InfiniBand", rate_gbps=400),
            RdmaPortRule("mlx5_(8|9)", link_layer="Ethernet", rate_gbps=200),
        ),
        hca_count=(HcaCountRule("mlx5_[0-7]", 8), HcaCountRule("mlx5_(8|9)", 2)),
        gpu_count=8,
        firmware=FirmwarePolicy(
            hca={"MT_0000000838": "28.39.1002", "MT_0000000834": "28.39.1002"},
            gpu_driver="550.90.07",
            gpu_vbios={H100: "96.00.99.00.01"},
        ),
    )
    results = run_audits(
        policy,
        Observations.of(
            gpus=healthy_node(gpu6=lost(6)),
            driver_version="550.90.07",
            rdma=read_rdma_devices(CLUSTER),
            netdev_mtus=read_netdev_mtus(CLUSTER),
            kernel_events=[xid(79, 6, 42)],
            now_boot_seconds=NOW,
        ),
    )
    assert not_ok(results) == [
        ("mtu", "enp170s0f1np1", CRITICAL),
        ("rdma_port_state", "mlx5_3/1", CRITICAL),
        ("rdma_port_rate", "mlx5_3/1", UNKNOWN),
        ("gpu_count", "node", CRITICAL),
        ("hca_firmware", "mlx5_7", WARNING),
        ("gpu_vbios", "6", UNKNOWN),
        ("gpu_pcie_link", "6", UNKNOWN),
        ("hca_pcie_link", "mlx5_4", CRITICAL),
        ("gpu_lost", "6", CRITICAL),
        ("gpu_ecc_uncorrectable", "6", UNKNOWN),
        ("gpu_row_remap", "6", UNKNOWN),
        ("gpu_xid", "6", CRITICAL),
        ("gpu_recovery_action", "6", UNKNOWN),
    ]
    assert worst(results) == CRITICAL
    # 10 MTUs, 10 ports twice, 2 HCA counts, 1 GPU count, 10 HCA firmware (irdma0 has no board_id),
    # 1 driver, 11 HCA PCIe links, 8 GPUs in 6 per-GPU checks, and the lost GPU's recovery action
    # (unknown; the others' drivers do not say).
    assert len(results) == 10 + 2 * 10 + 2 + 1 + 10 + 1 + 11 + 6 * 8 + 1


# --- worst and the firmware inventory ------------------------------------------------------------


def result(status: int) -> CheckResult:
    return CheckResult("mtu", "eth0", status, "")


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        ([], OK),
        ([OK, OK], OK),
        ([OK, WARNING], WARNING),
        ([WARNING, UNKNOWN, OK], UNKNOWN),
        ([UNKNOWN, CRITICAL, WARNING], CRITICAL),
        ([CRITICAL, UNKNOWN], CRITICAL),
    ],
)
def test_worst_ranks_critical_over_unknown_over_warning(found: list[int], expected: int) -> None:
    assert worst(result(s) for s in found) == expected


def test_the_firmware_inventory_needs_no_policy() -> None:
    inventory = firmware_inventory(healthy_node(gpu6=lost(6)), "550.90.07", read_rdma_devices(CLUSTER))
    assert inventory == [
        ("hca", "irdma0", "1.71"),
        *[("hca", name, "28.36.1010" if name == "mlx5_7" else "28.39.1002") for name in IB_DEVICES],
        ("hca", "mlx5_8", "28.39.1002"),
        ("hca", "mlx5_9", "28.39.1002"),
        *[("gpu_vbios", str(i), "96.00.99.00.01") for i in range(8) if i != 6],
        ("gpu_driver", "driver", "550.90.07"),
    ]
    assert firmware_inventory(None, None, None) == []


# --- gpu_recovery_action -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "advice"),
    [
        ("gpu_reset", "nvidia-smi -r"),
        ("node_reboot", "reboot it"),
        ("drain_p2p", "peer-to-peer"),
        ("drain_and_reset", "then reset the GPU"),
        ("bus_reset", "PCIe bus"),
    ],
)
def test_a_recovery_action_from_nvml_is_critical_and_says_what_to_do(action: str, advice: str) -> None:
    gpus = [h100(i, recovery_action="none") for i in range(8)]
    gpus[4] = h100(4, recovery_action=action)
    gpus[6] = lost(6)
    gpus[7] = h100(7)  # a driver without the field: nothing to judge
    results = audit(gpus=gpus)
    assert statuses(results, "gpu_recovery_action") == {
        **{str(i): OK for i in (0, 1, 2, 3, 5)},
        "4": CRITICAL,
        "6": UNKNOWN,
    }
    message = of(results, "gpu_recovery_action")["4"].message
    assert f"recovery action is {action}" in message and advice in message


@pytest.mark.parametrize("action", sorted(set(RECOVERY_ACTIONS.values()) - {"none"}))
def test_every_recovery_action_nvidia_ml_py_names_has_advice_of_its_own(action: str) -> None:
    # system_reboot, bus_reset, recover_imex_domain (13.615) or gpu_reset_bus (13.580) included.
    results = audit(gpus=[h100(0, recovery_action=action)])
    (result,) = of_all(results, "gpu_recovery_action")
    assert result.status == CRITICAL
    assert RECOVERY_ADVICE[action] in result.message
    assert "see NVIDIA's documentation" not in result.message


def test_a_gpu_waiting_for_a_reset_is_critical_with_what_nvml_says_to_do() -> None:
    waiting = dataclasses.replace(
        lost(2), down_reason="nvmlDeviceGetUUID: ResetRequired", recovery_action="gpu_reset"
    )
    said_none = dataclasses.replace(lost(3), recovery_action="none")
    results = audit(gpus=healthy_node(gpu2=waiting, gpu3=said_none))
    assert of(results, "gpu_recovery_action")["2"].status == CRITICAL
    message = of(results, "gpu_recovery_action")["2"].message
    assert "recovery action is gpu_reset" in message and "nvidia-smi -r" in message
    assert "ResetRequired" in message
    # A lost GPU whose field said none before it went: nothing to act on but gpu_lost.
    assert of(results, "gpu_recovery_action")["3"].status == UNKNOWN
    assert of(results, "gpu_lost")["2"].status == CRITICAL


# --- gpu_ecc_uncorrectable: SRAM ------------------------------------------------------------------


def test_sram_errors_past_nvidias_threshold_are_critical_and_ask_for_the_gpu_to_be_replaced() -> None:
    past = h100(1, health=NvmlHealth(sram_ecc_threshold_exceeded=True))
    below = h100(2, health=NvmlHealth(sram_ecc_threshold_exceeded=False))
    results = audit(gpus=healthy_node(gpu1=past, gpu2=below))
    assert of(results, "gpu_ecc_uncorrectable")["1"].status == CRITICAL
    assert of(results, "gpu_ecc_uncorrectable")["2"].status == OK
    message = of(results, "gpu_ecc_uncorrectable")["1"].message
    assert "SRAM Threshold Exceeded" in message and "RMA" in message and "replaced" in message
    # An SRAM past the threshold is CRITICAL even where the HBM counters cannot be read.
    unread = h100(3, ecc_errors={}, health=NvmlHealth(sram_ecc_threshold_exceeded=True))
    assert of(audit(gpus=healthy_node(gpu3=unread)), "gpu_ecc_uncorrectable")["3"].status == CRITICAL
