"""The HTTP endpoints: /metrics (the cached exposition), /healthz (JSON) and a landing page.

One event loop on one thread serves every connection (h11 parses HTTP/1.1), so idle or slow
clients cost a file descriptor and a few kilobytes each, never a thread, and are bounded:
- at most `max_connections` at once (256, less under a low file-descriptor limit, and accepted
  at most 100 at a time, fewer under such a limit, so that a burst fits too); a new
  connection over the cap closes the connection that has been idle longest (keep-alive between
  requests, or connected and silent), else the one that has been sending its request head
  longest; when every connection is busy answering, the new one is closed at once;
- a request head must arrive whole within `request_timeout` seconds of its first byte (of the
  connection for the first request; TLS handshake included) and be at most `max_head_bytes`
  (431 beyond); a keep-alive connection idle for `idle_timeout` seconds is closed; a response the
  client does not read within `write_timeout` seconds closes the connection;
- GET and HEAD are served; other methods get 405 (known methods) or 501, then the connection
  closes, any request body unread;
- when accept() fails for lack of file descriptors, asyncio stops accepting for a second instead
  of spinning.
TLS and basic auth come from the web config (agent/webconfig.py); bcrypt runs on one worker
thread, off the loop, and only for credentials not verified before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import ipaddress
import json
import logging
import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

import h11

from clusterhealth.agent import __version__
from clusterhealth.agent.exposition import CONTENT_TYPE, Exposition
from clusterhealth.agent.sampling import Sampler
from clusterhealth.agent.webconfig import NO_WEB_CONFIG, ConnectionRefused, Credentials, WebConfig

log = logging.getLogger("clusterhealth.http")

LANDING = b"""<html><head><title>clusterhealth</title></head><body>
<h1>clusterhealth</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>
</body></html>
"""

DEFAULT_MAX_CONNECTIONS = 256
LISTEN_BACKLOG = 128  # the kernel's queue of connections not accepted yet
ASYNCIO_ACCEPT_BATCH = 100  # what asyncio accepts in one go by default
DEFAULT_REQUEST_TIMEOUT = 10.0
# Longer than Prometheus's default 1 m scrape interval, so its keep-alive connection is reused.
DEFAULT_IDLE_TIMEOUT = 90.0
DEFAULT_WRITE_TIMEOUT = 30.0
DEFAULT_MAX_HEAD_BYTES = 16 * 1024
# Credentials waiting for bcrypt beyond this are answered 503 at once rather than queued.
MAX_PENDING_AUTH = 32
SWEEP_SECONDS = 0.25
KNOWN_METHODS = frozenset({b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"CONNECT"})
ALLOW = "GET, HEAD"


def health(samplers: Sequence[Sampler], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each collector's state, for /healthz: last success, its age, and why it is failing."""
    now_wall, now = time.time(), time.monotonic()
    collectors = {}
    for sampler in samplers:
        status = sampler.status(now)
        last = sampler.last_success_at
        collectors[sampler.name] = {
            "success": None if status.pending else status.success,
            "reason": status.reason,
            "last_success": _iso(last) if last else None,
            "last_success_age_seconds": (
                round(now - sampler.last_success_monotonic, 3) if sampler.last_success_monotonic else None
            ),
            "last_duration_seconds": round(status.snapshot.duration_seconds, 6) if status.snapshot else None,
            "interval_seconds": sampler.interval,
        }
    body = {
        "status": "degraded" if any(c["success"] is False for c in collectors.values()) else "ok",
        "version": __version__,
        "time": _iso(now_wall),
        "collectors": collectors,
    }
    body.update(extra or {})
    return body


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding header accepts gzip (RFC 9110 12.5.3: q=0 means "not this")."""
    if not header:
        return False
    gzip_q: float | None = None
    star_q: float | None = None
    for item in header.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # also NaN
                    q = 0.0
        coding = coding.lower()
        if coding in ("gzip", "x-gzip"):
            gzip_q = q if gzip_q is None else max(gzip_q, q)
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


class Server:
    """The HTTP(S) server, on its own thread; `reconfigure` swaps the web config while it runs."""

    def __init__(
        self,
        listen: str,
        exposition: Exposition,
        samplers: Callable[[], Sequence[Sampler]],
        health_extra: Callable[[], dict[str, Any]] = dict,
        *,
        web_config: WebConfig | None = None,
        max_connections: int | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
    ):
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, int(port)), family=family, backlog=LISTEN_BACKLOG)
        self._socket.setblocking(False)
        self.address = self._socket.getsockname()
        self.exposition = exposition
        self.samplers = samplers
        self.health_extra = health_extra
        self.web = web_config or NO_WEB_CONFIG
        self.max_connections = max_connections if max_connections is not None else default_max_connections()
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.max_head_bytes = max_head_bytes
        self.connections: dict[_Connection, None] = {}  # in the order they came
        self.evicted = 0
        self.refused = 0
        self.auth_pending = 0
        self._auth = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-auth")
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self._started = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._date = (0, "")

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)
        self._describe(self.web, starting=True)

    def stop(self) -> None:
        if self._thread.is_alive() and self._stopped is not None:
            self.loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(10)
        elif not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()  # never started
        self._auth.shutdown(wait=False, cancel_futures=True)
        self._socket.close()

    def reconfigure(self, web_config: WebConfig) -> None:
        """Apply a reloaded web config: new connections use its TLS settings, every request its auth."""
        old, self.web = self.web, web_config
        if (old.source, old.tls, old.authenticates) != (
            web_config.source,
            web_config.tls,
            web_config.authenticates,
        ):
            self._describe(web_config, starting=False)

    def _describe(self, web: WebConfig, starting: bool) -> None:
        host, port = self.address[:2]
        where = f"{host}:{port}"
        if web.tls or web.users:
            parts = ["TLS" if web.tls else "plain HTTP"]
            if web.client_auth_type != "NoClientCert":
                parts.append(f"client certificates ({web.client_auth_type})")
            if web.users:
                parts.append(f"basic auth ({len(web.users)} users)")
            log.info("%s on %s from %s", ", ".join(parts), where, web.source)
        if not web.authenticates and not _loopback(host):
            log.warning(
                "serving %s without authentication on %s, reachable beyond this host: anyone who "
                "reaches the port reads the node's metrics; set basic_auth_users or client certificates "
                "in --web-config-file, or --listen 127.0.0.1:%d",
                "/metrics" if starting else "/metrics (after reload)",
                where,
                port,
            )

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        # asyncio accepts up to `backlog` connections in one go, before any of them is admitted,
        # and the connections the cap closes for them release their descriptors a turn later: a
        # small batch keeps a burst within the HTTP quarter of a low descriptor limit. create_server
        # passes the same number to listen(); the kernel's queue is set back to its own size.
        # That `backlog` is also the accept batch is CPython's asyncio, not its documentation
        # (which names only listen()): BaseSelectorEventLoop._accept_connection runs
        # `for _ in range(backlog): sock.accept()` in CPython 3.10 to 3.13. Nothing here notices if
        # a release stops doing so; tests/test_http.py's
        # test_a_starved_agent_accepts_a_flood_within_its_descriptor_limit does.
        server = await self.loop.create_server(
            lambda: _Connection(self), sock=self._socket, backlog=accept_batch()
        )
        self._socket.listen(LISTEN_BACKLOG)
        sweeper = self.loop.create_task(self._sweep())
        self._started.set()
        try:
            await self._stopped.wait()
        finally:
            sweeper.cancel()
            server.close()
            for connection in list(self.connections):
                connection.abort()
            await server.wait_closed()

    async def _sweep(self) -> None:
        """Close connections past their deadline: a pass every quarter second costs less than a
        timer set and cancelled for every request."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            now = time.monotonic()
            for connection in [c for c in self.connections if c.deadline < now]:
                log.debug(
                    "http: closing a connection %s for %.1f s", connection.phase, now - connection.since
                )
                connection.abort()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # EMFILE on accept() lands here once per retry (asyncio pauses accepting for a second).
        error = context.get("exception")
        if isinstance(error, OSError):
            log.warning("http: %s: %s", context.get("message", "error"), error)
        else:
            loop.default_exception_handler(context)

    # -- connections --------------------------------------------------------------------------

    def admit(self, connection: _Connection) -> bool:
        """Make room for a new connection, or refuse it."""
        if len(self.connections) >= self.max_connections:
            victim = self._victim()
            if victim is None:
                self.refused += 1
                log.debug("http: %d connections, all busy: refusing one", len(self.connections))
                return False
            self.evicted += 1
            victim.abort()
        self.connections[connection] = None
        return True

    def _victim(self) -> _Connection | None:
        reading: _Connection | None = None
        for connection in self.connections:  # oldest first
            if connection.phase == "idle":
                return connection
            if connection.phase == "reading" and (reading is None or connection.since < reading.since):
                reading = connection
        return reading

    def forget(self, connection: _Connection) -> None:
        self.connections.pop(connection, None)

    def stats(self) -> dict[str, Any]:
        return {
            "connections": len(self.connections),
            "max_connections": self.max_connections,
            "evicted_total": self.evicted,
            "refused_total": self.refused,
            "tls": self.web.tls,
            "basic_auth": bool(self.web.users),
        }

    def date(self) -> str:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, email.utils.formatdate(now, usegmt=True))
        return self._date[1]

    # -- requests -----------------------------------------------------------------------------

    def authorize(self, web: WebConfig, path: str, header: bytes | None) -> bool | tuple[bytes, bytes]:
        """True or False, or the credentials bcrypt must check first (not verified before)."""
        if not web.needs_basic_auth(path):
            return True
        parsed = Credentials.parse(header.decode("latin-1") if header else None)
        if web.credentials is None or parsed is None:
            return False
        return True if web.credentials.known(*parsed) else parsed

    async def verify(self, web: WebConfig, credentials: tuple[bytes, bytes]) -> bool | None:
        """bcrypt on its own thread; None when too many credentials already wait for it."""
        if web.credentials is None:
            return False
        if self.auth_pending >= MAX_PENDING_AUTH:
            return None
        self.auth_pending += 1
        try:
            return await self.loop.run_in_executor(self._auth, web.credentials.verify, *credentials)
        finally:
            self.auth_pending -= 1

    def respond(
        self, method: bytes, target: bytes, accept_encoding: str | None
    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        path = target.split(b"?", 1)[0].decode("latin-1")
        if path == "/metrics":
            gzipped = accepts_gzip(accept_encoding)
            headers = [("Content-Type", CONTENT_TYPE), ("Vary", "Accept-Encoding")]
            if gzipped:
                headers.append(("Content-Encoding", "gzip"))
            return 200, self.exposition.render(gzipped, wait=False), headers
        if path == "/healthz":
            extra = {**self.health_extra(), "http": self.stats()}
            body = json.dumps(health(self.samplers(), extra), indent=2).encode() + b"\n"
            return 200, body, [("Content-Type", "application/json")]
        if path == "/":
            return 200, LANDING, [("Content-Type", "text/html; charset=utf-8")]
        return 404, b"not found\n", [("Content-Type", "text/plain; charset=utf-8")]


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def default_max_connections() -> int:
    """256, or a quarter of the file descriptors this process may open when that is less.

    The other three quarters stay for the collectors (sysfs, the kernel log, NVML, probes): a
    crowd of HTTP clients must never make the rdma collector fail with "Too many open files".
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(8, min(DEFAULT_MAX_CONNECTIONS, soft // 4))


def accept_batch() -> int:
    """How many connections the loop accepts in one go: asyncio's 100, or a sixteenth of the file
    descriptors this process may open when that is less."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ASYNCIO_ACCEPT_BATCH
    return max(8, min(ASYNCIO_ACCEPT_BATCH, soft // 16))


def _header(request: h11.Request, name: bytes) -> bytes | None:
    for key, value in request.headers:
        if key == name:
            return bytes(value)
    return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Connection(asyncio.Protocol):
    """One client connection: TLS (when configured), then HTTP/1.1 requests one after another."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.web = server.web  # this connection's TLS settings stay those it was accepted with
        self.transport: asyncio.Transport | None = None
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=server.max_head_bytes)
        # idle: no byte of a request yet; reading: a request head is arriving (or the TLS
        # handshake); busy: answering; closed.
        self.phase = "idle"
        self.since = time.monotonic()
        self.head_bytes = 0
        self.deadline = self.since + server.request_timeout
        self._task: asyncio.Task[None] | None = None
        self._write_paused = False

    # -- asyncio callbacks --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.server.admit(self):
            self.phase = "closed"
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Headers and body go out in one write; without this a small response could still
            # wait for the client's delayed ACK of the previous one on a keep-alive connection.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.web.ssl_context is not None:
            transport.pause_reading()  # nothing is read until TLS takes over the transport
            self._enter("reading", self.server.request_timeout)
            self._task = asyncio.ensure_future(self._start_tls(self.web.ssl_context))
        else:
            # A new connection gets a request timeout, not the idle one: it has not asked yet.
            self._enter("idle", self.server.request_timeout)

    def data_received(self, data: bytes) -> None:
        if self.phase == "idle":
            self._enter("reading", self.server.request_timeout)
        if self.phase == "reading":
            # h11 bounds a head still incomplete; one that arrives whole in a large read is
            # bounded here.
            self.head_bytes += len(data)
            if self.head_bytes > self.server.max_head_bytes:
                self._fail(431, f"request head over {self.server.max_head_bytes} bytes")
                return
        self.http.receive_data(data)
        self._next()

    def eof_received(self) -> bool | None:
        self.http.receive_data(b"")
        if self.phase in ("idle", "reading"):
            self.abort()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.phase = "closed"
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.server.forget(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        self.deadline = time.monotonic() + self.server.write_timeout
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.phase == "idle":
            self.deadline = time.monotonic() + self.server.idle_timeout
        if self.transport is not None and self.phase != "closed":
            self.transport.resume_reading()

    # -- states -------------------------------------------------------------------------------

    def _enter(self, phase: str, timeout: float) -> None:
        if phase == "idle":
            self.head_bytes = 0
        self.phase = phase
        self.since = time.monotonic()
        self.deadline = self.since + timeout

    def abort(self) -> None:
        if self.phase != "closed" and self.transport is not None:
            self.phase = "closed"
            self.transport.abort()

    async def _start_tls(self, context: ssl.SSLContext) -> None:
        assert self.transport is not None
        try:
            transport = await self.server.loop.start_tls(
                self.transport,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.server.request_timeout,
            )
            assert transport is not None
            self.web.check_peer(transport.get_extra_info("ssl_object"))
        except (OSError, ssl.SSLError, ConnectionRefused, asyncio.TimeoutError, ConnectionError) as err:
            log.debug("http: TLS handshake failed: %s", err)
            self.abort()
            return
        self.transport = transport
        self._task = None
        # The request may have come with the end of the handshake, and wait in h11's buffer.
        self._enter("reading" if self.http.trailing_data[0] else "idle", self.server.request_timeout)
        self._next()

    # -- HTTP ---------------------------------------------------------------------------------

    def _next(self) -> None:
        """Handle what h11 has parsed, unless a request is being answered."""
        while self.phase in ("idle", "reading") and self._task is None:
            try:
                event = self.http.next_event()
            except h11.RemoteProtocolError as err:
                self._fail(err.error_status_hint, str(err))
                return
            if event is h11.NEED_DATA:
                buffered = len(self.http.trailing_data[0])
                if self.phase == "idle" and buffered:  # part of a pipelined request
                    self._enter("reading", self.server.request_timeout)
                    self.head_bytes = buffered
                return
            if isinstance(event, h11.Request):
                self._enter("busy", self.server.write_timeout)
                if not self._dispatch(event):
                    return  # answered once bcrypt has checked the credentials
                continue
            if isinstance(event, h11.ConnectionClosed):
                self.abort()
                return
            # Data or EndOfMessage of a request already answered: nothing to do.

    def _dispatch(self, request: h11.Request) -> bool:
        """Answer a request now, or start checking its credentials (False while that runs)."""
        method = request.method
        if method not in (b"GET", b"HEAD"):
            code = 405 if method in KNOWN_METHODS else 501
            # Its body, if any, is not read: the connection closes after the answer.
            self._reply(request, code, f"{code} method not served here\n".encode(), [("Allow", ALLOW)], True)
            return True
        web = self.server.web
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        decision = self.server.authorize(web, path, _header(request, b"authorization"))
        if isinstance(decision, tuple):
            assert self.transport is not None
            self.transport.pause_reading()  # pipelined requests wait in the kernel, not here
            self._task = asyncio.ensure_future(self._verify_then_answer(request, web, decision))
            return False
        self._answer(request, decision)
        return True

    async def _verify_then_answer(
        self, request: h11.Request, web: WebConfig, credentials: tuple[bytes, bytes]
    ) -> None:
        try:
            verified = await self.server.verify(web, credentials)
        finally:
            self._task = None
        if self.phase == "closed":
            return
        if verified is None:
            self._reply(
                request, 503, b"too many requests waiting for authentication\n", [("Retry-After", "1")]
            )
        else:
            self._answer(request, verified)
        if self.phase in ("idle", "reading") and self.transport is not None:
            if not self._write_paused:
                self.transport.resume_reading()
            self._next()

    def _answer(self, request: h11.Request, authorized: bool) -> None:
        if not authorized:
            self._reply(
                request, 401, b"unauthorized\n", [("WWW-Authenticate", 'Basic realm="clusterhealth"')]
            )
            return
        try:
            encoding = _header(request, b"accept-encoding")
            status, body, extra = self.server.respond(
                request.method, request.target, encoding.decode("latin-1") if encoding else None
            )
        except Exception as err:  # a bug must cost one request, not the server
            log.error("http: error answering %r: %r", request.target, err)
            self._reply(request, 500, b"internal error\n", [], True)
            return
        self._reply(request, status, body, extra)

    def _reply(
        self,
        request: h11.Request,
        status: int,
        body: bytes,
        extra: list[tuple[str, str]],
        close: bool = False,
    ) -> None:
        self._send(status, body, extra, head=request.method == b"HEAD", close=close)
        self._after_response()

    def _send(self, status: int, body: bytes, extra: list[tuple[str, str]], head: bool, close: bool) -> None:
        assert self.transport is not None
        headers = [
            ("Server", f"clusterhealth/{__version__}"),
            ("Date", self.server.date()),
            *extra,
            *self.server.web.headers,
            ("Content-Length", str(len(body))),
        ]
        if close:
            headers.append(("Connection", "close"))
        try:
            out = self.http.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
            if not head and body:
                out += self.http.send(h11.Data(data=body))
            out += self.http.send(h11.EndOfMessage())
        except h11.LocalProtocolError as err:
            log.debug("http: cannot answer: %s", err)
            self.abort()
            return
        self.transport.write(out)

    def _after_response(self) -> None:
        if self.phase == "closed" or self.transport is None:
            return
        try:
            # The request's end (a GET has no body) is parsed but not yet taken from h11.
            while self.http.their_state is h11.SEND_BODY and self.http.next_event() is not h11.NEED_DATA:
                pass
        except h11.RemoteProtocolError:
            pass  # closed below: their side is not DONE
        if self.http.our_state is h11.MUST_CLOSE or self.http.their_state is not h11.DONE:
            self.phase = "closed"
            self.transport.close()  # after what is buffered is sent
            return
        try:
            self.http.start_next_cycle()
        except h11.LocalProtocolError:
            self.abort()
            return
        self._enter("idle", self.server.write_timeout if self._write_paused else self.server.idle_timeout)

    def _fail(self, status: int, reason: str) -> None:
        """A malformed or oversized request: answer it if HTTP still allows, then close."""
        log.debug("http: bad request (%d): %s", status, reason)
        if self.transport is not None and self.http.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = f"{status} bad request\n".encode()
            try:
                out = self.http.send(
                    h11.Response(
                        status_code=status,
                        headers=[("Content-Length", str(len(body))), ("Connection", "close")],
                        reason=_reason(status),
                    )
                )
                out += self.http.send(h11.Data(data=body)) + self.http.send(h11.EndOfMessage())
                self.transport.write(out)
            except h11.LocalProtocolError:
                pass
        if self.transport is not None and self.phase != "closed":
            self.phase = "closed"
            self.transport.close()
