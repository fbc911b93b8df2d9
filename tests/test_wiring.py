"""The wiring: one table of collectors, what they publish for each other, and how it runs.

In-process where the test needs to watch two collectors race (the simulated NVML library is
installed below pynvml, so the collectors make their real calls); the real command elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.agent.collectors import COLLECTORS, NAMES, Collectors
from clusterhealth.agent.node import Node
from clusterhealth.checks.audit_collector import AuditCollector
from clusterhealth.checks.audits import Status
from clusterhealth.exporters.sim import nvml as nvml_sim

from .conftest import AgentProcess, run_cli, samples, scenario, value

AgentFactory = Callable[..., AgentProcess]
GPU_CHECKS = ("gpu_lost", "gpu_ecc_uncorrectable", "gpu_row_remap", "gpu_pcie_link", "gpu_vbios", "gpu_count")
# The line the driver prints when a GPU falls off the bus (R535+), as /dev/kmsg hands it out.
XID_79_RECORD = "3,812,20000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=0, name=, GPU has fallen off the bus.\n"


def test_the_table_states_its_dependencies_in_order() -> None:
    seen: set[str] = set()
    for entry in COLLECTORS:
        assert set(entry.after) <= seen, f"{entry.name} waits for a collector listed after it"
        seen.add(entry.name)
        settings = entry.settings(configuration.Config())
        assert isinstance(settings.enabled, bool), entry.name
        assert settings.interval_seconds > 0 and settings.timeout_seconds > 0, entry.name
    assert len(set(NAMES)) == len(NAMES)


@pytest.fixture
def node_files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sys").mkdir()
    (tmp_path / "kmsg").write_text("")
    return {"paths.sysfs": str(tmp_path / "sys"), "paths.kmsg": str(tmp_path / "kmsg")}


def test_an_audit_never_sees_a_gpu_cycle_half_done(
    write_scenario: Callable[..., Path], node_files: dict[str, str]
) -> None:
    # Every GPU collection spends most of its interval in one slow NVML call; audits run all the
    # while. Each must judge the last finished cycle, never an empty state: a GPU that answers is
    # never UNKNOWN.
    slow = scenario(faults=[{"gpu": [0, 1], "hang": {"nvmlDeviceGetTemperature": 0.2}}])
    overrides = {
        **node_files,
        "simulate": str(write_scenario(slow)),
        "collectors.gpu.interval_seconds": 0.5,
        "collectors.gpu.gpm": False,
        "collectors.gpu.xid_events": False,
    }
    config = configuration.load(None, overrides)
    node = Node(config)
    collectors = Collectors(node)
    try:
        collectors.apply(config, only=("gpu",))
        (gpu,) = collectors.active
        deadline = time.monotonic() + 10
        while not gpu.settled() and time.monotonic() < deadline:
            time.sleep(0.01)
        audit = AuditCollector(
            config.policy,
            Path(config.paths.sysfs),
            lambda: node.gpu_state(config),
            lambda: node.recent_events(config),
        )
        generations, seen = set(), []
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            run = audit.run()
            seen += [r for r in run.results if r.check in GPU_CHECKS]
            status = gpu.status()
            generations.add(status.snapshot.generation if status.snapshot else None)
            time.sleep(0.01)
    finally:
        collectors.stop()
        node.close()
        nvml_sim.uninstall()
    assert len(generations) >= 3, "the GPU collector should have run several cycles meanwhile"
    assert {r.check for r in seen} >= {"gpu_lost", "gpu_ecc_uncorrectable", "gpu_row_remap"}
    unknown = [r for r in seen if r.status == Status.UNKNOWN]
    assert not unknown, unknown[0]


def _fast(**collectors: Any) -> dict[str, Any]:
    """Every collector of the table at short intervals (the audit's least is 1 s), and `collectors`."""
    fast: dict[str, dict[str, Any]] = {name: {"interval_seconds": 0.5} for name in NAMES}
    fast["audit"] = {"interval_seconds": 1}
    fast["gpu"]["gpm_min_window_seconds"] = 0.05
    for name, settings in collectors.items():
        fast[name] = {**fast[name], **settings}
    return {"collectors": fast}


def test_every_collector_of_the_table_is_in_scrape_and_healthz_unless_disabled(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    node_files: dict[str, str],
) -> None:
    simulated = str(write_scenario(scenario()))
    flags = [
        "--simulate",
        simulated,
        "--sysfs-root",
        node_files["paths.sysfs"],
        "--kmsg-path",
        node_files["paths.kmsg"],
    ]
    config_path = tmp_path / "clusterhealth.yaml"
    base = {**_fast(), "probing": {"state_dir": str(tmp_path / "state")}}
    config_path.write_text(yaml.safe_dump(base))

    def scraped(path: Path) -> set[str]:
        result = run_cli("scrape", "--config", str(path), *flags)
        assert result.returncode == 0, result.stderr
        return {
            dict(labels)["collector"]
            for name, labels in samples(result.stdout)
            if name == "clusterhealth_scrape_collector_success"
        }

    assert scraped(config_path) == set(NAMES)
    agent = agent_process("--config", str(config_path), *flags)

    def healthz_settled() -> set[str] | None:
        collectors = agent.health()["collectors"]
        return set(collectors) if all(c["success"] is not None for c in collectors.values()) else None

    agent.wait_for(lambda: healthz_settled() == set(NAMES), what="every collector in /healthz")
    for name in NAMES:
        one_off = dict(base, **_fast(**{name: {"enabled": False}}))
        config_path.write_text(yaml.safe_dump(one_off))
        assert scraped(config_path) == set(NAMES) - {name}
        agent.signal(signal.SIGHUP)
        agent.wait_for(
            lambda n=name: healthz_settled() == set(NAMES) - {n}, what=f"{name} gone from /healthz"
        )
        exposed = {
            dict(labels)["collector"]
            for metric, labels in samples(agent.metrics())
            if metric == "clusterhealth_scrape_collector_success"
        }
        assert exposed == set(NAMES) - {name}


def test_an_xid_79_in_the_kernel_log_counts_while_nvml_hangs_from_the_start(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    node_files: dict[str, str],
) -> None:
    # A node restarting with a wedged GPU: the first NVML call never returns. The kernel log
    # must still count the Xid 79 that says so, without asking NVML anything.
    Path(node_files["paths.kmsg"]).write_text(XID_79_RECORD)
    wedged = scenario(faults=[{"gpu": 0, "hang": {"nvmlDeviceGetUUID": 600}}])
    config_path = tmp_path / "clusterhealth.yaml"
    config_path.write_text(yaml.safe_dump(_fast(gpu={"timeout_seconds": 1})))
    agent = agent_process(
        "--config",
        str(config_path),
        "--simulate",
        str(write_scenario(wedged)),
        "--kmsg-path",
        node_files["paths.kmsg"],
        "--sysfs-root",
        node_files["paths.sysfs"],
    )
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_gpu_xid_errors_total", xid="79") == 1,
        timeout=15,
        what="the kernel log's Xid 79 counted",
    )
    text = agent.metrics()
    assert value(text, "clusterhealth_scrape_collector_success", collector="gpu") == 0
    assert value(text, "clusterhealth_scrape_collector_success", collector="kernel_log") == 1
    assert "running for" in agent.health()["collectors"]["gpu"]["reason"]


