"""Simulated pairwise groups' results in a real Prometheus, as the fleet-side tests read them
(tests/test_fabric_analyze_prometheus.py, tests/test_report.py), built once a session.

The results are what agents would have exported (checks/fabric/simulation.py plays the real
schedule), written as OpenMetrics, backfilled with `promtool tsdb create-blocks-from openmetrics`
into a fresh data directory, and served by the Debian `prometheus` on a free port, with its
default lookback (5 minutes, longer than a round here). Backfilled data carries no staleness
markers (nor do series that vanished while Prometheus was down, federated copies or some remote
stores): an evaluated range query would show a partner's result again beside the next round's
number, one meeting counted twice.

The groups, by probe name: ``healthy`` (8 nodes, 1 % spurious shorts), ``clean`` (8 nodes, no
short at all), ``hostfault`` (h3 at half speed for the last 3 rounds), ``pathfault`` (h2<->h5 at
half speed from a round in which they meet), ``fewrounds`` (2 rounds), ``renamed`` (h1 renamed
h1b halfway), ``unreachable`` (h4 measures nothing for the last 4 rounds), ``jobfault`` (jobs-h3
bad, with the jobs on the nodes in ``clusterhealth_gpu_job_info``), ``expectation`` (agents
expecting twice what the group reaches, h3 bad), ``partial`` (an agent without node_info),
``noise`` (200 nodes, 2 % single shorts, 5 % busy), ``noisefaults`` (the same with a bad host h3
and a bad path confirmed by its second meeting), ``lonely`` (one node), and two trees of 8 leaves of
8 on nodes of their own, t1..t64 (``TREE``, the members placed, with the same noise):
``treeuplink`` (leaf3's uplink and the host t45 at half speed for the last 8 rounds) and
``treeleaf`` (leaf5 and a path inside leaf2 at half speed), their nodes' GPUs in
``clusterhealth_gpu_info`` with a chassis serial number (racks of 16).

A second Prometheus serves a copy of the same blocks with a remote store that does not answer:
its answers carry `warnings` (partial data). A third asks its dead remote store for the jobs'
series alone (`required_matchers`), so that only the jobs' query answers with a warning.
"""

from __future__ import annotations

import random
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterhealth.checks.fabric import simulation as sim

