"""The /dev/kmsg reader: record parsing, files and FIFOs, ring-buffer overruns, bounded reads."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.checks import kmsg
from clusterhealth.checks.kernel_log import KernelEvent, parse_line
from clusterhealth.checks.kmsg import KmsgReader, KmsgRecord, parse_record

KMSG_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kmsg"
EXPECTED: list[dict[str, Any]] = json.loads((KMSG_FIXTURES / "expected.json").read_text(encoding="utf-8"))


# Printable ASCII but the backslash: the bytes the kernel leaves as they are.
_PLAIN = re.compile(rb"[\x20-\x5b\x5d-\x7e]*")


def kernel_escape(text: str) -> bytes:
    """Escape a message the way the kernel's msg_add_ext_text() does for /dev/kmsg."""
    raw = text.encode("utf-8")
    if _PLAIN.fullmatch(raw):
        return raw
    return b"".join(
        b"\\x%02x" % byte if byte < 0x20 or byte >= 0x7F or byte == 0x5C else bytes((byte,)) for byte in raw
    )


def kmsg_record(
    seq: int, message: str, *, prefix: int = 6, usec: int = 5678901, pci: str | None = None
) -> bytes:
    """A record as /dev/kmsg prints it, with the dictionary the kernel adds for a PCI device."""
    raw = b"%d,%d,%d,-;%s\n" % (prefix, seq, usec, kernel_escape(message))
    if pci is not None:
        raw += b" SUBSYSTEM=pci\n DEVICE=+pci:%s\n" % pci.encode()
    return raw


def outcome(event: KernelEvent | None) -> tuple[str | None, str | None, int | None]:
    return (event.kind, event.pci, event.code) if event else (None, None, None)


class ScriptedRead:
    """Stands in for os.read on /dev/kmsg: hands out one scripted record or error per call."""

    def __init__(self, script: Iterable[bytes | OSError]) -> None:
        self.script = list(script)
        self.calls: list[int] = []

    def __call__(self, fd: int, size: int) -> bytes:
        self.calls.append(size)
        if not self.script:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        step = self.script.pop(0)
        if isinstance(step, OSError):
            raise step
        return step


def device_reader(script: Iterable[bytes | OSError], start: str = "boot") -> tuple[KmsgReader, ScriptedRead]:
    """A reader in character-device mode: /dev/null is opened for real, reads are scripted."""
    read = ScriptedRead(script)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    reader = KmsgReader(os.devnull, "now" if start == "now" else "boot", read=read)
    return reader, read


# --- parse_record -------------------------------------------------------------------------------


def test_parse_record_from_the_kernel_documentation() -> None:
    raw = (KMSG_FIXTURES / "kmsg_records.txt").read_bytes().split(b"\n6,339,")[0] + b"\n"
    assert parse_record(raw) == KmsgRecord(
        priority=7,
        facility=0,
        sequence=160,
        timestamp_us=424069,
        flags="-",
        message="pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
        dictionary={"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A03:00"},
    )


def test_parse_record_splits_priority_and_facility() -> None:
    record = parse_record(b"30,340,5690716,-;udevd[80]: starting version 181\n")
    assert record is not None
    assert (record.facility, record.priority) == (3, 6)  # daemon.info
    record = parse_record(b"47,1639,370063740,-;systemd-journald[301]: Sent WATCHDOG=1 notification.\n")
    assert record is not None
    assert (record.facility, record.priority) == (5, 7)  # syslog.debug


def test_parse_record_unescapes_the_kernel_escapes() -> None:
    record = parse_record(b"3,1278,295982345,-;enp7s0: cmd = 0xff, should be 0x07 \\x0a.\n")
    assert record is not None
    assert record.message == "enp7s0: cmd = 0xff, should be 0x07 \n."
    # Every byte of a UTF-8 character is escaped separately, and so is the backslash itself.
    record = parse_record(b"6,1,2,-;" + kernel_escape("фев C:\\x41 tab\there") + b"\n")
    assert record is not None
    assert record.message == "фев C:\\x41 tab\there"


