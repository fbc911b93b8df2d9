"""Pairwise groups in the agent: real agents meeting over loopback with real iperf3.

Each "node" is a `clusterhealth agent` process with its own node name, state directory and
loopback address (127.0.0.x: iperf3 binds it with -B on both ends, so a server sees which node
connected). Rounds are short (12 s) and the iperf3 tests paced (-b), so that the pairs of a module
run side by side on two cores. Faults are real: a busy command that says busy, a partner whose
agent never started, a server command that does not exist, a probe lock held by another process,
an address with no route (in a network namespace), clocks set apart (the rounds' clock is a
constructor argument of GroupRounds).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.checks.fabric import meeting
from clusterhealth.checks.fabric.rounds import GroupRounds, group_store
from clusterhealth.checks.fabric.schedule import RoundTiming, round_at
from clusterhealth.checks.probe_parsers import iperf3 as iperf3_kind
from clusterhealth.checks.probes import ProbeLock, ProbeOutcome
from clusterhealth.checks.probes.families import ProbeFamilies
from clusterhealth.checks.probes.pipeline import Judge, Launch, Pipeline

from .conftest import CLUSTERHEALTH, AgentProcess, require_tool, run_cli, samples, value

# The module's fleet waits three 12 s rounds; its tests then add rounds of their own.
pytestmark = pytest.mark.slow

PERIOD = 12.0
# iperf3 paced to 200 Mbit/s for one second: cheap on two cores, far from the configured expectation's
# degraded threshold.
RATE = "200M"
EXPECT = "200 Mb/s"


def iperf3() -> str:
    return require_tool("iperf3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group(name: str, members: dict[str, str], **settings: Any) -> dict[str, Any]:
    """A fast iperf3 group over loopback addresses."""
    return {
        "name": name,
        "kind": "iperf3",
        "members": members,
        "period_seconds": PERIOD,
        "port": free_port(),
        "confirm_port": free_port(),
        "timeout_seconds": 2.5,
        "skew_seconds": 0.5,
        "startup_seconds": 0.5,
        "confirm_runs": 1,
        "server_argv": [iperf3(), "-s", "-1", "-B", "{address}", "-p", "{port}", "-J"],
        "client_argv": [
            *(iperf3(), "-c", "{peer}", "-B", "{address}", "-p", "{port}"),
            *("-t", "1", "-b", RATE, "-J", "--connect-timeout", "1000"),
        ],
        "expect": EXPECT,
        **settings,
    }


def node_config(tmp: Path, node: str, groups: list[dict[str, Any]], **extra: Any) -> Path:
    data = {
        "node_name": node,
        "collectors": {
            "gpu": {"enabled": False},
            "kernel_log": {"enabled": False},
            "rdma": {"enabled": False},
            "audit": {"enabled": False},
            "probes": {"interval_seconds": 0.5},
        },
        "probing": {
            "state_dir": str(tmp / f"state-{node}"),
            "check_gpus_idle": False,
            **extra.pop("probing", {}),
        },
        "pairwise_groups": groups,
        **extra,
    }
    path = tmp / f"{node}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def runs(agent: AgentProcess, probe: str) -> dict[str, float]:
    text = agent.metrics()
    return {
        result: value(text, "clusterhealth_probe_runs_total", probe=probe, result=result) or 0.0
        for result in ("ok", "degraded", "failed", "timeout", "skipped")
    }


def peer_series(exposition: str, probe: str) -> dict[str, dict[str, float]]:
    """{family: {peer: value}} of the per-peer series of one group."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), v in samples(exposition).items():
        ls = dict(labels)
        if ls.get("probe") == probe and "peer" in ls:
            out.setdefault(name, {})[ls["peer"]] = v
    return out


# --- the loopback fleet: one module, every pair side by side ------------------------------------


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI runs the suite as root)")