PERIOD = 120.0  # at most the lookback delta (300 s): a result would be read again in the next round
SCRAPE = 15.0
N = 8
NOISY = 200  # nodes of the groups with single spurious shorts


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make test` installs the Debian prometheus package")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The groups are played with these round numbers and moved to the last hour when exported, so
# that the data is the same on every run (the pairings depend on the round number).
BASE, COUNT = 1_000_000, 30
LAST = BASE + COUNT - 1
PLAYED: dict[str, list[sim.Round]] = {}  # the rounds each group played, by probe name
SHIFT: list[int] = []  # how far they were moved


def _group(
    probe: str,
    fault_from: int | None = None,
    bad_hosts: dict[str, float] | None = None,
    bad_paths: dict[frozenset[str], float] | None = None,
    *,
    first: int = BASE,
    n: int = N,
    seed: str | None = None,
    leaves: dict[str, str] | None = None,
    bad_uplinks: dict[str, float] | None = None,
    bad_leaves: dict[str, float] | None = None,
    **noise: float,
) -> list[sim.Round]:
    fleet = sim.Fleet(
        sim.node_names(n), seed=seed or probe, period=PERIOD, leaves=leaves or {}, **{"p_busy": 0.0, **noise}
    )
    group = sim.Group(fleet, random.Random(3))
    rounds = []
    for r in range(first, LAST + 1):
        if r == fault_from:
            fleet.bad_hosts.update(bad_hosts or {})
            fleet.bad_paths.update(bad_paths or {})
            fleet.bad_uplinks.update(bad_uplinks or {})
            fleet.bad_leaves.update(bad_leaves or {})
        rounds.append(group.play(r))
    PLAYED.setdefault(probe, rounds)
    return rounds


def _serve(server: str, root: Path, data: Path, config: str) -> tuple[subprocess.Popen[bytes], str]:
    (root / f"{data.name}.yml").write_text(config)
    port = free_port()
    process = subprocess.Popen(
        [
            server,
            f"--config.file={root / f'{data.name}.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(root / f"{data.name}.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.1)
    process.terminate()
    pytest.fail(f"prometheus did not become ready: {(root / f'{data.name}.log').read_text()[-2000:]}")


def write_history(root: Path, shift: int) -> Path:
    """Every group's results as the agents would have exported them, moved by ``shift`` rounds:
    the OpenMetrics document ``root / "data.om"`` and its blocks, in the directory returned
    (tests/test_fabric_analyze_victoriametrics.py imports the same document into VictoriaMetrics)."""
    promtool = tool("promtool")
    families: dict[str, list[str]] = {}

    def add(
        probe: str,
        rounds: list[sim.Round],
        n: int = N,
        node_info: bool = True,
        leaves: dict[str, str] | None = None,
    ) -> dict[str, list[str]]:
        part = sim.exposition_history(
            probe,
            sim.shifted(rounds, shift),
            PERIOD,
            sim.node_names(n),
            scrape_interval=SCRAPE,
            node_info=node_info,
            leaves=leaves,
        )
        for name, lines in part.items():
            families.setdefault(name, []).extend(lines)
        return part

    add("healthy", _group("healthy"))
    # A fleet with no fault at all, not even a single spurious short: the report's healthy picture.
    add("clean", _group("clean", p_short=0.0))
    # A group of one: its agent exports its rounds, but it has nobody to meet.
    add("lonely", _group("lonely", n=1), 1)
    add("hostfault", _group("hostfault", LAST - 2, bad_hosts={"h3": 0.5}))
    # The bad path starts the round before h2 and h5 meet, so their meeting and its confirmation
    # fall in the data.
    schedule = sim.Group(sim.Fleet(sim.node_names(N), seed="pathfault"), random.Random(0)).schedule
    met = sim.meeting_round(schedule, "h2", "h5", LAST - 10)  # at most LAST - 4: room to confirm
    add("pathfault", _group("pathfault", met, bad_paths={sim.path("h2", "h5"): 0.5}))
    add("fewrounds", _group("fewrounds", first=LAST - 1))
    # Agents of their own (instances renamed-hI), h1's renamed h1b halfway: each result goes to
    # the name the agent had then.
    renamed = sim.exposition_history(
        "renamed", sim.shifted(_group("renamed"), shift), PERIOD, sim.node_names(N), scrape_interval=SCRAPE
    )
    halfway = (LAST - COUNT // 2 + 1 + shift) * PERIOD
    for name, lines in renamed.items():
        for line in lines:
            line = line.replace('instance="h', 'instance="renamed-h')
            if float(line.rsplit(" ", 1)[1]) >= halfway:
                line = line.replace('node="h1"', 'node="h1b"')
            families.setdefault(name, []).append(line)
    # A node nobody can reach: its runs measure nothing, only peer_success 0 is exported.
    add("unreachable", _group("unreachable", LAST - 3, bad_hosts={"h4": 0.0}))
    # Nodes of their own (jobs-h1..jobs-h8, agents and names), jobs-h3 bad, with the jobs on them.
    jobs = sim.exposition_history(
        "jobfault",
        sim.shifted(_group("jobfault", LAST - 2, bad_hosts={"h3": 0.5}), shift),
        PERIOD,
        sim.node_names(N),
        scrape_interval=SCRAPE,
    )
    for name, lines in jobs.items():
        families.setdefault(name, []).extend(line.replace('"h', '"jobs-h') for line in lines)
    families[JOB_INFO] = list(_job_info(shift))
    # Agents that expect twice what the group reaches (a fleet-wide slowdown), h3 bad at the end.
    add("expectation", _group("expectation", LAST - 2, bad_hosts={"h3": 0.5}))
    families[EXPECTED] = list(_expected("expectation", shift))
    add("partial", _group("partial"))
    # One more agent of the "partial" group whose node_info Prometheus never got.
    stray = sim.exposition_history(
        "partial",
        sim.shifted(PLAYED["partial"], shift),
        PERIOD,
        sim.node_names(N),
        scrape_interval=SCRAPE,
        node_info=False,
    )
    for name, lines in stray.items():
        families.setdefault(name, []).extend(
            line.replace('instance="h1:9845"', 'instance="stray:9845"') for line in lines if "h1:9845" in line
        )
    # 200 nodes whose only faults are single short runs (2 %), some never played again in the
    # next round because an end was busy then (5 %); the same noise with a bad host and a bad path
    # confirmed by its second meeting.
    noise = {"p_short": 0.02, "p_busy": 0.05}
    add("noise", _group("noise", n=NOISY, **noise), NOISY)
    noisy = sim.Group(sim.Fleet(sim.node_names(NOISY), seed="noise"), random.Random(0)).schedule
    partner = noisy.partner("h2", LAST - 8)
    assert partner is not None
    bad_path = {sim.path("h2", partner.other("h2")): 0.5}
    faults = _group("noisefaults", LAST - 8, {"h3": 0.5}, bad_path, n=NOISY, seed="noise", **noise)
    add("noisefaults", faults, NOISY)
    # The tree: 8 leaves of 8 with the same noise, from LAST - 8 on leaf3's uplink at half and a bad
    # host on leaf6 (treeuplink), or leaf5 itself at half and a bad path inside leaf2 (treeleaf).
    # Nodes of their own (t1..t64, agents and names), whose GPUs sit in racks of 16.
    tree = {"p_short": 0.02, "p_busy": 0.05}

    def add_tree(probe: str, rounds: list[sim.Round]) -> None:
        part = sim.exposition_history(
            probe, sim.shifted(rounds, shift), PERIOD, list(TREE), scrape_interval=SCRAPE, leaves=TREE
        )
        for name, lines in part.items():
            families.setdefault(name, []).extend(tree_names(line) for line in lines)

    add_tree(
        "treeuplink",
        _group("treeuplink", LAST - 8, {"h45": 0.5}, n=64, leaves=TREE, bad_uplinks={"leaf3": 0.5}, **tree),
    )
    inside = sim.Group(sim.Fleet(list(TREE), seed="treeleaf", leaves=TREE), random.Random(0)).schedule
    at = next(r for r in (LAST - 7, LAST - 6) if inside.inside_leaves(r))
    partner = inside.partner("h9", at)  # a round inside the leaves: h9's partner is on leaf2
    assert partner is not None and TREE[partner.other("h9")] == "leaf2"
    TREE_PATH.append(sim.path("h9", partner.other("h9")))
    add_tree(
        "treeleaf",
        _group(
            "treeleaf",
            LAST - 8,
            bad_paths={TREE_PATH[0]: 0.5},
            n=64,
            leaves=TREE,
            bad_leaves={"leaf5": 0.5},
            **tree,
        ),
    )
    families[GPU_INFO] = list(_gpu_info(shift))
    source = root / "data.om"
    source.write_text(sim.openmetrics(families))
    data = root / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
    )
    return data


def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The three Prometheus servers of the module's docstring, up until the generator is closed
    (tests/conftest.py's session fixture ``fabric_store``)."""
    server = tool("prometheus")
    root = tmp_path_factory.mktemp("prometheus")
    shift = int(time.time() // PERIOD) - 2 - LAST  # the data ends a few minutes before now
    SHIFT.append(shift)
    data = write_history(root, shift)
    # The same blocks behind a remote store that refuses connections: Prometheus answers every
    # query with what it has and a warning; or, asking it for the jobs' series alone, only the
    # jobs' query.
    shutil.copytree(data, root / "partial-tsdb")
    shutil.copytree(data, root / "jobs-partial-tsdb")
    dead = f"http://127.0.0.1:{free_port()}/api/v1/read"
    remote = f"scrape_configs: []\nremote_read:\n  - url: {dead}\n    read_recent: true\n"
    served = [
        _serve(server, root, data, "global:\n  scrape_interval: 15s\nscrape_configs: []\n"),
        _serve(server, root, root / "partial-tsdb", remote),
        _serve(
            server,
            root,
            root / "jobs-partial-tsdb",
            remote + f"    required_matchers:\n      __name__: {JOB_INFO}\n",
        ),
    ]
    try:
        yield Servers(served[0][1], served[1][1], served[2][1])
    finally:
        for process, _ in served:
            process.terminate()
            process.wait(timeout=30)


TREE = sim.tree(8, 8)  # as played: h1..h64 on leaf1..leaf8; exported as t1..t64 (tree_names)
TREE_PATH: list[frozenset[str]] = []  # the bad path of treeleaf, once chosen (played names)
GPU_INFO = "clusterhealth_gpu_info"


def tree_names(text: str) -> str:
    """The tree's node names as exported (t1..t64) for the names it was played with (h1..h64)."""
    return re.sub(r"\bh(\d+)\b", r"t\1", text)


def _gpu_info(shift: int) -> Iterator[str]:
    """clusterhealth_gpu_info of the tree's nodes, eight GPUs each, with the rack-scale labels."""
    start, end = (LAST - 20 + shift) * PERIOD, (LAST + 1 + shift) * PERIOD
    for i, node in enumerate(tree_names(n) for n in TREE):
        chassis = f"rack-{i // 16 + 1}"
        for gpu in range(8):
            target = f'instance="{node}:9845",job="clusterhealth"'
            labels = (
                f'chassis_serial="{chassis}",gpu="{gpu}",name="NVIDIA GB200",slot="{i % 16}",'
                f'tray="{i % 16}",uuid="GPU-{node}-{gpu}"'
            )
            t = start + 7
            while t < end:
                yield f"{GPU_INFO}{{{target},{labels}}} 1 {t:.3f}"
                t += SCRAPE


JOB_INFO = "clusterhealth_gpu_job_info"
# (node, GPUs, labels): job 4242 runs on jobs-h3, jobs-h6 and jobs-h7 (16 GPUs), a pod on jobs-h3's
# other four GPUs, job 77 on jobs-h1 alone; job 13 ran on jobs-h3 until half an hour before the end.
JOBS = [
    ("jobs-h3", range(4), 'exported_job="4242",scheduler="slurm",source="mapping_dir"'),
    ("jobs-h6", range(4), 'exported_job="4242",scheduler="slurm",source="mapping_dir"'),
    ("jobs-h7", range(8), 'exported_job="4242",scheduler="slurm",source="mapping_dir"'),
    (
        "jobs-h3",
        range(4, 8),
        'container="trainer",namespace="ml",pod="trainer-0",scheduler="kubernetes",source="pod_resources"',
    ),
    ("jobs-h1", range(8), 'exported_job="77",scheduler="slurm",source="cgroup"'),
]
ENDED = ("jobs-h3", range(4), 'exported_job="13",scheduler="slurm",source="mapping_dir"')


def _job_info(shift: int) -> Iterator[str]:
    """The jobs' series as scraped over the last twenty rounds and up to now (the job that ended, up
    to half an hour before the data's end)."""
    start, end = (LAST - 20 + shift) * PERIOD, (LAST + 2 + shift) * PERIOD
    for (node, gpus, labels), until in [*((job, end) for job in JOBS), (ENDED, end - 1800)]:
        for gpu in gpus:
            target = f'instance="{node}:9845",job="clusterhealth"'
            series = f'{JOB_INFO}{{{target},gpu="{gpu}",uuid="GPU-{node}-{gpu}",{labels}}}'
            t = start + 7
            while t < until:
                yield f"{series} 1 {t:.3f}"
                t += SCRAPE


EXPECTED = "clusterhealth_probe_expected_bandwidth_bytes_per_second"
EXPECTATION = 2.5e9  # bytes/s: twice the 10 Gbit/s the simulated links reach


def _expected(probe: str, shift: int) -> Iterator[str]:
    """Every agent's expectation for the group, as scraped over its last twenty rounds."""
    start, end = (LAST - 20 + shift) * PERIOD, (LAST + 1 + shift) * PERIOD
    for node in sim.node_names(N):
        t = start + 7
        while t < end:
            target = f'instance="{node}:9845",job="clusterhealth"'
            yield f'{EXPECTED}{{{target},probe="{probe}"}} {EXPECTATION:.1f} {t:.3f}'
            t += SCRAPE


@dataclass(frozen=True)
class Servers:
    url: str  # the backfilled blocks
    partial: str  # the same, answering with warnings
    jobs_partial: str  # the same, answering the jobs' query alone with a warning