def test_parse_record_replaces_invalid_utf8() -> None:
    record = parse_record(b"6,1,2,-;bad \\xff byte\n")
    assert record is not None
    assert record.message == "bad \ufffd byte"


def test_parse_record_fragment_flag_and_leading_space_in_message() -> None:
    record = parse_record(b"4,1594,363524300,c; intel_gtt\n")
    assert record is not None
    assert (record.flags, record.message) == ("c", " intel_gtt")


def test_parse_record_ignores_unknown_header_fields() -> None:
    record = parse_record(b"6,100,2,-,caller=T123;something happened\n")
    assert record is not None
    assert (record.sequence, record.timestamp_us, record.message) == (100, 2, "something happened")


def test_parse_record_pci_device_from_dictionary() -> None:
    record = parse_record(kmsg_record(1234, "pcieport 0000:00:02.0: AER: x", pci="0000:00:02.0"))
    assert record is not None
    assert record.dictionary == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:00:02.0"}
    assert record.pci_device == "0000:00:02.0"
    record = parse_record(b"6,1,2,-;no device\n")
    assert record is not None
    assert record.pci_device is None


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\n",
        b"no header at all\n",
        b"6,1,2,- no semicolon\n",
        b"6,1;too few fields\n",
        b"x,1,2,-;not a number\n",
        b"6,-1,2,-;negative sequence\n",
        b"6, 1,2,-;space in a number\n",
        b"6,1_000,2,-;underscore in a number\n",
        b"6,1,2,-;fine header\nbut a stray line\n",
        b"\x00\xff\xfe",
    ],
)
def test_parse_record_rejects_garbage(garbage: bytes) -> None:
    assert parse_record(garbage) is None


THOUSANDS_OF_DIGITS = b"9" * 5000


@pytest.mark.parametrize(
    "absurd",
    [
        THOUSANDS_OF_DIGITS + b",1,2,-;prefix",
        b"6," + THOUSANDS_OF_DIGITS + b",2,-;sequence",
        b"6,1," + THOUSANDS_OF_DIGITS + b",-;timestamp",
        b"2048,1,2,-;a facility wider than the kernel's u8",
        b"6,18446744073709551616,2,-;a sequence number past u64",
        b"6,1,18446744073709551616,-;a timestamp past u64",
        b"6,000000000000000000001,2,-;21 digits",
    ],
)
def test_parse_record_rejects_numbers_no_kernel_prints(absurd: bytes) -> None:
    assert parse_record(absurd) is None


def test_parse_record_takes_the_largest_numbers_the_kernel_prints() -> None:
    record = parse_record(b"2047,18446744073709551615,18446744073709551615,-;edge")
    assert record is not None
    assert (record.facility, record.priority) == (255, 7)
    assert record.sequence == record.timestamp_us == (1 << 64) - 1


@pytest.mark.parametrize("entry", EXPECTED, ids=[f"{i:02d}" for i in range(len(EXPECTED))])
def test_fixture_line_through_a_kmsg_record(entry: dict[str, Any]) -> None:
    # The shared lines, turned into what /dev/kmsg would give, still parse to the expected event.
    record = parse_record(kmsg_record(1234, entry["line"], pci="0000:3b:00.0"))
    assert record is not None
    assert record.message == entry["line"]
    assert outcome(parse_line(record.message)) == (entry["kind"], entry["pci"], entry["code"])


# --- the reader on a regular file ---------------------------------------------------------------


