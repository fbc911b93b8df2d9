"""The one small interface every collector implements."""

from __future__ import annotations

from collections.abc import Iterable
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
    """

    name: str

    def collect(self) -> Iterable[Metric]: ...
