"""The analyzer: a bad host from a bad path, never a partner of either, never one short run."""

from __future__ import annotations

import random

import pytest

from clusterhealth.checks.cost import Job, Workload
from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.checks.fabric.analysis import (
    Analysis,
    Meeting,
    Report,
    Rules,
    analyze,
    merge,
    render_table,
)
from clusterhealth.fleet.pairwise import reduce_series

PERIOD = 900.0
GBIT = 1e9 / 8


def _run(
    n: int,
    healthy_rounds: int,
    faulty_rounds: int,
    *,
    bad_hosts: dict[str, float] | None = None,
    bad_paths: dict[frozenset[str], float] | None = None,
    seed: int = 7,
    p_busy: float = 0.01,
    expected: float | None = None,
    scale: float = 1.0,
) -> Analysis:
    meetings = _run_meetings(
        n,
        healthy_rounds,
        faulty_rounds,
        bad_hosts=bad_hosts,
        bad_paths=bad_paths,
        seed=seed,
        p_busy=p_busy,
        scale=scale,
    )
    window = (healthy_rounds + faulty_rounds) * PERIOD
    return analyze("fabric", meetings, window_seconds=window, expected=expected)


def _run_meetings(
    n: int,
    healthy_rounds: int,
    faulty_rounds: int,
    *,
    bad_hosts: dict[str, float] | None = None,
    bad_paths: dict[frozenset[str], float] | None = None,
    seed: int = 7,
    p_busy: float = 0.01,
    scale: float = 1.0,
) -> list[Meeting]:
    fleet = sim.Fleet(sim.node_names(n), p_busy=p_busy, nominal=10 * GBIT * scale)
    group = sim.Group(fleet, random.Random(seed))
    rounds = [group.play(r) for r in range(100, 100 + healthy_rounds)]
    fleet.bad_hosts.update(bad_hosts or {})
    fleet.bad_paths.update(bad_paths or {})
    start = 100 + healthy_rounds
    rounds += [group.play(r) for r in range(start, start + faulty_rounds)]
    return merge(sim.reports(rounds, PERIOD))


def _names(items: list) -> set[tuple[str, str]]:  # type: ignore[type-arg]
    return {(s.kind, s.name) for s in items}


@pytest.mark.parametrize("n", [8, 9, 64])
def test_healthy_group_has_no_suspect(n: int) -> None:
    result = _run(n, 96, 0)
    assert result.suspects == []
    assert result.not_enough_evidence is None


@pytest.mark.parametrize("n", [8, 9, 64])
def test_bad_host_is_named_within_three_rounds_and_its_partners_never(n: int) -> None:
    # Three rounds in which h3 meets someone (in an odd group it sits out one round in n).
    schedule = sim.Group(sim.Fleet(sim.node_names(n)), random.Random(0)).schedule
    played = [r for r in range(120, 130) if schedule.partner("h3", r) is not None]
    rounds = played[2] - 120 + 1
    assert rounds <= 4
    result = _run(n, 20, rounds, bad_hosts={"h3": 0.5}, p_busy=0)
    assert _names(result.suspects) == {("host", "h3")}
    evidence = result.suspects[0].evidence
    assert len(evidence["partners"]) == 3 and evidence["ongoing"]
    assert 0.45 < evidence["median_ratio"] < 0.55
    # Two rounds are not enough: one short run never names anyone, two name no host.
    assert _run(n, 20, rounds - 1, bad_hosts={"h3": 0.5}, p_busy=0).suspects == []


def test_bad_host_over_a_long_window_still_names_only_it() -> None:
    result = _run(64, 48, 48, bad_hosts={"h3": 0.5})
    assert _names(result.suspects) == {("host", "h3")}
    assert all("h3" not in s.hosts or s.kind == "host" for s in result.unconfirmed)


def _first_meeting(n: int, a: str, b: str, after: int) -> int:
    return sim.meeting_round(sim.Group(sim.Fleet(sim.node_names(n)), random.Random(0)).schedule, a, b, after)


@pytest.mark.parametrize("n", [8, 64])
def test_bad_path_is_named_as_a_path_by_its_confirming_meeting(n: int) -> None:
    healthy = 20
    met = _first_meeting(n, "h2", "h5", 100 + healthy)
    rounds_to_confirm = met - (100 + healthy) + 2  # the meeting round and the next one
    bad = {sim.path("h2", "h5"): 0.5}
    result = _run(n, healthy, rounds_to_confirm, bad_paths=bad, p_busy=0)
    assert _names(result.suspects) == {("path", "h2<->h5")}
    evidence = result.suspects[0].evidence
    assert evidence["rounds"] == [met, met + 1]
    # One round earlier only the first meeting fell short: unconfirmed, not a suspect.
    early = _run(n, healthy, rounds_to_confirm - 1, bad_paths=bad, p_busy=0)
    assert early.suspects == []
    assert ("path", "h2<->h5") in _names(early.unconfirmed)


def test_bad_host_and_bad_path_together() -> None:
    n, healthy = 64, 30
    met = _first_meeting(n, "h10", "h20", 100 + healthy + 3)
    result = _run(
        n,
        healthy,
        met - (100 + healthy) + 2,
        bad_hosts={"h3": 0.5},
        bad_paths={sim.path("h10", "h20"): 0.5},
    )
    assert _names(result.suspects) == {("host", "h3"), ("path", "h10<->h20")}


def test_fleet_wide_slowdown_is_one_finding_not_n_suspects() -> None:
    result = _run(64, 48, 0, expected=10 * GBIT, scale=0.5)
    assert result.fleet_slowdown
    assert result.suspects == []
    assert "FLEET-WIDE SLOWDOWN" in render_table(result)
    assert not _run(64, 48, 0, expected=10 * GBIT).fleet_slowdown


def _meeting(r: int, a: str, b: str, gbit: float | None, success: bool | None = None) -> Meeting:
    bw = None if gbit is None else gbit * GBIT
    ok = (gbit is not None and gbit >= 8) if success is None else success
    return merge([Report(r, a, b, bw, ok, r * PERIOD, r * PERIOD + 60)])[0]


def _round_robin(nodes: list[str], first: int, count: int) -> list[Meeting]:
    schedule = sim.Group(sim.Fleet(nodes), random.Random(0)).schedule
    return [
        _meeting(r, p.server, p.client, 10.0)
        for r in range(first, first + count)
        for p in schedule.matching(r).pairs
    ]


def test_a_single_short_run_never_names_anyone() -> None:
    nodes = sim.node_names(8)
    meetings = _round_robin(nodes, 0, 10)
    victim = meetings[-1]
    meetings[-1] = _meeting(victim.round, victim.a, victim.b, 2.0)
    result = analyze("fabric", meetings, window_seconds=10 * PERIOD)
    assert result.suspects == []
    assert _names(result.unconfirmed) == {("path", f"{victim.a}<->{victim.b}")}


