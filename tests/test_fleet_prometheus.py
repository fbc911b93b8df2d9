"""The fleet's one Prometheus client (fleet/prometheus.py) against a local HTTP server that answers
as the stores do: Prometheus's ``warnings``, VictoriaMetrics' ``"isPartial": true``, API errors,
answers that are not the API's.

The answers are canned here: what a real Prometheus answers (warnings from a dead remote store,
isPartial through a proxy) is tested in tests/test_fabric_analyze_prometheus.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from clusterhealth.fleet.prometheus import IS_PARTIAL, NoVerdict, Prometheus

VECTOR = {"resultType": "vector", "result": [{"metric": {"node": "h1"}, "value": [1000, "1"]}]}

# query text -> (HTTP status, body)
ANSWERS: dict[str, tuple[int, bytes]] = {
    "whole": (200, json.dumps({"status": "success", "data": VECTOR}).encode()),
    # VictoriaMetrics' cluster: some vmstorage nodes did not answer.
    "vm_partial": (200, json.dumps({"status": "success", "isPartial": True, "data": VECTOR}).encode()),
    "vm_whole": (200, json.dumps({"status": "success", "isPartial": False, "data": VECTOR}).encode()),
    "warned": (
        200,
        json.dumps({"status": "success", "data": VECTOR, "warnings": ["remote_read: store down"]}).encode(),
    ),
    "bad_query": (
        400,
        json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).encode(),
    ),
    "not_json": (200, b"<html>a login page</html>"),
    "failed": (200, json.dumps({"status": "error", "error": "overloaded"}).encode()),
    "no_result": (200, json.dumps({"status": "success", "data": {"resultType": "vector"}}).encode()),
}


@pytest.fixture(scope="module")
def store() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
            status, body = ANSWERS[query]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def test_an_answer_flagged_is_partial_is_recorded_like_a_warning(store: str) -> None:
    client = Prometheus(store)
    assert client.query("whole", 1000) == VECTOR["result"]
    assert client.query("vm_whole", 1000) == VECTOR["result"]
    assert client.partial_since() == []
    # The data of a partial answer is still returned; what is missing is said beside it.
    assert client.query("vm_partial", 1000) == VECTOR["result"]
    assert client.partial_since() == [f"Prometheus answered with partial data: {IS_PARTIAL}"]


def test_warnings_are_said_once_and_counted_from_a_mark(store: str) -> None:
    client = Prometheus(store)
    client.query("warned", 1000)
    client.query("warned", 1000)
    assert client.partial_since() == ["Prometheus answered with partial data: remote_read: store down"]
    # A loop over one client (the remediator's) asks what the reads since its mark got.
    mark = client.mark()
    client.query("whole", 1000)
    assert client.partial_since(mark) == []
    client.query("vm_partial", 1000)
    client.query("warned", 1000)
    assert client.partial_since(mark) == [
        f"Prometheus answered with partial data: {IS_PARTIAL}",
        "Prometheus answered with partial data: remote_read: store down",
    ]
    assert client.requests == 5 and client.bytes_read > 0


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("bad_query", "answered 400: bad_data: parse error at char 3"),
        ("not_json", "did not answer as Prometheus's HTTP API does (not JSON)"),
        ("failed", "answered an error"),
        ("no_result", "answered without a result list"),
    ],
)
def test_an_answer_that_is_not_data_is_no_verdict_naming_the_server(
    store: str, query: str, said: str
) -> None:
    with pytest.raises(NoVerdict) as raised:
        Prometheus(store).query(query, 1000)
    assert said in str(raised.value) and store in str(raised.value)


def test_an_unreachable_server_is_no_verdict() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        with pytest.raises(NoVerdict, match="cannot reach Prometheus at"):
            Prometheus(url, timeout=5).query("whole", 1000)
