"""Real Prometheus, Alertmanager and a webhook receiver for tests, on ports the kernel picks.

    with Prometheus(scrape_configs=[...], rule_files=[...], tmp=tmp_path) as prom:
        prom.wait_for(lambda: prom.query("up") != [], what="a first scrape")

The servers are the Debian packages' binaries (`prometheus`, `prometheus-alertmanager`), run as
subprocesses with a temporary config and data directory and stopped on exit. A missing binary
fails the test: `make test` installs the packages.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml


def binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make test` installs the Debian {package} package")
    return path


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports on loopback: all bound at once, since the kernel may hand a port
    just closed to the next bind (two `free_port()` calls in a row can answer the same port)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a free loopback port, in a thread of its own, for the block: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def flagging_partial(
    upstream: str, asked: list[dict[str, list[str]]] | None = None
) -> contextlib.AbstractContextManager[str]:
    """A proxy to the store at ``upstream`` that says every answer is partial, as a cluster store
    does (``"isPartial": true`` beside the data, no ``warnings``), recording each query's
    parameters in ``asked``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if asked is not None:
                asked.append(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query))
            with urllib.request.urlopen(upstream + self.path, timeout=60) as response:
                document = json.loads(response.read())
            document["isPartial"] = True
            body = json.dumps(document).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return serving(Handler)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, log: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if predicate():
                return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{log()}")


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


class _Server:
    """A server binary with a config file and a data directory under `tmp`."""

    name = ""
    package = ""
    ready_path = "/-/ready"  # answers 200 once it serves

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.tmp / f"{self.name}.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 30, f"{self.name} to be ready on {self.url}", self.log)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
        with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as response:
            return bool(response.status == 200)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Prometheus(_Server):
    name = "prometheus"
    package = "prometheus"

    def __init__(
        self,
        tmp: Path,
        scrape_configs: list[dict[str, Any]],
        rule_files: list[Path] = (),  # type: ignore[assignment]
        alertmanagers: list[str] = (),  # type: ignore[assignment]
        interval: str = "1s",
    ):
        super().__init__(tmp)
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        if alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
        self.config_path = self.tmp / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))

    def argv(self) -> list[str]:
        return [
            binary("prometheus", self.package),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def api(self, path: str, **params: str) -> Any:
        body = get_json(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples, or [] for an empty vector); errors raise."""
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, seconds: float, step: str = "1s") -> list[dict[str, Any]]:
        end = time.time()
        data = self.api("query_range", query=expr, start=str(end - seconds), end=str(end), step=step)
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def targets_up(self) -> int:
        return sum(1 for t in self.api("targets")["activeTargets"] if t["health"] == "up")


class Alertmanager(_Server):
    name = "alertmanager"
    package = "prometheus-alertmanager"

    def __init__(self, tmp: Path, config: dict[str, Any]):
        super().__init__(tmp)
        self.config_path = self.tmp / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def argv(self) -> list[str]:
        return [
            binary("prometheus-alertmanager", self.package),
            f"--config.file={self.config_path}",
            f"--storage.path={self.tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: a single instance, no port to collide on
            "--log.level=warn",
        ]

    def __enter__(self) -> Alertmanager:
        self.start()
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode(filters)
        return list(get_json(f"{self.url}/api/v2/alerts?{query}"))

    def post(self, alerts: list[dict[str, Any]]) -> None:
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200


def hurried(config: dict[str, Any], group_wait: str, ticket_group_wait: str) -> dict[str, Any]:
    """The Alertmanager example's waits shortened for a test of seconds, in the same order: a
    ticket waits longer than a page, so that the page that inhibits it has arrived."""
    route = config["route"]
    route.update(group_wait=group_wait, group_interval="1s", repeat_interval="1h")
    for child in route["routes"]:
        if "group_wait" in child:
            child["group_wait"] = ticket_group_wait
    return config


class Webhook:
    """An HTTP server that records what Alertmanager delivers: (path, payload) per request."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hook._lock:
                    hook.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def alerts(self, path: str | None = None) -> list[dict[str, Any]]:
        """Every alert delivered (to `path`), with the receiver that got it as `receiver`."""
        with self._lock:
            received = list(self.received)
        out = []
        for got_path, payload in received:
            if path is None or got_path == path:
                out += [{**alert, "receiver": payload["receiver"]} for alert in payload["alerts"]]
        return out

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def running(*servers: _Server) -> Iterator[None]:
    started: list[_Server] = []
    try:
        for server in servers:
            server.start()
            started.append(server)
        yield
    finally:
        for server in reversed(started):
            server.stop()


class VictoriaMetrics(_Server):
    """Single-node VictoriaMetrics (Debian's `victoria-metrics`), empty or scraping
    ``scrape_configs`` with its own scraper (-promscrape.config), with ``flags`` beside."""

    name = "victoria-metrics"
    package = "victoria-metrics"
    ready_path = "/health"

    def __init__(self, tmp: Path, scrape_configs: list[dict[str, Any]] = (), flags: list[str] = ()):  # type: ignore[assignment]
        super().__init__(tmp)
        self.flags = list(flags)
        self.config_path: Path | None = None
        if scrape_configs:
            self.config_path = self.tmp / "promscrape.yml"
            self.config_path.write_text(yaml.safe_dump({"scrape_configs": scrape_configs}))

    def argv(self) -> list[str]:
        argv = [
            binary("victoria-metrics", self.package),
            f"-storageDataPath={self.tmp / 'data'}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-loggerLevel=WARN",
            *self.flags,
        ]
        if self.config_path is not None:
            argv.append(f"-promscrape.config={self.config_path}")
        return argv

    def __enter__(self) -> VictoriaMetrics:
        self.start()
        return self

    def import_text(self, text: str) -> None:
        """Samples in the Prometheus text or OpenMetrics format, with their timestamps
        (/api/v1/import/prometheus), searchable on return."""
        request = urllib.request.Request(
            f"{self.url}/api/v1/import/prometheus", data=text.encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 204, response.status
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=60) as response:
            assert response.status == 200

    def query(self, expr: str, **params: str) -> list[dict[str, Any]]:
        body = get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr, **params})}")
        if body.get("status") != "success":
            raise AssertionError(f"{expr}: {body}")
        return list(body["data"]["result"])


