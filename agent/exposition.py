"""The exposition: snapshots of every collector plus the meta metrics, rendered with caching.

The agent never touches prometheus_client's global registry. Each collector's snapshot is
rendered once, when it changes, and kept; a scrape joins the cached parts with the small meta
part, so fifty scrapers cost one serialization per collection cycle and a collector that runs
every second re-renders only its own few series.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric, Sample
from prometheus_client.utils import floatToGoString

from clusterhealth.agent import __version__
from clusterhealth.agent.collectors import node_verdict
from clusterhealth.agent.sampling import Sampler, Status
from clusterhealth.checks.verdict import Missing, Verdict, VerdictClock, decide_run

log = logging.getLogger("clusterhealth.agent")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Families:
    """A collector over a fixed list of families, in the shape generate_latest expects."""

    def __init__(self, families: Iterable[Metric]):
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


def verdict_families(verdict: Verdict, since: float) -> list[Metric]:
    """The node's verdict, one series (docs/remediation.md), and when it began."""
    family = GaugeMetricFamily(
        "clusterhealth_node_verdict",
        "The node's verdict: its state and the recommended action, value 1 (docs/remediation.md).",
        labels=["state", "action"],
    )
    family.add_metric([verdict.state, verdict.action.label], 1.0)
    began = GaugeMetricFamily(
        "clusterhealth_node_verdict_since_timestamp_seconds",
        "When the current verdict (state and action) began, as this agent saw it (Unix time).",
    )
    began.add_metric([], since)
    return [family, began]


def meta_families(statuses: Sequence[Status], node_name: str | None = None) -> list[Metric]:
    build = GaugeMetricFamily(
        "clusterhealth_build_info", "clusterhealth version, value 1.", labels=["version"]
    )
    build.add_metric([__version__], 1.0)
    # Beside build_info, always: `clusterhealth analyze` ties every target's pairwise results to the
    # node name its partners know it by, whatever collectors run.
    node = GaugeMetricFamily(
        "clusterhealth_node_info",
        "The name this node has in pairwise probe groups (--node-name), value 1.",
        labels=["node"],
    )
    if node_name is not None:
        node.add_metric([node_name], 1.0)
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
        if status.pending:
            continue  # absent until its first run ends, rather than a failure at every start-up
        success.add_metric([status.name], 1.0 if status.success else 0.0)
        if status.snapshot is not None:
            duration.add_metric([status.name], status.snapshot.duration_seconds)
    return [build, node, success, duration]


class Renderer:
    """The text exposition of metric families, byte for byte as prometheus_client's
    generate_latest writes it, with each series' line up to its value, and each family's HELP and
    TYPE lines, kept from one rendering to the next.

    generate_latest sorts and escapes every sample's labels on every call, about 5 µs a sample: a
    node's thousand series cost 5 ms of Python holding the interpreter lock while scrapes wait.
    A series whose name and labels were rendered before costs a dictionary lookup here; a new one,
    a family of an unusual shape (OpenMetrics-only samples, timestamps) are rendered by
    generate_latest itself, so the text cannot differ. What the last rendering did not use is
    dropped.
    """

    def __init__(self) -> None:
        self._heads: dict[tuple[str, str, str], str] = {}
        # (sample name, label items) -> [its line up to the value, the rendering that last used it]
        self._prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]] = {}
        self._rendering = 0

    def render(self, families: Iterable[Metric]) -> bytes:
        self._rendering = rendering = self._rendering + 1
        heads: dict[tuple[str, str, str], str] = {}
        known_heads, prefixes = self._heads, self._prefixes
        used = 0
        out: list[str] = []
        append = out.append
        value_text = floatToGoString
        for family in families:
            name = family.name
            head_key = (name, family.documentation, family.type)
            head = heads.get(head_key) or known_heads.get(head_key)
            if head is None:
                head = generate_latest(_Families([_empty(family)])).decode("utf-8")
            heads[head_key] = head
            start = len(out)
            append(head)
            openmetrics_only = (name + "_created", name + "_gsum", name + "_gcount")
            for sample in family.samples:
                if sample.timestamp is not None or sample.name in openmetrics_only:
                    del out[start:]  # a shape of its own: the library's text for the whole family
                    append(generate_latest(_Families([family])).decode("utf-8"))
                    break
                key = (sample.name, tuple(sample.labels.items()))
                entry = prefixes.get(key)
                if entry is None:
                    entry = prefixes[key] = [_prefix(sample), rendering]
                else:
                    entry[1] = rendering
                used += 1
                append(f"{entry[0]}{value_text(sample.value)}\n")
        self._heads = heads
        if len(prefixes) > 2 * used:  # series gone: keep what this rendering used
            self._prefixes = {key: entry for key, entry in prefixes.items() if entry[1] == rendering}
        return "".join(out).encode("utf-8")


