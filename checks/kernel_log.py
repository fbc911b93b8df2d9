"""Kernel-log lines to typed hardware events: NVIDIA Xid/SXid, PCIe AER, mlx5, machine checks, thermal.

`parse_line` takes one line as dmesg, journald or syslog printed it (or one /dev/kmsg message) and
returns a `KernelEvent`, or None when the line is not an event. It is a pure function; reading the
log is `clusterhealth.checks.kmsg`'s job, and what a code means is `clusterhealth.checks.xid_catalog`'s.

Every pattern below was written against real lines; `tests/fixtures/kmsg/` holds them with their
public sources. Things a caller must know:

- An event of kind ``xid`` with ``code`` None is a "GPU has fallen off the bus" notice without an Xid
  number: R570's multi-line "The NVIDIA GPU ... has fallen off the bus", printed instead of an Xid
  79 line, and the one-line forms older and current drivers print next to their Xid 79 line
  ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "NVRM: GPU 0000:91:00.0: GPU has fallen
  off the bus."). Treat it as 79, once per fall: the watcher pairs a notice with its Xid 79 line.
- ``mce`` is both a machine-check record (its first line, "CPU 2: Machine Check: 0 Bank 3: ..." or
  AMD's decoded "CPU:0 (17:1:1) MC15_STATUS[...]") and the notice "Machine check events logged",
  which the kernel prints (at most twice a minute) whether or not it prints the records;
  `is_machine_check_notice` tells them apart. The other "[Hardware Error]:" lines continue a record.
- ``mlx5_link_down`` and ``mlx5_link_up`` are a ConnectX netdev's carrier changes; ``pci`` is the
  function's bus id.
- ``pci`` is the bus id exactly as printed. Xid lines print ``domain:bus:device`` without the
  function, NVML prints an 8-digit upper-case domain; `normalize_pci_bus_id` makes them comparable.
- The kernel reports one AER error on two lines, "AER: ... error received" from the root port and
  "PCIe Bus Error: severity=..." from the device; both are events here (the shared fixture asks
  for it), so a counter of errors rather than lines must pair them or count one form only.
- "NVRM: Xid ... caused by previous Xid 145" is an Xid 45: the code is the first number after the
  bus id, never a number later in the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

EventKind = Literal[
    "xid",
    "sxid",
    "pcie_aer_corrected",
    "pcie_aer_uncorrected",
    "mlx5",
    "mlx5_link_down",
    "mlx5_link_up",
    "mce",
    "thermal",
]


@dataclass(frozen=True)
class KernelEvent:
    kind: EventKind
    pci: str | None
    """The device's PCI bus id as the line printed it, or None for CPU-side events."""
    code: int | None
    """The Xid or SXid number; None for other kinds."""
    message: str
    """The line without its timestamp/host prefix."""


# A full bus/device/function address as the kernel's dev_printk prints it: 0000:3b:00.0.
_BDF = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
# What NVRM puts between "Xid (" and ")": PCI:0000:3b:00, 0000:3b:00, and in very old drivers 0003:00.
_NV_BUS = r"[0-9A-Fa-f]+(?::[0-9A-Fa-f]+)+(?:\.[0-7])?"

_PREFIXES = (
    # syslog / journalctl short: "Nov 29 11:28:11 zeus kernel: ", host optional, month in any
    # locale ("фев 12 00:48:02 kernel: "), or a bare "kernel: " when the poster trimmed the rest.
    re.compile(r"^(?:\S+ +\d{1,2} +\d{2}:\d{2}:\d{2} +(?:\S+ +)?)?kernel: *"),
    # dmesg --decode: "kern  :warn  : "; the names are listed so that "mce: CPU6: ..." is not eaten.
    re.compile(
        r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7]) *:"
        r"(?:emerg|alert|crit|err|warn|notice|info|debug) *: *"
    ),
    # dmesg --time-format iso: "2025-01-21T04:41:44,283575+00:00 "
    re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[,.]\d+)?(?:[+-]\d{2}:?\d{2}|Z)? +"),
    # dmesg: "[12345.678901] ", "[ 1843.308145] ", and dmesg -H's relative "[  +0.000001] "
    re.compile(r"^\[ *[+-]?\d+\.\d+\] *"),
    # dmesg -T: "[Sun Feb 23 16:24:18 2025] ", "[Fri Aug  9 13:32:56 2024] "
    re.compile(r"^\[\S+ \S+ +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}\] *"),
)

