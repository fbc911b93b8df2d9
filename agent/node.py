"""The node: what the collectors share, and what outlives a config reload.

Collectors do not reach into each other. What one of them reads for the others is published here,
whole, at the end of its cycle (`Board`): the GPU state the audits and the jobs collector read, the
kernel-log events the Xid check reads, the GPUs' workloads `check` shows. The GPU identities (index,
UUID, bus id) are in one directory that the gpu collector fills and the Xid and kernel-log
collectors read, so nothing but the gpu collector, the Xid event thread and the idle guard ever
calls NVML. Counters such as
`clusterhealth_gpu_xid_errors_total` live in the ledger here, so a reload never resets them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from clusterhealth.agent import config as configuration
from clusterhealth.checks.kernel_log import normalize_pci_bus_id
from clusterhealth.checks.kernel_watch import SeenEvent, recent_xid_events
from clusterhealth.exporters.gpu import GpuDirectory, GpuState
from clusterhealth.exporters.jobs.attribution import Attribution
from clusterhealth.exporters.nvml import NvmlSession
from clusterhealth.exporters.pci import nvidia_gpu_functions
from clusterhealth.exporters.xid import NvmlXidWatcher, XidLedger

if TYPE_CHECKING:
    from clusterhealth.exporters.sim.nvml import SimulatedLibrary

T = TypeVar("T")

# What the audits are told when GPUs are not to be looked at (gpu collector disabled): none.
NO_GPUS = GpuState((), None)


class Board(Generic[T]):
    """One thing a collector publishes for the others: replaced whole, or None with the reason.

    Before the first publication it reads as None with `pending` as the reason, so a reader that
    runs too early says so instead of making a reason up.
    """

    def __init__(self, pending: str):
        self._current: tuple[T | None, str] = (None, pending)

    def publish(self, value: T | None, why: str | None = None) -> None:
        self._current = (value, "" if value is not None else why or "not available")

    def read(self) -> tuple[T | None, str]:
        """The value, or None and why there is none."""
        return self._current


class Node:
    def __init__(self, config: configuration.Config, one_shot: bool = False):
        # One-shot commands (`scrape`, `check`) read everything waiting at once and run no threads.
        self.one_shot = one_shot
        self.session = NvmlSession()
        self.ledger = XidLedger()
        self.directory = GpuDirectory()
        self.gpus: Board[GpuState] = Board("the gpu collector has not finished its first run")
        self.kernel_events: Board[Sequence[SeenEvent]] = Board("the kernel log has not been read yet")
        self.jobs: Board[Attribution] = Board("the jobs collector has not finished its first run")
        self.xid_watcher: NvmlXidWatcher | None = None
        self.simulator: SimulatedLibrary | None = None
        if config.simulate:
            # Imported here: a node that is not simulated never loads the simulator.
            from clusterhealth.exporters.sim import nvml as nvml_sim
            from clusterhealth.exporters.sim.scenario import load_scenario

            self.simulator = nvml_sim.install(load_scenario(config.simulate))

    def gpu_state(self, config: configuration.Config) -> tuple[GpuState | None, str]:
        """The GPUs as the gpu collector last read them, or None and why."""
        if not config.collectors.gpu.enabled:
            return NO_GPUS, ""
        return self.gpus.read()

    def gpu_index_of_bus(self, sysfs_root: Path) -> dict[str, int]:
        """PCI bus id -> GPU index, for the kernel log, which names GPUs by bus id only.

        NVML told the bus ids of the GPUs that ever answered. A GPU lost before the agent started
        never told its own; when exactly one GPU never answered and exactly one GPU function of the
        nvidia driver in sysfs is no answering GPU's, that function is the lost GPU (NVML's order
        is no guide: its documentation promises none). Two such GPUs, or a GPU NVML does not see
        (excluded from the driver, hidden from a container) beside a lost one, leave more than one
        function unclaimed, and the kernel log's lines stay under their bus ids. Only a GPU NVML
        does not see together with a lost GPU gone from the bus as well would be mistaken.
        """
        known = self.directory.bus_ids()
        silent = self.directory.never_answered()
        if len(silent) != 1:
            return known
        seen = {_canonical(bus) for bus in known}
        others = [a for a in nvidia_gpu_functions(sysfs_root) if _canonical(a) not in seen]
        if len(others) == 1:
            known[others[0]] = silent.pop()
        return known

    def recent_events(self, config: configuration.Config) -> tuple[list[SeenEvent] | None, str]:
        """Counted Xids (both sources) and the kernel log's other events, or None and why the log
        could not be read: an unreadable log must not read as "no Xid"."""
        events = recent_xid_events(self.ledger)
        if config.collectors.kernel_log.enabled:
            logged, why = self.kernel_events.read()
            if logged is None:
                return None, why
            events += logged
        return events, ""

    def sync_xid_watcher(self, config: configuration.Config) -> None:
        """Run the NVML Xid event thread while the config asks for it (agent only)."""
        wanted = config.collectors.gpu.enabled and config.collectors.gpu.xid_events and not self.one_shot
        if wanted and self.xid_watcher is None:
            self.xid_watcher = NvmlXidWatcher(self.session, self.ledger)
            self.xid_watcher.start()
        elif not wanted and self.xid_watcher is not None:
            self.xid_watcher.stop()
            self.xid_watcher = None

    def drain_xid_events(self) -> None:
        """For one-shot commands: count the Xid events NVML already holds, without a thread.

        A real driver holds none (it delivers events after registration only); a simulated node
        delivers its past faults, as `scrape` and `check` then both show.
        """
        NvmlXidWatcher(self.session, self.ledger).drain()

    def close(self, wait: float = 2.0) -> None:
        if self.xid_watcher is not None:
            self.xid_watcher.stop()
        # On its own thread: a driver wedged in another call may hold nvmlShutdown too.
        closing = threading.Thread(target=self.session.shutdown, args=(wait,), daemon=True)
        closing.start()
        closing.join(wait)


def _canonical(bus_id: str) -> str | None:
    try:
        return normalize_pci_bus_id(bus_id)
    except ValueError:
        return None
