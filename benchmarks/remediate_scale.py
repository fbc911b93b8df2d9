"""What one reconcile of `clusterhealth remediate` costs at 1,024 and 16,384 nodes.

The Debian prometheus serves the verdicts of N agents as scraped every 15 s over the last 25
minutes (`clusterhealth_node_verdict`, `clusterhealth_node_info`, the sick nodes'
`clusterhealth_check_status`), backfilled with `promtool tsdb create-blocks-from openmetrics`.
1 % of the nodes are unhealthy and have been for 20 minutes, 0.5 % turned unhealthy 2 minutes ago
(still holding), 0.5 % came back healthy 10 minutes ago, the rest are healthy. The remediator runs
its real reading of Prometheus (fleet/remediate/verdicts.py), its real engine and loop
(Remediator.reconcile) against an in-memory scheduler (fleet/remediate/memory.py), so that the
figures are the remediator's and Prometheus's, not a scheduler's: a Slurm controller answers
`scontrol show node -o` for 16,384 nodes in its own time, and each drain is one more call.

Prints, per size: the wall time of a reconcile (best and median of the runs), Prometheus's CPU
time answering it, the remediator's own CPU time, the queries and the bytes of JSON read, and the
remediator's peak Python memory (tracemalloc) and resident set. docs/performance.md records them.

    .venv/bin/python benchmarks/remediate_scale.py                 # 1,024 and 16,384 nodes
    .venv/bin/python benchmarks/remediate_scale.py --nodes 1024    # one size
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from clusterhealth.fleet.prometheus import Prometheus
from clusterhealth.fleet.remediate.config import BudgetConfig, RemediateConfig
from clusterhealth.fleet.remediate.memory import MemoryBackend
from clusterhealth.fleet.remediate.reconcile import Remediator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fabric_scale import _start_prometheus  # a sibling script, not a package

SCRAPE = 15.0
HISTORY = 1500.0  # settle_seconds (900) + stale_seconds (180) and some


def _names(n: int) -> list[str]:
    return [f"gpu{i:05d}" for i in range(1, n + 1)]


def _history(n: int, end: float) -> tuple[str, dict[str, str]]:
    """The OpenMetrics text of N agents' last HISTORY seconds, and what each node is."""
    names = _names(n)
    kinds = {}
    for i, name in enumerate(names):
        kinds[name] = (
            "sick" if i % 100 == 0 else "new" if i % 200 == 1 else "back" if i % 200 == 2 else "healthy"
        )
    times = [end - HISTORY + k * SCRAPE for k in range(int(HISTORY // SCRAPE) + 1)]
    verdict, info, checks = [], [], []
    for name in names:
        target = f'instance="{name}:9845",job="clusterhealth"'
        kind = kinds[name]
        for t in times:
            sick = kind == "sick" or (kind == "new" and t >= end - 120) or (kind == "back" and t < end - 600)
            state, action = ("unhealthy", "reset_gpu") if sick else ("healthy", "none")
            verdict.append(
                f'clusterhealth_node_verdict{{{target},state="{state}",action="{action}"}} 1 {t:.0f}'
            )
            info.append(f'clusterhealth_node_info{{{target},node="{name}"}} 1 {t:.0f}')
            if sick:
                checks.append(f'clusterhealth_check_status{{{target},check="gpu_xid",subject="3"}} 2 {t:.0f}')
    out = []
    for family, lines in (
        ("clusterhealth_node_verdict", verdict),
        ("clusterhealth_node_info", info),
        ("clusterhealth_check_status", checks),
    ):
        out.append(f"# TYPE {family} gauge")
        # Each series' samples together, in time order.
        out.extend(sorted(lines, key=lambda line: (line.rsplit(" ", 2)[0], float(line.rsplit(" ", 1)[1]))))
    out.append("# EOF")
    return "\n".join(out) + "\n", kinds


def serve(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The Debian prometheus serving root/tsdb (as fabric_scale.py starts it), scraping nothing."""
    (root / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    server, url, _ = _start_prometheus(root)
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
            return server, url
    except OSError:
        raise SystemExit("prometheus did not start") from None


@dataclass
class Run:
    seconds: float
    prometheus_cpu: float
    own_cpu: float
    queries: int
    megabytes: float
    peak_python_mb: float
    rss_mb: float
    orders: int
    left: int


def _reconcile(url: str, server: subprocess.Popen[bytes], n: int, end: float, traced: bool = False) -> Run:
    """One reconcile; with ``traced``, under tracemalloc (its peak; tracemalloc slows Python down,
    so the timed runs are not traced)."""
    config = RemediateConfig(
        hold_seconds=300,
        settle_seconds=900,
        stale_seconds=180,
        budget=BudgetConfig(max_unavailable=max(1, n // 20), max_unavailable_per_domain=n, slow_start=False),
    )
    prometheus = Prometheus(url, timeout=600)
    remediator = Remediator(config, MemoryBackend(_names(n)), prometheus, act=True, clock=lambda: end)
    serving = psutil.Process(server.pid)
    if traced:
        tracemalloc.start()
    before, own, t0 = serving.cpu_times(), time.process_time(), time.perf_counter()
    result = remediator.reconcile()
    seconds = time.perf_counter() - t0
    after = serving.cpu_times()
    peak = 0
    if traced:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert result.plan is not None, result.problem
    return Run(
        seconds=seconds,
        prometheus_cpu=after.user + after.system - before.user - before.system,
        own_cpu=time.process_time() - own,
        queries=prometheus.requests,
        megabytes=prometheus.bytes_read / 1e6,
        peak_python_mb=peak / 1e6,
        rss_mb=psutil.Process().memory_info().rss / 1e6,
        orders=len(result.done),
        left=len(result.plan.left),
    )


def the_end() -> float:
    """The moment the reconciles happen at (their clock): a whole minute, ten minutes ago."""
    return math.floor(time.time() / 60) * 60 - 600


def prepare(root: Path, n: int, end: float) -> tuple[dict[str, str], float]:
    """N agents' history backfilled into ``root/tsdb``: what each node is, and the seconds it took."""
    t0 = time.perf_counter()
    text, kinds = _history(n, end)
    (root / "history.om").write_text(text)
    del text
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(root / "history.om"),
            str(root / "tsdb"),
        ],
        check=True,
        capture_output=True,
    )
    (root / "history.om").unlink()
    return kinds, time.perf_counter() - t0


def measure(n: int, runs: int) -> None:
    end = the_end()
    with tempfile.TemporaryDirectory(prefix="remediate-scale-") as tmp:
        root = Path(tmp)
        kinds, prepared = prepare(root, n, end)
        server, url = serve(root)
        try:
            done = [_reconcile(url, server, n, end) for _ in range(runs)]
            traced = _reconcile(url, server, n, end, traced=True)
            rss = psutil.Process(server.pid).memory_info().rss / 1e6
        finally:
            server.terminate()
            server.wait()
    sick = sum(1 for k in kinds.values() if k == "sick")
    expected = min(sick, max(1, n // 20))
    assert all(r.orders == expected for r in done), [r.orders for r in done]
    times = sorted(r.seconds for r in done)
    print(
        f"{n:>6} nodes ({sick} sick and held, {expected} drained per reconcile; history prepared in "
        f"{prepared:.0f} s): reconcile {times[0]:.2f} s best, {statistics.median(times):.2f} s median "
        f"of {runs}; Prometheus CPU {statistics.median(r.prometheus_cpu for r in done):.2f} s, "
        f"remediator CPU {statistics.median(r.own_cpu for r in done):.2f} s; "
        f"{done[0].queries} queries, {done[0].megabytes:.1f} MB of JSON; remediator peak Python memory "
        f"{traced.peak_python_mb:.0f} MB, RSS {max(r.rss_mb for r in done):.0f} MB; "
        f"Prometheus RSS {rss:.0f} MB",
        flush=True,
    )


def main() -> None:
    logging.getLogger("clusterhealth").setLevel(logging.ERROR)  # not a line per drain
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="fleet sizes (default 1024 and 16384)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for n in args.nodes or [1024, 16384]:
        measure(n, args.runs)


if __name__ == "__main__":
    main()
