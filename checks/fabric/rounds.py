"""Pairwise probe groups: each group's rounds on this node, what they keep, what they export.

A group's agents measure each other in rotating pairs with no coordinator (docs/fabric.md). On
each node, one thread per group wakes at each slot of each round on the wall clock, asks the
schedule (checks/fabric/schedule.py) whom it meets and in which role, and plays its end
(checks/fabric/meeting.py) through the probe pipeline (checks/probes/pipeline.py: the node's probe
lock, the idle guard, the expectation and the baseline), like every probe:

* the **regular slot** at the round's start (round = Unix time // period, from the slot's
  scheduled time, never from when the thread woke);
* the **confirming slot** at mid-round (``RoundTiming.confirm_start``), on the group's second port,
  when ``schedule.confirming`` says this node replays a short meeting of an earlier round.

What a node keeps per group (``probing.state_dir``/pairwise-NAME.json, written atomically): runs
by result, the last runs, the current round's result, and the two short histories of its own
regular meetings and confirming slots that ``schedule.confirming`` decides from. So a restarted
agent, `clusterhealth scrape` and a reload see the same state.

What it exports (SPEC "Fabric", ``probe`` = the group's name): the probe families of SPEC
"Probes", and for the round the wall clock is in now, ``clusterhealth_probe_round{probe}``, and the
current round's result only: ``clusterhealth_probe_bandwidth_bytes_per_second{probe,peer}`` and
``clusterhealth_probe_peer_success{probe,peer}`` (absent when the round was skipped). The round
number and the result come from one read of the state at collection time, so a result is never
exported beside the next round's number, and a node exports one partner at a time whatever the
size of the group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterhealth.checks.fabric import meeting
from clusterhealth.checks.fabric.schedule import (
    CONFIRM_ATTEMPTS,
    Assignment,
    Played,
    Schedule,
    confirming,
    regular,
    round_at,
)
from clusterhealth.checks.fabric.settings import PairwiseGroupConfig
from clusterhealth.checks.probes import ProbeOutcome, skipped
from clusterhealth.checks.probes.families import ProbeFamilies
from clusterhealth.checks.probes.pipeline import Job, Pipeline
from clusterhealth.checks.probes.store import (
    Format,
    Runs,
    StateStore,
    decode_counts,
    decode_record,
    encode_record,
    encode_runs,
)

log = logging.getLogger("clusterhealth.pairwise")

FORMAT_VERSION = 1


def state_path(state_dir: Path, group: str) -> Path:
    return state_dir / f"pairwise-{group}.json"


@dataclass(frozen=True)
class SlotResult:
    """What this node recorded for one slot."""

    round: int
    confirming: bool
    peer: str
    outcome: ProbeOutcome
    started_at: float  # wall clock
    duration_seconds: float
    command: str


@dataclass
class GroupState(Runs[SlotResult]):
    # The latest slot of the latest round played: a confirming meeting's result replaces the
    # regular one; a skipped confirming slot leaves the regular result in place.
    current: SlotResult | None = None
    history: dict[int, Played] = field(default_factory=dict)  # regular meetings, by round
    confirms: dict[int, Played] = field(default_factory=dict)  # confirming slots, by round


def group_store(state_dir: Path, group: str) -> StateStore[GroupState]:
    """A group's state in ``probing.state_dir``."""
    return StateStore(state_path(state_dir, group), GROUP_FORMAT)


