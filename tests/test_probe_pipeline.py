"""One probe run through every piece, as the agent will chain them: a real iperf3 over loopback.

lock -> idle guard -> template -> run (server and client) -> parse -> evaluate -> baseline.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probes import (
    BaselineStore,
    IdleGuard,
    ProbeLock,
    RunResult,
    evaluate,
    run,
    template,
)

from .conftest import require_tool


@pytest.fixture(autouse=True)
def _iperf3() -> None:
    require_tool("iperf3")


SERVER = ["iperf3", "-s", "-1", "-B", "{peer}", "-p", "{port}"]
CLIENT = ["iperf3", "-c", "{peer}", "-p", "{port}", "-t", "1", "-J"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
