"""The kernel-log watcher end to end: /dev/kmsg records in, counters out, Xid counted once."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterhealth.checks.kernel_watch import KernelLogCollector
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.xid import XidLedger

from .conftest import FIXTURES, AgentProcess, run_cli, scenario, value
from .test_kmsg import kmsg_record

LINES = [line.split("\t", 1)[1].rstrip("\n") for line in (FIXTURES / "kmsg" / "lines.txt").open()]
EXPECTED: list[dict[str, Any]] = json.loads((FIXTURES / "kmsg" / "expected.json").read_text())

XID_79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def write_kmsg(path: Path, messages: list[str], usec: int = 5_678_901) -> Path:
    path.write_bytes(b"".join(kmsg_record(seq, m, usec=usec + seq) for seq, m in enumerate(messages, 1)))
    return path


# The records read are opt-in (collectors.kernel_log.include_metrics); these tests count them.
RECORDS = {"include_metrics": ["clusterhealth_kernel_log_records_total"]}


def scrape(tmp_path: Path, data: dict[str, Any], kmsg: Path) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    config = tmp_path / "records.yaml"
    config.write_text(yaml.safe_dump({"collectors": {"kernel_log": RECORDS}}))
    result = run_cli("scrape", "--config", str(config), "--simulate", str(path), "--kmsg-path", str(kmsg))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_xid_line_is_counted_for_the_gpu_on_that_bus(tmp_path: Path) -> None:
    node = scenario(gpus={1: {"pci_bus_id": "00000000:91:00.0"}})
    text = scrape(tmp_path, node, write_kmsg(tmp_path / "kmsg", [XID_79]))
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="79") == 1
    assert value(text, "clusterhealth_scrape_collector_success", collector="kernel_log") == 1


def test_fallen_off_the_bus_notice_without_an_xid_line_counts_as_xid_79(tmp_path: Path) -> None:
    notice = (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\n NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        " NVRM: fallen off the bus and is not responding to commands."
    )
    node = scenario(gpus={0: {"pci_bus_id": "00000000:B3:00.0"}})
    text = scrape(tmp_path, node, write_kmsg(tmp_path / "kmsg", [notice]))
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="0", xid="79") == 1


def test_xid_seen_by_nvml_and_the_kernel_log_counts_once(tmp_path: Path) -> None:
    node = scenario(gpus={1: {"pci_bus_id": "00000000:91:00.0"}}, faults=[{"gpu": 1, "xid": [79]}])
    # Printed by the kernel just now: the same event NVML delivers to the agent.
    now_us = int(time.monotonic() * 1e6)
    text = scrape(tmp_path, node, write_kmsg(tmp_path / "kmsg", [XID_79], usec=now_us))
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="79") == 1


def test_xid_from_an_unknown_bus_keeps_an_empty_gpu_label(tmp_path: Path) -> None:
    text = scrape(tmp_path, scenario(), write_kmsg(tmp_path / "kmsg", [XID_79]))
    assert value(text, "clusterhealth_gpu_xid_errors_total", gpu="", uuid="", xid="79") == 1


def test_every_real_line_counts_as_its_kind(tmp_path: Path) -> None:
    text = scrape(tmp_path, scenario(), write_kmsg(tmp_path / "kmsg", LINES))
    want: Counter[str] = Counter()
    for entry in EXPECTED:
        kind = entry["kind"]
        if kind in (None, "xid"):
            continue
        # One AER error is printed twice (root port, then device); the device's line counts.
        if kind.startswith("pcie_aer_") and "PCIe Bus Error" not in entry["line"]:
            continue
        # A module plugged in is no fault.
        if "Port module event: " in entry["line"]:
            continue
        want[kind] += 1
    for kind in ("sxid", "pcie_aer_corrected", "pcie_aer_uncorrected", "mlx5", "mce", "thermal"):
        assert value(text, "clusterhealth_kernel_events_total", event=kind) == want[kind], kind
    assert want["sxid"] == 3 and want["mlx5"] == 4
    assert value(text, "clusterhealth_kernel_log_records_total") == len(LINES)


def test_unreadable_kernel_log_fails_only_its_collector(tmp_path: Path) -> None:
    text = scrape(tmp_path, scenario(), tmp_path / "no-such-kmsg")
    assert value(text, "clusterhealth_scrape_collector_success", collector="kernel_log") == 0
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 1
    assert value(text, "clusterhealth_gpu_up", gpu="0") == 1


def test_a_flood_is_read_in_bounded_cycles(tmp_path: Path) -> None:
    flood = write_kmsg(
        tmp_path / "kmsg", ["mlx5_core 0000:08:00.0: print_health_info:442:(pid 912): synd 0x1"] * 100_000
    )
    collector = KernelLogCollector(
        str(flood), XidLedger(), dict, max_records_per_cycle=20_000, keep_recent=50
    )
    collector.collect()
    assert collector.records_read == 20_000
    assert len(collector.recent) == 50
    for _ in range(4):
        collector.collect()
    assert collector.records_read == 100_000
    assert collector.events["mlx5"] == 100_000
    collector.collect()
    assert collector.records_read == 100_000
    collector.close()


def test_agent_reading_a_flood_keeps_serving(
    agent_process: Callable[..., AgentProcess], write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    lines = [LINES[i % len(LINES)] for i in range(100_000)]
    kmsg = write_kmsg(tmp_path / "kmsg", lines)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "collectors": {
                    "kernel_log": {"interval_seconds": 0.5, "max_records_per_cycle": 20_000, **RECORDS}
                }
            }
        )
    )
    agent = agent_process(
        "--config", str(config), "--simulate", str(write_scenario(scenario())), "--kmsg-path", str(kmsg)
    )
    # Read in bounded cycles (no cycle reads more than its budget) while /metrics keeps answering;
    # the latency and memory this costs are measured by benchmarks/fault_latency.py.
    seen: list[float] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, body, _ = agent.get("/metrics")
        assert status == 200
        records = re.search(rb"^clusterhealth_kernel_log_records_total (\S+)$", body, re.M)
        seen.append(float(records[1]) if records else 0.0)
        if seen[-1] == 100_000:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the agent did not read the 100k records within 60 s (read {seen[-1]:.0f})")
    assert seen == sorted(seen)
    assert any(0 < count < 100_000 for count in seen), "the flood was read in one go, not in cycles"


ABSURD_SEQUENCE = b"6," + b"9" * 5000 + b",5678901,-;a record no kernel prints\n"
ABSURD_XID = "NVRM: Xid (PCI:0000:91:00): " + "7" * 5000 + ", GPU has fallen off the bus."
AER = "nvme 0000:02:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
MLX5 = "mlx5_core 0000:08:00.0: print_health_info:442:(pid 912): synd 0x1: firmware internal error"


def test_an_absurd_number_skips_only_its_record(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(
        kmsg_record(1, MLX5) + ABSURD_SEQUENCE + kmsg_record(3, XID_79) + kmsg_record(4, ABSURD_XID)
        + kmsg_record(5, AER)
    )  # fmt: skip
    ledger = XidLedger()
    collector = KernelLogCollector(str(kmsg), ledger, lambda: {"00000000:91:00.0": 1})
    families = {f.name: f for f in collector.collect()}
    assert collector.records_read == 4
    assert (collector.events["mlx5"], collector.events["pcie_aer_corrected"]) == (1, 1)
    assert ledger.counts() == {(1, 79): 1}
    assert families["clusterhealth_kernel_log_records"].samples[0].value == 4
    # The skipped record is counted where an operator sees it.
    assert families["clusterhealth_kernel_log_malformed_records"].samples[0].value == 1
    collector.close()


def test_a_lost_gpu_is_critical_in_check_whatever_the_kernel_log_holds(tmp_path: Path) -> None:
    node = scenario(gpus={1: {"pci_bus_id": "00000000:91:00.0"}}, faults=[{"gpu": 1, "lost": True}])
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(node))
    kmsg = tmp_path / "kmsg"
    now_us = int(time.monotonic() * 1e6)
    kmsg.write_bytes(
        ABSURD_SEQUENCE + kmsg_record(2, XID_79, usec=now_us) + kmsg_record(3, ABSURD_XID, usec=now_us)
    )
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "net").mkdir(parents=True)
    result = run_cli(
        "check", "--json", "--simulate", str(path), "--sysfs-root", str(sysfs), "--kmsg-path", str(kmsg)
    )
    assert result.returncode == 2, result.stdout + result.stderr
    report = json.loads(result.stdout)
    statuses = {(r["check"], r["subject"]): r["status"] for r in report["results"]}
    assert statuses[("gpu_lost", "1")] == "CRITICAL"
    # The lost GPU and its Xid 79 both ask for a reboot; the Xid comes first (the catalog before the checks).
    assert report["summary"].startswith("unhealthy reboot: CRITICAL: gpu_xid 0000:91:00.0: ")
    evidence = {(e["check"], e["subject"]): e["action"] for e in report["verdict"]["evidence"]}
    assert evidence[("gpu_lost", "1")] == "reboot"
    # The Xid 79 line after the absurd record is counted (under the bus id: a lost GPU tells NVML none).
    xids = [r for r in report["results"] if r["check"] == "gpu_xid" and r["status"] == "CRITICAL"]
    assert len(xids) == 1 and "Xid 79" in xids[0]["message"] and "1 Xid event" in xids[0]["message"]


def lost_from_start(tmp_path: Path, lost: list[int]) -> tuple[Path, Path, Path]:
    """An 8-GPU simulated node whose GPUs `lost` fell off the bus before the agent started (NVML
    never answered for them), its sysfs with the GPUs' PCI functions (GPU 1 at 0000:43:00.0), and
    a kernel log holding GPU 1's Xid 79."""
    node = scenario(gpu_count=8, faults=[{"gpu": i, "lost": True} for i in lost])
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(node))
    sysfs = tmp_path / "sys"
    sim_sysfs.build(sysfs, faulty=False)
    line = "NVRM: Xid (PCI:0000:43:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    kmsg = write_kmsg(tmp_path / "kmsg", [line], usec=int(time.monotonic() * 1e6))
    return path, sysfs, kmsg


