#!/usr/bin/env python3
"""/metrics latency and memory of the agent beside node_exporter on the same node; prints a table.

Runs, as real processes on one simulated node (the 8-GPU `h100-faulty` scenario, the 10-HCA sysfs
tree of benchmarks/rdma_latency.py, the scenario's kernel log):
- `clusterhealth agent` as a user runs it: no config file, every collector at its defaults;
- the Debian `prometheus-node-exporter` with its infiniband and netclass collectors on the same
  tree, and `--web.max-requests=0` (its default of 40 answers 503 to the 41st concurrent scrape).

Both are scraped the same way, from outside, with `Accept-Encoding: gzip` on keep-alive
connections, in turns (agent, node_exporter, agent, ...) so that both see the same machine:
- 1 client back to back;
- 50 clients back to back (a saturation figure: requests queue behind one another);
- 50 clients each scraping once a second, spread over the second, as Prometheus servers do.
It prints p50, p99 and max of each, the ratios ours / node_exporter's (goal, issue 27: p99 at most
0.15x at 1 client and at 50 clients spread), both servers' RSS after the load (goal: the agent at
most 40 MB), and the agent's CPU over an idle minute.

Usage: benchmarks/metrics_latency.py [--clients 50] [--seconds 10] [--rounds 2] [--cpu-seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from agentproc import start_agent
from rdma_latency import NODE_EXPORTER, build_tree, fetch, load_average, start_node_exporter

from clusterhealth.agent.collectors import COLLECTORS
from clusterhealth.agent.demo import kmsg_record
from clusterhealth.exporters.sim.scenario import SCENARIO_DIR, load_scenario

SCENARIO = SCENARIO_DIR / "h100-faulty.yaml"
OURS, THEIRS = "clusterhealth", "node_exporter"
P99_GOAL = 0.15  # issue 27: p99 ours / node_exporter's, at 1 client and at 50
RSS_GOAL = 40e6  # issue 27


@dataclass(frozen=True)
class Mode:
    label: str
    clients: int
    period: float | None  # seconds between one client's scrapes; None: back to back
    goal: bool  # the p99 ratio of this mode is one of issue 27's goals


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    cpu: float = 0.0  # the server's user + system seconds during the run


async def _client(port: int, deadline: float, run: Run, period: float | None, phase: float) -> None:
    """One scraper on a keep-alive connection: every `period` seconds at `phase`, or back to back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    next_at = time.monotonic() + phase
    while time.monotonic() < deadline:
        if period is not None:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
        start = time.perf_counter()
        body = await fetch(reader, writer)
        run.latencies.append(time.perf_counter() - start)
        run.sizes.append(len(body))
    writer.close()


def load(port: int, pid: int, mode: Mode, seconds: float, run: Run) -> None:
    """`mode.clients` scrapers for `seconds`; spread scrapers start at i/clients of a second."""
    process = psutil.Process(pid)
    phases = [i / mode.clients if mode.period else 0.0 for i in range(mode.clients)]

    async def everyone() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_client(port, deadline, run, mode.period, p) for p in phases))

    before = process.cpu_times()
    asyncio.run(everyone())
    after = process.cpu_times()
    run.cpu += after.user - before.user + after.system - before.system


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return bytes(response.read())