class Fleet:
    """Every slow scenario of the module at once: one wait of three rounds for all of them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.agents: dict[str, AgentProcess] = {}
        self.rounds: dict[str, GroupRounds] = {}
        self.namespace = f"chtest-{uuid.uuid4().hex[:8]}"
        self.isolated: subprocess.Popen[bytes] | None = None
        self.isolated_config = tmp / "isolated.yaml"
        self.isolated_log = tmp / "isolated.log"

    def start(self, node: str, groups: list[dict[str, Any]], **extra: Any) -> None:
        config = node_config(self.tmp, node, groups, **extra)
        self.agents[node] = AgentProcess(["--config", str(config)])

    def start_in_process(self, node: str, spec: dict[str, Any], offset: float) -> None:
        """The group's rounds in this process, on a clock ``offset`` seconds from the wall clock."""
        config = configuration.load(node_config(self.tmp, node, [spec]))
        pipeline = Pipeline.of(config.probing, None)
        clock = lambda: time.time() + offset  # noqa: E731
        self.rounds[node] = GroupRounds(config.pairwise_groups[0], node, pipeline, clock=clock)
        self.rounds[node].start()

    def start_isolated(self, spec: dict[str, Any]) -> None:
        """An agent in a network namespace with only loopback: its partner's address has no route."""
        subprocess.run(["ip", "netns", "add", self.namespace], check=True)
        subprocess.run(["ip", "-n", self.namespace, "link", "set", "lo", "up"], check=True)
        node_config(self.tmp, "isolated", [spec]).rename(self.isolated_config)
        argv = [CLUSTERHEALTH, "agent", "--config", str(self.isolated_config), "--listen", "127.0.0.1:0"]
        with self.isolated_log.open("w") as log:
            self.isolated = subprocess.Popen(["ip", "netns", "exec", self.namespace, *argv], stderr=log)

    def stop(self) -> None:
        for agent in self.agents.values():  # all at once, then wait for each
            if agent.proc.poll() is None:
                agent.signal(signal.SIGTERM)
        for agent in self.agents.values():
            agent.stop()
        for rounds in self.rounds.values():
            rounds.close()
        for rounds in self.rounds.values():
            rounds.join(30)
        if self.isolated is not None:
            self.isolated.send_signal(signal.SIGTERM)
            self.isolated.wait(30)
        subprocess.run(["ip", "netns", "del", self.namespace], check=False, capture_output=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    _needs_root()
    tmp = tmp_path_factory.mktemp("pairwise")
    f = Fleet(tmp)
    # A lock held on h's state directory for the whole module, as a long probe run would hold it.
    lock = ProbeLock(tmp / "state-h" / "probe.lock", "nccl-tests-by-hand")
    assert lock.acquire()
    healthy = group("healthy", {"a": "127.0.0.11", "b": "127.0.0.12"})
    busy = group("busy", {"c": "127.0.0.13", "d": "127.0.0.14"})
    absent = group("absent", {"e": "127.0.0.15", "never": "127.0.0.16"})
    broken = group("broken", {"g": "127.0.0.17", "i": "127.0.0.18"})
    broken_g = {**broken, "server_argv": ["/nonexistent/iperf3", "-s", "-1", "-p", "{port}"]}
    locked = group("locked", {"h": "127.0.0.19", "j": "127.0.0.20"})
    # Clocks apart: 0.9 s with a tolerance of 1 s (a longer round holds the larger skew), and 5 s
    # with a tolerance of 0.5 s.
    within = group("within", {"k": "127.0.0.41", "l": "127.0.0.42"}, skew_seconds=1.0, period_seconds=16)
    beyond = group("beyond", {"m": "127.0.0.43", "n": "127.0.0.44"})
    try:
        f.start("a", [healthy])
        f.start("b", [healthy])
        f.start("c", [busy], probing={"busy_command": ["true"]})  # exits 0: busy
        f.start("d", [busy])
        f.start("e", [absent])
        f.start("g", [broken_g])
        f.start("i", [broken])
        f.start("h", [locked])
        f.start("j", [locked])
        f.start_in_process("k", within, 0.45)
        f.start_in_process("l", within, -0.45)
        f.start_in_process("m", beyond, 2.5)
        f.start_in_process("n", beyond, -2.5)
        f.start_isolated(group("unreachable", {"isolated": "127.0.0.1", "far": "192.0.2.77"}))
        # Two whole rounds (with two members the roles swap every round, so each end serves once),
        # and the regular slot of a third, whose result is then the current one.
        until = max((round_at(time.time(), p) + 3) * p for p in (PERIOD, 16.0))
        while not 5 <= until % PERIOD <= 10:  # the 12 s groups' regular slot is over, not the round
            until += 0.5
        while time.time() < until:
            time.sleep(0.5)
        yield f
    finally:
        f.stop()
        lock.release()


# Why a slot of two healthy agents may be sat out on a loaded machine: it started too late, or the
# partner's server was not up in time.
LATE = r"the slot started [\d.]+ s ago, too late|partner [ab] absent: "


def _when_met(agent: AgentProcess, probe: str) -> str:
    """The agent's exposition in a round whose meeting took place (it shows the partner's series)."""
    seen: list[str] = []

    def met() -> bool:
        seen[:] = [agent.metrics()]
        return "clusterhealth_probe_peer_success" in peer_series(seen[0], probe)

    agent.wait_for(met, 4 * PERIOD, "a round whose meeting took place")
    return seen[0]


def test_two_agents_meet_and_export_the_fabric_series(fleet: Fleet) -> None:
    for node, partner in (("a", "b"), ("b", "a")):
        agent = fleet.agents[node]
        # A loaded machine may sit a slot out (one that started too late, a partner's server not up
        # in time): the current round's series are read from a round whose meeting took place.
        text = _when_met(agent, "healthy")
        assert value(text, "clusterhealth_node_info", node=node) == 1.0
        counted = runs(agent, "healthy")
        assert counted["ok"] >= 2, agent.log()
        # Sat out at worst, for want of time alone, never misjudged.
        assert counted["failed"] + counted["degraded"] + counted["timeout"] == 0, agent.log()
        skips = re.findall(r"pairwise group healthy round \d+: .*?: skipped: (.*) \(", agent.log())
        assert all(re.match(LATE, why) for why in skips), skips
        # The round number is the wall clock's; the result exported is this round's, with this
        # round's partner: one peer at a time.
        exported = value(text, "clusterhealth_probe_round", probe="healthy")
        assert exported is not None and abs(exported - round_at(time.time(), PERIOD)) <= 1
        series = peer_series(text, "healthy")
        assert series["clusterhealth_probe_peer_success"] == {partner: 1.0}
        bandwidth = series["clusterhealth_probe_bandwidth_bytes_per_second"][partner]
        assert 0.8 * 25e6 <= bandwidth <= 1.05 * 25e6, "paced to 200 Mbit/s"
        assert value(text, "clusterhealth_probe_group_members", probe="healthy") == 2.0
        assert value(text, "clusterhealth_probe_success", probe="healthy") == 1.0
        assert "meeting serving" in agent.log() and "meeting connecting to" in agent.log()
        # What a group costs Prometheus per node, whatever the group's size (docs/fabric.md): 13
        # series of the group and the node's name.
        group_series = [n for n, ls in samples(text) if dict(ls).get("probe") == "healthy"]
        assert len(group_series) + 1 == 14, group_series


def test_a_busy_node_sits_out_and_its_partner_records_skipped(fleet: Fleet) -> None:
    busy, partner = fleet.agents["c"], fleet.agents["d"]
    for agent in (busy, partner):
        counted = runs(agent, "busy")
        assert counted["skipped"] >= 2 and counted["ok"] + counted["degraded"] + counted["failed"] == 0
        assert counted["timeout"] == 0
        assert "clusterhealth_probe_peer_success" not in peer_series(agent.metrics(), "busy")
        assert value(agent.metrics(), "clusterhealth_probe_round", probe="busy") is not None
    assert "skipped: busy command exited 0" in busy.log()
    assert "skipped: partner c absent" in partner.log()


def test_a_partner_whose_agent_is_down_is_absent_both_ways(fleet: Fleet) -> None:
    agent = fleet.agents["e"]
    counted = runs(agent, "absent")
    assert counted["skipped"] >= 2 and counted["failed"] + counted["degraded"] + counted["timeout"] == 0
    log = agent.log()
    assert "connection refused until the connect deadline" in log, "as the client"
    assert "no client connected before its deadline" in log, "as the server"


def test_a_server_that_cannot_start_fails_with_the_reason_and_its_partner_skips(fleet: Fleet) -> None:
    g, i = fleet.agents["g"], fleet.agents["i"]
    assert runs(g, "broken")["failed"] >= 1
    assert "the server did not start: executable not found: /nonexistent/iperf3" in g.log()
    assert runs(g, "broken")["ok"] >= 1, "its client end still measures"
    assert runs(i, "broken")["failed"] == 0 and runs(i, "broken")["skipped"] >= 1
    assert "connection refused until the connect deadline" in i.log()


def test_a_round_counts_against_the_probe_lock(fleet: Fleet) -> None:
    h, j = fleet.agents["h"], fleet.agents["j"]
    assert runs(h, "locked")["skipped"] >= 2 and runs(h, "locked")["ok"] == 0
    assert "another probe holds" in h.log() and "probe nccl-tests-by-hand" in h.log()
    assert runs(j, "locked")["skipped"] >= 2 and runs(j, "locked")["ok"] == 0


# --- faults seen by one end --------------------------------------------------------------------


def _serve_in_thread(argv: list[str], expected_address: str) -> tuple[threading.Thread, list[Any]]:
    timing = RoundTiming(period=30, run_seconds=5, skew=0.5, startup=0.5)
    end = meeting.End(time.time(), timing, 1, False, "h32", expected_address)
    # Judged against no expectation: a run that measured is ok.
    launch = Launch(argv, iperf3_kind.KIND, Judge("iperf3", 0.8))
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(meeting.serve(end, launch, time.time)))
    thread.start()
    return thread, out


