"""`clusterhealth analyze`: read a pairwise group's results back from Prometheus and name suspects.

It uses Prometheus's HTTP API (``/api/v1/query_range`` and ``/api/v1/query``) and the Fabric
series of SPEC alone. The step of the range queries follows the group's round period, measured
from ``changes(clusterhealth_probe_round[window])``: a quarter of a period, so that each
partner's result, exported for about half a round (the regular result until the confirming
one replaces it mid-round), is sampled at least once. Range queries return the latest sample at
each step and nothing for a series that was dropped (Prometheus marks it stale at the next
scrape), so a sample and the round number at the same step come from the same scrape.

Exit codes: 0 no suspect, 1 suspects, 2 bad arguments, 3 no verdict (Prometheus unreachable or
answering an error, no data, partial data, not enough evidence).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from clusterhealth.checks.fabric import analysis
from clusterhealth.checks.fabric.analysis import Analysis, Rules

EXIT_NO_SUSPECT, EXIT_SUSPECTS, EXIT_USAGE, EXIT_NO_VERDICT = 0, 1, 2, 3
DEFAULT_WINDOW = "6h"
# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_PROBE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class NoVerdict(Exception):
    """Why analyze cannot answer: the message names what is missing."""


def parse_duration(text: str) -> float:
    """A Prometheus duration (``6h``, ``1h30m``, ``2d``) in seconds; ValueError otherwise."""
    if not text or not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", text):
        raise ValueError(f"expected a duration such as 6h, 90m or 1d12h, got {text!r}")
    seconds = sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))
    if seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return float(seconds)


@dataclass
class Prometheus:
    """The few calls of Prometheus's HTTP API that analyze makes."""

    url: str
    timeout: float = 30.0

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        return self._get("/api/v1/query_range", params)

    def _get(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        url = self.url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            raise NoVerdict(f"Prometheus at {self.url} answered {err.code}: {_api_error(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise NoVerdict(f"cannot reach Prometheus at {self.url}: {reason}") from None
        try:
            document = json.loads(body)
        except ValueError:
            raise NoVerdict(f"{self.url} did not answer as Prometheus's HTTP API does (not JSON)") from None
        if not isinstance(document, dict) or document.get("status") != "success":
            raise NoVerdict(f"Prometheus at {self.url} answered an error: {document!r:.200}")
        warnings = document.get("warnings") or []
        if warnings:
            raise NoVerdict(f"Prometheus returned partial data for {params['query']}: {'; '.join(warnings)}")
        data = document.get("data") or {}
        result = data.get("result")
        if not isinstance(result, list):
            raise NoVerdict(f"Prometheus at {self.url} answered without a result list")
        return result


def _api_error(err: urllib.error.HTTPError) -> str:
    try:
        document = json.loads(err.read())
        return f"{document.get('errorType', '')}: {document.get('error', '')}".strip(": ")
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


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
) -> Analysis:
    """Query Prometheus and analyse one group; NoVerdict when it cannot."""
    prometheus = Prometheus(url, timeout)
    end = time.time() if now is None else now
    start = end - window
    selector = f"[{math.ceil(window)}s]"
    if probe is None:
        found = prometheus.query(f"count by (probe) (last_over_time({analysis.ROUND}{selector}))", end)
        names = sorted({s.get("metric", {}).get("probe", "") for s in found} - {""})
        if not names:
            raise NoVerdict(f"no pairwise probe results ({analysis.ROUND}) in Prometheus over the window")
        if len(names) > 1:
            raise NoVerdict(f"several pairwise probe groups ({', '.join(names)}): choose one with --probe")
        probe = names[0]
    match = f'probe="{probe}"'
    if step is None:
        step = _period(prometheus, probe, match, selector, end, window) / 4
    step = max(step, window / MAX_POINTS, 1.0)

    def series(promql: str) -> list[dict[str, Any]]:
        return prometheus.query_range(promql, start, end, step)

    reduced = analysis.reduce_series(
        probe,
        node_info=series(analysis.NODE_INFO),
        rounds=series(f"{analysis.ROUND}{{{match}}}"),
        bandwidth=series(f'{analysis.BANDWIDTH}{{{match},peer!=""}}'),
        peer_success=series(f"{analysis.PEER_SUCCESS}{{{match}}}"),
        expected=series(f"{analysis.EXPECTED}{{{match}}}"),
    )
    if not reduced.reports and not reduced.problems:
        raise NoVerdict(f"no pairwise results of probe {probe} in Prometheus over the window")
    if reduced.problems and not allow_partial:
        raise NoVerdict(
            "partial data (rerun with --allow-partial to analyse the rest): " + "; ".join(reduced.problems)
        )
    meetings = analysis.merge(reduced.reports)
    return analysis.analyze(
        probe,
        meetings,
        window_seconds=window,
        rules=rules,
        expected=reduced.expected,
        nodes=reduced.nodes,
        problems=reduced.problems,
    )


def _period(
    prometheus: Prometheus, probe: str, match: str, selector: str, end: float, window: float
) -> float:
    """The group's round period, in seconds.

    Rounds are numbered from the Unix epoch (round = wall clock // period), so the latest round
    number and the time give the period to well under a second. Should the numbers not follow
    that rule, the number of round changes in the window gives an upper bound.
    """
    latest = prometheus.query(f"max(last_over_time({analysis.ROUND}{{{match}}}{selector}))", end)
    values = [float(s["value"][1]) for s in latest if "value" in s]
    if not values:
        raise NoVerdict(f"no results of probe {probe} ({analysis.ROUND}) in Prometheus over the window")
    if values[0] >= 1 and end / (values[0] + 0.5) <= window:
        return end / (values[0] + 0.5)
    changes = prometheus.query(f"max(changes({analysis.ROUND}{{{match}}}{selector}))", end)
    counted = [float(s["value"][1]) for s in changes if "value" in s]
    return window / (max(counted, default=0.0) + 1)


def main(
    url: str,
    probe: str | None,
    window_text: str,
    as_json: bool,
    *,
    step_text: str | None = None,
    allow_partial: bool = False,
) -> int:
    """The command: prints the table or the JSON and returns the exit code."""
    try:
        window = parse_duration(window_text)
        step = parse_duration(step_text) if step_text else None
    except ValueError as err:
        print(f"clusterhealth analyze: {err}", file=sys.stderr)
        return EXIT_USAGE
    if probe is not None and not _PROBE.fullmatch(probe):
        print(f"clusterhealth analyze: --probe: expected a probe name, got {probe!r}", file=sys.stderr)
        return EXIT_USAGE
    if not urllib.parse.urlsplit(url).scheme.startswith("http"):
        print(
            f"clusterhealth analyze: --prometheus: expected http(s)://HOST:PORT, got {url!r}", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        result = run(url, probe, window, step=step, allow_partial=allow_partial)
    except NoVerdict as err:
        if as_json:
            print(json.dumps({"probe": probe, "window_seconds": round(window), "error": str(err)}))
        print(f"clusterhealth analyze: {err}", file=sys.stderr)
        return EXIT_NO_VERDICT
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        sys.stdout.write(analysis.render_table(result))
    if result.not_enough_evidence:
        return EXIT_NO_VERDICT
    return EXIT_SUSPECTS if result.suspects else EXIT_NO_SUSPECT
