"""The HTTP server over real sockets: methods, HEAD, Accept-Encoding, limits, idle and slow clients.

Protocol cases run against an in-process `Server` (the agent's own, on an exposition of the meta
series); the abuse cases of issue 11 run against a real `clusterhealth agent` process, whose
threads and file descriptors are counted from outside.
"""

from __future__ import annotations

import base64
import gzip
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import psutil
import pytest

from clusterhealth.agent import http, webconfig
from clusterhealth.agent.exposition import Exposition
from clusterhealth.agent.http import Server, accepts_gzip

from .conftest import AgentProcess, value
from .test_soak import settled_census

FIXTURES = Path(__file__).parent / "fixtures" / "sysfs"
CLUSTER = FIXTURES / "cluster-node" / "sys"


@pytest.fixture
def server() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(**options: object) -> Server:
        instance = Server("127.0.0.1:0", Exposition(lambda: []), lambda: [], **options)  # type: ignore[arg-type]
        instance.start()
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop()


def exchange(port: int, request: bytes, timeout: float = 5) -> bytes:
    """Send raw bytes, read until the server closes or goes quiet; the raw response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        return read_response(sock)


def read_response(sock: socket.socket) -> bytes:
    """One response: its head, then Content-Length bytes of body (or up to EOF)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        None,
    )
    while length is not None and len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def headers_of(response: bytes) -> dict[str, str]:
    head = response.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in head)}


def get(port: int, path: str = "/metrics", extra: str = "") -> bytes:
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode())


# --- basic auth --------------------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode() + "\r\n"


