"""The kernel-log watcher: reads /dev/kmsg each cycle and turns hardware lines into counters.

Xid lines go to the shared `XidLedger`, so an Xid that NVML also delivered counts once; the bus id
printed by the driver is mapped to the GPU's NVML index. Every other event (NVSwitch SXid, PCIe AER,
mlx5, machine checks, thermal) counts in `clusterhealth_kernel_events_total{event}`.

Memory stays bounded whatever the kernel prints: a cycle reads at most `max_records_per_cycle`
records (the rest waits for the next cycle; the kernel's ring buffer is the queue, and an overrun
is counted as lost records), the counters are per event kind, and only the last `keep_recent`
events are kept for `clusterhealth check`.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, Metric

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
from clusterhealth.checks.kmsg import KmsgReader, KmsgRecord
from clusterhealth.exporters.xid import UNKNOWN_GPU, XidLedger

log = logging.getLogger("clusterhealth.kernel_log")

XID_FELL_OFF_THE_BUS = 79
# Every kind is exported from the start at 0, so that increase() sees the first event.
# A one-shot `check` or `scrape` reads at most this many cycles' worth of records.
CATCH_UP_CYCLES = 100
EVENT_KINDS = (
    "sxid",
    "pcie_aer_corrected",
    "pcie_aer_uncorrected",
    "mlx5",
    "mlx5_link_down",
    "mce",
    "thermal",
)
# GPUs whose last fall off the bus is remembered, to pair the driver's notices with its Xid 79 line.
_MAX_FALLS = 64
# A RoCE port prints its netdev's "Link down" and its InfiniBand port's "Port: 1 Link DOWN" a few
# milliseconds apart for one loss of link; lines of the two forms this close are one event.
LINK_DOWN_PAIRING_SECONDS = 5.0
# Ports whose last unpaired link-down line is remembered.
_MAX_LINK_DOWNS = 256
# print_health_info prints a health-buffer dump's lines within microseconds; a syndrome line this
# soon after a header of the same function belongs to that header's dump.
HEALTH_DUMP_SECONDS = 5.0


@dataclass(frozen=True)
class SeenEvent:
    """One hardware event from the kernel log, for `check` and its reasons."""

    kind: str
    code: int | None
    pci: str | None
    gpu: int | None
    boot_seconds: float  # the record's time since boot
    message: str


class KernelLogCollector:
    """The `kernel_log` collector."""

    name = "kernel_log"
    # How many records were read says the reader is moving, which the collector's success already
    # says; kept for a site that wants the throughput (collectors.kernel_log.include_metrics).
    opt_in = frozenset({"clusterhealth_kernel_log_records_total"})

    def __init__(
        self,
        path: str,
        ledger: XidLedger,
        gpu_index_of_bus: Callable[[], Mapping[str, int]],
        *,
        start: Literal["boot", "now"] = "boot",
        max_records_per_cycle: int = 20_000,
        keep_recent: int = 200,
        catch_up: bool = False,
        publish: Callable[[Sequence[SeenEvent] | None, str | None], None] = lambda events, why: None,
    ):
        self.path, self.ledger, self.read_from = path, ledger, start
        # After each cycle, the events kept for the checks, or None and why the log is unreadable.
        self._publish = publish
        self._gpu_index_of_bus = gpu_index_of_bus
        self.max_records_per_cycle = max_records_per_cycle
        self._reader: KmsgReader | None = None
        self.events: Counter[str] = Counter(dict.fromkeys(EVENT_KINDS, 0))
        self.records_read = 0
        self.recent: deque[SeenEvent] = deque(maxlen=keep_recent)
        # None until the first attempt to read the log; False while it cannot be opened or read.
        self.readable: bool | None = None
        self.problem: str | None = None  # why it cannot be read
        # One-shot commands read everything waiting, in bounded cycles, instead of one cycle's worth.
        self.cycles_per_collect = CATCH_UP_CYCLES if catch_up else 1
        # Bus id -> (printk seconds, True if a notice without a number was counted last).
        self._falls: dict[str, tuple[float, bool]] = {}
        # Bus id -> (printk seconds, True if the IB port's line) of a link-down line not paired yet.
        self._link_downs: dict[str, tuple[float, bool]] = {}
        # Bus id -> printk seconds of a health-dump header whose syndrome line has not come yet.
        self._health_headers: dict[str, float] = {}
        self._cycle_mce = [0, 0]  # machine-check records, notices read this cycle
        self._cycle_buses: dict[str, int] | None = None  # bus id -> GPU index, for this cycle

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def collect(self) -> list[Metric]:
        # An unreadable log raises: the collector reports failure, the checks that need the log
        # say UNKNOWN (`readable`), and the agent goes on.
        try:
            for _ in range(self.cycles_per_collect):
                if not self._read_cycle():
                    break
        except OSError as err:
            # The reader, if open, keeps its position: reopening from boot would count events twice.
            self.readable, self.problem = False, f"the kernel log {self.path} could not be read ({err})"
            self._publish(None, self.problem)
            raise
        self.readable, self.problem = True, None
        self._publish(tuple(self.recent), None)
        return self._families()

    def _read_cycle(self) -> bool:
        """Read up to max_records_per_cycle records; False once nothing more is waiting."""
        if self._reader is None:
            self._reader = KmsgReader(self.path, self.read_from)
        self._cycle_buses = None
        budget = self.max_records_per_cycle
        try:
            while budget > 0:
                records = self._reader.read_available(min(budget, 1000))
                if not records:
                    return False
                budget -= len(records)
                self.records_read += len(records)
                for record in records:
                    self._handle(record)
            return True
        finally:
            # A machine check printed in full comes with the kernel's notice: count its records, and
            # the notices only when the records went elsewhere (mcelog, rasdaemon).
            records_seen, notices = self._cycle_mce
            self.events["mce"] += records_seen or notices
            self._cycle_mce = [0, 0]

    def _handle(self, record: KmsgRecord) -> None:
        event = parse_line(record.message)
        if event is None:
            return
        seconds = record.timestamp_us / 1e6
        if event.kind == "xid":
            code = event.code if event.code is not None else XID_FELL_OFF_THE_BUS
            if code == XID_FELL_OFF_THE_BUS and self._fall_counted_already(event, seconds):
                return
            gpu = self._gpu_index(event.pci)
            # The kernel's printk clock counts from boot like CLOCK_MONOTONIC, the NVML side's clock.
            self.ledger.record("kmsg", gpu, code, when=seconds, detail=event.message, pci=event.pci)
            return
        kind = _counted_kind(event)
        if kind is None:
            return
        if kind == "mce":
            self._cycle_mce[is_machine_check_notice(event)] += 1
        elif self._counted_already(kind, event, seconds):
            return
        else:
            self.events[kind] += 1
        self.recent.append(SeenEvent(kind, event.code, event.pci, None, seconds, event.message))

    def _counted_already(self, kind: str, event: KernelEvent, seconds: float) -> bool:
        """Whether this line reports, in another form, an event just counted."""
        if kind == "mlx5_link_down":
            return self._link_down_counted_already(event, seconds)
        if kind == "mlx5":
            return self._health_dump_counted_already(event, seconds)
        return False

    def _fall_counted_already(self, event: KernelEvent, seconds: float) -> bool:
        """Whether this line reports a fall off the bus already counted.

        Drivers print an Xid 79 line and a notice without a number ("NVRM: GPU 0000:91:00.0: GPU has
        fallen off the bus.") for the same fall, in either order, and may repeat the notice: within
        the ledger's window, a notice after any report of the GPU's fall is the same fall, and so is
        an Xid 79 line after a notice; two Xid 79 lines stay two events, as repeats do.
        """
        try:
            bus = normalize_pci_bus_id(event.pci or "")
        except ValueError:
            bus = event.pci or ""
        notice = event.code is None
        last = self._falls.get(bus)
        recent = last is not None and abs(seconds - last[0]) <= self.ledger.window_seconds
        if recent and last is not None and (notice or last[1]):
            self._falls[bus] = (seconds, False)  # paired: a later notice or line is a new report
            return True
        if len(self._falls) >= _MAX_FALLS and bus not in self._falls:
            del self._falls[min(self._falls, key=lambda b: self._falls[b][0])]
        self._falls[bus] = (seconds, notice)
        return False

    def _link_down_counted_already(self, event: KernelEvent, seconds: float) -> bool:
        """Whether this line is the other form of a link-down line of the same port just counted:
        the netdev's "Link down" and the InfiniBand port's "Port: N Link DOWN" pair up, once."""
        port = event.pci or ""
        ib_port = is_ib_port_line(event)
        last = self._link_downs.pop(port, None)
        if last is not None and last[1] != ib_port and abs(seconds - last[0]) <= LINK_DOWN_PAIRING_SECONDS:
            return True
        if len(self._link_downs) >= _MAX_LINK_DOWNS:
            del self._link_downs[min(self._link_downs, key=lambda p: self._link_downs[p][0])]
        self._link_downs[port] = (seconds, ib_port)
        return False

    def _health_dump_counted_already(self, event: KernelEvent, seconds: float) -> bool:
        """Whether this line is the syndrome of a health-buffer dump whose header was counted: a
        dump is one fault, told by its header on newer kernels and by its syndrome on older ones."""
        port = event.pci or ""
        if is_health_header(event):
            if len(self._health_headers) >= _MAX_LINK_DOWNS and port not in self._health_headers:
                del self._health_headers[min(self._health_headers, key=self._health_headers.__getitem__)]
            self._health_headers[port] = seconds
            return False
        if not is_health_syndrome(event):
            return False
        header = self._health_headers.pop(port, None)
        return header is not None and 0 <= seconds - header <= HEALTH_DUMP_SECONDS

    def _gpu_index(self, pci: str | None) -> int:
        if pci is None:
            return UNKNOWN_GPU
        try:
            bus = normalize_pci_bus_id(pci)
        except ValueError:
            return UNKNOWN_GPU
        if self._cycle_buses is None:
            # Asked once per cycle, not per line: placing a GPU lost before it answered NVML walks
            # the PCI bus in sysfs, and an Xid flood can bring thousands of lines a cycle.
            self._cycle_buses = {}
            for nvml_bus, index in self._gpu_index_of_bus().items():
                try:
                    self._cycle_buses[normalize_pci_bus_id(nvml_bus)] = index
                except ValueError:
                    continue
        return self._cycle_buses.get(bus, UNKNOWN_GPU)

    def _families(self) -> list[Metric]:
        events = CounterMetricFamily(
            "clusterhealth_kernel_events_total",
            "Hardware events in the kernel log; Xid errors count in clusterhealth_gpu_xid_errors_total.",
            labels=["event"],
        )
        for kind, count in sorted(self.events.items()):
            events.add_metric([kind], float(count))
        families: list[Metric] = [events]
        reader = self._reader
        if reader is not None:
            lost = CounterMetricFamily(
                "clusterhealth_kernel_log_lost_records_total",
                "Kernel-log records overwritten before the agent read them (ring buffer overrun).",
            )
            lost.add_metric([], float(reader.lost_records))
            read = CounterMetricFamily("clusterhealth_kernel_log_records_total", "Kernel-log records read.")
            read.add_metric([], float(self.records_read))
            malformed = CounterMetricFamily(
                "clusterhealth_kernel_log_malformed_records_total",
                "Kernel-log records skipped because they could not be parsed (absurd fields, overlong).",
            )
            malformed.add_metric([], float(reader.malformed_records))
            families += [lost, read, malformed]
        return families

    def recent_events(self) -> list[SeenEvent]:
        """The hardware events seen other than Xid (those are in the ledger), newest last."""
        return list(self.recent)


def recent_xid_events(ledger: XidLedger) -> list[SeenEvent]:
    """The ledger's counted Xids, from NVML or the kernel log, in the shape the audits read."""
    return [
        SeenEvent(
            "xid",
            e.xid,
            e.pci,
            e.gpu if e.gpu >= 0 else None,
            e.when,
            e.detail or f"Xid {e.xid} (NVML event)",
        )
        for e in ledger.recent()
    ]


def _counted_kind(event: KernelEvent) -> str | None:
    # The kernel reports one AER error twice: "AER: ... error received" from the root port, then
    # "PCIe Bus Error: severity=..." from the device. Count the device's line, once per error.
    if event.kind.startswith("pcie_aer_") and not is_aer_device_report(event):
        return None
    if is_informational(event):
        return None
    # A link coming up is the end of the flap that its link-down line already counted.
    if event.kind == "mlx5_link_up":
        return None
    return event.kind
