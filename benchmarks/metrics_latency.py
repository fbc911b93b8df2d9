#!/usr/bin/env python3
"""Speed and memory of the agent on the simulated 8-GPU node; prints a table.

Runs `clusterhealth agent --simulate` as a real process and measures, from outside:
- /metrics latency (p50, p99, max) with N concurrent keep-alive clients, like many Prometheus
  servers and dashboards at once: spread over each second (the target), all at the same instant,
  and back to back (a saturation figure);
- resident memory (RSS) after that load;
- CPU used over an idle minute at the default 10 s sampling interval (no scrapes), as a share of
  one core.

Usage: benchmarks/metrics_latency.py [--clients 50] [--seconds 10] [--cpu-seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from agentproc import start_agent

ROOT = Path(__file__).resolve().parent.parent
MODES = {"staggered": "1/s each, spread", "burst": "1/s each, all at once", "saturate": "back to back"}
SCENARIO = ROOT / "exporters" / "sim" / "scenarios" / "h100-faulty.yaml"


def start_gpu_agent(interval: float) -> tuple[subprocess.Popen[str], int]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(f"collectors:\n  gpu:\n    interval_seconds: {interval}\n")
    try:
        proc, port, _ = start_agent("--config", config.name, "--simulate", str(SCENARIO))
    finally:
        os.unlink(config.name)
    return proc, port


async def _client(
    port: int, deadline: float, latencies: list[float], sizes: list[int], period: float | None, phase: float
) -> None:
    """One scraper on a keep-alive connection: every `period` seconds at `phase`, or back to back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: gzip\r\n\r\n"
    next_at = time.monotonic() + phase
    while time.monotonic() < deadline:
        if period is not None:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
        start = time.perf_counter()
        writer.write(request)
        await writer.drain()
        length = 0
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        latencies.append(time.perf_counter() - start)
        sizes.append(len(body))
    writer.close()


async def load(port: int, clients: int, seconds: float, mode: str) -> tuple[list[float], list[int]]:
    """`staggered`: each client scrapes once a second at its own offset, as Prometheus servers
    spread their scrapes; `burst`: all clients scrape at the same instant every second;
    `saturate`: every client scrapes back to back (a stress figure, not a target)."""
    latencies: list[float] = []
    sizes: list[int] = []
    deadline = time.monotonic() + seconds
    period = None if mode == "saturate" else 1.0
    phases = [0.0 if mode != "staggered" else i / clients for i in range(clients)]
    await asyncio.gather(*(_client(port, deadline, latencies, sizes, period, p) for p in phases))
    return latencies, sizes


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def wait_for_first_collection(port: int) -> None:
    import urllib.request

    for _ in range(100):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
            if b"clusterhealth_gpu_up" in response.read():
                return
        time.sleep(0.1)
    raise SystemExit("no GPU series after 10 s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--cpu-seconds", type=float, default=60)
    args = ap.parse_args()

    proc, port = start_gpu_agent(interval=10)
    try:
        wait_for_first_collection(port)
        agent = psutil.Process(proc.pid)
        runs = {mode: asyncio.run(load(port, args.clients, args.seconds, mode)) for mode in MODES}
        rss = agent.memory_info().rss
        time.sleep(1)
        before = agent.cpu_times()
        time.sleep(args.cpu_seconds)
        after = agent.cpu_times()
        cpu = (after.user - before.user + after.system - before.system) / args.cpu_seconds
    finally:
        proc.terminate()
        proc.wait(10)

    rows: list[tuple[object, ...]] = []
    for mode, (latencies, _) in runs.items():
        latencies.sort()
        p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        target = ("<= 5 ms", p99 <= 0.005) if mode == "staggered" else ("",)
        label = f"{args.clients} clients, {MODES[mode]}"
        rows.append((f"/metrics p50, {label}", "", f"{p50 * 1000:.2f} ms"))
        rows.append((f"/metrics p99, {label}", target[0], f"{p99 * 1000:.2f} ms", *target[1:]))
        rows.append((f"/metrics max, {label}", "", f"{latencies[-1] * 1000:.2f} ms"))
        rows.append((f"requests, {label}", "", f"{len(latencies) / args.seconds:.0f}/s"))
    rows += [
        ("response size (gzip)", "", f"{statistics.median(runs['staggered'][1]) / 1024:.1f} KiB"),
        ("RSS after load", "<= 60 MB", f"{rss / 1e6:.1f} MB", rss <= 60e6),
        ("CPU, idle, 10 s interval", "<= 0.5% of a core", f"{cpu * 100:.2f}%", cpu <= 0.005),
    ]
    print(f"clusterhealth agent on {SCENARIO.name} (8 simulated GPUs), {os.cpu_count()} CPUs\n")
    print(f"| {'measure':<52} | {'target':<18} | {'measured':<12} | ok  |")
    print(f"| {'-' * 52} | {'-' * 18} | {'-' * 12} | --- |")
    for row in rows:
        ok = "" if len(row) < 4 else ("yes" if row[3] else "NO")
        print(f"| {row[0]!s:<52} | {row[1]!s:<18} | {row[2]!s:<12} | {ok:<3} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
