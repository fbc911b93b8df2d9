"""Kernel-log lines from real nodes, parsed into events: every captured line must come out as expected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.checks.kernel_log import (
    KernelEvent,
    is_aer_device_report,
    is_health_header,
    is_health_syndrome,
    is_ib_port_line,
    is_informational,
    is_machine_check_notice,
    normalize_pci_bus_id,
    parse_line,
)

KMSG_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kmsg"


def _load(name: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((KMSG_FIXTURES / name).read_text(encoding="utf-8"))
    return entries


EXPECTED = _load("expected.json")
EXTRA = _load("extra_lines.json")


def _outcome(event: KernelEvent | None) -> tuple[str | None, str | None, int | None]:
    return (event.kind, event.pci, event.code) if event else (None, None, None)


@pytest.mark.parametrize("entry", EXPECTED, ids=[f"{i:02d}" for i in range(len(EXPECTED))])
def test_shared_fixture_line(entry: dict[str, Any]) -> None:
    assert _outcome(parse_line(entry["line"])) == (entry["kind"], entry["pci"], entry["code"])


@pytest.mark.parametrize("entry", EXTRA, ids=[f"extra-{i:02d}" for i in range(len(EXTRA))])
def test_extra_fixture_line(entry: dict[str, Any]) -> None:
    assert _outcome(parse_line(entry["line"])) == (entry["kind"], entry["pci"], entry["code"])


def _events() -> list[tuple[str, KernelEvent]]:
    found = []
    for entry in EXPECTED + EXTRA:
        event = parse_line(entry["line"])
        if event is not None:
            found.append((entry["line"], event))
    return found


# What log tools put before the kernel's text in the real lines above: dmesg's seconds, dmesg -T,
# journald and syslog dates in three scripts, host names, "kernel:" tags, a caller id.
PREFIXES = sorted({line[: line.index(event.message)] for line, event in _events()} - {""})


def test_the_real_lines_carry_every_class_of_prefix() -> None:
    assert len(PREFIXES) >= 20
    for needle in (
        "фев 12",
        "6月 28",
        "jan. 29",
        "[Fri Aug 29",
        "lisa kernel: [T45426] ",
        "pve kernel: ",
        "ny2g1r12hh2",
    ):
        assert any(needle in prefix for prefix in PREFIXES), needle


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_event_means_the_same_behind_every_prefix_seen_in_the_field(prefix: str) -> None:
    for _, event in _events():
        assert parse_line(prefix + event.message) == event, prefix + event.message


@pytest.mark.parametrize("entry", [e for e in EXTRA if "counted" in e], ids=lambda e: e["line"][:60])
def test_what_a_fault_counter_leaves_out_is_told_apart(entry: dict[str, Any]) -> None:
    event = parse_line(entry["line"])
    assert event is not None
    if event.kind.startswith("pcie_aer_"):
        assert is_aer_device_report(event) is entry["counted"]
    elif event.kind == "mlx5" and entry.get("after_header"):
        # A fault of its own, but the dump's header before it counted it (the watcher pairs them).
        assert is_health_syndrome(event) and not is_informational(event) and not entry["counted"]
    elif event.kind == "mlx5":
        assert is_informational(event) is not entry["counted"]
    else:
        assert not is_informational(event) and not is_aer_device_report(event)


def test_a_health_dumps_header_and_syndrome_are_mlx5_events() -> None:
    # The header of a 6.x dump (lore: qemu-devel, in extra_lines.json) and the syndrome line of a dump
    # (lore: netdev 2021, in the shared fixture), each a fault of the ConnectX function.
    header = next(e["line"] for e in EXTRA if "Health issue observed, " in e["line"])
    syndrome = next(e["line"] for e in EXPECTED if ": synd 0x" in e["line"])
    for line, is_header in ((header, True), (syndrome, False)):
        event = parse_line(line)
        assert event is not None and event.kind == "mlx5", line
        assert not is_informational(event)
        assert (is_health_header(event), is_health_syndrome(event)) == (is_header, not is_header)
    register = next(e["line"] for e in EXTRA if ": assert_var[0] " in e["line"])
    assert parse_line(register) is None


def test_the_ib_ports_own_link_down_line_is_told_from_the_netdevs() -> None:
    ib_port = parse_line("[  309.261822] mlx5_core 0000:0a:00.0 mlx5_0: Port: 1 Link DOWN")
    netdev = parse_line("[18865.848172] mlx5_core 0000:01:00.0 enp1s0f0np0: Link down")
    assert ib_port is not None and netdev is not None
    assert (ib_port.kind, netdev.kind) == ("mlx5_link_down", "mlx5_link_down")
    assert is_ib_port_line(ib_port) and not is_ib_port_line(netdev)


def test_lines_txt_and_expected_json_hold_the_same_lines() -> None:
    rows = (KMSG_FIXTURES / "lines.txt").read_text(encoding="utf-8").splitlines()
    pairs = [tuple(row.split("\t", 1)) for row in rows]
    assert pairs == [(e["source"], e["line"]) for e in EXPECTED]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, "
            "Contained: SM (0x1). RST: No, D-RST: No",
            "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). "
            "RST: No, D-RST: No",
        ),
        (
            "kern  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, "
            "name=pt_main_thread, Ch 00000008",
            "NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008",
        ),
        (
            "Sep 19 16:18:02 bubz kernel: [68183.615790] pcieport 0000:00:03.1: AER: Correctable error "
            "message received from 0000:00:00.0",
            "pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0",
        ),
        (
            "[  +0.000001] pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: "
            "0000:00:03.0",
            "pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
        ),
        # "mce: CPU6:" is the kernel's text, not a "facility :level :" prefix.
        (
            "[76747.169399] mce: CPU6: Package temperature above threshold, cpu clock throttled (total "
            "events = 3654)",
            "mce: CPU6: Package temperature above threshold, cpu clock throttled (total events = 3654)",
        ),
        ("NVRM: Xid (PCI:0000:0a:00): 13, anything", "NVRM: Xid (PCI:0000:0a:00): 13, anything"),
    ],
)
def test_the_message_starts_where_the_kernel_text_starts(line: str, message: str) -> None:
    event = parse_line(line)
    assert event is not None and event.message == message


def test_event_message_keeps_the_kernel_text() -> None:
    event = parse_line(EXPECTED[0]["line"])
    assert event == KernelEvent(
        kind="xid",
        pci="0000:9b:00",
        code=119,
        message="NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of "
        "waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
    )


def test_fallen_off_the_bus_notice_read_from_kmsg_is_one_event() -> None:
    # /dev/kmsg gives the driver's three-line notice as one message; dmesg splits it for display.
    group = [e["line"] for e in EXPECTED if e.get("group") == "nvsentinel-155"]
    assert len(group) == 3
    # What the kernel wrote is each line from its "NVRM:" on.
    message = "\n".join(line[line.index("NVRM: ") :] for line in group)
    assert message.startswith("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5)")
    assert _outcome(parse_line(message)) == ("xid", "0000:b3:00.0", None)


@pytest.mark.parametrize("line", ["", "   ", "[12345.678901] ", "kernel: ", "random text"])
def test_lines_without_an_event(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("printed", "canonical"),
    [
        ("0000:3b:00", "0000:3b:00.0"),  # NVRM Xid line
        ("PCI:0000:3b:00", "0000:3b:00.0"),  # NVRM "GPU at" line
        ("0000:3b:00.0", "0000:3b:00.0"),  # kernel dev_printk, sysfs
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML pciBusId
        ("3b:00.0", "0000:3b:00.0"),  # lspci
        ("0019:01:00", "0019:01:00.0"),  # Grace-Blackwell domain from an Xid 149 line
        ("0000:84:00.0", "0000:84:00.0"),  # SXid line
        ("00010000:01:00.0", "10000:01:00.0"),  # VMD domains are wider than 4 digits
        (" 0000:00:1c.5 ", "0000:00:1c.5"),
    ],
)
def test_normalize_pci_bus_id(printed: str, canonical: str) -> None:
    assert normalize_pci_bus_id(printed) == canonical


def test_xid_bus_id_matches_nvml_bus_id() -> None:
    xid = parse_line("[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.")
    assert xid is not None and xid.pci is not None
    nvml_gpus = {normalize_pci_bus_id("00000000:02:00.0"): 3, normalize_pci_bus_id("00000000:03:00.0"): 4}
    assert nvml_gpus[normalize_pci_bus_id(xid.pci)] == 3


@pytest.mark.parametrize(
    "bad", ["", "0003:00", "0000:3b", "0000:3b:20.0", "0000:3b:00.8", "GPU-5096", "zz:00.0"]
)
def test_normalize_pci_bus_id_rejects_what_is_not_a_bus_id(bad: str) -> None:
    with pytest.raises(ValueError):
        normalize_pci_bus_id(bad)


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:91:00): "
        + "7" * 5000
        + ", pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:91:00): 1234567, GPU has fallen off the bus.",
        "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): " + "2" * 5000 + ", Non-fatal, Link 44",
        "NVRM: Xid (PCI:0000:91:00): \u0667\u0669, digits int() reads but the driver never prints",
    ],
)
def test_a_code_no_driver_prints_is_no_event(line: str) -> None:
    assert parse_line(line) is None


def test_the_longest_codes_drivers_print_are_read() -> None:
    sxid = parse_line("nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44")
    assert sxid is not None and sxid.code == 22013
    xid = parse_line("NVRM: Xid (PCI:0000:91:00): 154, GPU recovery action changed")
    assert xid is not None and xid.code == 154


def test_a_journald_prefix_with_a_month_that_is_not_english_is_stripped() -> None:
    lines = [e["line"] for e in EXTRA if e["line"].startswith("6月 ")]
    assert len(lines) == 2
    for line in lines:
        event = parse_line(line)
        assert event is not None and event.message.startswith("NVRM: ")


def test_machine_check_notice_and_records_are_told_apart() -> None:
    notice = parse_line("mce: [Hardware Error]: Machine check events logged")
    record = parse_line("mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 3: cc5eb2c000100135")
    assert notice is not None and record is not None
    assert is_machine_check_notice(notice) and not is_machine_check_notice(record)
