"""promtool cases of the recording rules that put a number on a slowdown (recording.py): what a
node of a pairwise group costs (issue 20's model, docs/cost.md) and f_max/f_eff of a busy GPU,
each with the exact samples it returns and the arithmetic beside it."""

from __future__ import annotations

from . import recording
from .cases import PAIRWISE_ROUNDS, Case, Expr, S, Sample, gpu
from .config import Config


def impact(bandwidth: float, reference: float, c: Config | None = None) -> dict[str, float]:
    """The impact rules' values for a node of typical meeting bandwidth `bandwidth` in a group of
    reference `reference`, by the contract's formulas (what an alert quoting them shows)."""
    c = c or Config()
    gradient = c.impact_params * c.impact_bytes_per_param
    m_ref = 2 * (c.impact_gpus - 1) / c.impact_gpus * gradient / reference
    r = bandwidth / reference
    m = m_ref / r

    def step(x: float) -> float:
        return c.impact_compute_seconds + x - c.impact_overlap * min(c.impact_compute_seconds, x)

    slowdown = step(m) / step(m_ref)
    return {
        recording.RATIO: r,
        recording.ALLREDUCE_SLOWDOWN: 1 / r,
        recording.STEP_SLOWDOWN: slowdown,
        recording.GPU_HOURS_LOST: max(0.0, c.impact_gpus * 24 * (1 - 1 / slowdown)),
    }


# The stated workload (Config's defaults): 7e9 parameters of 2 bytes, 64 GPUs, 1 s of compute a
# step, no overlap. Its gradient is S = 7e9 · 2 = 1.4e10 bytes; a ring all-reduce moves
# 2 · (64 - 1) / 64 · S = 1.96875 · 1.4e10 = 2.75625e10 bytes a rank. At the reference bandwidth
# B_ref = 2.75625e10 B/s (220.5 Gbit/s) it takes M_ref = 1 s.
REFERENCE = 2.75625e10
# h1 runs every meeting at half of it: r = 0.5, M = M_ref / r = 2 s. h2's meetings with the
# others (not h1) run at 1.25 times it: r = 1.25, M = 0.8 s.
HALF = REFERENCE / 2
FAST = REFERENCE * 1.25


def meetings(bad: str, fast: str = "", confirmed: tuple[str, str] | None = None) -> dict[str, str]:
    """A group of five (PAIRWISE_ROUNDS, 15-minute rounds, each meeting exported by both ends for
    5 minutes): every meeting with `bad` measures HALF, every other one with `fast` FAST, the rest
    REFERENCE. The meeting of the pair `confirmed` measures 0.7 of its bandwidth and is played again
    in the confirming slot of the next round (its second half: exported for 7 minutes), at its
    bandwidth: the pair's series holds two values."""
    series: dict[str, str] = {}
    for k, pairs in enumerate(PAIRWISE_ROUNDS):
        for a, b in pairs:
            measured = HALF if bad in (a, b) else FAST if fast in (a, b) else REFERENCE
            for node, peer in ((a, b), (b, a)):
                key = S(
                    "clusterhealth_probe_bandwidth_bytes_per_second",
                    {"instance": node, "probe": "fabric", "peer": peer},
                )
                row = series.get(key, " ".join(["_"] * 60)).split()
                if confirmed is not None and {a, b} == set(confirmed):
                    row[15 * k : 15 * k + 5] = [repr(measured * 0.7)] * 5
                    row[15 * k + 23 : 15 * k + 30] = [repr(measured)] * 7
                else:
                    row[15 * k : 15 * k + 5] = [repr(measured)] * 5
                series[key] = " ".join(row)
    for i in range(1, 6):
        series[S("clusterhealth_probe_round", {"instance": f"h{i}", "probe": "fabric"})] = "2000000+0x60"
    return series


GROUP = '{}{{job="clusterhealth",probe="fabric"}}'  # a series of the group, not of a node


