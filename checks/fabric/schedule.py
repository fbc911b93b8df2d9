"""Who meets whom: rotating pairings of a probe group, derived by every member alone.

No coordinator. Every agent of a group computes the same perfect matching from the same three
inputs: the group's members (a set of node names), the round number (wall clock // period) and a
seed (the group's name by default, so two groups over the same nodes pair differently).

The matching is the round-robin *circle method* over a seeded shuffle of the members: with N
members (N even), round r pairs position 0 with position 1 + (r mod N−1) and the others
symmetrically around the circle, so every pair meets exactly once in any N−1 consecutive rounds.
With N odd a placeholder joins the circle and the member paired with it sits the round out; every
pair then meets once in any N consecutive rounds. The shuffle is a sort by SHA-256 of
(seed, name): it does not depend on Python's ``random`` or on hash randomisation, so agents on
different Python versions agree, and neighbours in the member list are not paired first.

By leaf (every member placed on a leaf switch, two leaves or more: ``Schedule(members, seed,
leaves)``), rounds alternate inside the leaves and across them, so that every leaf meets itself
every other round and two other leaves within four; see ``Schedule``.

In each pair one side serves and the other connects. Which one is a per-pair bit from the same
hash, flipped every cycle: a pair is measured in both directions over two cycles.

**The confirming meeting.** Both ends of a meeting know its result (they ran it together), so a
meeting that fell short can be repeated without anyone else taking part. A round has two slots:
the regular meeting first, then a confirming slot. The rule, applied by each end to its own
results only:

    a regular meeting of round r that fell short is played again in the confirming slot of round
    r + 1, same partner, same roles, on the group's rematch port, if this end's own regular
    meeting of round r + 1 took place and did not fall short. When the confirming meeting does
    not take place (either end busy, absent or declining), both ends know it and try again in
    the next rounds' confirming slots, within ``CONFIRM_ATTEMPTS`` rounds of the meeting; when
    several short meetings wait, the oldest goes first.

By leaf, a meeting across leaves that fell short waits for a round whose own regular meeting
crossed leaves and was fine: an end fine inside its leaf says nothing of its uplink, which a
second shortfall would then show (the replay would name a path where the uplink failed).

The condition keeps a bad host from being re-tested pair by pair: a node whose meetings fall short
with two partners in a row is more likely the culprit than either path, and the host rule
(analysis.py) names it from its regular meetings. A node that could not measure in round r + 1
(busy, sitting out) declines too, and tries again a round later: simulation showed a bad host that
happened to be busy in r + 1 confirm its first short meeting and be named, for a round, as a path.
A confirming meeting is never itself confirmed,
and a node has one regular meeting per round, so it has at most one confirming meeting per
round. Both ends apply the rule to the same facts (the meeting's result, which both measured) and
reach the same decision; when they do not (one end's own r + 1 fell short, it is busy, or their
expectations put the same figure on either side of the threshold) the end that comes finds its
partner absent and records ``skipped``: a disagreement costs a data point, never a false result.

Because the confirming meeting has a slot of its own, it displaces nobody's regular meeting. (A
first design replayed the pair in place of a later regular round; simulating it showed that a bad
host's partners, each asking for a replay, then starve the same "shadow" node round after round:
in the circle method the partner of H two rounds ago always meets the same node relative to H.)
The confirming slot uses its own port, so a late client of the regular slot can never connect into
it and be measured against the wrong node, and a server checks that the client it accepted is the
partner it expects.

Pure: nothing here reads a clock or the network.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

Role = Literal["server", "client"]
T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


class MembershipError(ValueError):
    """The members of a group cannot be scheduled as given (duplicate, empty or invalid names)."""


def check_node_name(name: object) -> str | None:
    """None when ``name`` can name a node in a group; otherwise what was expected."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return "a node name of letters, digits, _ . : - (e.g. the short hostname)"
    return None


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\0".join(parts).encode()).digest()


@dataclass(frozen=True)
class Pair:
    """One meeting of a round: ``server`` serves, ``client`` connects and measures."""

    server: str
    client: str

    def role_of(self, node: str) -> Role:
        return "server" if node == self.server else "client"

    def other(self, node: str) -> str:
        return self.client if node == self.server else self.server


@dataclass(frozen=True)
class Matching:
    round: int
    pairs: tuple[Pair, ...]
    sitting_out: str | None  # the member without a partner this round (N odd)