def test_requests_beyond_the_bcrypt_queue_get_503_not_an_answer(
    server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While bcrypt is busy and the queue of credentials waiting for it is full, a request with
    unverified credentials is answered 503 at once, whatever its password, and never let in."""
    monkeypatch.setattr(http, "MAX_PENDING_AUTH", 1)
    users = {"alice": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))}
    credentials = webconfig.Credentials(users)
    instance = server(web_config=webconfig.WebConfig(users=users, credentials=credentials))
    port = instance.address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as waiting:
        with credentials.checking:  # bcrypt is busy: the first request waits for it
            waiting.sendall(f"GET /metrics HTTP/1.1\r\nHost: t\r\n{basic('alice', 's3cret')}\r\n".encode())
            deadline = time.monotonic() + 5
            while instance.auth_pending < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert instance.auth_pending == 1
            for password in ("s3cret", "wrong"):
                response = get(port, extra=basic("alice", password))
                assert status_of(response) == 503, response
                assert headers_of(response)["retry-after"] == "1"
                assert b"clusterhealth_" not in response
        assert status_of(read_response(waiting)) == 200
    # Verified once, alice no longer waits for bcrypt, even while it is busy.
    with credentials.checking:
        assert status_of(get(port, extra=basic("alice", "s3cret"))) == 200


# --- methods and encodings -------------------------------------------------------------------


def test_head_answers_like_get_without_a_body(server: Callable[..., Server]) -> None:
    port = server().address[1]
    full = get(port)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.2)  # anything the server sent after the head would be here by now
        sock.settimeout(0.5)
        head = sock.recv(65536)
        # The connection stays usable: the next request gets the next response, not stray body bytes.
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(5)
        after = read_response(sock)
    assert status_of(head) == 200
    assert head.endswith(b"\r\n\r\n")  # no body
    assert headers_of(head)["content-length"] == headers_of(full)["content-length"] != "0"
    assert headers_of(head)["content-type"].startswith("text/plain; version=0.0.4")
    assert status_of(after) == 200 and b'"status"' in after


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        ("POST /metrics HTTP/1.1", 405),
        ("DELETE / HTTP/1.1", 405),
        ("OPTIONS * HTTP/1.1", 405),
        ("BREW /metrics HTTP/1.1", 501),
        ("PROPFIND /metrics HTTP/1.1", 501),
    ],
)
def test_other_methods_are_refused_and_the_server_goes_on(
    server: Callable[..., Server], request_line: str, status: int
) -> None:
    port = server().address[1]
    response = exchange(port, f"{request_line}\r\nHost: t\r\nContent-Length: 1000000\r\n\r\npartial".encode())
    assert status_of(response) == status
    headers = headers_of(response)
    assert headers["allow"] == "GET, HEAD"
    assert headers["connection"] == "close"
    assert status_of(get(port)) == 200


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("GZIP", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("gzip;q=0, deflate", False),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("*;q=0", False),
        ("gzip;q=0, *", False),  # an explicit gzip;q=0 wins over *
        ("identity", False),
        ("", False),
        ("gzip;q=nan", False),
        ("gzip;q=2", False),
        ("x-gzip", True),
        ("notgzip", False),
    ],
)
def test_accept_encoding_is_parsed_with_its_q_values(header: str, gzipped: bool) -> None:
    assert accepts_gzip(header) is gzipped


def test_gzip_q_0_gets_plain_text(server: Callable[..., Server]) -> None:
    port = server().address[1]
    plain = get(port, extra="Accept-Encoding: gzip;q=0\r\n")
    assert "content-encoding" not in headers_of(plain)
    assert b"clusterhealth_build_info" in plain
    zipped = get(port, extra="Accept-Encoding: gzip\r\n")
    assert headers_of(zipped)["content-encoding"] == "gzip"
    assert b"clusterhealth_build_info" in gzip.decompress(zipped.partition(b"\r\n\r\n")[2])


# --- limits ----------------------------------------------------------------------------------


def test_a_huge_request_head_gets_431(server: Callable[..., Server]) -> None:
    port = server().address[1]
    response = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    assert status_of(response) == 431
    many = "".join(f"X-{i}: {'b' * 50}\r\n" for i in range(2000))
    assert status_of(exchange(port, f"GET / HTTP/1.1\r\nHost: t\r\n{many}\r\n".encode())) == 431
    assert status_of(get(port)) == 200


def test_garbage_gets_400_and_the_server_goes_on(server: Callable[..., Server]) -> None:
    port = server().address[1]
    assert status_of(exchange(port, b"\x16\x03\x01\x02\x00 not http\r\n\r\n")) == 400
    assert status_of(get(port)) == 200


def test_a_slow_request_head_is_cut_off(server: Callable[..., Server]) -> None:
    port = server(request_timeout=0.5).address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(10):  # a byte at a time, each well within any per-read timeout
            try:
                sock.sendall(b"X")
            except OSError:
                break
            time.sleep(0.2)
        try:
            answer = sock.recv(100)
        except ConnectionResetError:  # our late bytes met the closed socket
            answer = b""
        assert answer == b""  # closed, without an answer


def test_idle_keep_alive_connections_are_closed(server: Callable[..., Server]) -> None:
    instance = server(idle_timeout=0.5)
    with socket.create_connection(("127.0.0.1", instance.address[1]), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status_of(read_response(sock)) == 200
        assert sock.recv(100) == b""  # the server closed the idle connection
    assert wait_until(lambda: instance.stats()["connections"] == 0)


def test_over_the_cap_the_longest_idle_connection_makes_room(server: Callable[..., Server]) -> None:
    instance = server(max_connections=20)
    port = instance.address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
    try:
        assert wait_until(lambda: instance.stats()["evicted_total"] >= 40)
        assert status_of(get(port)) == 200
        assert instance.stats()["connections"] <= 20
        assert idle[0].recv(10) == b""  # the first ones were closed to make room
    finally:
        for sock in idle:
            sock.close()


def test_connections_stuck_in_their_request_head_make_room_too(server: Callable[..., Server]) -> None:
    # Slowloris: every connection holds an unfinished request head. With no idle connection left,
    # the one that has been sending its head longest is closed for the newcomer.
    instance = server(max_connections=4)
    port = instance.address[1]
    slow = []
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")  # head never finished: reading
        slow.append(sock)
    try:
        assert wait_until(lambda: instance.stats()["connections"] == 4)
        # Reading connections make room too (the oldest first), so a scraper still gets in.
        assert status_of(get(port)) == 200
        assert instance.stats()["evicted_total"] >= 1
    finally:
        for sock in slow:
            sock.close()


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- the agent under idle-connection abuse (issue 11, "Found" 1) -----------------------------


def rdma_only(tmp_path: Path) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "collectors:\n  gpu: {enabled: false}\n  kernel_log: {enabled: false}\n  audit: {enabled: false}\n"
        "  rdma: {interval_seconds: 0.5}\n"
    )
    return config


def fd_limited_agent(tmp_path: Path, limit: int) -> AgentProcess:
    """An rdma-only agent that may open `limit` file descriptors. This process holds the client
    ends of the connections a test opens: its own limit is raised to allow them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 2048:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (2048 if hard == resource.RLIM_INFINITY else min(2048, hard), hard)
        )
    return AgentProcess(
        ["--config", str(rdma_only(tmp_path)), "--sysfs-root", str(CLUSTER)],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
    )


def census(pid: int) -> tuple[int, int]:
    process = psutil.Process(pid)
    return process.num_threads(), process.num_fds()


