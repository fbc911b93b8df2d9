"""`clusterhealth model`: the gradient-sync calculator, on stated or measured bandwidth.

The arithmetic is checks/cost.py's; this module reads the command line and prints.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass

from clusterhealth.checks import cost

EXIT_USAGE = 2

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


def _bytes(value: float) -> str:
    # Published calculators mix decimal and binary units: say both.
    return f"{value / 1e9:.2f} GB ({value / 2**30:.2f} GiB)"


def _rate(value: float) -> str:
    return f"{value * 8 / 1e9:.1f} Gbit/s ({value / 1e9:.2f} GB/s)"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.3f} s"
