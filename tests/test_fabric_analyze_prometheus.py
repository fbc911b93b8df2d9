"""`clusterhealth analyze` against a real Prometheus holding simulated groups' results.

The results are what agents would have exported, backfilled into the Debian `prometheus`
(tests/fabric_store.py, built once a session and shared with tests/test_report.py). Backfilled
data carries no staleness markers (nor do series that vanished while Prometheus was down,
federated copies or some remote stores): an evaluated range query would show a partner's result
again beside the next round's number, one meeting counted twice. `analyze` reads samples as
scraped, so every meeting counts once.

Two groups are trees (8 leaves of 8, their members placed): a bad uplink and a host, a bad leaf and
a path inside another leaf, each named as its kind as in-process, with the places (and the NVLink
domains of `clusterhealth_gpu_info`) read back.

Beside the groups, `clusterhealth_gpu_job_info` names the jobs on the nodes of one of them, as
Prometheus stores it (the workload's `job` as `exported_job`, empty labels absent), so that each
suspect's `impact` is priced for those jobs; `clusterhealth model --prometheus` reads the same
history for a node's or a path's measured bandwidth.

A second Prometheus serves a copy of the same blocks with a remote store that does not answer:
its answers carry `warnings` (partial data). A third asks its dead remote store for the jobs'
series alone (`required_matchers`), so that only the jobs' query answers with a warning. A proxy in
front of the first adds `"isPartial": true` to every answer, as VictoriaMetrics' cluster and some
Thanos set-ups say a partial answer.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterhealth.checks.fabric import analysis, topology
from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.checks.fabric.schedule import RoundTiming
from clusterhealth.checks.fabric.topology import Placement
from clusterhealth.fleet import analyze as analyzing
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.prometheus import IS_PARTIAL, Prometheus
from tests.conftest import CLUSTERHEALTH
from tests.fabric_store import (
    COUNT,
    EXPECTATION,
    LAST,
    NOISY,
    PERIOD,
    PLAYED,
    SHIFT,
    TREE,
    TREE_PATH,
    N,
    Servers,
    free_port,
    tool,
    tree_names,
)
from tests.prom import flagging_partial


@pytest.fixture(scope="module")
def servers(fabric_store: Servers) -> Servers:
    return fabric_store


@pytest.fixture(scope="module")
def prometheus(servers: Servers) -> str:
    return servers.url


def _unconfirmed_singles(rounds: list[sim.Round]) -> int:
    """Short regular meetings whose pair did not meet again in the next round: an evaluated range
    query would show each again beside the next round's number, a second short meeting."""
    confirmed = {
        (m.round, frozenset((m.server, m.client))) for rnd in rounds for m in rnd.meetings if m.confirming
    }
    return sum(
        1
        for rnd in rounds[:-1]
        for m in rnd.meetings
        if m.short and not m.confirming and (m.round + 1, frozenset((m.server, m.client))) not in confirmed
    )


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


def test_a_node_nobody_can_reach_is_named_from_its_failed_runs(prometheus: str) -> None:
    code, result = _json(prometheus, "unreachable")
    assert code == 1
    assert [(s["kind"], s["suspect"]) for s in result["suspects"]] == [("host", "h4")]
    evidence = result["suspects"][0]["evidence"]
    assert {m["result"] for m in evidence["meetings"]} == {"failed"} and len(evidence["partners"]) >= 3


def test_an_agent_renamed_in_the_window_has_each_result_under_the_name_it_had(prometheus: str) -> None:
    code, result = _json(prometheus, "renamed")
    assert (code, result["suspects"]) == (0, [])
    # h1, and h1b from halfway. Its partners still call it h1, so from halfway each of its
    # meetings is read twice, once under each name; before, once.
    assert result["nodes"] == N + 1
    half = LAST - COUNT // 2 + 1
    renamed = sum(
        1
        for rnd in PLAYED["renamed"]
        if rnd.round >= half
        for m in rnd.meetings
        if "h1" in (m.server, m.client)
    )
    assert result["meetings"] == _played("renamed") + renamed


