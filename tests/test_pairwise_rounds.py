"""The agent's own pairwise rounds, in process: GroupRounds playing real iperf3 over loopback.

Two nodes' GroupRounds (checks/fabric/rounds.py) play each slot side by side on threads, with the real
probe runner, lock, idle guard and iperf3, as the agent's group thread would; only their clock is
the test's (a constructor argument), so that a slot of any round starts when the test says and
three slots take seconds, not rounds. What each end records and what it exports are read the way
Prometheus and `clusterhealth analyze` see them (the collected families), never from a second
implementation (checks/fabric/simulation.py plays the same rules at scale).

The client's rate is read for each run from a queue of rates (a file per node): a link that is
slow for one run and not the next, as noise or a real fault makes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.agent import config as configuration
from clusterhealth.checks.fabric.rounds import GroupRounds, SlotResult
from clusterhealth.checks.fabric.schedule import Schedule, round_at
from clusterhealth.checks.probes.families import ProbeFamilies
from clusterhealth.checks.probes.pipeline import Pipeline

from .test_pairwise_agent import group, iperf3, node_config

PERIOD = 3600.0  # long rounds: every slot is started by the test, on its clock
ROUND = 480_000  # a round number like any other (the clock is moved to it)
MBIT = 1e6 / 8  # bytes/s

# `client QUEUE IPERF3 ARGS...`: iperf3 at the rate on the queue file's first line, which only a run
# that reached the server uses up (unless it is the last one): a client that comes before the
# server has started again (a loaded machine) is refused, and retries at the same rate.
CLIENT = """#!/bin/sh
queue=$1
shift
out=$("$@" -b "$(head -n 1 "$queue")")
code=$?
printf '%s\\n' "$out"
case $out in
*"Connection refused"*) ;;
*) if [ "$(wc -l < "$queue")" -gt 1 ]; then sed -i 1d "$queue"; fi ;;
esac
exit $code
"""


class Clock:
    """A wall clock the test moves: the nodes' rounds read it, time still passes on it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def set(self, at: float) -> None:
        self.offset = at - time.time()


