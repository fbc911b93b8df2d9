"""Learned bandwidth expectations: the rolling median of a probe's last good runs.

Only ``ok`` runs feed a baseline (``learn``). A baseline that also learned from degraded runs
would drift down with the fault it is meant to catch: a link that lost half its lanes would be
"expected" at half speed after a few cycles and stop alerting. The price is that a deliberate,
lasting drop (a slower fabric accepted on purpose) stays ``degraded`` until an operator says so:
``reset(probe)``, deleting the state file, or a configured expectation, which the agent prefers
to a learned one. For the same reason a configured expectation is what a node that starts on a
bad fabric needs: its first ``min_runs`` runs have nothing to compare with and are learned as is.

The median, not the mean, so that one lucky or unlucky run moves nothing.

State lives in one JSON file in ``state_dir``, written atomically (statefile.py). The file is
re-read when another process (``clusterhealth probe run`` beside the agent) changed it; records are
read-modify-write, which is safe because probes run one at a time under the probe lock. A file that
cannot be read or parsed is logged, moved aside as ``*.corrupt`` when possible, and rebuilt from the
next runs. Nothing here raises on I/O: losing a baseline costs a few runs of relearning, while an
exception would cost the probe result.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import threading
from pathlib import Path
from typing import Any

from clusterhealth.checks.probes import statefile
from clusterhealth.checks.probes.evaluate import ProbeOutcome

log = logging.getLogger("clusterhealth.probes")

STATE_FILE = "probe-baselines.json"
FORMAT_VERSION = 1


class BaselineStore:
    def __init__(self, state_dir: Path, window: int = 10, min_runs: int = 3):
        if window < 1 or not 1 <= min_runs <= window:
            raise ValueError(f"need 1 <= min_runs <= window, got min_runs={min_runs}, window={window}")
        self.path = Path(state_dir) / STATE_FILE
        self.window, self.min_runs = window, min_runs
        self._lock = threading.Lock()
        # probe -> peer -> bandwidths in bytes/s, oldest first
        self._series: dict[str, dict[str, list[float]]] = {}
        self._signature: statefile.Signature | None = None
        self._refresh()

    def expected(self, probe: str, peer: str = "") -> float | None:
        """The median of the last ``window`` recorded runs, once there are ``min_runs`` of them."""
        with self._lock:
            self._refresh()
            runs = self._series.get(probe, {}).get(peer, [])
            return statistics.median(runs) if len(runs) >= self.min_runs else None

    def runs(self, probe: str, peer: str = "") -> tuple[float, ...]:
        with self._lock:
            self._refresh()
            return tuple(self._series.get(probe, {}).get(peer, []))

    def record(self, probe: str, peer: str, bandwidth: float) -> None:
        """Add one run's bandwidth (bytes/s), whatever its result; ``learn`` applies the policy."""
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(f"bandwidth must be a positive number, got {bandwidth}")
        with self._lock:
            self._refresh()
            runs = self._series.setdefault(probe, {}).setdefault(peer, [])
            runs.append(float(bandwidth))
            del runs[: -self.window]
            self._write()

    def learn(self, probe: str, peer: str, outcome: ProbeOutcome) -> bool:
        """Record the run if it may shape the baseline: ``ok`` with a bandwidth. True if recorded."""
        bandwidth = outcome.bandwidth_bytes_per_second
        if outcome.result != "ok" or bandwidth is None or not (math.isfinite(bandwidth) and bandwidth > 0):
            return False
        self.record(probe, peer, bandwidth)
        return True

    def reset(self, probe: str, peer: str | None = None) -> None:
        """Forget a probe's baseline (every peer when ``peer`` is None), to relearn it."""
        with self._lock:
            self._refresh()
            if peer is None:
                self._series.pop(probe, None)
            elif probe in self._series:
                self._series[probe].pop(peer, None)
                if not self._series[probe]:
                    del self._series[probe]
            self._write()

    def _refresh(self) -> None:
        """Adopt the file when it changed since this instance last read or wrote it."""
        try:
            signature = statefile.signature(self.path)
        except OSError as exc:
            log.warning("cannot read probe baselines from %s: %s; using this process's copy", self.path, exc)
            return
        if signature is None:
            if self._signature is not None:
                # It existed and is gone: an operator reset every baseline.
                log.info("%s was removed; probe baselines start over", self.path)
                self._series, self._signature = {}, None
            return
        if signature == self._signature:
            return
        if not self.path.is_file():
            self._signature = signature  # warned once, not on every run
            log.warning("%s is not a regular file; probe baselines are kept in memory only", self.path)
            return
        try:
            series = _decode(json.loads(self.path.read_bytes()), self.window)
        except (OSError, ValueError) as exc:
            # Neither a crash (atomic writes) nor a concurrent writer produces this: a disk fault, a
            # manual edit, a full disk on an older version. Move it aside so the next write does
            # not destroy the evidence, and so the warning is logged once, not on every run.
            corrupt = self.path.with_name(self.path.name + ".corrupt")
            try:
                os.replace(self.path, corrupt)
                moved = f"; moved to {corrupt}"
                self._signature = None
            except OSError:
                moved = ""
                self._signature = signature
            log.warning(
                "ignoring unreadable probe baselines in %s (%s)%s; they will be relearned",
                self.path,
                exc,
                moved,
            )
            return
        self._series, self._signature = series, signature

    def _write(self) -> None:
        document = {"version": FORMAT_VERSION, "baselines": self._series}
        try:
            self._signature = statefile.write_json(self.path, document)
        except OSError as exc:
            log.warning("cannot save probe baselines to %s: %s; kept in memory only", self.path, exc)


def _decode(document: Any, window: int) -> dict[str, dict[str, list[float]]]:
    """The baselines of a state file; ValueError naming what is wrong."""
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise ValueError(f"not a version {FORMAT_VERSION} baseline file")
    baselines = document.get("baselines")
    if not isinstance(baselines, dict):
        raise ValueError("'baselines' is not an object")
    series: dict[str, dict[str, list[float]]] = {}
    for probe, peers in baselines.items():
        if not isinstance(peers, dict):
            raise ValueError(f"baselines of probe {probe!r} are not an object")
        for peer, runs in peers.items():
            if not isinstance(runs, list) or not all(_is_bandwidth(run) for run in runs):
                raise ValueError(f"baseline of probe {probe!r} peer {peer!r} is not a list of bandwidths")
            # A smaller window than the one that wrote the file keeps the newest runs.
            series.setdefault(probe, {})[peer] = [float(run) for run in runs][-window:]
    return series


def _is_bandwidth(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
