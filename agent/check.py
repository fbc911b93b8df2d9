"""`clusterhealth check`: every audit and health check once, for Slurm, Nagios and node-problem-detector.

Exit codes follow Nagios and NHC: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (`--exit-codes nagios`).
node-problem-detector's custom plugins read 0 as OK, 1 as a problem and anything else as unknown;
`--exit-codes npd` maps CRITICAL to 1, WARNING to 0 and UNKNOWN to 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter

from clusterhealth.agent import collectors
from clusterhealth.agent import config as configuration
from clusterhealth.checks.audit_collector import AuditCollector, AuditRun
from clusterhealth.checks.audits import CheckResult, Status, by_precedence, worst

NPD_EXIT = {Status.OK: 0, Status.WARNING: 0, Status.CRITICAL: 1, Status.UNKNOWN: 2}


def collect_once(config: configuration.Config) -> AuditRun:
    """The audit once, after what it reads (GPUs, kernel log) was collected once, each collector
    bounded by its timeout: a hung NVML call gives UNKNOWN GPU checks in time, not a hung check."""
    # `check` runs the audits even where the agent's audit collector is switched off.
    audit = dataclasses.replace(config.collectors.audit, enabled=True)
    config = dataclasses.replace(config, collectors=dataclasses.replace(config.collectors, audit=audit))
    node, samplers = collectors.collect_once(config, only=("audit",))
    try:
        (sampler,) = [s for s in samplers if s.name == "audit"]
        assert isinstance(sampler.collector, AuditCollector)
        if sampler.collector.last is None:
            raise RuntimeError(f"the audit did not run: {sampler.status().reason}")
        return sampler.collector.last
    finally:
        node.close()


def run_check(
    config: configuration.Config, output: str, exit_codes: str, only: str | None, show_ok: bool
) -> int:
    run = collect_once(config)
    results = [r for r in run.results if only is None or re.fullmatch(only, r.check)]
    status = worst(results)
    if output == "json":
        print(json.dumps(_as_json(results, status), indent=2))
    elif output == "line":
        print(summary_line(results, status))
    else:
        print(table(results, status, show_ok))
    return NPD_EXIT[status] if exit_codes == "npd" else status


def summary_line(results: list[CheckResult], status: Status) -> str:
    """One line: the status and the worst problem, as a Slurm drain reason or an NPD message."""
    problems = by_precedence(r for r in results if r.status != Status.OK)
    if not problems:
        return f"OK: {len(results)} checks passed"
    first = problems[0]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{status.name}: {first.check} {first.subject}: {first.message}{more}"


def table(results: list[CheckResult], status: Status, show_ok: bool) -> str:
    rows = by_precedence(r for r in results if show_ok or r.status != Status.OK)
    lines = []
    if rows:
        width_check = max(len("CHECK"), *(len(r.check) for r in rows))
        width_subject = max(len("SUBJECT"), *(len(r.subject) for r in rows))
        lines.append(f"{'STATUS':<9} {'CHECK':<{width_check}} {'SUBJECT':<{width_subject}} MESSAGE")
        for r in rows:
            name = r.status.name
            lines.append(f"{name:<9} {r.check:<{width_check}} {r.subject:<{width_subject}} {r.message}")
        lines.append("")
    counts = Counter(r.status.name.lower() for r in results)
    tally = ", ".join(
        f"{counts[name]} {name}" for name in ("critical", "warning", "unknown", "ok") if counts[name]
    )
    lines.append(f"clusterhealth check: {status.name} ({tally or 'no checks'})")
    return "\n".join(lines)


def _as_json(results: list[CheckResult], status: Status) -> dict[str, object]:
    return {
        "status": status.name,
        "exit_code": int(status),
        "summary": summary_line(results, status),
        "results": [
            {"check": r.check, "subject": r.subject, "status": r.status.name, "message": r.message}
            for r in results
        ],
    }


def main_check(
    config: configuration.Config, output: str, exit_codes: str, only: str | None, show_ok: bool
) -> int:
    try:
        return run_check(config, output, exit_codes, only, show_ok)
    except Exception as err:  # a crashed check is UNKNOWN, never a silent OK
        print(f"UNKNOWN: clusterhealth check failed: {type(err).__name__}: {err}")
        return NPD_EXIT[Status.UNKNOWN] if exit_codes == "npd" else Status.UNKNOWN