# Xid and SXid codes have a few digits (SXid 22013 has five); a longer number is not a code, and a line
# holding one is no event (rather than an int() of thousands of digits failing the whole batch).
_CODE = r"(?P<code>[0-9]{1,6})(?![0-9])"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>" + _NV_BUS + r")(?: [^)]*)?\): " + _CODE)
# Driver 570 prints this three-line notice, with no Xid line, when a GPU falls off the bus. Only the
# first line names the GPU; the other two ("(PCI ID: 10de:26b5) installed ...", "fallen off the
# bus ...") are no event on their own. Through /dev/kmsg the three arrive as one message.
# Older drivers print "NVRM: GPU at 0000:01:00.0 has fallen off the bus." and current ones
# "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." right after their Xid 79 line (gpud's tests
# also have the domain-less "NVRM: GPU 18:00.0: ...").
_FALLEN_OFF_BUS = re.compile(
    r"NVRM: (?:The NVIDIA GPU (?P<pci>" + _BDF + r")(?:\s|$)"
    r"|GPU (?:at )?(?P<pci2>(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]):? "
    r"(?:GPU )?has fallen off the bus)"
)
_SXID = re.compile(r"SXid \((?:PCI:)?(?P<pci>" + _NV_BUS + r")\): " + _CODE)
# Kernels have worded these "Corrected error received" and, since 6.x, "Correctable error message
# received from"; "Multiple" prefixes both when the root port collected more than one.
_AER_UNCORRECTED = re.compile(
    r"(?P<pci>" + _BDF + r"): (?:AER: (?:Multiple )?Uncorrect(?:ed|able) \((?:Non-)?Fatal\) "
    r"error(?: message)? received|PCIe Bus Error: severity=Uncorrect(?:ed|able))"
)
_AER_CORRECTED = re.compile(
    r"(?P<pci>" + _BDF + r"): (?:AER: (?:Multiple )?Correct(?:ed|able) error(?: message)? received"
    r"|PCIe Bus Error: severity=Correct(?:ed|able))"
)
# mlx5_core_err/mlx5_core_warn prefix "func:line:(pid N): " (older kernels put the device name
# first); mlx5_core_info does not, so plain informational lines stay out, except the port module
# (cable/transceiver) events, which matter for link flaps.
_MLX5 = re.compile(
    r"mlx5_core (?P<pci>" + _BDF + r"): (?:(?:[\w.-]+:)?\w+:\d+:\(pid \d+\): |Port module event)"
)
MACHINE_CHECK_NOTICE = "Machine check events logged"
# The first line of each machine-check record: the kernel's own ("mce: [Hardware Error]: CPU 2:
# Machine Check: 0 Bank 3: cc5eb2c000100135", "... Machine Check Exception: 5 Bank 7: ..." when the
# check interrupted the CPU), sb_edac's "CPU 1: Machine Check Event: 0 Bank 11: ...", and on AMD the
# EDAC decoder's "[Hardware Error]: CPU:0 (17:1:1) MC15_STATUS[Over|CE|...]: 0xdc2040000000011b".
_MCE = re.compile(
    r"mce: \[Hardware Error\]: "
    + MACHINE_CHECK_NOTICE
    + r"|CPU \d+: Machine Check(?: Exception| Event)?: +[0-9a-f]+ Bank \d+: +[0-9a-f]+"
    r"|\[Hardware Error\]: CPU:\d+ \([0-9a-f]+:[0-9a-f]+:[0-9a-f]+\) MC\d+_STATUS\["
)
# mlx5e_update_carrier(): netdev_info(netdev, "Link up") / "Link down", after "mlx5_core <bus id> ".
_MLX5_LINK = re.compile(r"mlx5_core (?P<pci>" + _BDF + r") [^\s:]+: Link (?P<state>up|down)\b")
# Also printed with an "mce: " prefix, but it is CPU thermal throttling, not a machine check; the
# recovery line "Package temperature/speed normal" is deliberately not an event.
_THERMAL = re.compile(r"CPU\d+: (?:Core|Package) temperature above threshold, cpu clock throttled")