def per_node(record: str, h1: float, h2: float, others: float) -> list[Sample]:
    values = {1: h1, 2: h2}
    return [
        Sample(S(record, {"instance": f"h{i}", "probe": "fabric"}), values.get(i, others))
        for i in range(1, 6)
    ]


CASES = [
    Case(
        "",
        "h1 of a pairwise group of five meets everyone at half the others' bandwidth, h2 meets h4 and h5 "
        "at 1.25 times it: h1's typical meeting is HALF, h2's FAST (two of its three), the others' "
        "REFERENCE (each met h1 once in three, and at most one FAST; h3 and h4's meeting fell short "
        "at 0.7 and its confirmation, exported longer, measured REFERENCE: the median of its samples "
        "is REFERENCE, not the 0.7 of its lowest); the group's reference is the median of the five, "
        "REFERENCE",
        meetings("h1", fast="h2", confirmed=("h3", "h4")),
        exprs=[
            Expr("50m", recording.MEETINGS, per_node(recording.MEETINGS, HALF, FAST, REFERENCE)),
            Expr("50m", recording.REFERENCE, [Sample(GROUP.format(recording.REFERENCE), REFERENCE)]),
            # r = B / B_ref: 0.5 for h1, 1.25 for h2, 1 for the others.
            Expr("50m", recording.RATIO, per_node(recording.RATIO, 0.5, 1.25, 1.0)),
            # 1 / r: an all-reduce through h1 takes twice as long; through h2, 1 / 1.25 = 0.8 of it.
            Expr(
                "50m",
                recording.ALLREDUCE_SLOWDOWN,
                per_node(recording.ALLREDUCE_SLOWDOWN, 2.0, 1 / 1.25, 1.0),
            ),
            # step(x) = compute + x - overlap · min(compute, x) = 1 + x (no overlap):
            # step(M) / step(M_ref) = (1 + 2) / (1 + 1) = 1.5 for h1; (1 + 0.8) / (1 + 1) = 0.9 for h2
            # (float64's 0.8 is 27562500000 / 34453125000 rounded); (1 + 1) / (1 + 1) = 1 for the others.
            Expr(
                "50m",
                recording.STEP_SLOWDOWN,
                per_node(recording.STEP_SLOWDOWN, 1.5, (1 + REFERENCE / FAST) / (1 + 1), 1.0),
            ),
            # gpus · 24 · (1 - 1 / 1.5) = 1536 / 3 = 512 GPU-hours a day (float64 rounds it to 512
            # too); none for h2, faster than the reference (1536 · (1 - 1 / 0.9) < 0), nor the others.
            Expr(
                "50m",
                recording.GPU_HOURS_LOST,
                per_node(recording.GPU_HOURS_LOST, 64 * 24 * (1 - 1 / 1.5), 0.0, 0.0),
            ),
        ],
        title="the impact rules",
    ),
    Case(
        "",
        "f_max / f_eff of busy GPUs: GPU 0 busy at 990 MHz of 1980 MHz is 2 (its compute takes twice "
        "as long), GPU 1 at its maximum is 1; idle GPU 2 at 345 MHz has none",
        {
            **{
                S(name, gpu(g, **extra)): values
                for g, clock, util in (("0", "0.99e9", 1), ("1", "1.98e9", 1), ("2", "0.345e9", 0.1))
                for name, extra, values in (
                    ("clusterhealth_gpu_sm_clock_hertz", {}, f"{clock}x10"),
                    ("clusterhealth_gpu_sm_clock_max_hertz", {}, "1.98e9x10"),
                    ("clusterhealth_gpu_utilization_ratio", {}, f"{util}x10"),
                    ("clusterhealth_gpu_info", {"name": "H100"}, "1x10"),
                )
            },
        },
        exprs=[
            Expr(
                "5m",
                recording.CLOCK_SLOWDOWN,
                [
                    Sample(S(recording.CLOCK_SLOWDOWN, gpu("0")), 2.0),  # 1980 / 990
                    Sample(S(recording.CLOCK_SLOWDOWN, gpu("1")), 1.0),
                ],
            )
        ],
        title="the clock slowdown rule",
    ),
]
