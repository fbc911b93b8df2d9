#!/usr/bin/env python3
"""RDMA /metrics latency of the agent side by side with node_exporter on the same sysfs tree.

Builds the simulated DGX H100-class tree (exporters/sim/sysfs.py) in a temporary directory, keeps
10 HCAs with full counters/ and hw_counters/ (8 InfiniBand mlx5 + 2 RoCE mlx5), and starts, as
real processes on that tree:
- `clusterhealth agent` with only its rdma collector (gpu, kernel_log and audit disabled);
- the Debian `prometheus-node-exporter` with only its infiniband and netclass collectors.

Both are then scraped the same way, from outside, one after the other: sequential keep-alive
requests, then N concurrent keep-alive clients back to back, all with `Accept-Encoding: gzip` as
Prometheus sends it. It prints p50, p99, max, requests/s, response size, the ratio
ours/node_exporter (target: ≤ 1.0× at p50 and p99), RSS and CPU seconds used under load.

The two do different work per request: node_exporter reads sysfs on every scrape, the agent reads
it every `collectors.rdma.interval_seconds` (15 s) in the background and serves a cached
rendering. So the cost of one collection is measured too: `RdmaCollector.collect()` (built as
the agent builds it at its defaults) plus rendering timed in this process, node_exporter's
`node_scrape_collector_duration_seconds` read from every response it sent, and last, inside a
second agent run as a user runs it (no config file: every collector at its defaults, the rdma
collector every 15 s), its own `clusterhealth_scrape_collector_duration_seconds{collector="rdma"}`
over `--agent-runs` runs, beside node_exporter scraped once a second. The ratio of that duration to
node_exporter's single-client scrape is issue 27's goal (≤ 0.75×); so is the agent's RSS (≤ 40 MB).
Every figure comes with the load average it was measured at: the machine may be shared.

Usage: benchmarks/rdma_latency.py [--requests 500] [--clients 10] [--collections 200] [--agent-runs 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from agentproc import start_agent
from prometheus_client import generate_latest

from clusterhealth.agent import __version__
from clusterhealth.agent.config import Config
from clusterhealth.exporters.base import FamilySelection
from clusterhealth.exporters.rdma import RdmaCollector
from clusterhealth.exporters.sim import sysfs as sim_sysfs

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
AGENT_CONFIG = """\
collectors:
  gpu: {enabled: false}
  kernel_log: {enabled: false}
  audit: {enabled: false}