def test_reader_on_a_capture_file(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes((KMSG_FIXTURES / "kmsg_records.txt").read_bytes())
    with KmsgReader(str(path), "boot") as reader:
        records = reader.read_available(1000)
        assert [r.sequence for r in records][:4] == [160, 339, 340, 1278]
        assert len(records) == 23
        assert records[0].dictionary == {"SUBSYSTEM": "acpi", "DEVICE": "+acpi:PNP0A03:00"}
        assert records[3].message == "enp7s0: cmd = 0xff, should be 0x07 \n."
        assert reader.malformed_records == 0
        assert reader.last_sequence == 1639
        assert reader.read_available(1000) == []  # end of file: nothing more now


def test_reader_end_to_end_with_the_shared_lines(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(b"".join(kmsg_record(1000 + i, e["line"], pci=e["pci"]) for i, e in enumerate(EXPECTED)))
    with KmsgReader(str(path)) as reader:
        records = reader.read_available(7)
        while batch := reader.read_available(7):
            assert len(batch) <= 7
            records += batch
    assert [r.message for r in records] == [e["line"] for e in EXPECTED]
    assert (reader.lost_records, reader.malformed_records) == (0, 0)
    for record, entry in zip(records, EXPECTED, strict=True):
        assert outcome(parse_line(record.message)) == (entry["kind"], entry["pci"], entry["code"])
        if entry["pci"] is not None:
            assert record.pci_device == entry["pci"]


def test_reader_follows_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(kmsg_record(1, "first"))
    with KmsgReader(str(path)) as reader, path.open("ab", buffering=0) as log:
        assert [r.message for r in reader.read_available(10)] == ["first"]
        log.write(b"6,2,10,-;second, written in two hal")
        assert reader.read_available(10) == []  # a line without its newline waits
        log.write(b"ves\n")
        assert [r.message for r in reader.read_available(10)] == ["second, written in two halves"]


def records(*sequences: int) -> bytes:
    return b"".join(kmsg_record(seq, f"message {seq}") for seq in sequences)


def messages(reader: KmsgReader) -> list[str]:
    return [r.message for r in reader.read_available(100)]


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(records(1, 2, 3))
    with KmsgReader(str(path)) as reader:
        assert messages(reader) == ["message 1", "message 2", "message 3"]
        path.write_bytes(records(4, 5))  # truncated, then written: what logrotate's copytruncate does
        assert messages(reader) == ["message 4", "message 5"]
        assert messages(reader) == []
    assert (reader.restarts, reader.repeated_records, reader.lost_records, reader.malformed_records) == (
        1,
        0,
        0,
        0,
    )


def test_a_file_rewritten_with_its_old_records_counts_none_twice(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(records(1, 2, 3, 4))
    with KmsgReader(str(path)) as reader:
        assert len(messages(reader)) == 4
        path.write_bytes(records(2, 3))  # shorter than what was read: truncated and rewritten
        assert messages(reader) == []
        with path.open("ab") as log:
            log.write(records(4, 5))
        assert messages(reader) == ["message 5"]
    assert (reader.restarts, reader.repeated_records, reader.lost_records) == (1, 3, 0)


def test_a_rotated_file_is_read_to_its_end_then_the_new_one_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(records(1, 2))
    with KmsgReader(str(path)) as reader:
        assert messages(reader) == ["message 1", "message 2"]
        with path.open("ab") as log:
            log.write(records(3))  # written just before the rotation
        path.rename(tmp_path / "kmsg.txt.1")
        assert messages(reader) == ["message 3"]  # the new file does not exist yet
        path.write_bytes(records(4, 5))
        assert messages(reader) == ["message 4", "message 5"]
        (tmp_path / "kmsg.txt.1").write_bytes(records(99))  # the old file is no longer read
        with path.open("ab") as log:
            log.write(records(6))
        assert messages(reader) == ["message 6"]
    assert (reader.restarts, reader.lost_records, reader.malformed_records) == (1, 0, 0)


def test_a_line_cut_short_by_a_truncation_is_skipped_as_malformed(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(records(1) + b"6,2,10,-;half a rec")
    with KmsgReader(str(path)) as reader:
        assert messages(reader) == ["message 1"]
        path.write_bytes(records(3))
        assert messages(reader) == ["message 3"]
    assert (reader.restarts, reader.malformed_records) == (1, 1)


def test_a_rotated_file_replaced_by_a_directory_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(records(1))
    with KmsgReader(str(path)) as reader:
        assert messages(reader) == ["message 1"]
        path.rename(tmp_path / "old")
        path.mkdir()
        assert messages(reader) == []
    assert reader.restarts == 0


def test_start_now_on_a_file_skips_what_is_there(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(kmsg_record(1, "old") + kmsg_record(2, "older"))
    with KmsgReader(str(path), "now") as reader, path.open("ab") as log:
        assert reader.read_available(10) == []
        log.write(kmsg_record(3, "new"))
        log.flush()
        assert [r.message for r in reader.read_available(10)] == ["new"]
        assert reader.lost_records == 0


def test_garbage_in_a_file_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    lines = [
        b" DEVICE=+pci:0000:00:01.0",  # a dictionary line without its record
        b"6,1,2,-;good one",
        b"this is not a record",
        b"",
        b"\xff\xfe\x00 binary junk",
        b"6,2,3,-;" + b"x" * (3 * kmsg.READ_SIZE),  # longer than any kernel record
        b"6,3,4,-;good two",
        b"6,4,5,-;dictionary too long",
        b" KEY=" + b"v" * (kmsg.READ_SIZE - 100),
        b" KEY2=" + b"v" * 200,
        b" KEY3=more of the same record",
        b"6,5,6,-;good three",
    ]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    with KmsgReader(str(path)) as reader:
        records = reader.read_available(100)
    assert [r.message for r in records] == ["good one", "good two", "good three"]
    assert reader.malformed_records == 5
    # Records 2 and 4 were unreadable, not lost.
    assert reader.lost_records == 0


def test_a_record_with_an_absurd_number_is_skipped_and_the_rest_is_read(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(
        kmsg_record(1, "before")
        + b"6," + THOUSANDS_OF_DIGITS + b",2,-;absurd sequence\n"
        + kmsg_record(3, "after")
        + b"6,4," + THOUSANDS_OF_DIGITS + b",-;absurd timestamp\n"
        + kmsg_record(5, "last")
    )  # fmt: skip
    with KmsgReader(str(path)) as reader:
        assert [r.message for r in reader.read_available(100)] == ["before", "after", "last"]
    assert (reader.malformed_records, reader.lost_records) == (2, 0)


def test_device_mode_skips_a_record_with_an_absurd_number() -> None:
    reader, _ = device_reader(
        [kmsg_record(1, "a"), b"6,2," + THOUSANDS_OF_DIGITS + b",-;x\n", kmsg_record(3, "b")]
    )
    assert [r.message for r in reader.read_available(10)] == ["a", "b"]
    assert (reader.malformed_records, reader.lost_records) == (1, 0)


def test_sequence_gaps_in_a_file_count_as_lost(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.txt"
    path.write_bytes(kmsg_record(10, "a") + kmsg_record(11, "b") + kmsg_record(15, "c"))
    with KmsgReader(str(path)) as reader:
        assert len(reader.read_available(10)) == 3
    assert reader.lost_records == 3


def test_hundred_thousand_records_in_bounded_batches(tmp_path: Path) -> None:
    total, batch_size = 100_000, 1_000
    path = tmp_path / "kmsg.txt"
    with path.open("wb") as out:
        for seq in range(total):
            out.write(
                kmsg_record(
                    seq,
                    f"NVRM: Xid (PCI:0000:{seq % 256:02x}:00): 13, pid={seq}, Graphics Exception",
                    usec=seq * 10,
                    pci=f"0000:{seq % 256:02x}:00.0",
                )
            )
    file_size = path.stat().st_size
    seen = calls = peak = 0
    with KmsgReader(str(path)) as reader:
        while True:
            # Tracing every call would make this test slow; every 10th call shows the working set.
            traced = calls % 10 == 0
            if traced:
                tracemalloc.start()
            try:
                batch = reader.read_available(batch_size)
                if traced:
                    peak = max(peak, tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
            calls += 1
            if not batch:
                break
            assert len(batch) <= batch_size
            assert batch[0].sequence == seen
            seen += len(batch)
            del batch
    assert seen == total
    assert (reader.lost_records, reader.malformed_records) == (0, 0)
    # One call holds one batch of records and a few read buffers, never the file.
    assert peak < 3 * 1024 * 1024 < file_size


# --- the reader on a FIFO: real non-blocking reads ----------------------------------------------


def test_reader_on_a_fifo_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    with KmsgReader(str(fifo), "now") as reader:
        assert reader.read_available(10) == []  # no writer yet: end of file
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            assert reader.read_available(10) == []  # writer, no data: EAGAIN
            os.write(writer, kmsg_record(7, "one", pci="0000:3b:00.0") + kmsg_record(8, "two"))
            records = reader.read_available(10)
            assert [(r.sequence, r.message, r.pci_device) for r in records] == [
                (7, "one", "0000:3b:00.0"),
                (8, "two", None),
            ]
            os.write(writer, b"6,9,1,-;half a rec")
            assert reader.read_available(10) == []
            os.write(writer, b"ord\n")
            assert [r.message for r in reader.read_available(10)] == ["half a record"]
        finally:
            os.close(writer)


# --- the reader on the character device: EPIPE, EAGAIN, EINVAL ----------------------------------


def test_device_mode_reads_one_record_per_read_with_a_16k_buffer() -> None:
    reader, read = device_reader([kmsg_record(1, "a"), kmsg_record(2, "b", pci="0000:00:01.0")])
    with reader:
        records = reader.read_available(10)
    assert [r.message for r in records] == ["a", "b"]
    assert records[1].pci_device == "0000:00:01.0"
    assert read.calls == [16 * 1024] * 3  # the third read got EAGAIN


def test_epipe_counts_the_overwritten_records_and_reading_continues() -> None:
    reader, _ = device_reader(
        [
            kmsg_record(100, "before"),
            kmsg_record(101, "before too"),
            BrokenPipeError(errno.EPIPE, "Broken pipe"),  # 102..149 were overwritten
            kmsg_record(150, "oldest left"),
            kmsg_record(151, "next"),
        ]
    )
    with reader:
        records = reader.read_available(10)
    assert [r.sequence for r in records] == [100, 101, 150, 151]
    assert (reader.lost_records, reader.overruns, reader.last_sequence) == (48, 1, 151)


def test_epipe_before_the_first_record_cannot_count_losses() -> None:
    reader, _ = device_reader([OSError(errno.EPIPE, "Broken pipe"), kmsg_record(500, "x")])
    with reader:
        assert [r.sequence for r in reader.read_available(10)] == [500]
    assert (reader.lost_records, reader.overruns) == (0, 1)


def test_epipe_across_calls() -> None:
    reader, read = device_reader([kmsg_record(1, "a")])
    with reader:
        assert len(reader.read_available(10)) == 1
        read.script += [OSError(errno.EPIPE, "Broken pipe"), kmsg_record(11, "b")]
        assert [r.sequence for r in reader.read_available(10)] == [11]
    assert reader.lost_records == 9


def test_an_endless_epipe_storm_still_returns() -> None:
    reader, read = device_reader([OSError(errno.EPIPE, "Broken pipe")] * 1000)
    with reader:
        assert reader.read_available(5) == []
    assert len(read.calls) == 10


def test_device_mode_respects_max_records() -> None:
    reader, read = device_reader([kmsg_record(i, str(i)) for i in range(10)])
    with reader:
        assert [r.sequence for r in reader.read_available(4)] == [0, 1, 2, 3]
        assert len(read.calls) == 4
        assert [r.sequence for r in reader.read_available(4)] == [4, 5, 6, 7]
        assert [r.sequence for r in reader.read_available(4)] == [8, 9]


def test_device_mode_skips_garbage_and_oversized_records() -> None:
    reader, _ = device_reader(
        [
            kmsg_record(1, "ok"),
            b"garbage without a header\n",
            OSError(errno.EINVAL, "Invalid argument"),  # record too long for the buffer, skipped
            kmsg_record(4, "ok again"),
            OSError(errno.EINTR, "Interrupted system call"),
            kmsg_record(5, "after a signal"),
        ]
    )
    with reader:
        records = reader.read_available(10)
    assert [r.sequence for r in records] == [1, 4, 5]
    assert (reader.malformed_records, reader.lost_records) == (2, 0)


def test_device_mode_raises_real_read_errors() -> None:
    reader, _ = device_reader([OSError(errno.EIO, "Input/output error")])
    with reader, pytest.raises(OSError) as raised:
        reader.read_available(10)
    assert raised.value.errno == errno.EIO


def test_start_now_seeks_to_the_end_of_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    seeks: list[tuple[int, int]] = []
    real_lseek = os.lseek

    def spy(fd: int, offset: int, whence: int) -> int:
        seeks.append((offset, whence))
        return real_lseek(fd, offset, whence)

    monkeypatch.setattr(kmsg.os, "lseek", spy)
    reader, _ = device_reader([], start="now")
    reader.close()
    assert seeks == [(0, os.SEEK_END)]
    seeks.clear()
    reader, _ = device_reader([], start="boot")
    reader.close()
    assert seeks == []


def test_open_flags_are_read_only_and_non_blocking() -> None:
    opened: list[tuple[str, int]] = []

    def opener(path: str, flags: int) -> int:
        opened.append((path, flags))
        return os.open(path, flags)

    with KmsgReader(os.devnull, opener=opener, read=ScriptedRead([])) as reader:
        assert reader.read_available(1) == []
    ((path, flags),) = opened
    assert path == os.devnull
    assert flags & os.O_ACCMODE == os.O_RDONLY
    assert flags & os.O_NONBLOCK


def test_close_is_idempotent_and_reading_after_close_fails() -> None:
    reader, _ = device_reader([])
    fd = reader.fileno()
    reader.close()
    reader.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(ValueError):
        reader.read_available(1)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        KmsgReader(os.devnull, "later")  # type: ignore[arg-type]
    with KmsgReader(os.devnull, read=ScriptedRead([])) as reader, pytest.raises(ValueError):
        reader.read_available(0)


def test_the_real_device_if_this_machine_lets_us_read_it() -> None:
    try:
        reader = KmsgReader("/dev/kmsg", "boot")
    except OSError as err:
        pytest.skip(f"/dev/kmsg not readable here: {err}")
    with reader:
        try:
            first = reader.read_available(50)
        except OSError as err:
            pytest.skip(f"/dev/kmsg not readable here: {err}")
        rest: list[KmsgRecord] = []
        while batch := reader.read_available(500):
            assert len(batch) <= 500
            rest += batch
    sequences = [r.sequence for r in first + rest]
    # A running kernel's buffer always holds something (its boot messages, at the least).
    assert sequences
    assert sequences == sorted(sequences)
    assert reader.malformed_records == 0
    assert all(0 <= r.priority <= 7 for r in first + rest)
    marker = f"clusterhealth test_kmsg {os.getpid()} {time.monotonic_ns()}"
    with KmsgReader("/dev/kmsg", "now") as reader:
        try:
            # A message written into /dev/kmsg becomes a record of facility 1 (user).
            with open("/dev/kmsg", "w", encoding="utf-8") as kernel_log:
                kernel_log.write(marker + "\n")
        except OSError as err:
            pytest.skip(f"/dev/kmsg not writable here: {err}")
        newer: list[KmsgRecord] = []
        deadline = time.monotonic() + 5
        while marker not in [r.message for r in newer] and time.monotonic() < deadline:
            batch = reader.read_available(500)
            if not batch:
                time.sleep(0.01)
            newer += batch
    # Only records logged after the boot-to-end read above come back from "now", ours among them.
    assert marker in [r.message for r in newer]
    assert all(r.sequence > sequences[-1] for r in newer)
    (ours,) = [r for r in newer if r.message == marker]
    assert ours.facility == 1
