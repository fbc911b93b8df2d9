"""RDMA ports, counters, PCIe links and netdev MTUs from sysfs, as metric families.

Reading and its quirks live in exporters/infiniband.py; this module only maps its records to the
SPEC's "RDMA and network" metrics (labels `device` and `port` as node_exporter names them) plus
a few of this project's own: the PMA counters pinned at their width, the HCA's PCIe link, and
the counters node_exporter also exports (unicast/multicast, pre-4.5 `counters_ext/`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clusterhealth.exporters.base import NoData
from clusterhealth.exporters.infiniband import (
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


class RdmaCollector:
    """Every RDMA device under `<sysfs_root>/class/infiniband`, optionally filtered by name.

    `include_devices` and `exclude_devices` are shell-style patterns (`mlx5_*`); an empty include
    list takes every device, and exclusion wins over inclusion.
    """

    name = "rdma"
    # Off unless a config asks: the packet counts (the byte counts say the traffic), the
    # unicast/multicast split, and each pinned counter's own flag (one count per port instead).
    opt_in = frozenset(
        {
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
    ) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.include_devices = tuple(include_devices)
        self.exclude_devices = tuple(exclude_devices)
        self.error_counters = _Names(error_counters)
        self.hw_counters = _Names(hw_counters)
        # Identity attributes and directory listings are read once per registered device.
        self._cache = ReadCache()

    def selects(self, device: str) -> bool:
        if any(fnmatch.fnmatchcase(device, pattern) for pattern in self.exclude_devices):
            return False
        return not self.include_devices or any(
            fnmatch.fnmatchcase(device, pattern) for pattern in self.include_devices
        )

    def close(self) -> None:
        """Release the counter files held open between reads."""
        self._cache.close()

    def collect(self) -> list[Metric]:
        # Read eagerly (not a generator) so NoData is raised by the call itself.
        try:
            devices = read_rdma_devices(self.sysfs_root, self._cache)
        except FileNotFoundError as absent:
            raise NoData(str(absent)) from None
        if not devices:
            raise NoData(f"no RDMA devices under {self.sysfs_root / 'class' / 'infiniband'}")
        return _families(
            [device for device in devices if self.selects(device.name)], self.error_counters, self.hw_counters
        )


class _Names:
    """Counter file names matched against glob patterns, each name's answer kept (a few dozen
    names, asked about on every port of every read)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._known: dict[str, bool] = {}

    def __contains__(self, name: str) -> bool:
        known = self._known.get(name)
        if known is None:
            known = self._known[name] = any(fnmatch.fnmatchcase(name, p) for p in self.patterns)
        return known


