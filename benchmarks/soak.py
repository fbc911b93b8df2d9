#!/usr/bin/env python3
"""Load and soak of the agent's endpoint; prints a table.

Runs `clusterhealth agent` as a real process on the simulated 8-GPU node (exporters' h100-faulty
scenario) with a simulated 10-HCA sysfs tree and every collector at its defaults, then:
1. load: N concurrent scrapers (100) for S seconds (60), each scraping back to back with
   `Accept-Encoding: gzip`; half keep their connection, half open a new one for every scrape
   (so accept() and connection teardown are exercised too); every answer must be a 200 with the
   whole body;
2. soak: M sequential scrapes (100,000) on one keep-alive connection, every 1,000th on a new
   connection; the agent's RSS, threads and file descriptors are read before (after a warm-up
   of 5,000 scrapes) and after.
Targets (issue 9): no error under load; RSS growth under 1 MB over the soak; no thread or file
descriptor left behind.

Usage: benchmarks/soak.py [--scrapers 100] [--seconds 60] [--scrapes 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from agentproc import start_agent

from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import SCENARIO_DIR

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: soak\r\nAccept-Encoding: gzip\r\n\r\n"
WARMUP = 5_000


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: int = 0


async def scrape(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(REQUEST)
    await writer.drain()
    status = await reader.readline()
    if not status.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"status {status!r}")
    length = None
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if length is None:
        raise RuntimeError("no Content-Length")
    await reader.readexactly(length)


async def scraper(port: int, deadline: float, keep_alive: bool, tally: Tally) -> None:
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            if connection is None:
                connection = await asyncio.open_connection("127.0.0.1", port)
                tally.connections += 1
            await scrape(*connection)
            tally.latencies.append(time.perf_counter() - start)
        except (OSError, RuntimeError, asyncio.IncompleteReadError) as err:
            tally.errors.append(f"{type(err).__name__}: {err}")
            connection = None
            continue
        if not keep_alive:
            connection[1].close()
            await connection[1].wait_closed()
            connection = None
    if connection is not None:
        connection[1].close()
        await connection[1].wait_closed()


async def load(port: int, scrapers: int, seconds: float) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(scraper(port, deadline, i % 2 == 0, tally) for i in range(scrapers)))
    return tally


async def sequential(port: int, count: int, tally: Tally) -> None:
    connection = None
    for i in range(count):
        try:
            if connection is None or i % 1000 == 0:
                if connection is not None:
                    connection[1].close()
                    await connection[1].wait_closed()
                connection = await asyncio.open_connection("127.0.0.1", port)
                tally.connections += 1
            start = time.perf_counter()
            await scrape(*connection)
            tally.latencies.append(time.perf_counter() - start)
        except (OSError, RuntimeError, asyncio.IncompleteReadError) as err:
            tally.errors.append(f"{type(err).__name__}: {err}")
            connection = None
    if connection is not None:
        connection[1].close()
        await connection[1].wait_closed()


def census(process: psutil.Process) -> tuple[int, int, int]:
    return process.memory_info().rss, process.num_threads(), process.num_fds()


def settle(process: psutil.Process, fds: int, seconds: float = 10) -> tuple[int, int, int]:
    """The census once the server has closed what the clients closed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.num_fds() > fds:
        time.sleep(0.1)
    return census(process)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapers", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scrapes", type=int, default=100_000)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        tree = Path(tmp) / "sys"
        sim_sysfs.build(tree)
        proc, port, log = start_agent(
            "--simulate", str(SCENARIO_DIR / "h100-faulty.yaml"), "--sysfs-root", str(tree)
        )
        agent = psutil.Process(proc.pid)
        try:
            time.sleep(2)  # first collections
            idle = census(agent)
            started = time.monotonic()
            under_load = asyncio.run(load(port, args.scrapers, args.seconds))
            load_wall = time.monotonic() - started
            after_load = settle(agent, idle[2])

            warm = Tally()
            asyncio.run(sequential(port, WARMUP, warm))
            before = settle(agent, idle[2])
            soak = Tally()
            started = time.monotonic()
            asyncio.run(sequential(port, args.scrapes, soak))
            soak_wall = time.monotonic() - started
            after = settle(agent, before[2])
        finally:
            proc.terminate()
            proc.wait(10)

    rows = [
        ("load: scrapers, seconds", "", f"{args.scrapers}, {args.seconds:g} s", ""),
        (
            "load: scrapes answered",
            "",
            f"{len(under_load.latencies)} ({len(under_load.latencies) / load_wall:.0f}/s)",
            "",
        ),
        ("load: connections opened", "", str(under_load.connections), ""),
        ("load: errors", "0", str(len(under_load.errors)), "yes" if not under_load.errors else "NO"),
        (
            "load: latency p50 / p99",
            "",
            f"{ms(statistics.median(under_load.latencies))} / "
            f"{ms(sorted(under_load.latencies)[int(len(under_load.latencies) * 0.99)])}",
            "",
        ),
        (
            "load: threads before / after",
            "equal",
            f"{idle[1]} / {after_load[1]}",
            "yes" if idle[1] == after_load[1] else "NO",
        ),
        (
            "load: fds before / after",
            "equal",
            f"{idle[2]} / {after_load[2]}",
            "yes" if after_load[2] <= idle[2] else "NO",
        ),
        (
            "soak: sequential scrapes (after 5,000 warm-up)",
            "",
            f"{len(soak.latencies)} in {soak_wall:.0f} s",
            "",
        ),
        ("soak: errors", "0", str(len(soak.errors)), "yes" if not soak.errors else "NO"),
        ("soak: RSS before / after", "", f"{before[0] / 1e6:.2f} MB / {after[0] / 1e6:.2f} MB", ""),
        (
            "soak: RSS growth",
            "< 1 MB",
            f"{(after[0] - before[0]) / 1e3:+.0f} kB",
            "yes" if after[0] - before[0] < 1e6 else "NO",
        ),
        (
            "soak: threads before / after",
            "equal",
            f"{before[1]} / {after[1]}",
            "yes" if before[1] == after[1] else "NO",
        ),
        (
            "soak: fds before / after",
            "equal",
            f"{before[2]} / {after[2]}",
            "yes" if after[2] <= before[2] else "NO",
        ),
    ]
    print(f"clusterhealth agent, simulated 8-GPU node and 10-HCA sysfs, {os.cpu_count()} CPUs\n")
    widths = [
        max(len(str(row[i])) for row in [("measure", "target", "measured", "ok"), *rows]) for i in range(4)
    ]
    for row in [("measure", "target", "measured", "ok"), tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(f"{cell!s:<{w}}" for cell, w in zip(row, widths, strict=True)) + " |")
    for errors, what in ((under_load.errors, "load"), (soak.errors, "soak")):
        if errors:
            print(f"\n{what} errors (first 5): {errors[:5]}")
    if any("level=error" in line and "gpu" not in line for line in log):
        print("\nagent errors:\n" + "".join(line for line in log if "level=error" in line))
    return 0 if not (under_load.errors or soak.errors) else 1


if __name__ == "__main__":
    sys.exit(main())
