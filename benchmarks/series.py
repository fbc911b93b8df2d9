#!/usr/bin/env python3
"""Series and bytes per scrape of the simulated node, at the default settings and at full detail,
beside node_exporter's InfiniBand collector on the same HCAs; prints markdown tables.

The nodes are real `clusterhealth agent` processes without a config file (the default settings),
or with one that asks for every opt-in family and every counter (`include_metrics: ['*']` on each
collector, `hw_counters`, `error_counters`, `clocks_event_counters: ['*']`, and the GPUs' PCI
functions in `pcie_aer`):

- faulty: the golden node of tests/test_golden.py without its probe and pairwise group: the
  faulty H100 scenario frozen at 600 s (GPU 6 fell off the bus: 7 of 8 GPUs answer), the faulty
  simulated sysfs tree (10 mlx5 HCAs and irdma0), its kernel log replayed;
- healthy: the healthy H100 scenario (all 8 GPUs answer) on the healthy tree.

/metrics is fetched once every collector has reported and the audit has run, plain and gzipped.
A series is a sample line; the top families are printed by count.

Then every moment: the same two nodes at the default settings, the faulty scenario running from
the agent's start instead of frozen (GPU 6 answers for its first 45 s, then falls off the bus),
/metrics counted every second for `--watch` seconds from the first time every collector has
reported; the most any scrape had is issue 27's goal (at most 800 series on every node at every
moment). node_exporter (the Debian
`prometheus-node-exporter`, `--collector.disable-defaults --collector.infiniband`) reads the
same tree with irdma0 removed and an empty counter filled (node_exporter 1.5 drops its whole
collector on either; benchmarks/rdma_latency.py says why).

Usage: benchmarks/series.py [--node-exporter PATH] [--top 12] [--watch 75]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from agentproc import start_agent
from rdma_latency import build_tree, free_port, wait_listening

from clusterhealth.agent.collectors import COLLECTORS as TABLE
from clusterhealth.agent.demo import kmsg_record
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import SCENARIO_DIR, load_scenario

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
COLLECTORS = tuple(entry.name for entry in TABLE)
FULL_DETAIL = {
    "collectors": {
        **{name: {"include_metrics": ["*"]} for name in COLLECTORS},
        "gpu": {"include_metrics": ["*"], "clocks_event_counters": ["*"], "clocks_event_reasons": ["*"]},
        "rdma": {"include_metrics": ["*"], "hw_counters": ["*"], "error_counters": ["*"]},
        "pcie_aer": {"include_metrics": ["*"], "drivers": ["nvidia", "mlx5_core"]},
    }
}


def get(port: int, path: str = "/metrics", gzipped: bool = False) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if gzipped:
        request.add_header("Accept-Encoding", "gzip")
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


GOAL = 800  # issue 27: series per node at the default settings, at every moment


def lay_out(root: Path, node: str, frozen: bool = True) -> list[str]:
    """The node's files under `root`; the agent's flags that point at them."""
    if node == "faulty":
        data = yaml.safe_load((SCENARIO_DIR / "h100-faulty.yaml").read_text())
        if frozen:
            data["frozen_at_seconds"] = 600
    else:
        data = yaml.safe_load((SCENARIO_DIR / "h100-healthy.yaml").read_text())
    scenario = root / f"{node}.yaml"
    scenario.write_text(yaml.safe_dump(data))
    sim_sysfs.build(root / "sys", faulty=node == "faulty")
    kmsg = root / "kmsg"
    lines = load_scenario(scenario).kernel_log
    kmsg.write_bytes(b"".join(kmsg_record(n, line) for n, (_, line) in enumerate(lines, 1)))
    return ["--simulate", str(scenario), "--sysfs-root", str(root / "sys"), "--kmsg-path", str(kmsg)]


def wait_for_every_collector(port: int, log: list[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        health = json.loads(get(port, "/healthz"))["collectors"]
        if all(c["success"] is not None for c in health.values()) and len(health) == len(COLLECTORS):
            return
        time.sleep(0.2)
    raise SystemExit("the agent's collectors did not all report within 60 s:\n" + "".join(log))


def scrape_agent(flags: list[str], config: dict[str, object] | None, root: Path) -> tuple[bytes, int]:
    """(the plain exposition, its gzipped size) once every collector has reported."""
    args = list(flags)
    if config is not None:
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        args = ["--config", str(path), *args]
    proc, port, log = start_agent(*args)
    try:
        wait_for_every_collector(port, log)
        plain = get(port)
        return plain, len(get(port, gzipped=True))
    finally:
        proc.terminate()
        proc.wait(10)


def watch_agent(flags: list[str], seconds: float) -> list[tuple[float, int]]:
    """(seconds since the agent started, series) of a scrape every second, from the first time
    every collector has reported until `seconds` after the start."""
    started = time.monotonic()
    proc, port, log = start_agent(*flags)
    counts: list[tuple[float, int]] = []
    try:
        wait_for_every_collector(port, log)
        while time.monotonic() - started < seconds:
            plain = get(port)
            counts.append((time.monotonic() - started, sum(families(plain, "clusterhealth_").values())))
            time.sleep(1)
    finally:
        proc.terminate()
        proc.wait(10)
    return counts


def scrape_node_exporter(binary: str, root: Path) -> tuple[bytes, int]:
    tree = root / "ne-sys"
    build_tree(tree)
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--path.sysfs={tree}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, proc, "node_exporter")  # type: ignore[arg-type]
        plain = get(port)
        return plain, len(gzip.compress(plain))
    finally:
        proc.terminate()
        proc.wait(10)


def families(exposition: bytes, prefix: str) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in exposition.decode().splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name.startswith(prefix):
                counts[name] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node-exporter", default=NODE_EXPORTER, metavar="PATH", help=f"default {NODE_EXPORTER}")
    ap.add_argument("--top", type=int, default=12, help="families listed per run (default 12)")
    ap.add_argument(
        "--watch", type=float, default=75, help="seconds each node is watched at the defaults (default 75)"
    )
    args = ap.parse_args()
    loads = [os.getloadavg()[0]]
    runs: dict[tuple[str, str], tuple[collections.Counter[str], int, int]] = {}
    for node in ("faulty", "healthy"):
        for settings, config in (("default", None), ("full detail", FULL_DETAIL)):
            with tempfile.TemporaryDirectory(prefix="clusterhealth-series-") as tmp:
                root = Path(tmp)
                plain, zipped = scrape_agent(lay_out(root, node), config, root)
            runs[(node, settings)] = (families(plain, "clusterhealth_"), len(plain), zipped)

    print("| node | settings | series | families | bytes (text) | bytes (gzip) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (node, settings), (counts, plain_bytes, zipped) in runs.items():
        series = sum(counts.values())
        print(f"| {node} | {settings} | {series:,} | {len(counts)} | {plain_bytes:,} | {zipped:,} |")
    binary = shutil.which(args.node_exporter)
    if binary is None:
        print(f"\nnode_exporter not found at {args.node_exporter}: its figures are left out", file=sys.stderr)
    else:
        with tempfile.TemporaryDirectory(prefix="clusterhealth-series-") as tmp:
            plain, zipped = scrape_node_exporter(binary, Path(tmp))
        ib = families(plain, "node_infiniband_")
        print(
            f"| node_exporter infiniband (the faulty tree without irdma0) | default | "
            f"{sum(ib.values()):,} | {len(ib)} | {len(plain):,} (whole response) | {zipped:,} |"
        )

    watched: dict[str, list[tuple[float, int]]] = {}
    for node in ("faulty", "healthy"):
        with tempfile.TemporaryDirectory(prefix="clusterhealth-series-") as tmp:
            watched[node] = watch_agent(lay_out(Path(tmp), node, frozen=False), args.watch)
        loads.append(os.getloadavg()[0])
    print(
        f"\nEvery moment, at the default settings: a scrape a second until {args.watch:g} s after the "
        "agent started\n(the faulty scenario running, GPU 6 off the bus from 45 s):\n"
    )
    print("| node | scrapes | first | most (at) | fewest | goal | ok |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    for node, counts in watched.items():
        most = max(counts, key=lambda c: c[1])
        fewest = min(c[1] for c in counts)
        ok = "yes" if most[1] <= GOAL else "NO"
        print(
            f"| {node} | {len(counts)} | {counts[0][1]} | **{most[1]}** ({most[0]:.0f} s) | {fewest} | "
            f"≤ {GOAL} | {ok} |"
        )
    print(f"\nload average (1 min) during the runs: {min(loads):.2f} .. {max(loads):.2f}")

    for key in (("healthy", "default"), ("faulty", "default"), ("faulty", "full detail")):
        counts = runs[key][0]
        print(f"\nThe {args.top} largest families, {key[0]} node, {key[1]}:\n")
        print("| family | series |")
        print("| --- | ---: |")
        for name, count in counts.most_common(args.top):
            print(f"| `{name}` | {count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