def _empty(family: Metric) -> Metric:
    return Metric(family.name, family.documentation, family.type, family.unit)


def _prefix(sample: Sample) -> str:
    """A sample's line up to its value, as generate_latest writes it ("name{labels} ")."""
    family = Metric("prefix", "", "untyped")
    family.samples.append(Sample(sample.name, sample.labels, 0.0))
    # The last line; only "\n" ends one (a label value may hold a "\r").
    line = generate_latest(_Families([family])).decode("utf-8").split("\n")[-2]
    return line[: -len(floatToGoString(0.0))]


class Exposition:
    """Renders the samplers' snapshots, reusing what has not changed."""

    def __init__(
        self, samplers: Callable[[], Sequence[Sampler]], node_name: Callable[[], str | None] = lambda: None
    ):
        self._samplers = samplers
        self._node_name = node_name
        self._lock = threading.Lock()
        self._key: tuple[object, ...] | None = None
        self._parts: dict[int, tuple[object, bytes]] = {}  # id(sampler) -> (its key, its text)
        # id(sampler) -> its part's renderer (the meta part's under 0)
        self._renderers: dict[int, Renderer] = {}
        self._text = b""
        self._gzipped: bytes | None = None
        self._clock = VerdictClock()
        self._verdict_error: str | None = None  # said once

    def render(self, gzipped: bool = False, wait: bool = True) -> bytes:
        """The exposition of the latest snapshots.

        With `wait=False`, while a collector's new snapshot is being rendered (on its own thread,
        for ~10 ms) the rendering before it is returned instead of waiting: the HTTP server answers
        every connection from one thread, which must not stall behind a rendering.
        """
        if not wait and self._lock.locked():
            previous = self._gzipped if gzipped else self._text
            if previous:
                return previous
        # The meta part changes with every finished run or a run hung past its timeout, a
        # collector's part with its snapshot's generation: a scrape between them (nearly every
        # scrape) compares this key and sends the bytes kept.
        samplers = self._samplers()
        node_name = self._node_name()
        now = time.monotonic()
        key = (node_name, tuple((id(sampler), *sampler.version(now)) for sampler in samplers))
        with self._lock:
            if key != self._key:
                current = [(sampler, sampler.status(now)) for sampler in samplers]
                self._text = self._render(current, node_name)
                self._gzipped = None
                self._key = key
            if not gzipped:
                return self._text
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._text, compresslevel=5)
            return self._gzipped

    def _render(self, current: list[tuple[Sampler, Status]], node_name: str | None) -> bytes:
        verdict = self._verdict(current)
        meta = meta_families([status for _, status in current], node_name)
        meta += verdict_families(verdict, self._clock.since(verdict, time.time()))
        renderers = {0: self._renderers.get(0) or Renderer()}
        parts = [renderers[0].render(meta)]
        fresh: dict[int, tuple[object, bytes]] = {}
        for sampler, status in current:
            part_key = _part_key(sampler, status)
            renderer = renderers[id(sampler)] = self._renderers.get(id(sampler)) or Renderer()
            cached = self._parts.get(id(sampler))
            if cached is None or cached[0] != part_key:
                cached = (part_key, renderer.render(status.families))
            fresh[id(sampler)] = cached
            parts.append(cached[1])
        self._parts, self._renderers = fresh, renderers
        return b"".join(parts)

    def _verdict(self, current: list[tuple[Sampler, Status]]) -> Verdict:
        """The node's verdict; a fault in judging it makes it unknown, never the scrape fail."""
        try:
            verdict = node_verdict(current)
        except Exception as err:
            why = f"could not be judged: {type(err).__name__}: {err}"
            if why != self._verdict_error:
                log.exception("the node's verdict %s", why)
            self._verdict_error = why
            return decide_run(None, [Missing("audit", why)])
        if self._verdict_error is not None:
            log.info("the node's verdict is judged again")
        self._verdict_error = None
        return verdict

    def refresh(self) -> None:
        """Render now (both encodings), ahead of the next scrape."""
        self.render(gzipped=True)


def _part_key(sampler: Sampler, status: Status) -> tuple[object, ...]:
    generation = status.snapshot.generation if status.snapshot else 0
    return (sampler.name, id(sampler), generation, status.success)