def _confirming_result_read(
    timing: RoundTiming, width: float, scrape: float, scrape_phase: float, grid_phase: float
) -> bool:
    """Whether a window of the reading grid gives round 0's confirming result: one whose samples of
    the node's round all say 0 and one of which carries the result. Round 0 is [0, period); the
    result is exported from the confirming slot's deadline (its runs took all their time) to the
    round's end; the node is scraped every ``scrape`` seconds."""
    period = timing.period
    exported = timing.confirm_start + timing.slot_deadline(confirming=True)
    first = scrape_phase - scrape * math.ceil((width + scrape_phase) / scrape)
    samples = [first + k * scrape for k in range(math.ceil((period + 2 * width - first) / scrape) + 1)]
    # The windows that can hold the result end after it is exported, before the next round's end.
    end = grid_phase + width * math.floor((exported - grid_phase) / width)
    while end < period + width:
        inside = [t for t in samples if end - width < t <= end]
        if inside and all(0 <= t < period for t in inside) and any(t >= exported for t in inside):
            return True
        end += width
    return False


@pytest.mark.parametrize("period", [900.0, 3600.0])
def test_the_reading_windows_are_narrow_enough_to_catch_the_confirming_result(period: float) -> None:
    # The default group (900 s rounds, runs of up to 30 s, three confirming runs) scraped every
    # minute, Prometheus's default: whatever the phase of the scrapes and of the windows, the
    # confirming meeting's result, exported for the last 335 s of its round, is read. (Windows as
    # wide as the larger bound, 330 s, miss it at some phases.)
    timing = RoundTiming(period, 30.0, skew=5.0, startup=2.0, confirm_runs=3)
    assert timing.problem() is None
    width = pairwise.window_width(period)
    for scrape_phase in range(60):
        for grid_phase in range(int(width) + 1):
            assert _confirming_result_read(timing, width, 60.0, scrape_phase, grid_phase), (
                scrape_phase,
                grid_phase,
            )


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
    assert result["partial"] is True


def _played(probe: str) -> int:
    return sum(len(rnd.meetings) for rnd in PLAYED[probe])


def test_single_short_runs_on_many_nodes_name_nobody(prometheus: str) -> None:
    # What makes the data hard: short meetings that were not played again in the next round. Read
    # through Prometheus's lookback, each of them would be a second short meeting of its pair, a
    # path "confirmed" by itself.
    assert _unconfirmed_singles(PLAYED["noise"]) >= 10
    code, result = _json(prometheus, "noise")
    assert (code, result["suspects"]) == (0, []), result["suspects"]
    assert result["nodes"] == NOISY and result["rounds"] == 30
    # Every meeting played is read, once: none carried into the next round, none lost.
    assert result["meetings"] == _played("noise")
    # Windows of four scrapes each (as at the default period, 225 s against a 15 s scrape), each
    # round's end in the middle of one: that window holds the end of one round's results and the
    # next round's number; it is left out, never read as a meeting of the next round. (Some results
    # shorter than a window are missed at this width: fewer meetings, never more.)
    ends = (LAST + SHIFT[0] + 1) * PERIOD + 30
    wide = analyzing.run(prometheus, "noise", 7200, step=60, now=ends)
    assert wide.suspects == [], wide.suspects
    assert 0.9 * _played("noise") <= wide.meetings <= _played("noise")


def test_the_same_noise_with_a_bad_host_and_a_confirmed_path_names_exactly_those(prometheus: str) -> None:
    rounds = PLAYED["noisefaults"]
    path = next(
        frozenset((m.server, m.client))
        for rnd in rounds
        for m in rnd.meetings
        if m.confirming and m.short and "h2" in (m.server, m.client)
    )
    assert _unconfirmed_singles(rounds) >= 10
    code, result = _json(prometheus, "noisefaults")
    assert code == 1
    named = {(s["kind"], s["suspect"]) for s in result["suspects"]}
    assert named == {("host", "h3"), ("path", "<->".join(sorted(path)))}
    assert result["meetings"] == _played("noisefaults")
    host = next(s for s in result["suspects"] if s["kind"] == "host")
    assert 0.45 <= host["evidence"]["median_ratio"] <= 0.55
    assert result["fleet"]["slowdown"] is False


