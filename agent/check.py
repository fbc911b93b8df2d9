"""`clusterhealth check`: every audit and health check once, for Slurm, Nagios and node-problem-detector.

Exit codes follow Nagios and NHC: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (`--exit-codes nagios`).
node-problem-detector's custom plugins read 0 as OK, 1 as a problem and anything else as unknown;
`--exit-codes npd` maps CRITICAL to 1, WARNING to 0 and UNKNOWN to 2.

With job attribution on (`collectors.jobs`), each finding about a GPU names the workload on it: a
JOB column in the table, `jobs` in the JSON, and the job in the one line.

Every output carries the node's verdict (checks/verdict.py, docs/remediation.md): the JSON's
`verdict` object, the line's first two words (`unhealthy reboot: CRITICAL: gpu_lost 6: ...`, the
finding named being the verdict's reason), the table's last line. With `--only` it is the verdict of
the checks selected, as the exit code is their status.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass

from clusterhealth.agent import collectors
from clusterhealth.agent import config as configuration
from clusterhealth.checks.audit_collector import AuditCollector, AuditRun
from clusterhealth.checks.audits import CheckResult, Status, worst
from clusterhealth.checks.verdict import Evidence, Missing, Verdict, decide_run
from clusterhealth.exporters.jobs.attribution import Attribution, Workload

NPD_EXIT = {Status.OK: 0, Status.WARNING: 0, Status.CRITICAL: 1, Status.UNKNOWN: 2}


@dataclass(frozen=True)
class CheckRun:
    audit: AuditRun
    # The GPUs' workloads when attribution is on: None when it is off, or why it failed.
    jobs: Attribution | None
    jobs_unknown: str = ""

    def workloads(self, result: CheckResult | Evidence) -> list[Workload] | None:
        """The workloads on the GPU a result is about; None for a result about no GPU or when
        attribution is off."""
        if self.jobs is None or not result.check.startswith("gpu_") or not result.subject.isdigit():
            return None
        return self.jobs.workloads(int(result.subject))


def collect_once(config: configuration.Config) -> CheckRun:
    """The audit once, after what it reads (GPUs, kernel log) was collected once, each collector
    bounded by its timeout: a hung NVML call gives UNKNOWN GPU checks in time, not a hung check."""
    # `check` runs the audits even where the agent's audit collector is switched off.
    audit = dataclasses.replace(config.collectors.audit, enabled=True)
    config = dataclasses.replace(config, collectors=dataclasses.replace(config.collectors, audit=audit))
    attribution = config.collectors.jobs.enabled
    node, samplers = collectors.collect_once(config, only=("audit", "jobs") if attribution else ("audit",))
    try:
        (sampler,) = [s for s in samplers if s.name == "audit"]
        assert isinstance(sampler.collector, AuditCollector)
        if sampler.collector.last is None:
            raise RuntimeError(f"the audit did not run: {sampler.status().reason}")
        jobs, why = node.jobs.read() if attribution else (None, "")
        return CheckRun(sampler.collector.last, jobs, why)
    finally:
        node.close()


def run_check(
    config: configuration.Config, output: str, exit_codes: str, only: str | None, show_ok: bool
) -> int:
    run = collect_once(config)

    def selected(result: CheckResult) -> bool:
        return only is None or re.fullmatch(only, result.check) is not None

    results = [r for r in run.audit.results if selected(r)]
    # A collector that could not deliver left its checks UNKNOWN in the results: they say it.
    verdict = decide_run(run.audit, keep=selected)
    status = worst(results)
    if output == "json":
        print(json.dumps(_as_json(results, status, run, verdict), indent=2))
    elif output == "line":
        print(summary_line(results, status, verdict, run))
    else:
        print(table(results, status, show_ok, verdict, run))
    return NPD_EXIT[status] if exit_codes == "npd" else status


def jobs_text(workloads: list[Workload] | None) -> str:
    """`slurm:817304`, `kubernetes:team/train-0`, or `-` for a GPU no workload was found on."""
    if workloads is None:
        return ""
    if not workloads:
        return "-"
    names = []
    for w in workloads:
        if w.scheduler == "slurm":
            names.append(f"slurm:{w.job}")
        else:
            names.append(f"kubernetes:{w.namespace}/{w.pod}" if w.pod else f"kubernetes:pod-uid={w.job}")
    return ",".join(names)


def verdict_words(verdict: Verdict) -> str:
    """`unhealthy reboot`: the verdict's state and action, as the line begins."""
    return f"{verdict.state} {verdict.action.label}"