def wait_for_every_collector(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        health = json.loads(get(port, "/healthz"))["collectors"]
        if len(health) == len(COLLECTORS) and all(c["success"] is not None for c in health.values()):
            return
        time.sleep(0.2)
    raise SystemExit("the agent's collectors did not all report within 60 s")


def lay_out(root: Path) -> tuple[Path, list[str]]:
    """The node's tree and kernel log under `root`; the agent's flags that point at them."""
    tree = root / "sys"
    build_tree(tree)
    kmsg = root / "kmsg"
    lines = load_scenario(SCENARIO).kernel_log
    kmsg.write_bytes(b"".join(kmsg_record(n, line) for n, (_, line) in enumerate(lines, 1)))
    return tree, ["--simulate", str(SCENARIO), "--sysfs-root", str(tree), "--kmsg-path", str(kmsg)]


def q(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50, help="clients of the concurrent modes (50)")
    ap.add_argument("--seconds", type=float, default=10, help="seconds per mode, server and round (10)")
    ap.add_argument("--rounds", type=int, default=2, help="turns of each mode per server (2)")
    ap.add_argument("--cpu-seconds", type=float, default=60, help="idle seconds the agent's CPU is read (60)")
    ap.add_argument("--node-exporter", default=NODE_EXPORTER, metavar="PATH", help=f"default {NODE_EXPORTER}")
    args = ap.parse_args()
    binary = shutil.which(args.node_exporter)
    if binary is None:
        print(
            f"node_exporter not found at {args.node_exporter}: install the Debian package "
            "prometheus-node-exporter, or pass --node-exporter PATH",
            file=sys.stderr,
        )
        return 2
    modes = (
        Mode("1 client, back to back", 1, None, True),
        Mode(f"{args.clients} clients, back to back", args.clients, None, False),
        Mode(f"{args.clients} clients, 1/s each, spread", args.clients, 1.0, True),
    )
    runs = {(mode, name): Run() for mode in modes for name in (OURS, THEIRS)}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as tmp:
        tree, flags = lay_out(Path(tmp))
        agent, agent_port, agent_log = start_agent(*flags)
        exporter, exporter_port = start_node_exporter(binary, tree, "--web.max-requests=0")
        servers = {OURS: (agent_port, agent.pid), THEIRS: (exporter_port, exporter.pid)}
        try:
            wait_for_every_collector(agent_port)
            for port, pid in servers.values():
                load(port, pid, modes[0], 1.0, Run())  # warm-up
            for _ in range(args.rounds):
                for mode in modes:
                    for name, (port, pid) in servers.items():
                        loads.append(load_average())
                        load(port, pid, mode, args.seconds, runs[mode, name])
            loads.append(load_average())
            rss = {name: psutil.Process(pid).memory_info().rss for name, (_, pid) in servers.items()}
            agent_process = psutil.Process(agent.pid)
            time.sleep(1)
            before = agent_process.cpu_times()
            time.sleep(args.cpu_seconds)
            after = agent_process.cpu_times()
            cpu = (after.user - before.user + after.system - before.system) / args.cpu_seconds
        finally:
            for proc in (agent, exporter):
                proc.terminate()
            for proc in (agent, exporter):
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()

    print("/metrics of clusterhealth agent (every collector at its defaults) and node_exporter")
    print(f"(infiniband, netclass) on one simulated node: {SCENARIO.name}, the 10-HCA tree of")
    print(f"rdma_latency.py, {os.cpu_count()} CPUs; {args.rounds} turns of {args.seconds:g} s", end="")
    print(" per mode and server;")
    print(f"load average (1 min) during the runs: {min(loads):.2f} .. {max(loads):.2f}\n")
    header = ("measure", OURS, THEIRS, "ours/theirs", "goal", "ok")
    rows: list[tuple[str, ...]] = []
    for mode in modes:
        ours, theirs = runs[mode, OURS], runs[mode, THEIRS]
        for stat, fraction in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
            a, b = q(ours.latencies, fraction), q(theirs.latencies, fraction)
            goal = stat == "p99" and mode.goal
            ratio = a / b
            rows.append(
                (
                    f"/metrics {stat}, {mode.label}",
                    ms(a),
                    ms(b),
                    f"{ratio:.3f}×",
                    f"≤ {P99_GOAL:g}×" if goal else "",
                    ("yes" if ratio <= P99_GOAL else "NO") if goal else "",
                )
            )
        rows.append(
            (
                f"requests answered, {mode.label}",
                str(len(ours.latencies)),
                str(len(theirs.latencies)),
                f"{len(ours.latencies) / len(theirs.latencies):.2f}×",
                "",
                "",
            )
        )
        cpu_ours, cpu_theirs = ours.cpu / len(ours.latencies), theirs.cpu / len(theirs.latencies)
        rows.append(
            (
                f"server CPU per request, {mode.label}",
                ms(cpu_ours),
                ms(cpu_theirs),
                f"{cpu_ours / cpu_theirs:.3f}×",
                "",
                "",
            )
        )
    size_ours = statistics.median(runs[modes[0], OURS].sizes)
    size_theirs = statistics.median(runs[modes[0], THEIRS].sizes)
    rows.append(
        (
            "response size, gzip",
            f"{size_ours / 1024:.1f} KiB",
            f"{size_theirs / 1024:.1f} KiB",
            f"{size_ours / size_theirs:.2f}×",
            "",
            "",
        )
    )
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
    rows.append(
        (
            f"agent CPU over {args.cpu_seconds:g} idle s",
            f"{cpu * 100:.2f}% of a core",
            "",
            "",
            "≤ 0.5%",
            "yes" if cpu <= 0.005 else "NO",
        )
    )
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("| " + " | ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)) + " |")
    errors = [line for line in agent_log if "level=error" in line]
    if errors:
        print("\nagent errors:\n" + "".join(errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