@pytest.mark.parametrize("command", ["scrape", "check"])
def test_one_shot_commands_answer_within_their_timeouts_when_nvml_hangs(
    command: str, write_scenario: Callable[..., Path], tmp_path: Path, node_files: dict[str, str]
) -> None:
    wedged = scenario(faults=[{"gpu": 1, "hang": {"nvmlDeviceGetMemoryInfo": 600}}])
    config_path = tmp_path / "clusterhealth.yaml"
    config_path.write_text(yaml.safe_dump({"collectors": {"gpu": {"timeout_seconds": 2}}}))
    # slurmd kills a HealthCheckProgram after 60 s: run_cli's limit fails the test past that.
    result = run_cli(
        command,
        "--config",
        str(config_path),
        "--simulate",
        str(write_scenario(wedged)),
        "--kmsg-path",
        node_files["paths.kmsg"],
        "--sysfs-root",
        node_files["paths.sysfs"],
        timeout=60,
    )
    if command == "scrape":
        assert result.returncode == 0, result.stderr
        assert value(result.stdout, "clusterhealth_scrape_collector_success", collector="gpu") == 0
        assert value(result.stdout, "clusterhealth_scrape_collector_success", collector="rdma") == 1
        assert value(result.stdout, "clusterhealth_gpu_up", gpu="0") is None  # withheld, not stale
    else:
        assert result.returncode == Status.UNKNOWN, result.stdout + result.stderr
        first = result.stdout.splitlines()[0]
        assert first.startswith("STATUS") or "UNKNOWN" in first
        assert "gpu collector has not finished" in result.stdout, result.stdout