class Pair:
    """Two members of one group, a and b, playing slots together."""

    def __init__(self, tmp: Path, name: str, addresses: tuple[str, str], **settings: Any):
        self.tmp, self.clock = tmp, Clock()
        script = tmp / "client"
        script.write_text(CLIENT)
        spec = group(
            name,
            {"a": addresses[0], "b": addresses[1]},
            period_seconds=PERIOD,
            confirm_runs=3,
            client_argv=[
                *("sh", str(script), str(tmp / f"{name}-rates-{{node}}")),
                *(iperf3(), "-c", "{peer}", "-B", "{address}", "-p", "{port}", "-t", "1", "-J"),
                *("--connect-timeout", "1000"),
            ],
        )
        self.rounds: dict[str, GroupRounds] = {}
        for node in ("a", "b"):
            extra = settings.get(node, {})
            config = configuration.load(node_config(tmp, f"{name}-{node}", [spec], **extra))
            pipeline = Pipeline.of(config.probing, None)
            self.rounds[node] = GroupRounds(config.pairwise_groups[0], node, pipeline, clock=self.clock)
        self.name = name

    def rates(self, node: str, *mbit: int) -> None:
        (self.tmp / f"{self.name}-rates-{node}").write_text("".join(f"{m}M\n" for m in mbit))

    def client(self, round_: int) -> str:
        pair = self.rounds["a"].schedule.partner("a", round_)
        assert pair is not None
        return pair.client

    def play(self, round_: int, confirming: bool) -> dict[str, SlotResult | None]:
        """Both ends' slot, started now on the test's clock."""
        start = round_ * PERIOD + (self.rounds["a"].timing.confirm_start if confirming else 0.0)
        self.clock.set(start - 0.2)
        results: dict[str, SlotResult | None] = {}

        def play(node: str) -> None:
            results[node] = self.rounds[node].play_slot(round_, confirming, start)

        threads = [threading.Thread(target=play, args=(node,)) for node in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return results

    def exported(self, node: str) -> dict[str, dict[str, float]]:
        """{family: {peer: value}} of the per-peer series the node exports now, and its round."""
        families = ProbeFamilies.new()
        self.rounds[node].collect(families)
        out: dict[str, dict[str, float]] = {}
        for family in (families.bandwidth, families.peer_success, families.round):
            for sample in family.samples:
                out.setdefault(family.name, {})[sample.labels.get("peer", "")] = sample.value
        return out


@pytest.fixture
def pair(tmp_path: Path) -> Callable[..., Pair]:
    return lambda *args, **kwargs: Pair(tmp_path, *args, **kwargs)


def _between(value: float | None, mbit: float) -> bool:
    return value is not None and 0.9 * mbit * MBIT <= value <= 1.05 * mbit * MBIT


def test_a_degraded_meeting_is_confirmed_by_its_best_run_and_that_result_is_exported(
    pair: Callable[..., Pair],
) -> None:
    p = pair("confirm", ("127.0.0.91", "127.0.0.92"))
    first, second = p.client(ROUND), p.client(ROUND + 1)
    assert first != second, "with two members the roles swap every round"
    # Round R: the meeting falls short (50 of the expected 200 Mbit/s). Round R+1: its regular
    # meeting is fine (300, the other way), and its confirming slot replays R, same roles: three
    # runs, of which only the second is fine.
    p.rates(first, 50, 50, 200, 50)
    p.rates(second, 300)

    regular = p.play(ROUND, confirming=False)
    for node in "ab":
        result = regular[node]
        assert result is not None and result.outcome.result == "degraded", result
    assert p.exported("a")["clusterhealth_probe_peer_success"] == {"b": 0.0}

    regular = p.play(ROUND + 1, confirming=False)
    for node in "ab":
        result = regular[node]
        assert result is not None and result.outcome.result == "ok", result
        assert _between(p.exported(node)["clusterhealth_probe_bandwidth_bytes_per_second"][result.peer], 300)

    confirming = p.play(ROUND + 1, confirming=True)
    for node, partner in (("a", "b"), ("b", "a")):
        result = confirming[node]
        # The short meeting of R is played again: same partner, same direction.
        assert result is not None and result.confirming and result.peer == partner, result
        # Its best run counts: a random shortfall must repeat in every run to confirm.
        assert result.outcome.result == "ok", result
        assert _between(result.outcome.bandwidth_bytes_per_second, 200)
        # And it is what the node exports for the rest of the round, under the round's number.
        exported = p.exported(node)
        assert exported["clusterhealth_probe_round"] == {"": float(ROUND + 1)}
        assert exported["clusterhealth_probe_peer_success"] == {partner: 1.0}
        assert _between(exported["clusterhealth_probe_bandwidth_bytes_per_second"][partner], 200)
        assert round_at(p.clock(), PERIOD) == ROUND + 1


def test_a_fine_meeting_is_not_played_again(pair: Callable[..., Pair]) -> None:
    p = pair("fine", ("127.0.0.93", "127.0.0.94"))
    p.rates("a", 200)
    p.rates("b", 200)
    for round_ in (ROUND, ROUND + 1):
        assert all(r is not None and r.outcome.result == "ok" for r in p.play(round_, False).values())
    assert p.play(ROUND + 1, confirming=True) == {"a": None, "b": None}


def test_the_client_asks_the_idle_guard_again_before_it_connects(
    pair: Callable[..., Pair], tmp_path: Path
) -> None:
    # The client's node is idle when the slot starts and busy by the time it would connect (a job
    # started meanwhile): it must not measure. Its busy command says idle once, then busy.
    calls = tmp_path / "busy-calls"
    busy = ["sh", "-c", f'echo x >> {calls}; [ "$(wc -l < {calls})" -gt 1 ]']
    pairing = Schedule(["a", "b"], "idle").partner("a", ROUND)
    assert pairing is not None
    client = pairing.client
    server = "b" if client == "a" else "a"
    p = pair("idle", ("127.0.0.95", "127.0.0.96"), **{client: {"probing": {"busy_command": busy}}})
    assert p.client(ROUND) == client
    p.rates(client, 200)
    played = p.play(ROUND, confirming=False)
    measured, absent = played[client], played[server]
    assert measured is not None and measured.outcome.result == "skipped", measured
    assert "busy command exited 0" in measured.outcome.reason
    assert calls.read_text().count("x") == 2, "the guard at the slot's start, and again before connecting"
    assert absent is not None and absent.outcome.result == "skipped"
    assert "partner" in absent.outcome.reason and "absent" in absent.outcome.reason
    assert "clusterhealth_probe_peer_success" not in p.exported(client)
