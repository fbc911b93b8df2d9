"""`clusterhealth model`: the gradient-sync calculator, on stated or measured bandwidth.

The arithmetic is checks/cost.py's; this module reads the command line and prints.

With ``--prometheus URL --node NAME`` (or ``--path A,B``) the bandwidth is the one the pairwise
probes measured: the group's history is read back from Prometheus as ``analyze`` reads it
(fleet/pairwise.py), and the bandwidth is the median of the node's latest meetings (as many as name
a host, 3) or the pair's (as many as name a path, 2), a failed run counting as none measured
when every one failed. It is compared with the nominal bandwidth: ``--bandwidth`` when given,
else the group's reference (the median of the meetings, without those of its slow nodes; what
``analyze`` judges against), never the agents' expectation: the reference is what the group
reaches, the expectation what someone configured or an agent learned, and with a fleet-wide
slowdown the two differ.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from clusterhealth.checks import cost
from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric.analysis import Meeting, Rules
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.prometheus import NoVerdict, Prometheus

EXIT_USAGE = 2
EXIT_NO_DATA = 3  # Prometheus unreachable, no such node or path (analyze's "no verdict")
NODE_MEETINGS = Rules().host_partners  # a node's latest meetings read as its bandwidth
PATH_MEETINGS = Rules().path_meetings  # a pair's

# Practitioners write model sizes as 7B or 175B; K, M, B (= G) and T multiply by powers of 1000.
_COUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([kKmMbBgGtT]?)\s*")
_COUNT_FACTORS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """`7B`, `175e9`, `1.3T` -> a number; ValueError otherwise."""
    m = _COUNT.fullmatch(text)
    if not m:
        raise ValueError(f"expected a count such as 7B, 70e9 or 1.3T, got {text!r}")
    value = float(m.group(1)) * _COUNT_FACTORS[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a positive count, got {text!r}")
    return value


@dataclass(frozen=True)
class Request:
    workload: cost.Workload
    bandwidth: float
    target_efficiency: float | None


@dataclass(frozen=True)
class Source:
    """Where --prometheus reads the measured bandwidth: a node's meetings, or a pair's."""

    url: str
    probe: str | None
    window: float
    node: str | None = None
    path: tuple[str, str] | None = None

    @property
    def subject(self) -> str:
        return self.node if self.node is not None else "<->".join(self.path or ())


@dataclass
class Measured:
    source: Source
    probe: str
    bandwidth: float  # bytes/s; 0 when every meeting read failed
    meetings: list[Meeting]
    reference: float | None  # the group's, over the window
    expected: float | None  # the agents' expectation, when exported
    problems: list[str] = field(default_factory=list)

    def to_dict(self, nominal_from: str) -> dict[str, Any]:
        return {
            "prometheus": self.source.url,
            "probe": self.probe,
            "window_seconds": round(self.source.window),
            "node": self.source.node,
            "path": list(self.source.path) if self.source.path else None,
            "bandwidth_bytes_per_second": self.bandwidth,
            "meetings": [
                {"round": m.round, "hosts": [m.a, m.b], "bandwidth_bytes_per_second": m.bandwidth}
                for m in self.meetings
            ],
            "nominal_from": nominal_from,
            "reference_bandwidth_bytes_per_second": self.reference,
            "expected_bandwidth_bytes_per_second": self.expected,
            "problems": self.problems,
        }


def measure(source: Source, *, now: float | None = None, timeout: float = 30.0) -> Measured:
    """The node's or the pair's measured bandwidth; NoVerdict when Prometheus has none."""
    prometheus = Prometheus(source.url, timeout)
    history = pairwise.read_history(
        prometheus, source.probe, source.window, now=now, allow_partial=True, jobs=False
    )
    if source.node is not None:
        node = source.node
        mine = [m for m in history.meetings if node in (m.a, m.b)]
        latest = NODE_MEETINGS
    else:
        a, b = sorted(source.path or ())
        mine = [m for m in history.meetings if (m.a, m.b) == (a, b)]
        latest = PATH_MEETINGS
    if not mine:
        nodes = sorted({n for m in history.meetings for n in (m.a, m.b)})
        known = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
        what = f"node {source.node}" if source.node is not None else f"path {source.subject}"
        raise NoVerdict(f"no meeting of {what} in probe {history.probe} over the window (its nodes: {known})")
    mine.sort(key=lambda m: (m.round, m.first_seen))
    chosen = mine[-latest:]
    measured = [m.bandwidth for m in chosen if m.bandwidth is not None]
    reference, _ = analysis.reference_bandwidth(history.meetings, Rules().threshold)
    return Measured(
        source,
        history.probe,
        statistics.median(measured) if measured else 0.0,
        chosen,
        reference,
        history.expected,
        history.problems,
    )


def run_measured(request: Request, source: Source, nominal: float | None, as_json: bool) -> int:
    """--prometheus: the step at the nominal and at the measured bandwidth, side by side."""
    try:
        measured = measure(source)
    except NoVerdict as err:
        print(f"clusterhealth model: {err}", file=sys.stderr)
        return EXIT_NO_DATA
    nominal_from = "--bandwidth" if nominal is not None else "reference"
    if nominal is None:
        nominal = measured.reference
    if not nominal:
        print(
            f"clusterhealth model: no meeting of probe {measured.probe} measured a bandwidth", file=sys.stderr
        )
        return EXIT_NO_DATA
    if measured.bandwidth <= 0:
        print(
            f"clusterhealth model: the latest meetings of {source.subject} measured nothing (failed runs): "
            "no bandwidth to model",
            file=sys.stderr,
        )
        return EXIT_NO_DATA
    at_nominal = cost.estimate(request.workload, nominal, request.target_efficiency)
    at_measured = cost.estimate(request.workload, measured.bandwidth, request.target_efficiency)
    if as_json:
        document = at_measured.to_dict()
        document["nominal"] = at_nominal.to_dict()
        document["bandwidth_ratio"] = measured.bandwidth / nominal
        document["step_slowdown"] = at_measured.step_seconds / at_nominal.step_seconds
        document["measured"] = measured.to_dict(nominal_from)
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        sys.stdout.write(comparison(request.workload, at_nominal, at_measured, measured, nominal_from))
    return 0


def run(request: Request, as_json: bool) -> int:
    result = cost.estimate(request.workload, request.bandwidth, request.target_efficiency)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        sys.stdout.write(table(request.workload, result))
    return 0


def table(workload: cost.Workload, result: cost.Estimate) -> str:
    n = workload.gpus
    moved = cost.bus_factor("all_reduce", n) * result.gradient_bytes
    gamma = result.comm_compute_ratio
    bound = "communication-bound" if gamma > 1 else "compute-bound"
    per_step = f" (k={workload.accumulation} micro-batches)" if workload.accumulation > 1 else ""
    rows = [
        ("gradient", f"{_bytes(result.gradient_bytes)} per step"),
        ("bandwidth", _rate(result.bandwidth_bytes_per_second) + " on the slowest link"),
        (
            "all-reduce",
            f"{_seconds(result.allreduce_seconds)}  ring over {n} GPUs, {_bytes(moved)} per GPU "
            f"(2(n-1)/n of the gradient)",
        ),
        ("compute", f"{_seconds(result.compute_seconds)}{per_step}"),
        ("step", f"{_seconds(result.step_seconds)}  (overlap {workload.overlap:g})"),
        ("comm/compute", f"{gamma:.3g}  {bound}"),
        ("scaling efficiency", f"{result.scaling_efficiency:.1%}"),
    ]
    if result.target_efficiency is not None:
        needed = result.bandwidth_for_target_bytes_per_second
        text = "unreachable (latency alone is too long)" if needed is None else _rate(needed)
        rows.append((f"bandwidth for {result.target_efficiency:.0%}", text))
    width = max(len(label) for label, _ in rows)
    return "".join(f"{label:<{width}}  {value}\n" for label, value in rows)


def comparison(
    workload: cost.Workload,
    nominal: cost.Estimate,
    measured: cost.Estimate,
    source: Measured,
    nominal_from: str,
) -> str:
    """The table of --prometheus: what differs at the two bandwidths in two columns."""
    n = workload.gpus
    rounds = sorted({m.round for m in source.meetings})
    whose = "its" if source.source.node is not None else "the pair's"
    head = [
        (
            "measured",
            f"{source.source.subject} in probe {source.probe}: median of {whose} latest "
            f"{len(source.meetings)} meeting{'s' if len(source.meetings) > 1 else ''} "
            f"(round{'s' if len(rounds) > 1 else ''} {', '.join(str(r) for r in rounds)}) "
            f"in {source.source.url}",
        ),
        ("gradient", f"{_bytes(nominal.gradient_bytes)} per step, ring over {n} GPUs"),
        ("compute", f"{_seconds(nominal.compute_seconds)}  (overlap {workload.overlap:g})"),
    ]
    for problem in source.problems:
        head.append(("partial data", problem))
    what = "--bandwidth" if nominal_from == "--bandwidth" else "the group's reference"
    columns = [
        ("", f"nominal ({what})", f"measured ({source.source.subject})"),
        ("bandwidth", _rate(nominal.bandwidth_bytes_per_second), _rate(measured.bandwidth_bytes_per_second)),
        ("all-reduce", _seconds(nominal.allreduce_seconds), _seconds(measured.allreduce_seconds)),
        ("step", _seconds(nominal.step_seconds), _seconds(measured.step_seconds)),
        (
            "comm/compute",
            f"{nominal.comm_compute_ratio:.3g}  {_bound(nominal.comm_compute_ratio)}",
            f"{measured.comm_compute_ratio:.3g}  {_bound(measured.comm_compute_ratio)}",
        ),
        ("scaling efficiency", f"{nominal.scaling_efficiency:.1%}", f"{measured.scaling_efficiency:.1%}"),
    ]
    ratio = measured.bandwidth_bytes_per_second / nominal.bandwidth_bytes_per_second
    tail = [
        (
            "slowdown",
            f"x{measured.step_seconds / nominal.step_seconds:.2f} a step, x{1 / ratio:.2f} an all-reduce "
            f"({ratio:.0%} of the nominal bandwidth)",
        )
    ]
    if nominal.target_efficiency is not None:
        needed = nominal.bandwidth_for_target_bytes_per_second
        text = "unreachable (latency alone is too long)" if needed is None else _rate(needed)
        tail.append((f"bandwidth for {nominal.target_efficiency:.0%}", text))
    labels = [label for label, _ in head + tail] + [row[0] for row in columns]
    width = max(len(label) for label in labels)
    middle = max(len(row[1]) for row in columns)
    out = [f"{label:<{width}}  {value}" for label, value in head]
    out += [f"{label:<{width}}  {a:<{middle}}  {b}".rstrip() for label, a, b in columns]
    out += [f"{label:<{width}}  {value}" for label, value in tail]
    return "\n".join(out) + "\n"


def _bound(gamma: float) -> str:
    return "communication-bound" if gamma > 1 else "compute-bound"


def _bytes(value: float) -> str:
    # Published calculators mix decimal and binary units: say both.
    return f"{value / 1e9:.2f} GB ({value / 2**30:.2f} GiB)"


def _rate(value: float) -> str:
    return f"{value * 8 / 1e9:.1f} Gbit/s ({value / 1e9:.2f} GB/s)"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.3f} s"