def summary_line(
    results: list[CheckResult], status: Status, verdict: Verdict, run: CheckRun | None = None
) -> str:
    """One line, as a Slurm drain reason or an NPD message: the verdict, the status and the
    verdict's reason (worst status first, then heaviest action, then NVML, Xid, other checks)."""
    first = verdict.reason
    if first is None:
        return f"{verdict_words(verdict)}: OK: {len(results)} checks passed"
    more = f" (+{len(verdict.evidence) - 1} more)" if len(verdict.evidence) > 1 else ""
    jobs = jobs_text(run.workloads(first)) if run is not None else ""
    on = f" [job {jobs}]" if jobs and jobs != "-" else ""
    return f"{verdict_words(verdict)}: {status.name}: {first.about}{on}: {first.message}{more}"


def table(
    results: list[CheckResult], status: Status, show_ok: bool, verdict: Verdict, run: CheckRun | None = None
) -> str:
    # The verdict's evidence in its order (worst status, heaviest action first), then what passed.
    rank = {(e.check, e.subject): n for n, e in enumerate(verdict.evidence)}
    rows = sorted(
        (r for r in results if show_ok or r.status != Status.OK),
        key=lambda r: rank.get((r.check, r.subject), len(rank)),
    )
    lines = []
    attribution = run is not None and run.jobs is not None
    if rows:
        width_check = max(len("CHECK"), *(len(r.check) for r in rows))
        width_subject = max(len("SUBJECT"), *(len(r.subject) for r in rows))
        jobs = {id(r): jobs_text(run.workloads(r)) if run is not None else "" for r in rows}
        width_job = max(len("JOB"), *(len(j) for j in jobs.values()))
        job_head = f"{'JOB':<{width_job}} " if attribution else ""
        lines.append(f"{'STATUS':<9} {'CHECK':<{width_check}} {'SUBJECT':<{width_subject}} {job_head}MESSAGE")
        for r in rows:
            name = r.status.name
            job = f"{jobs[id(r)]:<{width_job}} " if attribution else ""
            lines.append(f"{name:<9} {r.check:<{width_check}} {r.subject:<{width_subject}} {job}{r.message}")
        lines.append("")
    if run is not None and run.jobs is None and run.jobs_unknown:
        lines.append(f"jobs unknown: {run.jobs_unknown}")
    counts = Counter(r.status.name.lower() for r in results)
    tally = ", ".join(
        f"{counts[name]} {name}" for name in ("critical", "warning", "unknown", "ok") if counts[name]
    )
    lines.append(
        f"clusterhealth check: {status.name} ({tally or 'no checks'}); verdict: {verdict_words(verdict)}"
    )
    return "\n".join(lines)


def _as_json(
    results: list[CheckResult], status: Status, run: CheckRun, verdict: Verdict
) -> dict[str, object]:
    def entry(r: CheckResult) -> dict[str, object]:
        out: dict[str, object] = {
            "check": r.check,
            "subject": r.subject,
            "status": r.status.name,
            "message": r.message,
        }
        workloads = run.workloads(r)
        if workloads is not None:
            out["jobs"] = [
                {
                    "scheduler": w.scheduler,
                    "job": w.job,
                    "namespace": w.namespace,
                    "pod": w.pod,
                    "container": w.container,
                }
                for w in workloads
            ]
        return out

    return {
        "status": status.name,
        "exit_code": int(status),
        "summary": summary_line(results, status, verdict, run),
        "verdict": verdict.as_json(),
        "results": [entry(r) for r in results],
    }


def main_check(
    config: configuration.Config, output: str, exit_codes: str, only: str | None, show_ok: bool
) -> int:
    try:
        return run_check(config, output, exit_codes, only, show_ok)
    except Exception as err:  # a crashed check is UNKNOWN, never a silent OK
        why = f"clusterhealth check failed: {type(err).__name__}: {err}"
        verdict = decide_run(None, [Missing("audit", f"did not run: {why}")])
        line = f"{verdict_words(verdict)}: UNKNOWN: {why}"
        if output == "json":
            report = {"status": "UNKNOWN", "exit_code": int(Status.UNKNOWN), "summary": line}
            print(json.dumps({**report, "verdict": verdict.as_json(), "results": []}, indent=2))
        else:
            print(line)
        return NPD_EXIT[Status.UNKNOWN] if exit_codes == "npd" else Status.UNKNOWN
