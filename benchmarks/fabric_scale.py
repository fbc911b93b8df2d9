"""Fabric tomography at scale, by simulation: the real schedule and analyzer, a noise model.

Plays pairwise groups of 64 to 4,096 nodes round by round with checks/fabric/simulation.py (the
real ``schedule.regular`` / ``schedule.confirming`` decisions of every node, from its own history)
and runs the real analyzer (checks/fabric/analysis.py) on what they would export. Noise (issue 8):
each run falls short at random with p = 1 % (to 30-75 % of nominal), bandwidth jitter ±5 %, 1 % of
the nodes busy each round. Faults: a bad host and a bad path at half bandwidth.

Prints: rounds and wall time to name a bad host and a bad path, and both together; false suspects
per 1,000 nodes per day in a healthy fleet; the trade-off of the rule's settings; series and churn
per day; the time ``clusterhealth analyze`` takes over 1,024 nodes × 24 h against the Debian
prometheus holding that day as scraped (backfilled with promtool; Prometheus's time included).
And the tree (``--tree``): 4,096 nodes on 128 leaves of 32, the schedule pairing inside and across
leaves, the same noise: rounds to name a bad uplink, a bad leaf, a host and a path inside and across
leaves; false suspects per 1,000 nodes per day; analyze's cost over a day of them in-process and,
over its default 6 h window, against the Debian prometheus. docs/fabric.md records the figures.

    .venv/bin/python benchmarks/fabric_scale.py                 # about 17 minutes on 2 cores
    .venv/bin/python benchmarks/fabric_scale.py --quick         # a smaller run, for a look
    .venv/bin/python benchmarks/fabric_scale.py --only-analyze  # the analyze timing (10 minutes)
    .venv/bin/python benchmarks/fabric_scale.py --tree          # the tree alone
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.checks.fabric.analysis import Rules
from clusterhealth.fleet import analyze as analyzing
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.prometheus import Prometheus

DEFAULT_PERIOD = 900.0  # the group's default round period (seconds)
DEFAULT_CONFIRM_RUNS = 3
WARMUP = 8  # healthy rounds before a fault, so that partners have other results to compare with
GBIT = 1e9 / 8


@dataclass
class Detection:
    rounds: int | None  # rounds until named (None: not within the limit)
    false: int  # suspects other than the injected faults, seen during the run


def _analyze(rounds: list[sim.Round], period: float, rules: Rules) -> analysis.Analysis:
    meetings = analysis.merge(sim.reports(rounds, period))
    return analysis.analyze("fabric", meetings, window_seconds=len(rounds) * period, rules=rules)


def detect(
    n: int,
    seed: int,
    *,
    host: bool,
    path: bool,
    rules: Rules,
    confirm_runs: int,
    limit: int = 12,
) -> tuple[Detection | None, Detection | None]:
    """Rounds to name the bad host (from the fault's start) and the bad path (from its first
    meeting): the analyzer runs after every round, as an operator's periodic `analyze` would."""
    rng = random.Random(seed)
    nodes = sim.node_names(n)
    fleet = sim.Fleet(nodes, confirm_runs=confirm_runs, nominal=10 * GBIT)
    group = sim.Group(fleet, random.Random(seed + 1))
    bad_host = rng.choice(nodes) if host else None
    a, b = rng.sample([x for x in nodes if x != bad_host], 2)
    start = 10_000 + rng.randrange(10_000)
    if path:
        # Simulate from a few rounds before the pair's first meeting: the fault is there from the
        # start, but the pair does not meet before (every pair meets once per cycle).
        meets = sim.meeting_round(group.schedule, a, b, start + WARMUP)
        start = meets - WARMUP if not host else meets - WARMUP - 3
    rounds = [group.play(r) for r in range(start, start + WARMUP)]
    if bad_host:
        fleet.bad_hosts[bad_host] = 0.5
    if path:
        fleet.bad_paths[sim.path(a, b)] = 0.5
    host_found = path_found = None
    false = 0
    expected = {("host", bad_host or ""), ("path", f"{min(a, b)}<->{max(a, b)}")}
    first_meeting = None
    met = start + WARMUP
    for k in range(1, limit + 2 * n):
        r = start + WARMUP + k - 1
        rounds.append(group.play(r))
        if (
            path
            and first_meeting is None
            and any({m.server, m.client} == {a, b} for m in rounds[-1].meetings)
        ):
            first_meeting = r
        result = _analyze(rounds, DEFAULT_PERIOD, rules)
        named = {(s.kind, s.name) for s in result.suspects}
        false = max(false, len(named - expected))
        if host and host_found is None and ("host", bad_host) in named:
            host_found = k
        if path and path_found is None and ("path", f"{min(a, b)}<->{max(a, b)}") in named:
            path_found = r - (first_meeting if first_meeting is not None else r) + 1
        done_host = not host or host_found is not None or k >= limit
        # A pair whose meeting was skipped (an end busy) meets again only a cycle later: give up.
        done_path = not path or path_found is not None or r - (first_meeting or met) >= limit
        if done_host and done_path:
            break
    return (
        Detection(host_found, false) if host else None,
        Detection(path_found, false) if path else None,
    )