def _in_process(probe: str) -> set[tuple[str, str]]:
    """The verdict on a group's played rounds, analysed without Prometheus (by exported names)."""
    meetings = analysis.merge(sim.reports(PLAYED[probe], PERIOD))
    judged = analysis.analyze(probe, meetings, window_seconds=COUNT * PERIOD, leaves=TREE)
    return {(s.kind, tree_names(s.name)) for s in judged.suspects}


def test_a_bad_uplink_and_a_bad_host_in_the_tree_are_named_as_such(prometheus: str) -> None:
    code, result = _json(prometheus, "treeuplink")
    assert code == 1
    named = {(s["kind"], s["suspect"]) for s in result["suspects"]}
    assert named == {("uplink", "leaf3"), ("host", "t45")} == _in_process("treeuplink")
    assert _unconfirmed_singles(PLAYED["treeuplink"]) >= 5, "the store's lookback would make paths of them"
    assert result["meetings"] == _played("treeuplink")
    uplink = next(s for s in result["suspects"] if s["kind"] == "uplink")
    assert uplink["hosts"] == [f"t{i}" for i in range(17, 25)] == result["leaves"]["leaf3"]
    assert set(result["leaves"]) == {f"leaf{i}" for i in range(1, 9)}
    evidence = uplink["evidence"]
    assert 0.45 <= evidence["median_ratio"] <= 0.55 and evidence["ongoing"]
    assert evidence["inside"]["fine"] > evidence["inside"]["short"]
    assert 0.45 <= uplink["impact"]["bandwidth_ratio"] <= 0.55
    table = _analyze("--prometheus", prometheus, "--probe", "treeuplink", "--window", "2h").stdout
    row = next(line for line in table.splitlines() if line.startswith("leaf3 "))
    assert row.split()[1] == "uplink" and "8 hosts (t17, t18, ...): fine inside" in row


def test_a_bad_leaf_and_a_path_inside_another_leaf_are_named_as_such(prometheus: str) -> None:
    code, result = _json(prometheus, "treeleaf")
    assert code == 1
    path = "<->".join(sorted(tree_names(n) for n in TREE_PATH[0]))
    named = {(s["kind"], s["suspect"]) for s in result["suspects"]}
    assert named == {("leaf", "leaf5"), ("path", path)} == _in_process("treeleaf")
    leaf = next(s for s in result["suspects"] if s["kind"] == "leaf")
    assert leaf["evidence"]["inside"]["short"] > leaf["evidence"]["inside"]["fine"]


def test_the_places_are_read_back_with_the_nvlink_domain(prometheus: str) -> None:
    history = pairwise.read_history(Prometheus(prometheus), "treeuplink", 7200)
    assert history.placement["t1"] == Placement(leaf="leaf1", nvlink_domain="rack-1")
    assert history.placement["t64"] == Placement(leaf="leaf8", nvlink_domain="rack-4")
    assert len(history.placement) == 64
    order = topology.ordered(sorted(history.nodes), history.placement)
    assert order[:9] == [f"t{i}" for i in range(1, 10)], "by leaf, then t2 before t10"
    # As the report groups them: (leaf,) per node.
    assert topology.outermost_first(history.placement)["t9"] == ("leaf2",)
    # A group without places: none read, nothing by leaf.
    flat = pairwise.read_history(Prometheus(prometheus), "noise", 7200)
    assert flat.placement == {} and pairwise.judge(flat).leaves == {}


