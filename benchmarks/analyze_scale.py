"""`clusterhealth analyze` at fleet scale: N nodes × 24 h against the Debian prometheus, end to end.

Builds a day of a pairwise group of N nodes as the agents export it (the generator of
benchmarks/fabric_scale.py: checks/fabric/simulation.py, the real schedule, the noise of issue 8,
one bad host h7 at half bandwidth), as Prometheus would have scraped it every 15 s, and backfills
it with promtool, two hours at a time (promtool reads its whole input once more for every two-hour
block it writes: a day in one file would be read fourteen times). The blocks are kept in
``--data`` (a directory per size), so that a second run, of another version of the reader, times
the same data.

Then it times `analyze` over the day, each run in a new Python process as a user's command runs
(``--window 24h``, the window ending at the day's end): wall time, the CPU of the analyze process
and of Prometheus, analyze's peak RSS, its queries and bytes of JSON, and the load of the machine.
``--profile`` adds a cProfile of one run: where analyze's own time goes. Every run must name the
seeded bad host (over a day of 16,384 nodes the noise names a few more: 1 % of runs fall short);
``--save`` writes a run's JSON verdict, to compare two versions' verdicts on the same blocks.
analyze asks several range queries at once (``--parallel``): its seconds waiting for answers are
summed over the requests in flight, and may exceed the wall time.

    .venv/bin/python benchmarks/analyze_scale.py --nodes 1024
    .venv/bin/python benchmarks/analyze_scale.py --nodes 16384 --data /var/tmp/analyze-scale --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.fleet import analyze as analyzing
from clusterhealth.fleet.prometheus import Prometheus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fabric_scale import (  # a sibling script, not a package
    DEFAULT_CONFIRM_RUNS,
    DEFAULT_PERIOD,
    GBIT,
    _start_prometheus,
    _write_openmetrics,
)

BLOCK_ROUNDS = int(7200 // DEFAULT_PERIOD)  # rounds in one of promtool's two-hour blocks
SEEDED = ["host", "h7"]
PROMTOOL = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q"]


def build(root: Path, n: int, hours: float, scrape: float) -> dict[str, float]:
    """Simulate and backfill the day into root/tsdb (once: kept with its meta.json)."""
    meta_path = root / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta["nodes"] == n and meta["hours"] == hours and meta["scrape"] == scrape:
            return meta
        raise SystemExit(f"{root} holds another size ({meta}); choose another --data")
    root.mkdir(parents=True, exist_ok=True)
    (root / "tsdb").mkdir(exist_ok=True)
    count = int(hours * 3600 // DEFAULT_PERIOD)
    fleet = sim.Fleet(sim.node_names(n), confirm_runs=DEFAULT_CONFIRM_RUNS, nominal=10 * GBIT)
    fleet.bad_hosts["h7"] = 0.5
    began = time.perf_counter()
    # Rounds start on a two-hour boundary, so that each slice is one of promtool's blocks.
    last = int(time.time() // DEFAULT_PERIOD) - 1
    first = (last - count + 1) // BLOCK_ROUNDS * BLOCK_ROUNDS
    rounds = sim.shifted(sim.play(fleet, 0, count, seed=5), first)
    played = time.perf_counter()
    samples, written, backfilling, pending = 0, 0, 0.0, None
    for k in range(0, count, BLOCK_ROUNDS):
        part = root / f"slice{k}.om"
        t0 = time.perf_counter()
        samples += _write_openmetrics(part, rounds[k : k + BLOCK_ROUNDS], DEFAULT_PERIOD, fleet.nodes, scrape)
        written += part.stat().st_size
        if pending is not None:  # the previous slice's promtool ran while this one was written
            _finish(pending)
        backfilling += time.perf_counter() - t0
        pending = (
            subprocess.Popen(
                [*PROMTOOL, str(part), str(root / "tsdb")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            ),
            part,
        )
        print(f"  slice {k // BLOCK_ROUNDS + 1}: {samples / 1e6:.0f} M samples so far", flush=True)
    if pending is not None:
        _finish(pending)
    end = (first + count) * DEFAULT_PERIOD
    meta = {
        "nodes": n,
        "hours": hours,
        "scrape": scrape,
        "end": end,
        "samples": samples,
        "openmetrics_bytes": written,
        "simulate_seconds": played - began,
        "write_and_backfill_seconds": time.perf_counter() - played,
        "tsdb_bytes": sum(p.stat().st_size for p in (root / "tsdb").rglob("*") if p.is_file()),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def _finish(pending: tuple[subprocess.Popen[bytes], Path]) -> None:
    process, part = pending
    _, err = process.communicate()
    part.unlink()
    if process.returncode:
        raise SystemExit(f"promtool failed on {part}: {err.decode()[-2000:]}")


def _settle(server: psutil.Process, url: str, deadline: float = 3600.0) -> float:
    """Wait until Prometheus has compacted the backfilled blocks (it starts a minute after it
    starts; kept with the blocks, so once per size): the seconds waited. Compacted is no
    compaction for a minute and a half and the process idle."""
    began = time.perf_counter()
    counted, since = _compactions(url), time.perf_counter()
    while time.perf_counter() - began < deadline:
        time.sleep(5)
        now = _compactions(url)
        if now != counted:
            counted, since = now, time.perf_counter()
        elif time.perf_counter() - since > 90 and server.cpu_percent(interval=2.0) < 5:
            break
    return time.perf_counter() - began


def _compactions(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("prometheus_tsdb_compactions_total "):
                return float(line.split()[1])
    return 0.0


def child(url: str, end: float, window: float, profile: str | None, save: str | None, parallel: int) -> None:
    """One analyze run, as the command runs it, in this (new) process; its figures on stdout."""
    client = Prometheus(url, timeout=600)
    client.parallel = parallel  # (set apart: an older reader, timed for comparison, has none)
    began = time.perf_counter()
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    result = analyzing.run(url, None, window, now=end, prometheus=client)
    document = result.to_dict()
    text = json.dumps(document, indent=2, allow_nan=False)
    if profiler and profile:
        profiler.disable()
        profiler.dump_stats(profile)
    total = time.perf_counter() - began
    if save:
        Path(save).write_text(text)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "total": total,
                "waiting": client.seconds_waiting,
                "decoding": client.seconds_decoding,
                "requests": client.requests,
                "bytes": client.bytes_read,
                "meetings": result.meetings,
                "suspects": sorted([s.kind, s.name] for s in result.suspects),
                "partial": result.partial,
                "maxrss_kb": usage.ru_maxrss,
                "cpu": usage.ru_utime + usage.ru_stime,  # the whole command's, its imports included
            }
        )
    )


def timed(
    url: str, server: psutil.Process, end: float, window: float, parallel: int, **options: str
) -> dict[str, float]:
    before, load = server.cpu_times(), os.getloadavg()[0]
    command = [sys.executable, __file__, "--child", url, "--end", str(end), "--window-seconds", str(window)]
    command += ["--parallel", str(parallel)]
    for key, value in options.items():
        command += [f"--{key}", value]
    t0 = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE)
    out, _ = process.communicate()
    wall = time.perf_counter() - t0
    after = server.cpu_times()
    if process.returncode:
        raise SystemExit(f"analyze failed ({process.returncode})")
    figures = json.loads(out)
    figures.update(
        wall=wall,
        prometheus_cpu=after.user + after.system - before.user - before.system,
        load=load,
        load_after=os.getloadavg()[0],
    )
    if SEEDED not in figures["suspects"]:
        raise SystemExit(f"suspects {figures['suspects']}: not the seeded {SEEDED}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16384)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--scrape", type=float, default=15.0)
    parser.add_argument("--runs", type=int, default=3, help="timed runs (after one untimed, warming up)")
    parser.add_argument("--data", default="", help="where the blocks are kept (default: a temporary one)")
    parser.add_argument("--profile", action="store_true", help="a cProfile of one more run")
    parser.add_argument("--save", default="", help="write a run's JSON verdict here")
    parser.add_argument("--parallel", type=int, default=4, help="range queries in flight at once")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--end", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--window-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(
            args.child,
            args.end,
            args.window_seconds,
            args.profile_to or None,
            args.save or None,
            args.parallel,
        )
        return
    root = Path(args.data or f"/var/tmp/analyze-scale-{os.getpid()}") / f"n{args.nodes}"
    try:
        print(f"# `analyze` over {args.nodes:,} nodes × {args.hours:g} h ({root})", flush=True)
        meta = build(root, args.nodes, args.hours, args.scrape)
        print(
            f"{meta['samples'] / 1e6:.0f} M samples "
            f"({meta['openmetrics_bytes'] / 1e9:.1f} GB of OpenMetrics), "
            f"simulated in {meta['simulate_seconds']:.0f} s, written and backfilled in "
            f"{meta['write_and_backfill_seconds']:.0f} s, {meta['tsdb_bytes'] / 1e6:.0f} MB of blocks",
            flush=True,
        )
        (root / "prometheus.yml").write_text("scrape_configs: []\n")
        server, url, startup = _start_prometheus(root)
        try:
            serving = psutil.Process(server.pid)
            settled = _settle(serving, url)
            print(f"Prometheus ready in {startup:.1f} s, compacted in {settled:.0f} s more", flush=True)
            window = args.hours * 3600
            runs = [
                timed(
                    url,
                    serving,
                    meta["end"],
                    window,
                    args.parallel,
                    **({"save": args.save} if args.save else {}),
                )
            ]
            runs += [timed(url, serving, meta["end"], window, args.parallel) for _ in range(args.runs)]
            print(
                "\n| run | wall | analyze CPU | Prometheus CPU | waiting for answers | decoding the JSON "
                "| peak RSS | queries | JSON | meetings | load (1 min) |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for i, run in enumerate(runs):
                print(
                    f"| {'first' if i == 0 else i} | {run['wall']:.2f} s | {run.get('cpu', 0):.2f} s "
                    f"| {run['prometheus_cpu']:.2f} s | {run['waiting']:.2f} s | {run['decoding']:.2f} s "
                    f"| {run['maxrss_kb'] / 1024:.0f} MB | {run['requests']} "
                    f"| {run['bytes'] / 1e6:.1f} MB | {run['meetings']:,} "
                    f"| {run['load']:.1f}→{run['load_after']:.1f} |",
                    flush=True,
                )
            print(f"\nSuspects named: {', '.join(name for _, name in runs[0]['suspects'])}", flush=True)
            if args.profile:
                target = root / "analyze.prof"
                timed(url, serving, meta["end"], window, args.parallel, **{"profile-to": str(target)})
                out = io.StringIO()
                pstats.Stats(str(target), stream=out).sort_stats("cumulative").print_stats(30)
                print("\n```\n" + out.getvalue() + "```")
        finally:
            server.terminate()
            server.wait(60)
    finally:
        if not args.data:
            shutil.rmtree(root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