class VMAlert(_Server):
    """vmalert (Debian's `victoria-metrics`) evaluating ``rules`` against ``datasource`` every
    ``interval``, writing the recording rules' series back to it (vmalert keeps none of its own),
    sending its alerts to ``notifier`` (an Alertmanager's address, or a `Webhook`'s)."""

    name = "vmalert"
    package = "victoria-metrics"
    ready_path = "/health"

    def __init__(
        self,
        tmp: Path,
        rules: Path,
        datasource: str,
        notifier: str,
        interval: str = "1s",
        flags: list[str] = (),  # type: ignore[assignment]
    ):
        super().__init__(tmp)
        self.rules, self.datasource, self.notifier, self.interval = rules, datasource, notifier, interval
        self.flags = list(flags)

    def argv(self) -> list[str]:
        return [
            binary("vmalert", self.package),
            f"-rule={self.rules}",
            f"-datasource.url={self.datasource}",
            f"-remoteWrite.url={self.datasource}",
            f"-remoteWrite.flushInterval={self.interval}",
            f"-notifier.url={self.notifier}",
            f"-evaluationInterval={self.interval}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-loggerLevel=WARN",
            *self.flags,
        ]

    def __enter__(self) -> VMAlert:
        self.start()
        return self

    def groups(self) -> list[dict[str, Any]]:
        """The groups and their rules as vmalert holds them (/api/v1/rules), with each rule's
        last error."""
        return list(get_json(f"{self.url}/api/v1/rules")["data"]["groups"] or [])

    def alerts(self) -> list[dict[str, Any]]:
        return list(get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"] or [])
