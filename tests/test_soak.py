"""A short load and soak of a real agent (issue 9): no error, no thread or file descriptor left behind.

The full figures (100 scrapers for a minute, 100,000 scrapes, RSS) come from benchmarks/soak.py
and live in docs/performance.md; nothing here is timed.
"""

from __future__ import annotations

import gzip
import http.client
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from .conftest import AgentProcess, samples, scenario

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"


def scrape(connection: http.client.HTTPConnection) -> None:
    connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    response = connection.getresponse()
    body = response.read()
    assert response.status == 200
    assert b"clusterhealth_gpu_up" in gzip.decompress(body)


def scraper(port: int, count: int, keep_alive: bool) -> list[str]:
    errors = []
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(count):
        try:
            scrape(connection)
        except (OSError, AssertionError, http.client.HTTPException) as err:
            errors.append(repr(err))
        if not keep_alive:
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.close()
    return errors


def census(pid: int) -> tuple[int, int]:
    process = psutil.Process(pid)
    return process.num_threads(), process.num_fds()


def every_collector_ran(agent: AgentProcess) -> bool:
    """Each collector the agent runs has finished a first run (its collector_success series is
    there): some hold a descriptor from then on (kernel_log its /dev/kmsg, rdma its counter
    files), which is no leak but must be in the census before it is taken."""
    running = set(agent.health()["collectors"])
    ran = {
        dict(labels)["collector"]
        for name, labels in samples(agent.metrics())
        if name == "clusterhealth_scrape_collector_success"
    }
    return bool(running) and running <= ran


def settled_census(pid: int) -> tuple[int, int]:
    """Threads and descriptors once they hold still for a second (ten readings alike): a
    collector's read opens a file for a moment, and the audit's read of the RDMA tree a few
    hundred."""
    readings: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        readings = [*readings[-9:], census(pid)]
        if len(readings) == 10 and len(set(readings)) == 1:
            return readings[0]
        time.sleep(0.1)
    raise AssertionError(f"threads and descriptors never held still: {readings}")


def no_leak(pid: int, threads: int, fds: int) -> bool:
    """Once the server has closed what the clients closed: no more threads or descriptors than before
    (a collector may close one of its own meanwhile). Judged on one reading, the last one waited for."""
    deadline = time.monotonic() + 10
    now_threads, now_fds = census(pid)
    while time.monotonic() < deadline and (now_threads != threads or now_fds > fds):
        time.sleep(0.1)
        now_threads, now_fds = census(pid)
    assert now_threads == threads and now_fds <= fds, (now_threads, now_fds, threads, fds)
    return True


def test_concurrent_and_sequential_scrapes_leave_nothing_behind(
    agent_process: Callable[..., AgentProcess], write_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("collectors:\n  gpu: {interval_seconds: 0.5}\n  rdma: {interval_seconds: 0.5}\n")
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(write_scenario(scenario())),
        "--sysfs-root",
        str(FIXTURES / "cluster-node" / "sys"),
    )
    agent.wait_for(lambda: every_collector_ran(agent), what="every collector's first run")
    port = int(agent.url.rsplit(":", 1)[1])
    threads, fds = settled_census(agent.proc.pid)

    # 40 concurrent scrapers, half of them opening a connection per scrape, while collectors run.
    with ThreadPoolExecutor(40) as pool:
        errors = [e for found in pool.map(lambda i: scraper(port, 25, i % 2 == 0), range(40)) for e in found]
    assert errors == []
    assert no_leak(agent.proc.pid, threads, fds)

    assert scraper(port, 2000, keep_alive=True) == []
    assert no_leak(agent.proc.pid, threads, fds)
    assert agent.health()["http"]["refused_total"] == 0
