"""The promtool rule tests as data: each area's cases (`<area>_cases.py`, beside the area) are
`Case`s, and `tests_file` writes them all as one `promtool test rules` file (deploy/prometheus/
tests.yaml), one test group per case.

A case holds input series and the evaluations that decide it: for an alert, at each `eval_time`,
the alerts that fire with their labels, severity and the value their annotations quote (the
expected annotations are the rule's own templates expanded, templates.py), an empty list where it
must stay quiet; for a recording rule or an expression, the exact samples it returns. The series
are the agent's (job="clusterhealth", an `instance` per node, `S`), at the shipped defaults
(`Config()`): tests.yaml tests the rule file that `make generate` writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Config
from .lib import Alert
from .templates import expand


@dataclass
class Firing:
    labels: dict[str, str]
    severity: str
    value: float = 0.0  # what {{ $value }} shows, for the alerts whose text uses it
    quoted: dict[str, float] = field(default_factory=dict)  # recording rules its text quotes (lib.quote)


@dataclass
class Sample:
    """One series an expression returns: its labels as a series selector, and its exact value."""

    series: str
    value: float


@dataclass
class Expr:
    eval_time: str
    expr: str
    samples: list[Sample]  # empty: the expression returns nothing


@dataclass
class Case:
    alert: str  # the alert its `evals` are about; "" for a case of expressions only
    why: str
    input_series: dict[str, str]
    evals: list[tuple[str, list[Firing]]] = field(default_factory=list)
    exprs: list[Expr] = field(default_factory=list)
    interval: str = "1m"
    title: str = ""  # what a case of expressions is about (a recording rule's name)

    @property
    def name(self) -> str:
        return f"{self.alert or self.title}: {self.why}"


def labels(instance: str | None, extra: dict[str, str]) -> dict[str, str]:
    """The agent's job, a node's instance label and `extra`."""
    return {"job": "clusterhealth", **({"instance": f"{instance}:9845"} if instance else {}), **extra}


def S(name: str, where: dict[str, str]) -> str:
    """A series of the agent on node `where["instance"]` (n1 unless given), as promtool writes one."""
    where = dict(where)
    full = labels(where.pop("instance", "n1"), where)
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in full.items()) + "}"


def F(
    where: dict[str, str], severity: str, value: float = 0.0, quoted: dict[str, float] | None = None
) -> Firing:
    """An alert firing with the labels of `where` (the agent's job, an instance)."""
    where = dict(where)
    # An empty label value is no label at all in Prometheus.
    where = {k: v for k, v in where.items() if v}
    return Firing(labels(where.pop("instance", "n1"), where), severity, value, dict(quoted or {}))


def gpu(n: str, instance: str = "n1", **extra: str) -> dict[str, str]:
    return {"instance": instance, "gpu": n, "uuid": f"GPU-{instance}-{n}", **extra}


def port(device: str, instance: str = "n1", **extra: str) -> dict[str, str]:
    return {"instance": instance, "device": device, "port": "1", **extra}


# A pairwise group of five nodes in 15-minute rounds; each meeting is exported by both ends for 5
# minutes (SPEC "Fabric"); one node sits out each round.
PAIRWISE_ROUNDS = [
    [("h1", "h2"), ("h3", "h4")],
    [("h1", "h3"), ("h2", "h5")],
    [("h1", "h4"), ("h3", "h5")],
    [("h1", "h5"), ("h2", "h4")],
]


def _rule(alerts: Sequence[Alert], name: str, severity: str) -> Alert:
    found = [a for a in alerts if a.name == name and a.severity == severity]
    if len(found) != 1:
        raise ValueError(f"{name} at {severity}: {len(found)} rules")
    return found[0]


def promtool_group(case: Case, alerts: Sequence[Alert], config: Config) -> dict[str, Any]:
    """The case as one test group of a `promtool test rules` file."""
    group: dict[str, Any] = {
        "name": case.name,
        "interval": case.interval,
        "input_series": [{"series": s, "values": v} for s, v in case.input_series.items()],
    }
    if case.evals:
        group["alert_rule_test"] = [
            {
                "eval_time": eval_time,
                "alertname": case.alert,
                "exp_alerts": [_expected(case.alert, f, alerts, config) for f in firing],
            }
            for eval_time, firing in case.evals
        ]
    if case.exprs:
        group["promql_expr_test"] = [
            {
                "expr": e.expr,
                "eval_time": e.eval_time,
                "exp_samples": [{"labels": s.series, "value": s.value} for s in e.samples],
            }
            for e in case.exprs
        ]
    return group


def _expected(name: str, f: Firing, alerts: Sequence[Alert], config: Config) -> dict[str, Any]:
    rule = _rule(alerts, name, f.severity)
    all_labels = {**f.labels, "severity": f.severity}
    return {
        "exp_labels": all_labels,
        "exp_annotations": {
            "summary": expand(rule.summary, all_labels, f.value, f.quoted),
            "description": expand(rule.description, all_labels, f.value, f.quoted),
            "runbook_url": config.runbook_url.format(alert=name),
        },
    }


def tests_file(
    cases: Iterable[Case], alerts: Sequence[Alert], config: Config, rule_file: str
) -> dict[str, Any]:
    """A `promtool test rules` file of `cases` against `rule_file` (a path relative to the test
    file, or absolute)."""
    return {
        "rule_files": [rule_file],
        "evaluation_interval": "1m",
        "tests": [promtool_group(case, alerts, config) for case in cases],
    }
