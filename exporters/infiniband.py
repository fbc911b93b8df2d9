"""RDMA devices from sysfs (`class/infiniband`, `class/net`, the PCI devices they sit on), as records.

Pure parsing, the procfs way: every record field comes from one sysfs file, named beside it, and
every quirk of those files is dealt with here so the collector only maps records to metrics:

- `port_rcv_data` / `port_xmit_data` (and the pre-4.5 `counters_ext/*_data_64`) count 4-octet
  words; the records hold bytes.
- `rate` is "<Gb> Gb/sec (<lanes>X[ <speed>])"; the records hold bytes per second (Gb × 1e9 / 8).
- A counter the kernel could not query reads `N/A (no PMA)` on older kernels and fails the read
  (EINVAL, ENOSYS, ...) on current ones. Either way, and for any other unreadable, empty or
  non-numeric file, that one value is left out (and listed in `RdmaDevice.skipped`); the rest of
  the device is still returned.
- The small PMA PortCounters saturate at their width instead of wrapping (IBTA PortCounters;
  kernel `drivers/infiniband/core/sysfs.c`, `PORT_PMA_ATTR(name, counter, width, offset)`), so a
  counter at 2^width - 1 has stopped counting: `RdmaPort.pinned_at_max` says which.

The files are read through exporters/sysfs.py, which bounds every read and holds the files read
on every collection open between collections. A reader asks for the counter files it needs
(`CounterSelection`): the rdma collector those of the families it exports, the audits none.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from clusterhealth.exporters.sysfs import (
    Failure,
    ReadCache,
    decode,
    held_files,
    identity,
    link_name,
    read_held_directory,
    read_raw,
)

T = TypeVar("T")

# Widths of the PortCounters fields the kernel shows in counters/. The error counters keep these
# widths on every kernel; the extended (64-bit) set only replaces the data and packet counters.
# port_xmit_wait is always read from the 32-bit PortCounters field: PortCountersExtended as the
# kernel knows it (include/rdma/ib_pma.h) has no PortXmitWait, and there is no
# PORT_PMA_ATTR_EXT(port_xmit_wait) in sysfs.c.
PMA_COUNTER_BITS: Mapping[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}

# Kernels before 4.5 put the 64-bit counters in counters_ext/ and left the 32-bit PortCounters
# fields in counters/; so when counters_ext/ exists, these counters/ files are 32 bits wide too.
LEGACY_32BIT_TRAFFIC_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")

# PCIe transfer rate (GT/s, as drivers/pci prints it) to the generation that introduced it.
PCIE_GENERATION_BY_GTS: Mapping[Decimal, int] = {
    Decimal("2.5"): 1,
    Decimal("5"): 2,
    Decimal("8"): 3,
    Decimal("16"): 4,
    Decimal("32"): 5,
    Decimal("64"): 6,
}

# What older kernels' show_pma_counter printed when the PMA query failed; current ones fail the read.
NO_PMA = "N/A (no PMA)"

# Digit runs are bounded in every pattern: a value is at most a few digits long, and int() of a
# run of thousands of digits raises instead of returning.
_RATE_RE = re.compile(
    r"(?P<gb>[0-9]{1,7}(?:\.[0-9]{1,3})?) Gb/sec(?: \((?P<lanes>[0-9]{1,3})X(?: (?P<speed>\w+))?\))?"
)
_STATE_RE = re.compile(r"(?P<id>[0-9]{1,3}): ?(?P<name>.*)")
_PCIE_SPEED_RE = re.compile(r"(?P<gts>[0-9]{1,4}(?:\.[0-9]{1,3})?) GT/s(?: PCIe)?")
_PCIE_WIDTH_RE = re.compile(r"x?(?P<lanes>[0-9]{1,3})")


def _counter_field(file: str) -> Any:
    """A counter read from `file`; the collector labels series with this sysfs file name."""
    return field(default=None, metadata={"file": file})


@dataclass(frozen=True)
class PortCounters:
    """ports/<n>/counters/: the PMA PortCounters (and PortCountersExtended) of one port."""

    symbol_error: int | None = _counter_field("symbol_error")
    link_error_recovery: int | None = _counter_field("link_error_recovery")
    link_downed: int | None = _counter_field("link_downed")
    port_rcv_errors: int | None = _counter_field("port_rcv_errors")
    port_rcv_remote_physical_errors: int | None = _counter_field("port_rcv_remote_physical_errors")
    port_rcv_switch_relay_errors: int | None = _counter_field("port_rcv_switch_relay_errors")
    port_xmit_discards: int | None = _counter_field("port_xmit_discards")
    port_xmit_constraint_errors: int | None = _counter_field("port_xmit_constraint_errors")
    port_rcv_constraint_errors: int | None = _counter_field("port_rcv_constraint_errors")
    local_link_integrity_errors: int | None = _counter_field("local_link_integrity_errors")
    excessive_buffer_overrun_errors: int | None = _counter_field("excessive_buffer_overrun_errors")
    vl15_dropped: int | None = _counter_field("VL15_dropped")
    # Not in mainline sysfs.c; older mlx4 trees (and node_exporter's fixture) have it.
    port_rcv_discards: int | None = _counter_field("port_rcv_discards")
    port_xmit_data_bytes: int | None = _counter_field("port_xmit_data")  # words × 4
    port_rcv_data_bytes: int | None = _counter_field("port_rcv_data")  # words × 4
    port_xmit_packets: int | None = _counter_field("port_xmit_packets")
    port_rcv_packets: int | None = _counter_field("port_rcv_packets")
    port_xmit_wait: int | None = _counter_field("port_xmit_wait")
    unicast_xmit_packets: int | None = _counter_field("unicast_xmit_packets")
    unicast_rcv_packets: int | None = _counter_field("unicast_rcv_packets")
    multicast_xmit_packets: int | None = _counter_field("multicast_xmit_packets")
    multicast_rcv_packets: int | None = _counter_field("multicast_rcv_packets")
    # Files this parser has no field for, by file name, so a driver's extra counter is not lost.
    other: Mapping[str, int] = field(default_factory=dict)

    def by_file(self) -> dict[str, int]:
        """Every value read, keyed by its file name in counters/ (data counters in bytes)."""
        values = {file: getattr(self, name) for file, name in _PORT_COUNTER_FIELD_BY_FILE.items()}
        present = {file: value for file, value in values.items() if value is not None}
        present.update(self.other)
        return present


# counters/ file name -> PortCounters field, worked out once rather than for every port read.
_PORT_COUNTER_FIELD_BY_FILE = {
    f.metadata["file"]: f.name for f in fields(PortCounters) if "file" in f.metadata
}


@dataclass(frozen=True)
class LegacyCounters:
    """ports/<n>/counters_ext/: the 64-bit counters of kernels before 4.5 (PortCountersExtended)."""

    port_xmit_data_bytes: int | None = _counter_field("port_xmit_data_64")  # words × 4
    port_rcv_data_bytes: int | None = _counter_field("port_rcv_data_64")  # words × 4
    port_xmit_packets: int | None = _counter_field("port_xmit_packets_64")
    port_rcv_packets: int | None = _counter_field("port_rcv_packets_64")
    unicast_xmit_packets: int | None = _counter_field("port_unicast_xmit_packets")
    unicast_rcv_packets: int | None = _counter_field("port_unicast_rcv_packets")
    multicast_xmit_packets: int | None = _counter_field("port_multicast_xmit_packets")
    multicast_rcv_packets: int | None = _counter_field("port_multicast_rcv_packets")


_LEGACY_COUNTER_FIELD_BY_FILE = {f.metadata["file"]: f.name for f in fields(LegacyCounters)}


@dataclass(frozen=True)
class RdmaPort:
    """ports/<n>/ of one RDMA device."""

    number: int  # the directory name under ports/
    state_id: int | None = None  # state: "4: ACTIVE" -> 4
    state: str | None = None  # state: "4: ACTIVE" -> "ACTIVE"
    physical_state_id: int | None = None  # phys_state: "5: LinkUp" -> 5
    physical_state: str | None = None  # phys_state: "5: LinkUp" -> "LinkUp"
    rate_bytes_per_second: int | None = None  # rate: "400 Gb/sec (4X NDR)" -> 50e9
    rate_lanes: int | None = None  # rate: "(4X NDR)" -> 4
    rate_speed: str | None = None  # rate: "(4X NDR)" -> "NDR"; None when the kernel printed none
    link_layer: str | None = None  # link_layer: "InfiniBand" or "Ethernet"
    counters: PortCounters | None = None  # counters/; absent for irdma, efa, ...
    legacy_counters: LegacyCounters | None = None  # counters_ext/, kernels before 4.5
    hw_counters: Mapping[str, int] = field(default_factory=dict)  # hw_counters/*, by file name
    hw_counters_lifespan_ms: int | None = None  # hw_counters/lifespan: a cache setting, no counter
    gid_netdevs: tuple[str, ...] = ()  # gid_attrs/ndevs/<index>, in GID-index order, once each
    # The port's network interface: the netdev of its lowest populated GID (RoCE), else the one
    # sharing the HCA's PCI function (IPoIB), narrowed by dev_port when the function has several.
    netdev: str | None = None
    # counters/ files of fixed PMA width -> True when the value sits at 2^width - 1.
    pinned_at_max: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class PciLink:
    """The PCIe link of the HCA's PCI function (class/infiniband/<dev>/device/...)."""

    address: str  # basename of the resolved `device` link, e.g. 0000:18:00.0
    generation: int | None = None  # current_link_speed: "32.0 GT/s PCIe" -> 5
    generation_max: int | None = None  # max_link_speed
    width: int | None = None  # current_link_width: "16" -> 16 lanes
    width_max: int | None = None  # max_link_width