def test_a_node_whose_partners_cannot_reach_it_is_named_with_failed_runs() -> None:
    nodes = sim.node_names(8)
    meetings = _round_robin(nodes, 0, 12)
    down = "h4"
    meetings = [
        _meeting(m.round, m.a, m.b, None, False) if down in (m.a, m.b) and m.round >= 9 else m
        for m in meetings
    ]
    result = analyze("fabric", meetings, window_seconds=12 * PERIOD)
    assert _names(result.suspects) == {("host", down)}
    assert {m["result"] for m in result.suspects[0].evidence["meetings"]} == {"failed"}


def test_too_few_rounds_is_not_enough_evidence() -> None:
    meetings = _round_robin(sim.node_names(8), 0, 2)
    result = analyze("fabric", meetings, window_seconds=2 * PERIOD)
    assert result.not_enough_evidence is not None and "2 rounds" in result.not_enough_evidence
    assert result.suspects == []
    assert "not enough evidence" in render_table(result)
    assert analyze("fabric", [], window_seconds=PERIOD).not_enough_evidence


def test_rules_are_validated() -> None:
    with pytest.raises(ValueError, match="threshold"):
        Rules(threshold=0)
    with pytest.raises(ValueError):
        Rules(host_partners=0)


def test_merge_keeps_the_better_report_of_the_two_ends() -> None:
    meetings = merge(
        [
            Report(5, "h1", "h2", None, False, 100.0, 110.0),  # the server end saw nothing
            Report(5, "h2", "h1", 1.2e9, True, 105.0, 200.0),
            Report(5, "h1", "h1", 1.0, True, 0.0, 0.0),  # nonsense: a node meeting itself
        ]
    )
    assert len(meetings) == 1
    m = meetings[0]
    assert (m.a, m.b, m.bandwidth, m.success, m.first_seen, m.last_seen) == (
        "h1",
        "h2",
        1.2e9,
        True,
        100.0,
        200.0,
    )


@pytest.mark.parametrize("order", [1, -1], ids=["higher-first", "higher-second"])
def test_of_two_measured_reports_of_one_meeting_the_better_wins(order: int) -> None:
    # Each end measured the run (the client and the server see slightly different rates), one end
    # judged it short: a lost or garbled report can hide a shortfall, never invent one.
    reports = [
        Report(5, "h1", "h2", 1.2e9, True, 100.0, 110.0),
        Report(5, "h2", "h1", 0.6e9, False, 105.0, 200.0),
    ][::order]
    (m,) = merge(reports)
    assert (m.bandwidth, m.success) == (1.2e9, True)


def test_json_has_the_spec_keys() -> None:
    result = _run(16, 20, 3, bad_hosts={"h3": 0.5}, p_busy=0)
    data = result.to_dict()
    assert list(data)[:5] == ["probe", "window_seconds", "nodes", "rounds", "suspects"]
    assert data["probe"] == "fabric" and data["nodes"] == 16 and data["rounds"] == 23
    suspect = data["suspects"][0]
    assert list(suspect) == ["kind", "suspect", "hosts", "evidence", "impact"]
    assert suspect["kind"] == "host" and suspect["suspect"] == "h3" and suspect["hosts"] == ["h3"]
    table = render_table(result)
    assert "SUSPECT" in table and "\nh3 " in table and "host" in table


# --- reading range queries ----------------------------------------------------------------------


def _series(name: str, labels: dict[str, str], values: list[tuple[float, float]]) -> dict:  # type: ignore[type-arg]
    return {"metric": {"__name__": name, **labels}, "values": [[t, str(v)] for t, v in values]}


