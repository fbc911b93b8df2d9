"""Background sampling: each collector runs on its own thread and leaves a snapshot behind.

A scrape never calls a collector. It serializes the latest snapshot, so a slow or hung NVML call
delays only the next snapshot, never `/metrics`. A run that has lasted longer than the
collector's timeout is reported as hung: its success drops to 0 and its stale series are withheld
until it returns, so nobody reads a dead GPU's last temperature as current.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from clusterhealth.exporters.base import Collector, NoData

log = logging.getLogger("clusterhealth.sampler")


@dataclass(frozen=True)
class Snapshot:
    families: Sequence[Metric]
    success: bool
    duration_seconds: float
    finished_at: float  # wall clock, for /healthz
    finished_monotonic: float
    error: str | None
    generation: int


@dataclass(frozen=True)
class Status:
    """What a scrape and /healthz report about one collector right now."""

    name: str
    success: bool
    reason: str | None
    snapshot: Snapshot | None
    families: Sequence[Metric]

    @property
    def pending(self) -> bool:
        """No run has finished yet (the agent just started): neither success nor failure."""
        return self.snapshot is None and self.success is False and self.reason == PENDING


PENDING = "no collection has finished yet"


class Sampler:
    """Runs one collector every `interval` seconds on a daemon thread."""

    def __init__(
        self,
        collector: Collector,
        interval: float,
        timeout: float,
        on_snapshot: Callable[[], None] = lambda: None,
        start_delay: float = 0.0,
    ):
        self.collector = collector
        self.name = collector.name
        self.interval, self.timeout = interval, timeout
        self._on_snapshot = on_snapshot
        self.start_delay = start_delay
        self._snapshot: Snapshot | None = None
        self._running_since: float | None = None
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self.last_success_at: float | None = None  # wall clock
        self.last_success_monotonic: float | None = None

    # -- running -----------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"sampler-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, wait: float = 2.0) -> None:
        """Ask the loop to end; a hung collector cannot be interrupted, so do not wait forever."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)

    def _loop(self) -> None:
        if self._stop.wait(self.start_delay):
            return
        next_run = time.monotonic()
        while not self._stop.is_set():
            self.run_once()
            next_run += self.interval
            now = time.monotonic()
            if next_run < now:  # a run overran: skip the missed cycles instead of bunching them up
                next_run = now + self.interval
            self._stop.wait(next_run - now)

    def run_once(self) -> Snapshot:
        start_wall, start = time.time(), time.monotonic()
        self._running_since = start
        error: str | None = None
        families: Sequence[Metric] = ()
        try:
            families = list(self.collector.collect())
        except NoData as err:
            if self._last_error != f"nodata:{err}":
                log.debug("collector %s found nothing to read: %s", self.name, err)
            self._last_error = f"nodata:{err}"
        except Exception as err:  # a collector's failure must never stop the agent
            error = f"{type(err).__name__}: {err}" if not str(err) else str(err)
            if error != self._last_error:
                log.error("collector %s failed: %s", self.name, error)
            self._last_error = error
        else:
            if self._last_error is not None and not self._last_error.startswith("nodata:"):
                log.info("collector %s recovered", self.name)
            self._last_error = None
        end = time.monotonic()
        previous = self._snapshot
        unchanged = (
            previous is not None
            and error is None
            and previous.success
            and list(previous.families) == list(families)
        )
        if unchanged and previous is not None:
            # Nothing to export has changed: the snapshot keeps its generation, so its rendered
            # series are reused and a fast collector with quiet hardware costs no re-rendering.
            families = previous.families
        else:
            self._generation += 1
        snapshot = Snapshot(
            families=families,
            success=error is None,
            duration_seconds=end - start,
            finished_at=start_wall + (end - start),
            finished_monotonic=end,
            error=error,
            generation=self._generation,
        )
        self._snapshot = snapshot
        if snapshot.success:
            self.last_success_at, self.last_success_monotonic = snapshot.finished_at, end
        self._running_since = None
        self._on_snapshot()
        return snapshot

    # -- reporting ---------------------------------------------------------------------------

    def status(self, now: float | None = None) -> Status:
        now = time.monotonic() if now is None else now
        snapshot, running_since = self._snapshot, self._running_since
        if running_since is not None and now - running_since > self.timeout:
            return Status(
                self.name,
                False,
                f"collection has been running for {now - running_since:.0f}s (timeout {self.timeout:g}s);"
                " its series are withheld until it returns",
                snapshot,
                (),
            )
        if snapshot is None:
            return Status(self.name, False, PENDING, None, ())
        if not snapshot.success:
            return Status(self.name, False, snapshot.error, snapshot, snapshot.families)
        return Status(self.name, True, None, snapshot, snapshot.families)
