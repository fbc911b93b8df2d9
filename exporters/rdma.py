"""RDMA ports, counters, PCIe links and netdev MTUs from sysfs, as metric families.

Reading and its quirks live in exporters/infiniband.py; this module only maps its records to the
SPEC's "RDMA and network" metrics (labels `device` and `port` as node_exporter names them) plus
a few of this project's own: the PMA counters pinned at their width, the HCA's PCIe link, and
the counters node_exporter also exports (unicast/multicast, pre-4.5 `counters_ext/`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clusterhealth.exporters.base import NoData
from clusterhealth.exporters.infiniband import (
    PMA_COUNTER_BITS,
    CounterSelection,
    LegacyCounters,
    PortCounters,
    RdmaDevice,
    read_rdma_devices,
)
from clusterhealth.exporters.sysfs import ReadCache

PORT = ["device", "port"]

# counters/ files that count traffic or congestion; every other file there counts an error or a
# discard (the PMA PortCounters are one or the other), so a counter this list does not know,
# from a newer kernel or a vendor tree, still lands in clusterhealth_rdma_port_errors_total.
TRAFFIC_COUNTER_FILES = frozenset(
    {
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "port_xmit_wait",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
    }
)

# The error counters of counters/ exported by default (`error_counters`): what the alerts read
# (symbol and link-integrity errors, flaps, damaged packets) and the transmit discards that
# congestion causes. The other files (constraint errors, switch relay errors, VL15 drops) are
# partition and subnet-management matters, exported with `error_counters: ['*']`.
ERROR_COUNTERS_DEFAULT = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)
# The driver counters of hw_counters/ exported by default (`hw_counters`): congestion (receive
# buffers exhausted; RoCE congestion notifications sent, handled, and ECN marks) and the transport
# error that stalls a queue pair for its whole acknowledgement timeout (local_ack_timeout_err: a
# packet or its ack was lost and the sender waited to resend). The rest (out-of-sequence arrivals,
# which the responder NAKs and the sender resends at once; request and completion counts,
# per-opcode errors, irdma's IP and TCP counters) with `hw_counters: ['*']`.
HW_COUNTERS_DEFAULT = (
    "out_of_buffer",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
)

# (metric name, help, PortCounters field) for the traffic counters of counters/.
PORT_TRAFFIC = (
    (
        "clusterhealth_rdma_port_data_received_bytes_total",
        "Octets received (port_rcv_data counts 4-octet words).",
        "port_rcv_data_bytes",
    ),
    (
        "clusterhealth_rdma_port_data_transmitted_bytes_total",
        "Octets transmitted (port_xmit_data counts 4-octet words).",
        "port_xmit_data_bytes",
    ),
    (
        "clusterhealth_rdma_port_packets_received_total",
        "Packets received (port_rcv_packets).",
        "port_rcv_packets",
    ),
    (
        "clusterhealth_rdma_port_packets_transmitted_total",
        "Packets transmitted (port_xmit_packets).",
        "port_xmit_packets",
    ),
    (
        "clusterhealth_rdma_port_xmit_wait_total",
        "Ticks during which the port had data to send but sent none (port_xmit_wait): congestion.",
        "port_xmit_wait",
    ),
    (
        "clusterhealth_rdma_port_unicast_packets_received_total",
        "Unicast packets received (unicast_rcv_packets).",
        "unicast_rcv_packets",
    ),
    (
        "clusterhealth_rdma_port_unicast_packets_transmitted_total",
        "Unicast packets transmitted (unicast_xmit_packets).",
        "unicast_xmit_packets",
    ),
    (
        "clusterhealth_rdma_port_multicast_packets_received_total",
        "Multicast packets received (multicast_rcv_packets).",
        "multicast_rcv_packets",
    ),
    (
        "clusterhealth_rdma_port_multicast_packets_transmitted_total",
        "Multicast packets transmitted (multicast_xmit_packets).",
        "multicast_xmit_packets",
    ),
)

# The same for counters_ext/, which only kernels before 4.5 have (node_exporter's legacy_*).
LEGACY_TRAFFIC = (
    (
        "clusterhealth_rdma_port_legacy_data_received_bytes_total",
        "Octets received (counters_ext/port_rcv_data_64, kernels before 4.5).",
        "port_rcv_data_bytes",
    ),
    (
        "clusterhealth_rdma_port_legacy_data_transmitted_bytes_total",
        "Octets transmitted (counters_ext/port_xmit_data_64, kernels before 4.5).",
        "port_xmit_data_bytes",
    ),
    ("clusterhealth_rdma_port_legacy_packets_received_total", "port_rcv_packets_64", "port_rcv_packets"),
    ("clusterhealth_rdma_port_legacy_packets_transmitted_total", "port_xmit_packets_64", "port_xmit_packets"),
    (
        "clusterhealth_rdma_port_legacy_unicast_packets_received_total",
        "port_unicast_rcv_packets",
        "unicast_rcv_packets",
    ),
    (
        "clusterhealth_rdma_port_legacy_unicast_packets_transmitted_total",
        "port_unicast_xmit_packets",
        "unicast_xmit_packets",
    ),
    (
        "clusterhealth_rdma_port_legacy_multicast_packets_received_total",
        "port_multicast_rcv_packets",
        "multicast_rcv_packets",
    ),
    (
        "clusterhealth_rdma_port_legacy_multicast_packets_transmitted_total",
        "port_multicast_xmit_packets",
        "multicast_xmit_packets",
    ),
)

# (metric name, help, PciLink field)
PCIE_LINK = (
    (
        "clusterhealth_rdma_device_pcie_link_generation",
        "PCIe generation the HCA's link trained at.",
        "generation",
    ),
    (
        "clusterhealth_rdma_device_pcie_link_generation_max",
        "Highest PCIe generation of the HCA.",
        "generation_max",
    ),
    ("clusterhealth_rdma_device_pcie_link_width", "PCIe lanes the HCA's link trained at.", "width"),
    ("clusterhealth_rdma_device_pcie_link_width_max", "PCIe lanes the HCA supports.", "width_max"),
)


# Exposed names the collector reads or writes by name.
ERRORS = "clusterhealth_rdma_port_errors_total"
HW_EVENTS = "clusterhealth_rdma_port_hw_events_total"
SATURATED_COUNT = "clusterhealth_rdma_port_pma_saturated_counters"
SATURATED = "clusterhealth_rdma_port_pma_saturated"
# (exposed name, PortCounters or LegacyCounters field, the file it is read from) of the traffic
# counters.
_FILE_OF = {f.name: f.metadata["file"] for f in fields(PortCounters) if "file" in f.metadata}
_LEGACY_FILE_OF = {f.name: f.metadata["file"] for f in fields(LegacyCounters)}
PORT_TRAFFIC_FILES = tuple((name, field, _FILE_OF[field]) for name, _, field in PORT_TRAFFIC)
LEGACY_TRAFFIC_FILES = tuple((name, field, _LEGACY_FILE_OF[field]) for name, _, field in LEGACY_TRAFFIC)
FAMILY_NAMES = frozenset(
    {
        "clusterhealth_rdma_device_info",
        "clusterhealth_rdma_port_info",
        "clusterhealth_rdma_port_state_id",
        "clusterhealth_rdma_port_physical_state_id",
        "clusterhealth_rdma_port_rate_bytes_per_second",
        ERRORS,
        HW_EVENTS,
        SATURATED_COUNT,
        SATURATED,
        "clusterhealth_netdev_mtu_bytes",
        *(name for name, _, _ in PORT_TRAFFIC),
        *(name for name, _, _ in LEGACY_TRAFFIC),
        *(name for name, _, _ in PCIE_LINK),
    }
)


class RdmaCollector:
    """Every RDMA device under `<sysfs_root>/class/infiniband`, optionally filtered by name.

    `include_devices` and `exclude_devices` are shell-style patterns (`mlx5_*`); an empty include
    list takes every device, and exclusion wins over inclusion. `families` says which families
    are exported (the agent's per-family switch): the files only other families need are not read.
    """

    name = "rdma"
    # Off unless a config asks: the packet counts (the byte counts say the traffic), the
    # unicast/multicast split, each pinned counter's own flag (one count per port instead), and
    # the HCA's PCIe link figures (the audit's hca_pcie_link check judges them, and
    # RDMAPCIeLinkDegraded reads the check).
    opt_in = frozenset(
        {
            *(name for name, _, _ in PCIE_LINK),
            "clusterhealth_rdma_port_packets_received_total",
            "clusterhealth_rdma_port_packets_transmitted_total",
            "clusterhealth_rdma_port_unicast_packets_received_total",
            "clusterhealth_rdma_port_unicast_packets_transmitted_total",
            "clusterhealth_rdma_port_multicast_packets_received_total",
            "clusterhealth_rdma_port_multicast_packets_transmitted_total",
            "clusterhealth_rdma_port_pma_saturated",
        }
    )

    def __init__(
        self,
        sysfs_root: Path,
        include_devices: Sequence[str] = (),
        exclude_devices: Sequence[str] = (),
        *,
        error_counters: Sequence[str] = ("*",),
        hw_counters: Sequence[str] = ("*",),
        families: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.include_devices = tuple(include_devices)
        self.exclude_devices = tuple(exclude_devices)
        self.error_counters = _Names.matching(error_counters)
        self.hw_counters = _Names.matching(hw_counters)
        self.exported = frozenset(name for name in FAMILY_NAMES if families(name))
        self._counters = CounterSelection(
            _Names(self._counter_files_read()), self.hw_counters if HW_EVENTS in self.exported else _NONE
        )
        # Identity attributes are read once per registered device; the files read every time are
        # held open.
        self._cache = ReadCache()
        self._labels = _LabelSets()

    def _counter_files_read(self) -> Callable[[str], bool]:
        """Which files of counters/ and counters_ext/ the exported families need."""
        wanted = {
            file for name, _, file in (*PORT_TRAFFIC_FILES, *LEGACY_TRAFFIC_FILES) if name in self.exported
        }
        if self.exported & {SATURATED_COUNT, SATURATED}:
            # Every fixed-width error counter is watched for saturation, exported or not; the
            # 32-bit traffic counters of pre-4.5 kernels, when they are read.
            wanted.update(PMA_COUNTER_BITS)
        errors = ERRORS in self.exported
        error_counters = self.error_counters
        return lambda file: (
            file in wanted or (errors and file not in TRAFFIC_COUNTER_FILES and file in error_counters)
        )

    def selects(self, device: str) -> bool:
        if any(fnmatch.fnmatchcase(device, pattern) for pattern in self.exclude_devices):
            return False
        return not self.include_devices or any(
            fnmatch.fnmatchcase(device, pattern) for pattern in self.include_devices
        )

    def close(self) -> None:
        """Release the files held open between reads."""
        self._cache.close()

    def collect(self) -> list[Metric]:
        # Read eagerly (not a generator) so NoData is raised by the call itself.
        try:
            # Devices the patterns leave out are not read at all.
            devices = read_rdma_devices(
                self.sysfs_root, self._cache, counters=self._counters, selects=self.selects
            )
        except FileNotFoundError as absent:
            raise NoData(str(absent)) from None
        if not devices:
            class_dir = self.sysfs_root / "class" / "infiniband"
            names = os.listdir(class_dir)
            if names and not any(self.selects(name) for name in names):
                return []  # devices there, none selected
            raise NoData(f"no RDMA devices under {class_dir}")
        self._labels.turn()
        return _families(devices, self.error_counters, self.hw_counters, self.exported, self._labels)


class _Names:
    """A test of counter file names with each name's answer kept (a few dozen names, asked about
    on every port of every read)."""

    def __init__(self, test: Callable[[str], bool]) -> None:
        self._test = test
        self._known: dict[str, bool] = {}

    @classmethod
    def matching(cls, patterns: Sequence[str]) -> _Names:
        """The names that match one of the glob `patterns`."""
        patterns = tuple(patterns)
        return cls(lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns))

    def __contains__(self, name: str) -> bool:
        known = self._known.get(name)
        if known is None:
            known = self._known[name] = self._test(name)
        return known

    def __call__(self, name: str) -> bool:
        return name in self


_NONE = _Names(lambda name: False)


class _LabelSets:
    """The label dicts of the series, kept from one collection to the next: a sample's labels are
    read, never changed, so one dict serves every collection while its series lasts."""

    def __init__(self) -> None:
        self._previous: dict[tuple[str, ...], dict[str, str]] = {}
        self._current: dict[tuple[str, ...], dict[str, str]] = {}

    def turn(self) -> None:
        """A new collection: what the last one did not use goes."""
        self._previous, self._current = self._current, {}

    def port(self, device: str, port: str) -> dict[str, str]:
        return self._get((device, port), lambda: {"device": device, "port": port})

    def counter(self, device: str, port: str, counter: str) -> dict[str, str]:
        return self._get(
            (device, port, counter), lambda: {"device": device, "port": port, "counter": counter}
        )

    def _get(self, key: tuple[str, ...], make: Callable[[], dict[str, str]]) -> dict[str, str]:
        labels = self._current.get(key)
        if labels is None:
            labels = self._previous.get(key) or make()
            self._current[key] = labels
        return labels


def _families(
    devices: list[RdmaDevice],
    error_counters: _Names,
    hw_counters: _Names,
    exported: frozenset[str],
    labels: _LabelSets,
) -> list[Metric]:
    # Only the exported families are built (None: not exported).
    def gauge(name: str, help_: str, label_names: list[str]) -> GaugeMetricFamily | None:
        return GaugeMetricFamily(name, help_, labels=label_names) if name in exported else None

    def counter(name: str, help_: str, label_names: list[str]) -> CounterMetricFamily | None:
        return CounterMetricFamily(name, help_, labels=label_names) if name in exported else None

    device_info = gauge(
        "clusterhealth_rdma_device_info",
        "RDMA device identity; 1.",
        ["device", "board_id", "firmware_version", "hca_type", "node_guid"],
    )
    port_info = gauge(
        "clusterhealth_rdma_port_info",
        "RDMA port link layer and network interface; 1.",
        [*PORT, "link_layer", "netdev"],
    )
    state = gauge(
        "clusterhealth_rdma_port_state_id",
        "Logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).",
        PORT,
    )
    physical_state = gauge(
        "clusterhealth_rdma_port_physical_state_id",
        "Physical port state (2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery, ...).",
        PORT,
    )
    rate = gauge(
        "clusterhealth_rdma_port_rate_bytes_per_second",
        "Negotiated port rate (lanes times lane speed).",
        PORT,
    )
    traffic = _traffic_families(PORT_TRAFFIC, exported)
    legacy = _traffic_families(LEGACY_TRAFFIC, exported)
    errors = counter(
        "clusterhealth_rdma_port_errors_total",
        "Error and discard counters of counters/, by file name (saturating PMA counters).",
        [*PORT, "counter"],
    )
    saturated = gauge(
        SATURATED_COUNT,
        "Fixed-width PMA counters of the port that sit at their maximum and have stopped counting.",
        PORT,
    )
    pinned = gauge(
        SATURATED,
        "1 when a fixed-width PMA counter sits at its maximum and has stopped counting.",
        [*PORT, "counter"],
    )
    hw = counter(
        "clusterhealth_rdma_port_hw_events_total",
        "Driver counters of hw_counters/, by file name.",
        [*PORT, "counter"],
    )
    pcie = [
        (GaugeMetricFamily(name, help_, labels=["device"]), field)
        for name, help_, field in PCIE_LINK
        if name in exported
    ]
    mtu = gauge(
        "clusterhealth_netdev_mtu_bytes",
        "MTU of a network interface an RDMA device uses.",
        ["interface"],
    )

    mtu_seen: set[str] = set()
    for device in devices:
        name = device.name
        if device_info is not None:
            device_info.add_metric(
                [
                    name,
                    device.board_id or "",
                    device.firmware_version or "",
                    device.hca_type or "",
                    device.node_guid or "",
                ],
                1,
            )
        if device.pci is not None:
            for pcie_family, field in pcie:
                _add(pcie_family, [name], getattr(device.pci, field))
        if mtu is not None:
            for netdev in device.netdevs:
                if netdev.mtu_bytes is not None and netdev.name not in mtu_seen:
                    mtu_seen.add(netdev.name)
                    mtu.add_metric([netdev.name], netdev.mtu_bytes)

        for port in device.ports:
            number = str(port.number)
            # The per-port and per-file series are most of the samples: their labels are kept from
            # one collection to the next (`labels`) rather than zipped from lists by add_metric.
            port_labels = labels.port(name, number)
            if port_info is not None:
                port_info.add_metric([name, number, port.link_layer or "", port.netdev or ""], 1)
            for port_gauge, value in (
                (state, port.state_id),
                (physical_state, port.physical_state_id),
                (rate, port.rate_bytes_per_second),
            ):
                if port_gauge is not None and value is not None:
                    port_gauge.add_sample(port_gauge.name, port_labels, value)
            counters = port.counters
            if counters is not None:
                _add_traffic(traffic, port_labels, counters)
                if errors is not None:
                    for file, value in sorted(counters.by_file().items()):
                        if file not in TRAFFIC_COUNTER_FILES and file in error_counters:
                            errors.add_sample(ERRORS, labels.counter(name, number, file), value)
            if port.legacy_counters is not None:
                _add_traffic(legacy, port_labels, port.legacy_counters)
            if saturated is not None and port.pinned_at_max:
                saturated.add_sample(SATURATED_COUNT, port_labels, sum(port.pinned_at_max.values()))
            if pinned is not None:
                for file, is_pinned in sorted(port.pinned_at_max.items()):
                    pinned.add_sample(SATURATED, labels.counter(name, number, file), 1 if is_pinned else 0)
            if hw is not None:
                for file, value in sorted(port.hw_counters.items()):
                    if file in hw_counters:
                        hw.add_sample(HW_EVENTS, labels.counter(name, number, file), value)

    families = [
        device_info,
        port_info,
        state,
        physical_state,
        rate,
        *(f for f, _ in traffic),
        errors,
        saturated,
        pinned,
        *(f for f, _ in legacy),
        hw,
        *(f for f, _ in pcie),
        mtu,
    ]
    # A family without samples would still print HELP and TYPE lines; leave it out instead.
    return [family for family in families if family is not None and family.samples]


def _traffic_families(
    table: tuple[tuple[str, str, str], ...], exported: frozenset[str]
) -> list[tuple[CounterMetricFamily, str]]:
    return [
        (CounterMetricFamily(name, help_, labels=PORT), field)
        for name, help_, field in table
        if name in exported
    ]


def _add(family: GaugeMetricFamily, labels: list[str], value: int | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


def _add_traffic(
    families: list[tuple[CounterMetricFamily, str]],
    labels: dict[str, str],
    counters: PortCounters | LegacyCounters,
) -> None:
    for family, field in families:
        value = getattr(counters, field)
        if value is not None:
            family.add_sample(family.name + "_total", labels, value)