def test_sigterm_while_nvml_init_hangs_exits(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    node_files: dict[str, str],
) -> None:
    wedged = scenario(system_hang={"nvmlInitWithFlags": 600})
    agent = agent_process(
        "--simulate",
        str(write_scenario(wedged)),
        "--kmsg-path",
        node_files["paths.kmsg"],
        "--sysfs-root",
        node_files["paths.sysfs"],
    )
    agent.wait_for(lambda: agent.health()["collectors"]["rdma"]["success"] is True, what="rdma collected")
    agent.signal(signal.SIGTERM)
    assert agent.proc.wait(15) == 0, agent.log()


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_sighup_during_a_hung_nvml_call_leaks_no_thread(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    node_files: dict[str, str],
) -> None:
    wedged = scenario(faults=[{"gpu": 0, "from_seconds": 1, "hang": {"nvmlDeviceGetPowerUsage": 600}}])
    config_path = tmp_path / "clusterhealth.yaml"
    config_path.write_text(yaml.safe_dump(_fast(gpu={"timeout_seconds": 1})))
    agent = agent_process(
        "--config",
        str(config_path),
        "--simulate",
        str(write_scenario(wedged)),
        "--kmsg-path",
        node_files["paths.kmsg"],
        "--sysfs-root",
        node_files["paths.sysfs"],
    )
    agent.wait_for(
        lambda: "running for" in (agent.health()["collectors"]["gpu"]["reason"] or ""), what="the hang"
    )
    before = _threads(agent.proc.pid)
    for n in range(20):
        # A change every other time, so that the gpu collector is rebuilt, not just kept.
        config_path.write_text(yaml.safe_dump(_fast(gpu={"timeout_seconds": 1 + n % 2})))
        agent.signal(signal.SIGHUP)
        agent.wait_for(lambda k=n + 1: agent.log().count("configuration reloaded") == k, what="reload")
    agent.wait_for(lambda: _threads(agent.proc.pid) <= before, timeout=10, what="no thread leak")
    reason = agent.health()["collectors"]["gpu"]["reason"]
    age = float(reason.split("running for ")[1].split("s")[0])
    assert age >= 2, reason  # the age of the one hung call, not of a fresh one started by a reload


def test_a_kernel_log_that_opens_but_cannot_be_read_is_unknown(
    agent_process: AgentFactory,
    write_scenario: Callable[..., Path],
    tmp_path: Path,
    node_files: dict[str, str],
) -> None:
    # A directory opens (O_RDONLY) and fails every read with EISDIR.
    unreadable = tmp_path / "kmsg.d"
    unreadable.mkdir()
    flags = ["--simulate", str(write_scenario(scenario())), "--kmsg-path", str(unreadable)]
    flags += ["--sysfs-root", node_files["paths.sysfs"]]
    result = run_cli("check", "--only", "gpu_xid", "--json", *flags)
    assert result.returncode == Status.UNKNOWN, result.stdout + result.stderr
    (xid,) = json.loads(result.stdout)["results"]
    assert xid["status"] == "UNKNOWN" and "could not be read" in xid["message"], xid
    config_path = tmp_path / "clusterhealth.yaml"
    config_path.write_text(yaml.safe_dump(_fast()))
    agent = agent_process("--config", str(config_path), *flags)
    agent.wait_for(
        lambda: value(agent.metrics(), "clusterhealth_check_status", check="gpu_xid") is not None,
        what="the audit",
    )
    text = agent.metrics()
    assert value(text, "clusterhealth_scrape_collector_success", collector="kernel_log") == 0
    assert value(text, "clusterhealth_check_status", check="gpu_xid") == Status.UNKNOWN


