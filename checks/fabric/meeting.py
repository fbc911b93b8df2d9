"""One end of one pairwise meeting: serve, or connect and measure, within the slot's timing.

The schedule (schedule.py) says who meets whom and who serves; the probe pipeline
(checks/probes/pipeline.py) takes the lock, asks the idle guard and fills in the command; this
module plays one end of one slot with the probe runner (checks/probes/runner.py) and says what
happened, in the words of ``clusterhealth_probe_runs_total``. Each run that measured or failed is
judged by the pipeline's ``Judge`` (the probe evaluation against this node's expectation), and the
rules that keep a missing partner from ever counting against the fabric live here:

* **server** (``serve``): runs the server command from the slot's start, once per run of the
  meeting, each bounded by the slot's deadline. A server that no client reached (stopped at the
  deadline, or gone idle by itself with nothing measured) records ``skipped``: the partner is
  absent. A client other than the expected partner (the members' lists disagree: the address the
  tool printed is not the partner's) is ``skipped`` too, with its address. A server command that
  cannot start is ``failed`` with the reason.
* **client** (``connect``): waits for the grace delay, asks the idle guard again, then runs the
  client command. A refused connection (the kind's ``refused`` markers: nothing listened) is
  retried until the connect deadline and then recorded ``skipped``; anything else is judged as a
  run: an unreachable address is ``failed`` with the tool's reason, a run that hangs is ``timeout``.

A meeting of several runs (the confirming meeting) keeps its best run, on both ends.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

from clusterhealth.checks.fabric.schedule import RoundTiming
from clusterhealth.checks.probes import ProbeOutcome, RunResult, run, skipped
from clusterhealth.checks.probes.pipeline import Launch, StepResult

# Sleeps until a wall-clock time; True when the agent is stopping and the meeting should end.
WaitUntil = Callable[[float], bool]

RETRY_SECONDS = 0.5  # between two connection attempts that were refused
_RANK = {"ok": 3, "degraded": 2, "timeout": 1, "failed": 1, "skipped": 0}


@dataclass(frozen=True)
class End:
    """How this node plays its end of one slot (the command comes from the pipeline's ``Launch``)."""

    slot_start: float  # wall clock, on this node's clock
    timing: RoundTiming
    runs: int
    confirming: bool
    partner: str  # the partner's node name, for reasons
    partner_address: str  # where the partner's probe server listens (an IP or a name), as members say


@dataclass(frozen=True)
class EndResult(StepResult):
    runs: int = 0  # runs that measured or failed (skipped ones aside)


def serve(end: End, launch: Launch, clock: Callable[[], float]) -> EndResult:
    """The server end: serve each run of the meeting until the slot's deadline."""
    deadline = end.slot_start + end.timing.slot_deadline(end.confirming)
    outcomes: list[ProbeOutcome] = []
    command = " ".join(launch.argv)
    for _ in range(end.runs):
        remaining = deadline - clock()
        if remaining <= 0:
            break
        result = run(launch.argv, timeout=remaining, env=launch.env, max_output_bytes=launch.max_output_bytes)
        command = result.command
        if result.cancelled:
            return EndResult(skipped("the agent stopped during the meeting"), command, len(outcomes))
        if result.error is not None:
            return EndResult(ProbeOutcome("failed", f"the server did not start: {result.error}"), command, 0)
        parse = launch.kind.parse(result.output)
        remote = launch.kind.remote_address(parse) if launch.kind.remote_address is not None else None
        measured = parse.bandwidth_bytes_per_second is not None
        if remote is None and not measured and _waited_in_vain(result):
            if not outcomes:
                why = "its deadline" if result.timed_out else "the server stopped waiting"
                return EndResult(
                    skipped(f"partner {end.partner} absent: no client connected before {why}"), command, 0
                )
            break  # a later run of a confirming meeting that the partner did not come back for
        if remote is not None and not same_host(remote, end.partner_address):
            return EndResult(
                skipped(
                    f"a client other than the expected partner {end.partner} connected, from {remote} "
                    "(do the members' lists disagree?)"
                ),
                command,
                len(outcomes),
            )
        outcomes.append(launch.judge(result, parse))
    if not outcomes:
        return EndResult(skipped(f"partner {end.partner} absent: the slot was over"), command, 0)
    return EndResult(best(outcomes), command, len(outcomes))


def _waited_in_vain(result: RunResult) -> bool:
    # Stopped at the slot's deadline, or exited by itself without a word (iperf3's --idle-timeout).
    return result.timed_out or (result.exit_code == 0 and not result.output.strip())


def connect(end: End, launch: Launch, clock: Callable[[], float], wait_until: WaitUntil) -> EndResult:
    """The client end: after the grace delay, connect to the partner's server and measure.

    ``launch.ready`` is asked once the grace delay is over, right before the first connection (the
    idle guard again: a job may have started meanwhile); an outcome from it ends the meeting.
    """
    timing = end.timing
    if wait_until(end.slot_start + timing.grace):
        return EndResult(skipped("the agent is stopping"), "", 0)
    if (refusal := launch.ready()) is not None:
        return EndResult(refusal, "", 0)
    connect_until = end.slot_start + timing.connect_until
    outcomes: list[ProbeOutcome] = []
    command = " ".join(launch.argv)
    for i in range(end.runs):
        while True:
            result = run(
                launch.argv,
                timeout=timing.run_seconds,
                env=launch.env,
                max_output_bytes=launch.max_output_bytes,
            )
            command = result.command
            if result.cancelled:
                return EndResult(skipped("the agent stopped during the meeting"), command, len(outcomes))
            if result.error is not None:
                outcome = ProbeOutcome("failed", f"the client did not start: {result.error}")
                return EndResult(outcome, command, len(outcomes))
            parse = launch.kind.parse(result.output)
            refused = parse.bandwidth_bytes_per_second is None and any(
                marker in result.output for marker in launch.kind.refused
            )
            if not refused:
                outcomes.append(launch.judge(result, parse))
                break
            now = clock()
            if now + RETRY_SECONDS > connect_until:
                if i == 0:
                    return EndResult(
                        skipped(
                            f"partner {end.partner} absent: connection refused until the connect deadline"
                        ),
                        command,
                        0,
                    )
                return EndResult(best(outcomes), command, len(outcomes))
            if wait_until(now + RETRY_SECONDS):
                return EndResult(skipped("the agent is stopping"), command, len(outcomes))
        # The server starts again for the next run of a confirming meeting: give it its start-up time.
        connect_until = clock() + timing.startup + timing.skew
    return EndResult(best(outcomes), command, len(outcomes))


def best(outcomes: list[ProbeOutcome]) -> ProbeOutcome:
    """The best run of a meeting: a random shortfall must repeat in every run to confirm."""
    return max(outcomes, key=lambda o: (_RANK[o.result], o.bandwidth_bytes_per_second or 0.0))


def same_host(remote: str, address: str) -> bool:
    """Is ``remote`` (an address a tool printed) the member at ``address`` (an IP or a name)?"""
    remote = _plain(remote)
    if remote == _plain(address):
        return True
    try:
        ipaddress.ip_address(address)
        return False  # an IP address that differs
    except ValueError:
        pass
    try:
        resolved = {_plain(str(info[4][0])) for info in socket.getaddrinfo(address, None)}
    except OSError:
        return True  # cannot tell: give the meeting the benefit of the doubt
    return remote in resolved


def _plain(address: str) -> str:
    # A dual-stack server prints an IPv4 client as ::ffff:10.0.0.1.
    with contextlib.suppress(ValueError):
        ip = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ip)
    return address