def test_a_gpu_lost_before_it_ever_answered_is_named_by_elimination(tmp_path: Path) -> None:
    # NVML knows GPU 1 only by its index; the kernel log knows it only by its bus id. Seven GPUs
    # told their bus ids and sysfs lists eight nvidia GPU functions: the eighth is GPU 1.
    path, sysfs, kmsg = lost_from_start(tmp_path, [1])
    common = ("--simulate", str(path), "--sysfs-root", str(sysfs), "--kmsg-path", str(kmsg))
    report = json.loads(run_cli("check", "--json", *common).stdout)
    xids = {r["subject"]: r for r in report["results"] if r["check"] == "gpu_xid"}
    assert xids["1"]["status"] == "CRITICAL"
    assert xids["1"]["message"].startswith("GPU 1: Xid 79")
    assert "0000:43:00.0" not in xids
    exposition = run_cli("scrape", *common).stdout
    assert value(exposition, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="79") == 1


def test_two_gpus_lost_before_they_answered_stay_under_their_bus_ids(tmp_path: Path) -> None:
    # Two silent GPUs and two unclaimed functions: which is which is not known, so nothing is made up.
    path, sysfs, kmsg = lost_from_start(tmp_path, [1, 2])
    common = ("--simulate", str(path), "--sysfs-root", str(sysfs), "--kmsg-path", str(kmsg))
    report = json.loads(run_cli("check", "--json", *common).stdout)
    xids = {r["subject"]: r for r in report["results"] if r["check"] == "gpu_xid"}
    assert xids["0000:43:00.0"]["status"] == "CRITICAL"
    assert xids["0000:43:00.0"]["message"].startswith("the GPU at 0000:43:00.0: Xid 79")
    assert xids["1"]["status"] == "OK"
    exposition = run_cli("scrape", *common).stdout
    assert value(exposition, "clusterhealth_gpu_xid_errors_total", gpu="1", xid="79") is None


