"""Parse the JSON that ``iperf3 -c HOST -J`` prints on the client side.

The shape is read from captures of Debian's iperf 3.12 (tests/fixtures/iperf3): ``start`` names
the peer (``connecting_to``) and the test (``test_start``), ``end.sum_sent`` and
``end.sum_received`` hold the totals for TCP and UDP alike, and a failure adds a top-level
``error`` string. iperf 3.12 exits 0 even when it writes ``error``, so the key, not the exit code,
says whether the test ran.

Outputs copied from a terminal carry debris around the JSON: the ``^C`` a terminal echoes (iperf3,
interrupted, still writes its JSON, right after it on the same line, with ``error`` "interrupt -
the client has terminated"), the shell prompt and command before it and the next prompt after it,
and lines iperf3 prints outside its JSON (``iperf3: error - unable to send control message: Broken
pipe`` after it, esnet/iperf issue 1143). The JSON object is found wherever it starts; an
``iperf3: error - ...`` line outside it is one of the run's errors too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from clusterhealth.checks.probe_parsers._common import ProbeKind, ProbeParse, Verdict, number_or_none

BITS_PER_BYTE = 8
# Where the JSON may start in a capture with debris; a bound on the attempts keeps garbage cheap.
_MAX_JSON_STARTS = 64
_ERROR_LINE = re.compile(r"^iperf3: error - .*$", re.MULTILINE)


@dataclass(frozen=True)
class Iperf3Result:
    peer_host: str | None
    peer_port: int | None
    protocol: str | None  # "TCP" or "UDP"
    reverse: bool | None  # -R: the server sent, the client received
    num_streams: int | None
    duration_seconds: float | None
    # As iperf3 reports them; received is what the receiving end counted, whichever end that is.
    received_bytes_per_second: float | None
    sent_bytes_per_second: float | None
    received_bytes: int | None
    sent_bytes: int | None
    retransmits: int | None  # TCP only, counted by the sender
    lost_percent: float | None  # UDP only
    jitter_ms: float | None  # UDP only
    version: str | None
    errors: tuple[str, ...]
    verdict: Verdict

    @property
    def bandwidth_bytes_per_second(self) -> float | None:
        # When the server vanishes mid-test iperf3 still writes end.sum_received, with zeros: the
        # receiver never reported. Only a finished test's figure is a measurement.
        return self.received_bytes_per_second if self.verdict == "ok" else None

    @property
    def peak_bandwidth_bytes_per_second(self) -> float | None:
        # The per-interval figures are the client's view (sender, or receiver under -R), so their
        # maximum is not comparable across runs.
        return None

    @property
    def wrong_values(self) -> int | None:
        return None

    @property
    def problem(self) -> str | None:
        return self.errors[0] if self.errors else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "iperf3",
            "peer_host": self.peer_host,
            "peer_port": self.peer_port,
            "protocol": self.protocol,
            "reverse": self.reverse,
            "num_streams": self.num_streams,
            "duration_seconds": self.duration_seconds,
            "received_bytes_per_second": self.received_bytes_per_second,
            "sent_bytes_per_second": self.sent_bytes_per_second,
            "received_bytes": self.received_bytes,
            "sent_bytes": self.sent_bytes,
            "retransmits": self.retransmits,
            "lost_percent": self.lost_percent,
            "jitter_ms": self.jitter_ms,
            "version": self.version,
            "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
            "peak_bandwidth_bytes_per_second": self.peak_bandwidth_bytes_per_second,
            "errors": list(self.errors),
            "verdict": self.verdict,
        }


def parse_iperf3(text: str) -> Iperf3Result:
    """Parse ``iperf3 -J`` client output, with or without terminal debris around the JSON. Never
    raises: bad input gives verdict incomplete."""
    try:
        document = json.loads(text)
        debris = ""
    except ValueError as exc:
        found = _json_amid_debris(text)
        if found is None:
            return _unparsable(f"not iperf3 JSON output (run the client with -J): {exc}")
        document, debris = found
    if not isinstance(document, dict):
        return _unparsable("not iperf3 JSON output: the top level is not an object")

    start = _object(document.get("start"))
    end = _object(document.get("end"))
    test_start = _object(start.get("test_start"))
    connecting_to = _object(start.get("connecting_to"))
    connected = start.get("connected")
    first_connection = _object(connected[0]) if isinstance(connected, list) and connected else {}
    received = _object(end.get("sum_received"))
    sent = _object(end.get("sum_sent"))

    errors: list[str] = []
    error = document.get("error")
    if isinstance(error, str) and error:
        errors.append(error)
    errors += _ERROR_LINE.findall(debris)
    verdict: Verdict
    if errors:
        verdict = "failed"
    elif received:
        verdict = "ok"
    else:
        verdict = "incomplete"
        errors.append("iperf3 JSON output has no end.sum_received: the test did not finish")

    peer_host = _str(connecting_to.get("host")) or _str(first_connection.get("remote_host"))
    peer_port = _int(connecting_to.get("port"))
    if peer_port is None:
        peer_port = _int(first_connection.get("remote_port"))
    reverse = _int(test_start.get("reverse"))
    return Iperf3Result(
        peer_host=peer_host,
        peer_port=peer_port,
        protocol=_str(test_start.get("protocol")),
        reverse=None if reverse is None else reverse != 0,
        num_streams=_int(test_start.get("num_streams")),
        duration_seconds=_float(test_start.get("duration")),
        received_bytes_per_second=_bytes_per_second(received.get("bits_per_second")),
        sent_bytes_per_second=_bytes_per_second(sent.get("bits_per_second")),
        received_bytes=_int(received.get("bytes")),
        sent_bytes=_int(sent.get("bytes")),
        retransmits=_int(sent.get("retransmits")),
        lost_percent=_float(received.get("lost_percent")),
        jitter_ms=_float(received.get("jitter_ms")),
        version=_str(start.get("version")),
        errors=tuple(errors),
        verdict=verdict,
    )


def _json_amid_debris(text: str) -> tuple[dict[str, Any], str] | None:
    """The first iperf3 JSON object in `text` and the text around it, or None."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(_MAX_JSON_STARTS):
        if start < 0:
            return None
        try:
            document, end = decoder.raw_decode(text, start)
        except ValueError:
            document, end = None, start
        if _is_iperf3_output(document):
            return document, text[:start] + "\n" + text[end:]
        start = text.find("{", start + 1)
    return None


