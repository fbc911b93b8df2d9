"""The machinery below scheduled fabric probes, in the order a probe run uses it:

* ``lock.ProbeLock``: one probe at a time per node, across processes;
* ``idle.IdleGuard``: skip the run while a job uses the node;
* ``runner.template`` and ``runner.run``: fill in the command and run it, bounded in time and output;
* ``probe_parsers.parse`` (a sibling package): read what the tool printed;
* ``evaluate.evaluate``: ok, degraded, failed or timeout, with a reason;
* ``baseline.BaselineStore``: the expectation learned from past good runs.

Scheduling, configuration and metrics are the agent's; nothing here imports it.
"""

from __future__ import annotations

from clusterhealth.checks.probes.baseline import BaselineStore
from clusterhealth.checks.probes.evaluate import RESULTS, ProbeOutcome, ProbeResult, evaluate, skipped
from clusterhealth.checks.probes.idle import IdleGuard
from clusterhealth.checks.probes.lock import ProbeLock, ProbeLockHeld
from clusterhealth.checks.probes.runner import RunResult, run, template

__all__ = [
    "RESULTS",
    "BaselineStore",
    "IdleGuard",
    "ProbeLock",
    "ProbeLockHeld",
    "ProbeOutcome",
    "ProbeResult",
    "RunResult",
    "evaluate",
    "run",
    "skipped",
    "template",
]
