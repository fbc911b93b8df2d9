"""`clusterhealth analyze` and `model` read through VictoriaMetrics: the verdict is the one read
from Prometheus on the same data.

The data is tests/fabric_store.py's (`write_history`): every simulated group's
results as the agents would have exported them, one OpenMetrics document. Prometheus serves its
blocks (promtool), single-node VictoriaMetrics (Debian's `victoria-metrics`, 1.79) imports the same
document (/api/v1/import/prometheus reads OpenMetrics' timestamps in seconds) and holds the same
samples. VictoriaMetrics runs at its defaults but one: its newest 10 minutes are held back
(-search.latencyOffset=10m; 30 s by default), so that the data's last rounds, which end a few
minutes before now, fall where it replaces a range query's points with the point before them.

What VictoriaMetrics answers differently, and where the reader handles it (fleet/prometheus.py),
each with a test here that fails without its handling:

- a range query of 50 points or more comes back on a grid moved to multiples of its step, and an
  instant query of its newest 30 s is evaluated 30 s earlier, unless asked ``nocache=1``;
- a range query's points in its newest 30 s (the latency offset) are the point before them when
  the step is under a minute: narrower windows are read in interleaved queries a minute apart;
- a range selector ``[w]`` at t holds the samples of (t - w, t]; Prometheus 2 (2.42 here) holds
  those of [t - w, t], so a sample on the edge between two windows is in both: asked of the store,
  the windows are a millisecond shorter there;
- it keeps the metric's name through ``max_over_time``, ``min_over_time`` and comparisons of them,
  where Prometheus drops it: the reduction ties series by their target without ``__name__``;
- its cluster answers a partial result with ``"isPartial": true``, not ``warnings``: every request
  asks for a whole answer (``deny_partial_response=1``; Thanos' ``partial_response=false``) and a
  partial one is still no verdict (single-node VictoriaMetrics never answers partial data: a proxy
  in front of it says so).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from clusterhealth.fleet import analyze as analyzing
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.prometheus import IS_PARTIAL, NoVerdict, Prometheus, Windows
from tests.conftest import CLUSTERHEALTH
from tests.fabric_store import LAST, PERIOD, _serve, tool, write_history
from tests.prom import VictoriaMetrics, flagging_partial, wait_for

# Every group of the data, each with its own trap (tests/fabric_store.py).
PROBES = [
    "healthy", "hostfault", "pathfault", "fewrounds", "renamed", "unreachable", "jobfault",
    "expectation", "partial", "noise", "noisefaults",
]  # fmt: skip
WINDOW = 7200.0
HELD_BACK = "10m"


@dataclass(frozen=True)
class Stores:
    prometheus: str
    victoria: str
    shift: int  # how far the data was moved, in rounds (tests/fabric_store.py)
    samples: int  # in the document both hold
    families: list[str]  # its metric families


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    root = tmp_path_factory.mktemp("stores")
    shift = int(time.time() // PERIOD) - 2 - LAST  # the data ends a few minutes before now
    data = write_history(root, shift)
    document = (root / "data.om").read_text()
    samples = sum(1 for line in document.splitlines() if line and not line.startswith("#"))
    families = [line.split()[2] for line in document.splitlines() if line.startswith("# TYPE ")]
    process, prometheus = _serve(tool("prometheus"), root, data, "scrape_configs: []\n")
    victoria = VictoriaMetrics(root / "victoria-metrics", flags=[f"-search.latencyOffset={HELD_BACK}"])
    try:
        victoria.start()
        victoria.import_text(document)
        wait_for(lambda: _count(victoria.url, families) == samples, 60, "every sample imported", victoria.log)
        yield Stores(prometheus, victoria.url, shift, samples, families)
    finally:
        victoria.stop()
        process.terminate()
        process.wait(timeout=30)


def _count(url: str, families: list[str]) -> float:
    """The samples of ``families`` a store holds, asked without the reader (Prometheus refuses a
    name pattern here: the counts of two families would be one series without their names)."""
    total = 0.0
    for name in families:
        query = {"query": f"sum(count_over_time({name}[1d]))", "time": f"{time.time():.3f}", "nocache": "1"}
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(query)}") as answer:
            total += sum(float(s["value"][1]) for s in json.loads(answer.read())["data"]["result"])
    return total


def _verdict(url: str, probe: str, now: float, step: float | None = None) -> dict[str, Any] | str:
    """The JSON verdict of one group at ``now``, or why there is none."""
    try:
        return analyzing.run(url, probe, WINDOW, now=now, step=step).to_dict()
    except NoVerdict as err:
        return f"{type(err).__name__}: {err}"


def test_both_stores_hold_the_same_samples(stores: Stores) -> None:
    assert len(stores.families) >= 6
    assert (
        _count(stores.prometheus, stores.families)
        == _count(stores.victoria, stores.families)
        == stores.samples
    )


def test_every_group_has_the_same_verdict_as_read_from_prometheus(stores: Stores) -> None:
    now = time.time()
    verdicts = {probe: _verdict(stores.prometheus, probe, now) for probe in PROBES}
    # Each group's trap is still there: suspects, no suspect, too few rounds, partial data.
    faults = verdicts["noisefaults"]
    assert isinstance(faults, dict) and {(s["kind"], s["suspect"]) for s in faults["suspects"]} >= {
        ("host", "h3")
    }
    assert isinstance(verdicts["fewrounds"], dict) and verdicts["fewrounds"]["not_enough_evidence"]
    assert str(verdicts["partial"]).startswith("Partial: partial data")
    for probe in PROBES:
        assert _verdict(stores.victoria, probe, now) == verdicts[probe], probe


def _without_times(document: Any) -> Any:
    """A verdict without its evidence's times: two commands read at two different nows."""
    if isinstance(document, dict):
        return {k: _without_times(v) for k, v in document.items() if k not in ("first_seen", "last_seen")}
    if isinstance(document, list):
        return [_without_times(v) for v in document]
    return document


