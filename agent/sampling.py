"""Background sampling: each collector runs on its own thread and leaves a snapshot behind.

A scrape never calls a collector. It serializes the latest snapshot, so a slow or hung NVML call
delays only the next snapshot, never `/metrics`. A run that has lasted longer than the
collector's timeout is reported as hung: its success drops to 0 and its stale series are withheld
until it returns, so nobody reads a dead GPU's last temperature as current.

A sampler lives as long as the agent, one per collector name: a reload hands it a new collector or
new settings, which it takes up between runs. So a run hung in a driver call keeps the one thread
it already holds, however many times the agent reloads, and /healthz keeps counting its age.

A collector may wait for others (`after`): its first run starts once each of them has finished
one (or hung past its timeout), because it reads what they publish. That order is stated, not left
to start delays or list order.

After its first run, a collector runs at a fixed phase of its interval on the monotonic clock
(`next_run`), each collector at its own: the default intervals are whole seconds that divide one
another (2, 5, 10, 15, 30, 60 s), so collectors started together would otherwise all run at the
same instants every 30 s, share the interpreter for as long, and hold up scrapes together.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from clusterhealth.exporters.base import Collector, CollectorFailed, FamilySelection, NoData, exposed_name

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
# A collector without opt-in families, switched by no config: everything it yields is exported.
EVERY_FAMILY = FamilySelection()


def next_run(started: float, interval: float, phase: float) -> float:
    """When the run after one that started at `started` starts: the first moment `phase` seconds
    past a multiple of `interval` (monotonic clock) and at least half an interval after `started`.
    Once on its phase, a collector runs every `interval` seconds."""
    earliest = started + interval / 2
    return phase + math.ceil((earliest - phase) / interval) * interval


class Sampler:
    """Runs one collector every `interval` seconds, at `phase` seconds past a multiple of it, on a
    daemon thread."""

    def __init__(
        self,
        collector: Collector,
        interval: float,
        timeout: float,
        on_snapshot: Callable[[], None] = lambda: None,
        after: Sequence[Sampler] = (),
        select: Callable[[str], bool] = EVERY_FAMILY,
        phase: float = 0.0,
    ):
        self.collector = collector
        self.phase = phase
        # Which of the collector's families are exported (the per-family switch).
        self.select = select
        self.name = collector.name
        self.interval, self.timeout = interval, timeout
        self.after = tuple(after)
        self._on_snapshot = on_snapshot
        self._snapshot: Snapshot | None = None
        self._running_since: float | None = None
        self._snapshots = 0  # runs finished
        self._generation = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._settled = threading.Event()  # a first run finished (or the sampler was stopped)
        self._thread: threading.Thread | None = None
        self._last_error: str | None = None
        self._retired: list[Collector] = []  # replaced collectors, closed between runs
        self._collector_started = False
        self._collector_closed = False
        self._abandoned = False  # a one-shot run given up at its timeout
        self._lock = threading.Lock()
        self.last_success_at: float | None = None  # wall clock
        self.last_success_monotonic: float | None = None

    # -- running -----------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the loop, or resume it after `stop`: a thread still in a hung run is reused."""
        with self._lock:
            self._stop.clear()
            self._start_collector()
            if not self.alive:
                self._thread = threading.Thread(target=self._loop, name=f"sampler-{self.name}", daemon=True)
                self._thread.start()

    def reconfigure(
        self,
        collector: Collector,
        interval: float,
        timeout: float,
        after: Sequence[Sampler] = (),
        select: Callable[[str], bool] = EVERY_FAMILY,
    ) -> None:
        """Take up new settings and, if it is another one, a new collector, from the next run on.

        The replaced collector is closed once its current run (if any) has returned, on the
        sampler's own thread, so it is never closed under a run.
        """
        with self._lock:
            if collector is not self.collector:
                if not self._collector_closed:
                    self._retired.append(self.collector)
                self.collector, self._collector_started, self._collector_closed = collector, False, False
                if self.alive and not self._stop.is_set():
                    self._start_collector()
            self.interval, self.timeout, self.after = interval, timeout, tuple(after)
            self.select = select
        self._wake.set()

    def _start_collector(self) -> None:
        if not self._collector_started:
            _start(self.collector)
            self._collector_started = True

    def stop(self) -> None:
        """Ask the loop to end; a hung collector cannot be interrupted, so nobody waits for it.

        The loop closes its collectors when it ends, on its own thread."""
        self._stop.set()
        self._wake.set()
        self._settled.set()

    def join(self, deadline: float) -> None:
        """Wait for the loop to end, until `deadline` (time.monotonic())."""
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        try:
            if self._wait_for_dependencies():
                self._run_until_stopped()
        finally:
            with self._lock:
                self._retired, retired = [], self._retired
                if self._stop.is_set():
                    retired.append(self.collector)
                    self._collector_started, self._collector_closed = False, True
                else:  # resumed (`start`) while this loop was ending: carry on in a new thread
                    self._thread = threading.Thread(
                        target=self._loop, name=f"sampler-{self.name}", daemon=True
                    )
                    self._thread.start()
            for collector in retired:
                _close(collector)

    def _run_until_stopped(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            self._close_retired()
            while not self._stop.is_set():
                remaining = next_run(started, self.interval, self.phase) - time.monotonic()
                if remaining <= 0:
                    break
                # A reconfiguration wakes the loop so that a shorter interval applies at once.
                self._wake.wait(remaining)
                self._wake.clear()

    def _wait_for_dependencies(self) -> bool:
        """Wait until every collector this one reads from has finished a first run, or hung past
        its timeout; False if the sampler was stopped meanwhile."""
        for dependency in self.after:
            deadline = time.monotonic() + dependency.timeout
            while not dependency.settled(deadline):
                if self._stop.wait(0.05):
                    return False
        return not self._stop.is_set()

    def settled(self, deadline: float | None = None) -> bool:
        """A first run has finished, or (given a deadline) the deadline passed while it runs."""
        return self._settled.is_set() or (deadline is not None and time.monotonic() >= deadline)

    def run_once(self, timeout: float | None = None) -> Snapshot:
        """One run of the collector. With a timeout (one-shot commands), a run still going after
        it is abandoned and reported as hung, so the command answers within its timeouts."""
        if timeout is None:
            return self._run()
        finished = threading.Event()

        def work() -> None:
            self._run()
            finished.set()

        threading.Thread(target=work, name=f"once-{self.name}", daemon=True).start()
        if not finished.wait(timeout):
            self._abandoned = True
            self._settled.set()
            return Snapshot((), False, timeout, time.time(), time.monotonic(), self.status().reason, 0)
        assert self._snapshot is not None
        return self._snapshot

    def _run(self) -> Snapshot:
        collector = self.collector
        start_wall, start = time.time(), time.monotonic()
        self._running_since = start
        error: str | None = None
        families: Sequence[Metric] = ()
        try:
            families = list(collector.collect())
        except NoData as err:
            if self._last_error != f"nodata:{err}":
                log.debug("collector %s found nothing to read: %s", self.name, err)
            self._last_error = f"nodata:{err}"
        except CollectorFailed as err:
            error, families = str(err), list(err.families)
            self._note_failure(error)
        except Exception as err:  # a collector's failure must never stop the agent
            error = f"{type(err).__name__}: {err}" if not str(err) else str(err)
            self._note_failure(error)
        else:
            if self._last_error is not None and not self._last_error.startswith("nodata:"):
                log.info("collector %s recovered", self.name)
            self._last_error = None
        end = time.monotonic()
        select = self.select
        families = [family for family in families if select(exposed_name(family))]
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
        self._snapshots += 1
        if snapshot.success:
            self.last_success_at, self.last_success_monotonic = snapshot.finished_at, end
        self._running_since = None
        self._settled.set()
        self._on_snapshot()
        return snapshot

    def _note_failure(self, error: str) -> None:
        if error != self._last_error:
            log.error("collector %s failed: %s", self.name, error)
        self._last_error = error

    def _close_retired(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, []
        for collector in retired:
            _close(collector)

    # -- reporting ---------------------------------------------------------------------------

    def version(self, now: float) -> tuple[int, bool]:
        """What `status` depends on, cheaply: the runs finished, and whether one is hung. Two equal
        versions give the same status (but for a hung run's age)."""
        running_since = self._running_since
        hung = running_since is not None and (self._abandoned or now - running_since > self.timeout)
        return self._snapshots, hung

    def status(self, now: float | None = None) -> Status:
        now = time.monotonic() if now is None else now
        snapshot, running_since = self._snapshot, self._running_since
        if running_since is not None and (self._abandoned or now - running_since > self.timeout):
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


def _start(collector: Any) -> None:
    start = getattr(collector, "start", None)
    if start is not None:
        start()


def _close(collector: Any) -> None:
    close = getattr(collector, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception as err:  # closing must not take the agent down either
        log.warning("closing collector %s failed: %s", getattr(collector, "name", "?"), err)
