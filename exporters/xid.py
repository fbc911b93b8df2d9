"""Xid errors: one ledger fed by NVML events and by the kernel log, counting each event once.

The same Xid usually reaches the agent twice: NVML delivers it as an `nvmlEventTypeXidCriticalError`
event and the driver prints an `NVRM: Xid (PCI:...): 79, ...` line to the kernel log. The ledger
counts an event from one source and swallows the matching event from the other source (same GPU,
same code, within `window_seconds`). Repeats from one source are real repeats and all count.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import pynvml
from prometheus_client.core import CounterMetricFamily, Metric

from clusterhealth.exporters.gpu import GpuDirectory
from clusterhealth.exporters.nvml import GpuGone, NvmlSession, NvmlUnavailable

log = logging.getLogger("clusterhealth.xid")

UNKNOWN_GPU = -1


@dataclass(frozen=True)
class XidEvent:
    """One counted Xid: which source saw it first, on which GPU, when (CLOCK_MONOTONIC seconds)."""

    source: str
    gpu: int
    xid: int
    when: float
    detail: str = ""  # the kernel's line, when the kernel log was first
    pci: str | None = None  # the bus id the kernel printed


@dataclass
class _Unmatched:
    source: str
    gpu: int
    xid: int
    when: float


class XidLedger:
    """Counts Xid events per (GPU index, code), deduplicated across sources."""

    def __init__(self, window_seconds: float = 30.0, max_unmatched: int = 4096, keep_recent: int = 512):
        self.window_seconds = window_seconds
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int]] = Counter()
        # The counted events, newest last, for "a critical Xid in the last hour" checks. Xids only,
        # so a flood of other kernel messages cannot push them out.
        self._recent: deque[XidEvent] = deque(maxlen=keep_recent)
        # Events not yet seen by the other source; bounded so a flood cannot grow memory.
        self._unmatched: deque[_Unmatched] = deque(maxlen=max_unmatched)

    def record(
        self,
        source: str,
        gpu: int,
        xid: int,
        when: float | None = None,
        detail: str = "",
        pci: str | None = None,
    ) -> bool:
        """Record one event; True when it counted, False when it was the other source's twin.

        `when` is a CLOCK_MONOTONIC time in seconds (the kernel log's timestamps are on that clock).
        """
        when = time.monotonic() if when is None else when
        with self._lock:
            # Twice the window: the two sources may deliver one event a little out of order.
            cutoff = when - 2 * self.window_seconds
            while self._unmatched and self._unmatched[0].when < cutoff:
                self._unmatched.popleft()
            for i, seen in enumerate(self._unmatched):
                if (
                    seen.source != source
                    and seen.gpu == gpu
                    and seen.xid == xid
                    and abs(seen.when - when) <= self.window_seconds
                ):
                    del self._unmatched[i]
                    return False
            self._unmatched.append(_Unmatched(source, gpu, xid, when))
            self._counts[(gpu, xid)] += 1
            self._recent.append(XidEvent(source, gpu, xid, when, detail, pci))
            return True

    def counts(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._counts)

    def recent(self) -> list[XidEvent]:
        with self._lock:
            return list(self._recent)


class XidCollector:
    """The `xid` collector: the ledger's counts, whichever source fed them.

    Apart from the gpu collector so that Xid lines from the kernel log still export when NVML is
    unusable, which is when they matter most (the driver is wedged, a GPU fell off the bus).
    """

    name = "xid"

    def __init__(self, ledger: XidLedger, directory: GpuDirectory):
        self.ledger, self.directory = ledger, directory

    def collect(self) -> list[Metric]:
        xid = CounterMetricFamily(
            "clusterhealth_gpu_xid_errors_total",
            "Xid errors, from NVML events and the kernel log, each counted once.",
            labels=["gpu", "uuid", "xid"],
        )
        for (gpu, code), count in sorted(self.ledger.counts().items()):
            if gpu == UNKNOWN_GPU:
                xid.add_metric(["", "", str(code)], float(count))
            else:
                xid.add_metric([str(gpu), self.directory.uuid(gpu), str(code)], float(count))
        return [xid] if xid.samples else []


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class NvmlXidWatcher:
    """A background thread waiting on NVML's Xid events and feeding them to the ledger."""

    WAIT_MS = 500

    def __init__(self, session: NvmlSession, ledger: XidLedger, retry_seconds: float = 30.0):
        self.session, self.ledger = session, ledger
        self.retry_seconds = retry_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: object | None = None
        # Handle address -> GPU index, from registration: asking NVML for the index of a GPU that
        # just fell off the bus fails, and Xid 79 is exactly that event.
        self._indices: dict[int, int] = {}
        self.last_error: str | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._free()

    def drain(self) -> int:
        """Deliver the events already waiting, without blocking (for one-shot `scrape`)."""
        delivered = 0
        try:
            self._ensure_registered()
            while self._wait_one(0):
                delivered += 1
        except (NvmlUnavailable, GpuGone, pynvml.NVMLError) as err:
            self._note_error(err)
        finally:
            self._free()
        return delivered

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._ensure_registered()
                self._wait_one(self.WAIT_MS)
                if self.last_error is not None:
                    log.info("receiving NVML Xid events again")
                    self.last_error = None
            except (NvmlUnavailable, GpuGone, pynvml.NVMLError) as err:
                self._note_error(err)
                self._free()
                self._stop.wait(self.retry_seconds)

    def _note_error(self, err: Exception) -> None:
        text = str(err)
        if text != self.last_error:
            # An unusable library is already reported (once) by the gpu collector.
            level = logging.DEBUG if isinstance(err, NvmlUnavailable) else logging.WARNING
            log.log(level, "NVML Xid events unavailable: %s; retrying every %gs", text, self.retry_seconds)
        self.last_error = text

    def _ensure_registered(self) -> None:
        if self._event_set is not None:
            return
        devices = self.session.devices()
        event_set = pynvml.nvmlEventSetCreate()
        indices = {}
        for device in devices:
            # A lost GPU or one without event support: its Xids still arrive via the kernel log.
            if device.gone is not None:
                log.debug("GPU %d: no Xid events: %s", device.index, device.gone)
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    device.handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except pynvml.NVMLError as err:
                log.debug("GPU %d: no Xid events: %s", device.index, err)
                continue
            indices[_address(device.handle)] = device.index
        self._event_set, self._indices = event_set, indices

    def _wait_one(self, timeout_ms: int) -> bool:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return False
        if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            gpu = self._indices.get(_address(data.device), UNKNOWN_GPU)
            self.ledger.record("nvml", gpu, int(data.eventData))
        return True

    def _free(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):  # the library may already be gone
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