def test_a_server_that_serves_another_node_than_its_partner_records_skipped() -> None:
    # The members' lists disagree: 127.0.0.33 believes it meets this server, which expects .32.
    port = free_port()
    argv = [iperf3(), "-s", "-1", "-B", "127.0.0.31", "-p", str(port), "-J"]
    thread, out = _serve_in_thread(argv, "127.0.0.32")
    time.sleep(0.5)
    client = [iperf3(), "-c", "127.0.0.31", "-B", "127.0.0.33", "-p", str(port), "-t", "1", "-b", RATE, "-J"]
    subprocess.run(client, capture_output=True, check=False, timeout=30)
    thread.join(30)
    (played,) = out
    assert played.outcome.result == "skipped"
    assert "a client other than the expected partner h32 connected, from 127.0.0.33" in played.outcome.reason

    # The expected partner is measured.
    port = free_port()
    argv = [iperf3(), "-s", "-1", "-B", "127.0.0.31", "-p", str(port), "-J"]
    thread, out = _serve_in_thread(argv, "127.0.0.32")
    time.sleep(0.5)
    client = [iperf3(), "-c", "127.0.0.31", "-B", "127.0.0.32", "-p", str(port), "-t", "1", "-b", RATE, "-J"]
    subprocess.run(client, capture_output=True, check=False, timeout=30)
    thread.join(30)
    assert out[0].outcome.result == "ok" and out[0].outcome.bandwidth_bytes_per_second > 2e7