@dataclass(frozen=True)
class Netdev:
    """class/net/<name>/ of a network interface an RDMA device uses."""

    name: str
    mtu_bytes: int | None = None  # mtu


@dataclass(frozen=True)
class SkippedFile:
    """A file that was present but gave no value; `path` is relative to class/infiniband."""

    path: str
    reason: str


@dataclass(frozen=True)
class RdmaDevice:
    """class/infiniband/<name>/ with its ports, PCIe link and network interfaces."""

    name: str
    firmware_version: str | None = None  # fw_ver
    board_id: str | None = None  # board_id
    hca_type: str | None = None  # hca_type
    node_guid: str | None = None  # node_guid
    pci: PciLink | None = None  # device -> the PCI function
    ports: tuple[RdmaPort, ...] = ()  # ports/<n>, by number
    netdevs: tuple[Netdev, ...] = ()  # every interface of its ports and of its PCI function
    skipped: tuple[SkippedFile, ...] = ()


def parse_state(text: str) -> tuple[int, str] | None:
    """`state` / `phys_state`: "4: ACTIVE" -> (4, "ACTIVE"); None when not of that form."""
    match = _STATE_RE.fullmatch(text.strip())
    if match is None:
        return None
    return int(match["id"]), match["name"].strip()


def parse_rate(text: str) -> tuple[int, int | None, str | None] | None:
    """`rate`: "400 Gb/sec (4X NDR)" -> (50_000_000_000 bytes/s, 4, "NDR").

    Older kernels print no speed name for SDR ("10 Gb/sec (4X)"), and the value has a ".5"
    for 2.5 Gb/sec lanes, so the number is read as a decimal and converted exactly.
    """
    match = _RATE_RE.fullmatch(text.strip())
    if match is None:
        return None
    bytes_per_second = int(Decimal(match["gb"]) * 1_000_000_000 / 8)
    lanes = int(match["lanes"]) if match["lanes"] else None
    return bytes_per_second, lanes, match["speed"]


