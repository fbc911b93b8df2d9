"""promtool cases of the remediator's alerts (remediation.py)."""

from __future__ import annotations

from .cases import Case, Firing

REMEDIATOR = {"job": "clusterhealth-remediate", "instance": "ctl:9846"}


def R(name: str, **labels: str) -> str:
    """A series of the remediator's scrape job."""
    every = {**REMEDIATOR, **labels}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in every.items()) + "}"


def fires(severity: str, value: float = 0.0, **labels: str) -> Firing:
    return Firing({**REMEDIATOR, **labels}, severity, value)


DEFERRED = "clusterhealth_remediation_deferred_nodes"
CASES = [
    Case(
        "RemediationBudgetExhausted",
        "4 nodes wait for the fleet budget and 1 for its domain from 3m; the slow start's pacing is "
        "not a spent budget; the budget frees at 15m",
        {
            R(DEFERRED, backend="slurm", reason="budget"): "0x2 4x12 0x5",
            R(DEFERRED, backend="slurm", reason="domain"): "0x2 1x12 0x5",
            R(DEFERRED, backend="slurm", reason="slow_start"): "3x20",
        },
        [
            ("4m", []),  # pending
            ("10m", [fires("critical", 5, backend="slurm")]),
            ("18m", []),
        ],
    ),
    Case(
        "RemediationBudgetExhausted",
        "a failure domain's share alone spent",
        {
            R(DEFERRED, backend="kubernetes", reason="budget"): "0x10",
            R(DEFERRED, backend="kubernetes", reason="domain"): "2x10",
            R(DEFERRED, backend="kubernetes", reason="slow_start"): "0x10",
        },
        [("8m", [fires("critical", 2, backend="kubernetes")])],
    ),
    Case(
        "RemediationDown",
        "the remediator unreachable from 3m",
        {R("up"): "1x2 0x10"},
        [("5m", []), ("10m", [fires("warning", 0)])],
    ),
    Case(
        "RemediationStale",
        "its latest success stops at 2m (a reconcile every minute before); with the default 15 minutes "
        "it is stale from 17m, and fires 5m later",
        {
            R("clusterhealth_remediation_last_success_timestamp_seconds", backend="slurm"): "0+60x2 120x30",
            R("clusterhealth_remediation_dry_run", backend="slurm"): "0x32",
        },
        [("10m", []), ("20m", []), ("25m", [fires("warning", 25 * 60 - 120, backend="slurm")])],
    ),
    Case(
        "RemediationStale",
        "a remediator that never finished a reconcile since it started",
        {R("clusterhealth_remediation_dry_run", backend="slurm"): "1x10"},
        [("3m", []), ("8m", [fires("warning", 1, backend="slurm")])],
    ),
]
