#!/usr/bin/env python3
"""The impact model against a real collective: Open MPI's MPI_Allreduce in the namespace lab.

For each fault (one host's link, or one path, shaped to r of the common rate with tc) and each r:

1. `clusterhealth lab` (fleet/lab.py) builds N hosts as network namespaces on a bridge, every link
   shaped to the common rate, the fault in place; its real agents probe the pairs with iperf3 and
   `analyze` reads their results from the lab's Prometheus. From its verdict come the inputs of
   the model, as measured: the suspect's ratio r̂ (the median of its short meetings' bandwidth
   over the group's reference) and the reference bandwidth B̂ (bytes/s).
2. The agents and Prometheus are stopped (their probes would share the links), and a synchronous
   data-parallel loop runs on the same links: one rank per host namespace, started by mpirun from
   the switch namespace through an rsh agent that enters the namespaces (`ip netns exec`); each
   step a fixed compute (a sleep) and MPI_Allreduce of S bytes (mpi4py, Open MPI's TCP transport
   on the lab's interfaces, the ring algorithm). It runs in blocks, alternately with the fault
   taken away (every link at the common rate) and with it, so that the machine's load moves both.
3. The model (checks/cost.py) predicts the step-time slowdown from r̂ and B̂ alone:
   slowdown(S, N, compute, B̂, r̂·B̂) = (C + M/r̂) / (C + M), M = 2(N−1)/N · S / B̂; the loop
   measured it as the mean degraded step over the mean healthy one.

Prints a table (docs/cost.md "Validation" records it) or, with --json, every number. Root only
(network namespaces, tc); needs Open MPI's mpirun (Debian openmpi-bin) and mpi4py (the test
extras). Everything the labs made, mpirun and its ranks included, is removed at the end.

    make bench-impact                                           # host and path, r = 0.75, 0.5, 0.25
    .venv/bin/python benchmarks/impact.py --kinds host --factors 0.5 --steps 3 --blocks 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from clusterhealth.checks import cost
from clusterhealth.fleet.lab import FIRST, SUBNET, SWITCH_ADDRESS, Lab, LabError, LabSpec

HERE = Path(__file__).resolve().parent
LOOP = HERE / "allreduce_loop.py"
DEGRADED_HOST = "h2"


class HarnessError(Exception):
    """A case could not be measured; the message says why."""


@dataclass(frozen=True)
class Setup:
    hosts: int = 4
    rate_mbit: float = 100.0
    size_bytes: int = 8_000_000  # float32 gradients: 2 M parameters
    compute_seconds: float = 1.0
    steps: int = 6  # counted steps per block
    warmup: int = 1  # steps per block not counted (Open MPI connects on first use)
    blocks: int = 2  # healthy/degraded pairs
    rounds: int = 3  # probe rounds before analyze's verdict (it wants 3)
    algorithm: str = "ring"  # or "default": Open MPI's own choice by message size
    mca: tuple[tuple[str, str], ...] = ()  # more Open MPI parameters, e.g. the TCP eager limit


def mpi_options(setup: Setup) -> list[str]:
    options = [
        # The lab's interfaces only, TCP (no shared memory between the "hosts", which share a kernel).
        *("--mca", "btl", "tcp,self"),
        *("--mca", "btl_tcp_if_include", f"{SUBNET}.0/24"),
        *("--mca", "oob_tcp_if_include", f"{SUBNET}.0/24"),
        # Ranks waiting in the all-reduce yield the CPU: four ranks share two cores here.
        *("--mca", "mpi_yield_when_idle", "1"),
    ]
    if setup.algorithm == "ring":
        options += [
            *("--mca", "coll_tuned_use_dynamic_rules", "1"),
            *("--mca", "coll_tuned_allreduce_algorithm", "4"),
        ]
    for name, value in setup.mca:
        options += ["--mca", name, value]
    return options


def _launch_agent(lab: Lab) -> Path:
    """Open MPI's rsh agent for the lab: `mpi-launch HOST COMMAND...` runs the command line (a
    shell's, as ssh would hand it over) in the namespace of the host whose address is HOST.

    Each host gets a TMPDIR of its own: Open MPI keeps its session directory (PMIx's shared-memory
    store among it) under TMPDIR/ompi.HOSTNAME.UID, and the namespaces share one file system and
    one host name, so daemons launched together would otherwise race over the same directory
    (about one launch in twenty then hangs: "orte_session_dir failed", "PMIX ERROR: NO-PERMISSIONS").
    """
    assert lab.workdir is not None
    ip = shutil.which("ip") or "ip"
    agent = lab.workdir / "mpi-launch"
    agent.write_text(
        "#!/bin/sh\n"
        f"# HOST is {SUBNET}.I, the lab address of {lab.prefix}-hI\n"
        'host="$1"; shift\ni="${host##*.}"\n'
        f'mkdir -p "{lab.workdir}/tmp/h$i"\n'
        f'exec {ip} netns exec "{lab.prefix}-h$i" env TMPDIR="{lab.workdir}/tmp/h$i" /bin/sh -c "$*"\n'
    )
    agent.chmod(0o755)
    return agent


def run_loop(lab: Lab, order: list[str], setup: Setup, name: str, timeout: float) -> dict[str, Any]:
    """One mpirun of the loop, rank i on host order[i]; the ranks' document."""
    assert lab.workdir is not None
    out, log_path = lab.workdir / f"{name}.json", lab.workdir / f"{name}.log"
    addresses = [lab.address(int(h[1:])) for h in order]
    tmp = lab.workdir / "tmp" / "sw"
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [
        *(shutil.which("ip") or "ip", "netns", "exec", lab.switch, "env", f"TMPDIR={tmp}"),
        *(shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "-np", str(len(order))),
        *("--host", ",".join(addresses)),
        *("--mca", "plm_rsh_agent", str(_launch_agent(lab)), "--mca", "plm_rsh_no_tree_spawn", "1"),
        *mpi_options(setup),
        *(sys.executable, str(LOOP), str(setup.size_bytes), repr(setup.compute_seconds)),
        *(str(setup.steps), str(setup.warmup), SWITCH_ADDRESS, str(out)),
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        # mpirun's own process group; what it started in the host namespaces goes with lab.stop().
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    tail = log_path.read_text(errors="replace").strip()[-800:] or "no output"
    if code != 0 or not out.exists():
        why = f"timed out after {timeout:.0f} s" if code is None else f"exited {code}"
        raise HarnessError(f"mpirun {why}: {tail}")
    document: dict[str, Any] = json.loads(out.read_text())
    if document["addresses"] != addresses:
        raise HarnessError(f"ranks ran on {document['addresses']}, not {addresses} as asked")
    return document


def step_times(document: dict[str, Any]) -> list[float]:
    """Per counted step: compute plus all-reduce, the mean over ranks (the all-reduce ends them
    together; each rank's step starts after its own previous all-reduce)."""
    per_rank = document["steps"]
    return [statistics.fmean(sum(rank[i]) for rank in per_rank) for i in range(len(per_rank[0]))]


def allreduce_times(document: dict[str, Any]) -> list[float]:
    per_rank = document["steps"]
    return [statistics.fmean(rank[i][1] for rank in per_rank) for i in range(len(per_rank[0]))]


def probe_inputs(result: dict[str, Any], kind: str, suspect: str) -> tuple[float, float]:
    """(r̂, B̂): the suspect's ratio and the group's reference bandwidth, from analyze's verdict."""
    named = [s for s in result.get("suspects", []) if (s["kind"], s["suspect"]) == (kind, suspect)]
    if not named:
        found = ", ".join(f"{s['suspect']} ({s['kind']})" for s in result.get("suspects", [])) or "nobody"
        why = result.get("not_enough_evidence") or result.get("error")
        raise HarnessError(
            f"analyze did not name {suspect} ({kind}): it named {found}" + (f"; {why}" if why else "")
        )
    ratio = named[0]["evidence"]["median_ratio"]
    reference = result["reference_bandwidth_bytes_per_second"]
    if not isinstance(ratio, float) or not ratio > 0 or not isinstance(reference, float):
        raise HarnessError(
            f"analyze measured no bandwidth for {suspect}: ratio {ratio}, reference {reference}"
        )
    return ratio, reference


def measure(kind: str, factor: float, setup: Setup, say: Any = None) -> dict[str, Any]:
    """One row of the table: a lab with the fault, analyze's inputs, the loop with and without it."""
    spec = LabSpec(
        hosts=setup.hosts,
        rounds=setup.rounds,
        rate_mbit=setup.rate_mbit,
        degrade_host=DEGRADED_HOST if kind == "host" else None,
        degrade_path=FIRST if kind == "path" else None,
        factor=factor,
    )
    if (problem := spec.problem()) is not None:
        raise HarnessError(problem)
    lab = Lab(spec, say=say) if say is not None else Lab(spec)
    try:
        lab.build()
        lab.start()
        last, why, report = lab.run()
        result = last.to_dict() if last is not None else {"error": why, "suspects": []}
        lab.stop()
        expected = spec.expected_suspect(lab.path)
        assert expected is not None
        suspect = expected[1]
        ratio, reference = probe_inputs(result, kind, suspect)
        hosts = [f"h{i}" for i in range(1, setup.hosts + 1)]
        # The ring must cross a path: its ends are ranks 0 and 1 (rank i sends to rank i + 1).
        order = hosts if lab.path is None else [*lab.path, *(h for h in hosts if h not in lab.path)]
        workload = cost.Workload(
            params=setup.size_bytes / 4,
            bytes_per_param=4,
            gpus=setup.hosts,
            compute_seconds=setup.compute_seconds,
        )
        nominal = setup.rate_mbit * 1e6 / 8
        slowest = cost.estimate(workload, nominal * factor).step_seconds
        timeout = 60 + 3 * (setup.warmup + setup.steps) * slowest
        healthy: list[dict[str, Any]] = []
        degraded: list[dict[str, Any]] = []
        for block in range(1, setup.blocks + 1):
            lab.set_degraded(False)
            healthy.append(run_loop(lab, order, setup, f"healthy-{block}", timeout))
            lab.set_degraded(True)
            degraded.append(run_loop(lab, order, setup, f"degraded-{block}", timeout))
            lab.say(
                f"lab {lab.prefix}: block {block}: step {_mean_step(healthy[-1]):.3f} s healthy, "
                f"{_mean_step(degraded[-1]):.3f} s with {suspect} at {factor:g}"
            )
    finally:
        # A second Ctrl-C must not cut the clean-up short (mpirun's ranks and daemons included).
        handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            lab.cleanup()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    healthy_steps = [t for d in healthy for t in step_times(d)]
    degraded_steps = [t for d in degraded for t in step_times(d)]
    measured = statistics.fmean(degraded_steps) / statistics.fmean(healthy_steps)
    predicted = cost.slowdown(workload, reference, ratio * reference)
    at_reference = cost.estimate(workload, reference)
    return {
        "kind": kind,
        "suspect": suspect,
        "factor": factor,
        "ring": order,
        "probe": {"ratio": ratio, "reference_bandwidth_bytes_per_second": reference},
        "model": {
            "allreduce_seconds": at_reference.allreduce_seconds,
            "comm_compute_ratio": at_reference.comm_compute_ratio,
            "healthy_step_seconds": at_reference.step_seconds,
            "degraded_step_seconds": cost.estimate(workload, ratio * reference).step_seconds,
            "step_slowdown": predicted,
        },
        "loop": {
            "library": healthy[0]["library"],
            "healthy_step_seconds": statistics.fmean(healthy_steps),
            "degraded_step_seconds": statistics.fmean(degraded_steps),
            "healthy_allreduce_seconds": statistics.fmean(t for d in healthy for t in allreduce_times(d)),
            "degraded_allreduce_seconds": statistics.fmean(t for d in degraded for t in allreduce_times(d)),
            "healthy_block_steps": [_mean_step(d) for d in healthy],
            "degraded_block_steps": [_mean_step(d) for d in degraded],
            "step_slowdown": measured,
        },
        "error": predicted / measured - 1,
        "analyze": {"rounds": result.get("rounds"), "named_after_rounds": report.get("named_after_rounds")},
    }


def _mean_step(document: dict[str, Any]) -> float:
    return statistics.fmean(step_times(document))


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| fault | shaped to | probe: ratio r̂ | probe: reference B̂ | loop: step healthy → degraded "
        "| measured slowdown | predicted from r̂, B̂ | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if "failed" in row:
            lines.append(f"| {row['kind']} | {row['factor']:g} | failed: {row['failed']} | | | | | |")
            continue
        probe, loop = row["probe"], row["loop"]
        lines.append(
            f"| {row['kind']} {row['suspect']} | {row['factor']:g} | {probe['ratio']:.2f} "
            f"| {probe['reference_bandwidth_bytes_per_second'] / 1e6:.2f} MB/s "
            f"| {loop['healthy_step_seconds']:.3f} s → {loop['degraded_step_seconds']:.3f} s "
            f"| {loop['step_slowdown']:.3f} | {row['model']['step_slowdown']:.3f} | {row['error']:+.1%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Setup()
    parser.add_argument("--hosts", type=int, default=defaults.hosts)
    parser.add_argument("--rate", type=float, default=defaults.rate_mbit, help="the lab's link rate, Mbit/s")
    parser.add_argument("--kinds", default="host,path", help="host, path or both (default both)")
    parser.add_argument("--factors", default="0.75,0.5,0.25", help="r, the fault's share of the rate")
    parser.add_argument(
        "--size", type=float, default=defaults.size_bytes, help="S, bytes all-reduced per step"
    )
    parser.add_argument(
        "--compute", type=float, default=defaults.compute_seconds, help="compute seconds per step"
    )
    parser.add_argument("--steps", type=int, default=defaults.steps, help="counted steps per block")
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument(
        "--blocks", type=int, default=defaults.blocks, help="healthy/degraded pairs of blocks"
    )
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="probe rounds before the verdict")
    parser.add_argument("--algorithm", choices=("ring", "default"), default=defaults.algorithm)
    parser.add_argument(
        "--mca", action="append", default=[], metavar="NAME=VALUE", help="another Open MPI parameter"
    )
    parser.add_argument("--json", action="store_true", help="print every number as JSON")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("impact.py: needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    for tool in ("mpirun", "ip", "tc"):
        if shutil.which(tool) is None:
            print(f"impact.py: {tool} is missing (`make sysdeps` installs it)", file=sys.stderr)
            return 2
    setup = Setup(
        hosts=args.hosts,
        rate_mbit=args.rate,
        size_bytes=int(args.size),
        compute_seconds=args.compute,
        steps=args.steps,
        warmup=args.warmup,
        blocks=args.blocks,
        rounds=args.rounds,
        algorithm=args.algorithm,
        mca=tuple((name, value) for name, _, value in (m.partition("=") for m in args.mca)),
    )
    cases = [(k, float(f)) for k in args.kinds.split(",") for f in args.factors.split(",")]

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for kind, factor in cases:
        try:
            rows.append(measure(kind, factor, setup))
        except (HarnessError, LabError, OSError) as err:
            print(f"impact.py: {kind} at {factor:g}: {err}", file=sys.stderr)
            rows.append({"kind": kind, "factor": factor, "failed": str(err)})
        except KeyboardInterrupt:
            print("impact.py: interrupted", file=sys.stderr)
            return 130
    document = {
        "setup": asdict(setup),
        "mpirun_options": mpi_options(setup),
        "rows": rows,
        "seconds": round(time.monotonic() - started),
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        sys.stdout.write(table(rows))
        print(f"({document['seconds']} s)")
    return 1 if any("failed" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