def parse_pcie_generation(text: str) -> int | None:
    """`*_link_speed`: "32.0 GT/s PCIe" (older kernels: "8 GT/s") -> 5; "Unknown" -> None."""
    match = _PCIE_SPEED_RE.fullmatch(text.strip())
    return PCIE_GENERATION_BY_GTS.get(Decimal(match["gts"])) if match else None


def parse_pcie_width(text: str) -> int | None:
    """`*_link_width`: "16" -> 16. A virtual function reads 0 (the register is reserved): None."""
    lanes = _parse_lanes(text)
    return lanes or None


def _parse_lanes(text: str) -> int | None:
    match = _PCIE_WIDTH_RE.fullmatch(text.strip())
    return int(match["lanes"]) if match else None


@dataclass(frozen=True)
class CounterSelection:
    """Which counter files a read takes: the names `counters` accepts in `counters/` and
    `counters_ext/`, and those `hw_counters` accepts in `hw_counters/` (None: every file). The
    collector reads only what it exports; every file is read by default."""

    counters: Callable[[str], bool] | None = None
    hw_counters: Callable[[str], bool] | None = None


EVERY_COUNTER = CounterSelection()
# For readers that need no counter (the audits, the probes' transport): directories are still
# listed, so a port with counters/ still says so, but no counter file is read.
NO_COUNTERS = CounterSelection(lambda _: False, lambda _: False)