def strip_prefix(text: str) -> str:
    """The line without its timestamp/host prefix (any of those `parse_line` accepts)."""
    text = text.strip()
    # A syslog line can carry the kernel's own timestamp after its own: "... kernel: [68183.6] ..."
    for _ in range(len(_PREFIXES)):
        for prefix in _PREFIXES:
            match = prefix.match(text)
            if match and match.end() > 0:
                text = text[match.end() :]
                break
        else:
            break
    return text


def parse_line(text: str) -> KernelEvent | None:
    """The hardware event a kernel-log line reports, or None.

    `text` is one line from dmesg (plain, -T, -H or --decode --time-format iso), journalctl -k or
    syslog, or one /dev/kmsg message (which may span lines).
    """
    message = strip_prefix(text)
    if not message:
        return None
    # Cheap substring tests first: the watcher runs this on every kernel message.
    if "NVRM: " in message:
        if match := _XID.search(message):
            return KernelEvent("xid", match["pci"], int(match["code"]), message)
        if match := _FALLEN_OFF_BUS.search(message):
            return KernelEvent("xid", match["pci"] or match["pci2"], None, message)
        return None
    if "SXid (" in message and (match := _SXID.search(message)):
        return KernelEvent("sxid", match["pci"], int(match["code"]), message)
    if "AER: " in message or "PCIe Bus Error: " in message:
        if match := _AER_UNCORRECTED.search(message):
            return KernelEvent("pcie_aer_uncorrected", match["pci"], None, message)
        if match := _AER_CORRECTED.search(message):
            return KernelEvent("pcie_aer_corrected", match["pci"], None, message)
    if "mlx5_core " in message:
        if match := _MLX5.search(message):
            return KernelEvent("mlx5", match["pci"], None, message)
        if match := _MLX5_LINK.search(message):
            return KernelEvent(
                "mlx5_link_down" if match["state"] == "down" else "mlx5_link_up", match["pci"], None, message
            )
    if _THERMAL.search(message):
        return KernelEvent("thermal", None, None, message)
    if _MCE.search(message):
        return KernelEvent("mce", None, None, message)
    return None


def is_machine_check_notice(event: KernelEvent) -> bool:
    """Whether an ``mce`` event is the kernel's notice rather than a machine-check record."""
    return event.kind == "mce" and MACHINE_CHECK_NOTICE in event.message


_PCI_ADDRESS = re.compile(
    r"(?:PCI:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})"
    r"(?:\.(?P<function>[0-7]))?",
    re.IGNORECASE,
)


def normalize_pci_bus_id(bus_id: str) -> str:
    """The canonical form ``dddd:bb:dd.f`` (lower-case hex, domain at least 4 digits) of a PCI bus id.

    Accepts the kernel's and NVRM's forms (``0000:3b:00.0``, ``PCI:0000:3b:00``, ``0000:3b:00``),
    NVML's (``00000000:3B:00.0``) and lspci's short one (``3b:00.0``). A missing function is 0: the
    NVIDIA driver leaves it out because a GPU is always function 0. Raises ValueError otherwise,
    e.g. for the domain-less ``0003:00`` of pre-2010 drivers, which names no bus unambiguously.
    """
    match = _PCI_ADDRESS.fullmatch(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain = int(match["domain"] or "0", 16)
    bus = int(match["bus"], 16)
    device = int(match["device"], 16)
    function = int(match["function"] or "0")
    if device > 0x1F:
        raise ValueError(f"PCI device number out of range (0-1f) in {bus_id!r}")
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
