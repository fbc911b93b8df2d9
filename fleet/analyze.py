"""`clusterhealth analyze`: read a pairwise group's results back from Prometheus and name suspects.

The history is read as fleet/pairwise.py reads it (samples as scraped, window by window) and
judged by checks/fabric/analysis.py. Each suspect is priced (``impact``, checks/cost.py) for a
stated workload (``--params``, ``--bytes-per-param``, ``--gpus``, ``--compute-seconds``,
``--overlap``), and, where ``clusterhealth_gpu_job_info`` names the jobs running on a suspect's
nodes at the end of the window, for each of them with its own GPU count.

A Prometheus answer with ``warnings`` or ``isPartial`` (a remote store or a federated source that
did not answer), to any query including the jobs', is partial data, like results that cannot be
tied to a node: no verdict without ``--allow-partial``, and with it the verdict says it is partial
(``partial`` in the JSON).

Exit codes: 0 no suspect, 1 suspects, 2 bad arguments, 3 no verdict (Prometheus unreachable or
answering an error, no data, partial data, not enough evidence).
"""

from __future__ import annotations

import json
import sys

from clusterhealth.checks import cost
from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric.analysis import Analysis, Rules
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.prometheus import NoVerdict, Partial, Prometheus, parse_duration, valid_url

EXIT_NO_SUSPECT, EXIT_SUSPECTS, EXIT_USAGE, EXIT_NO_VERDICT = 0, 1, 2, 3


def run(
    url: str,
    probe: str | None,
    window: float,
    *,
    step: float | None = None,
    now: float | None = None,
    allow_partial: bool = False,
    rules: Rules | None = None,
    timeout: float = 30.0,
    prometheus: Prometheus | None = None,
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
) -> Analysis:
    """Query Prometheus and analyse one group; NoVerdict when it cannot.

    ``step`` is the width of the windows the history is read in (default:
    ``pairwise.window_width``); ``workload`` is what suspects are priced for where no job
    attribution names the jobs."""
    prometheus = prometheus or Prometheus(url, timeout)
    history = pairwise.read_history(
        prometheus, probe, window, step=step, now=now, allow_partial=allow_partial
    )
    return pairwise.judge(history, rules=rules, workload=workload)


def main(
    url: str,
    probe: str | None,
    window_text: str,
    as_json: bool,
    *,
    step_text: str | None = None,
    allow_partial: bool = False,
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
) -> int:
    """The command: prints the table or the JSON and returns the exit code."""
    try:
        window = parse_duration(window_text)
        step = parse_duration(step_text) if step_text else None
    except ValueError as err:
        print(f"clusterhealth analyze: {err}", file=sys.stderr)
        return EXIT_USAGE
    if probe is not None and not pairwise.valid_probe(probe):
        print(f"clusterhealth analyze: --probe: expected a probe name, got {probe!r}", file=sys.stderr)
        return EXIT_USAGE
    if not valid_url(url):
        print(
            f"clusterhealth analyze: --prometheus: expected http(s)://HOST:PORT, got {url!r}", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        result = run(url, probe, window, step=step, allow_partial=allow_partial, workload=workload)
    except NoVerdict as err:
        if as_json:
            document = {"probe": probe, "window_seconds": round(window), "error": str(err)}
            document["partial"] = isinstance(err, Partial)
            print(json.dumps(document))
        print(f"clusterhealth analyze: {err}", file=sys.stderr)
        return EXIT_NO_VERDICT
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        sys.stdout.write(analysis.render_table(result))
    if result.not_enough_evidence:
        return EXIT_NO_VERDICT
    return EXIT_SUSPECTS if result.suspects else EXIT_NO_SUSPECT