def test_reduce_series_ties_results_to_node_names_and_rounds() -> None:
    a = {"instance": "10.0.0.1:9845", "job": "clusterhealth"}
    b = {"instance": "10.0.0.2:9845", "job": "clusterhealth"}
    c = {"instance": "10.0.0.3:9845", "job": "clusterhealth"}
    steps = [1000.0, 1450.0, 1900.0, 2350.0]
    result = reduce_series(
        "fabric",
        node_info=[
            _series("clusterhealth_node_info", {**a, "node": "h1"}, [(t, 1) for t in steps]),
            _series("clusterhealth_node_info", {**b, "node": "h2"}, [(t, 1) for t in steps]),
        ],
        rounds=[
            _series("clusterhealth_probe_round", {**a, "probe": "fabric"}, [(t, t // 900) for t in steps]),
            _series("clusterhealth_probe_round", {**b, "probe": "fabric"}, [(t, t // 900) for t in steps]),
            _series("clusterhealth_probe_round", {**a, "probe": "other"}, [(t, 7) for t in steps]),
        ],
        bandwidth=[
            _series(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {**a, "probe": "fabric", "peer": "h2"},
                [(1000.0, 1.2e9), (1450.0, 1.2e9)],
            ),
            _series(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {**a, "probe": "fabric", "peer": "h9"},
                [(1900.0, 0.6e9), (2350.0, 0.6e9)],
            ),
            _series(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {**a, "probe": "fabric", "peer": ""},  # a node-local probe of that name
                [(1000.0, 5.0)],
            ),
            _series(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {**c, "probe": "fabric", "peer": "h1"},  # no node_info for this target
                [(1000.0, 1.0e9)],
            ),
        ],
        peer_success=[
            _series(
                "clusterhealth_probe_peer_success", {**a, "probe": "fabric", "peer": "h2"}, [(1000.0, 1)]
            ),
            _series(
                "clusterhealth_probe_peer_success",
                {**b, "probe": "fabric", "peer": "h7"},
                [(1900.0, 0), (2350.0, 0)],
            ),
        ],
        expected=[
            _series(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second",
                {**a, "probe": "fabric"},
                [(1000, 1.25e9)],
            )
        ],
    )
    got = sorted((r.round, r.node, r.peer, r.bandwidth, r.success) for r in result.reports)
    assert got == [(1, "h1", "h2", 1.2e9, True), (2, "h1", "h9", 0.6e9, None), (2, "h2", "h7", None, False)]
    first = next(r for r in result.reports if r.peer == "h9")
    assert (first.first_seen, first.last_seen) == (1900.0, 2350.0)
    assert result.nodes == {"h1", "h2"}
    assert result.expected == 1.25e9
    target = '{instance="10.0.0.3:9845", job="clusterhealth"}'
    assert result.problems == [f"{target} exports fabric results but no clusterhealth_node_info"]


def test_the_agents_expectation_is_their_median_not_the_highest() -> None:
    # Three agents export the group's expectation; one was configured for another fabric.
    targets = [{"instance": f"10.0.0.{i}:9845", "job": "clusterhealth"} for i in (1, 2, 3)]
    expectations = [1.25e9, 1.25e9, 5e9]
    result = reduce_series(
        "fabric",
        node_info=[],
        rounds=[],
        bandwidth=[],
        peer_success=[],
        expected=[
            _series(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second",
                {**target, "probe": "fabric"},
                [(1000.0, value)],
            )
            for target, value in zip(targets, expectations, strict=True)
        ],
    )
    assert result.expected == 1.25e9


def test_a_window_in_which_an_agent_changed_its_name_is_credited_to_neither_name() -> None:
    # The agent of 10.0.0.1 was h1 until the window ending at 1450 and h9 from it on: that window
    # has both names, and its result is left out (the windows beside it hold it), not given to
    # the new name or the old one.
    a = {"instance": "10.0.0.1:9845", "job": "clusterhealth"}
    steps = [1000.0, 1450.0, 1900.0]
    result = reduce_series(
        "fabric",
        node_info=[
            _series("clusterhealth_node_info", {**a, "node": "h1"}, [(1000.0, 1), (1450.0, 1)]),
            _series("clusterhealth_node_info", {**a, "node": "h9"}, [(1450.0, 1), (1900.0, 1)]),
        ],
        rounds=[
            _series("clusterhealth_probe_round", {**a, "probe": "fabric"}, [(t, t // 450) for t in steps]),
        ],
        bandwidth=[
            _series(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                {**a, "probe": "fabric", "peer": "h2"},
                [(t, 1.2e9) for t in steps],
            ),
        ],
        peer_success=[],
    )
    assert sorted((r.round, r.node) for r in result.reports) == [(2, "h1"), (4, "h9")]
    assert result.nodes == {"h1", "h9"} and result.problems == []


# --- who gets blamed: small hand-made tables, each with its verdict ------------------------------


def _table(text: str) -> list[Meeting]:
    """One meeting per line: round, the two ends, Gbit/s (10 is the group's speed) or 'failed'."""
    meetings = []
    for line in filter(str.strip, text.splitlines()):
        r, a, b, gbit = line.split()
        meetings.append(_meeting(int(r), a, b, None if gbit == "failed" else float(gbit)))
    return meetings


def _verdict(text: str, **rules: int) -> Analysis:
    meetings = _table(text)
    rounds = len({m.round for m in meetings})
    return analyze("fabric", meetings, window_seconds=rounds * PERIOD, rules=Rules(**rules))


# x falls short with a, b and c in a row. c's nearest meetings with others (two before, two
# after) are FINE: e 10, f 5, g 10, h {c_h}: with c_h = 5, c was bad half the time.
HALF_BAD_PARTNER = """
1 x a 5
1 c e 10
1 b d 10
2 x b 5
2 c f 5
2 a d 10
3 x c 5
3 a e 10
3 b f 10
4 c g 10
4 a h 10
4 b e 10
5 c h {c_h}
5 a f 10
5 b g 10
"""


def test_a_partner_bad_half_the_time_is_not_clean() -> None:
    result = _verdict(HALF_BAD_PARTNER.format(c_h=5))
    assert result.suspects == [], "c was bad half the time: x has two clean partners, not three"
    (leaning,) = [s for s in result.unconfirmed if s.kind == "host"]
    assert leaning.hosts == ("x",) and leaning.evidence["partners"] == ["a", "b"]
    # The same table with c fine three times in four: x is named on the word of a, b and c.
    named = _verdict(HALF_BAD_PARTNER.format(c_h=10))
    assert _names(named.suspects) == {("host", "x")}
    assert named.suspects[0].evidence["partners"] == ["a", "b", "c"]


def test_a_host_is_not_named_on_the_word_of_partners_that_were_not_clean() -> None:
    # c is a bad host, short with everyone; x had two unlucky meetings before it met c. The
    # verdict is c alone: x's third partner was c, who was not clean then.
    result = _verdict(
        """
        1 c d 5
        1 x a 5
        1 b e 10
        2 c e 5
        2 x b 5
        2 a d 10
        3 c x 5
        3 a e 10
        3 b d 10
        4 c f 5
        4 a b 10
        4 d e 10
        5 a f 10
        5 d x 10
        5 b e 10
        """
    )
    assert _names(result.suspects) == {("host", "c")}
    assert result.suspects[0].evidence["partners"] == ["d", "e", "f"], "x was not clean either"


# p and q fall short in two meetings in a row (a meeting and its confirmation). p is fine with
# a and b; q with c and, when Q_FINE_WITH_D, d too.
PATH = """
1 p q 5
1 a b 10
1 c d 10
2 p q 5
2 a c 10
2 b d 10
3 p a 10
3 q c 10
3 b d 10
4 p b 10
4 q {q4} 10
4 a c 10
"""


def test_a_path_is_named_only_when_both_ends_had_enough_fine_partners() -> None:
    result = _verdict(PATH.format(q4="c"))  # q fine with c twice: one partner
    assert result.suspects == []
    (single,) = result.unconfirmed
    assert (single.kind, single.name) == ("path", "p<->q")
    assert single.evidence["fine_partners"] == {"p": 2, "q": 1}
    assert "at least 2 other partners" in single.evidence["why_unconfirmed"]
    named = _verdict(PATH.format(q4="d"))
    assert _names(named.suspects) == {("path", "p<->q")}
    assert named.suspects[0].evidence["fine_partners"] == {"p": 2, "q": 2}


def test_a_path_end_with_as_many_short_meetings_as_fine_ones_is_not_clean() -> None:
    # p is fine with a and b and short with c and d besides q: not clean, so no path.
    table = PATH.format(q4="d") + "5 p c 5\n6 p d 5\n5 a b 10\n6 a b 10\n"
    assert _verdict(table).suspects == []
    assert _names(_verdict(table.replace("6 p d 5", "6 p d 10")).suspects) == {("path", "p<->q")}


def test_a_path_whose_second_end_is_not_clean_is_no_path() -> None:
    # The same table from q's side (q sorts after p, so it is the pair's second end): q is fine
    # with c and d and short with a and b besides p: not clean, so no path.
    table = PATH.format(q4="d") + "5 q a 5\n6 q b 5\n5 c d 10\n6 c d 10\n"
    result = _verdict(table)
    assert result.suspects == []
    assert _names(_verdict(table.replace("6 q b 5", "6 q b 10")).suspects) == {("path", "p<->q")}


HOST_IN_THREE_ROUNDS = """
1 x a 5
1 b c 10
1 d e 10
2 x b 5
2 a c 10
2 d f 10
3 x c 5
3 a e 10
3 b d 10
"""


def test_exactly_min_rounds_rounds_give_a_verdict() -> None:
    result = _verdict(HOST_IN_THREE_ROUNDS)
    assert result.rounds == 3 and result.not_enough_evidence is None
    assert _names(result.suspects) == {("host", "x")}
    assert _verdict(HOST_IN_THREE_ROUNDS, min_rounds=4).not_enough_evidence == (
        "3 rounds of probe fabric in the window, at least 4 needed"
    )


def test_a_meeting_exactly_at_the_threshold_is_not_short() -> None:
    # 8 of 10 Gbit/s is exactly 0.8 of the reference: fine. Just below it, x is named.
    at = _verdict(HOST_IN_THREE_ROUNDS.replace(" 5\n", " 8\n"))
    assert at.reference == 10 * GBIT and at.reference_excludes == ()
    assert at.suspects == [] and at.unconfirmed == []
    below = _verdict(HOST_IN_THREE_ROUNDS.replace(" 5\n", " 7.99\n"))
    assert _names(below.suspects) == {("host", "x")}


def test_a_hosts_evidence_is_its_latest_run_that_names_it() -> None:
    # Two runs of three short meetings, fine meetings between them: the latest is the evidence.
    table = (
        HOST_IN_THREE_ROUNDS
        + """
        4 x d 10
        4 a b 10
        5 x e 10
        5 c d 10
        6 x f 5
        6 a b 10
        7 x d 5
        7 b c 10
        8 x a 5
        8 c e 10
        """
    )
    result = _verdict(table)
    (host,) = result.suspects
    assert host.evidence["rounds"] == [6, 7, 8] and host.evidence["ongoing"] is True
    assert host.evidence["partners"] == ["f", "d", "a"]
    # A later short meeting that names nobody does not replace the run that does.
    result = _verdict(table.replace("7 x d 5", "7 x d 10").replace("8 x a 5", "8 x a 10"))
    (host,) = result.suspects
    assert host.evidence["rounds"] == [1, 2, 3] and host.evidence["ongoing"] is False


# x falls short with a, b and then c three rounds running (a meeting, its confirmation, and the
# next): c's own meetings with others around it were all fine (e, f before; g, h after). Only
# those say whether c was fine; its meetings with x are x's doing.
HOST_MET_AGAIN = """
1 x a 5
1 c e 10
1 b d 10
2 x b 5
2 c f 10
2 a d 10
3 x c 5
3 a e 10
3 b f 10
4 x c 5
4 d e 10
5 x c 5
5 d f 10
6 c g 10
6 a b 10
7 c h 10
7 d e 10
"""


def test_a_partners_meetings_with_the_suspect_do_not_count_against_the_partner() -> None:
    result = _verdict(HOST_MET_AGAIN)
    assert _names(result.suspects) == {("host", "x")}
    host = result.suspects[0]
    assert host.evidence["partners"] == ["a", "b", "c"]
    assert host.evidence["short_with"][-1] == {"peer": "c", "meetings": 3, "median_ratio": 0.5}
    # c really short with others around its meetings with x (f before, g after): not clean then.
    bad_c = _verdict(HOST_MET_AGAIN.replace("2 c f 10", "2 c f 5").replace("6 c g 10", "6 c g 5"))
    assert bad_c.suspects == []


# --- small groups --------------------------------------------------------------------------------


def test_fast_nodes_do_not_make_the_others_slow() -> None:
    # Two of eight nodes measure 13 Gbit/s in every meeting they take part in, the others 10: the
    # median node is a 10, so nobody is left out of the reference and nobody falls short. (Judged
    # against the fastest node, six nodes would be "slow", the reference 13, every 10 short.)
    fast = {"h1", "h2"}
    meetings = [
        _meeting(m.round, m.a, m.b, 13.0) if {m.a, m.b} & fast else m
        for m in _round_robin(sim.node_names(8), 0, 14)
    ]
    result = analyze("fabric", meetings, window_seconds=14 * PERIOD)
    assert result.reference == 10 * GBIT and result.reference_excludes == ()
    assert result.suspects == [] and result.unconfirmed == []


def test_one_slow_host_of_four_is_that_host_at_its_own_speed_not_a_slow_fleet() -> None:
    # In a group of four the slow host takes part in half the meetings: the median of all meetings
    # would land between its speed and the others' (a ratio of 0.67, and a "fleet" at 75 %).
    nodes = sim.node_names(4)
    meetings = [
        _meeting(m.round, m.a, m.b, 5.0) if "h2" in (m.a, m.b) else m for m in _round_robin(nodes, 0, 5)
    ]
    result = analyze("fabric", meetings, window_seconds=5 * PERIOD, expected=10 * GBIT)
    assert result.reference == 10 * GBIT and result.reference_excludes == ("h2",)
    assert not result.fleet_slowdown
    (host,) = result.suspects
    assert host.hosts == ("h2",) and host.evidence["median_ratio"] == 0.5
    # Five rounds of a group of four: h2 met two of its partners twice. Each is listed once.
    short_with = host.evidence["short_with"]
    assert sorted(p["peer"] for p in short_with) == ["h1", "h3", "h4"]
    assert sorted(p["meetings"] for p in short_with) == [1, 2, 2]
    table = render_table(result)
    assert "FLEET-WIDE SLOWDOWN" not in table and "without the meetings of h2" in table
    row = next(line for line in table.splitlines() if line.startswith("h2 "))
    for peer in ("h1", "h3", "h4"):
        assert row.count(f"{peer} ") == 1, row
    assert "(2 meetings)" in row


def test_a_slow_fleet_is_still_one_finding_with_its_reference() -> None:
    nodes = sim.node_names(4)
    meetings = [_meeting(m.round, m.a, m.b, 6.0, True) for m in _round_robin(nodes, 0, 5)]
    result = analyze("fabric", meetings, window_seconds=5 * PERIOD, expected=10 * GBIT)
    assert result.fleet_slowdown and result.suspects == [] and result.reference == 6 * GBIT
    fleet = result.to_dict()["fleet"]
    assert fleet["slowdown"] is True and fleet["median_to_expected_ratio"] == 0.6
    # The fleet's price: r = 6/10 of the expectation (10 Gbit/s = 1.25e9 B/s), the default job.
    # M_ref = 2·63/64 · 14e9 B / 1.25e9 B/s = 22.05 s; M = 22.05 / 0.6 = 36.75 s; steps 23.05 s and
    # 37.75 s: ×1.6377; 64 GPUs × 24 h × (1 − 23.05/37.75) = 1536 × 14.7/37.75 = 598.12 GPU-h/day.
    impact = fleet["impact"]
    assert impact["bandwidth_ratio"] == pytest.approx(0.6)
    assert impact["allreduce_slowdown"] == pytest.approx(1 / 0.6)
    assert impact["reference_bandwidth_bytes_per_second"] == 10 * GBIT
    assert impact["step_slowdown"] == pytest.approx(37.75 / 23.05)
    assert impact["gpu_hours_per_day"] == pytest.approx(1536 * 14.7 / 37.75)
    assert "costs all-reduce x1.67, step x1.64, 598 GPU-h/day to a job of 64 GPUs" in render_table(result)
    # No expectation exported, or the fleet within 0.8 of it: no fleet finding, no price.
    alone = analyze("fabric", meetings, window_seconds=5 * PERIOD)
    assert alone.to_dict()["fleet"] == {"slowdown": False, "median_to_expected_ratio": None, "impact": None}
    fine = analyze("fabric", meetings, window_seconds=5 * PERIOD, expected=7 * GBIT)
    assert fine.to_dict()["fleet"] == {"slowdown": False, "median_to_expected_ratio": 0.857, "impact": None}


# --- the price of a suspect (impact) --------------------------------------------------------------
#
# The default job (checks/cost.py IMPACT_WORKLOAD): 7e9 parameters × 2 bytes = S = 14e9 bytes of
# gradients, 64 GPUs, 1 s of compute a step, no overlap. At the reference 10 Gbit/s = 1.25e9 B/s a
# ring all-reduce takes M_ref = 2·63/64 · 14e9 / 1.25e9 = 1.96875 × 11.2 = 22.05 s, a step 23.05 s.
# Through a host or path at r = 0.5: M = 44.1 s, a step 45.1 s, so
#   allreduce_slowdown = 2, step_slowdown = 45.1 / 23.05 = 1.95662,
#   gpu_hours_per_day = 64 × 24 × (1 − 23.05/45.1) = 1536 × 22.05/45.1 = 750.971.
HALF_STEP = 45.1 / 23.05
HALF_LOST = 1536 * 22.05 / 45.1


def _impact(s) -> dict:  # type: ignore[no-untyped-def, type-arg]
    return s.to_dict()["impact"]


def test_a_host_at_half_the_reference_costs_the_default_job_this_much() -> None:
    result = _verdict(HOST_IN_THREE_ROUNDS)
    (host,) = result.suspects
    impact = _impact(host)
    assert impact["bandwidth_ratio"] == 0.5  # x measured 5 against a reference of 10 (x left out)
    assert impact["allreduce_slowdown"] == 2.0
    assert impact["step_slowdown"] == pytest.approx(HALF_STEP, rel=1e-12)
    assert impact["gpu_hours_per_day"] == pytest.approx(HALF_LOST, rel=1e-12)
    assert impact["reference_bandwidth_bytes_per_second"] == 10 * GBIT
    assert impact["workload"] == {
        "params": 7e9,
        "bytes_per_param": 2,
        "gpus": 64,
        "compute_seconds": 1.0,
        "overlap": 0.0,
    }
    assert "jobs" not in impact, "no job attribution: the stated job alone"


def test_a_path_is_priced_from_its_own_meetings() -> None:
    # p and q measured 5 and 5 against 10: r = 0.5, the same price as a host at half speed. At 2.5
    # and 5 the median is 3.75: r = 0.375, M = 22.05/0.375 = 58.8 s, step 59.8 s, ×59.8/23.05.
    (path,) = _verdict(PATH.format(q4="d")).suspects
    assert _impact(path)["bandwidth_ratio"] == 0.5
    assert _impact(path)["gpu_hours_per_day"] == pytest.approx(HALF_LOST)
    (slower,) = _verdict(PATH.format(q4="d").replace("1 p q 5", "1 p q 2.5")).suspects
    assert _impact(slower)["bandwidth_ratio"] == 0.375
    assert _impact(slower)["step_slowdown"] == pytest.approx(59.8 / 23.05)
    assert _impact(slower)["gpu_hours_per_day"] == pytest.approx(1536 * (1 - 23.05 / 59.8))


@pytest.mark.parametrize(
    ("workload", "step", "lost"),
    [
        # 1e9 × 2 = 2e9 bytes over 8 GPUs: M_ref = 2·7/8 · 2e9/1.25e9 = 2.8 s, M = 5.6 s.
        # Compute 0.5 s fully overlapped: steps max(0.5, 2.8) = 2.8 s and 5.6 s, ×2;
        # 8 × 24 × (1 − 1/2) = 96 GPU-h/day.
        (Workload(params=1e9, bytes_per_param=2, gpus=8, compute_seconds=0.5, overlap=1.0), 2.0, 96.0),
        # Compute 4 s, half overlapped: 4 + 2.8 − 0.5·2.8 = 5.4 s and 4 + 5.6 − 0.5·4 = 7.6 s,
        # ×7.6/5.4 = 1.4074; 192 × (1 − 5.4/7.6) = 192 × 2.2/7.6 = 55.58 GPU-h/day.
        (
            Workload(params=1e9, bytes_per_param=2, gpus=8, compute_seconds=4.0, overlap=0.5),
            7.6 / 5.4,
            192 * 2.2 / 7.6,
        ),
        # A compute-bound job hardly notices: 1e6 parameters × 4 bytes on 2 GPUs, M_ref = 3.2 ms,
        # 10 s compute: (10.0064)/(10.0032) = ×1.00032, 48 × 0.0032/10.0064 = 0.01535 GPU-h/day.
        (
            Workload(params=1e6, bytes_per_param=4, gpus=2, compute_seconds=10.0),
            10.0064 / 10.0032,
            48 * 0.0032 / 10.0064,
        ),
    ],
)
def test_the_stated_workload_sets_the_price(workload: Workload, step: float, lost: float) -> None:
    meetings = _table(HOST_IN_THREE_ROUNDS)
    result = analyze("fabric", meetings, window_seconds=3 * PERIOD, workload=workload)
    impact = _impact(result.suspects[0])
    assert impact["step_slowdown"] == pytest.approx(step, rel=1e-12)
    assert impact["gpu_hours_per_day"] == pytest.approx(lost, rel=1e-12)
    assert impact["workload"]["gpus"] == workload.gpus and impact["workload"]["overlap"] == workload.overlap
    assert result.workload == workload


# x (the suspect) runs a 16-GPU Slurm job (its other GPUs elsewhere), a 4-GPU pod, and a 1-GPU job;
# a, its partner, runs a job of its own.
JOBS = {
    "x": [
        Job("slurm", "4242", "", "", 16),
        Job("kubernetes", "", "ml", "trainer-0", 4),
        Job("slurm", "9", "", "", 1),
    ],
    "a": [Job("slurm", "77", "", "", 64)],
}


def test_the_jobs_on_a_suspects_node_are_priced_each_with_its_own_gpus() -> None:
    result = analyze("fabric", _table(HOST_IN_THREE_ROUNDS), window_seconds=3 * PERIOD, jobs=JOBS)
    impact = _impact(result.suspects[0])
    # Job 4242, 16 GPUs: M_ref = 2·15/16 · 11.2 = 21 s, M = 42 s; steps 22 s and 43 s: ×43/22;
    # 16 × 24 × (1 − 22/43) = 384 × 21/43 = 187.535 GPU-h/day.
    # Pod ml/trainer-0, 4 GPUs: M_ref = 2·3/4 · 11.2 = 16.8 s, M = 33.6 s; steps 17.8 and 34.6 s:
    # ×34.6/17.8; 96 × 16.8/34.6 = 46.613 GPU-h/day.
    # Job 9, one GPU: no all-reduce at all, ×1, nothing lost.
    assert impact["jobs"] == [
        {
            "scheduler": "slurm",
            "job": "4242",
            "namespace": "",
            "pod": "",
            "gpus": 16,
            "step_slowdown": pytest.approx(43 / 22),
            "gpu_hours_per_day": pytest.approx(384 * 21 / 43),
        },
        {
            "scheduler": "kubernetes",
            "job": "",
            "namespace": "ml",
            "pod": "trainer-0",
            "gpus": 4,
            "step_slowdown": pytest.approx(34.6 / 17.8),
            "gpu_hours_per_day": pytest.approx(96 * 16.8 / 34.6),
        },
        {
            "scheduler": "slurm",
            "job": "9",
            "namespace": "",
            "pod": "",
            "gpus": 1,
            "step_slowdown": 1.0,
            "gpu_hours_per_day": 0.0,
        },
    ]
    # The top level: their sum; the step slowdown stays the stated job's.
    assert impact["gpu_hours_per_day"] == pytest.approx(384 * 21 / 43 + 96 * 16.8 / 34.6)
    assert impact["step_slowdown"] == pytest.approx(HALF_STEP)
    table = render_table(result)
    assert "jobs on x: slurm job 4242 (16 GPUs) step x1.95, 188 GPU-h/day; pod ml/trainer-0 (4 GPUs)" in table
    row = next(line for line in table.splitlines() if line.startswith("x "))
    assert row.split()[:5] == ["x", "host", "0.50", "x1.96", "234"]
    # Job attribution that knows no job on x: the stated job's price, no jobs key.
    bare = analyze("fabric", _table(HOST_IN_THREE_ROUNDS), window_seconds=3 * PERIOD, jobs={"a": JOBS["a"]})
    assert "jobs" not in _impact(bare.suspects[0])
    assert _impact(bare.suspects[0])["gpu_hours_per_day"] == pytest.approx(HALF_LOST)


def test_a_job_on_both_ends_of_a_path_is_priced_once() -> None:
    # Job 4242 spans p and q (and 14 more GPUs elsewhere): the path slows it once, whichever end.
    job = Job("slurm", "4242", "", "", 16)
    alone = analyze("fabric", _table(PATH.format(q4="d")), window_seconds=4 * PERIOD, jobs={"p": [job]})
    both = analyze(
        "fabric", _table(PATH.format(q4="d")), window_seconds=4 * PERIOD, jobs={"p": [job], "q": [job]}
    )
    (path,) = both.suspects
    assert path.hosts == ("p", "q")
    assert [j["job"] for j in _impact(path)["jobs"]] == ["4242"]
    # Job 4242 at r = 0.5: 384 × 21/43 GPU-h/day (see the test above), once.
    assert _impact(path)["gpu_hours_per_day"] == pytest.approx(384 * 21 / 43)
    assert _impact(path) == _impact(alone.suspects[0])


def test_a_node_nobody_can_reach_costs_its_job_everything() -> None:
    # Every meeting of h4 failed: r = 0, the all-reduce never completes (null in the JSON, "stalled"
    # in the table), and a job spanning it loses all its GPU-hours: 64 × 24 = 1536.
    meetings = [
        _meeting(m.round, m.a, m.b, None, False) if "h4" in (m.a, m.b) and m.round >= 9 else m
        for m in _round_robin(sim.node_names(8), 0, 12)
    ]
    result = analyze("fabric", meetings, window_seconds=12 * PERIOD)
    impact = _impact(result.suspects[0])
    assert impact["bandwidth_ratio"] == 0.0
    assert impact["allreduce_slowdown"] is None and impact["step_slowdown"] is None
    assert impact["gpu_hours_per_day"] == 1536.0
    row = next(line for line in render_table(result).splitlines() if line.startswith("h4 "))
    assert row.split()[:5] == ["h4", "host", "0.00", "stalled", "1536"]


def test_suspects_are_ranked_by_the_gpu_hours_they_cost() -> None:
    # A host at 0.5 and a path at 0.25: with the stated job the path costs more and comes first.
    n, healthy = 64, 30
    met = _first_meeting(n, "h10", "h20", 100 + healthy + 3)
    faulty = met - (100 + healthy) + 2
    kw = {"bad_hosts": {"h3": 0.5}, "bad_paths": {sim.path("h10", "h20"): 0.25}}
    result = _run(n, healthy, faulty, **kw)  # type: ignore[arg-type]
    assert [s.name for s in result.suspects] == ["h10<->h20", "h3"]
    lost = [s.impact.gpu_hours_per_day for s in result.suspects if s.impact]
    assert lost == sorted(lost, reverse=True) and len(lost) == 2
    # A 512-GPU job on h3 and a 2-GPU job on h10: h3's job now loses more, h3 comes first.
    jobs = {"h3": [Job("slurm", "big", "", "", 512)], "h10": [Job("slurm", "small", "", "", 2)]}
    meetings = _run_meetings(n, healthy, faulty, **kw)  # type: ignore[arg-type]
    ranked = analyze("fabric", meetings, window_seconds=(healthy + faulty) * PERIOD, jobs=jobs)
    assert [s.name for s in ranked.suspects] == ["h3", "h10<->h20"]


# --- leaves and uplinks ---------------------------------------------------------------------------
#
# Members placed on leaves, the schedule pairing inside and across them (checks/fabric/schedule.py),
# the noise of the other simulated groups (1 % short runs, ±5 %, 1 % busy). A fault starts after
# eight healthy rounds at a random place; analyze runs after every round, as a periodic `analyze`
# would. The bound (tests/test_fabric_schedule.py): 4 rounds with an even number of leaves, 6 with
# an odd one.


def _tree(
    leaves: int,
    size: int,
    seed: int,
    *,
    uplink: bool = False,
    leaf: bool = False,
    host: bool = False,
    path: str | None = None,
    rounds: int = 8,
) -> tuple[dict[str, str], dict[str, str], list[Analysis]]:
    """(node -> leaf, what was degraded, the analysis after each faulty round)."""
    placed = sim.tree(leaves, size)
    rng = random.Random(seed)
    fleet = sim.Fleet(list(placed), leaves=placed, nominal=10 * GBIT)
    group = sim.Group(fleet, random.Random(seed))
    start = 1000 + rng.randrange(2)  # a fault that starts inside the leaves, or across them
    played = [group.play(r) for r in range(start, start + 8)]
    names = [f"leaf{i + 1}" for i in range(leaves)]
    up, down = rng.sample(names, 2)
    faults: dict[str, str] = {}
    if uplink:
        fleet.bad_uplinks[up] = 0.5
        faults["uplink"] = up
    if leaf:
        fleet.bad_leaves[down] = 0.5
        faults["leaf"] = down
    elsewhere = [n for n, at in placed.items() if at not in (up, down)]
    if host:
        faults["host"] = rng.choice(elsewhere)
        fleet.bad_hosts[faults["host"]] = 0.5
    if path is not None:
        # Two nodes away from the faulty leaves that meet within the faulty rounds, inside one leaf
        # or across two.
        first = start + 8
        pairs = [
            p
            for r in range(first, first + rounds - 2)
            for p in group.schedule.matching(r).pairs
            if {p.server, p.client} <= set(elsewhere) - {faults.get("host")}
            and (placed[p.server] == placed[p.client]) == (path == "inside")
        ]
        chosen = pairs[0]
        fleet.bad_paths[sim.path(chosen.server, chosen.client)] = 0.5
        faults["path"] = "<->".join(sorted((chosen.server, chosen.client)))
    analyses = []
    for r in range(start + 8, start + 8 + rounds):
        played.append(group.play(r))
        meetings = merge(sim.reports(played, PERIOD))
        analyses.append(analyze("fabric", meetings, window_seconds=len(played) * PERIOD, leaves=placed))
    return placed, faults, analyses


def _first_named(analyses: list[Analysis], kind: str, name: str) -> int | None:
    return next((k + 1 for k, a in enumerate(analyses) if (kind, name) in _names(a.suspects)), None)


@pytest.mark.parametrize(("leaves", "size", "bound"), [(4, 4, 4), (5, 4, 6), (8, 4, 4), (16, 8, 4)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bad_uplink_is_named_as_its_leafs_uplink_within_the_bound(
    leaves: int, size: int, bound: int, seed: int
) -> None:
    placed, faults, analyses = _tree(leaves, size, seed, uplink=True)
    up = faults["uplink"]
    found = _first_named(analyses, "uplink", up)
    assert found is not None and found <= bound, [_names(a.suspects) for a in analyses]
    # One verdict per incident, at every round: never its hosts, never the paths across it.
    assert all(_names(a.suspects) <= {("uplink", up)} for a in analyses), [
        _names(a.suspects) for a in analyses
    ]
    (named,) = analyses[-1].suspects
    assert list(named.hosts) == [n for n, at in placed.items() if at == up]
    e = named.evidence
    assert e["leaf"] == up and e["inside"]["fine"] > 4 * e["inside"]["short"], "fine inside but for noise"
    assert sum(x["clean"] for x in e["short_with"]) >= 2
    assert 0.45 <= e["median_ratio"] <= 0.55 and e["ongoing"]
    assert analyses[-1].leaves[up] == list(named.hosts)


@pytest.mark.parametrize(("leaves", "size", "bound"), [(4, 4, 4), (5, 4, 6), (8, 4, 4), (16, 8, 4)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bad_leaf_is_named_as_the_leaf_within_the_bound(
    leaves: int, size: int, bound: int, seed: int
) -> None:
    _, faults, analyses = _tree(leaves, size, seed, leaf=True)
    down = faults["leaf"]
    found = _first_named(analyses, "leaf", down)
    assert found is not None and found <= bound, [_names(a.suspects) for a in analyses]
    assert all(_names(a.suspects) <= {("leaf", down)} for a in analyses), [
        _names(a.suspects) for a in analyses
    ]
    (named,) = analyses[-1].suspects
    assert named.evidence["inside"]["short"] > named.evidence["inside"]["fine"]
    assert all(n not in {h for s in analyses[-1].unconfirmed for h in s.hosts} for n in named.hosts), (
        "its members' meetings are its evidence, not hosts or paths waiting"
    )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_four_faults_in_the_tree_are_each_named_as_their_kind(seed: int) -> None:
    # A bad uplink, a bad leaf, a bad host and a bad path inside a leaf at once, in 8 leaves of 4:
    # each named as what it is, nothing else.
    _, faults, analyses = _tree(8, 4, seed, uplink=True, leaf=True, host=True, path="inside", rounds=10)
    expected = {(kind, name) for kind, name in faults.items()}
    assert _names(analyses[-1].suspects) == expected, _names(analyses[-1].suspects)
    for kind, name in expected:
        assert all((kind, name) in _names(a.suspects) for a in analyses[5:]), (
            f"{kind} {name} named from the sixth round on"
        )
    assert all(_names(a.suspects) <= expected for a in analyses), [_names(a.suspects) for a in analyses]


def test_a_path_across_two_leaves_is_a_path_and_a_host_inside_a_leaf_a_host() -> None:
    _, faults, analyses = _tree(8, 4, 5, host=True, path="across", rounds=10)
    assert _names(analyses[-1].suspects) == {("host", faults["host"]), ("path", faults["path"])}


@pytest.mark.parametrize(("leaves", "size"), [(8, 8), (5, 3)])
def test_a_healthy_tree_has_no_suspect(leaves: int, size: int) -> None:
    placed = sim.tree(leaves, size)
    rounds = sim.play(sim.Fleet(list(placed), leaves=placed), 200, 96, seed=9)
    result = analyze("fabric", merge(sim.reports(rounds, PERIOD)), window_seconds=96 * PERIOD, leaves=placed)
    assert result.suspects == [] and not [s for s in result.unconfirmed if s.kind in ("leaf", "uplink")]


def test_without_placement_a_bad_uplink_is_what_it_was_before() -> None:
    # The same data judged without the places: no leaf, no uplink (the members look like hosts or
    # nothing, as before the tree was known).
    placed = sim.tree(8, 4)
    fleet = sim.Fleet(list(placed), leaves=placed, nominal=10 * GBIT)
    group = sim.Group(fleet, random.Random(1))
    played = [group.play(r) for r in range(500, 508)]
    fleet.bad_uplinks["leaf3"] = 0.5
    played += [group.play(r) for r in range(508, 516)]
    meetings = merge(sim.reports(played, PERIOD))
    blind = analyze("fabric", meetings, window_seconds=16 * PERIOD)
    assert not {s.kind for s in (*blind.suspects, *blind.unconfirmed)} & {"leaf", "uplink"}
    assert blind.leaves == {}
    # Known for some nodes only: the leaves that are known still tell.
    partly = {n: at for n, at in placed.items() if at != "leaf8"}
    seen = analyze("fabric", merge(sim.reports(played, PERIOD)), window_seconds=16 * PERIOD, leaves=partly)
    assert _names(seen.suspects) == {("uplink", "leaf3")}


def test_two_leaves_cannot_tell_whose_uplink() -> None:
    # Every meeting across crosses both uplinks: neither leaf is named, and nobody else.
    placed = sim.tree(2, 6)
    fleet = sim.Fleet(list(placed), leaves=placed, nominal=10 * GBIT)
    group = sim.Group(fleet, random.Random(2))
    played = [group.play(r) for r in range(300, 308)]
    fleet.bad_uplinks["leaf1"] = 0.5
    played += [group.play(r) for r in range(308, 320)]
    result = analyze("fabric", merge(sim.reports(played, PERIOD)), window_seconds=20 * PERIOD, leaves=placed)
    assert result.suspects == []


def _placed_meeting(r: int, a: str, b: str, gbit: float) -> Meeting:
    return _meeting(r, a, b, gbit)


def test_the_uplink_rule_on_a_hand_made_table() -> None:
    # Leaves A (a1, a2), B (b1, b2), C (c1, c2). Rounds 1-2 healthy; from round 3 everything that
    # crosses A's uplink runs at half: A meets B in round 3, itself in 4, C in 5.
    leaves = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C", "c2": "C"}
    m = _placed_meeting
    healthy = [
        m(1, "a1", "b1", 10), m(1, "a2", "b2", 10), m(1, "c1", "c2", 10),
        m(2, "a1", "c1", 10), m(2, "a2", "c2", 10), m(2, "b1", "b2", 10),
    ]  # fmt: skip
    faulty = [
        m(3, "a1", "b2", 5), m(3, "a2", "b1", 5), m(3, "c1", "c2", 10),
        m(4, "a1", "a2", 10), m(4, "b1", "c1", 10), m(4, "b2", "c2", 10),
        m(5, "a1", "c2", 5), m(5, "a2", "c1", 5), m(5, "b1", "b2", 10),
    ]  # fmt: skip
    result = analyze("fabric", healthy + faulty, window_seconds=5 * PERIOD, leaves=leaves)
    assert _names(result.suspects) == {("uplink", "A")}
    (uplink,) = result.suspects
    assert uplink.hosts == ("a1", "a2") and uplink.ratio == pytest.approx(0.5, abs=0.01)
    e = uplink.evidence
    assert [(x["leaf"], x["meetings"], x["clean"]) for x in e["short_with"]] == [
        ("B", 2, True),
        ("C", 2, True),
    ]
    assert e["inside"] == {"fine": 1, "short": 0, "median_ratio": 1.0} and e["rounds"] == [3, 5]
    # Round 4 inside A short too: the leaf itself.
    leafy = [x if x.round != 4 or {x.a, x.b} != {"a1", "a2"} else m(4, "a1", "a2", 5) for x in faulty]
    assert _names(analyze("fabric", healthy + leafy, window_seconds=5 * PERIOD, leaves=leaves).suspects) == {
        ("leaf", "A")
    }
    # Only one other leaf met so far: waiting, not named; and what it would explain waits with it.
    early = analyze("fabric", healthy + faulty[:6], window_seconds=4 * PERIOD, leaves=leaves)
    assert early.suspects == []
    (waiting,) = [s for s in early.unconfirmed if s.kind == "uplink"]
    assert "1 clean other leaf" in waiting.evidence["why_unconfirmed"]
    # B's uplink bad as well: the meetings with B say nothing about A (B is not clean), C does.
    both = [*faulty, m(4, "b1", "c1", 5), m(4, "b2", "c2", 5)]
    both = [x for x in both if not (x.round == 4 and x.bandwidth == 10 * GBIT and "b" in x.a + x.b)]
    assert ("uplink", "B") not in _names(
        analyze("fabric", healthy + both, window_seconds=5 * PERIOD, leaves=leaves).suspects
    )


def test_an_uplink_is_priced_for_the_jobs_on_its_leaf() -> None:
    _, faults, analyses = _tree(8, 4, 1, uplink=True)
    (named,) = analyses[-1].suspects
    r = named.ratio
    assert named.impact is not None and named.impact.bandwidth_ratio == pytest.approx(r)
    assert named.impact.allreduce_slowdown == pytest.approx(1 / r)
    placed = sim.tree(8, 4)
    members = [n for n, at in placed.items() if at == faults["uplink"]]
    jobs = {
        members[0]: [Job("slurm", "41", "", "", gpus=16)],
        members[2]: [Job("slurm", "42", "", "", gpus=8)],
    }
    fleet = sim.Fleet(list(placed), leaves=placed, nominal=10 * GBIT)
    group = sim.Group(fleet, random.Random(1))
    played = [group.play(r) for r in range(700, 708)]
    fleet.bad_uplinks[faults["uplink"]] = 0.5
    played += [group.play(r) for r in range(708, 716)]
    priced = analyze(
        "fabric", merge(sim.reports(played, PERIOD)), window_seconds=16 * PERIOD, leaves=placed, jobs=jobs
    )
    (uplink,) = priced.suspects
    assert uplink.impact is not None and [job.job for job, _, _ in uplink.impact.jobs] == ["41", "42"]


def test_the_table_and_the_json_of_a_leaf_and_an_uplink() -> None:
    _, faults, analyses = _tree(8, 4, 3, uplink=True, leaf=True, rounds=8)
    result = analyses[-1]
    table = render_table(result)
    rows = {line.split()[0]: line for line in table.splitlines() if line.startswith("leaf")}
    up, down = faults["uplink"], faults["leaf"]
    assert rows[up].split()[1] == "uplink" and "4 hosts (" in rows[up] and "fine inside (" in rows[up]
    assert "short across with leaf" in rows[up]
    assert rows[down].split()[1] == "leaf" and "short inside (" in rows[down]
    document = result.to_dict()
    kinds = {s["kind"]: s for s in document["suspects"]}
    assert kinds["uplink"]["suspect"] == up and kinds["uplink"]["hosts"] == result.leaves[up]
    assert set(document["leaves"]) == {f"leaf{i}" for i in range(1, 9)}
    assert {"leaf", "short_with", "inside", "members_short", "meetings", "rounds", "median_ratio"} <= set(
        kinds["leaf"]["evidence"]
    )
