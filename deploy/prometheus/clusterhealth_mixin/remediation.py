"""The remediator's alerts (group `clusterhealth.remediation`): its budget spent while nodes wait,
the remediator not scraped, its reconciles no longer succeeding. Its own scrape job
(`remediation_selector`), one per fleet (docs/remediation.md). Cases: remediation_cases.py;
runbooks: docs/runbooks/<Alert>.md."""

from __future__ import annotations

from .config import Config
from .lib import Alert, Group


def group(c: Config) -> Group:
    return Group("clusterhealth.remediation", [budget_exhausted(c), down(c), stale(c)])


def _m(c: Config, *extra: str) -> str:
    return "{" + ",".join(m for m in (c.remediation_selector, *extra) if m) + "}"


def budget_exhausted(c: Config) -> Alert:
    return Alert(
        "RemediationBudgetExhausted",
        "critical",
        f"""sum without (reason) (
  clusterhealth_remediation_deferred_nodes{_m(c, 'reason=~"budget|domain"')}
) > 0""",
        "The remediator on {{ $labels.instance }} has spent its budget: {{ $value }} node(s) wait.",
        "Nodes whose verdict asks for a drain wait because budget.max_unavailable nodes (or a failure "
        "domain's share) are out of service by the remediator already. Many nodes turning sick at once "
        "is rarely many broken nodes: look for what they share (a configuration push, a switch, a driver "
        "roll-out) before raising the budget. It adds nodes again by itself as its own come back, and "
        "acts on the verdicts of that moment, not on those it deferred.",
        c.for_remediation,
        about="remediator",
    )


def down(c: Config) -> Alert:
    return Alert(
        "RemediationDown",
        "warning",
        f"up{_m(c)} == 0",
        "The remediator on {{ $labels.instance }} cannot be scraped.",
        "Prometheus cannot scrape the remediator: it stopped or hangs, so no node is drained or "
        "resumed by it, and the nodes it drained stay drained. Check `systemctl status "
        "clusterhealth-remediate` on the controller host (or its Deployment).",
        c.for_agent,
        about="remediator",
    )


def stale(c: Config) -> Alert:
    return Alert(
        "RemediationStale",
        "warning",
        f"""time() - clusterhealth_remediation_last_success_timestamp_seconds{_m(c)}
  > {c.remediation_stale_seconds:g}
or
(
  clusterhealth_remediation_dry_run{_m(c)}
  unless on (instance, job, backend)
  clusterhealth_remediation_last_success_timestamp_seconds{_m(c)}
)""",
        "The remediator on {{ $labels.instance }} has not finished a reconcile lately.",
        "Its reconciles find no trusted data (Prometheus unreachable or answering partially, the "
        "scheduler unreadable) or a scheduler command fails or hangs: it acts on nothing meanwhile. "
        "Its log says why, once, when it begins.",
        c.for_agent,
        about="remediator",
    )