def _command(name: str, url: str, *args: str) -> tuple[int, Any]:
    done = subprocess.run(
        [CLUSTERHEALTH, name, "--prometheus", url, "--window", "2h", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_analyze_names_the_same_suspects_through_victoriametrics(stores: Stores) -> None:
    code, read = _command("analyze", stores.victoria, "--probe", "noisefaults")
    assert code == 1
    assert ("host", "h3") in {(s["kind"], s["suspect"]) for s in read["suspects"]}
    assert (code, _without_times(read)) == (
        1,
        _without_times(_command("analyze", stores.prometheus, "--probe", "noisefaults")[1]),
    )


def test_model_reads_the_same_meetings_through_victoriametrics(stores: Stores) -> None:
    args = ("--params", "7B", "--bytes-per-param", "2", "--gpus", "64", "--compute-seconds", "1")
    args += ("--probe", "hostfault", "--node", "h3")
    code, read = _command("model", stores.victoria, *args)
    assert code == 0 and 0.45 <= read["bandwidth_ratio"] <= 0.55
    assert read["measured"].pop("prometheus") == stores.victoria
    _, expected = _command("model", stores.prometheus, *args)
    assert expected["measured"].pop("prometheus") == stores.prometheus
    assert _without_times(read) == _without_times(expected)


def test_a_sample_on_the_edge_between_two_windows_is_read_in_one_of_them(stores: Stores) -> None:
    # The windows end on scrapes (scrapes fall 7 s after every 15 s of a round; a round's last is at
    # 112 s): a sample on the edge between two windows. Prometheus 2.42 puts it in both; the
    # window after a round's last scrape then holds the round before's number too and is left out,
    # and a result seen first there is dated a window later than through VictoriaMetrics.
    assert Prometheus(stores.prometheus).holds_left_edge(time.time())
    assert not Prometheus(stores.victoria).holds_left_edge(time.time())
    now = (LAST + stores.shift + 2) * PERIOD - 8
    for step in (60.0, 45.0):
        for probe in ("hostfault", "pathfault", "noisefaults"):
            read = _verdict(stores.prometheus, probe, now, step)
            assert isinstance(read, dict) and read["suspects"], (probe, step)
            assert _verdict(stores.victoria, probe, now, step) == read, (probe, step)


def _points(url: str, promql: str, start: float, end: float, step: float, **extra: str) -> list[Any]:
    query = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}", **extra}
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{urllib.parse.urlencode(query)}") as answer:
        (series,) = json.loads(answer.read())["data"]["result"]
    return list(series["values"])


H1 = 'clusterhealth_probe_round{instance="h1:9845",probe="hostfault"}'


def test_victoriametrics_moves_a_long_range_query_onto_its_step_unless_asked_not_to(stores: Stores) -> None:
    # 60 windows of a minute over the data's last hour, ending at a time that is no multiple of a
    # minute.
    end = (LAST + stores.shift + 1) * PERIOD - 2.75
    promql = f"max_over_time({H1}[60s])"
    moved = _points(stores.victoria, promql, end - 59 * 60, end, 60)
    assert moved[0][0] % 60 == 0, "VictoriaMetrics' own grid"
    asked = _points(stores.victoria, promql, end - 59 * 60, end, 60, nocache="1")
    assert [t for t, _ in asked] == [end - (59 - i) * 60 for i in range(60)]
    # The reader's windows are where it asked for them, whatever the store.
    windows = Windows(end, 60, 60).read(Prometheus(stores.victoria), promql)
    assert sorted(t for series in windows for t, _ in series["values"]) == [t for t, _ in asked]
    # Narrower windows, asked a few at a time (per_query), each in one of three queries a minute
    # apart: every window once.
    narrow = Windows(end, 25, 13).read(Prometheus(stores.victoria), f"max_over_time({H1}[25s])", 5)
    assert sorted(t for series in narrow for t, _ in series["values"]) == [
        end - (12 - i) * 25 for i in range(13)
    ]


def test_the_rounds_victoriametrics_holds_back_are_read_as_prometheus_reads_them(stores: Stores) -> None:
    # Asked with a step under a minute, VictoriaMetrics answers its newest 10 minutes (here; 30 s at
    # its defaults) with the point before them: the round number stops changing.
    now = time.time()
    last = (LAST + stores.shift + 1) * PERIOD  # the data's end
    asked = (f"max_over_time({H1}[30s])", last - 1200, now, 30)
    held = [v for t, v in _points(stores.victoria, *asked, nocache="1") if t > now - 600]
    assert len(held) >= 10 and len(set(held)) == 1, held
    assert len({v for t, v in _points(stores.prometheus, *asked) if t > now - 600}) > 1
    # The reader asks a minute apart: each window as it is, the last rounds' meetings all there.
    latest = [
        sorted((m.round, m.a, m.b, m.bandwidth) for m in history.meetings if m.round * PERIOD > now - 600)
        for history in (
            pairwise.read_history(Prometheus(url), "hostfault", WINDOW, now=now)
            for url in (stores.prometheus, stores.victoria)
        )
    ]
    assert latest[0] and latest[0] == latest[1]


def test_victoriametrics_keeps_the_metric_name_and_the_reduction_does_not_mind(stores: Stores) -> None:
    now = time.time()
    reduced = []
    for url in (stores.prometheus, stores.victoria):
        client = Prometheus(url)
        windows = Windows(now, 30, int(WINDOW // 30), client.holds_left_edge(now))
        rounds = f'{pairwise.ROUND}{{probe="hostfault"}}{windows.selector}'
        bandwidth = f'{pairwise.BANDWIDTH}{{probe="hostfault",peer!=""}}{windows.selector}'
        answer = windows.read(client, f"max_over_time({rounds}) == min_over_time({rounds})")
        names = {series["metric"].get("__name__") for series in answer}
        assert names == ({None} if url == stores.prometheus else {pairwise.ROUND}), names
        reduced.append(
            pairwise.reduce_series(
                "hostfault",
                node_info=client.series(pairwise.NODE_INFO, now - WINDOW, now),
                rounds=answer,
                bandwidth=windows.read(client, f"last_over_time({bandwidth})"),
                peer_success=[],
            )
        )
    assert reduced[0].reports and reduced[0].problems == []
    assert sorted(map(repr, reduced[0].reports)) == sorted(map(repr, reduced[1].reports))


@pytest.fixture
def partial_victoria(stores: Stores) -> Iterator[tuple[str, list[dict[str, list[str]]]]]:
    """VictoriaMetrics behind a proxy that says every answer is partial, as its cluster does
    (``"isPartial": true`` beside the data, no ``warnings``), and records what it was asked."""
    asked: list[dict[str, list[str]]] = []
    with flagging_partial(stores.victoria, asked) as url:
        yield url, asked


def test_a_partial_answer_is_no_verdict_and_every_request_asks_for_a_whole_one(
    partial_victoria: tuple[str, list[dict[str, list[str]]]],
) -> None:
    url, asked = partial_victoria
    code, answer = _command("analyze", url, "--probe", "hostfault")
    assert code == 3 and answer["partial"] is True and "isPartial" in answer["error"]
    code, result = _command("analyze", url, "--probe", "hostfault", "--allow-partial")
    assert code == 1 and [s["suspect"] for s in result["suspects"]] == ["h3"]
    assert result["partial"] is True
    assert result["problems"] == [f"Prometheus answered with partial data: {IS_PARTIAL}"]
    assert len(asked) > 10
    for params in asked:
        assert params["nocache"] == ["1"], params
        assert params["deny_partial_response"] == ["1"] and params["partial_response"] == ["false"], params