def test_reload_keeps_a_collector_whose_inputs_did_not_change(
    write_scenario: Callable[..., Path], node_files: dict[str, str]
) -> None:
    config = configuration.load(None, {**node_files, "simulate": str(write_scenario(scenario()))})
    node = Node(config)
    collectors = Collectors(node)
    try:
        collectors.apply(config, start=False)
        before = {s.name: s.collector for s in collectors.active}
        changed = dataclasses.replace(
            config,
            collectors=dataclasses.replace(
                config.collectors,
                rdma=dataclasses.replace(config.collectors.rdma, include_devices=("mlx5_*",)),
            ),
        )
        collectors.apply(changed, start=False)
        after = {s.name: s.collector for s in collectors.active}
    finally:
        collectors.stop()
        node.close()
        nvml_sim.uninstall()
    # The probes judge NCCL's transport by the RDMA devices the rdma collector selects: built anew.
    rebuilt = {"rdma", "probes"}
    assert all(after[name] is not before[name] for name in rebuilt)
    assert all(after[name] is before[name] for name in NAMES if name not in rebuilt)


class Recording:
    """A collector that records its lifecycle: the sampler's contract with every collector."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def start(self) -> None:
        self.events.append(f"start {self.name}")

    def collect(self) -> list[Any]:
        return []

    def close(self) -> None:
        self.events.append(f"close {self.name}")


def test_a_sampler_starts_and_closes_each_collector_once() -> None:
    from clusterhealth.agent.sampling import Sampler

    events: list[str] = []
    sampler = Sampler(Recording("a", events), 0.5, 1)
    sampler.start()
    sampler.start()  # resuming a running sampler starts nothing twice
    sampler.reconfigure(Recording("b", events), 0.5, 1)
    deadline = time.monotonic() + 5
    while "close a" not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    sampler.join(time.monotonic() + 5)
    assert events == ["start a", "start b", "close a", "close b"]
    # Enabled again after a stop: a new collector, started once, in a new loop.
    sampler.reconfigure(Recording("c", events), 0.5, 1)
    sampler.start()
    sampler.stop()
    sampler.join(time.monotonic() + 5)
    assert events[4:] == ["start c", "close c"]
    assert not sampler.alive


def test_collectors_run_at_their_own_phase_so_that_none_start_together() -> None:
    from clusterhealth.agent.collectors import PHASES
    from clusterhealth.agent.sampling import next_run

    # Once on its phase, every interval; a run started late or early is put back on it.
    assert next_run(30.25, 15, 0.25) == 45.25
    assert next_run(30.31, 15, 0.25) == 45.25
    assert next_run(3.0, 15, 0.25) == 15.25  # the first run, at start: on the phase from then on
    assert next_run(100.0, 2, 0.5) == 102.5  # at least half an interval after the last start
    # The default intervals are whole seconds: at distinct fractions of a second, the collectors'
    # starts over an hour never coincide.
    defaults = configuration.Config()
    starts: dict[float, str] = {}
    for entry in COLLECTORS:
        interval, phase = entry.settings(defaults).interval_seconds, PHASES[entry.name]
        at = next_run(0.0, interval, phase)
        while at < 3600:
            assert round(at % 1, 6) == round(phase, 6), entry.name
            at = next_run(at, interval, phase)
        starts[round(phase, 6)] = entry.name
    assert len(starts) == len(COLLECTORS)