class GroupRounds:
    """One pairwise group on this node: the thread that plays its slots, and its series."""

    def __init__(
        self,
        group: PairwiseGroupConfig,
        node: str,
        pipeline: Pipeline,
        clock: Callable[[], float] = time.time,
    ):
        self.group, self.node, self.pipeline, self.clock = group, node, pipeline, clock
        self.places = group.places()
        self.schedule = Schedule(
            group.members, group.name, {node: p.leaf for node, p in self.places.items() if p.leaf}
        )
        self.timing = group.timing()
        self.store = group_store(pipeline.state_dir, group.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def member(self) -> bool:
        return self.node in self.schedule

    @property
    def problem(self) -> str | None:
        """Why the group's state cannot be kept (an unwritable state directory), if it cannot."""
        return self.store.problem

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        g = self.group
        if not self.member:
            log.info(
                "node %s is not a member of pairwise group %s (%d members): it takes no part",
                self.node,
                g.name,
                len(self.schedule),
            )
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"pairwise-{g.name}", daemon=True)
            self._thread.start()
            log.info(
                "pairwise group %s: %d members, %s kind, rounds of %g s, this node is %s; %s",
                g.name,
                len(self.schedule),
                g.kind,
                g.period_seconds,
                self.node,
                self._pairing(),
            )

    def _pairing(self) -> str:
        """How the schedule pairs, for the start's log line."""
        if self.schedule.by_leaf:
            return (
                f"pairs inside and across {len(self.schedule.leaves)} leaves "
                f"(this node on {self.schedule.leaf_of[self.node]})"
            )
        unplaced = sorted(n for n in self.schedule.members if not (p := self.places.get(n)) or not p.leaf)
        if len(unplaced) == len(self.schedule):
            return "pairs as one flat group (no member has a leaf in the inventory)"
        if unplaced:
            shown = ", ".join(unplaced[:5]) + (f" and {len(unplaced) - 5} more" if len(unplaced) > 5 else "")
            return f"pairs as one flat group ({shown} without a leaf in the inventory)"
        return "pairs as one flat group (every member on one leaf)"

    def close(self) -> None:
        """Stop after the meeting in progress, if any: cutting it short would fail the partner's end."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def next_slot(self, after: float) -> tuple[int, bool, float]:
        """(round, confirming, start) of the first slot that starts after ``after``."""
        period = self.group.period_seconds
        r = round_at(after, period)
        for round_, confirming_, start in (
            (r, False, r * period),
            (r, True, r * period + self.timing.confirm_start),
            (r + 1, False, (r + 1) * period),
        ):
            if start > after:
                return round_, confirming_, start
        raise AssertionError("unreachable: the next round starts after any time in this one")

    def _wait_until(self, target: float) -> bool:
        """Sleep until ``target`` on the wall clock; True if the agent is stopping."""
        while (remaining := target - self.clock()) > 0:
            # In steps, so that a clock stepped by NTP is followed within a second.
            if self._stop.wait(min(remaining, 1.0)):
                return True
        return self._stop.is_set()

    def _loop(self) -> None:
        # A slot already under way when the thread starts is left alone: after a reload, the old
        # thread is still playing it.
        round_, confirming_, start = self.next_slot(self.clock())
        while not self._wait_until(start):
            try:
                self.play_slot(round_, confirming_, start)
            except Exception:  # a slot's failure must not end the group's rounds
                log.exception("pairwise group %s: round %d failed unexpectedly", self.group.name, round_)
            round_, confirming_, start = self.next_slot(max(start, self.clock()))

    def play_slot(self, round_: int, confirming_: bool, start: float) -> SlotResult | None:
        """Play this node's end of one slot that starts at ``start`` and record it."""
        if confirming_:
            state = self.store.read()
            plan = confirming(self.schedule, self.node, round_, state.history, state.confirms)
            if plan is None:
                return None
            port, runs = self.group.confirm_port, self.group.confirm_runs
        else:
            plan = regular(self.schedule, self.node, round_)
            if plan.partner is None:
                log.debug("pairwise group %s round %d: %s %s", self.group.name, round_, self.node, plan.why)
                self.store.update(lambda s: _keep(s.history, round_, Played(round_, None, None, None)))
                return None
            port, runs = self.group.port, 1
        late = self.clock() - start
        if late > self.timing.startup:
            outcome = skipped(f"the slot started {late:.1f} s ago, too late to take part")
            result = SlotResult(round_, confirming_, plan.partner or "", outcome, self.clock(), 0.0, "")
        else:
            result = self._meet(plan, port, runs, start)
        self._record(result, plan)
        return result

    def _meet(self, plan: Assignment, port: int, runs: int, start: float) -> SlotResult:
        assert plan.partner is not None and plan.role is not None
        partner, members = plan.partner, self.group.members
        started_at, began = self.clock(), time.monotonic()
        job = Job(
            self.group.name,
            self.group.kind,
            self.group.server_argv if plan.role == "server" else self.group.client_argv,
            lambda: {
                "peer": members[partner],
                "peer_node": partner,
                "address": members[self.node],
                "node": self.node,
                "port": str(port),
            },
            expect=self.group.expect,
            degraded_fraction=self.group.degraded_fraction,
            env=self.group.env or None,
        )
        end = meeting.End(start, self.timing, runs, plan.confirming, partner, members[partner])
        if plan.role == "server":
            played = self.pipeline.play(job, lambda launch: meeting.serve(end, launch, self.clock))
        else:
            played = self.pipeline.play(
                job, lambda launch: meeting.connect(end, launch, self.clock, self._wait_until)
            )
        duration = time.monotonic() - began
        return SlotResult(
            plan.round, plan.confirming, partner, played.outcome, started_at, duration, played.command
        )

    def _record(self, result: SlotResult, plan: Assignment) -> None:
        outcome = result.outcome
        short = None if outcome.result == "skipped" else outcome.result != "ok"
        played = Played(result.round, plan.partner, plan.role, short)

        def change(state: GroupState) -> None:
            state.count(result)
            # A confirming meeting replaces the regular result; one that did not take place
            # leaves it: it is still this round's result.
            if not result.confirming or outcome.result != "skipped":
                state.current = result
            _keep(state.confirms if result.confirming else state.history, result.round, played)

        self.store.update(change)
        what = "confirming meeting" if result.confirming else "meeting"
        role = "serving" if plan.role == "server" else "connecting to"
        level = logging.INFO if outcome.result in ("ok", "skipped") else logging.WARNING
        log.log(
            level,
            "pairwise group %s round %d: %s %s %s: %s: %s (%.1fs)",
            self.group.name,
            result.round,
            what,
            role,
            result.peer,
            outcome.result,
            outcome.reason,
            result.duration_seconds,
        )

    # -- exporting --------------------------------------------------------------------------

    def collect(self, families: ProbeFamilies) -> None:
        """Add this group's series (none when this node is not a member)."""
        if not self.member:
            return
        name = self.group.name
        state = self.store.read()
        families.add_runs(name, state)
        now = round_at(self.clock(), self.group.period_seconds)
        families.round.add_metric([name], float(now))
        families.members.add_metric([name], float(len(self.schedule)))
        place = self.places.get(self.node)
        if place is not None:
            families.placement.add_metric([name, *place.labels().values()], 1.0)
        current = state.current
        if current is not None and current.round == now and current.outcome.result != "skipped":
            families.peer_success.add_metric([name, current.peer], 1.0 if current.outcome.success else 0.0)
            if current.outcome.bandwidth_bytes_per_second is not None:
                families.bandwidth.add_metric(
                    [name, current.peer], current.outcome.bandwidth_bytes_per_second
                )


