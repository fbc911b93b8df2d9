"""Kernel-log lines to typed hardware events: NVIDIA Xid/SXid, PCIe AER, mlx5, machine checks, thermal.

`parse_line` takes one line as a log tool printed it (or one /dev/kmsg message) and returns a
`KernelEvent`, or None when the line is not an event. It is a pure function; reading the log is
`clusterhealth.checks.kmsg`'s job, and what a code means is `clusterhealth.checks.xid_catalog`'s.

An event is recognised by the kernel's own text wherever it stands in the line, never by what a log
tool put before it: dmesg's `[seconds]`, `dmesg -T`'s date, journald and syslog dates in any
locale (`фев 12 00:48:02`, `6月 28 02:52:53`, RFC 3339), a host name, a `kernel:` tag, a caller id
(`[T45426]`), or nothing. The event's ``message`` starts where the kernel's text starts.

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
- ``mlx5`` is a ConnectX function's error line, with or without the ``function:line:(pid N):``
  caller that mlx5_core_err puts before its text, and the informational lines printed in the same
  shapes (a slot's power advertisement, a module plugged in), which `is_informational` tells apart.
  Of a health-buffer dump (print_health_info) two lines are events: its header ``Health issue
  observed, <what>, severity(N) <LEVEL>:`` (newer kernels, `is_health_header`) and its
  ``synd 0x..: <what>`` line, which every kernel prints (`is_health_syndrome`); the registers are
  continuation lines. One dump is one fault: the watcher counts its header, or its syndrome where
  the kernel printed no header.
- ``mlx5_link_down`` and ``mlx5_link_up`` are a ConnectX netdev's carrier changes, and
  ``mlx5_link_down`` also the InfiniBand port's own "Port: N Link DOWN" (`is_ib_port_line`), which
  a RoCE port prints next to its netdev's line for the same loss of link; ``pci`` is the function's
  bus id.
- ``pci`` is the bus id exactly as printed. Xid lines print ``domain:bus:device`` without the
  function, NVML prints an 8-digit upper-case domain; `normalize_pci_bus_id` makes them comparable.
- The kernel reports one AER error on two lines, "AER: ... error received" from the root port and
  "PCIe Bus Error: severity=..." (behind "AER: " on kernels 4.20 to 6.x) from each device that
  logged it; both are events here (the shared fixture asks for it), with the bus id of the device
  that printed the line. `is_aer_device_report` picks the device's line, to count each error once.
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
    """The kernel's text: the line from where the kernel's own words start (nothing a log tool put
    before them)."""


# A full bus/device/function address as the kernel's dev_printk prints it: 0000:3b:00.0.
_BDF = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
# What NVRM puts between "Xid (" and ")": PCI:0000:3b:00, 0000:3b:00, and in very old drivers 0003:00.
_NV_BUS = r"[0-9A-Fa-f]+(?::[0-9A-Fa-f]+)+(?:\.[0-7])?"
# dev_printk's "<driver> <bus id>: ": the driver name (or "pci" when none is bound) starts the message.
_DEVICE = r"(?:[\w.-]+ )?(?P<pci>" + _BDF + r")"

# Every pattern below is searched for anywhere in the line and starts where the kernel's own text
# starts (the driver name, "NVRM:", "mce:", ...): whatever a log tool wrote before it (a dmesg
# timestamp, a journald or syslog date in any locale, a host name, a "kernel:" tag, a caller id
# such as "[T45426]") is never read, so no prefix shape has to be known.

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
_SXID = re.compile(r"(?:nvidia-nvswitch\d+: )?SXid \((?:PCI:)?(?P<pci>" + _NV_BUS + r")\): " + _CODE)
# The device that logged an AER error reports it on its own "PCIe Bus Error: severity=..." line,
# which kernels 4.20 to 6.x print behind the "AER: " of aer.c's dev_fmt and others print without it.
_AER_REPORT = re.compile(
    _DEVICE + r": (?:AER: )?PCIe Bus Error: severity=(?P<severity>Correct|Uncorrect)(?:ed|able)\b"
)
# The root port's notice that an error message reached it ("AER: Corrected error received: <source>",
# since 6.x "AER: Correctable error message received from <source>"; "Multiple" when it collected
# more than one). It names the root port, and the device's own line follows it.
_AER_RECEIVED = re.compile(
    _DEVICE + r": AER: (?:Multiple )?(?P<severity>Correct|Uncorrect)(?:ed|able)"
    r"(?: \((?:Non-)?Fatal\))? error(?: message)? received"
)
# A ConnectX function's line: "mlx5_core <bus id>: <text>", where mlx5_core_err/_warn/_info_rl and
# mlx5_log put the caller before the text ("poll_health:709:(pid 0): ", older kernels the bus id too:
# "0000:03:00.0:handle_hca_cap:438:(pid 6016): ") and plain dev_err/dev_info do not.
_MLX5 = re.compile(
    r"mlx5_core (?P<pci>" + _BDF + r"): "
    r"(?P<caller>(?:[0-9A-Fa-f:.]+:)?[A-Za-z_]\w*:\d+:(?:\(pid \d+\):)? )?(?P<text>.*)",
    re.DOTALL,
)
# Informational lines, whichever of the two shapes they come in: the PCIe slot's power advertisement,
# a cable or module plugged or unplugged (an error is "Port module event[error]:"), and the note that
# a profile value was lowered to what the card supports.
_MLX5_INFORMATIONAL = re.compile(
    r"PCIe slot advertised sufficient power"
    r"|PCIe slot power capability was not advertised"
    r"|Port module event: "
    r"|log_max_qp value in current profile is \d+, changing it to HCA capability limit"
)
# print_health_info's dump of the firmware's health buffer: one fault, which newer kernels head
# with "Health issue observed, <syndrome>, severity(N) <LEVEL>:" and every kernel tells by its
# "synd 0x..: <what>" line; the registers around them are its continuation lines.
_MLX5_HEALTH_DUMP = re.compile(
    r"(?:assert_var\[\d+\]|assert_exit_ptr|assert_callra|fw_ver|raw fw_ver|hw_id|irisc_index|ext_synd"
    r"|time|rfr|severity) \S"
)
_MLX5_HEALTH_HEADER = re.compile(r"Health issue observed, ")
_MLX5_HEALTH_SYNDROME = re.compile(r"synd 0x[0-9a-fA-F]+: ")
# Faults that kernels print with dev_err/dev_warn, without the caller: the health poller's
# (older kernels print all of these that way) and a failed probe ("mlx5_load_one failed with error
# code -22", "handle_hca_cap failed").
_MLX5_FAULT_WITHOUT_CALLER = re.compile(
    r"device's health compromised|Fatal error \d+ detected|synd 0x[0-9a-fA-F]+: "
    r"|health recovery flow aborted|PCI slot is unavailable|\b[Ff]ailed\b"
)
# mlx5e_update_carrier(): netdev_info(netdev, "Link up") / "Link down", after "mlx5_core <bus id> ".
_MLX5_LINK = re.compile(r"mlx5_core (?P<pci>" + _BDF + r") [^\s:]+: Link (?P<state>up|down)\b")
# The InfiniBand port's own state change (IB core, kernels since early 2025):
# "mlx5_core <bus id> mlx5_3: Port: 1 Link DOWN". Only DOWN is an event; a RoCE port prints it beside
# its netdev's "Link down".
_IB_PORT_DOWN = re.compile(r"mlx5_core (?P<pci>" + _BDF + r") [^\s:]+: Port: \d+ Link DOWN\b")
MACHINE_CHECK_NOTICE = "Machine check events logged"
# The first line of each machine-check record: the kernel's own ("mce: [Hardware Error]: CPU 2:
# Machine Check: 0 Bank 3: cc5eb2c000100135", "... Machine Check Exception: 5 Bank 7: ..." when the
# check interrupted the CPU), sb_edac's "CPU 1: Machine Check Event: 0 Bank 11: ...", and on AMD the
# EDAC decoder's "[Hardware Error]: CPU:0 (17:1:1) MC15_STATUS[Over|CE|...]: 0xdc2040000000011b".
_MCE = re.compile(
    r"mce: \[Hardware Error\]: "
    + MACHINE_CHECK_NOTICE
    + r"|(?:mce: \[Hardware Error\]: |EDAC [\w-]+ MC\d+: )?"
    r"CPU \d+: Machine Check(?: Exception| Event)?: +[0-9a-f]+ Bank \d+: +[0-9a-f]+"
    r"|\[Hardware Error\]: CPU:\d+ \([0-9a-f]+:[0-9a-f]+:[0-9a-f]+\) MC\d+_STATUS\["
)
# Also printed with an "mce: " prefix, but it is CPU thermal throttling, not a machine check; the
# recovery line "Package temperature/speed normal" is deliberately not an event.
_THERMAL = re.compile(r"(?:mce: )?CPU\d+: (?:Core|Package) temperature above threshold, cpu clock throttled")


def parse_line(text: str) -> KernelEvent | None:
    """The hardware event a kernel-log line reports, or None.

    `text` is one line as dmesg (plain, -T, -H, --decode, --time-format iso), journalctl -k, syslog or
    a collector with a host name printed it, or one /dev/kmsg message (which may span lines).
    """
    # Cheap substring tests first: the watcher runs this on every kernel message.
    if "NVRM: " in text:
        if match := _XID.search(text):
            return _event("xid", match, text, int(match["code"]))
        if match := _FALLEN_OFF_BUS.search(text):
            return KernelEvent("xid", match["pci"] or match["pci2"], None, _from(text, match.start()))
        return None
    if "SXid (" in text and (match := _SXID.search(text)):
        return _event("sxid", match, text, int(match["code"]))
    if "PCIe Bus Error: " in text and (match := _AER_REPORT.search(text)):
        return _aer_event(match, text)
    if "AER: " in text and (match := _AER_RECEIVED.search(text)):
        return _aer_event(match, text)
    if "mlx5_core " in text:
        return _mlx5_event(text)
    if match := _THERMAL.search(text):
        return KernelEvent("thermal", None, None, _from(text, match.start()))
    if match := _MCE.search(text):
        return KernelEvent("mce", None, None, _from(text, match.start()))
    return None


def _from(text: str, start: int) -> str:
    return text[start:].strip()


def _event(kind: EventKind, match: re.Match[str], text: str, code: int | None = None) -> KernelEvent:
    return KernelEvent(kind, match["pci"], code, _from(text, match.start()))


def _aer_event(match: re.Match[str], text: str) -> KernelEvent:
    kind: EventKind = "pcie_aer_corrected" if match["severity"] == "Correct" else "pcie_aer_uncorrected"
    return _event(kind, match, text)


def _mlx5_event(text: str) -> KernelEvent | None:
    if match := _MLX5_LINK.search(text):
        return _event("mlx5_link_down" if match["state"] == "down" else "mlx5_link_up", match, text)
    if match := _IB_PORT_DOWN.search(text):
        return _event("mlx5_link_down", match, text)
    match = _MLX5.search(text)
    if match is None or _MLX5_HEALTH_DUMP.match(match["text"]):
        return None
    if (
        match["caller"]
        or _MLX5_INFORMATIONAL.match(match["text"])
        or _MLX5_FAULT_WITHOUT_CALLER.search(match["text"])
    ):
        return _event("mlx5", match, text)
    return None


def is_informational(event: KernelEvent) -> bool:
    """Whether an ``mlx5`` event is a notice that reports no fault (a slot's power advertisement, a
    module plugged in): a counter of faults leaves it out."""
    return _mlx5_text_matches(event, _MLX5_INFORMATIONAL)


def is_health_header(event: KernelEvent) -> bool:
    """Whether an ``mlx5`` event is the "Health issue observed" line that opens a health-buffer dump."""
    return _mlx5_text_matches(event, _MLX5_HEALTH_HEADER)


def is_health_syndrome(event: KernelEvent) -> bool:
    """Whether an ``mlx5`` event is a health-buffer dump's "synd 0x..: <what>" line, which repeats
    the fault of the dump's header where the kernel printed one."""
    return _mlx5_text_matches(event, _MLX5_HEALTH_SYNDROME)


def _mlx5_text_matches(event: KernelEvent, pattern: re.Pattern[str]) -> bool:
    if event.kind != "mlx5":
        return False
    match = _MLX5.search(event.message)
    return match is not None and pattern.match(match["text"]) is not None


def is_aer_device_report(event: KernelEvent) -> bool:
    """Whether a ``pcie_aer_*`` event is the device's own "PCIe Bus Error" line (one per error and
    device that logged it) rather than the root port's "error received" notice before it."""
    return event.kind.startswith("pcie_aer_") and _AER_REPORT.match(event.message) is not None


def is_ib_port_line(event: KernelEvent) -> bool:
    """Whether an ``mlx5_link_down`` event is the InfiniBand port's own "Port: N Link DOWN" line
    rather than its netdev's "Link down"; a RoCE port prints both for one loss of link."""
    return event.kind == "mlx5_link_down" and _IB_PORT_DOWN.match(event.message) is not None


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
