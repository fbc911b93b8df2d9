"""The agent's own CollectorRegistry: snapshots of every collector plus the meta metrics.

Rendering is cached per combination of snapshot generations and statuses, so fifty Prometheus
servers and dashboards scraping at once cost one serialization per collection cycle.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from clusterhealth.agent import __version__
from clusterhealth.agent.sampling import Sampler, Status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SnapshotCollector:
    def __init__(self, samplers: Callable[[], Sequence[Sampler]]):
        self._samplers = samplers

    def collect(self) -> Iterator[Metric]:
        statuses = [s.status() for s in self._samplers()]
        yield from meta_families(statuses)
        for status in statuses:
            yield from status.families


def meta_families(statuses: Sequence[Status]) -> list[Metric]:
    build = GaugeMetricFamily(
        "clusterhealth_build_info", "clusterhealth version, value 1.", labels=["version"]
    )
    build.add_metric([__version__], 1.0)
    success = GaugeMetricFamily(
        "clusterhealth_scrape_collector_success",
        "1 if the collector's last run succeeded (0 also while a run is hung past its timeout).",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "clusterhealth_scrape_collector_duration_seconds",
        "How long the collector's last finished run took.",
        labels=["collector"],
    )
    for status in statuses:
        success.add_metric([status.name], 1.0 if status.success else 0.0)
        if status.snapshot is not None:
            duration.add_metric([status.name], status.snapshot.duration_seconds)
    return [build, success, duration]


class Exposition:
    """Renders the registry, reusing the last rendering while no snapshot has changed."""

    def __init__(self, samplers: Callable[[], Sequence[Sampler]]):
        self._samplers = samplers
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(samplers))
        self._lock = threading.Lock()
        self._key: tuple[object, ...] | None = None
        self._text = b""
        self._gzipped: bytes | None = None

    def _current_key(self) -> tuple[object, ...]:
        key = []
        for sampler in self._samplers():
            status = sampler.status()
            generation = status.snapshot.generation if status.snapshot else 0
            key.append((sampler.name, id(sampler), generation, status.success))
        return tuple(key)

    def render(self, gzipped: bool = False) -> bytes:
        key = self._current_key()
        with self._lock:
            if key != self._key:
                self._text = generate_latest(self.registry)
                self._gzipped = None
                self._key = key
            if not gzipped:
                return self._text
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._text, compresslevel=5)
            return self._gzipped

    def refresh(self) -> None:
        """Render now (both encodings), ahead of the next scrape."""
        self.render(gzipped=True)
