"""The analyzer: a bad host from a bad path, never a partner of either, never one short run."""

from __future__ import annotations

import random

import pytest

from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.checks.fabric.analysis import (
    Analysis,
    Meeting,
    Report,
    Rules,
    analyze,
    merge,
    reduce_series,
    render_table,
)

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
    fleet = sim.Fleet(sim.node_names(n), p_busy=p_busy, nominal=10 * GBIT * scale)
    group = sim.Group(fleet, random.Random(seed))
    rounds = [group.play(r) for r in range(100, 100 + healthy_rounds)]
    fleet.bad_hosts.update(bad_hosts or {})
    fleet.bad_paths.update(bad_paths or {})
    start = 100 + healthy_rounds
    rounds += [group.play(r) for r in range(start, start + faulty_rounds)]
    meetings = merge(sim.reports(rounds, PERIOD))
    return analyze("fabric", meetings, window_seconds=len(rounds) * PERIOD, expected=expected)


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


def test_json_has_the_spec_keys() -> None:
    result = _run(16, 20, 3, bad_hosts={"h3": 0.5}, p_busy=0)
    data = result.to_dict()
    assert list(data)[:5] == ["probe", "window_seconds", "nodes", "rounds", "suspects"]
    assert data["probe"] == "fabric" and data["nodes"] == 16 and data["rounds"] == 23
    suspect = data["suspects"][0]
    assert list(suspect) == ["kind", "suspect", "hosts", "evidence"]
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