def test_hundreds_of_idle_and_half_open_connections_leave_scrapes_and_rdma_working(tmp_path: Path) -> None:
    """Before: 200 half-open requests held 200 threads for good; ~1,100 idle connections ran the
    agent out of file descriptors, scrapes got no answer, and rdma failed with EMFILE."""
    # A low file-descriptor limit, so that without a cap the connections below would exhaust it.
    limit = 512
    agent = fd_limited_agent(tmp_path, limit)
    try:
        port = int(agent.url.rsplit(":", 1)[1])
        agent.wait_for(lambda: "clusterhealth_rdma_port_state_id" in agent.metrics(), what="RDMA series")
        # Readings that hold still: a collector's read opens a file for a moment, which a loaded
        # machine catches more often.
        threads_before, fds_before = settled_census(agent.proc.pid)
        held: list[socket.socket] = []
        try:
            for i in range(700):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                if i % 3 == 0:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Slow: ")  # half-open request
                held.append(sock)
            time.sleep(1)  # several rdma cycles while the connections are held
            threads_during, fds_during = settled_census(agent.proc.pid)
            text = agent.metrics()  # a normal scraper is served
            health = agent.health()
        finally:
            for sock in held:
                sock.close()
        assert value(text, "clusterhealth_scrape_collector_success", collector="rdma") == 1
        assert health["collectors"]["rdma"]["success"] is True
        assert health["http"]["max_connections"] == limit // 4
        assert health["http"]["evicted_total"] >= 700 - limit // 4
        # No thread per connection, and file descriptors bounded by the cap.
        assert threads_during <= threads_before + 1
        assert fds_during <= fds_before + health["http"]["max_connections"] + 2
        emfile = [line for line in agent.lines if "Too many open files" in line]
        assert not emfile, emfile[:3]
        # Once they are gone, nothing is left behind.
        assert wait_until(lambda: census(agent.proc.pid)[1] <= fds_before + 1)
        assert census(agent.proc.pid)[0] == threads_before
    finally:
        agent.stop()


def test_a_starved_agent_accepts_a_flood_within_its_descriptor_limit(tmp_path: Path) -> None:
    """Before: asyncio accepted 100 connections a loop turn, and the connections the cap closed for
    them released their descriptors turns later, so an agent short of CPU while connections poured
    in (CI, a loaded node) went past a 512-descriptor limit: accept() and the collectors got EMFILE.

    The agent is stopped while 110 connections queue, then let run for 2 ms, twelve times over.
    """
    limit = 512
    agent = fd_limited_agent(tmp_path, limit)
    held: list[socket.socket] = []
    try:
        port = int(agent.url.rsplit(":", 1)[1])
        agent.wait_for(lambda: "clusterhealth_rdma_port_state_id" in agent.metrics(), what="RDMA series")
        for _ in range(12):
            agent.proc.send_signal(signal.SIGSTOP)
            for _ in range(110):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
                held.append(sock)
            time.sleep(0.05)  # the handshakes complete into the stopped agent's listen queue
            agent.proc.send_signal(signal.SIGCONT)
            time.sleep(0.002)
        emfile = [line for line in agent.lines if "Too many open files" in line]
        assert not emfile, emfile[:3]
        assert value(agent.metrics(), "clusterhealth_scrape_collector_success", collector="rdma") == 1
    finally:
        agent.proc.send_signal(signal.SIGCONT)
        for sock in held:
            sock.close()
        agent.stop()


def test_failing_accepts_do_not_spin_a_core(tmp_path: Path) -> None:
    """When accept() fails for want of file descriptors the server waits instead of retrying at once.

    A server whose cap is above its file-descriptor limit (the agent's own cap stays below it) is
    run in a child process; connections queue in its listen backlog that it cannot accept. CPU is
    compared with the spinning it replaces: a loop retrying accept() uses the whole wall time.
    """
    script = textwrap.dedent(
        """
        import resource, sys, time
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
        from clusterhealth.agent.exposition import Exposition
        from clusterhealth.agent.http import Server
        server = Server("127.0.0.1:0", Exposition(lambda: []), lambda: [], max_connections=1000)
        server.start()
        print(server.address[1], flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    held: list[socket.socket] = []
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        for _ in range(80):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        process = psutil.Process(child.pid)
        before = process.cpu_times()
        time.sleep(3)
        after = process.cpu_times()
        used = after.user - before.user + after.system - before.system
        assert used < 1.0, f"{used:.2f} s of CPU in 3 s with accept() failing"
    finally:
        for sock in held:
            sock.close()
        child.kill()
        child.wait()
