"""The one small interface every collector implements."""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import Metric


class NoData(Exception):
    """The hardware this collector reads is not present on this node (no GPU, no RDMA device).

    Not a failure: the agent logs it once at debug level and reports the collector as successful
    with no series, so a node without InfiniBand does not page anyone.
    """


class Collector(Protocol):
    """Reads hardware state and yields fresh metric families for one collection cycle.

    `collect` runs in the agent's background sampler, never in the scrape path. Raising an
    exception marks the collector's run as failed (`clusterhealth_scrape_collector_success` 0);
    values that cannot be read are simply not yielded.

    Two optional methods: `start()`, called when the agent starts running the collector (the
    probes start their schedule there; one-shot commands never call it), and `close()`, called
    once the collector is replaced or the agent stops, never while `collect` runs. An optional
    attribute, `opt_in`, names the families it leaves out unless a config asks for them
    (`FamilySelection`).
    """

    name: str

    def collect(self) -> Iterable[Metric]: ...


def exposed_name(family: Metric) -> str:
    """The name a family's samples have in the exposition (prometheus_client keeps a counter's
    family name without `_total`)."""
    return family.name + "_total" if family.type == "counter" else family.name


@dataclass(frozen=True)
class FamilySelection:
    """Which metric families of a collector are exported: all but its opt-in ones (the detail a
    fleet does not need by default), plus those `include` names, minus those `exclude` names (glob
    patterns of exposition names; `*` includes every opt-in family)."""

    opt_in: Collection[str] = frozenset()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __call__(self, name: str) -> bool:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude):
            return False
        return name not in self.opt_in or any(fnmatch.fnmatchcase(name, p) for p in self.include)


class CollectorFailed(Exception):
    """The run failed, but what it could read is still worth exporting.

    The collector reports success 0 with `reason` (in /healthz) and its `families` are exported,
    so one failure does not hide the data that was read.
    """

    def __init__(self, reason: str, families: Iterable[Metric] = ()):
        super().__init__(reason)
        self.families = list(families)