def _is_iperf3_output(document: object) -> TypeGuard[dict[str, Any]]:
    # iperf3's top level has the objects "start" and "end" or the string "error" (iperf_api.c); an
    # object nested in it (a stream's interval, with numbers for "start" and "end") is not one.
    return isinstance(document, dict) and (
        isinstance(document.get("start"), dict)
        or isinstance(document.get("end"), dict)
        or isinstance(document.get("error"), str)
    )


def _unparsable(message: str) -> Iperf3Result:
    return Iperf3Result(
        peer_host=None,
        peer_port=None,
        protocol=None,
        reverse=None,
        num_streams=None,
        duration_seconds=None,
        received_bytes_per_second=None,
        sent_bytes_per_second=None,
        received_bytes=None,
        sent_bytes=None,
        retransmits=None,
        lost_percent=None,
        jitter_ms=None,
        version=None,
        errors=(message,),
        verdict="incomplete",
    )


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return number_or_none(value)


def _bytes_per_second(bits_per_second: object) -> float | None:
    bits = _float(bits_per_second)
    # A negative rate is no measurement (a hand-edited or corrupted file).
    return None if bits is None or bits < 0 else bits / BITS_PER_BYTE


def _remote_address(parse: ProbeParse) -> str | None:
    # The client's `start.connecting_to` or, on the server (`iperf3 -s -J`), `start.connected[0]`.
    return parse.peer_host if isinstance(parse, Iperf3Result) else None


KIND = ProbeKind(
    name="iperf3",
    parse=parse_iperf3,
    unit="Gbit/s",
    headline="received throughput (end.sum_received)",
    # `iperf3 -s -1` on one end, `iperf3 -c` on the other; with -J both ends print end.sum_received,
    # the same figure (the server's count, which the client receives at the end of the test).
    pairwise=True,
    remote_address=_remote_address,
)
