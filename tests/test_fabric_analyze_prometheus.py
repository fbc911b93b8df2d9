"""`clusterhealth analyze` against a real Prometheus holding simulated groups' results.

The results are what agents would have exported (checks/fabric/simulation.py plays the real
schedule), written as OpenMetrics, backfilled with `promtool tsdb create-blocks-from openmetrics`
into a fresh data directory, and served by the Debian `prometheus` on a free port. Backfilled
data carries no staleness markers, which real scraping writes when a series disappears (so that
a partner's result is never read beside the next round's number); the test server's lookback is
the scrape interval, so that a dropped series ends there as it would and every step still finds
the latest scrape (a shorter lookback leaves a gap in which a whole query, its steps all at one
phase of the scrape grid, finds nothing).
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterhealth.checks.fabric import simulation as sim
from tests.conftest import CLUSTERHEALTH

PERIOD = 120.0
SCRAPE = 15.0
N = 8


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make test` installs the Debian prometheus package")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group(
    probe: str,
    first: int,
    count: int,
    fault_from: int,
    bad_hosts: dict[str, float] | None = None,
    bad_paths: dict[frozenset[str], float] | None = None,
    node_info: bool = True,
) -> dict[str, list[str]]:
    nodes = sim.node_names(N)
    fleet = sim.Fleet(nodes, seed=probe, period=PERIOD, p_busy=0)
    group = sim.Group(fleet, random.Random(3))
    rounds = []
    for r in range(first, first + count):
        if r == fault_from:
            fleet.bad_hosts.update(bad_hosts or {})
            fleet.bad_paths.update(bad_paths or {})
        rounds.append(group.play(r))
    return sim.exposition_history(probe, rounds, PERIOD, nodes, scrape_interval=SCRAPE, node_info=node_info)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    promtool, server = _tool("promtool"), _tool("prometheus")
    root = tmp_path_factory.mktemp("prometheus")
    count = 30
    last = int(time.time() // PERIOD) - 2  # the data ends a few minutes before now
    first = last - count + 1
    families: dict[str, list[str]] = {}

    def add(part: dict[str, list[str]]) -> None:
        for name, lines in part.items():
            families.setdefault(name, []).extend(lines)

    add(_group("healthy", first, count, fault_from=last + 1))
    add(_group("hostfault", first, count, fault_from=last - 2, bad_hosts={"h3": 0.5}))
    # The bad path starts the round before h2 and h5 meet, so their meeting and its confirmation
    # fall in the data.
    schedule = sim.Group(sim.Fleet(sim.node_names(N), seed="pathfault"), random.Random(0)).schedule
    met = sim.meeting_round(schedule, "h2", "h5", last - 10)  # at most last - 4: room to confirm
    add(_group("pathfault", first, count, fault_from=met, bad_paths={sim.path("h2", "h5"): 0.5}))
    add(_group("fewrounds", last - 1, 2, fault_from=last + 1))
    partial = _group("partial", first, count, fault_from=last + 1)
    add(partial)
    # One more agent of the "partial" group whose node_info Prometheus never got.
    stray = _group("partial", first, count, fault_from=last + 1, node_info=False)
    for name, lines in stray.items():
        families.setdefault(name, []).extend(
            line.replace('instance="h1:9845"', 'instance="stray:9845"') for line in lines if "h1:9845" in line
        )
    source = root / "data.om"
    source.write_text(sim.openmetrics(families))
    data = root / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
    )
    config = root / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    port = _free_port()
    process = subprocess.Popen(
        [
            server,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
            f"--query.lookback-delta={int(SCRAPE)}s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"prometheus did not become ready: {(root / 'prometheus.log').read_text()[-2000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLUSTERHEALTH, "analyze", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _json(url: str, probe: str, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = _analyze("--prometheus", url, "--probe", probe, "--window", "2h", "--json", *extra)
    return done.returncode, json.loads(done.stdout)


def test_bad_host_is_named(prometheus: str) -> None:
    code, result = _json(prometheus, "hostfault")
    assert code == 1
    assert [(s["kind"], s["suspect"], s["hosts"]) for s in result["suspects"]] == [("host", "h3", ["h3"])]
    assert result["probe"] == "hostfault" and result["nodes"] == N and result["rounds"] == 30
    assert result["window_seconds"] == 7200
    evidence = result["suspects"][0]["evidence"]
    assert len(evidence["partners"]) == 3 and evidence["ongoing"]


def test_bad_path_is_named_as_a_path(prometheus: str) -> None:
    code, result = _json(prometheus, "pathfault")
    assert code == 1
    assert [(s["kind"], s["suspect"]) for s in result["suspects"]] == [("path", "h2<->h5")]
    rounds = result["suspects"][0]["evidence"]["rounds"]
    assert len(rounds) >= 2 and rounds[1] == rounds[0] + 1, "a meeting and its confirmation"


def test_healthy_group_has_no_suspect_and_prints_a_table(prometheus: str) -> None:
    code, result = _json(prometheus, "healthy")
    assert code == 0 and result["suspects"] == []
    table = _analyze("--prometheus", prometheus, "--probe", "healthy", "--window", "2h")
    assert table.returncode == 0
    assert table.stdout.startswith(f"probe healthy: {N} nodes, 30 rounds")
    assert "no suspect" in table.stdout


def test_host_table_names_the_suspect(prometheus: str) -> None:
    table = _analyze("--prometheus", prometheus, "--probe", "hostfault", "--window", "2h")
    assert table.returncode == 1
    lines = table.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("SUSPECT"))
    suspect, kind, ratio = lines[header + 1].split()[:3]
    assert (suspect, kind) == ("h3", "host") and 0.45 <= float(ratio) <= 0.55


def test_too_few_rounds_is_not_enough_evidence(prometheus: str) -> None:
    code, result = _json(prometheus, "fewrounds")
    assert code == 3
    assert result["suspects"] == [] and "2 rounds" in result["not_enough_evidence"]


def test_partial_data_is_named_and_can_be_analysed_anyway(prometheus: str) -> None:
    done = _analyze("--prometheus", prometheus, "--probe", "partial", "--window", "2h")
    assert done.returncode == 3
    assert "partial data" in done.stderr and 'instance="stray:9845"' in done.stderr
    assert "no clusterhealth_node_info" in done.stderr
    code, result = _json(prometheus, "partial", "--allow-partial")
    assert code == 0 and result["suspects"] == [] and len(result["problems"]) == 1


def test_several_groups_need_a_probe_name(prometheus: str) -> None:
    done = _analyze("--prometheus", prometheus, "--window", "2h")
    assert done.returncode == 3 and "choose one with --probe" in done.stderr


def test_unknown_group_has_no_data(prometheus: str) -> None:
    done = _analyze("--prometheus", prometheus, "--probe", "nosuch", "--window", "2h")
    assert done.returncode == 3 and "no results of probe nosuch" in done.stderr


def test_prometheus_down() -> None:
    port = _free_port()  # nothing listens there
    done = _analyze("--prometheus", f"http://127.0.0.1:{port}", "--probe", "fabric", "--json")
    assert done.returncode == 3
    assert "cannot reach Prometheus" in done.stderr and "Connection refused" in done.stderr
    assert "cannot reach Prometheus" in json.loads(done.stdout)["error"]


def test_empty_prometheus(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    port = _free_port()
    process = subprocess.Popen(
        [
            _tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        done = _analyze("--prometheus", url)
        assert done.returncode == 3
        assert "no pairwise probe results (clusterhealth_probe_round)" in done.stderr
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_bad_arguments_exit_2() -> None:
    assert _analyze("--prometheus", "http://127.0.0.1:9", "--window", "soon").returncode == 2
    assert _analyze("--prometheus", "127.0.0.1:9090").returncode == 2
    assert _analyze("--prometheus", "http://127.0.0.1:9", "--probe", 'x"}').returncode == 2