def read_rdma_devices(
    sysfs_root: Path,
    cache: ReadCache | None = None,
    *,
    counters: CounterSelection = EVERY_COUNTER,
    selects: Callable[[str], bool] | None = None,
) -> list[RdmaDevice]:
    """Every RDMA device under `<sysfs_root>/class/infiniband` (those `selects` keeps), by name.

    Raises FileNotFoundError when that directory is absent (no RDMA stack on this node) and lets
    an error listing it propagate; below it, what cannot be read is left out, never raised.
    With a `cache` (one per reader, reused), what does not change while a device stays registered
    is read once (see exporters/sysfs.py's ReadCache): the identity attributes (`fw_ver`,
    `board_id`, `hca_type`, `node_guid`), each port's `link_layer`, the HCA's PCI function and its
    `max_link_*`, the port numbers, an interface's `ifindex`, `iflink`, `dev_port` and PCI
    function; and the files read every time (counters, states, rates, current link, MTUs, the
    GIDs' interfaces) are held open and read again at offset 0.
    """
    root = os.fspath(sysfs_root)
    class_dir = f"{root}/class/infiniband"
    if not os.path.isdir(class_dir):
        raise FileNotFoundError(errno.ENOENT, "no RDMA devices (class/infiniband is absent)", class_dir)
    # A read without the caller's cache holds nothing open beyond itself.
    own = cache is None
    cache = cache if cache is not None else ReadCache(held_budget=0)
    try:
        interfaces = _Interfaces(f"{root}/class/net", cache)
        devices = []
        for name in sorted(os.listdir(class_dir), key=_natural):
            if selects is not None and not selects(name):
                continue
            device_dir = f"{class_dir}/{name}"
            try:
                status = os.stat(device_dir)
            except OSError:
                continue  # gone since the listing, or a link to nothing
            # A regular file here (a tree copied without its symlinks) is not a device.
            if stat.S_ISDIR(status.st_mode):
                reader = _Reader(device_dir, name, identity(status), cache)
                devices.append(_read_device(reader, interfaces, counters))
        cache.turn()
    finally:
        if own:
            cache.close()
    return devices


def _natural(name: str) -> list[int | str]:
    """mlx5_2 before mlx5_10 (odd items are the runs of ASCII digits)."""
    return [int(part) if i % 2 else part for i, part in enumerate(_DIGIT_RUNS.split(name))]


_DIGIT_RUNS = re.compile("([0-9]+)")


@dataclass(frozen=True)
class _Interface:
    name: str
    pci_function: tuple[int, int] | None  # (st_dev, st_ino) of the directory `device` leads to
    dev_port: int | None
    is_child: bool  # an IPoIB P_Key child or other stacked interface (iflink != ifindex)
    key: tuple[object, ...]  # what it is while it exists: its directory's identity


class _Interfaces:
    """The interfaces of class/net: what each is, read once while it exists, and the MTU of those
    an RDMA device uses, read when asked (a node may have hundreds of others: veths, bridges)."""

    def __init__(self, class_net: str, cache: ReadCache) -> None:
        self.class_net, self.cache = class_net, cache
        self.by_name: dict[str, _Interface] = {}
        try:
            names = os.listdir(class_net)
        except OSError:
            return
        for name in sorted(names, key=_natural):
            entry = f"{class_net}/{name}"
            try:
                status = os.stat(entry)
            except OSError:
                continue
            if not stat.S_ISDIR(status.st_mode):  # bonding_masters, or a link flattened into a file
                continue
            key = ("interface", identity(status))
            static = cache.get(key)
            if static is None:
                ifindex = _read_small_int(f"{entry}/ifindex")
                iflink = _read_small_int(f"{entry}/iflink")
                static = (
                    _function_of(f"{entry}/device"),
                    _read_small_int(f"{entry}/dev_port"),
                    ifindex is not None and iflink is not None and ifindex != iflink,
                )
                if ifindex is not None and iflink is not None:
                    cache.put(key, static)
            function, dev_port, is_child = static
            self.by_name[name] = _Interface(name, function, dev_port, is_child, key)

    def on_function(self, function: tuple[int, int] | None) -> list[_Interface]:
        if function is None:
            return []
        return [i for i in self.by_name.values() if i.pci_function == function]

    def mtu(self, name: str) -> int | None:
        interface = self.by_name.get(name)
        if interface is None:
            return None
        held = held_files(self.cache, ("mtu", interface.key), f"{self.class_net}/{name}", ["mtu"])
        ((_, raw),) = held.read()
        return None if isinstance(raw, Failure) else _small_int(raw)


