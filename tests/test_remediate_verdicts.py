"""The verdicts the remediator reads from a real Prometheus (fleet/remediate/verdicts.py).

Each node's past is written scrape by scrape and backfilled (tests/verdict_tsdb.py), then read at
a fixed moment: how long a verdict held, whether its series stopped, what cannot be trusted.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterhealth.fleet.prometheus import NoVerdict, Partial, Prometheus
from clusterhealth.fleet.remediate import verdicts
from clusterhealth.fleet.remediate.config import FabricConfig, RemediateConfig
from clusterhealth.fleet.remediate.engine import Seen
from clusterhealth.fleet.remediate.reconcile import fabric_suspects

from .prom import free_port
from .verdict_tsdb import Span, Target, backfill, openmetrics, serve

NOW = float(math.floor(time.time() / 60) * 60 - 3600)  # an hour ago, on a minute
HOLD, SETTLE, STALE = 300.0, 900.0, 180.0
BEGIN = NOW - 7200
END = NOW + 1  # the sample at NOW included


def span(start: float, end: float, state: str = "healthy", action: str = "none") -> Span:
    return Span(start, end, state, action)


TARGETS = [
    # Healthy for two hours.
    Target("10.0.0.1:9845", "n1", (span(BEGIN, END),)),
    # Unhealthy for the last 400 s: past the hold, short of the settle time.
    Target(
        "10.0.0.2:9845",
        "n2",
        (span(BEGIN, NOW - 400), span(NOW - 400, END, "unhealthy", "reset_gpu")),
        checks=(("gpu_xid", "3", 2), ("hca_firmware", "mlx5_0", 1), ("gpu_ecc_uncorrectable", "3", 2)),
    ),
    # Unhealthy for the last 200 s: not held yet.
    Target("10.0.0.3:9845", "n3", (span(BEGIN, NOW - 200), span(NOW - 200, END, "unhealthy", "reboot"))),
    # Its agent stopped 600 s ago, unhealthy: a verdict from a series that stopped.
    Target("10.0.0.4:9845", "n4", (span(BEGIN, NOW - 600, "unhealthy", "replace"),)),
    # Two targets say they are n5.
    Target("10.0.0.5:9845", "n5", (span(BEGIN, END),)),
    Target("10.0.0.55:9845", "n5", (span(BEGIN, END, "unhealthy", "reboot"),)),
    # A series no agent writes.
    Target("10.0.0.6:9845", "n6", (span(BEGIN, END, "broken", "reboot"),)),
    # A target that never said which node it is.
    Target("10.0.0.7:9845", None, (span(BEGIN, END, "unhealthy", "reboot"),)),
    # Healthy, then 100 s unhealthy, healthy again for 500 s: held for the hold, not the settle.
    Target(
        "10.0.0.8:9845",
        "n8",
        (span(BEGIN, NOW - 600), span(NOW - 600, NOW - 500, "unhealthy", "reset_gpu"), span(NOW - 500, END)),
    ),
    # The agent restarted 300 s ago (two minutes without samples), unhealthy before and after: the
    # verdict has held all along, whatever the agent's own `since` says.
    Target(
        "10.0.0.9:9845",
        "n9",
        (span(BEGIN, NOW - 300, "unhealthy", "replace"), span(NOW - 180, END, "unhealthy", "replace")),
    ),
    # A node whose agent first reported 400 s ago, unhealthy: nothing before says how long.
    Target("10.0.0.10:9845", "n10", (span(NOW - 400, END, "unhealthy", "reboot"),)),
    # A state the agents write with an action none writes.
    Target("10.0.0.11:9845", "n11", (span(BEGIN, END, "unhealthy", "explode"),)),
    # One target that says it is two nodes (its node_info series carry two names).
    Target("10.0.0.12:9845", "n12", (span(BEGIN, END, "unhealthy", "reboot"),)),
    Target("10.0.0.12:9845", "n12b", (span(BEGIN, END, "unhealthy", "reboot"),)),
    # Healthy, then for the last 100 s a series with a state no agent writes, beside the good one.
    Target("10.0.0.13:9845", "n13", (span(BEGIN, NOW - 100), span(NOW - 100, END, "broken", "reboot"))),
    # Unhealthy all along but silent from 500 s to 290 s ago: nothing says what it was when the
    # hold's window began, though the settle's window began unhealthy.
    Target(
        "10.0.0.14:9845",
        "n14",
        (span(BEGIN, NOW - 500, "unhealthy", "reset_gpu"), span(NOW - 290, END, "unhealthy", "reset_gpu")),
    ),
    # Its checks: a WARNING, an UNKNOWN and a status no agent writes (4).
    Target(
        "10.0.0.15:9845",
        "n15",
        (span(BEGIN, NOW - 400), span(NOW - 400, END, "unhealthy", "reset_gpu")),
        checks=(("nvlink", "0", 1), ("gpu_health", "1", 3), ("made_up", "x", 4)),
    ),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verdicts")
    return backfill(root, openmetrics(TARGETS))


@pytest.fixture(scope="module")
def prometheus(data: Path) -> Iterator[str]:
    with serve(data.parent, data) as url:
        yield url


def read(url: str, now: float = NOW) -> verdicts.Reading:
    return verdicts.read(Prometheus(url), now, stale_seconds=STALE, windows=(HOLD, SETTLE))


def test_each_node_has_its_verdict_and_how_long_it_held(prometheus: str) -> None:
    seen = read(prometheus).seen
    assert seen["n1"] == Seen("n1", "healthy", "none", SETTLE)
    assert (seen["n2"].state, seen["n2"].action, seen["n2"].held_seconds) == ("unhealthy", "reset_gpu", HOLD)
    # 200 s of a 300 s hold; its healthy series is still within the lookback: the newer one counts.
    assert (seen["n3"].state, seen["n3"].action, seen["n3"].held_seconds) == ("unhealthy", "reboot", 0)
    assert seen["n8"].held_seconds == HOLD  # healthy again for 500 s: not yet settled
    assert (seen["n9"].state, seen["n9"].held_seconds) == ("unhealthy", SETTLE)
    assert seen["n10"].held_seconds == HOLD
    # Not proven over the hold: not proven over the longer settle either, whatever its start says.
    assert (seen["n14"].state, seen["n14"].held_seconds) == ("unhealthy", 0)


def test_the_evidence_names_the_worst_checks_first(prometheus: str) -> None:
    seen = read(prometheus).seen
    assert seen["n2"].evidence == "gpu_ecc_uncorrectable 3, gpu_xid 3, hca_firmware mlx5_0"
    # UNKNOWN before WARNING; a status no agent writes is no evidence (and fails nothing).
    assert seen["n15"].evidence == "gpu_health 1, nvlink 0"


def test_a_verdict_from_a_series_that_stopped_is_not_a_verdict(prometheus: str) -> None:
    # 215 s after its last sample (past stale_seconds, within Prometheus's 5 minutes of lookback).
    n4 = read(prometheus, NOW - 400).seen["n4"]
    assert n4.state is None and n4.action is None
    stopped = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - 615))
    assert n4.problem == f"its series stopped: its latest verdict (unhealthy replace) is from {stopped}"
    # Exactly stale_seconds after its last sample it is still a verdict; a second later, not.
    assert read(prometheus, NOW - 615 + STALE).seen["n4"].state == "unhealthy"
    assert read(prometheus, NOW - 615 + STALE + 1).seen["n4"].state is None
    # The same words a minute later: said once.
    assert read(prometheus, NOW - 340).seen["n4"].problem == n4.problem
    # Just after it stopped it was still one; 10 minutes after, Prometheus has none for it.
    assert read(prometheus, NOW - 600 + 60).seen["n4"].state == "unhealthy"
    assert "n4" not in read(prometheus).seen


def test_what_cannot_be_tied_to_one_node_is_not_a_verdict(prometheus: str) -> None:
    reading = read(prometheus)
    assert reading.seen["n5"].state is None and "2 targets say they are n5" in (
        reading.seen["n5"].problem or ""
    )
    assert reading.seen["n6"].state is None and "unexpected labels" in (reading.seen["n6"].problem or "")
    # An action no agent writes, beside a state one does; an odd series beside a good one.
    assert reading.seen["n11"].state is None and "unexpected labels" in (reading.seen["n11"].problem or "")
    assert reading.seen["n13"].state is None and "unexpected labels" in (reading.seen["n13"].problem or "")
    two_names, no_name = sorted(reading.problems)  # by the target's labels: 10.0.0.12 < 10.0.0.7
    assert "10.0.0.7:9845" in no_name and "clusterhealth_node_info" in no_name
    assert "10.0.0.12:9845" in two_names and "names itself ['n12', 'n12b']" in two_names
    assert "n12" not in reading.seen and "n12b" not in reading.seen
    assert reading.queries == 7  # whatever the size of the fleet


def test_a_partial_answer_is_no_verdict_at_all(data: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tsdb"
    shutil.copytree(data, copy)
    with serve(tmp_path, copy, partial=True) as url, pytest.raises(Partial, match="partial"):
        read(url)


def test_a_partial_answer_fails_only_the_read_it_came_in(prometheus: str, data: Path, tmp_path: Path) -> None:
    """One client serves every reconcile of a loop: a partial answer fails that reconcile's read,
    not the next ones once the answers are whole again."""
    copy = tmp_path / "tsdb"
    shutil.copytree(data, copy)
    with serve(tmp_path, copy, partial=True) as url:
        client = Prometheus(url)
        with pytest.raises(Partial):
            verdicts.read(client, NOW, stale_seconds=STALE, windows=(HOLD, SETTLE))
    client.url = prometheus
    assert (
        verdicts.read(client, NOW, stale_seconds=STALE, windows=(HOLD, SETTLE)).seen["n1"].state == "healthy"
    )


def test_an_unreachable_prometheus_is_no_verdict() -> None:
    with pytest.raises(NoVerdict, match="cannot reach"):
        read(f"http://127.0.0.1:{free_port()}")


def test_a_prometheus_without_verdicts_is_no_verdict(prometheus: str) -> None:
    with pytest.raises(NoVerdict, match="no clusterhealth_node_verdict"):
        read(prometheus, BEGIN - 86400)


def test_a_fabric_suspect_makes_its_host_unhealthy_unless_it_is_worse() -> None:
    suspect = Seen("n1", "unhealthy", "inspect", math.inf, "fabric f: n1 at 50%", source="fabric")
    own = {
        "n1": Seen("n1", "healthy", "none", 900.0),
        "n2": Seen("n2", "unhealthy", "replace", 900.0, "gpu_row_remap 1"),
    }
    merged = verdicts.with_suspects(own, {"n1": suspect, "n2": Seen("n2", "unhealthy", "inspect", math.inf)})
    assert (merged["n1"].state, merged["n1"].action, merged["n1"].source) == (
        "unhealthy",
        "inspect",
        "fabric",
    )
    assert merged["n2"] == own["n2"]


def test_a_fabric_suspect_wins_over_an_equal_action_and_over_a_degraded_node() -> None:
    """The node's own verdict stands only when it is unhealthy with a heavier action: an equal one
    gives way to the suspect (the evidence of both kept), and so does a degraded verdict, whatever
    its action."""
    own = {
        "n1": Seen("n1", "unhealthy", "inspect", 900.0, "gpu_clocks 0"),
        "n2": Seen("n2", "degraded", "replace", 900.0, "gpu_row_remap 0"),
    }
    suspects = {
        n: Seen(n, "unhealthy", "inspect", math.inf, f"fabric f: {n} at 50%", source="fabric") for n in own
    }
    merged = verdicts.with_suspects(own, suspects)
    assert (merged["n1"].source, merged["n1"].evidence) == ("fabric", "fabric f: n1 at 50%; gpu_clocks 0")
    assert (merged["n2"].state, merged["n2"].action, merged["n2"].source) == (
        "unhealthy",
        "inspect",
        "fabric",
    )


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two pairwise groups of 8 as their agents exported them over the last hour (the analyze
    tests' simulation, tests/fabric_store.py): h3 slow in one, the path h2-h5
    in the other."""
    from clusterhealth.checks.fabric import simulation as sim

    from .fabric_store import LAST, PERIOD, SCRAPE, N, _group

    shift = int(time.time() // PERIOD) - 2 - LAST
    families: dict[str, list[str]] = {}
    schedule = sim.Group(sim.Fleet(sim.node_names(N), seed="pathfault"), random.Random(0)).schedule
    met = sim.meeting_round(schedule, "h2", "h5", LAST - 10)
    for probe, rounds in (
        ("hostfault", _group("hostfault", LAST - 2, bad_hosts={"h3": 0.5})),
        ("pathfault", _group("pathfault", met, bad_paths={sim.path("h2", "h5"): 0.5})),
    ):
        part = sim.exposition_history(
            probe, sim.shifted(rounds, shift), PERIOD, sim.node_names(N), scrape_interval=SCRAPE
        )
        for name, lines in part.items():
            families.setdefault(name, []).extend(lines)
    root = tmp_path_factory.mktemp("fabric")
    data = backfill(root, sim.openmetrics(families))
    with serve(root, data) as url:
        yield url


def test_fabric_host_suspects_become_verdicts_and_paths_do_not(fabric: str) -> None:
    config = RemediateConfig(fabric=FabricConfig(window_seconds=7200))
    now = time.time()
    suspects, problem = fabric_suspects(Prometheus(fabric), "hostfault", now, config)
    assert problem is None and list(suspects) == ["h3"]
    h3 = suspects["h3"]
    assert (h3.state, h3.action, h3.held_seconds, h3.source) == ("unhealthy", "inspect", math.inf, "fabric")
    assert (
        h3.evidence.startswith("fabric hostfault: h3 at ") and h3.impact and "gpu_hours_per_day" in h3.impact
    )
    # A path is two hosts' link: analyze names it, the remediator acts on neither end.
    assert fabric_suspects(Prometheus(fabric), "pathfault", now, config) == ({}, None)