def _circle(order: Sequence[T | None], k: int) -> Iterator[tuple[T | None, T | None]]:
    """Round ``k`` of the circle method over ``order`` (of even length): position 0 stays, the
    others turn one step a round; slot s meets slot m−1−s. Every pair meets once in any m−1
    consecutive rounds."""
    m = len(order)
    if m < 2:
        return
    k %= m - 1
    circle = [order[0]] + [order[(s - 1 + k) % (m - 1) + 1] for s in range(1, m)]
    for s in range(m // 2):
        yield circle[s], circle[m - 1 - s]


def _padded(items: Sequence[T]) -> list[T | None]:
    """``items`` with a placeholder (None) when odd: the circle's sit-out."""
    return [*items, None] if len(items) % 2 else list(items)


class Schedule:
    """The rotating pairings of one group's members.

    Flat (no leaves given, or a member without one, or a single leaf): the circle method over
    all members, as described above. By leaf (``leaves`` gives every member's leaf switch, and
    there are at least two): rounds alternate between

    * **inside the leaves** (even rounds): each leaf's own circle over its members, so every leaf
      of two or more members has meetings inside itself every other round;
    * **across the leaves** (odd rounds): a circle over the leaves pairs each leaf with another
      one, and the smaller leaf's k-th member meets the other's (k + c) mod b-th, c the number of
      times the two leaves have been paired before and b the larger leaf's size; in consecutive
      such rounds a leaf meets different leaves;

    and whoever is left without a partner (the sit-out of a leaf of odd size, the unmatched
    members of the larger of two leaves, every member of the leaf the leaf circle leaves out when
    the number of leaves is odd) is paired with the others left over, in a seeded order. Every
    pair meets at least once in any ``cycle`` = 2 × b_max × (M − 1) consecutive rounds (M the
    number of leaves, made even), a pair inside a leaf of L members once every 2(L − 1) rounds.
    """

    def __init__(self, members: Iterable[str], seed: str, leaves: Mapping[str, str] | None = None):
        listed = list(members)
        for name in listed:
            if (problem := check_node_name(name)) is not None:
                raise MembershipError(f"member {name!r}: expected {problem}")
        twice = sorted(name for name, count in Counter(listed).items() if count > 1)
        if twice:
            raise MembershipError(f"member{'s' if len(twice) > 1 else ''} listed twice: {', '.join(twice)}")
        self.seed = seed
        self.members: tuple[str, ...] = tuple(sorted(listed))
        # The shuffled circle; None is the placeholder that gives N odd a sit-out.
        shuffled = sorted(self.members, key=lambda n: _digest(seed, "order", n))
        self._order = tuple(_padded(shuffled))
        self._index = {n: i for i, n in enumerate(self._order) if n is not None}
        self._bit = {n: _digest(seed, "role", n)[0] & 1 for n in self.members}
        # Rounds after which every pair has met once (0 for a group of one: nobody ever meets).
        self.cycle = max(len(self._order) - 1, 0)
        self.leaf_of: dict[str, str] = {}
        self.leaves: dict[str, tuple[str, ...]] = {}  # by leaf: its members in circle order
        placed = {n: leaves.get(n) for n in self.members} if leaves else {}
        if placed and all(placed.values()) and len(set(placed.values())) >= 2:
            self.leaf_of = {n: leaf for n, leaf in placed.items() if leaf}
            by_leaf: dict[str, list[str]] = {}
            for node in shuffled:
                by_leaf.setdefault(self.leaf_of[node], []).append(node)
            self.leaves = {leaf: tuple(nodes) for leaf, nodes in by_leaf.items()}
            leaf_order = sorted(self.leaves, key=lambda leaf: _digest(seed, "leaf", leaf))
            self._leaf_order = tuple(_padded(leaf_order))
            self._largest = max(len(nodes) for nodes in self.leaves.values())
            self.cycle = 2 * self._largest * (len(self._leaf_order) - 1)
            self._cache: dict[int, dict[str, Pair]] = {}

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, node: object) -> bool:
        return node in self._index

    @property
    def by_leaf(self) -> bool:
        """Pairs inside and across leaves (every member placed on one of two or more leaves)."""
        return bool(self.leaves)

    def across(self, a: str, b: str) -> bool:
        """Whether a meeting of ``a`` and ``b`` crosses leaves (False in a flat group)."""
        return bool(self.leaves) and self.leaf_of.get(a) != self.leaf_of.get(b)

    @staticmethod
    def inside_leaves(round: int) -> bool:
        """Whether ``round`` pairs inside the leaves (by leaf) rather than across them."""
        return round % 2 == 0

    def partner(self, node: str, round: int) -> Pair | None:
        """``node``'s regular meeting in ``round``; None when it sits out or is not a member."""
        i = self._index.get(node)
        if i is None or self.cycle == 0:
            return None
        if self.leaves:
            return self._tree(round).get(node)
        m, k = len(self._order), round % self.cycle
        # Slot s of the circle holds order[0] at s = 0 and order[1 + (s - 1 + k) mod (m-1)] else;
        # slot s meets slot m-1-s.
        slot = 0 if i == 0 else (i - 1 - k) % (m - 1) + 1
        opposite = m - 1 - slot
        other = self._order[0] if opposite == 0 else self._order[(opposite - 1 + k) % (m - 1) + 1]
        if other is None:
            return None
        return self._pair(node, other, round // self.cycle)

    def matching(self, round: int) -> Matching:
        """Every meeting of ``round``."""
        pairs: list[Pair] = []
        sitting_out = None
        if self.leaves:
            found = self._tree(round)
            pairs = sorted(set(found.values()), key=lambda p: (p.server, p.client))
            left = [n for n in self.members if n not in found]
            return Matching(round, tuple(pairs), left[0] if left else None)
        if self.cycle:
            for a, b in _circle(self._order, round):
                if a is None or b is None:
                    sitting_out = b if a is None else a
                else:
                    pairs.append(self._pair(a, b, round // self.cycle))
        elif self.members:
            sitting_out = self.members[0]
        return Matching(round, tuple(pairs), sitting_out)

    def _pair(self, a: str, b: str, times: int) -> Pair:
        # A per-pair bit (xor of the two members' bits) decides who serves; it flips each time the
        # pair meets again (``times``: which of the pair's meetings this is), so each pair is
        # measured in both directions over two of its meetings.
        flip = self._bit[a] ^ self._bit[b] ^ (times & 1)
        first, second = (a, b) if self._index[a] < self._index[b] else (b, a)
        return Pair(first, second) if flip == 0 else Pair(second, first)

    def _tree(self, round: int) -> dict[str, Pair]:
        """Every meeting of ``round`` by leaf, by member (computed once per round)."""
        found = self._cache.get(round)
        if found is not None:
            return found
        pairs: list[Pair] = []
        left: list[str] = []  # members without a partner so far
        k = round // 2
        if self.inside_leaves(round):
            for nodes in self.leaves.values():
                order = _padded(nodes)
                for a, b in _circle(order, k):
                    if a is None or b is None:
                        left.extend(n for n in (a, b) if n is not None)
                    else:
                        pairs.append(self._pair(a, b, k // (len(order) - 1)))
        else:
            turn = len(self._leaf_order) - 1
            times = k // turn  # how many times each two leaves have been paired before
            for x, y in _circle(self._leaf_order, k):
                if x is None or y is None:
                    left.extend(self.leaves[x if x is not None else y])  # type: ignore[index]
                    continue
                small, large = sorted((self.leaves[x], self.leaves[y]), key=len)
                size = len(large)
                matched = set()
                for i, node in enumerate(small):
                    other = large[(i + times) % size]
                    matched.add(other)
                    # Two members meet once every `size` pairings of their leaves.
                    pairs.append(self._pair(node, other, times // size))
                left.extend(n for n in large if n not in matched)
        # The ones left over meet each other, in an order seeded by the round.
        left.sort(key=lambda n: _digest(self.seed, "left", str(round), n))
        pairs.extend(self._pair(a, b, round) for a, b in zip(left[::2], left[1::2], strict=False))
        found = {n: p for p in pairs for n in (p.server, p.client)}
        if len(self._cache) >= 8:
            self._cache.pop(min(self._cache))
        self._cache[round] = found
        return found


# --- rounds in time ----------------------------------------------------------------------------


def round_at(wall_clock: float, period: float) -> int:
    """The round that a wall-clock time (Unix seconds) falls in."""
    return math.floor(wall_clock / period)


def round_start(round: int, period: float) -> float:
    return round * period


@dataclass(frozen=True)
class RoundTiming:
    """When each side acts within a round, as offsets from the round's start on its own clock.

    A round has two slots of equal length, the regular meeting's and the confirming meeting's.
    Within a slot, with clocks that differ by up to ``skew`` seconds between any two members:

    * the server starts listening at the slot's start;
    * the client first connects ``grace`` = skew + startup seconds in, by which time a server on a
      clock ``skew`` behind has started; it retries a refused connection (a server still starting)
      until ``connect_until`` = grace + skew + startup, then records its partner absent;
    * the server stops waiting for a client at ``accept_until`` = connect_until + skew, which covers
      a client on a clock ``skew`` behind it, and is stopped at ``slot_deadline``, after the runs;
    * the confirming slot starts at mid-round, and at least ``skew`` after the regular slot's
      deadline, so the two never overlap on any two clocks; the round is over on every clock
      before the next one starts.

    A confirming meeting may hold several runs (``confirm_runs``); the client starts each one as
    soon as the previous ended, the server serves them one after the other.
    """

    period: float
    run_seconds: float  # the longest one run may take (the probe's own duration and set-up)
    skew: float = 5.0
    startup: float = 2.0  # time for the idle guard, the lock and the server process to start
    confirm_runs: int = 1

    @property
    def grace(self) -> float:
        return self.skew + self.startup

    @property
    def connect_until(self) -> float:
        return self.grace + self.skew + self.startup

    @property
    def accept_until(self) -> float:
        return self.connect_until + self.skew

    def slot_deadline(self, confirming: bool = False) -> float:
        """When the slot's server is stopped, from the slot's start."""
        runs = self.confirm_runs if confirming else 1
        return self.accept_until + runs * (self.run_seconds + self.startup)

    @property
    def confirm_start(self) -> float:
        """The confirming slot's start, from the round's start: mid-round when the period allows.

        Mid-round because a node exports one partner's result at a time: the regular result is
        replaced by the confirming one, and each must stay long enough for Prometheus to scrape it.
        """
        earliest = self.slot_deadline() + self.skew
        latest = self.period - self.slot_deadline(confirming=True) - self.skew
        return max(earliest, min(self.period / 2, latest))

    @property
    def round_length(self) -> float:
        """The shortest period that holds both slots, each clear of the other under the skew."""
        return self.slot_deadline() + self.skew + self.slot_deadline(confirming=True) + self.skew

    def problem(self) -> str | None:
        """None when the round fits its period; otherwise what is needed."""
        if self.period <= 0 or self.run_seconds <= 0 or self.skew < 0 or self.confirm_runs < 1:
            return "a positive period and run time, a skew of at least 0 and at least one run"
        if self.round_length > self.period:
            return (
                f"a period of at least {self.round_length:g} s for runs of {self.run_seconds:g} s with "
                f"{self.skew:g} s of clock skew and {self.confirm_runs} confirming run"
                f"{'s' if self.confirm_runs > 1 else ''}"
            )
        return None


# --- the confirming meeting -------------------------------------------------------------------


@dataclass(frozen=True)
class Played:
    """What one node recorded for its regular meeting of one round: what its decisions read."""

    round: int
    partner: str | None  # None: sat out (odd group) or not a member
    role: Role | None
    short: bool | None  # fell short (degraded, failed, timed out); None: skipped, nothing measured


@dataclass(frozen=True)
class Assignment:
    """One meeting a node plans in one slot of one round."""

    round: int
    partner: str | None  # None: nothing to do in this slot
    role: Role | None
    confirming: bool  # the confirming slot: replays the pair's short meeting of the round before
    why: str  # one phrase for a log line: "regular", "confirms round 41", "sits out (odd group)"


def regular(schedule: Schedule, node: str, round: int) -> Assignment:
    """``node``'s regular meeting in ``round``."""
    if node not in schedule:
        return Assignment(round, None, None, False, "not a member of the group")
    pair = schedule.partner(node, round)
    if pair is None:
        return Assignment(round, None, None, False, "sits out (odd number of members)")
    return Assignment(round, pair.other(node), pair.role_of(node), False, "regular")


CONFIRM_ATTEMPTS = 3  # confirming slots a short meeting is tried in before it is left unconfirmed


def confirming(
    schedule: Schedule,
    node: str,
    round: int,
    history: Mapping[int, Played],
    confirms: Mapping[int, Played] | None = None,
) -> Assignment | None:
    """``node``'s confirming meeting in ``round``, decided after its regular meeting of ``round``.

    ``history`` holds the node's own regular meetings and ``confirms`` its confirming slots (what
    it planned there and whether it measured), for the last ``CONFIRM_ATTEMPTS`` + 1 rounds. The
    partner's history is not needed: it holds the same facts about their common meetings.
    """
    if node not in schedule:
        return None
    now = history.get(round)
    if now is None or now.partner is None or now.short is not False:
        return None  # this round's own meeting fell short, was skipped, or there was none
    confirms = confirms or {}
    # The oldest short meeting still waiting first: both ends of it hold it, and a later short
    # meeting of one end (with a bad host, say) must not push it out.
    for r0 in range(round - CONFIRM_ATTEMPTS, round):
        before = history.get(r0)
        if before is None or not before.short:
            continue  # fine, skipped or sat out
        if before.partner is None or before.role is None or before.partner not in schedule:
            continue
        if (
            schedule.by_leaf
            and schedule.across(node, before.partner)
            and not schedule.across(node, now.partner)
        ):
            # Short across the leaves: replayed once this end has been fine across them, so that
            # its own uplink is not what a second shortfall would show.
            continue
        # Not confirmed yet: no confirming slot since measured this pair.
        if any(
            (tried := confirms.get(t)) is not None
            and tried.partner == before.partner
            and tried.short is not None
            for t in range(r0 + 1, round)
        ):
            continue
        return Assignment(round, before.partner, before.role, True, f"confirms round {r0}")
    return None