def _families(devices: list[RdmaDevice], error_counters: _Names, hw_counters: _Names) -> list[Metric]:
    device_info = GaugeMetricFamily(
        "clusterhealth_rdma_device_info",
        "RDMA device identity; 1.",
        labels=["device", "board_id", "firmware_version", "hca_type", "node_guid"],
    )
    port_info = GaugeMetricFamily(
        "clusterhealth_rdma_port_info",
        "RDMA port link layer and network interface; 1.",
        labels=[*PORT, "link_layer", "netdev"],
    )
    state = GaugeMetricFamily(
        "clusterhealth_rdma_port_state_id",
        "Logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).",
        labels=PORT,
    )
    physical_state = GaugeMetricFamily(
        "clusterhealth_rdma_port_physical_state_id",
        "Physical port state (2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery, ...).",
        labels=PORT,
    )
    rate = GaugeMetricFamily(
        "clusterhealth_rdma_port_rate_bytes_per_second",
        "Negotiated port rate (lanes times lane speed).",
        labels=PORT,
    )
    traffic = {field: CounterMetricFamily(name, help_, labels=PORT) for name, help_, field in PORT_TRAFFIC}
    legacy = {field: CounterMetricFamily(name, help_, labels=PORT) for name, help_, field in LEGACY_TRAFFIC}
    errors = CounterMetricFamily(
        "clusterhealth_rdma_port_errors_total",
        "Error and discard counters of counters/, by file name (saturating PMA counters).",
        labels=[*PORT, "counter"],
    )
    saturated = GaugeMetricFamily(
        "clusterhealth_rdma_port_pma_saturated_counters",
        "Fixed-width PMA counters of the port that sit at their maximum and have stopped counting.",
        labels=PORT,
    )
    pinned = GaugeMetricFamily(
        "clusterhealth_rdma_port_pma_saturated",
        "1 when a fixed-width PMA counter sits at its maximum and has stopped counting.",
        labels=[*PORT, "counter"],
    )
    hw = CounterMetricFamily(
        "clusterhealth_rdma_port_hw_events_total",
        "Driver counters of hw_counters/, by file name.",
        labels=[*PORT, "counter"],
    )
    pcie = {field: GaugeMetricFamily(name, help_, labels=["device"]) for name, help_, field in PCIE_LINK}
    mtu = GaugeMetricFamily(
        "clusterhealth_netdev_mtu_bytes",
        "MTU of a network interface an RDMA device uses.",
        labels=["interface"],
    )

    errors_total, hw_total = errors.name + "_total", hw.name + "_total"
    mtu_seen: set[str] = set()
    for device in devices:
        device_info.add_metric(
            [
                device.name,
                device.board_id or "",
                device.firmware_version or "",
                device.hca_type or "",
                device.node_guid or "",
            ],
            1,
        )
        if device.pci is not None:
            for field, family in pcie.items():
                _add(family, [device.name], getattr(device.pci, field))
        for netdev in device.netdevs:
            if netdev.mtu_bytes is not None and netdev.name not in mtu_seen:
                mtu_seen.add(netdev.name)
                mtu.add_metric([netdev.name], netdev.mtu_bytes)

        for port in device.ports:
            labels = [device.name, str(port.number)]
            port_info.add_metric([*labels, port.link_layer or "", port.netdev or ""], 1)
            _add(state, labels, port.state_id)
            _add(physical_state, labels, port.physical_state_id)
            _add(rate, labels, port.rate_bytes_per_second)
            # The per-file series are most of the samples (~700 on a 10-HCA node): their labels
            # are built as dicts directly rather than zipped from lists by add_metric.
            port_labels = {"device": device.name, "port": labels[1]}
            if port.counters is not None:
                _add_traffic(traffic, labels, port.counters)
                for file, value in sorted(port.counters.by_file().items()):
                    if file not in TRAFFIC_COUNTER_FILES and file in error_counters:
                        errors.add_sample(errors_total, {**port_labels, "counter": file}, value)
            if port.legacy_counters is not None:
                _add_traffic(legacy, labels, port.legacy_counters)
            if port.pinned_at_max:
                saturated.add_sample(saturated.name, port_labels, sum(port.pinned_at_max.values()))
            for file, is_pinned in sorted(port.pinned_at_max.items()):
                pinned.add_sample(pinned.name, {**port_labels, "counter": file}, 1 if is_pinned else 0)
            for file, value in sorted(port.hw_counters.items()):
                if file in hw_counters:
                    hw.add_sample(hw_total, {**port_labels, "counter": file}, value)

    families: list[Metric] = [
        device_info,
        port_info,
        state,
        physical_state,
        rate,
        *traffic.values(),
        errors,
        saturated,
        pinned,
        *legacy.values(),
        hw,
        *pcie.values(),
        mtu,
    ]
    # A family without samples would still print HELP and TYPE lines; leave it out instead.
    return [family for family in families if family.samples]


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: int | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


def _add_traffic(
    families: dict[str, CounterMetricFamily], labels: list[str], counters: PortCounters | LegacyCounters
) -> None:
    for field, family in families.items():
        _add(family, labels, getattr(counters, field))
