"""Fabric probes: the machinery below every probe run, in the order a run uses it,

* ``lock.ProbeLock``: one probe at a time per node, across processes;
* ``idle.IdleGuard``: skip the run while a job uses the node;
* ``runner.template`` and ``runner.run``: fill in the command and run it, bounded in time and output;
* ``probe_parsers.parse`` (a sibling package): read what the tool printed;
* ``evaluate.evaluate``: ok, degraded, failed or timeout, with a reason;
* ``baseline.BaselineStore``: the expectation learned from past good runs;

chained once by ``pipeline`` for the scheduled probes and the pairwise meetings
(checks/fabric/rounds.py) alike; and above it the ``probes`` collector (``collector``: the
schedule, the results kept by ``store``, the families of ``families``) and the settings
(``settings``). The agent builds the collector from its table (agent/collectors.py); nothing here
imports the agent.
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
