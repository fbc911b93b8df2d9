"""The history as `analyze` reads it now (range queries in flight side by side, each answer reduced as
it comes and dropped) against the reading it replaces (one query after another, every answer held,
then reduced whole), on the shared fabric store (tests/fabric_store.py): the same History, also
when the answers come back in the reverse of the order asked.

The groups' windows are narrower than a minute (rounds of 120 s), so each family is read in two
interleaved queries (``Windows``' stride): an answer taken out of turn would tie a result to
another window than the whole reading does."""

from __future__ import annotations

import math
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from clusterhealth.checks.fabric import analysis
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.pairwise import BANDWIDTH, EXPECTED, PEER_SUCCESS, ROUND, History
from clusterhealth.fleet.prometheus import Prometheus, Windows, target_of

from .fabric_store import Servers, _serve, tool
from .prom import serving

WINDOW = 7200.0
GROUPS = (
    "hostfault",
    "pathfault",
    "renamed",
    "unreachable",
    "jobfault",
    "partial",
    "noisefaults",
    "treeuplink",
)


@pytest.fixture(scope="module")
def servers(fabric_store: Servers) -> Servers:
    return fabric_store


def _whole(url: str, probe: str, end: float) -> dict[str, Any]:
    """The reading before streaming (fleet/pairwise.py as of 0.2.0), one query at a time: the
    period from every round number of the window, every answer held, then reduced whole."""
    prometheus = Prometheus(url, parallel=1)
    selector, match = f"[{math.ceil(WINDOW)}s]", f'probe="{probe}"'
    (latest,) = prometheus.query(f"max(last_over_time({ROUND}{{{match}}}{selector}))", end)
    period = end / (float(latest["value"][1]) + 0.5)
    step = pairwise.window_width(period)
    windows = Windows(end, step, max(int(WINDOW // step), 1), prometheus.holds_left_edge(end))
    node_info = prometheus.series(pairwise.NODE_INFO, end - WINDOW, end)
    if len(node_info) != len({target_of(s["metric"], ("node",)) for s in node_info}):
        node_info = windows.read(prometheus, f"last_over_time({pairwise.NODE_INFO}{windows.selector})")
    w = windows.selector
    few_rounds = max(1, math.ceil(pairwise.ROUNDS_PER_QUERY * period / step))
    rounds = f"{ROUND}{{{match}}}{w}"
    reduced = pairwise.reduce_series(
        probe,
        node_info=node_info,
        rounds=windows.read(prometheus, f"max_over_time({rounds}) == min_over_time({rounds})"),
        bandwidth=windows.read(prometheus, f'last_over_time({BANDWIDTH}{{{match},peer!=""}}{w})', few_rounds),
        peer_success=windows.read(
            prometheus, f'last_over_time({PEER_SUCCESS}{{{match},peer!=""}}{w}) == 0', few_rounds
        ),
        expected=prometheus.query(f"last_over_time({EXPECTED}{{{match}}}{selector})", end),
    )
    return {
        "meetings": analysis.merge(reduced.reports),
        "nodes": reduced.nodes,
        "expected": reduced.expected,
        "untied": reduced.problems,
        "period": period,
        "step": step,
    }


def _read(url: str, probe: str, end: float) -> History:
    return pairwise.read_history(Prometheus(url, parallel=4), probe, WINDOW, now=end, allow_partial=True)


def _same(history: History, whole: dict[str, Any]) -> None:
    assert history.meetings, "a group without meetings compares nothing"
    assert history.meetings == whole["meetings"]
    assert history.nodes == whole["nodes"] and history.expected == whole["expected"]
    assert history.untied == whole["untied"]
    assert (history.period, history.step) == (whole["period"], whole["step"])


@pytest.fixture
def reversed_answers(servers: Servers) -> Iterator[str]:
    """The first Prometheus behind a proxy that sends each range query's answer only after the
    answer of the request that came after it (or after 0.1 s), so that parallel answers come
    back in the reverse of the order asked."""
    lock, arrived, sent = threading.Lock(), [0], threading.Condition()
    # The last of a batch in flight has no later request to wait for: it waits 0.1 s.
    done: set[int] = set()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with urllib.request.urlopen(servers.url + self.path, timeout=60) as response:
                body = response.read()
            if "/query_range" in self.path:
                with lock:
                    arrived[0] += 1
                    mine = arrived[0]
                with sent:
                    sent.wait_for(lambda: mine + 1 in done, timeout=0.1)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if "/query_range" in self.path:
                with sent:
                    done.add(mine)
                    sent.notify_all()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


@pytest.mark.parametrize("probe", GROUPS)
def test_the_streamed_reading_gives_the_history_of_the_whole_reading(servers: Servers, probe: str) -> None:
    end = time.time()
    _same(_read(servers.url, probe, end), _whole(servers.url, probe, end))


def test_answers_that_come_back_out_of_order_are_taken_in_order(
    servers: Servers, reversed_answers: str
) -> None:
    end = time.time()
    _same(_read(reversed_answers, "noisefaults", end), _whole(servers.url, "noisefaults", end))


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """A Prometheus holding two groups of two agents over the last two hours, rounds of 900 s:
    ``live``, both scraped to the end, and ``skewed``, whose second agent stopped an hour before
    the end with a clock ten rounds ahead, so that its last round number is the group's highest
    (what the period is read from) and none of its samples is recent. The window's end."""
    root = tmp_path_factory.mktemp("skewed")
    last = time.time() // 900 * 900 - 900
    lines = ["# TYPE clusterhealth_probe_round gauge"]
    for probe, instance, until, ahead in (
        ("live", "a", last, 0),
        ("live", "b", last, 0),
        ("skewed", "a", last, 0),
        ("skewed", "b", last - 3600, 10),
    ):
        for t in range(int(last - 7200), int(until) + 1, 15):
            labels = f'instance="{instance}:9845",job="clusterhealth",probe="{probe}"'
            lines.append(f"clusterhealth_probe_round{{{labels}}} {t // 900 + ahead} {t}.000")
    lines.append("# EOF")
    (root / "data.om").write_text("\n".join(lines) + "\n")
    data = root / "tsdb"
    subprocess.run(
        [tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(root / "data.om"), str(data)],
        check=True,
        capture_output=True,
    )
    process, url = _serve(tool("prometheus"), root, data, "scrape_configs: []\n")
    try:
        yield url, last + 1
    finally:
        process.terminate()
        process.wait(30)


class _Asked(Prometheus):
    """A client that keeps the instant queries it asked."""

    asked: list[str]

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        self.asked = [*getattr(self, "asked", []), promql]
        return super().query(promql, at)


def _exact_period(client: Prometheus, probe: str, end: float) -> float:
    (latest,) = client.query(f'max(last_over_time({ROUND}{{probe="{probe}"}}[{int(WINDOW)}s]))', end)
    return end / (float(latest["value"][1]) + 0.5)


def test_the_period_of_a_live_group_is_read_from_its_recent_round_numbers(skewed: tuple[str, float]) -> None:
    url, end = skewed
    client = _Asked(url)
    period = pairwise._period(client, "live", 'probe="live"', f"[{int(WINDOW)}s]", end, WINDOW)
    assert not any(f"[{int(WINDOW)}s]" in q for q in client.asked), client.asked
    assert period == _exact_period(client, "live", end) and abs(period - 900) < 0.01


def test_the_period_is_read_from_the_whole_window_when_an_agent_has_no_recent_round(
    skewed: tuple[str, float],
) -> None:
    url, end = skewed
    client = _Asked(url)
    period = pairwise._period(client, "skewed", 'probe="skewed"', f"[{int(WINDOW)}s]", end, WINDOW)
    # The agent ten rounds ahead, silent for the last hour, holds the highest last round number:
    # not the round of the agent scraped to the end.
    assert period == _exact_period(client, "skewed", end) and period < end / ((end - 1) // 900 + 0.5)


@pytest.mark.parametrize("text", ["1e19", "-9223372036854775808", "-9223372036854775807", "-1"])
def test_a_round_number_outside_the_arrays_range_is_kept_as_read(text: str) -> None:
    """The rounds are held in arrays of 64-bit integers; a number outside them, or equal to the
    values that mark a window without a round, is still the round its results belong to."""
    target = {"instance": "10.0.0.1:9845", "job": "clusterhealth"}
    times = [1000.0, 1225.0]
    reduced = pairwise.reduce_series(
        "fabric",
        node_info=[{"metric": {**target, "node": "h1"}}],
        rounds=[{"metric": {**target, "probe": "fabric"}, "values": [[t, text] for t in times]}],
        bandwidth=[
            {"metric": {**target, "probe": "fabric", "peer": "h2"}, "values": [[t, "1e9"] for t in times]}
        ],
        peer_success=[],
    )
    (report,) = reduced.reports
    assert (report.round, report.node, report.peer, report.bandwidth) == (int(float(text)), "h1", "h2", 1e9)
    assert (report.first_seen, report.last_seen) == (1000.0, 1225.0)
