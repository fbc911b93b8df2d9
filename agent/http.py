"""The HTTP endpoints: /metrics (the cached exposition), /healthz (JSON) and a landing page."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from clusterhealth.agent import __version__
from clusterhealth.agent.exposition import CONTENT_TYPE, Exposition
from clusterhealth.agent.sampling import Sampler

log = logging.getLogger("clusterhealth.http")

LANDING = b"""<html><head><title>clusterhealth</title></head><body>
<h1>clusterhealth</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>
</body></html>
"""


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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops connections when many scrapers arrive at once.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hangs up mid-response is routine; anything else is worth one line.
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            log.debug("client %s went away: %s", client_address, err)
        else:
            log.error("error serving %s: %r", client_address, err)


class Server:
    """A threaded HTTP server on its own thread."""

    def __init__(
        self,
        listen: str,
        exposition: Exposition,
        samplers: Callable[[], Sequence[Sampler]],
        health_extra: Callable[[], dict[str, Any]] = dict,
    ):
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        handler = _make_handler(exposition, samplers, health_extra)
        self.httpd = _HTTPServer((host, int(port)), handler)
        self.address = self.httpd.server_address
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _make_handler(
    exposition: Exposition,
    samplers: Callable[[], Sequence[Sampler]],
    health_extra: Callable[[], dict[str, Any]],
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"clusterhealth/{__version__}"
        # Headers and body go out in two writes; with Nagle's algorithm the body would wait for
        # the client's delayed ACK of the headers (40 ms on Linux) on every keep-alive scrape.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
                body = exposition.render(gzipped)
                headers = {"Content-Type": CONTENT_TYPE}
                if gzipped:
                    headers["Content-Encoding"] = "gzip"
                self._send(200, body, headers)
            elif path == "/healthz":
                body = json.dumps(health(samplers(), health_extra()), indent=2).encode() + b"\n"
                self._send(200, body, {"Content-Type": "application/json"})
            elif path == "/":
                self._send(200, LANDING, {"Content-Type": "text/html; charset=utf-8"})
            else:
                self._send(404, b"not found\n", {"Content-Type": "text/plain"})

        def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(code)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a line per scrape would drown the events that matter

    return Handler