def test_an_unreachable_partner_is_failed_with_the_reason(fleet: Fleet) -> None:
    text = fleet.isolated_log.read_text()
    assert "meeting connecting to far: failed" in text and "Network is unreachable" in text, text
    assert "meeting serving far: skipped: partner far absent" in text, text
    scraped = run_cli("scrape", "--config", str(fleet.isolated_config), "--kmsg-path", "/dev/null").stdout
    assert value(scraped, "clusterhealth_probe_runs_total", probe="unreachable", result="failed") >= 1


def test_clocks_apart_within_the_tolerance_meet_and_beyond_it_skip(fleet: Fleet) -> None:
    # Beyond the tolerance a meeting is missed, never misjudged.
    counted = {node: r.store.read().runs for node, r in fleet.rounds.items()}
    assert counted["k"]["ok"] >= 2 and counted["l"]["ok"] >= 2, counted
    for node in "klmn":
        assert counted[node]["failed"] + counted[node]["degraded"] + counted[node]["timeout"] == 0, counted
    assert counted["m"]["skipped"] >= 2 and counted["n"]["skipped"] >= 2 and counted["m"]["ok"] == 0, counted


# --- membership and identity ------------------------------------------------------------------


def test_sighup_rereads_the_members_file_and_a_bad_one_keeps_the_running_config(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    members = tmp_path / "members.yaml"
    members.write_text("a: 127.0.0.51\nb: 127.0.0.52\n")
    spec = group("fabric", {})
    del spec["members"]
    spec["members_file"] = str(members)
    agent = agent_process("--config", str(node_config(tmp_path, "a", [spec])))

    def size() -> float | None:
        return value(agent.metrics(), "clusterhealth_probe_group_members", probe="fabric")

    agent.wait_for(lambda: size() == 2.0, what="two members")
    members.write_text("a: 127.0.0.51\nb: 127.0.0.52\nc: 127.0.0.53\n")
    agent.signal(signal.SIGHUP)
    agent.wait_for(lambda: size() == 3.0, what="a third member after SIGHUP")
    members.write_text("a: 127.0.0.51\nb: 127.0.0.52\nb: 127.0.0.54\n")
    agent.signal(signal.SIGHUP)
    agent.wait_for(lambda: "reload failed" in agent.log(), what="the reload to fail")
    assert (
        "pairwise_groups[0].members_file" in agent.log() and "line 3: member 'b' listed twice" in agent.log()
    )
    time.sleep(1.5)  # two collections
    assert size() == 3.0


def test_a_node_that_is_not_a_member_takes_no_part(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    agent = agent_process(
        "--config", str(node_config(tmp_path, "z", [group("fabric", {"a": "127.0.0.61", "b": "127.0.0.62"})]))
    )
    agent.wait_for(lambda: "is not a member" in agent.log(), what="the log line")
    text = agent.metrics()
    assert value(text, "clusterhealth_node_info", node="z") == 1.0
    assert not [n for n, ls in samples(text) if dict(ls).get("probe") == "fabric"]
    assert "node z is not a member of pairwise group fabric (2 members)" in agent.log()


def _scrape_node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    quiet = ["--kmsg-path", "/dev/null", "--sysfs-root", "/nonexistent"]
    return run_cli("scrape", *quiet, *args, env={**os.environ, **(env or {})})


def test_node_name_from_flag_file_environment_or_hostname(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("node_name: from-file\ncollectors: {gpu: {enabled: false}}\n")
    bare = tmp_path / "bare.yaml"
    bare.write_text("collectors: {gpu: {enabled: false}}\n")
    env = {"NODE_NAME": "from-env"}

    def node(*args: str, env: dict[str, str] | None = None) -> list[str]:
        done = _scrape_node(*args, env=env)
        assert done.returncode == 0, done.stderr
        return [dict(ls)["node"] for n, ls in samples(done.stdout) if n == "clusterhealth_node_info"]

    assert node("--config", str(config), "--node-name", "from-flag", env=env) == ["from-flag"]
    assert node("--config", str(config), env=env) == ["from-file"]
    assert node("--config", str(bare), env=env) == ["from-env"]
    without = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = run_cli("scrape", "--config", str(bare), "--kmsg-path", "/dev/null", env=without)
    assert [dict(ls)["node"] for n, ls in samples(done.stdout) if n == "clusterhealth_node_info"] == [
        socket.gethostname().split(".")[0]
    ]
    bad = _scrape_node("--config", str(bare), env={"NODE_NAME": "two words"})
    assert bad.returncode == 2
    assert "the environment: NODE_NAME: expected a node name" in bad.stderr
    flag = _scrape_node("--config", str(bare), "--node-name", "a/b")
    assert flag.returncode == 2 and "node_name: expected a node name" in flag.stderr


@pytest.mark.parametrize(
    ("change", "key", "expected"),
    [
        ({"kind": "nccl-tests"}, "pairwise_groups[0].kind", "one of iperf3, ib_write_bw"),
        ({"confirm_port": "same"}, "pairwise_groups", "port and confirm_port to differ"),
        ({"period_seconds": 10}, "pairwise_groups", "a period of at least 12 s for runs of 2.5 s"),
        ({"client_argv": ["iperf3", "-c", "{host}"]}, "pairwise_groups[0].client_argv", "found {host}"),
        (
            {"members": {"a": "10.0.0.1", "b": "10.0.0.1"}},
            "pairwise_groups[0].members",
            "same address 10.0.0.1",
        ),
        ({"members_file": "FILE"}, "pairwise_groups", "members or members_file, not both"),
        (
            {"placement": {"z": {"leaf": "l1"}}},
            "pairwise_groups",
            "placement for members only (pairwise_groups[0], fabric, places z",
        ),
        ({"placement": {"a": {"switch": "s1"}}}, "pairwise_groups[0].placement", "(a has switch)"),
        ({"placement": {"a": {"leaf": "l 1"}}}, "pairwise_groups[0].placement", "a's leaf is 'l 1'"),
        ({"name": "local"}, "pairwise_groups[0].name", "a name no probe has"),
        ({"server_argv": []}, "pairwise_groups[0].server_argv", "the command and its arguments"),
    ],
)
def test_bad_groups_name_the_file_the_key_and_what_was_expected(
    tmp_path: Path, change: dict[str, Any], key: str, expected: str
) -> None:
    spec = group("fabric", {"a": "10.0.0.1", "b": "10.0.0.2"})
    if change.get("confirm_port") == "same":
        change = {"confirm_port": spec["port"]}
    if change.get("members_file") == "FILE":
        (tmp_path / "m.yaml").write_text("a: 10.0.0.1\n")
        change = {"members_file": str(tmp_path / "m.yaml")}
    spec.update(change)
    path = node_config(tmp_path, "a", [spec], probes=[{"name": "local", "argv": ["true"]}])
    with pytest.raises(configuration.ConfigError) as err:
        configuration.load(path)
    assert err.value.source == str(path) and err.value.key == key
    assert expected in str(err.value)


def test_two_groups_of_one_name_exit_2_naming_the_file_the_key_and_both_groups(tmp_path: Path) -> None:
    # One name is one probe label and one state file: the second group would mix its results in.
    first = group("fabric", {"a": "10.0.0.1", "b": "10.0.0.2"})
    second = group("fabric", {"a": "10.0.1.1", "c": "10.0.1.3"})
    path = node_config(tmp_path, "a", [first, group("other", {"a": "10.0.2.1", "b": "10.0.2.2"}), second])
    done = run_cli("agent", "--config", str(path), "--print-config")
    assert done.returncode == 2
    assert (
        f"{path}: pairwise_groups: expected group names to be unique "
        "(pairwise_groups[0] and [2] are both fabric)" in done.stderr
    ), done.stderr
    second["name"] = "fabric-2"
    assert (
        configuration.load(node_config(tmp_path, "a", [first, second])).pairwise_groups[1].name == "fabric-2"
    )


def test_a_bad_members_file_exits_2_naming_the_file_and_its_line(tmp_path: Path) -> None:
    members = tmp_path / "members.yaml"
    members.write_text("a: 10.0.0.1\nb: 10.0.0.2\na: 10.0.0.3\n")
    spec = group("fabric", {})
    del spec["members"]
    spec["members_file"] = str(members)
    path = node_config(tmp_path, "a", [spec])
    done = run_cli("agent", "--config", str(path), "--print-config")
    assert done.returncode == 2
    assert f"{path}: pairwise_groups[0].members_file: expected a members file" in done.stderr
    assert f"{members}: line 3: member 'a' listed twice (first on line 1)" in done.stderr
    members.unlink()
    done = run_cli("agent", "--config", str(path), "--print-config")
    assert done.returncode == 2 and "expected a readable members file" in done.stderr
    assert "No such file or directory" in done.stderr


# --- the state kept between processes ---------------------------------------------------------


def test_scrape_exports_the_current_rounds_result_only(tmp_path: Path) -> None:
    # What the agent recorded for this round shows in `scrape`; a result of an earlier round does
    # not (the round number moved on, the partner's series is gone), but the round number does.
    from clusterhealth.checks.fabric.rounds import SlotResult

    spec = group("fabric", {"a": "10.0.0.1", "b": "10.0.0.2"}, period_seconds=3600)
    config_path = node_config(tmp_path, "a", [spec])
    config = configuration.load(config_path)
    store = group_store(Path(config.probing.state_dir), "fabric")
    now = round_at(time.time(), 3600)
    outcome = ProbeOutcome("degraded", "slow", 1e8, 2.5e7 * 8)

    def record(round_: int) -> None:
        result = SlotResult(round_, False, "b", outcome, time.time(), 1.5, "iperf3 -c 10.0.0.2")

        def change(state: Any) -> None:
            state.runs["degraded"] += 1
            state.current = state.last = state.last_any = result

        store.update(change)

    record(now - 1)
    text = run_cli("scrape", "--config", str(config_path), "--kmsg-path", "/dev/null").stdout
    assert value(text, "clusterhealth_probe_round", probe="fabric") == now
    assert "clusterhealth_probe_peer_success" not in peer_series(text, "fabric")
    assert value(text, "clusterhealth_probe_runs_total", probe="fabric", result="degraded") == 1.0
    record(now)
    text = run_cli("scrape", "--config", str(config_path), "--kmsg-path", "/dev/null").stdout
    assert peer_series(text, "fabric") == {
        "clusterhealth_probe_peer_success": {"b": 0.0},
        "clusterhealth_probe_bandwidth_bytes_per_second": {"b": 1e8},
    }


def test_an_unreadable_state_file_fails_the_collector_with_the_reason(tmp_path: Path) -> None:
    spec = group("fabric", {"a": "10.0.0.1", "b": "10.0.0.2"})
    config_path = node_config(tmp_path, "a", [spec])
    state = tmp_path / "state-a" / "pairwise-fabric.json"
    state.parent.mkdir(parents=True)
    state.write_text("{not json")
    text = run_cli("scrape", "--config", str(config_path), "--kmsg-path", "/dev/null").stdout
    assert value(text, "clusterhealth_scrape_collector_success", collector="probes") == 0.0
    assert value(text, "clusterhealth_probe_round", probe="fabric") is not None, "the rest is exported"


def test_every_family_is_one_family_with_a_probe_and_a_group(tmp_path: Path) -> None:
    # The probes and the groups share the probe families: each appears once in the exposition.
    spec = group("fabric", {"a": "10.0.0.1", "b": "10.0.0.2"})
    config = node_config(tmp_path, "a", [spec], probes=[{"name": "local", "argv": ["true"]}])
    text = run_cli("scrape", "--config", str(config), "--kmsg-path", "/dev/null").stdout
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))
    assert set(ProbeFamilies.new().__dict__) == {
        "success",
        "runs",
        "last_run",
        "duration",
        "bandwidth",
        "expected",
        "wrong",
        "transport",
        "peer_success",
        "round",
        "members",
        "placement",
    }


def test_a_placed_member_exports_its_place_from_the_members_file(tmp_path: Path) -> None:
    # The inventory's export: a node's address alone, or with its place in the fabric.
    members = tmp_path / "members.yaml"
    members.write_text(
        "a: {address: 10.0.0.1, leaf: su1-leaf3, pod: su1, rail: 0}\n"
        "b: {address: 10.0.0.2, leaf: su1-leaf4}\n"
        "c: 10.0.0.3\n"
    )
    spec = group("fabric", {})
    del spec["members"]
    spec["members_file"] = str(members)
    places = {}
    for node in ("a", "b", "c"):
        text = run_cli(
            "scrape", "--config", str(node_config(tmp_path, node, [spec])), "--kmsg-path", "/dev/null"
        ).stdout
        places[node] = [dict(ls) for n, ls in samples(text) if n == "clusterhealth_probe_placement_info"]
    assert places == {
        "a": [{"probe": "fabric", "leaf": "su1-leaf3", "spine": "", "pod": "su1", "rail": "0"}],
        "b": [{"probe": "fabric", "leaf": "su1-leaf4", "spine": "", "pod": "", "rail": ""}],
        "c": [],
    }
    config = configuration.load(node_config(tmp_path, "a", [spec]))
    assert config.pairwise_groups[0].members == {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
    # Inline, the same places beside the members.
    inline = group(
        "fabric", {"a": "10.0.0.1", "b": "10.0.0.2"}, placement={"a": {"leaf": "l1"}, "b": {"leaf": "l2"}}
    )
    text = run_cli(
        "scrape", "--config", str(node_config(tmp_path, "b", [inline])), "--kmsg-path", "/dev/null"
    ).stdout
    assert (
        value(
            text, "clusterhealth_probe_placement_info", probe="fabric", leaf="l2", spine="", pod="", rail=""
        )
        == 1.0
    )


def test_how_a_group_pairs_is_logged_at_start(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    members = tmp_path / "members.yaml"
    members.write_text(
        "a: {address: 127.0.0.71, leaf: l1}\nb: {address: 127.0.0.72, leaf: l2}\nc: 127.0.0.73\n"
    )
    spec = group("fabric", {}, period_seconds=3600)
    del spec["members"]
    spec["members_file"] = str(members)
    agent = agent_process("--config", str(node_config(tmp_path, "a", [spec])))
    agent.wait_for(lambda: "pairwise group fabric: 3 members" in agent.log(), what="the start's log line")
    assert "pairs as one flat group (c without a leaf in the inventory)" in agent.log()
    members.write_text("a: {address: 127.0.0.71, leaf: l1}\nb: {address: 127.0.0.72, leaf: l2}\n")
    agent.signal(signal.SIGHUP)
    agent.wait_for(
        lambda: "pairs inside and across 2 leaves (this node on l1)" in agent.log(), what="a reload"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a: {address: 10.0.0.1, leaf: l1, switch: s3}\n",
            "line 1: member a: expected the keys address, leaf, spine, pod, rail, got switch",
        ),
        (
            "a: 10.0.0.1\nb: {address: 10.0.0.2, leaf: 'leaf 2'}\n",
            "line 2: member b: leaf: expected a name of letters",
        ),
        ("a: {leaf: l1}\n", "line 1: member a: expected an IP address or a host name, got None"),
    ],
)
def test_a_bad_place_in_the_members_file_exits_2_naming_the_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    members = tmp_path / "members.yaml"
    members.write_text(text)
    spec = group("fabric", {})
    del spec["members"]
    spec["members_file"] = str(members)
    done = run_cli("agent", "--config", str(node_config(tmp_path, "a", [spec])), "--print-config")
    assert done.returncode == 2
    assert "pairwise_groups[0].members_file: expected a members file" in done.stderr
    assert f"{members}: {expected}" in done.stderr, done.stderr


def test_stopping_the_agent_ends_the_probe_server_it_started(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    # The probe processes run in sessions of their own; a server still waiting for its partner
    # must not outlive the agent and hold the group's port.
    import psutil

    spec = group("fabric", {"a": "127.0.0.71", "never": "127.0.0.72"})
    agent = agent_process("--config", str(node_config(tmp_path, "a", [spec])))
    parent = psutil.Process(agent.proc.pid)
    children: list[psutil.Process] = []

    def probing() -> bool:
        children[:] = [c for c in parent.children(recursive=True) if "iperf3" in c.name()]
        return bool(children)

    agent.wait_for(probing, timeout=3 * PERIOD, what="an iperf3 child")
    assert agent.stop() == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[c.cmdline() for c in alive]}"


def test_probe_run_of_a_group_says_it_runs_in_the_agent(tmp_path: Path) -> None:
    config = node_config(tmp_path, "a", [group("fabric", {"a": "10.0.0.1", "b": "10.0.0.2"})])
    done = run_cli("probe", "run", "fabric", "--config", str(config))
    assert done.returncode == 2 and "fabric is a pairwise group: its rounds run in the agent" in done.stderr