def test_an_answer_with_warnings_gives_no_confident_verdict(servers: Servers) -> None:
    # A remote store that did not answer: Prometheus returns what it has, with a warning.
    done = _analyze("--prometheus", servers.partial, "--probe", "hostfault", "--window", "2h", "--json")
    assert done.returncode == 3, done.stdout
    answer = json.loads(done.stdout)
    assert answer["partial"] is True and "suspects" not in answer
    assert "partial data" in answer["error"] and "remote_read" in answer["error"]
    assert "--allow-partial" in done.stderr
    # Analysed anyway on request: the verdict says it stands on partial data, in JSON and table.
    code, result = _json(servers.partial, "hostfault", "--allow-partial")
    assert code == 1 and [s["suspect"] for s in result["suspects"]] == ["h3"]
    assert result["partial"] is True
    assert [p for p in result["problems"] if p.startswith("Prometheus answered with partial data")]
    table = _analyze(
        "--prometheus", servers.partial, "--probe", "hostfault", "--window", "2h", "--allow-partial"
    )
    assert "PARTIAL DATA" in table.stdout and "remote_read" in table.stdout
    # The same data without the warning is a whole verdict.
    code, whole = _json(servers.url, "hostfault")
    assert code == 1 and whole["partial"] is False and whole["problems"] == []


def test_a_partial_answer_to_the_jobs_query_alone_is_partial_data(servers: Servers) -> None:
    # There the history's own queries are whole: read without the jobs, nothing is missing.
    history = pairwise.read_history(Prometheus(servers.jobs_partial), "jobfault", 7200, jobs=False)
    assert history.meetings and history.warnings == [] and not history.partial
    # The jobs' query (clusterhealth_gpu_job_info) asks the store that does not answer: the jobs
    # priced may be missing some, so there is no verdict on it, as on any other partial answer.
    done = _analyze("--prometheus", servers.jobs_partial, "--probe", "jobfault", "--window", "2h", "--json")
    assert done.returncode == 3, done.stdout
    answer = json.loads(done.stdout)
    assert answer["partial"] is True and "suspects" not in answer
    assert "partial data" in answer["error"] and "remote_read" in answer["error"]
    code, result = _json(servers.jobs_partial, "jobfault", "--allow-partial")
    assert code == 1 and [s["suspect"] for s in result["suspects"]] == ["jobs-h3"]
    assert result["partial"] is True
    (problem,) = result["problems"]
    assert problem.startswith("Prometheus answered with partial data") and "remote_read" in problem


@pytest.fixture
def is_partial(servers: Servers) -> Iterator[str]:
    """The first Prometheus behind a proxy that says every answer is partial as VictoriaMetrics'
    cluster does: ``"isPartial": true`` beside the data, no ``warnings``."""
    with flagging_partial(servers.url) as url:
        yield url


def test_an_answer_flagged_is_partial_gives_no_confident_verdict(is_partial: str) -> None:
    done = _analyze("--prometheus", is_partial, "--probe", "hostfault", "--window", "2h", "--json")
    assert done.returncode == 3, done.stdout
    answer = json.loads(done.stdout)
    assert answer["partial"] is True and "isPartial" in answer["error"]
    code, result = _json(is_partial, "hostfault", "--allow-partial")
    assert code == 1 and [s["suspect"] for s in result["suspects"]] == ["h3"]
    assert result["partial"] is True
    assert result["problems"] == [f"Prometheus answered with partial data: {IS_PARTIAL}"]


def test_several_groups_need_a_probe_name(prometheus: str) -> None:
    done = _analyze("--prometheus", prometheus, "--window", "2h")
    assert done.returncode == 3 and "choose one with --probe" in done.stderr


def test_unknown_group_has_no_data(prometheus: str) -> None:
    done = _analyze("--prometheus", prometheus, "--probe", "nosuch", "--window", "2h")
    assert done.returncode == 3 and "no results of probe nosuch" in done.stderr


def test_prometheus_down() -> None:
    port = free_port()  # nothing listens there
    done = _analyze("--prometheus", f"http://127.0.0.1:{port}", "--probe", "fabric", "--json")
    assert done.returncode == 3
    assert "cannot reach Prometheus" in done.stderr and "Connection refused" in done.stderr
    assert "cannot reach Prometheus" in json.loads(done.stdout)["error"]