def _summary(values: list[int | None]) -> str:
    found = [v for v in values if v is not None]
    if not found:
        return "not named"
    missed = len(values) - len(found)
    text = f"{statistics.median(found):g} (max {max(found)})"
    return text + (f", {missed} not named within the limit" if missed else "")


def _minutes(values: list[int | None], period: float) -> str:
    found = [v for v in values if v is not None]
    return f"{statistics.median(found) * period / 60:.0f} min" if found else "-"


def detection_table(sizes: list[int], trials: Callable[[int], int], rules: Rules, confirm_runs: int) -> None:
    print(f"\n## Rounds to name (period {DEFAULT_PERIOD:g} s; median and max over trials)\n")
    print(
        "| nodes | trials | bad host: rounds | wall time | bad path: rounds from its first meeting | "
        "wall time | both: host / path | false suspects seen |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    false_anywhere = 0
    for n in sizes:
        t = trials(n)
        hosts, paths, both_h, both_p, false = [], [], [], [], 0
        for i in range(t):
            h, _ = detect(n, 100 * n + i, host=True, path=False, rules=rules, confirm_runs=confirm_runs)
            _, p = detect(n, 200 * n + i, host=False, path=True, rules=rules, confirm_runs=confirm_runs)
            bh, bp = detect(n, 300 * n + i, host=True, path=True, rules=rules, confirm_runs=confirm_runs)
            assert h and p and bh and bp
            hosts.append(h.rounds)
            paths.append(p.rounds)
            both_h.append(bh.rounds)
            both_p.append(bp.rounds)
            false += h.false + p.false + bh.false
        false_anywhere += false
        print(
            f"| {n:,} | {t} | {_summary(hosts)} | {_minutes(hosts, DEFAULT_PERIOD)} | {_summary(paths)} | "
            f"{_minutes(paths, DEFAULT_PERIOD)} | {_summary(both_h)} / {_summary(both_p)} | {false} |"
        )
    print(
        "\nA bad path is found when its two ends meet: once per cycle of N−1 rounds, so on average "
        "(N−1)/2 rounds after the fault starts (at 900 s: "
        + ", ".join(f"{n:,} nodes {((n - 1) / 2) * DEFAULT_PERIOD / 86400:.1f} d" for n in sizes)
        + "); it is named by its confirming meeting, in the next round. A path not named within the "
        "limit had its meeting skipped (an end busy): it is found a cycle later."
    )
    if false_anywhere:
        raise SystemExit(f"{false_anywhere} suspects other than the seeded bad host and path were named")


@dataclass
class FalseRate:
    node_rounds: int
    host: int
    path: int


def false_suspects(
    n: int, rounds: int, confirm_runs: int, p_short: float, rules: list[Rules], seed: int
) -> list[FalseRate]:
    """False suspects in a healthy fleet, analysed one day-long window after another."""
    fleet = sim.Fleet(sim.node_names(n), confirm_runs=confirm_runs, p_short=p_short, nominal=10 * GBIT)
    group = sim.Group(fleet, random.Random(seed))
    window = int(86400 // DEFAULT_PERIOD)
    counts = [FalseRate(0, 0, 0) for _ in rules]
    for first in range(0, rounds, window):
        played = [group.play(r) for r in range(first, min(first + window, rounds))]
        for rule, count in zip(rules, counts, strict=True):
            result = _analyze(played, DEFAULT_PERIOD, rule)
            count.node_rounds += n * len(played)
            count.host += sum(s.kind == "host" for s in result.suspects)
            count.path += sum(s.kind == "path" for s in result.suspects)
    return counts


def model(p: float, k: int, confirm_runs: int, period: float) -> tuple[float, float]:
    """Expected false suspects per 1,000 nodes per day: k short meetings in a row for a host
    (p^k per node-round), a short meeting confirmed by confirm_runs short runs for a path (one
    meeting per two node-rounds)."""
    per_day = 86400 / period * 1000
    return per_day * p**k, per_day * 0.5 * p * p**confirm_runs


def false_table(n: int, days: int, seed: int) -> None:
    rounds = int(days * 86400 // DEFAULT_PERIOD)
    settings = [(k, c) for c in (1, 2, 3) for k in (2, 3, 4)]
    print(f"\n## False suspects in a healthy fleet ({n:,} nodes, {days} simulated days per setting)\n")
    print("Counted per day-long window of `analyze`. At p = 1 % false suspects are rare events, so a")
    print("second run at p = 5 % checks the model (host p^k, path p^(1+confirm_runs) per meeting)")
    print("that the per-day figures at p = 1 % are computed from.\n")
    print(
        "| host_partners | confirm_runs | p | simulated host / path per 1,000 node-rounds | "
        "model host / path |"
    )
    print("| --- | --- | --- | --- | --- |")
    measured: dict[tuple[int, int], tuple[float, float]] = {}
    for c in (1, 2, 3):
        for p_short in (0.05, 0.01):
            ks = [k for k, cc in settings if cc == c]
            rates = false_suspects(n, rounds, c, p_short, [Rules(host_partners=k) for k in ks], seed)
            for k, rate in zip(ks, rates, strict=True):
                host = rate.host / rate.node_rounds * 1000
                path = rate.path / rate.node_rounds * 1000
                mh, mp = model(p_short, k, c, 86400.0)  # per 1,000 node-rounds
                print(
                    f"| {k} | {c} | {p_short:.0%} | {host:.2e} ({rate.host}) / {path:.2e} ({rate.path}) | "
                    f"{mh:.2e} / {mp:.2e} |"
                )
                if p_short == 0.01:
                    measured[(k, c)] = (rate.host / rate.node_rounds, rate.path / rate.node_rounds)
    print("\n## The trade-off: rounds to detect against false suspects per 1,000 nodes per day (p = 1 %)\n")
    print(
        "| host_partners | confirm_runs | period | bad host named in | bad path named in | "
        "false/1,000 nodes/day (model) | (simulated) | meets the goals |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for period in (300.0, 600.0, 900.0):
        for k, c in settings:
            if c == 1 and k != 3:
                continue
            mh, mp = model(0.01, k, c, period)
            sh, sp = measured[(k, c)]
            simulated = (sh + sp) * 86400 / period * 1000
            goals = k <= 3 and mh + mp <= 0.1
            marker = " **default**" if (k, c, period) == (3, DEFAULT_CONFIRM_RUNS, DEFAULT_PERIOD) else ""
            print(
                f"| {k} | {c} | {period:g} s | {k} rounds, {k * period / 60:.0f} min | 2 rounds, "
                f"{2 * period / 60:.0f} min | {mh + mp:.3f} | {simulated:.3f} | "
                f"{'yes' if goals else 'no'}{marker} |"
            )


def series_table(sizes: list[int]) -> None:
    rounds_per_day = 86400 / DEFAULT_PERIOD
    # node_info, round, group_members, success, runs_total × 5, last_run, duration, expected: what
    # the agent exports (tests/test_pairwise_agent.py counts them on a real agent); one more,
    # placement_info, for a node its members file places.
    static = 12
    print(f"\n## Series a group costs Prometheus (period {DEFAULT_PERIOD:g} s)\n")
    print(
        "| nodes | active series per node | active series | new series per day (churn) | "
        "a series per directed pair instead |"
    )
    print("| --- | --- | --- | --- | --- |")
    for n in sizes:
        per_node = static + 2  # bandwidth and peer_success of the current partner
        # Each round a node exports a new partner's two series; about 1 % of rounds add a
        # confirming partner.
        churn = n * rounds_per_day * 2 * 1.01
        print(f"| {n:,} | {per_node} | {n * per_node:,} | {churn:,.0f} | {n * (n - 1):,} |")


@dataclass
class AnalyzeRun:
    label: str
    total: float  # wall time of fleet/analyze.run
    waiting: float  # for Prometheus's answers (evaluating, encoding, sending)
    decoding: float  # decoding the JSON
    prometheus_cpu: float  # the Prometheus process's CPU time during the run
    own_cpu: float  # this process's CPU time during the run
    requests: int
    megabytes: float
    result: analysis.Analysis

    @property
    def work(self) -> float:
        return self.total - self.waiting - self.decoding


def _start_prometheus(root: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    """The Debian prometheus serving root/tsdb; the seconds until it said it was ready."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    began = time.perf_counter()
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=30d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    return server, url, time.perf_counter() - began


def _evict(directory: Path) -> int:
    """Drop the files under ``directory`` from the page cache (posix_fadvise DONTNEED; nothing
    else on the machine is touched), as after a reboot; their size in bytes."""
    size = 0
    for path in directory.rglob("*"):
        if path.is_file():
            size += path.stat().st_size
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return size


def _timed_run(label: str, url: str, server: subprocess.Popen[bytes], hours: float, end: float) -> AnalyzeRun:
    serving = psutil.Process(server.pid)
    client = Prometheus(url, timeout=600)
    before, t0, own = serving.cpu_times(), time.perf_counter(), time.process_time()
    result = analyzing.run(url, "fabric", hours * 3600, now=end, prometheus=client)
    total, after = time.perf_counter() - t0, serving.cpu_times()
    return AnalyzeRun(
        label,
        total,
        client.seconds_waiting,
        client.seconds_decoding,
        after.user + after.system - before.user - before.system,
        time.process_time() - own,
        client.requests,
        client.bytes_read / 1e6,
        result,
    )


def _import_seconds(runs: int = 3) -> float:
    """Best wall time of a new Python process importing what `clusterhealth analyze` imports."""
    code = "import clusterhealth.agent.cli, clusterhealth.fleet.analyze"
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def analyze_time(
    n: int, hours: float, scrape: float, runs: int = 3, leaves: dict[str, str] | None = None
) -> None:
    """`clusterhealth analyze` (fleet/analyze.run) over n nodes × hours against a real Prometheus
    holding the group's history as scraped every ``scrape`` seconds, backfilled with promtool.

    Runs: the first against a Prometheus just started on the backfilled blocks (cold), ``runs``
    more (warm), then two after Prometheus is restarted on the same blocks (its process cold, the
    files in the page cache), and two after a restart with its files dropped from the page cache
    (as after a reboot). Every run must name the seeded bad host alone (and, on ``leaves``, the
    seeded bad uplink). On a shared machine the wall time follows the load; the CPU times are the
    cost."""
    imports = _import_seconds()
    period = DEFAULT_PERIOD
    count = int(hours * 3600 // period)
    fleet = sim.Fleet(
        sim.node_names(n), confirm_runs=DEFAULT_CONFIRM_RUNS, nominal=10 * GBIT, leaves=leaves or {}
    )
    seeded = {("host", "h7")}
    fleet.bad_hosts["h7"] = 0.5
    if leaves:
        seeded.add(("uplink", "leaf40"))
        fleet.bad_uplinks["leaf40"] = 0.5
    last = int(time.time() // period) - 1
    rounds = sim.shifted(sim.play(fleet, 0, count, seed=5), last - count + 1)
    end = (last + 1) * period
    timed: list[AnalyzeRun] = []
    with tempfile.TemporaryDirectory(prefix="fabric-scale-") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        samples = _write_openmetrics(root / "data.om", rounds, period, fleet.nodes, scrape, leaves)
        written = time.perf_counter()
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "-q",
                str(root / "data.om"),
                str(root / "tsdb"),
            ],
            check=True,
            capture_output=True,
        )
        backfilled = time.perf_counter()
        size = (root / "data.om").stat().st_size
        (root / "data.om").unlink()
        (root / "prometheus.yml").write_text("scrape_configs: []\n")
        server, url, startup = _start_prometheus(root)
        try:
            timed.append(
                _timed_run("cold: the first query of a Prometheus just started", url, server, hours, end)
            )
            for i in range(runs):
                timed.append(_timed_run(f"warm {i + 1}", url, server, hours, end))
        finally:
            server.terminate()
            server.wait(60)
        server, url, restart = _start_prometheus(root)
        try:
            timed.append(_timed_run("after a restart (files in the page cache)", url, server, hours, end))
            timed.append(_timed_run("after a restart, second run", url, server, hours, end))
        finally:
            server.terminate()
            server.wait(60)
        tsdb_bytes = _evict(root / "tsdb")
        server, url, _ = _start_prometheus(root)
        try:
            timed.append(
                _timed_run("after a restart, its files out of the page cache", url, server, hours, end)
            )
            timed.append(_timed_run("the same, second run", url, server, hours, end))
        finally:
            server.terminate()
            server.wait(60)
    for run in timed:
        named = {(s.kind, s.name) for s in run.result.suspects}
        if named != seeded:
            raise SystemExit(f"{run.label}: suspects {sorted(named)}, seeded {sorted(seeded)} only")
    warm = min(timed[1 : 1 + runs], key=lambda r: r.total)
    print(f"\n## `analyze` over {n:,} nodes × {hours:g} h, against a real Prometheus\n")
    print(
        f"The group's history as Prometheus would have scraped it every {scrape:g} s ({samples / 1e6:.1f} M "
        f"samples, {size / 1e9:.1f} GB of OpenMetrics written in {written - began:.0f} s), backfilled with "
        f"promtool in {backfilled - written:.0f} s ({tsdb_bytes / 1e6:.0f} MB of blocks), served by the "
        f"Debian prometheus (ready "
        f"{startup:.1f} s after its start, {restart:.1f} s after its restart); `analyze` with its defaults "
        f"(windows of {pairwise.window_width(period):g} s). Every run named "
        f"{', '.join(name for _, name in sorted(seeded))} alone, the seeded faults.\n"
    )
    print(
        "| run | total | Prometheus answering (its CPU) | decoding the JSON | reduction, merge, analysis "
        "| analyze's CPU |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for run in timed:
        print(
            f"| {run.label} | {run.total:.2f} s | {run.waiting:.2f} s ({run.prometheus_cpu:.2f} s) "
            f"| {run.decoding:.2f} s | {run.work:.2f} s | {run.own_cpu:.2f} s |"
        )
    cpu = min(r.prometheus_cpu + r.own_cpu for r in timed)
    print(
        f"\nCPU time of a run, Prometheus's and analyze's together, the cost on a machine of their own: "
        f"{cpu:.2f} s to {max(r.prometheus_cpu + r.own_cpu for r in timed):.2f} s."
    )
    print(
        f"Best warm run: **{warm.total:.2f} s** (goal < 10 s); {warm.requests} queries, "
        f"{warm.megabytes:.1f} MB of JSON, {warm.result.meetings:,} meetings. A new Python process "
        f"importing `clusterhealth analyze`'s modules: {imports:.2f} s (best of 3), on top of any run."
    )
    load = os.getloadavg()[0]
    print(f"Load average after the runs (this machine's cores: {os.cpu_count()}): {load:.1f}.")


def _write_openmetrics(
    path: Path,
    rounds: list[sim.Round],
    period: float,
    nodes: list[str],
    scrape: float,
    leaves: dict[str, str] | None = None,
) -> int:
    """The scrapes as one OpenMetrics file, family by family, without holding them in memory."""
    parts = {family: path.with_suffix(f".{i}") for i, family in enumerate(sim.FAMILIES)}
    handles = {family: part.open("w") for family, part in parts.items()}
    samples = 0
    try:
        for family, line in sim.scrapes(
            "fabric", rounds, period, nodes, scrape_interval=scrape, leaves=leaves
        ):
            handles[family].write(line + "\n")
            samples += 1
    finally:
        for handle in handles.values():
            handle.close()
    with path.open("w") as out:
        for family, part in parts.items():
            if not part.stat().st_size:
                part.unlink()
                continue
            out.write(f"# TYPE {family} gauge\n")
            with part.open() as lines:
                shutil.copyfileobj(lines, out)
            part.unlink()
        out.write("# EOF\n")
    return samples


# --- the tree ------------------------------------------------------------------------------------

TREE_BOUND = 4  # rounds: a leaf meets itself every other round and two other leaves in four


@dataclass
class TreeTrial:
    kind: str
    rounds: int | None  # analyses until named, from the fault's start (a path: from its first meeting)
    false: int  # suspects other than the fault, the most seen after any round
    explained: int = 0  # of those, the fault's own hosts or paths (one verdict per incident: none)


def detect_tree(leaves: int, per_leaf: int, seed: int, kind: str, limit: int = 10) -> TreeTrial:
    """One fault in a tree of ``leaves`` × ``per_leaf`` nodes, analysed after every round."""
    rng = random.Random(seed)
    placed = sim.tree(leaves, per_leaf)
    nodes = list(placed)
    fleet = sim.Fleet(nodes, confirm_runs=DEFAULT_CONFIRM_RUNS, nominal=10 * GBIT, leaves=placed)
    group = sim.Group(fleet, random.Random(seed + 1))
    start = 10_000 + rng.randrange(10_000)
    leaf = f"leaf{rng.randrange(leaves) + 1}"
    name, first_meeting = leaf, None
    if kind in ("path inside", "path across"):
        a = rng.choice(nodes)
        b = rng.choice([n for n in nodes if (placed[n] == placed[a]) == (kind == "path inside") and n != a])
        name = f"{min(a, b)}<->{max(a, b)}"
        first_meeting = sim.meeting_round(group.schedule, a, b, start + WARMUP)
        start = first_meeting - WARMUP - rng.randrange(2)
    elif kind == "host":
        name = rng.choice(nodes)
    rounds = [group.play(r) for r in range(start, start + WARMUP)]
    if kind == "uplink":
        fleet.bad_uplinks[leaf] = 0.5
    elif kind == "leaf":
        fleet.bad_leaves[leaf] = 0.5
    elif kind == "host":
        fleet.bad_hosts[name] = 0.5
    else:
        fleet.bad_paths[sim.path(*name.split("<->"))] = 0.5
    expected = ("path" if kind.startswith("path") else kind, name)
    members = (
        {n for n in nodes if placed[n] == leaf} if kind in ("uplink", "leaf") else set(name.split("<->"))
    )
    false, explained, found = 0, 0, None
    for k in range(1, limit + 1):
        r = start + WARMUP + k - 1
        rounds.append(group.play(r))
        meetings = analysis.merge(sim.reports(rounds[-24:], DEFAULT_PERIOD))
        result = analysis.analyze(
            "fabric", meetings, window_seconds=len(rounds[-24:]) * DEFAULT_PERIOD, leaves=placed
        )
        named = {(s.kind, s.name) for s in result.suspects}
        false = max(false, len(named - {expected}))
        others = [s for s in result.suspects if (s.kind, s.name) != expected]
        explained = max(explained, sum(bool(set(s.hosts) & members) for s in others if s.kind != "leaf"))
        if found is None and expected in named:
            found = k if first_meeting is None else r - first_meeting + 1
            break
    return TreeTrial(kind, found, false, explained)


def tree_table(leaves: int, per_leaf: int, trials: int) -> None:
    n = leaves * per_leaf
    print(f"\n## The tree: {n:,} nodes on {leaves} leaves of {per_leaf} (period {DEFAULT_PERIOD:g} s)\n")
    print("Rounds until `analyze` names the fault, from its start (a path: from its first meeting), over")
    print(f"{trials} trials each, the fault at a random place; the schedule's bound: {TREE_BOUND} rounds.\n")
    print(
        "| fault | named after (median, max) | wall time (median) | named as its kind | false suspects seen "
        "| of them, its own hosts or paths |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    failed = []
    for kind in ("uplink", "leaf", "host", "path inside", "path across"):
        began = time.perf_counter()
        results = [detect_tree(leaves, per_leaf, 1000 * leaves + 17 * i, kind) for i in range(trials)]
        found = [t.rounds for t in results]
        named = sum(r is not None for r in found)
        false = sum(t.false for t in results)
        print(
            f"| {kind} | {_summary(found)} | {_minutes(found, DEFAULT_PERIOD)} | {named} of {trials} "
            f"| {false} | {sum(t.explained for t in results)} |  <!-- {time.perf_counter() - began:.0f} s -->"
        )
        if any(t.explained for t in results):
            failed.append(f"{kind} (its hosts or paths named beside it)")
        if kind in ("uplink", "leaf") and any(r is None or r > TREE_BOUND for r in found):
            failed.append(kind)
    print(
        "\nFalse suspects seen: the most suspects other than the fault after any round of a trial, from"
        "\nthe noise (a host short three rounds running by chance: the rate of the next table), never"
        "\nthe fault's hosts or paths (each incident is one verdict)."
    )
    if failed:
        raise SystemExit(f"the tree: not named within the bound: {', '.join(failed)}")


def tree_false(leaves: int, per_leaf: int, days: int, seed: int) -> None:
    """False suspects in a healthy tree, analysed one day-long window after another."""
    placed = sim.tree(leaves, per_leaf)
    n = len(placed)
    fleet = sim.Fleet(list(placed), confirm_runs=DEFAULT_CONFIRM_RUNS, nominal=10 * GBIT, leaves=placed)
    group = sim.Group(fleet, random.Random(seed))
    window = int(86400 // DEFAULT_PERIOD)
    kinds = {kind: 0 for kind in analysis.KINDS}
    node_rounds, analysed, seconds = 0, 0, 0.0
    for first in range(0, days * window, window):
        played = [group.play(r) for r in range(first, first + window)]
        began = time.perf_counter()
        meetings = analysis.merge(sim.reports(played, DEFAULT_PERIOD))
        result = analysis.analyze("fabric", meetings, window_seconds=window * DEFAULT_PERIOD, leaves=placed)
        seconds += time.perf_counter() - began
        analysed += result.meetings
        node_rounds += n * len(played)
        for s in result.suspects:
            kinds[s.kind] += 1
    per_day = sum(kinds.values()) / (node_rounds / window) * 1000
    print(f"\n## False suspects in a healthy tree ({n:,} nodes, {days} simulated days, p = 1 %)\n")
    print("| host | path | uplink | leaf | per 1,000 nodes per day (goal ≤ 0.1) |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {kinds['host']} | {kinds['path']} | {kinds['uplink']} | {kinds['leaf']} | {per_day:.3f} |")
    print(
        f"\n`analyze` in-process over a day of {n:,} nodes ({analysed // days:,} meetings), merge and "
        f"analysis: {seconds / days:.2f} s a day-long window (mean of {days})."
    )
    if per_day > 0.1:
        raise SystemExit(f"{per_day:.3f} false suspects per 1,000 nodes per day in the tree")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and days")
    parser.add_argument("--sizes", default="64,512,1024,4096")
    parser.add_argument("--days", type=int, default=20, help="simulated days per false-suspect setting")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--analyze-nodes", type=int, default=1024, help="nodes of the analyze timing (24 h)")
    parser.add_argument("--scrape", type=float, default=15.0, help="scrape interval of the analyze timing")
    parser.add_argument("--only-analyze", action="store_true", help="only the analyze timing")
    parser.add_argument("--tree", action="store_true", help="only the tree (128 leaves of 32)")
    parser.add_argument("--tree-days", type=int, default=10, help="simulated days of the healthy tree")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rules = Rules()
    started = time.perf_counter()
    print(f"# Fabric tomography at scale (rules {rules}, confirm_runs {DEFAULT_CONFIRM_RUNS})")
    if args.only_analyze:
        analyze_time(args.analyze_nodes, 24, args.scrape)
        return
    if args.tree:
        tree_table(128, 32, 2 if args.quick else 8)
        tree_false(128, 32, 2 if args.quick else args.tree_days, args.seed)
        analyze_time(4096, 6, args.scrape, leaves=sim.tree(128, 32))
        return
    detection_table(
        sizes, (lambda n: 2) if args.quick else (lambda n: 8 if n <= 1024 else 4), rules, DEFAULT_CONFIRM_RUNS
    )
    false_table(1024, 3 if args.quick else args.days, args.seed)
    series_table(sizes)
    analyze_time(args.analyze_nodes, 24, args.scrape)
    print(f"\n(benchmark ran {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
