"""The README's picture of `clusterhealth report` (docs/images/report.png): the top of the page, down
to the pair matrix, as Debian's chromium draws it (tests/browser.py).

Drawn from fixed data, so that it regenerates the same: 16 nodes, 24 rounds of 15 minutes on
2025-11-24, h5 at half speed and the path h9<->h12 at half speed from the 17th round (h9 and
h12 meet two rounds later, and again to confirm), the simulation's noise otherwise.

    .venv/bin/python -m tests.report_image      # what `make generate` runs

tests/test_report.py draws it again and compares.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.report import command

from .browser import Browser
from .conftest import ROOT
from .fabric_history import simulated

IMAGE = Path("docs/images/report.png")
FIRST, ROUNDS, FAULT = 1_960_000, 24, 1_960_016
BAD_HOST, BAD_PATH = "h5", ("h9", "h12")
WIDTH = 1000


def draw(browser: Browser, out: Path) -> dict[str, Any]:
    """Write the picture to ``out``; where its matrix is (box, cell, nodes, colormap)."""
    history, _ = simulated(
        16,
        ROUNDS,
        first=FIRST,
        fault_from=FAULT,
        bad_hosts={BAD_HOST: 0.5},
        bad_paths={sim.path(*BAD_PATH): 0.5},
        seed="readme",
    )
    result = pairwise.judge(history)
    with tempfile.TemporaryDirectory() as folder:
        page = command.write(history, result, Path(folder) / "report.html", generated=history.end + 300)
        looked = browser.look(page, width=WIDTH, height=800)
        try:
            data = looked.data()
            _, y, _, height = looked.box("matrix")
            looked.page.screenshot(
                path=out, clip={"x": 0, "y": 0, "width": WIDTH, "height": y + height}, full_page=True
            )
            return {
                "box": looked.box(data["matrix"]["ids"]["latest"]),
                "cell": data["matrix"]["cell"],
                "nodes": data["nodes"],
                "colormap": data["colormap"],
            }
        finally:
            looked.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        browser = Browser(Path(folder))
        try:
            where = draw(browser, ROOT / IMAGE)
        finally:
            browser.close()
    print(f"{IMAGE}: {json.dumps(where['box'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