def test_empty_prometheus(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    port = free_port()
    process = subprocess.Popen(
        [
            tool("prometheus"),
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


# --- impact: the price of a suspect --------------------------------------------------------------
#
# The contract's formula, written out again here: S = 7e9 × 2 bytes, a ring over g GPUs at the
# reference B takes M_ref = 2(g−1)/g · S/B, through the suspect M_ref/r; step = 1 s + M.

S = 7e9 * 2


def _price(r: float, reference: float, gpus: int = 64) -> tuple[float, float]:
    m_ref = 2 * (gpus - 1) / gpus * S / reference
    step = (1 + m_ref / r) / (1 + m_ref)
    return step, gpus * 24 * (1 - 1 / step)


def test_the_bad_host_and_the_bad_path_carry_their_price(prometheus: str) -> None:
    for probe, suspect in (("hostfault", "h3"), ("pathfault", "h2<->h5")):
        code, result = _json(prometheus, probe)
        assert code == 1
        (named,) = result["suspects"]
        assert named["suspect"] == suspect
        impact = named["impact"]
        r = impact["bandwidth_ratio"]
        assert 0.45 <= r <= 0.55, "shaped to half, ±5 % jitter"
        assert r == pytest.approx(named["evidence"]["median_ratio"], abs=0.0005)
        assert impact["allreduce_slowdown"] == pytest.approx(1 / r)
        reference = result["reference_bandwidth_bytes_per_second"]
        assert impact["reference_bandwidth_bytes_per_second"] == reference
        assert 0.95 * 1.25e9 <= reference <= 1.05 * 1.25e9
        step, lost = _price(r, reference)
        assert impact["step_slowdown"] == pytest.approx(step, rel=1e-9)
        assert impact["gpu_hours_per_day"] == pytest.approx(lost, rel=1e-9)
        assert impact["workload"] == {
            "params": 7e9,
            "bytes_per_param": 2,
            "gpus": 64,
            "compute_seconds": 1.0,
            "overlap": 0.0,
        }
        assert "jobs" not in impact, "no job runs on these nodes"
    assert result["fleet"]["impact"] is None, "no fleet-wide slowdown"


def test_the_stated_workload_comes_from_the_flags(prometheus: str) -> None:
    code, result = _json(
        prometheus, "hostfault", "--params", "70B", "--bytes-per-param", "4", "--gpus", "8",
        "--compute-seconds", "30", "--overlap", "0.5",
    )  # fmt: skip
    assert code == 1
    impact = result["suspects"][0]["impact"]
    assert impact["workload"] == {
        "params": 70e9,
        "bytes_per_param": 4,
        "gpus": 8,
        "compute_seconds": 30.0,
        "overlap": 0.5,
    }
    # 280e9 bytes over 8 GPUs at B: M_ref = 1.75 · 280e9 / B; step = 30 + M − 0.5·min(30, M).
    r, reference = impact["bandwidth_ratio"], result["reference_bandwidth_bytes_per_second"]
    m_ref = 1.75 * 280e9 / reference

    def step(m: float) -> float:
        return 30 + m - 0.5 * min(30, m)

    assert impact["step_slowdown"] == pytest.approx(step(m_ref / r) / step(m_ref), rel=1e-9)
    assert impact["gpu_hours_per_day"] == pytest.approx(
        8 * 24 * (1 - step(m_ref) / step(m_ref / r)), rel=1e-9
    )
    assert _analyze("--prometheus", prometheus, "--probe", "hostfault", "--overlap", "2").returncode == 2
    assert _analyze("--prometheus", prometheus, "--probe", "hostfault", "--params", "many").returncode == 2


def test_the_jobs_on_the_suspect_are_priced_with_their_own_gpus(prometheus: str) -> None:
    code, result = _json(prometheus, "jobfault")
    assert code == 1
    (host,) = result["suspects"]
    assert host["suspect"] == "jobs-h3"
    impact = host["impact"]
    r, reference = impact["bandwidth_ratio"], result["reference_bandwidth_bytes_per_second"]
    assert 0.45 <= r <= 0.55
    # Job 4242 with all its 16 GPUs (jobs-h3, jobs-h6, jobs-h7), the pod with its 4; not job 77
    # (jobs-h1 only), nor job 13, which ended half an hour ago.
    step_16, lost_16 = _price(r, reference, 16)
    step_4, lost_4 = _price(r, reference, 4)
    assert impact["jobs"] == [
        {
            "scheduler": "slurm",
            "job": "4242",
            "namespace": "",
            "pod": "",
            "gpus": 16,
            "step_slowdown": pytest.approx(step_16, rel=1e-9),
            "gpu_hours_per_day": pytest.approx(lost_16, rel=1e-9),
        },
        {
            "scheduler": "kubernetes",
            "job": "",
            "namespace": "ml",
            "pod": "trainer-0",
            "gpus": 4,
            "step_slowdown": pytest.approx(step_4, rel=1e-9),
            "gpu_hours_per_day": pytest.approx(lost_4, rel=1e-9),
        },
    ]
    assert impact["gpu_hours_per_day"] == pytest.approx(lost_16 + lost_4, rel=1e-9)
    assert impact["step_slowdown"] == pytest.approx(_price(r, reference)[0], rel=1e-9)
    table = _analyze("--prometheus", prometheus, "--probe", "jobfault", "--window", "2h").stdout
    assert "jobs on jobs-h3: slurm job 4242 (16 GPUs) step x" in table
    assert "pod ml/trainer-0 (4 GPUs)" in table


def test_a_table_row_shows_the_price(prometheus: str) -> None:
    _, result = _json(prometheus, "hostfault")
    impact = result["suspects"][0]["impact"]
    table = _analyze("--prometheus", prometheus, "--probe", "hostfault", "--window", "2h").stdout
    row = next(line for line in table.splitlines() if line.startswith("h3 "))
    assert row.split()[3:5] == [f"x{impact['step_slowdown']:.2f}", f"{impact['gpu_hours_per_day']:.0f}"]
    assert "STEP: how much longer a step takes for a data-parallel job of 64 GPUs" in table


# --- clusterhealth model --prometheus --------------------------------------------------------------

WORKLOAD_ARGS = ["--params", "7B", "--bytes-per-param", "2", "--gpus", "64", "--compute-seconds", "1"]


def _model(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLUSTERHEALTH, "model", *WORKLOAD_ARGS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_model_takes_a_nodes_measured_bandwidth(prometheus: str) -> None:
    done = _model(
        "--prometheus", prometheus, "--probe", "hostfault", "--node", "h3", "--window", "2h", "--json"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    measured = doc["measured"]
    # h3's latest three meetings, all in the rounds it was bad, each with h3.
    rounds = [m["round"] - SHIFT[0] for m in measured["meetings"]]
    assert len(rounds) == 3 and min(rounds) >= LAST - 2, rounds
    assert all("h3" in m["hosts"] for m in measured["meetings"])
    bandwidth = doc["bandwidth_bytes_per_second"]
    assert bandwidth == sorted(m["bandwidth_bytes_per_second"] for m in measured["meetings"])[1]
    assert measured["bandwidth_bytes_per_second"] == bandwidth
    # Nominal: the group's reference, which analyze judges against.
    _, analyzed = _json(prometheus, "hostfault")
    reference = analyzed["reference_bandwidth_bytes_per_second"]
    assert measured["nominal_from"] == "reference"
    assert measured["reference_bandwidth_bytes_per_second"] == reference
    assert doc["nominal"]["bandwidth_bytes_per_second"] == reference
    assert 0.45 <= doc["bandwidth_ratio"] <= 0.55 and doc["bandwidth_ratio"] == pytest.approx(
        bandwidth / reference
    )
    # SPEC's keys, at the measured bandwidth; the same at the nominal one beside them.
    m, m_ref = 2 * 63 / 64 * S / bandwidth, 2 * 63 / 64 * S / reference
    assert doc["allreduce_seconds"] == pytest.approx(m) and doc["nominal"][
        "allreduce_seconds"
    ] == pytest.approx(m_ref)
    assert doc["step_seconds"] == pytest.approx(1 + m) and doc["nominal"]["step_seconds"] == pytest.approx(
        1 + m_ref
    )
    assert doc["step_slowdown"] == pytest.approx((1 + m) / (1 + m_ref))
    for key in (
        "gradient_bytes",
        "comm_compute_ratio",
        "scaling_efficiency",
        "bandwidth_for_target_bytes_per_second",
    ):
        assert key in doc and key in doc["nominal"]
    # The table puts them side by side.
    table = _model("--prometheus", prometheus, "--probe", "hostfault", "--node", "h3", "--window", "2h")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "nominal (the group's reference)" in table.stdout and "measured (h3)" in table.stdout
    step = next(line for line in lines if line.startswith("step "))
    assert step.split()[1:] == [f"{1 + m_ref:.3f}", "s", f"{1 + m:.3f}", "s"]
    assert f"x{(1 + m) / (1 + m_ref):.2f} a step" in table.stdout


def test_model_takes_a_paths_measured_bandwidth_against_a_stated_nominal(prometheus: str) -> None:
    done = _model(
        "--prometheus", prometheus, "--probe", "pathfault", "--path", "h5,h2", "--window", "2h",
        "--bandwidth", "10Gbit/s", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    measured = doc["measured"]
    assert measured["path"] == ["h2", "h5"], "named as analyze names it"
    assert [m["hosts"] for m in measured["meetings"]] == [["h2", "h5"], ["h2", "h5"]]
    rounds = [m["round"] for m in measured["meetings"]]
    assert rounds[1] == rounds[0] + 1, "the meeting and its confirmation"
    values = [m["bandwidth_bytes_per_second"] for m in measured["meetings"]]
    assert doc["bandwidth_bytes_per_second"] == pytest.approx(sum(values) / 2)
    assert (
        measured["nominal_from"] == "--bandwidth" and doc["nominal"]["bandwidth_bytes_per_second"] == 1.25e9
    )
    assert 0.45 * 1.25e9 <= doc["bandwidth_bytes_per_second"] <= 0.55 * 1.25e9


def test_model_compares_with_the_groups_reference_not_the_agents_expectation(prometheus: str) -> None:
    # The agents expect twice what the group reaches: analyze judges against the group's reference
    # (and calls the gap a fleet-wide slowdown); model's nominal is that reference too.
    code, analyzed = _json(prometheus, "expectation")
    assert code == 1 and [s["suspect"] for s in analyzed["suspects"]] == ["h3"]
    reference = analyzed["reference_bandwidth_bytes_per_second"]
    assert analyzed["expected_bandwidth_bytes_per_second"] == EXPECTATION
    assert analyzed["fleet"]["slowdown"] is True and 0.95 * 1.25e9 <= reference <= 1.05 * 1.25e9
    done = _model(
        "--prometheus", prometheus, "--probe", "expectation", "--node", "h3", "--window", "2h", "--json"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    measured = doc["measured"]
    assert measured["expected_bandwidth_bytes_per_second"] == EXPECTATION, "read, and shown"
    assert measured["nominal_from"] == "reference"
    assert doc["nominal"]["bandwidth_bytes_per_second"] == reference
    assert 0.45 <= doc["bandwidth_ratio"] <= 0.55, "h3 at half the group's pace, not a quarter"
    table = _model("--prometheus", prometheus, "--probe", "expectation", "--node", "h3", "--window", "2h")
    bandwidth = next(line for line in table.stdout.splitlines() if line.startswith("bandwidth "))
    assert f"{reference * 8 / 1e9:.1f} Gbit/s" in bandwidth and "20.0 Gbit/s" not in bandwidth


def test_model_without_such_a_node_or_without_a_subject(prometheus: str) -> None:
    done = _model("--prometheus", prometheus, "--probe", "hostfault", "--node", "h99", "--window", "2h")
    assert done.returncode == 3 and "no meeting of node h99 in probe hostfault" in done.stderr
    done = _model(
        "--prometheus", prometheus, "--probe", "hostfault", "--path", "h1,jobs-h2", "--window", "2h"
    )
    assert done.returncode == 3 and "no meeting of path h1<->jobs-h2" in done.stderr
    assert _model("--prometheus", prometheus).returncode == 2
    assert _model("--node", "h3", "--bandwidth", "1GB/s").returncode == 2
    assert _model("--prometheus", prometheus, "--path", "h2").returncode == 2
    assert _model("--prometheus", "127.0.0.1:9090", "--node", "h3").returncode == 2
    assert _model("--prometheus", prometheus, "--node", "h3", "--window", "soon").returncode == 2