class _Reader:
    """Reads the attributes of one device, remembering what was present but unusable.

    About 300 small files are read per collection on a 10-HCA node, so the cost of each one is
    what matters: paths are plain strings, a file read every time is held open and read again
    with pread (one system call), and a file that does not change is read once per registration.
    """

    def __init__(self, device_dir: str, name: str, identity: tuple[int, int, int], cache: ReadCache) -> None:
        self.device_dir = device_dir
        self.name = name
        self.identity = identity
        self.cache = cache
        self.skipped: list[SkippedFile] = []
        self._attributes: dict[str, bytes | Failure] = {}

    def _skip(self, relative: str, reason: str) -> None:
        self.skipped.append(SkippedFile(f"{self.name}/{relative}", reason))

    def _failed(self, relative: str, reason: str) -> None:
        if reason != "ENOENT":  # an absent file is normal: drivers differ
            self._skip(relative, reason)

    def _usable(self, relative: str, raw: bytes | Failure) -> bytes | None:
        """The bytes, or None (and why) when there are none."""
        if isinstance(raw, Failure):
            self._failed(relative, raw.reason)
            return None
        if not raw:
            self._skip(relative, "empty")
            return None
        return raw

    def static_text(self, relative: str) -> str | None:
        """The text of an attribute that does not change while the device stays registered."""
        key = (self.identity, relative)
        text = self.cache.get(key)
        if text is None:
            raw = self._usable(relative, read_raw(f"{self.device_dir}/{relative}"))
            text = None if raw is None else decode(raw)
            if text is not None:
                self.cache.put(key, text)
        return text

    def hold(self, relatives: list[str]) -> None:
        """Read the attributes read on every collection (held open while the device stays
        registered); `parsed` then takes them from here."""
        held = held_files(self.cache, ("attributes", self.identity), self.device_dir, relatives)
        self._attributes = dict(held.read())

    def parsed(self, relative: str, parse: Callable[[str], T | None], static: bool = False) -> T | None:
        if static:
            text = self.static_text(relative)
        else:
            raw = self._usable(relative, self._attributes.get(relative, Failure("ENOENT")))
            text = None if raw is None else decode(raw)
        if text is None:
            return None
        value = parse(text)
        if value is None:
            self._skip(relative, f"unexpected format: {text[:40]!r}")
        return value

    def _not_a_counter(self, relative: str, raw: bytes) -> None:
        text = decode(raw)
        if not raw:
            reason = "empty"
        elif text.startswith("N/A"):
            reason = text[:40]
        elif raw.isdigit():
            reason = f"out of range: {len(raw)} digits"
        else:
            reason = f"not a counter: {text[:40]!r}"
        self._skip(relative, reason)

    def counter_files(
        self, relative_dir: str, wanted: Callable[[str], bool] | None
    ) -> tuple[bool, dict[str, int]]:
        """Whether a counter directory is there, and {file name: value} of its readable counters
        that `wanted` accepts."""
        values: dict[str, int] = {}
        path = f"{self.device_dir}/{relative_dir}"
        files = read_held_directory(self.cache, (self.identity, relative_dir), path, wanted)
        if isinstance(files, Failure):
            if files.reason == "ENOENT":
                return False, values
            self._skip(relative_dir, files.reason)
            # Present but unreadable (EACCES) still says the device has such counters.
            return _is_dir(path), values
        # This loop runs for every counter file: the common case (digits) is tested inline.
        for name, raw in files:
            if isinstance(raw, Failure):
                self._failed(f"{relative_dir}/{name}", raw.reason)
            elif raw.isdigit() and len(raw) <= _COUNTER_MAX_DIGITS and (value := int(raw)) <= COUNTER_MAX:
                values[name] = value
            else:
                self._not_a_counter(f"{relative_dir}/{name}", raw)
        return True, values

    def gid_netdevs(self, base: str) -> tuple[str, ...]:
        relative = f"{base}/gid_attrs/ndevs"
        path = f"{self.device_dir}/{relative}"
        files = read_held_directory(self.cache, (self.identity, relative), path, _is_index)
        if isinstance(files, Failure):
            return ()
        names: list[str] = []
        for _, raw in sorted(files, key=lambda entry: int(entry[0])):
            # An unused GID entry fails with EINVAL: the normal case for most of the table, not a fault.
            if isinstance(raw, bytes) and raw and (text := decode(raw)) not in names:
                names.append(text)
        return tuple(names)


