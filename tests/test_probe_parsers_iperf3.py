"""iperf3 parser, tested on real `iperf3 -J` client captures (tests/fixtures/iperf3/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterhealth.checks.probe_parsers import parse
from clusterhealth.checks.probe_parsers.iperf3 import Iperf3Result, parse_iperf3

FIXTURES = Path(__file__).parent / "fixtures" / "iperf3"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_tcp_loopback() -> None:
    result = parse_iperf3(capture("01_tcp_loopback.json"))

    assert result.verdict == "ok"
    assert result.errors == ()
    assert result.peer_host == "127.0.0.1"
    assert result.peer_port == 59611
    assert result.protocol == "TCP"
    assert result.reverse is False
    assert result.num_streams == 1
    assert result.duration_seconds == 1.0
    # end.sum_received.bits_per_second / 8, and end.sum_sent for the sender's side.
    assert result.received_bytes_per_second == pytest.approx(1_641_815_445.4174755)
    assert result.sent_bytes_per_second == pytest.approx(1_646_715_454.5327342)
    assert result.received_bytes == 1647574934
    assert result.sent_bytes == 1647575040
    assert result.retransmits == 14
    assert result.lost_percent is None
    assert result.version == "iperf 3.12"
    assert result.bandwidth_bytes_per_second == pytest.approx(1_641_815_445.4174755)
    assert result.peak_bandwidth_bytes_per_second is None


def test_reverse_mode_still_reports_what_was_received() -> None:
    result = parse_iperf3(capture("02_tcp_reverse_loopback.json"))

    assert result.verdict == "ok"
    assert result.reverse is True
    assert result.peer_port == 59612
    assert result.bandwidth_bytes_per_second == pytest.approx(1_433_686_714.6319418)
    assert result.sent_bytes_per_second == pytest.approx(1_433_213_269.6499844)
    assert result.retransmits == 27


def test_udp_reports_loss_and_jitter_and_no_retransmits() -> None:
    result = parse_iperf3(capture("03_udp_100m_loopback.json"))

    assert result.verdict == "ok"
    assert result.protocol == "UDP"
    assert result.bandwidth_bytes_per_second == pytest.approx(12_508_994.973367844)
    assert result.received_bytes == 12517376
    assert result.retransmits is None
    assert result.lost_percent == 0
    assert result.jitter_ms == pytest.approx(0.04800420355264109)


def test_connection_refused_is_a_failure_with_iperf3s_message() -> None:
    result = parse("iperf3", capture("04_connection_refused.json"))

    assert isinstance(result, Iperf3Result)
    assert result.verdict == "failed"
    assert result.errors == ("unable to connect to server: Connection refused",)
    assert result.bandwidth_bytes_per_second is None
    assert result.received_bytes_per_second is None
    assert result.peer_host is None
    assert result.version == "iperf 3.12"


def test_server_killed_mid_test_reports_no_bandwidth() -> None:
    result = parse_iperf3(capture("05_server_killed_mid_test.json"))

    assert result.verdict == "failed"
    assert result.errors == ("the server has terminated",)
    # iperf3 writes the receiver's total as zero when the server never reported it.
    assert result.received_bytes_per_second == 0
    assert result.bandwidth_bytes_per_second is None
    assert result.sent_bytes == 2355363840
    assert result.peer_host == "127.0.0.1"
    assert result.duration_seconds == 3.0


@pytest.mark.parametrize(
    "name", sorted(p.name for p in FIXTURES.glob("*.json")) + sorted(p.name for p in FIXTURES.glob("*.txt"))
)
def test_to_dict_is_strict_json(name: str) -> None:
    result = parse_iperf3(capture(name))
    as_dict = json.loads(json.dumps(result.to_dict(), allow_nan=False))

    assert as_dict["verdict"] == result.verdict
    assert as_dict["bandwidth_bytes_per_second"] == result.bandwidth_bytes_per_second
    assert as_dict["errors"] == list(result.errors)


def test_truncated_json_is_incomplete() -> None:
    text = capture("01_tcp_loopback.json")
    result = parse_iperf3(text[: len(text) // 2])

    assert result.verdict == "incomplete"
    assert result.bandwidth_bytes_per_second is None
    assert result.errors[0].startswith("not iperf3 JSON output")


def test_json_without_end_sums_is_incomplete() -> None:
    document = json.loads(capture("01_tcp_loopback.json"))
    document["end"] = {}
    result = parse_iperf3(json.dumps(document))

    assert result.verdict == "incomplete"
    assert result.peer_host == "127.0.0.1"
    assert result.errors == ("iperf3 JSON output has no end.sum_received: the test did not finish",)


@pytest.mark.parametrize(
    "garbage",
    ["", "   ", "iperf3: error - unable to connect to server", "[1, 2, 3]", '"text"', "null", "{]"],
)
def test_garbage_is_incomplete_with_an_error(garbage: str) -> None:
    result = parse_iperf3(garbage)

    assert result.verdict == "incomplete"
    assert len(result.errors) == 1
    assert result.bandwidth_bytes_per_second is None


def test_a_negative_rate_is_no_bandwidth() -> None:
    # Found by tests/test_fuzz.py: a negative bits_per_second became a negative headline.
    document = json.loads(capture("01_tcp_loopback.json"))
    document["end"]["sum_received"]["bits_per_second"] = -1
    result = parse_iperf3(json.dumps(document))
    assert result.bandwidth_bytes_per_second is None
    assert result.received_bytes_per_second is None


def test_a_rate_too_large_for_a_float_is_no_bandwidth() -> None:
    # Found by tests/test_fuzz.py: float() of a 400-digit integer raised OverflowError.
    document = json.loads(capture("01_tcp_loopback.json"))
    document["end"]["sum_received"]["bits_per_second"] = 10**400
    result = parse_iperf3(json.dumps(document))
    assert result.bandwidth_bytes_per_second is None
    assert result.received_bytes_per_second is None


def test_json_after_the_terminals_ctrl_c_is_read_and_its_error_honoured() -> None:
    # The terminal echoed ^C and iperf3, interrupted, wrote its JSON right after it on that line.
    text = capture("06_client_interrupted_ctrl_c_terminal.txt")
    assert text.startswith("^C{")
    result = parse_iperf3(text)

    assert result.verdict == "failed"
    assert result.errors == ("interrupt - the client has terminated",)
    assert (result.peer_host, result.peer_port, result.version) == ("127.0.0.1", 59621, "iperf 3.12")
    assert result.bandwidth_bytes_per_second is None


def test_json_between_shell_prompts_is_read() -> None:
    text = capture("07_client_between_shell_prompts.txt")
    assert text.startswith("user@node01:~$ iperf3 -c") and text.endswith("user@node01:~$ exit\nexit\n")
    result = parse_iperf3(text)
    # The same figures as the JSON alone.
    alone = parse_iperf3(text[text.index("{") : text.rindex("}") + 1])

    assert result.verdict == "ok" and result.errors == ()
    assert result == alone
    assert result.bandwidth_bytes_per_second == pytest.approx(1695294825.1759393)


def test_iperf3s_own_error_line_after_its_json_fails_the_run() -> None:
    # esnet/iperf issue 1143: the client wrote its whole JSON, then this line outside it.
    text = capture("01_tcp_loopback.json") + "iperf3: error - unable to send control message: Broken pipe\n"
    result = parse_iperf3(text)

    assert result.verdict == "failed"
    assert result.errors == ("iperf3: error - unable to send control message: Broken pipe",)


@pytest.mark.parametrize("name", ["01_tcp_loopback.json", "04_connection_refused.json"])
def test_debris_around_the_json_changes_nothing(name: str) -> None:
    text = capture(name)
    debris = capture("07_client_between_shell_prompts.txt")
    before, after = debris[: debris.index("{")], debris[debris.rindex("}") + 1 :]
    assert parse_iperf3(before + text + after) == parse_iperf3(text)
    assert parse_iperf3("^C" + text) == parse_iperf3(text)


def test_an_object_nested_in_a_cut_json_is_not_taken_for_the_output() -> None:
    # Cut inside the intervals: the streams' objects decode, but they are not iperf3's top level.
    text = capture("01_tcp_loopback.json")
    cut = text[: text.index('"sum":')]
    assert '"streams":' in cut
    result = parse_iperf3(cut)

    assert result.verdict == "incomplete"
    assert result.errors[0].startswith("not iperf3 JSON output")