def _keep(history: dict[int, Played], round_: int, played: Played) -> None:
    """Record a round and forget what ``schedule.confirming`` no longer reads."""
    history[round_] = played
    for old in [r for r in history if r < round_ - CONFIRM_ATTEMPTS - 1]:
        del history[old]


# --- the state file ----------------------------------------------------------------------------


def _encode(state: GroupState) -> dict[str, Any]:
    def history(h: dict[int, Played]) -> dict[str, Any]:
        return {str(r): [p.partner, p.role, p.short] for r, p in sorted(h.items())}

    return {
        "version": FORMAT_VERSION,
        **encode_runs(state),
        "current": encode_record(state.current),
        "history": history(state.history),
        "confirms": history(state.confirms),
    }


def _decode(document: Any) -> GroupState:
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise ValueError(f"not a version {FORMAT_VERSION} pairwise state file")

    def history(data: Any) -> dict[int, Played]:
        out = {}
        for r, (partner, role, short) in data.items():
            if role not in ("server", "client", None) or short not in (True, False, None):
                raise ValueError(f"malformed history entry for round {r}")
            out[int(r)] = Played(int(r), partner, role, short)
        return out

    try:
        return GroupState(
            decode_counts(document["runs"]),
            decode_record(SlotResult, document["last"]),
            decode_record(SlotResult, document["last_any"]),
            decode_record(SlotResult, document["current"]),
            history(document["history"]),
            history(document["confirms"]),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"malformed pairwise state ({type(err).__name__}: {err})") from err


GROUP_FORMAT = Format("pairwise results", GroupState, _encode, _decode)