def _is_index(name: str) -> bool:
    return name.isascii() and name.isdigit()


# The hardware counters are at most 64 bits wide (sysfs prints them as unsigned decimals); a
# longer run of digits is damage, and int() of thousands of digits raises, so it is bounded here.
COUNTER_MAX = (1 << 64) - 1
_COUNTER_MAX_DIGITS = len(str(COUNTER_MAX))
# Interface attributes (ifindex, iflink, dev_port, mtu) are 32-bit.
_SMALL_INT_MAX = (1 << 32) - 1


def _counter_value(raw: bytes) -> int | None:
    """An unsigned decimal counter of at most 64 bits; None for anything else."""
    # bytes.isdigit() is ASCII-only: "+5", "-1", " 5", "1_0" and other scripts' digits all fail.
    if not raw.isdigit() or len(raw) > _COUNTER_MAX_DIGITS:
        return None
    value = int(raw)
    return value if value <= COUNTER_MAX else None


def _read_small_int(path: str) -> int | None:
    raw = read_raw(path)
    return None if isinstance(raw, Failure) else _small_int(raw)


def _small_int(raw: bytes) -> int | None:
    if len(raw) > 12:
        return None
    try:
        value = int(raw, 0)
    except ValueError:
        return None
    return value if 0 <= value <= _SMALL_INT_MAX else None


def _function_of(link: str) -> tuple[int, int] | None:
    """The identity of the directory a sysfs `device` link leads to, or None when there is none.

    Two links lead to the same PCI function when they lead to the same directory: comparing the
    (device, inode) pair of the target costs one stat where resolving the path costs one per part.
    """
    try:
        status = os.stat(link)
    except OSError:
        return None
    return (status.st_dev, status.st_ino) if stat.S_ISDIR(status.st_mode) else None


def _function_address(link: str) -> str:
    """The PCI address the `device` link names: the last part of its target (0000:18:00.0)."""
    try:
        return link_name(link)
    except OSError:  # not a link: a tree copied without its symlinks
        return os.path.basename(os.path.realpath(link))


@dataclass(frozen=True)
class _Registration:
    """What holds while a device stays registered: its PCI function and its ports."""

    function: tuple[int, int] | None
    address: str
    ports: tuple[int, ...]


def _registration(reader: _Reader) -> _Registration:
    key = ("registration", reader.identity)
    known = reader.cache.get(key)
    if isinstance(known, _Registration):
        return known
    link = f"{reader.device_dir}/device"
    function = _function_of(link)
    try:
        names = os.listdir(f"{reader.device_dir}/ports")
    except OSError:
        names = []
    known = _Registration(
        function,
        _function_address(link) if function else "",
        tuple(sorted(int(name) for name in names if _is_index(name))),
    )
    reader.cache.put(key, known)
    return known


def _read_device(reader: _Reader, interfaces: _Interfaces, counters: CounterSelection) -> RdmaDevice:
    firmware_version = reader.static_text("fw_ver")
    board_id = reader.static_text("board_id")
    hca_type = reader.static_text("hca_type")
    node_guid = reader.static_text("node_guid")
    registration = _registration(reader)
    attributes = [f"ports/{number}/{name}" for number in registration.ports for name in PORT_ATTRIBUTES]
    if registration.function is not None:
        attributes += PCIE_ATTRIBUTES
    reader.hold(attributes)
    pci = _read_pci_link(reader, registration)
    on_same_function = interfaces.on_function(registration.function)
    ports = tuple(_read_port(reader, number, on_same_function, counters) for number in registration.ports)
    names = {i.name for i in on_same_function}
    for port in ports:
        names.update(port.gid_netdevs)
    netdevs = tuple(Netdev(name, interfaces.mtu(name)) for name in sorted(names))
    return RdmaDevice(
        name=reader.name,
        firmware_version=firmware_version,
        board_id=board_id,
        hca_type=hca_type,
        node_guid=node_guid,
        pci=pci,
        ports=ports,
        netdevs=netdevs,
        skipped=tuple(reader.skipped),
    )


