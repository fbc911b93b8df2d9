"""One probe run through every piece: a real iperf3 over loopback, first chained by hand, then
through the pipeline the scheduled probes and the pairwise meetings share (checks/probes/pipeline.py).

lock -> idle guard -> template -> run (server and client) -> parse -> evaluate -> baseline.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probes import (
    BaselineStore,
    IdleGuard,
    ProbeLock,
    ProbeOutcome,
    RunResult,
    evaluate,
    run,
    skipped,
    template,
)
from clusterhealth.checks.probes.pipeline import Job, Launch, Pipeline, StepResult, run_once

from .conftest import require_tool
from .prom import free_port


@pytest.fixture(autouse=True)
def _iperf3() -> None:
    require_tool("iperf3")


SERVER = ["iperf3", "-s", "-1", "-B", "{peer}", "-p", "{port}"]
CLIENT = ["iperf3", "-c", "{peer}", "-p", "{port}", "-t", "1", "-J"]


def listening(port: int) -> bool:
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.net_connections(kind="tcp4")
    )


def serve(values: dict[str, str]) -> tuple[threading.Thread, list[RunResult]]:
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(run(template(SERVER, values), timeout=30)))
    thread.start()
    deadline = time.monotonic() + 10
    while not listening(int(values["port"])):
        assert time.monotonic() < deadline, "iperf3 server did not start listening"
        time.sleep(0.05)
    return thread, results


def test_iperf3_probe_end_to_end(tmp_path: Path) -> None:
    values = {"peer": "127.0.0.1", "port": str(free_port())}
    store = BaselineStore(tmp_path / "state", min_runs=1)
    with ProbeLock(tmp_path / "probe.lock", "iperf3-loopback"):
        assert IdleGuard(None, ["false"], 5).check() is None
        server, served = serve(values)
        client = run(template(CLIENT, values), timeout=30)
        server.join(30)

        assert client.completed and client.exit_code == 0, client.stderr
        assert served[0].completed and served[0].exit_code == 0, "the one-off server did not finish"
        parsed = parse("iperf3", client.output)
        first = evaluate("iperf3", client, parsed, store.expected("iperf3-loopback"), 0.9)
        assert first.result == "ok", first.reason
        assert first.bandwidth_bytes_per_second is not None and first.bandwidth_bytes_per_second > 0
        assert store.learn("iperf3-loopback", values["peer"], first)
        learned = store.expected("iperf3-loopback", values["peer"])
        assert learned == first.bandwidth_bytes_per_second

        # Against a fabric a thousand times faster than this loopback, the same run is degraded.
        degraded = evaluate("iperf3", client, parsed, learned * 1000, 0.9)
        assert degraded.result == "degraded"
        assert not store.learn("iperf3-loopback", values["peer"], degraded)
        assert store.runs("iperf3-loopback", values["peer"]) == (learned,)


def test_iperf3_without_a_server_fails_with_its_own_words(tmp_path: Path) -> None:
    values = {"peer": "127.0.0.1", "port": str(free_port())}
    client = run(template(CLIENT, values), timeout=30)
    outcome = evaluate("iperf3", client, parse("iperf3", client.output), None, 0.9)
    assert outcome.result == "failed"
    assert "Connection refused" in outcome.reason


# --- the pipeline itself (checks/probes/pipeline.py), as the scheduled probes and the meetings run it


@pytest.fixture
def iperf3_server() -> Iterator[str]:
    """A real iperf3 server on loopback serving any number of tests; its port."""
    port = str(free_port())
    server = subprocess.Popen(["iperf3", "-s", "-B", "127.0.0.1", "-p", port], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not listening(int(port)):
        assert time.monotonic() < deadline, "iperf3 server did not start listening"
        time.sleep(0.05)
    yield port
    server.terminate()
    server.wait(10)


def pipeline(state: Path, busy_command: list[str] | None = None) -> Pipeline:
    return Pipeline(state, IdleGuard(None, busy_command, 5), BaselineStore(state, min_runs=1), 0.9, 1 << 20)


def test_a_run_through_the_pipeline_learns_its_baseline_under_the_lock(
    tmp_path: Path, iperf3_server: str
) -> None:
    line = pipeline(tmp_path / "state")
    values = {"peer": "127.0.0.1", "port": iperf3_server}
    holders: list[str | None] = []

    def step(launch: Launch) -> StepResult:
        holders.append(ProbeLock(line.lock_path).holder())
        return run_once(30)(launch)

    played = line.play(Job("loopback", "iperf3", CLIENT, lambda: values, baseline_peer="127.0.0.1"), step)
    assert holders == [f"pid {os.getpid()} probe loopback"], "the tool runs under the probe lock"
    assert played.outcome.result == "ok", played.outcome.reason
    assert played.command.startswith("iperf3 -c 127.0.0.1 -p ")
    bandwidth = played.outcome.bandwidth_bytes_per_second
    assert bandwidth is not None and line.baselines.runs("loopback", "127.0.0.1") == (bandwidth,)
    assert line.baselines.runs("loopback") == (), "learned under its peer"
    after = ProbeLock(line.lock_path)
    assert after.acquire(), "and released after"
    after.release()

    # A configured expectation is used as is, and nothing is learned from the run, good as it is.
    held = Job("loopback", "iperf3", CLIENT, lambda: values, expect="1 Mb/s", baseline_peer="127.0.0.1")
    played = line.play(held, run_once(30))
    assert played.outcome.result == "ok" and played.outcome.expected_bytes_per_second == 125e3
    assert line.baselines.runs("loopback", "127.0.0.1") == (bandwidth,)

    # A group's meetings learn one baseline for all partners, and are held to it.
    group = Job("fabric", "iperf3", CLIENT, lambda: values)
    first = line.play(group, run_once(30))
    assert line.baselines.runs("fabric") == (first.outcome.bandwidth_bytes_per_second,)
    second = line.play(group, run_once(30))
    assert second.outcome.expected_bytes_per_second == first.outcome.bandwidth_bytes_per_second


def test_a_locked_or_busy_node_is_skipped_before_the_command_is_built(tmp_path: Path) -> None:
    asked: list[str] = []

    def values() -> dict[str, str]:
        asked.append("values")
        return {"peer": "127.0.0.1"}

    def step(launch: Launch) -> StepResult:
        asked.append("step")
        return StepResult(skipped("not reached"))

    job = Job("p", "iperf3", ["true", "{peer}"], values)
    line = pipeline(tmp_path / "state")
    with ProbeLock(line.lock_path, "another-agent"):
        played = line.play(job, step)
    assert played == StepResult(
        skipped(f"another probe holds {line.lock_path}: pid {os.getpid()} probe another-agent")
    )
    busy = pipeline(tmp_path / "state", ["true"]).play(job, step)
    assert busy.outcome.result == "skipped" and busy.outcome.reason.startswith("busy command exited 0")
    assert asked == [], "nothing asked, nothing run"

    unknown = line.play(Job("p", "iperf3", ["true", "{nope}"], values), step)
    assert unknown == StepResult(
        ProbeOutcome(
            "failed", "cannot build the command: argument '{nope}': unknown placeholder {nope}; known: {peer}"
        )
    )
    assert asked == ["values"]

    (tmp_path / "file").write_text("")
    unlockable = pipeline(tmp_path / "file" / "state").play(job, step)
    assert unlockable.outcome.result == "failed"
    assert unlockable.outcome.reason.startswith(
        f"cannot take the probe lock {tmp_path}/file/state/probe.lock: "
    )


def test_the_idle_guard_is_asked_again_right_before_launch(tmp_path: Path) -> None:
    # Idle when the lock is taken, busy by the time the tool would start: it must not start.
    calls, ran = tmp_path / "busy-calls", tmp_path / "ran"
    busy = ["sh", "-c", f'echo x >> {calls}; [ "$(wc -l < {calls})" -gt 1 ]']
    job = Job("p", "iperf3", ["touch", str(ran)], dict)
    played = pipeline(tmp_path / "state", busy).play(job, run_once(30))
    assert played.outcome.result == "skipped" and "busy command exited 0" in played.outcome.reason
    assert calls.read_text().count("x") == 2 and not ran.exists()
