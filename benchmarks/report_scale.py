"""`clusterhealth report` at 64, 1,024 and 4,096 nodes: the time to judge and draw, the file's size,
the memory, and how long Debian's chromium takes to open the page.

Each size is a pairwise group played by checks/fabric/simulation.py over 6 hours of 15-minute
rounds (24 rounds, the default window and period) with its noise (1 % single shorts, ±5 %
jitter, 1 % of the nodes busy each round) and h3 at half speed for the last 8 rounds. Its history
is what ``pairwise.read_history`` returns for those meetings (Prometheus's part is measured by
benchmarks/fabric_scale.py). Each size runs in a process of its own, so that its peak memory is its
own; the page is then opened 5 times in chromium (Playwright, DevTools protocol), each in a fresh
context: the median time to the load event, to the first paint, and until every image is decoded.

    .venv/bin/python benchmarks/report_scale.py          # about a minute on 2 cores
    .venv/bin/python benchmarks/report_scale.py --sizes 64,1024

docs/performance.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.report import command

PERIOD, ROUNDS, BAD_FOR = 900.0, 24, 8
FIRST = 1_960_000
LOADS = 5


def history(n: int) -> pairwise.History:
    names = sim.node_names(n)
    fleet = sim.Fleet(names, seed="bench", period=PERIOD)
    group = sim.Group(fleet, random.Random(1))
    played = []
    for r in range(FIRST, FIRST + ROUNDS):
        if r == FIRST + ROUNDS - BAD_FOR:
            fleet.bad_hosts["h3"] = 0.5
        played.append(group.play(r))
    return pairwise.History(
        probe="fabric",
        end=(FIRST + ROUNDS) * PERIOD,
        window=ROUNDS * PERIOD,
        period=PERIOD,
        step=PERIOD / 8,
        meetings=analysis.merge(sim.reports(played, PERIOD)),
        nodes=set(names),
        expected=None,
        jobs=None,
        warnings=[],
        untied=[],
    )


def one(n: int, folder: Path) -> dict[str, Any]:
    """Judge and draw one size (in this process); its figures."""
    h = history(n)
    began = time.perf_counter()
    result = pairwise.judge(h)
    judged = time.perf_counter()
    page = command.write(h, result, folder / f"report-{n}.html", generated=h.end)
    drawn = time.perf_counter()
    picture = command.write(h, result, folder / f"report-{n}.png", "png", generated=h.end)
    pictured = time.perf_counter()
    return {
        "nodes": n,
        "meetings": len(h.meetings),
        "suspects": [s.name for s in result.suspects],
        "judge_seconds": judged - began,
        "html_seconds": drawn - judged,
        "html_bytes": page.stat().st_size,
        "png_seconds": pictured - drawn,
        "png_bytes": picture.stat().st_size,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "page": str(page),
    }


def load(page: Path) -> dict[str, float]:
    """Median of LOADS openings in chromium: load event, first contentful paint, images decoded (ms)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is missing: `make sysdeps` installs it")
    runs: list[dict[str, float]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            for _ in range(LOADS):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                tab = context.new_page()
                tab.goto(page.absolute().as_uri(), wait_until="load")
                runs.append(
                    tab.evaluate(
                        """async () => {
                          await Promise.all([...document.images].map((i) => i.decode()));
                          // Two frames later the first paint has been recorded, however fast.
                          await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
                          const nav = performance.getEntriesByType("navigation")[0];
                          const paint = performance.getEntriesByName("first-contentful-paint")[0];
                          return {load: nav.loadEventEnd, paint: paint ? paint.startTime : NaN,
                                  decoded: performance.now()};
                        }"""
                    )
                )
                context.close()
        finally:
            browser.close()
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="64,1024,4096")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.folder)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in (int(s) for s in args.sizes.split(",")):
            done = subprocess.run(
                [sys.executable, __file__, "--one", str(n), "--folder", folder],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(done.stdout)
            row.update(load(Path(row["page"])))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(
        "| nodes | meetings | judge | draw the page | page size | browser: load, first paint, images decoded "
        "| PNG | PNG size | peak memory |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        browser = f"{r['load']:.0f} ms, {r['paint']:.0f} ms, {r['decoded']:.0f} ms"
        cells = [
            f"{r['nodes']:,}",
            f"{r['meetings']:,}",
            f"{r['judge_seconds']:.2f} s",
            f"{r['html_seconds']:.2f} s",
            f"{r['html_bytes'] / 1e6:.2f} MB",
            browser,
            f"{r['png_seconds']:.2f} s",
            f"{r['png_bytes'] / 1e3:.0f} kB",
            f"{r['peak_rss_bytes'] / 2**20:.0f} MiB",
        ]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
