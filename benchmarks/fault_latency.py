#!/usr/bin/env python3
"""/metrics latency and memory of the agent under faults, against the same agent healthy; prints a table.

The tests check that /metrics keeps answering while an NVML call hangs and while a kernel-log flood
is read; how fast it answers and what the flood costs in memory is measured here, not asserted
there (the machine is shared and noisy). Three agents run one after another on a simulated 2-GPU
node (`clusterhealth agent --simulate`, a real process):

- healthy: the baseline of this run;
- hung NVML: every temperature query blocks for 120 s from 1 s in (a wedged driver);
- kernel-log flood: 100,000 /dev/kmsg records (the real lines of tests/fixtures/kmsg, repeated)
  read 5,000 per 0.5 s cycle while /metrics is scraped.

For each, one client scrapes /metrics back to back for the measuring window; the table gives p50,
p99 and max latency, their ratio to the healthy run, and the agent's RSS at the end.

Usage: benchmarks/fault_latency.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import yaml
from agentproc import start_agent

ROOT = Path(__file__).resolve().parent.parent
KMSG = ROOT / "tests" / "fixtures" / "kmsg"
FLOOD_RECORDS = 100_000


def escape(text: str) -> bytes:
    """A message as /dev/kmsg prints it: control bytes, non-ASCII and the backslash as \\xNN."""
    return b"".join(
        bytes((b,)) if 0x20 <= b < 0x7F and b != 0x5C else b"\\x%02x" % b for b in text.encode("utf-8")
    )


def kmsg_flood(path: Path) -> None:
    lines = [row.split("\t", 1)[1] for row in (KMSG / "lines.txt").read_text(encoding="utf-8").splitlines()]
    lines += [e["line"] for e in json.loads((KMSG / "extra_lines.json").read_text(encoding="utf-8"))]
    records = [escape(line) for line in lines]
    with path.open("wb") as out:
        for seq in range(1, FLOOD_RECORDS + 1):
            out.write(b"6,%d,%d,-;%s\n" % (seq, 5_000_000 + seq, records[seq % len(records)]))


def start_fault_agent(
    workdir: Path, name: str, scenario: dict[str, object], kmsg: Path
) -> tuple[subprocess.Popen[str], int]:
    config = workdir / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "collectors": {
                    "gpu": {"interval_seconds": 1, "timeout_seconds": 2},
                    "kernel_log": {
                        "interval_seconds": 0.5,
                        "max_records_per_cycle": 5000,
                        # The records read are opt-in; the flood's note counts them.
                        "include_metrics": ["clusterhealth_kernel_log_records_total"],
                    },
                }
            }
        )
    )
    scenario_path = workdir / f"{name}-scenario.yaml"
    scenario_path.write_text(yaml.safe_dump(scenario))
    proc, port, _ = start_agent(
        *("--config", str(config), "--simulate", str(scenario_path)),
        *("--kmsg-path", str(kmsg), "--sysfs-root", str(workdir)),
        name=f"{name}: agent",
    )
    return proc, port


def scrape_for(port: int, seconds: float) -> tuple[list[float], bytes]:
    latencies: list[float] = []
    body = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            body = response.read()
        latencies.append(time.perf_counter() - start)
    return sorted(latencies), body


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()

    runs: dict[str, tuple[list[float], float, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        empty, flood = workdir / "kmsg-empty", workdir / "kmsg-flood"
        empty.write_bytes(b"")
        kmsg_flood(flood)
        cases = {
            "healthy": ({"gpu_count": 2}, empty),
            "hung NVML call": (
                {
                    "gpu_count": 2,
                    "faults": [{"gpu": 0, "from_seconds": 1, "hang": {"nvmlDeviceGetTemperature": 120}}],
                },
                empty,
            ),
            f"kernel-log flood ({FLOOD_RECORDS:,} records)": ({"gpu_count": 2}, flood),
        }
        for name, (scenario, kmsg) in cases.items():
            proc, port = start_fault_agent(workdir, re.sub(r"\W+", "-", name), scenario, kmsg)
            try:
                time.sleep(2)  # past the first collection, and past the start of the hang
                latencies, body = scrape_for(port, args.seconds)
                rss = psutil.Process(proc.pid).memory_info().rss
                read = re.search(rb"^clusterhealth_kernel_log_records_total (\S+)$", body, re.M)
                note = f"{float(read[1]):,.0f} records read" if read and kmsg is flood else ""
                if "hung" in name:
                    gpu = re.search(
                        rb'^clusterhealth_scrape_collector_success\{collector="gpu"\} (\S+)$', body, re.M
                    )
                    note = f"gpu collector success {gpu[1].decode() if gpu else 'absent'}"
                runs[name] = (latencies, rss, note)
            finally:
                proc.terminate()
                proc.wait(10)

    base_latencies, base_rss, _ = runs["healthy"]
    base = {q: percentile(base_latencies, q) for q in (0.5, 0.99)}
    print(
        f"clusterhealth agent, 2 simulated GPUs, one client back to back for {args.seconds:g} s, "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        f"| {'case':<34} | {'p50':>8} | {'p99':>8} | {'max':>8} | {'p99 / healthy':>13} | {'RSS':>8} | note"
    )
    print(f"| {'-' * 34} | {'-' * 8} | {'-' * 8} | {'-' * 8} | {'-' * 13} | {'-' * 8} | ----")
    for name, (latencies, rss, note) in runs.items():
        p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        print(
            f"| {name:<34} | {p50 * 1000:6.2f}ms | {p99 * 1000:6.2f}ms | {latencies[-1] * 1000:6.2f}ms"
            f" | {p99 / base[0.99]:12.1f}x | {rss / 1e6:6.1f}MB | {note}"
        )
    flood_rss = next(rss for name, (_, rss, _) in runs.items() if name.startswith("kernel-log flood"))
    print(f"\nRSS of the flood run against the healthy one: {flood_rss / base_rss:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
