"""The impact model against a real collective: benchmarks/impact.py on one small case, as root.

The full table (a host and a path at r = 0.75, 0.5 and 0.25, ±20 %) is `make bench-impact`'s and
docs/cost.md's; this asserts only that the harness runs and that the model is not far off. Four
hosts (the fewest in which `analyze` names a host: three clean partners), h2's link at half the
lab's rate, Open MPI's ring all-reduce of 2 MB after 0.25 s of compute (γ ≈ 1 at 100 Mbit/s), one
block of three steps with the fault taken away and three with it. About 95 s, most of it the three
probe rounds `analyze` wants before a verdict.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from clusterhealth.checks import cost

from .conftest import ROOT, require_tool

# About 95 s (three probe rounds and the all-reduce loop).
pytestmark = pytest.mark.slow

HARNESS = ROOT / "benchmarks" / "impact.py"


def _left_behind(prefix: str, workdir: str) -> tuple[list[str], list[str]]:
    """The lab's namespaces that still exist, and processes that belong to it: mpirun and the
    ranks name the work directory on their command line, Open MPI's daemons in their TMPDIR."""
    namespaces = [
        line.split()[0]
        for line in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        if line.startswith(prefix)
    ]
    processes = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            seen = " ".join(p.info["cmdline"] or ()) + " " + " ".join(p.environ().values())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if workdir in seen or f"{prefix}-" in seen:
            processes.append(f"{p.info['pid']} {' '.join(p.info['cmdline'] or ())}")
    return namespaces, processes


def test_the_model_predicts_a_real_allreduce_slowdown_from_the_probes() -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, tc); CI runs the suite as root")
    require_tool("mpirun")
    done = subprocess.run(
        [
            *(sys.executable, str(HARNESS), "--hosts", "4", "--kinds", "host", "--factors", "0.5"),
            *("--size", "2e6", "--compute", "0.25", "--steps", "3", "--blocks", "1", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    (row,) = document["rows"]
    assert (row["kind"], row["suspect"], row["factor"]) == ("host", "h2", 0.5)
    # The model's inputs are what the probes measured, not what tc was told.
    assert 0.4 <= row["probe"]["ratio"] <= 0.6, row["probe"]
    assert 10e6 <= row["probe"]["reference_bandwidth_bytes_per_second"] <= 12.5e6, "iperf3 at 100 Mbit/s"
    loop = row["loop"]
    assert loop["library"].startswith("Open MPI"), loop["library"]
    assert "coll_tuned_allreduce_algorithm" in document["mpirun_options"], "the ring, as the model"
    # The fault costs the real loop something, and the model, fed the probes' numbers alone,
    # says about how much.
    measured = loop["degraded_step_seconds"] / loop["healthy_step_seconds"]
    assert measured == pytest.approx(loop["step_slowdown"]) and measured > 1.2, loop
    ratio, reference = row["probe"]["ratio"], row["probe"]["reference_bandwidth_bytes_per_second"]
    workload = cost.Workload(params=2e6 / 4, bytes_per_param=4, gpus=4, compute_seconds=0.25)
    predicted = cost.slowdown(workload, reference, ratio * reference)
    assert row["model"]["step_slowdown"] == pytest.approx(predicted)
    assert predicted == pytest.approx(measured, rel=0.5), (row["model"], loop)
    # Everything the lab and Open MPI made is gone: namespaces, mpirun, daemons, ranks, files.
    m = re.search(r"lab (chl[0-9a-f]+): 4 hosts, work directory (\S+)", done.stderr)
    assert m, done.stderr
    prefix, workdir = m.groups()
    assert _left_behind(prefix, workdir) == ([], [])
    assert not Path(workdir).exists()