"""
OURS, THEIRS = "clusterhealth", "node_exporter"
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: gzip\r\n\r\n"
WARMUP_REQUESTS = 50
PAUSE = 0.02  # seconds before each measurement of a read pair
IN_AGENT_GOAL = 0.75  # issue 27: the rdma collector's duration in the agent / node_exporter's scrape
RSS_GOAL = 40e6  # issue 27
DURATION_RE = re.compile(rb'^(\w+)_scrape_collector_duration_seconds\{collector="(\w+)"\} (\S+)$', re.M)


# -- the tree ----------------------------------------------------------------------------------


def build_tree(root: Path) -> list[str]:
    """The simulated node's sysfs under `root`, changed so node_exporter 1.5.0 reads all of it.

    Returns what was changed. node_exporter 1.5.0 drops its whole infiniband collector on a
    device without board_id (irdma) and on an empty counter file (mlx5_6's symbol_error).
    """
    sim_sysfs.build(root)
    irdma_link = root / "class" / "infiniband" / "irdma0"
    shutil.rmtree(irdma_link.resolve())
    irdma_link.unlink()
    empty = root / "class" / "infiniband" / "mlx5_6" / "ports" / "1" / "counters" / "symbol_error"
    assert empty.read_text() == ""
    empty.write_text("0\n")
    return [
        "irdma0 removed (its device directory and class/infiniband link; its netdev stays)",
        "mlx5_6 counters/symbol_error: empty file filled with 0",
    ]


def tree_summary(root: Path) -> str:
    devices = sorted((root / "class" / "infiniband").iterdir())
    counters = sum(len(list(d.glob("ports/*/counters/*"))) for d in devices)
    hw = sum(len(list(d.glob("ports/*/hw_counters/*"))) for d in devices)
    netdevs = len(list((root / "class" / "net").iterdir()))
    names = (
        f"{devices[0].name}..{devices[-1].name}" if len(devices) > 2 else ", ".join(d.name for d in devices)
    )
    return (
        f"{len(devices)} HCAs ({names}), {counters} counters/ and {hw} hw_counters/ files in all, "
        f"{netdevs} interfaces in class/net"
    )


# -- the two servers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} is not listening on port {port} after 10 s")


def start_node_exporter(binary: str, tree: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={tree}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--collector.netclass",
            f"--web.listen-address=127.0.0.1:{port}",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(port, proc, "node_exporter")
    return proc, port


def load_average() -> float:
    """The 1-minute load average: the machine is shared, so every figure says what else ran."""
    return os.getloadavg()[0]


def get(port: int, gzipped: bool = False) -> bytes:
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if gzipped:
        request.add_header("Accept-Encoding", "gzip")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def agent_rdma_duration(port: int) -> tuple[bool, float | None]:
    body = get(port)
    success = b'clusterhealth_scrape_collector_success{collector="rdma"} 1.0' in body
    durations = {c: float(v) for prefix, c, v in DURATION_RE.findall(body) if prefix == b"clusterhealth"}
    return success, durations.get(b"rdma")


def wait_for_rdma(port: int) -> float:
    for _ in range(100):
        success, duration = agent_rdma_duration(port)
        if success and duration is not None:
            return duration
        time.sleep(0.1)
    raise SystemExit("the agent's rdma collector did not succeed within 10 s")


# -- load --------------------------------------------------------------------------------------


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall


async def fetch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One request on a keep-alive connection; the body as sent (Content-Length or chunked)."""
    writer.write(REQUEST)
    await writer.drain()
    status = await reader.readline()
    if not status.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected response {status!r}")
    length, chunked = None, False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return await reader.readexactly(length or 0)
    parts: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def _client(port: int, count: int, run: Run) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        start = time.perf_counter()
        body = await fetch(reader, writer)
        run.latencies.append(time.perf_counter() - start)
        run.bodies.append(body)
    writer.close()
    await writer.wait_closed()


def load(port: int, pid: int, clients: int, requests: int) -> Run:
    """`requests` in all from `clients` keep-alive connections, each sending back to back."""
    run = Run()
    process = psutil.Process(pid)
    per_client = [requests // clients + (i < requests % clients) for i in range(clients)]

    async def everyone() -> None:
        await asyncio.gather(*(_client(port, n, run) for n in per_client if n))

    before = process.cpu_times()
    start = time.perf_counter()
    asyncio.run(everyone())
    run.wall = time.perf_counter() - start
    after = process.cpu_times()
    run.cpu = after.user - before.user + after.system - before.system
    return run


# -- collection cost in this process ------------------------------------------------------------


def default_collector(tree: Path) -> RdmaCollector:
    """The rdma collector as the agent builds it at the default settings."""
    settings = Config().collectors.rdma
    return RdmaCollector(
        tree,
        error_counters=settings.error_counters,
        hw_counters=settings.hw_counters,
        families=FamilySelection(RdmaCollector.opt_in),
    )


class _Families:
    def __init__(self, families: list[object]):
        self._families = families

    def collect(self) -> list[object]:
        return self._families


def in_process(tree: Path, runs: int) -> dict[str, list[float]]:
    """RdmaCollector.collect(), then rendering as the agent does it (text, then gzip)."""
    # The agent's GC settings (agent/daemon.py), so a collection costs what it costs there.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    collector = default_collector(tree)
    times: dict[str, list[float]] = {"collect": [], "render": [], "gzip": [], "total": []}
    for i in range(runs + 5):
        t0 = time.perf_counter()
        families = collector.collect()
        t1 = time.perf_counter()
        text = generate_latest(_Families(families))  # type: ignore[arg-type]
        t2 = time.perf_counter()
        gzip.compress(text, compresslevel=5)
        t3 = time.perf_counter()
        if i >= 5:  # warm-up
            times["collect"].append(t1 - t0)
            times["render"].append(t2 - t1)
            times["gzip"].append(t3 - t2)
            times["total"].append(t3 - t0)
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    return times


@dataclass
class CpuCost:
    """CPU seconds per read, which scheduling noise on a shared machine does not inflate."""

    ours_read: float  # RdmaCollector.collect(), this thread's CPU time
    ours_render: float  # generate_latest() of its families, this thread's CPU time
    theirs_scrape: float  # node_exporter's process CPU per scrape: read, render, HTTP


def paired(
    tree: Path, exporter_port: int, exporter_pid: int, runs: int
) -> tuple[list[tuple[float, float]], CpuCost]:
    """One read of the tree by each, back to back, `runs` times: (ours, theirs) in seconds.

    Ours is RdmaCollector.collect() (reading sysfs and building the metric families), timed in
    this process; theirs is node_exporter's own node_scrape_collector_duration_seconds of its
    infiniband and netclass collectors (reading sysfs and building its metrics) for the scrape
    made just before or after (the order alternates). Pairs taken a few milliseconds apart see
    the same machine, so the median of the per-pair ratios holds on a shared, noisy machine
    where absolute figures drift.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    collector = default_collector(tree)
    for _ in range(5):
        collector.collect()
        get(exporter_port)

    cpu = {"read": 0.0, "render": 0.0}

    def ours() -> float:
        start, start_cpu = time.perf_counter(), time.thread_time()
        families = collector.collect()
        wall, read_cpu = time.perf_counter() - start, time.thread_time()
        generate_latest(_Families(families))  # type: ignore[arg-type]
        cpu["read"] += read_cpu - start_cpu
        cpu["render"] += time.thread_time() - read_cpu
        return wall

    def theirs() -> float:
        found = {c: float(v) for prefix, c, v in DURATION_RE.findall(get(exporter_port)) if prefix == b"node"}
        return found[b"infiniband"] + found[b"netclass"]

    exporter = psutil.Process(exporter_pid)
    before = exporter.cpu_times()
    pairs = []
    for i in range(runs):
        # Each side is measured after a pause, so neither pays for what the other left running
        # (node_exporter's garbage collection after a scrape, this process's after a read), and
        # the order alternates.
        time.sleep(PAUSE)
        first = ours() if i % 2 == 0 else theirs()
        time.sleep(PAUSE)
        second = theirs() if i % 2 == 0 else ours()
        pairs.append((first, second) if i % 2 == 0 else (second, first))
    after = exporter.cpu_times()
    theirs_cpu = after.user - before.user + after.system - before.system
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    return pairs, CpuCost(cpu["read"] / runs, cpu["render"] / runs, theirs_cpu / runs)


@dataclass
class InAgent:
    """The rdma collector's own duration in an agent run as a user runs it, beside node_exporter
    scraped once a second by one client over the same minutes."""

    durations: list[float] = field(default_factory=list)  # one per run of the rdma collector
    theirs: list[float] = field(default_factory=list)  # node_exporter's /metrics, 1/s
    interval: float = 0.0
    loads: list[float] = field(default_factory=list)


def in_agent(tree: Path, workdir: Path, exporter_port: int, runs: int) -> InAgent:
    """`clusterhealth agent` without a config file (every collector at its defaults, the rdma
    collector every 15 s) on the tree, an empty kernel log and no GPU; its
    clusterhealth_scrape_collector_duration_seconds{collector="rdma"} read once a second until
    `runs` runs after the first have finished, node_exporter scraped beside it each second."""
    kmsg = workdir / "kmsg"
    kmsg.write_bytes(b"")
    agent, port, log = start_agent("--sysfs-root", str(tree), "--kmsg-path", str(kmsg))
    result = InAgent(interval=15.0)
    try:
        last = wait_for_rdma(port)  # the first run opens every file: not counted
        deadline = time.monotonic() + runs * 15 * 2 + 30
        while len(result.durations) < runs and time.monotonic() < deadline:
            time.sleep(1)
            start = time.perf_counter()
            get(exporter_port)
            result.theirs.append(time.perf_counter() - start)
            result.loads.append(load_average())
            _, duration = agent_rdma_duration(port)
            if duration is not None and duration != last:
                result.durations.append(duration)
                last = duration
    finally:
        agent.terminate()
        agent.wait(10)
    if not result.durations:
        raise SystemExit("the agent's rdma collector ran no second time:\n" + "".join(log))
    return result


# -- report ------------------------------------------------------------------------------------


def q(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.2f} ms"


def samples(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def theirs_durations(bodies: list[bytes]) -> dict[str, list[float]]:
    """node_exporter's own node_scrape_collector_duration_seconds, from every response it sent."""
    out: dict[str, list[float]] = {"infiniband": [], "netclass": [], "both": []}
    for body in bodies:
        found = {c.decode(): float(v) for prefix, c, v in DURATION_RE.findall(gzip.decompress(body))}
        for collector in ("infiniband", "netclass"):
            out[collector].append(found[collector])
        out["both"].append(found["infiniband"] + found["netclass"])
    return out


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{os.cpu_count()} CPUs ({model or platform.machine()}), {memory:.0f} GiB, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    print("| " + " | ".join(f"{h:<{w}}" for h, w in zip(header, widths, strict=True)) + " |")
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in rows:
        print("| " + " | ".join(f"{c!s:<{w}}" for c, w in zip(row, widths, strict=True)) + " |")
    print()


def kib(size: float) -> str:
    return f"{size / 1024:.1f} KiB"


def ratio_row(
    label: str, ours: float, theirs: float, target: float | None, show: Callable[[float], str] = ms
) -> tuple[str, ...]:
    r = ours / theirs if theirs else float("inf")
    target_text = f"≤ {target:.1f}×" if target is not None else ""
    ok = "" if target is None else ("yes" if r <= target else "NO")
    return (label, show(ours), show(theirs), f"{r:.2f}×", target_text, ok)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500, help="requests per server and mode (500)")
    ap.add_argument("--clients", type=int, default=10, help="concurrent keep-alive clients (10)")
    ap.add_argument(
        "--collections", type=int, default=200, help="in-process collections timed, and read pairs (200)"
    )
    ap.add_argument("--node-exporter", default=NODE_EXPORTER, metavar="PATH", help=f"default {NODE_EXPORTER}")
    ap.add_argument(
        "--agent-runs",
        type=int,
        default=8,
        help="runs of the rdma collector (every 15 s) read inside an agent at its defaults (8)",
    )
    args = ap.parse_args()

    binary = shutil.which(args.node_exporter)
    if binary is None:
        print(
            f"node_exporter not found at {args.node_exporter}: install the Debian package "
            "prometheus-node-exporter (apt-get install prometheus-node-exporter), "
            "or pass --node-exporter PATH",
            file=sys.stderr,
        )
        return 2
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    theirs_version = (version.stdout or version.stderr).splitlines()[0] if version.returncode == 0 else "?"

    with tempfile.TemporaryDirectory(prefix="rdma-bench-") as tmp:
        tree = Path(tmp) / "sys"
        changes = build_tree(tree)
        summary = tree_summary(tree)
        config = Path(tmp) / "agent.yaml"
        config.write_text(AGENT_CONFIG)

        agent, agent_port, agent_log = start_agent("--sysfs-root", str(tree), "--config", str(config))
        exporter, exporter_port = start_node_exporter(binary, tree)
        servers = {OURS: (agent_port, agent.pid), THEIRS: (exporter_port, exporter.pid)}
        try:
            cold_duration = wait_for_rdma(agent_port)
            plain = {name: get(port) for name, (port, _) in servers.items()}
            if b'node_scrape_collector_success{collector="infiniband"} 1' not in plain[THEIRS]:
                raise SystemExit("node_exporter's infiniband collector failed on the tree")
            for port, pid in servers.values():
                load(port, pid, 1, WARMUP_REQUESTS)
            runs: dict[tuple[str, str], Run] = {}
            for mode, clients in (("sequential", 1), ("concurrent", args.clients)):
                for name, (port, pid) in servers.items():
                    runs[mode, name] = load(port, pid, clients, args.requests)
            rss = {name: psutil.Process(pid).memory_info().rss for name, (_, pid) in servers.items()}
            pairs, cpu_cost = paired(tree, exporter_port, exporter.pid, args.collections)
            agent.terminate()
            agent.wait(10)
            inside = in_agent(tree, Path(tmp), exporter_port, args.agent_runs)
        finally:
            for proc in (agent, exporter):
                proc.terminate()
            for proc in (agent, exporter):
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        cost = in_process(tree, args.collections)

    # -- print ---------------------------------------------------------------------------------
    print(f"RDMA /metrics: clusterhealth {__version__} vs {theirs_version}")
    print(f"Machine: {machine()}")
    print(f"Tree: sim.sysfs.build() in a temporary directory; {summary}.")
    print("Changed in that copy so that node_exporter 1.5.0 reads all of it (it drops its whole")
    print("infiniband collector on either):")
    for change in changes:
        print(f"- {change}")
    print("clusterhealth agent: only the rdma collector (gpu, kernel_log, audit disabled; interval 15 s).")
    print("node_exporter: --collector.disable-defaults --collector.infiniband --collector.netclass.")
    print(
        f"Load: {WARMUP_REQUESTS} warm-up requests each, then {args.requests} requests per server and mode, "
        "keep-alive,"
    )
    print("Accept-Encoding: gzip; the client runs in this process, on the same cores.\n")

    rows: list[tuple[str, ...]] = []
    for mode, clients in (("sequential", 1), ("concurrent", args.clients)):
        ours, theirs = runs[mode, OURS], runs[mode, THEIRS]
        label = "1 client" if clients == 1 else f"{clients} clients"
        for stat, fraction, target in (("p50", 0.5, 1.0), ("p99", 0.99, 1.0), ("max", 1.0, None)):
            rows.append(
                ratio_row(
                    f"/metrics {stat}, {label}",
                    statistics.median(ours.latencies) if fraction == 0.5 else q(ours.latencies, fraction),
                    statistics.median(theirs.latencies) if fraction == 0.5 else q(theirs.latencies, fraction),
                    target,
                )
            )
        rows.append(ratio_row(f"requests/s, {label}", ours.rate, theirs.rate, None, lambda v: f"{v:.0f}/s"))
        rows.append(
            ratio_row(
                f"server CPU, {label}, {args.requests} requests",
                ours.cpu,
                theirs.cpu,
                None,
                lambda v: f"{v:.2f} s",
            )
        )
        rows.append(
            ratio_row(
                f"server CPU per request, {label}",
                ours.cpu / len(ours.latencies),
                theirs.cpu / len(theirs.latencies),
                None,
            )
        )
    seq_ours, seq_theirs = runs["sequential", OURS], runs["sequential", THEIRS]
    rows.append(
        ratio_row(
            "response size, gzip",
            statistics.median(map(len, seq_ours.bodies)),
            statistics.median(map(len, seq_theirs.bodies)),
            None,
            kib,
        )
    )
    rows.append(ratio_row("response size, plain", len(plain[OURS]), len(plain[THEIRS]), None, kib))
    rows.append(ratio_row("samples in the response", samples(plain[OURS]), samples(plain[THEIRS]), None, str))
    rows.append(
        (
            "RSS after the load",
            f"{rss[OURS] / 1e6:.1f} MB",
            f"{rss[THEIRS] / 1e6:.1f} MB",
            f"{rss[OURS] / rss[THEIRS]:.2f}×",
            f"≤ {RSS_GOAL / 1e6:.0f} MB",
            "yes" if rss[OURS] <= RSS_GOAL else "NO",
        )
    )
    print_table(("measure", OURS, THEIRS, "ours/theirs", "target", "ok"), rows)

    inside_ms = statistics.median(inside.durations)
    back_to_back = statistics.median(seq_theirs.latencies)
    once_a_second = statistics.median(inside.theirs)
    print("The rdma collector inside the agent as a user runs it (no config file: every collector at its")
    print("defaults, the rdma collector every 15 s; no GPU, an empty kernel log),", end="")
    print(f" {len(inside.durations)} runs")
    print("after the first, beside node_exporter's single-client scrapes of the same tree; load average")
    print(f"{min(inside.loads):.2f} .. {max(inside.loads):.2f}:\n")
    print_table(
        ("measure", OURS, THEIRS, "ours/theirs", "goal", "ok"),
        [
            (
                "rdma collector duration (median) / node_exporter scrape p50, 1 client back to back",
                ms(inside_ms),
                ms(back_to_back),
                f"{inside_ms / back_to_back:.2f}×",
                f"≤ {IN_AGENT_GOAL:g}×",
                "yes" if inside_ms / back_to_back <= IN_AGENT_GOAL else "NO",
            ),
            (
                "rdma collector duration (median) / node_exporter scrape p50, 1 client once a second",
                ms(inside_ms),
                ms(once_a_second),
                f"{inside_ms / once_a_second:.2f}×",
                "",
                "",
            ),
            (
                "rdma collector duration, slowest run / node_exporter scrape p90, once a second",
                ms(max(inside.durations)),
                ms(q(inside.theirs, 0.9)),
                f"{max(inside.durations) / q(inside.theirs, 0.9):.2f}×",
                "",
                "",
            ),
        ],
    )

    theirs_cost = theirs_durations(seq_theirs.bodies)
    n_theirs = len(seq_theirs.bodies)
    rows = [
        (
            "clusterhealth, rdma collection in the agent (its own duration metric)",
            "first run (opens every file), rdma-only agent",
            ms(cold_duration),
            "",
        ),
        (
            "",
            f"later runs, agent at its defaults ({len(inside.durations)} runs, every 15 s)",
            ms(statistics.median(inside.durations)),
            ms(max(inside.durations)),
        ),
    ]
    for key, label in (
        ("collect", "RdmaCollector.collect()"),
        ("render", "+ generate_latest()"),
        ("gzip", "+ gzip level 5"),
        ("total", "= one collection, rendered"),
    ):
        rows.append(
            (
                f"clusterhealth, in this process, {args.collections} runs" if key == "collect" else "",
                label,
                ms(statistics.median(cost[key])),
                ms(q(cost[key], 0.99)),
            )
        )
    for key, label in (
        ("infiniband", 'collector="infiniband"'),
        ("netclass", 'collector="netclass"'),
        ("both", "infiniband + netclass"),
    ):
        rows.append(
            (
                f"node_exporter, node_scrape_collector_duration_seconds, {n_theirs} scrapes"
                if key == "infiniband"
                else "",
                label,
                ms(statistics.median(theirs_cost[key])),
                ms(q(theirs_cost[key], 0.99)),
            )
        )
    rows.append(
        (
            "node_exporter, whole /metrics request (sequential, from outside)",
            "per scrape",
            ms(statistics.median(seq_theirs.latencies)),
            ms(q(seq_theirs.latencies, 0.99)),
        )
    )
    print("Work per collection (what each does to read the tree once):\n")
    print_table(("who", "what", "p50", "p99"), rows)

    ratios = sorted(ours / theirs for ours, theirs in pairs)
    ours_read = [ours for ours, _ in pairs]
    theirs_read = [theirs for _, theirs in pairs]
    print(f"One read of the tree, side by side ({len(pairs)} pairs, 20 ms apart, the order alternating):\n")
    read_ratio = statistics.median(ratios)
    print_table(
        ("measure", OURS, THEIRS, "ours/theirs", "target", "ok"),
        [
            (
                "read, median of the per-pair ratios",
                ms(statistics.median(ours_read)),
                ms(statistics.median(theirs_read)),
                f"{read_ratio:.2f}×",
                "≤ 1.0×",
                "yes" if read_ratio <= 1.0 else "NO",
            ),
            (
                "read, p10..p90 of the per-pair ratios",
                ms(q(ours_read, 0.1)) + " .. " + ms(q(ours_read, 0.9)),
                ms(q(theirs_read, 0.1)) + " .. " + ms(q(theirs_read, 0.9)),
                f"{q(ratios, 0.1):.2f}× .. {q(ratios, 0.9):.2f}×",
                "",
                "",
            ),
        ],
    )
    print_table(
        ("CPU time per read of the tree", OURS, THEIRS, "ours/theirs"),
        [
            (
                "ours: read (collect); theirs: whole scrape (read, render, HTTP)",
                ms(cpu_cost.ours_read),
                ms(cpu_cost.theirs_scrape),
                f"{cpu_cost.ours_read / cpu_cost.theirs_scrape:.2f}×",
            ),
            (
                "ours: read and render (generate_latest); theirs: whole scrape",
                ms(cpu_cost.ours_read + cpu_cost.ours_render),
                ms(cpu_cost.theirs_scrape),
                f"{(cpu_cost.ours_read + cpu_cost.ours_render) / cpu_cost.theirs_scrape:.2f}×",
            ),
        ],
    )
    print("ours: RdmaCollector.collect() (sysfs read and metric families built) in this process;")
    print("theirs: node_scrape_collector_duration_seconds infiniband + netclass of the scrape beside it.\n")

    print("How to read it:")
    print("- node_exporter reads sysfs and renders on every scrape; clusterhealth reads sysfs every 15 s in")
    print("  the background and a scrape sends cached gzip bytes. The /metrics rows compare what a scraper")
    print("  waits for; the table above compares the work of one read of the tree.")
    print("- The work differs: node_exporter 1.5.0's infiniband collector reads counters/ but not")
    print("  hw_counters/, and its netclass collector reads every attribute of every interface; the agent")
    print("  reads the counters/ files it exports or watches for saturation, the hw_counters/ files it")
    print("  exports (five by default), the HCAs' PCIe links and the MTUs of the RDMA devices' interfaces.")
    print("- The agent's duration metric is its last run's: the first run opens every file it holds; the")
    print(
        "  later runs, in an agent at its defaults, are what a node pays every 15 s, and the goal's figure."
    )
    print("- In this process the collector reads the tree back to back (warm caches); inside the agent a run")
    print("  comes every 15 s and shares the interpreter with the other collectors and the HTTP server.")
    print("- node_exporter's response also carries its go_*, process_* and promhttp_* self-metrics,")
    print("  gathered per scrape; the agent's carries clusterhealth_build_info and the scrape meta series.")
    print("- Server CPU is the server process's user+system time during that load; the load generator")
    print("  runs in this process on the same cores.")
    seq_cpu = seq_ours.cpu / len(seq_ours.latencies)
    seq_p50 = statistics.median(seq_ours.latencies)
    if seq_p50 > 0.02 and seq_p50 > 10 * seq_cpu:
        print(
            f"- clusterhealth's p50 ({ms(seq_p50)}) is far above the CPU it spent per request "
            f"({ms(seq_cpu)}): the response"
        )
        print("  waits rather than works. ~40 ms is Linux's minimum delayed-ACK time: a response written")
        print("  in two sends (headers, then body) on a socket without TCP_NODELAY stalls on Nagle until")
        print("  the client's delayed ACK of the first send.")
    if any("error" in line.lower() for line in agent_log):
        print("\nagent stderr:\n" + "".join(agent_log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