def test_a_truncated_or_rotated_log_file_is_followed_counting_nothing_twice(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(kmsg_record(1, XID_79) + kmsg_record(2, MLX5) + kmsg_record(3, AER))
    ledger = XidLedger()
    collector = KernelLogCollector(str(kmsg), ledger, lambda: {"00000000:91:00.0": 1})
    collector.collect()
    # Truncated and rewritten with part of what it held: those records were counted already.
    kmsg.write_bytes(kmsg_record(1, XID_79) + kmsg_record(2, MLX5))
    collector.collect()
    with kmsg.open("ab") as log:
        log.write(kmsg_record(4, MLX5))
    collector.collect()
    assert (collector.events["mlx5"], collector.events["pcie_aer_corrected"], collector.records_read) == (
        2,
        1,
        4,
    )
    kmsg.rename(tmp_path / "kmsg.1")
    kmsg.write_bytes(kmsg_record(5, MLX5))
    collector.collect()
    assert (collector.events["mlx5"], collector.records_read) == (3, 5)
    assert ledger.counts() == {(1, 79): 1}
    collector.close()


EXTRA: list[dict[str, Any]] = json.loads((FIXTURES / "kmsg" / "extra_lines.json").read_text())
NOTICE_91 = "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."
OLD_NOTICE_91 = "NVRM: GPU at 0000:91:00.0 has fallen off the bus."


def watch(tmp_path: Path, records: list[tuple[float, str]]) -> tuple[KernelLogCollector, XidLedger]:
    """A collector that read `records` ((seconds since boot, message), in order) in one cycle."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"".join(kmsg_record(i, m, usec=int(t * 1e6)) for i, (t, m) in enumerate(records, 1)))
    ledger = XidLedger(window_seconds=30)
    collector = KernelLogCollector(str(kmsg), ledger, lambda: {"00000000:91:00.0": 1, "00000000:92:00.0": 2})
    collector.collect()
    collector.close()
    return collector, ledger


@pytest.mark.parametrize(
    ("records", "falls"),
    [
        pytest.param([(100.0, XID_79), (100.00001, NOTICE_91)], 1, id="line-then-notice"),
        pytest.param([(100.0, NOTICE_91), (100.5, XID_79)], 1, id="notice-then-line"),
        pytest.param([(100.0, OLD_NOTICE_91), (100.1, OLD_NOTICE_91), (100.2, NOTICE_91)], 1, id="repeats"),
        pytest.param([(100.0, OLD_NOTICE_91)], 1, id="older-driver-notice-alone"),
        pytest.param([(100.0, XID_79), (101.0, NOTICE_91), (102.0, XID_79)], 2, id="two-xid-lines-stay-two"),
        pytest.param([(100.0, NOTICE_91), (200.0, NOTICE_91)], 2, id="a-later-fall"),
    ],
)
def test_a_fall_off_the_bus_counts_once_whatever_the_driver_prints(
    tmp_path: Path, records: list[tuple[float, str]], falls: int
) -> None:
    _, ledger = watch(tmp_path, records)
    assert ledger.counts() == {(1, 79): falls}


def test_notices_of_two_gpus_are_two_falls(tmp_path: Path) -> None:
    _, ledger = watch(
        tmp_path, [(100.0, NOTICE_91), (100.1, "NVRM: GPU 0000:92:00.0: GPU has fallen off the bus.")]
    )
    assert ledger.counts() == {(1, 79): 1, (2, 79): 1}


MCE_NOTICE = "mce: [Hardware Error]: Machine check events logged"
MCE_RECORD = "mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 3: cc5eb2c000100135"
MCE_MORE = "mce: [Hardware Error]: TSC 0 ADDR 4658130c0 MISC 102285 "


@pytest.mark.parametrize(
    ("messages", "checks"),
    [
        pytest.param([MCE_NOTICE], 1, id="notice-alone-records-went-to-mcelog"),
        pytest.param([MCE_NOTICE, MCE_RECORD, MCE_MORE], 1, id="notice-and-its-record"),
        pytest.param(
            [MCE_RECORD, MCE_MORE, MCE_NOTICE, MCE_NOTICE, MCE_RECORD, MCE_MORE], 2, id="two-records"
        ),
        pytest.param([MCE_RECORD, MCE_RECORD, MCE_RECORD], 3, id="records-without-notice"),
    ],
)
def test_a_machine_check_counts_once_with_or_without_its_notice(
    tmp_path: Path, messages: list[str], checks: int
) -> None:
    collector, _ = watch(tmp_path, [(10.0 + i, m) for i, m in enumerate(messages)])
    assert collector.events["mce"] == checks


def test_mlx5_link_downs_count_so_a_flapping_port_shows(tmp_path: Path) -> None:
    flaps = [
        "mlx5_core 0000:01:00.0 enp1s0f0np0: Link down",
        "mlx5_core 0000:01:00.0 enp1s0f0np0: Link up",
    ] * 3
    collector, _ = watch(tmp_path, [(10.0 + i, m) for i, m in enumerate(flaps)])
    assert collector.events["mlx5_link_down"] == 3
    assert collector.events["mlx5"] == 0


def test_every_event_kind_is_exported_from_the_start(tmp_path: Path) -> None:
    text = scrape(tmp_path, scenario(), write_kmsg(tmp_path / "kmsg", []))
    for kind in (
        "sxid",
        "pcie_aer_corrected",
        "pcie_aer_uncorrected",
        "mlx5",
        "mlx5_link_down",
        "mce",
        "thermal",
    ):
        assert value(text, "clusterhealth_kernel_events_total", event=kind) == 0, kind


def test_every_real_field_form_counts_as_its_kind(tmp_path: Path) -> None:
    text = scrape(tmp_path, scenario(), write_kmsg(tmp_path / "kmsg", [e["line"] for e in EXTRA]))
    # Per the fixture's "counted": the device's AER line, not the root port's notice; mlx5 faults, not
    # the informational lines; a machine check's records, not the notice that came with them; link
    # downs, not ups. Xid lines and notices go to the Xid series, one per fall.
    want: Counter[str] = Counter(e["kind"] for e in EXTRA if e.get("counted"))
    assert want["mlx5"] == 10 and want["mlx5_link_down"] == 5 and want["pcie_aer_corrected"] == 9
    assert want["pcie_aer_uncorrected"] == 1 and want["mce"] == 7
    for kind in ("pcie_aer_corrected", "pcie_aer_uncorrected", "mlx5", "mlx5_link_down", "mce"):
        assert value(text, "clusterhealth_kernel_events_total", event=kind) == want[kind], kind


QEMU_DEVEL = (
    "https://lore.kernel.org/qemu-devel/m7p7ubuyfhqxhcxqt4qs6rbi24pgxtnbq52maqpdom2da75g7e@laluifinsegp/"
)


def test_a_health_poll_failure_and_its_dump_count_twice_not_once_per_line(tmp_path: Path) -> None:
    episode = [e["line"] for e in EXTRA if e["source"] == QEMU_DEVEL]
    assert len(episode) == 19  # the poller's line and the 18 lines of the dump
    collector, _ = watch(tmp_path, [(445.9 + i / 1000, line) for i, line in enumerate(episode)])
    # "device's health compromised" from the poller, and the dump's header; its syndrome line, 17 ms
    # later, is the same fault.
    assert collector.events["mlx5"] == 2
    assert [e.message.split(": ", 1)[1] for e in collector.recent] == [
        "poll_health:801:(pid 0): device's health compromised - reached miss count",
        "print_health_info:431:(pid 0): Health issue observed, firmware internal error, severity(3) ERROR:",
    ]


HEALTH_HEADER = next(e["line"] for e in EXTRA if "Health issue observed, " in e["line"])
HEALTH_SYNDROME = next(e["line"] for e in EXTRA if e["source"] == QEMU_DEVEL and ": synd 0x" in e["line"])
# An older kernel's dump has no header (lore: netdev 2021, the shared fixture), on another function.
OLDER_SYNDROME = next(line for line in LINES if ": synd 0x" in line)


@pytest.mark.parametrize(
    ("records", "faults"),
    [
        pytest.param([(445.0, HEALTH_HEADER)], 1, id="header-alone"),
        pytest.param([(445.0, HEALTH_HEADER), (445.0001, HEALTH_SYNDROME)], 1, id="header-and-syndrome"),
        pytest.param([(10.0, OLDER_SYNDROME)], 1, id="older-kernel-syndrome-alone"),
        pytest.param(
            [(445.0, HEALTH_HEADER), (445.0001, OLDER_SYNDROME)], 2, id="syndrome-of-another-function"
        ),
        pytest.param(
            [
                (445.0, HEALTH_HEADER),
                (445.0001, HEALTH_SYNDROME),
                (505.0, HEALTH_HEADER),
                (505.0001, HEALTH_SYNDROME),
            ],
            2,
            id="two-dumps",
        ),
        pytest.param([(445.0, HEALTH_HEADER), (500.0, HEALTH_SYNDROME)], 2, id="syndrome-long-after"),
    ],
)
def test_a_health_dump_counts_once_by_its_header_or_its_syndrome(
    tmp_path: Path, records: list[tuple[float, str]], faults: int
) -> None:
    collector, _ = watch(tmp_path, records)
    assert collector.events["mlx5"] == faults


NETDEV_DOWN = "[Tue Feb 14 18:48:25 2023] mlx5_core 0000:02:00.0 ens2f0np0: Link down"
# The IB core's line for the same function (lore: cover.1738586601.git.leon@kernel.org prints it for
# every IB device "in similar to netdev"); no citable capture of a RoCE port's pair was found, so the
# pair is the two real forms on one bus id.
IB_PORT_DOWN = "[Tue Feb 14 18:48:25 2023] mlx5_core 0000:02:00.0 mlx5_0: Port: 1 Link DOWN"
IB_PORT_UP = "[Tue Feb 14 18:48:30 2023] mlx5_core 0000:02:00.0 mlx5_0: Port: 1 Link ACTIVE"


@pytest.mark.parametrize(
    ("records", "downs"),
    [
        pytest.param([(10.0, NETDEV_DOWN), (10.006, IB_PORT_DOWN)], 1, id="roce-netdev-then-ib-port"),
        pytest.param([(10.0, IB_PORT_DOWN), (10.006, NETDEV_DOWN)], 1, id="roce-ib-port-then-netdev"),
        pytest.param([(10.0, IB_PORT_DOWN), (12.0, IB_PORT_UP), (14.0, IB_PORT_DOWN)], 2, id="ib-port-flaps"),
        pytest.param(
            [(10.0, NETDEV_DOWN), (10.006, IB_PORT_DOWN), (20.0, NETDEV_DOWN), (20.006, IB_PORT_DOWN)],
            2,
            id="roce-flaps",
        ),
        pytest.param([(10.0, NETDEV_DOWN), (100.0, IB_PORT_DOWN)], 2, id="far-apart-are-two"),
    ],
)
def test_a_loss_of_link_counts_once_whichever_lines_the_port_prints(
    tmp_path: Path, records: list[tuple[float, str]], downs: int
) -> None:
    collector, _ = watch(tmp_path, records)
    assert collector.events["mlx5_link_down"] == downs


def test_the_gpu_bus_ids_are_asked_once_a_cycle_not_once_a_line(tmp_path: Path) -> None:
    # Placing a lost GPU walks sysfs; an Xid flood must not walk it for every line.
    asked = []

    def bus_ids() -> dict[str, int]:
        asked.append(1)
        return {"00000000:91:00.0": 1}

    kmsg = write_kmsg(tmp_path / "kmsg", [XID_79.replace(": 79,", f": {13 + n % 2},") for n in range(500)])
    ledger = XidLedger()
    collector = KernelLogCollector(str(kmsg), ledger, bus_ids)
    collector.collect()
    assert len(asked) == 1
    assert sum(n for (gpu, _), n in ledger.counts().items() if gpu == 1) == 500
    collector.collect()  # the next cycle reads no Xid line, so it has nothing to ask
    assert len(asked) == 1
    collector.close()
