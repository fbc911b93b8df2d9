"""The pairwise schedule: perfect matchings every member derives alone, and the confirming rematch."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterhealth.checks.fabric import topology
from clusterhealth.checks.fabric.members import parse_inventory, parse_members
from clusterhealth.checks.fabric.schedule import (
    CONFIRM_ATTEMPTS,
    MembershipError,
    Played,
    RoundTiming,
    Schedule,
    confirming,
    regular,
    round_at,
)
from clusterhealth.checks.fabric.topology import Placement

names = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), min_size=2, max_size=40, unique=True)
seeds = st.text(min_size=0, max_size=12)
rounds = st.integers(min_value=0, max_value=10**9)


@given(names, seeds, rounds)
def test_every_round_is_a_perfect_matching(members: list[str], seed: str, r: int) -> None:
    matching = Schedule(members, seed).matching(r)
    met = [n for p in matching.pairs for n in (p.server, p.client)]
    assert len(met) == len(set(met)), "a member meets twice in one round"
    left = set(members) - set(met)
    if len(members) % 2 == 0:
        assert left == set() and matching.sitting_out is None
    else:
        assert left == {matching.sitting_out}


@given(names, seeds, rounds)
@settings(max_examples=60)
def test_every_pair_meets_once_in_any_cycle_of_rounds(members: list[str], seed: str, start: int) -> None:
    schedule = Schedule(members, seed)
    n = len(members)
    assert schedule.cycle == (n - 1 if n % 2 == 0 else n)
    met = [
        frozenset((p.server, p.client))
        for r in range(start, start + schedule.cycle)
        for p in schedule.matching(r).pairs
    ]
    assert len(met) == len(set(met)) == n * (n - 1) // 2


@given(names, seeds, rounds, st.randoms(use_true_random=False))
def test_every_member_computes_the_same_matching(members: list[str], seed: str, r: int, rnd: object) -> None:
    # Each agent reads the member list in its own order (a file re-written by another tool, a
    # different inventory order) and asks only about itself.
    reference = Schedule(members, seed).matching(r)
    expected = {p.server: p for p in reference.pairs} | {p.client: p for p in reference.pairs}
    for node in members:
        shuffled = list(members)
        rnd.shuffle(shuffled)  # type: ignore[attr-defined]
        assert Schedule(shuffled, seed).partner(node, r) == expected.get(node)


@given(names, seeds, rounds)
def test_roles_are_complementary_and_alternate_between_cycles(members: list[str], seed: str, r: int) -> None:
    schedule = Schedule(members, seed)
    for pair in schedule.matching(r).pairs:
        assert schedule.partner(pair.server, r) == pair == schedule.partner(pair.client, r)
        assert pair.role_of(pair.server) == "server" and pair.role_of(pair.client) == "client"
        again = schedule.partner(pair.server, r + schedule.cycle)
        assert again is not None and again.server == pair.client, "same direction two cycles running"


def test_schedule_is_the_same_in_another_process_with_another_hash_seed() -> None:
    members = [f"gpu-{i:03d}" for i in range(37)]
    here = [Schedule(members, "fabric").matching(r) for r in range(40)]
    code = (
        "from clusterhealth.checks.fabric.schedule import Schedule\n"
        f"s = Schedule({members!r}, 'fabric')\n"
        "for r in range(40):\n"
        "    m = s.matching(r)\n"
        "    print(m.sitting_out, ' '.join(p.server + '>' + p.client for p in m.pairs))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout.splitlines()
    assert out == [f"{m.sitting_out} " + " ".join(f"{p.server}>{p.client}" for p in m.pairs) for m in here]


def test_the_seed_changes_the_pairing_and_neighbours_are_not_paired_first() -> None:
    members = [f"n{i:02d}" for i in range(16)]
    a, b = Schedule(members, "fabric"), Schedule(members, "storage")
    assert [a.matching(r) for r in range(15)] != [b.matching(r) for r in range(15)]
    first = {frozenset((p.server, p.client)) for p in a.matching(0).pairs}
    neighbours = {frozenset(pair) for pair in itertools.pairwise(members)}
    assert len(first & neighbours) < 4


def test_small_groups() -> None:
    assert Schedule(["solo"], "g").matching(7).sitting_out == "solo"
    assert Schedule(["solo"], "g").partner("solo", 7) is None
    assert Schedule([], "g").matching(0).pairs == ()
    two = Schedule(["a", "b"], "g")
    assert all(two.partner("a", r) is not None for r in range(5))


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (["h1", "h2", "h1"], "listed twice: h1"),
        (["h1", ""], "member ''"),
        (["h1", "h 2"], "member 'h 2'"),
    ],
)
def test_bad_members_are_named(members: list[str], message: str) -> None:
    with pytest.raises(MembershipError, match=message):
        Schedule(members, "g")


def test_a_member_that_left_or_is_not_listed_plans_nothing() -> None:
    schedule = Schedule(["h1", "h2", "h3", "h4"], "g")
    assert regular(schedule, "h9", 3).partner is None
    assert regular(schedule, "h9", 3).why == "not a member of the group"


@given(st.integers(min_value=2, max_value=30), rounds)
def test_membership_change_mid_cycle_gives_a_perfect_matching_at_once(n: int, r: int) -> None:
    before = [f"h{i}" for i in range(n)]
    for after in ([*before, "joined"], before[1:]):
        matching = Schedule(after, "g").matching(r)
        met = [x for p in matching.pairs for x in (p.server, p.client)]
        assert len(met) == len(set(met)) and set(met) | {matching.sitting_out} >= set(after)


# --- the confirming meeting -------------------------------------------------------------------


def _played(schedule: Schedule, node: str, r: int, short: bool | None) -> Played:
    pair = schedule.partner(node, r)
    if pair is None:  # sits out (odd group): nothing measured
        return Played(r, None, None, None)
    return Played(r, pair.other(node), pair.role_of(node), short)


def _history(schedule: Schedule, node: str, shorts: dict[int, bool | None]) -> dict[int, Played]:
    return {r: _played(schedule, node, r, s) for r, s in shorts.items()}


@given(
    st.integers(min_value=2, max_value=40), rounds, st.integers(min_value=0, max_value=CONFIRM_ATTEMPTS - 1)
)
def test_both_ends_of_a_short_meeting_plan_the_same_confirming_meeting(
    n: int, r: int, busy_rounds: int
) -> None:
    # Both ends fine in the rounds after, each busy (or partner-less) in the first ``busy_rounds``.
    schedule = Schedule([f"h{i}" for i in range(n)], "g")
    at = r + 1 + busy_rounds
    for pair in schedule.matching(r).pairs:
        a, b = pair.server, pair.client
        if schedule.partner(a, at) is None or schedule.partner(b, at) is None:
            continue  # an end sits out that round (odd group): it has nothing to vouch with
        plans = []
        for x in (a, b):
            shorts: dict[int, bool | None] = {r: True}
            shorts |= {t: None for t in range(r + 1, at)} | {at: False}
            history = _history(schedule, x, shorts)
            history[r] = Played(r, pair.other(x), pair.role_of(x), True)
            assert all(confirming(schedule, x, t, history) is None for t in range(r + 1, at))
            plans.append(confirming(schedule, x, at, history))
        assert [p.partner if p else None for p in plans] == [b, a]
        assert [p.role if p else None for p in plans] == ["server", "client"], "the direction is kept"
        assert all(p is not None and p.confirming and p.round == at for p in plans)


@given(st.integers(min_value=2, max_value=40), rounds)
def test_a_fine_meeting_is_not_confirmed(n: int, r: int) -> None:
    schedule = Schedule([f"h{i}" for i in range(n)], "g")
    for node in schedule.members:
        assert confirming(schedule, node, r + 1, _history(schedule, node, {r: False, r + 1: False})) is None
        assert confirming(schedule, node, r + 1, _history(schedule, node, {r: None, r + 1: None})) is None


def test_no_confirming_meeting_unless_this_rounds_own_meeting_was_fine() -> None:
    # Short again: the node is the likelier culprit, the host rule will name it; its partner finds
    # it absent. Busy: it cannot vouch for itself this round, and tries again the next.
    schedule = Schedule([f"h{i}" for i in range(8)], "g")
    assert confirming(schedule, "h0", 11, _history(schedule, "h0", {10: True, 11: True})) is None
    assert confirming(schedule, "h0", 11, _history(schedule, "h0", {10: True, 11: None})) is None
    assert (
        confirming(schedule, "h0", 12, _history(schedule, "h0", {10: True, 11: None, 12: False})) is not None
    )
    assert (
        confirming(schedule, "h0", 12, _history(schedule, "h0", {10: True, 11: True, 12: False})) is not None
    )
    waiting = _history(schedule, "h0", {10: True, 11: True, 12: False})
    first = confirming(schedule, "h0", 12, waiting)
    assert first is not None and first.partner == waiting[10].partner, "the oldest waiting goes first"
    done = {12: Played(12, waiting[10].partner, waiting[10].role, True)}
    second = confirming(schedule, "h0", 13, waiting | _history(schedule, "h0", {13: False}), done)
    assert second is not None and second.partner == waiting[11].partner


def test_a_confirming_meeting_that_did_not_happen_is_tried_again_then_given_up() -> None:
    schedule = Schedule([f"h{i}" for i in range(8)], "g")
    history = _history(schedule, "h0", {10: True, 11: False, 12: False, 13: False, 14: False})
    partner, role = history[10].partner, history[10].role
    absent = {t: Played(t, partner, role, None) for t in (11, 12)}
    assert confirming(schedule, "h0", 11, history) is not None
    assert confirming(schedule, "h0", 12, history, {11: absent[11]}) is not None
    assert confirming(schedule, "h0", 13, history, absent) is not None
    assert confirming(schedule, "h0", 10 + CONFIRM_ATTEMPTS + 1, history, absent) is None
    measured = {11: Played(11, partner, role, False)}
    assert confirming(schedule, "h0", 12, history, measured) is None, "confirmed (fine) already"


def test_a_confirming_meeting_with_a_member_that_left_is_dropped() -> None:
    before = Schedule(["h0", "h1", "h2", "h3"], "g")
    history = _history(before, "h0", {10: True, 11: False})
    gone = history[10].partner
    after = Schedule([n for n in before.members if n != gone], "g")
    assert confirming(after, "h0", 11, history) is None
    assert confirming(before, "h0", 11, history) is not None


# --- timing ------------------------------------------------------------------------------------


def test_round_timing_tolerates_the_skew_it_is_built_for() -> None:
    timing = RoundTiming(period=60, run_seconds=8, skew=2, confirm_runs=2)
    assert timing.problem() is None
    half = timing.skew / 2
    for server_offset, client_offset in itertools.product((-half, 0, half), repeat=2):
        # Offsets of each clock from true time; their difference is at most the skew.
        for slot_start in (0.0, timing.confirm_start):
            server_listens = slot_start - server_offset
            client_first_try = slot_start + timing.grace - client_offset
            client_last_try = slot_start + timing.connect_until - client_offset
            server_gives_up = slot_start + timing.accept_until - server_offset
            assert client_first_try >= server_listens + timing.startup
            assert client_last_try <= server_gives_up
        # The regular slot is over on every clock before the confirming slot starts on any.
        assert timing.slot_deadline() + half <= timing.confirm_start - half
        assert timing.confirm_start + timing.slot_deadline(confirming=True) + half <= timing.period - half
    assert "period of at least" in (RoundTiming(period=20, run_seconds=12, skew=5).problem() or "")
    assert round_at(119.99, 60) == 1 and round_at(120, 60) == 2


# --- the inventory file ------------------------------------------------------------------------


def test_members_file_reads_names_and_addresses() -> None:
    assert parse_members("h1: 10.0.0.1\nh2: 10.0.0.2\nh3: node-3.example\n") == {
        "h1": "10.0.0.1",
        "h2": "10.0.0.2",
        "h3": "node-3.example",
    }
    assert parse_members("") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("h1: 10.0.0.1\nh2: 10.0.0.2\nh1: 10.0.0.3\n", "line 3: member 'h1' listed twice .first on line 1"),
        ("h1: 10.0.0.1\nh2: 10.0.0.1\n", "members h1 and h2 have the same address 10.0.0.1"),
        ("h1:\n", "member h1: expected an IP address or a host name, got None"),
        ("- h1\n- h2\n", "expected a mapping of node name to address"),
        ("h1: [10.0.0.1\n", "not valid YAML"),
        ("'h 1': 10.0.0.1\n", "member 'h 1'"),
    ],
)
def test_members_file_problems_are_named(text: str, message: str) -> None:
    with pytest.raises(MembershipError, match=message):
        parse_members(text)


# --- by leaf ------------------------------------------------------------------------------------
#
# Members placed on leaves (the members file's `leaf`): rounds alternate inside the leaves and
# across them. The bound, for M leaves (M ≥ 3) and any leaf sizes: in any 2 consecutive rounds a
# leaf of two or more members has meetings inside itself; in any 2j consecutive rounds (j < M,
# counting M + 1 when M is odd) its members meet members of at least j other leaves, j − 1 when M
# is odd (a circle over an odd number of leaves leaves one out each round); every pair meets in
# any `cycle` = 2 × (largest leaf) × (M − 1, M when odd) consecutive rounds.


@st.composite
def placed(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    """Members spread over 2 to 9 leaves of any sizes (one member or more each)."""
    members = draw(names)
    count = draw(st.integers(min_value=2, max_value=min(9, len(members))))
    # Every leaf gets one member, then the rest go anywhere: leaves of 1 to 40 members.
    spread = draw(st.lists(st.integers(0, count - 1), min_size=len(members), max_size=len(members)))
    leaves = {m: f"leaf-{i if i < count else spread[i]}" for i, m in enumerate(members)}
    return members, leaves


@given(placed(), seeds, rounds)
def test_by_leaf_every_round_is_a_perfect_matching(
    group: tuple[list[str], dict[str, str]], seed: str, r: int
) -> None:
    members, leaves = group
    schedule = Schedule(members, seed, leaves)
    assert schedule.by_leaf
    matching = schedule.matching(r)
    met = [n for p in matching.pairs for n in (p.server, p.client)]
    assert len(met) == len(set(met)), "a member meets twice in one round"
    left = set(members) - set(met)
    assert left == (set() if len(members) % 2 == 0 else {matching.sitting_out})
    for pair in matching.pairs:
        assert schedule.partner(pair.server, r) == pair == schedule.partner(pair.client, r)
        if Schedule.inside_leaves(r) and len(schedule.leaves[leaves[pair.server]]) % 2 == 0:
            assert leaves[pair.server] == leaves[pair.client], "leaves of even size pair inside"


@given(placed(), seeds, rounds)
@settings(max_examples=40, deadline=None)
def test_by_leaf_every_pair_meets_within_a_cycle(
    group: tuple[list[str], dict[str, str]], seed: str, start: int
) -> None:
    members, leaves = group
    schedule = Schedule(members, seed, leaves)
    count = len(set(leaves.values()))
    largest = max(list(leaves.values()).count(leaf) for leaf in set(leaves.values()))
    assert schedule.cycle == 2 * largest * (count - 1 if count % 2 == 0 else count)
    met = {
        frozenset((p.server, p.client))
        for r in range(start, start + schedule.cycle)
        for p in schedule.matching(r).pairs
    }
    assert len(met) == len(members) * (len(members) - 1) // 2


@given(placed(), seeds, rounds, st.integers(min_value=1, max_value=4))
@settings(deadline=None)
def test_by_leaf_each_leaf_meets_itself_and_other_leaves_within_the_bound(
    group: tuple[list[str], dict[str, str]], seed: str, start: int, j: int
) -> None:
    members, leaves = group
    schedule = Schedule(members, seed, leaves)
    count = len(set(leaves.values()))
    j = min(j, count - 1 if count % 2 == 0 else count)
    window = range(start, start + 2 * j)
    inside: dict[str, int] = {}
    across: dict[str, set[str]] = {leaf: set() for leaf in set(leaves.values())}
    for r in window:
        for p in schedule.matching(r).pairs:
            a, b = leaves[p.server], leaves[p.client]
            if a == b:
                inside[a] = inside.get(a, 0) + 1
            else:
                across[a].add(b)
                across[b].add(a)
    for leaf, nodes in schedule.leaves.items():
        if len(nodes) >= 2:
            assert inside.get(leaf, 0) >= j, f"{leaf}: a meeting inside in each of {j} rounds of {2 * j}"
        assert len(across[leaf]) >= (j if count % 2 == 0 else j - 1), (leaf, across[leaf])


@given(placed(), seeds, rounds, st.randoms(use_true_random=False))
def test_by_leaf_every_member_computes_the_same_matching(
    group: tuple[list[str], dict[str, str]], seed: str, r: int, rnd: object
) -> None:
    members, leaves = group
    reference = Schedule(members, seed, leaves).matching(r)
    expected = {p.server: p for p in reference.pairs} | {p.client: p for p in reference.pairs}
    for node in members[:6]:
        shuffled = list(members)
        rnd.shuffle(shuffled)  # type: ignore[attr-defined]
        reordered = dict(sorted(leaves.items(), key=lambda kv: shuffled.index(kv[0])))
        assert Schedule(shuffled, seed, reordered).partner(node, r) == expected.get(node)


@given(st.integers(min_value=1, max_value=4), st.integers(min_value=1, max_value=4), seeds, rounds)
@settings(deadline=None)
def test_by_leaf_a_pair_is_measured_in_the_other_direction_at_its_next_meeting(
    half: int, pairs: int, seed: str, r: int
) -> None:
    # Leaves of one even size, an even number of them: nobody is left over, so every pair meets on
    # its own turn (inside a leaf, or across when its two leaves are paired).
    size = 2 * pairs
    leaves = {f"n{i}": f"leaf{i // size}" for i in range(2 * half * size)}
    schedule = Schedule(leaves, seed, leaves)
    for pair in schedule.matching(r).pairs:
        later = next(
            p
            for t in range(r + 1, r + schedule.cycle + 1)
            if (p := schedule.partner(pair.server, t)) is not None and p.other(pair.server) == pair.client
        )
        assert later.server == pair.client, "same direction at two meetings running"


def test_by_leaf_only_when_every_member_has_a_leaf_and_there_are_two() -> None:
    members = [f"h{i}" for i in range(8)]
    flat = Schedule(members, "g")
    assert not flat.by_leaf
    for leaves in ({m: "leaf1" for m in members}, {m: "leaf1" for m in members[:6]}, {}):
        schedule = Schedule(members, "g", leaves)
        assert not schedule.by_leaf
        assert [schedule.matching(r) for r in range(9)] == [flat.matching(r) for r in range(9)]
    assert Schedule(members, "g", {m: f"leaf{i % 2}" for i, m in enumerate(members)}).by_leaf


def test_by_leaf_a_leaf_of_32_meets_itself_every_other_round_where_the_flat_circle_rarely_does() -> None:
    # The case of the issue: 4,096 nodes on 128 leaves of 32.
    members = [f"h{i}" for i in range(4096)]
    leaves = {m: f"leaf{i // 32}" for i, m in enumerate(members)}
    by_leaf, flat = Schedule(members, "fabric", leaves), Schedule(members, "fabric")

    def inside(schedule: Schedule, r: int) -> int:
        return sum(leaves[p.server] == leaves[p.client] == "leaf7" for p in schedule.matching(r).pairs)

    assert [inside(by_leaf, r) for r in range(10, 14)] == [16, 0, 16, 0]
    assert sum(inside(flat, r) for r in range(10, 30)) <= 6, "about one in ten rounds"
    across = {
        leaves[p.other(n)]
        for r in (11, 13, 15)
        for n in by_leaf.leaves["leaf7"]
        if (p := by_leaf.partner(n, r))
    }
    assert len(across - {"leaf7"}) == 3, "a different leaf in each round across"


def test_by_leaf_a_short_meeting_across_is_confirmed_once_the_end_was_fine_across() -> None:
    # Short across in round r: fine inside the leaf in r + 1 says nothing about the end's uplink,
    # which a second shortfall would then show; fine across in r + 2 does, and the pair replays.
    leaves = {f"h{i}": f"leaf{i // 4}" for i in range(16)}
    schedule = Schedule(leaves, "g", leaves)
    r = 41  # across
    pair = schedule.partner("h0", r)
    assert pair is not None and schedule.across("h0", pair.other("h0"))
    history = _history(schedule, "h0", {r: True, r + 1: False, r + 2: False})
    assert not schedule.across("h0", history[r + 1].partner or "") and schedule.across(
        "h0", history[r + 2].partner or ""
    )
    assert confirming(schedule, "h0", r + 1, history) is None
    plan = confirming(schedule, "h0", r + 2, history)
    assert plan is not None and plan.partner == pair.other("h0") and plan.why == f"confirms round {r}"
    # Short inside the leaf: confirmed as soon as the end was fine, here across, in r + 1.
    inside = _history(schedule, "h0", {r - 1: True, r: False})
    assert not schedule.across("h0", inside[r - 1].partner or "")
    assert confirming(schedule, "h0", r, inside) is not None
    # A flat group confirms in the next round whatever the leaves.
    flat = Schedule(leaves, "g")
    assert confirming(flat, "h0", r + 1, _history(flat, "h0", {r: True, r + 1: False})) is not None


# --- places ---------------------------------------------------------------------------------------


def test_the_members_file_gives_each_node_its_place_or_its_address_alone() -> None:
    inventory = parse_inventory(
        "gpu-1: {address: 10.1.0.1, leaf: su1-leaf3, pod: su1, rail: 0}\n"
        "gpu-2:\n  address: 10.1.0.2\n  leaf: su1-leaf4\n  spine: plane-a\n"
        "gpu-3: 10.1.0.3\n"
    )
    assert inventory.addresses == {"gpu-1": "10.1.0.1", "gpu-2": "10.1.0.2", "gpu-3": "10.1.0.3"}
    assert inventory.placement == {
        "gpu-1": Placement(leaf="su1-leaf3", pod="su1", rail="0"),
        "gpu-2": Placement(leaf="su1-leaf4", spine="plane-a"),
    }
    assert parse_members("gpu-1: {address: 10.1.0.1, leaf: l1}\n") == {"gpu-1": "10.1.0.1"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "a: 10.0.0.1\nb: {address: 10.0.0.2, lef: l1}\n",
            "line 2: member b: expected the keys address, leaf",
        ),
        ("a: {address: 10.0.0.1, leaf: [l1]}\n", "line 1: member a: leaf: expected a name"),
        ("a: {address: 10.0.0.1, rail: true}\n", "line 1: member a: rail: expected a name"),
        ("a: {leaf: l1}\n", "line 1: member a: expected an IP address or a host name, got None"),
        ("a: {address: 10.0.0.1, leaf: l1, leaf: l2}\n", "listed twice"),
    ],
)
def test_a_bad_place_is_named_with_its_line(text: str, message: str) -> None:
    with pytest.raises(MembershipError, match=message):
        parse_inventory(text)


def test_nodes_in_fabric_order_by_pod_spine_leaf_nvlink_domain_then_name() -> None:
    places = {
        "h10": Placement(leaf="leaf-2"),
        "h2": Placement(leaf="leaf-10"),
        "h9": Placement(leaf="leaf-2", nvlink_domain="rack-1"),
        "h1": Placement(leaf="leaf-2"),
        "h3": Placement(pod="su0", leaf="leaf-9"),
        "h4": Placement(nvlink_domain="rack-1"),
    }
    nodes = ["h10", "h2", "h9", "h1", "h3", "h4", "h0"]
    assert topology.ordered(nodes, places) == ["h3", "h9", "h1", "h10", "h2", "h4", "h0"]
    assert topology.ordered(nodes) == ["h0", "h1", "h2", "h3", "h4", "h9", "h10"]
    assert topology.leaves(places) == {"leaf-2": ["h1", "h9", "h10"], "leaf-9": ["h3"], "leaf-10": ["h2"]}
    assert topology.leaves(places, ["h1", "h2", "h0"]) == {"leaf-2": ["h1"], "leaf-10": ["h2"]}
    assert topology.leaf_of(places, "h3") == "leaf-9" and topology.leaf_of(places, "h0") is None
    assert topology.leaf_of(None, "h3") is None
    labels = {"probe": "fabric", "leaf": "l1", "spine": "", "pod": "p", "rail": ""}
    assert topology.placement(labels) == Placement(leaf="l1", pod="p")
