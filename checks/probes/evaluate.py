"""Turn one probe run (the process, its parsed output, the expectation) into a result.

Pure: no I/O, no clock. The result vocabulary is the ``result`` label of
``clusterhealth_probe_runs_total``; the rules, first match wins:

1. ``timeout``: the runner killed the probe at its deadline.
2. ``failed``: the probe could not be started or reaped, exited non-zero or by a signal (for
   nccl-tests the exit code is named: 3 is an NCCL error, 7 wrong results), or exited 0 but its
   output says it did not finish or went wrong (iperf3 exits 0 on a refused connection; nccl-tests
   can print ``#wrong`` counts), or an expectation is set and the output holds no bandwidth.
3. ``degraded``: the bandwidth is below ``degraded_fraction`` of the expectation, or NCCL fell back
   to sockets or shared memory where the node has RDMA devices or NVLink (checks/probes/transport.py;
   only a run whose output says which transports it used, and only given the node's facts).
4. ``ok``: otherwise, including when there is no expectation yet.

``skipped`` is never the outcome of a run; ``skipped(reason)`` builds it for a probe the idle
guard or the probe lock did not let start.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from typing import Any, Literal

from clusterhealth.checks import probe_parsers
from clusterhealth.checks.probe_parsers import ProbeKind, ProbeParse
from clusterhealth.checks.probe_parsers._common import format_rate
from clusterhealth.checks.probe_parsers.nccl_transport import Transport
from clusterhealth.checks.probes.runner import RunResult
from clusterhealth.checks.probes.transport import NodeLinks, fallback

ProbeResult = Literal["ok", "degraded", "failed", "timeout", "skipped"]
RESULTS: tuple[ProbeResult, ...] = ("ok", "degraded", "failed", "timeout", "skipped")


@dataclass(frozen=True)
class ProbeOutcome:
    result: ProbeResult
    reason: str  # one sentence for a log line or `clusterhealth probe run`
    bandwidth_bytes_per_second: float | None = None  # the parser's headline figure
    expected_bytes_per_second: float | None = None
    wrong_values: int | None = None  # the parser's wrong_values; None when not checked
    transport: Transport | None = (
        None  # what the output says of NCCL's transports; None: not a kind that says
    )

    @property
    def success(self) -> bool:
        """``clusterhealth_probe_success``: completed and met its expectation."""
        return self.result == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": self.result,
            "reason": self.reason,
            "success": self.success,
            "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
            "expected_bytes_per_second": self.expected_bytes_per_second,
            "wrong_values": self.wrong_values,
            "transport": self.transport.to_dict() if self.transport is not None else None,
        }

    @classmethod
    def from_state(cls, data: Any) -> ProbeOutcome:
        """An outcome as `dataclasses.asdict` kept it in a state file; ValueError when it is not one."""
        try:
            fields = dict(data)
            transport = fields.pop("transport", None)
            outcome = cls(**fields, transport=None if transport is None else Transport.from_dict(transport))
        except (TypeError, ValueError) as err:
            raise ValueError(f"not a probe outcome ({err})") from err
        if outcome.result not in RESULTS:
            raise ValueError(f"unknown result {outcome.result!r}")
        return outcome


def skipped(reason: str) -> ProbeOutcome:
    return ProbeOutcome(result="skipped", reason=reason)


def evaluate(
    kind: str,
    run: RunResult,
    parse: ProbeParse | None,
    expected_bytes_per_second: float | None,
    degraded_fraction: float,
    node: NodeLinks | None = None,
) -> ProbeOutcome:
    """The outcome of one run; ``parse`` is None for a probe whose output is not parsed, ``node``
    None where the node's facts are not at hand (no transport is then called a fallback)."""
    if not 0 < degraded_fraction <= 1:
        raise ValueError(f"degraded_fraction must be in (0, 1], got {degraded_fraction}")
    if expected_bytes_per_second is not None and not (
        math.isfinite(expected_bytes_per_second) and expected_bytes_per_second > 0
    ):
        raise ValueError(f"expected bandwidth must be a positive number, got {expected_bytes_per_second}")

    # Reasons give rates in the unit the operator knows from the tool (its declaration says which);
    # a probe whose output is not parsed has no declaration and is read in bytes.
    declared = probe_parsers.REGISTRY.get(kind)
    unit: Literal["GB/s", "Gbit/s"] = declared.unit if declared is not None else "GB/s"

    def rate(bytes_per_second: float) -> str:
        return format_rate(bytes_per_second, unit)

    bandwidth = parse.bandwidth_bytes_per_second if parse is not None else None
    wrong = parse.wrong_values if parse is not None else None
    transport = None
    if parse is not None and declared is not None and declared.transport is not None:
        transport = declared.transport(parse)

    def outcome(result: ProbeResult, reason: str) -> ProbeOutcome:
        return ProbeOutcome(result, reason, bandwidth, expected_bytes_per_second, wrong, transport)

    if run.timed_out:
        how = " (it ignored SIGTERM)" if run.signal == signal.SIGKILL else ""
        return outcome(
            "timeout", f"{_name(kind, run)} timed out and was stopped after {run.duration_seconds:.1f} s{how}"
        )
    if run.error is not None:
        return outcome("failed", run.error)
    name = _name(kind, run)
    if run.exit_code != 0:
        return outcome("failed", _with_detail(_exit_reason(name, declared, run), parse))
    if parse is not None and parse.verdict != "ok":
        return outcome("failed", _with_detail(_verdict_reason(name, parse), parse))
    fell_back = fallback(transport, node) if transport is not None and node is not None else None
    if expected_bytes_per_second is None:
        figure = "" if bandwidth is None else f": {rate(bandwidth)}"
        if fell_back is not None:
            return outcome("degraded", f"{name} finished{figure}, but {fell_back}")
        return outcome("ok", f"{name} finished{figure}, no expected bandwidth to compare with yet")
    if bandwidth is None:
        return outcome(
            "failed",
            f"{name} finished but its output holds no bandwidth figure to compare with the expected "
            f"{rate(expected_bytes_per_second)}",
        )
    ratio = bandwidth / expected_bytes_per_second
    comparison = f"{rate(bandwidth)} is {ratio:.0%} of the expected {rate(expected_bytes_per_second)}"
    if bandwidth < degraded_fraction * expected_bytes_per_second:
        below = f"{comparison}, below the {degraded_fraction:.0%} threshold"
        return outcome("degraded", below if fell_back is None else f"{fell_back}; {below}")
    if fell_back is not None:
        return outcome("degraded", f"{fell_back} ({comparison})")
    return outcome("ok", comparison)


def _name(kind: str, run: RunResult) -> str:
    return run.argv[0].rsplit("/", 1)[-1] if run.argv else kind


def _exit_reason(name: str, kind: ProbeKind | None, run: RunResult) -> str:
    if run.signal is not None:
        return f"{name} was killed by {run.signal_name}"
    assert run.exit_code is not None
    if kind is not None and kind.exit_code_meaning is not None:
        return f"{name} exited {run.exit_code}: {kind.exit_code_meaning(run.exit_code)}"
    return f"{name} exited {run.exit_code}"


def _verdict_reason(name: str, parse: ProbeParse) -> str:
    if parse.verdict == "wrong_results":
        return f"{name} exited 0 but reports wrong results"
    if parse.verdict == "incomplete":
        return f"{name} exited 0 but its output is incomplete"
    return f"{name} exited 0 but its output reports a failure"


def _with_detail(reason: str, parse: ProbeParse | None) -> str:
    """The reason, with what the output says went wrong (wrong values, the first error line)."""
    problem = parse.problem if parse is not None else None
    return f"{reason} ({problem})" if problem else reason
