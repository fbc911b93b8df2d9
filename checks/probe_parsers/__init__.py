"""Pure parsers for fabric-probe outputs: text in, frozen records out, no I/O.

Each module declares its kind (`KIND`: name, parser, unit, headline figure, exit-code meanings);
`REGISTRY` below maps kind names to those declarations, and everything that depends on the kind
(the config's accepted kinds, `clusterhealth probe parse --kind`, the evaluation's reasons, the
metrics' HELP) reads it from there. A new kind is one module and one line in `REGISTRY`
(docs/adding-a-probe-kind.md).

``parse(kind, text)`` returns a result with ``to_dict()`` (JSON-serializable), a ``verdict`` and a
headline ``bandwidth_bytes_per_second`` for ``clusterhealth_probe_bandwidth_bytes_per_second``.
"""

from __future__ import annotations

from clusterhealth.checks.probe_parsers import ib_write_bw, iperf3, nccl_tests, nvbandwidth
from clusterhealth.checks.probe_parsers._common import ProbeKind, ProbeParse, Verdict

REGISTRY: dict[str, ProbeKind] = {
    kind.name: kind
    for kind in (
        nccl_tests.KIND,
        iperf3.KIND,
        ib_write_bw.KIND,
        nvbandwidth.KIND,
    )
}
KINDS = tuple(REGISTRY)


def kind(name: str) -> ProbeKind:
    """The declaration of kind `name`; ValueError naming the known kinds otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown probe output kind {name!r}; expected one of {', '.join(KINDS)}") from None


def parse(name: str, text: str) -> ProbeParse:
    """Parse one saved probe output. An unknown kind raises ValueError; bad text never raises."""
    return kind(name).parse(text)


def headline_help() -> str:
    """What the headline bandwidth is for each kind, for the metrics' HELP."""
    return "; ".join(f"{k.name}: {k.headline}" for k in REGISTRY.values())


def wrong_values_help() -> str:
    """What the wrong values are for each kind that checks its data, for the metric's HELP."""
    return "; ".join(f"{k.name}: {k.wrong_values}" for k in REGISTRY.values() if k.wrong_values)


__all__ = [
    "KINDS",
    "REGISTRY",
    "ProbeKind",
    "ProbeParse",
    "Verdict",
    "headline_help",
    "kind",
    "parse",
    "wrong_values_help",
]