# A port's and a PCI function's attributes read on every collection, held open.
PORT_ATTRIBUTES = ("state", "phys_state", "rate")
PCIE_ATTRIBUTES = ["device/current_link_speed", "device/current_link_width"]


def _read_pci_link(reader: _Reader, registration: _Registration) -> PciLink | None:
    if registration.function is None:
        return None
    return PciLink(
        address=registration.address,
        generation=reader.parsed("device/current_link_speed", parse_pcie_generation),
        generation_max=reader.parsed("device/max_link_speed", parse_pcie_generation, static=True),
        width=reader.parsed("device/current_link_width", _parse_lanes) or None,
        width_max=reader.parsed("device/max_link_width", _parse_lanes, static=True) or None,
    )


def _read_port(
    reader: _Reader, number: int, on_same_function: list[_Interface], counters: CounterSelection
) -> RdmaPort:
    base = f"ports/{number}"
    state = reader.parsed(f"{base}/state", parse_state)
    physical_state = reader.parsed(f"{base}/phys_state", parse_state)
    rate = reader.parsed(f"{base}/rate", parse_rate)

    counters_present, raw_counters = reader.counter_files(f"{base}/counters", counters.counters)
    legacy_present, raw_legacy = reader.counter_files(f"{base}/counters_ext", counters.counters)
    _, hw_counters = reader.counter_files(f"{base}/hw_counters", counters.hw_counters)
    lifespan = hw_counters.pop("lifespan", None)

    gid_netdevs = reader.gid_netdevs(base)
    return RdmaPort(
        number=number,
        state_id=state[0] if state else None,
        state=state[1] if state else None,
        physical_state_id=physical_state[0] if physical_state else None,
        physical_state=physical_state[1] if physical_state else None,
        rate_bytes_per_second=rate[0] if rate else None,
        rate_lanes=rate[1] if rate else None,
        rate_speed=rate[2] if rate else None,
        link_layer=reader.static_text(f"{base}/link_layer"),
        counters=_port_counters(raw_counters) if counters_present else None,
        legacy_counters=_legacy_counters(raw_legacy) if legacy_present else None,
        hw_counters=hw_counters,
        hw_counters_lifespan_ms=lifespan,
        gid_netdevs=gid_netdevs,
        netdev=gid_netdevs[0] if gid_netdevs else _function_netdev(number, on_same_function),
        pinned_at_max=_pinned_at_max(raw_counters, legacy_present),
    )


def _is_dir(path: str) -> bool:
    """Only asked when listing failed: an unlistable directory (EACCES) is still present."""
    return os.path.isdir(path)


def _function_netdev(port_number: int, candidates: list[_Interface]) -> str | None:
    """The interface on the HCA's PCI function that belongs to this port (IPoIB has no GID ndev)."""
    if len(candidates) > 1:
        # mlx4 and IPoIB number the interfaces of a multi-port function by dev_port = port - 1.
        by_port = [i for i in candidates if i.dev_port == port_number - 1]
        candidates = by_port or candidates
    if len(candidates) > 1:
        # P_Key children share the parent's function and dev_port; the port's own is the parent.
        parents = [i for i in candidates if not i.is_child]
        candidates = parents or candidates
    return min(candidates, key=lambda i: i.name).name if candidates else None


def _port_counters(raw: Mapping[str, int]) -> PortCounters:
    by_file = _PORT_COUNTER_FIELD_BY_FILE
    values: dict[str, int] = {}
    other: dict[str, int] = {}
    for file, value in raw.items():
        if file in by_file:
            values[by_file[file]] = value * 4 if file in ("port_xmit_data", "port_rcv_data") else value
        else:
            other[file] = value
    return PortCounters(**values, other=other)


def _legacy_counters(raw: Mapping[str, int]) -> LegacyCounters:
    by_file = _LEGACY_COUNTER_FIELD_BY_FILE
    values = {
        by_file[file]: value * 4 if file.endswith("_data_64") else value
        for file, value in raw.items()
        if file in by_file
    }
    return LegacyCounters(**values)


def _pinned_at_max(raw: Mapping[str, int], legacy_present: bool) -> dict[str, bool]:
    widths = dict(PMA_COUNTER_BITS)
    if legacy_present:
        widths.update(dict.fromkeys(LEGACY_32BIT_TRAFFIC_COUNTERS, 32))
    return {file: raw[file] == (1 << bits) - 1 for file, bits in widths.items() if file in raw}
