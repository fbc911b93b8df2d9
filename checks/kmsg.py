"""Reading the kernel log from /dev/kmsg: one typed record per kernel message, never blocking.

The device's contract (Linux Documentation/ABI/testing/dev-kmsg, and devkmsg_read() in
kernel/printk/printk.c):

- each read() returns exactly one record, ``<prefix>,<seq>,<usec>,<flags>[,more];<text>\\n``
  followed by zero or more dictionary lines `` KEY=VALUE\\n`` (SUBSYSTEM=, DEVICE=); the prefix is
  ``facility << 3 | level``; unknown header fields after the flags must be ignored
  (CONFIG_PRINTK_CALLER adds ``,caller=T123``);
- the text escapes bytes below 0x20, from 0x7f up (so all of UTF-8) and the backslash as ``\\xNN``,
  so a message with embedded newlines is still one line;
- a record, dictionary included, never exceeds 8 KiB (CONSOLE_EXT_LOG_MAX); a read() with a
  smaller buffer fails with EINVAL (current kernels have then already moved past the record);
- with O_NONBLOCK an empty buffer gives EAGAIN; when the ring buffer overwrote records this reader
  had not read yet, read() fails once with EPIPE and the next read() returns the oldest record left,
  so the lost records are the gap in sequence numbers;
- lseek(fd, 0, SEEK_END) moves after the newest record ("start now").

`KmsgReader` also reads a regular file or a FIFO, for tests and replays: the stream is what
``cat /dev/kmsg`` prints, a record being a header line plus the dictionary lines (starting with a
space) after it, so a file with one record per line is the simple case. There, end of file means
"nothing more now": a line without its newline waits for the rest, and a record's dictionary lines
must be written with it (a record is complete when the next header line or end of file is seen).
A regular file is followed like ``tail -F`` does: at its end, a file shorter than what was read
(truncated: ``copytruncate``, ``> file``) is read again from its start, and a path that names
another file (rotated: renamed and created anew) is opened and read from its start once the old
one is read to its end. The kernel's sequence numbers only grow, so after such a restart the
records at or below the last one read are the old content written again, skipped, not counted
twice. (A file truncated and rewritten past the read position between two reads cannot be told
from one that grew; the partial line there is skipped as malformed.)
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

# Twice the kernel's largest record (CONSOLE_EXT_LOG_MAX, 8 KiB): a read never meets the EINVAL for
# a short buffer, and a longer line in a file cannot be a record.
READ_SIZE = 16 * 1024
MAX_RECORD_BYTES = READ_SIZE

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# What the kernel can print in a header field: the prefix is a u8 facility shifted over the 3-bit
# level, the sequence number and the timestamp are u64. A field beyond these is not a record (and
# int() of thousands of digits raises).
_HEADER_LIMITS = (1 << 11, 1 << 64, 1 << 64)


def _bounded(field: bytes, limit: int) -> int | None:
    """The decimal number in a header field if it is one below `limit`, else None."""
    if not (0 < len(field) <= 20 and field.isdigit()):
        return None
    value = int(field)
    return value if value < limit else None


def _unescape(raw: bytes) -> str:
    # The kernel escapes the backslash too, so text without one has nothing to unescape.
    if b"\\" in raw:
        # Unescape before decoding: the kernel escapes every byte of a multi-byte UTF-8 character.
        raw = _ESCAPE.sub(lambda m: bytes((int(m[1], 16),)), raw)
    return raw.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class KmsgRecord:
    priority: int
    """Syslog level, 0 (emerg) to 7 (debug)."""
    facility: int
    """Syslog facility: 0 for the kernel itself, 1 (user) for messages written into /dev/kmsg."""
    sequence: int
    timestamp_us: int
    """Microseconds since boot on the kernel's printk clock, as /dev/kmsg gives it."""
    flags: str
    """``-``, or ``c`` when the record is a fragment of a line (printk's KERN_CONT)."""
    message: str
    dictionary: Mapping[str, str] = field(default_factory=dict, hash=False)
    """The KEY=VALUE context lines (SUBSYSTEM=pci, DEVICE=+pci:0000:3b:00.0, ...)."""

    @property
    def pci_device(self) -> str | None:
        """The PCI address from ``DEVICE=+pci:...``, when the message came from a PCI device."""
        device = self.dictionary.get("DEVICE", "")
        return device[len("+pci:") :] if device.startswith("+pci:") else None


def parse_record(raw: bytes) -> KmsgRecord | None:
    """One /dev/kmsg record (header line plus optional dictionary lines), or None if malformed."""
    first, _, rest = raw.partition(b"\n")
    header, semicolon, text = first.partition(b";")
    if not semicolon:
        return None
    fields = header.split(b",")
    if len(fields) < 3:
        return None
    prefix, sequence, timestamp = (_bounded(fields[i], limit) for i, limit in enumerate(_HEADER_LIMITS))
    if prefix is None or sequence is None or timestamp is None:
        return None
    flags = fields[3].decode("ascii", errors="replace") if len(fields) > 3 else "-"
    dictionary: dict[str, str] = {}
    for line in rest.split(b"\n"):
        if not line:
            continue
        if not line.startswith(b" "):
            return None
        key, equals, value = line[1:].partition(b"=")
        if equals:
            dictionary[_unescape(key)] = _unescape(value)
    return KmsgRecord(
        priority=prefix & 7,
        facility=prefix >> 3,
        sequence=sequence,
        timestamp_us=timestamp,
        flags=flags,
        message=_unescape(text),
        dictionary=dictionary,
    )


Opener = Callable[[str, int], int]
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
Reader = Callable[[int, int], bytes]


class KmsgReader:
    """Reads whatever records are available now from /dev/kmsg (or a file or FIFO; see module doc).

    ``start="boot"`` begins at the oldest record still in the kernel's buffer (the start of a
    file), ``start="now"`` after the newest one (the end of a file). `opener` and `read` default to
    os.open and os.read; tests pass their own to simulate the device's errors.

    Counters, for the watcher's meta metrics:
    ``lost_records``: records the kernel overwrote before this reader got to them, counted from
    the gap in sequence numbers after an EPIPE (losses before the first record read are not
    counted; in a file any gap counts);
    ``overruns``: how many times read() failed with EPIPE;
    ``malformed_records``: records (or lines, from a file) that could not be parsed and were skipped;
    ``restarts``: how many times a regular file was found truncated or rotated and read from its start;
    ``repeated_records``: records read again after such a restart and skipped.
    """

    def __init__(
        self,
        path: str,
        start: Literal["boot", "now"] = "boot",
        *,
        opener: Opener = os.open,
        read: Reader = os.read,
    ) -> None:
        if start not in ("boot", "now"):
            raise ValueError(f"start must be 'boot' or 'now', not {start!r}")
        self.path = path
        self._read = read
        self._opener = opener
        self._fd: int | None = opener(path, _OPEN_FLAGS)
        try:
            status = os.fstat(self._fd)
            # Only the character device hands out one record per read(); a file or a FIFO is a
            # byte stream that has to be split into lines.
            self._record_mode = stat.S_ISCHR(status.st_mode)
            self._regular_file = stat.S_ISREG(status.st_mode)
            self._identity = (status.st_dev, status.st_ino)
            if start == "now":
                try:
                    os.lseek(self._fd, 0, os.SEEK_END)
                except OSError as err:
                    if err.errno != errno.ESPIPE:  # a FIFO has no end to seek to; it starts empty
                        raise
        except BaseException:
            self.close()
            raise
        self.lost_records = 0
        self.overruns = 0
        self.malformed_records = 0
        self.restarts = 0
        self.repeated_records = 0
        self.last_sequence: int | None = None
        # After a restart: records up to this sequence number were read before the file started over.
        self._read_up_to: int | None = None
        # Malformed records read since the last good one: they account for part of the next gap.
        self._skipped_since_last = 0
        self._buffer = bytearray()
        self._position = 0  # start of the first unread line in _buffer
        self._pending: bytearray | None = None
        self._discarding_long_line = False
        self._dropping_record = False  # skipping the rest of a record already counted as malformed

    def fileno(self) -> int:
        """The descriptor, for select/poll on the device (readable when a record is waiting)."""
        if self._fd is None:
            raise ValueError("reader is closed")
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> KmsgReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def read_available(self, max_records: int) -> list[KmsgRecord]:
        """Up to `max_records` records, returning as soon as none is waiting; never blocks."""
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        if self._fd is None:
            raise ValueError("reader is closed")
        if self._record_mode:
            return self._read_records(self._fd, max_records)
        return self._read_stream(self._fd, max_records)

    def _read_records(self, fd: int, max_records: int) -> list[KmsgRecord]:
        records: list[KmsgRecord] = []
        # An EPIPE is followed by a readable record unless the kernel overwrites the buffer again
        # meanwhile; twice the budget bounds the system calls per call even under such a flood.
        for _ in range(2 * max_records):
            if len(records) >= max_records:
                break
            try:
                raw = self._read(fd, READ_SIZE)
            except InterruptedError:
                continue
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:
                    self.overruns += 1
                    continue
                if err.errno == errno.EINVAL:
                    # A record longer than our buffer; the kernel has already moved past it.
                    self._skip_malformed()
                    continue
                raise
            if not raw:
                break
            self._accept(parse_record(raw), records)
        return records

    def _read_stream(self, fd: int, max_records: int) -> list[KmsgRecord]:
        records: list[KmsgRecord] = []
        skipped = 0
        restarted = False
        while len(records) < max_records and skipped < max_records:
            line = self._next_line(fd)
            if line is None:
                # Nothing more now: whatever record is pending has all its lines.
                if self._pending is not None:
                    self._accept(parse_record(bytes(self._pending)), records)
                    self._pending = None
                # At most once per call, so that a file replaced over and over still returns.
                if self._regular_file and not restarted and self._start_over_if_replaced():
                    restarted = True
                    fd = self.fileno()
                    continue
                break
            if line.startswith(b" "):
                if self._pending is not None and len(self._pending) + 1 + len(line) <= MAX_RECORD_BYTES:
                    self._pending += b"\n" + line
                elif self._pending is not None:
                    self._pending = None  # too long for a kernel record
                    self._dropping_record = True
                    self._skip_malformed()
                    skipped += 1
                elif not self._dropping_record:
                    self._skip_malformed()  # a dictionary line without its record
                    skipped += 1
                continue
            if self._pending is not None:
                self._accept(parse_record(bytes(self._pending)), records)
            self._pending = None
            self._dropping_record = False
            if line:
                self._pending = bytearray(line)
            else:
                skipped += 1
        return records

    def _next_line(self, fd: int) -> bytes | None:
        """The next complete line without its newline, or None when none is available now."""
        while True:
            newline = self._buffer.find(b"\n", self._position)
            if newline >= 0:
                line = bytes(self._buffer[self._position : newline])
                self._position = newline + 1
                if self._discarding_long_line:
                    self._discarding_long_line = False
                    continue
                return line
            # Keep only the unfinished line before reading more, so the buffer stays bounded.
            del self._buffer[: self._position]
            self._position = 0
            if len(self._buffer) > MAX_RECORD_BYTES:
                # No kernel record is this long: drop it rather than grow without bound.
                if not self._discarding_long_line:
                    self._skip_malformed()
                    self._discarding_long_line = True
                self._buffer.clear()
            try:
                chunk = self._read(fd, READ_SIZE)
            except InterruptedError:
                continue
            except BlockingIOError:
                return None
            if not chunk:
                return None
            self._buffer += chunk

    def _start_over_if_replaced(self) -> bool:
        """At the end of a regular file: go back to the start of the file the path names now if
        this one was truncated or the path names another file; True when reading starts over."""
        fd = self.fileno()
        try:
            named = os.stat(self.path)
        except OSError:
            named = None  # renamed away and not created anew yet: the old file is all there is
        if named is not None and (named.st_dev, named.st_ino) != self._identity:
            try:
                new_fd = self._opener(self.path, _OPEN_FLAGS)
            except OSError:
                return False  # the next cycle tries again; the old file stays open meanwhile
            status = os.fstat(new_fd)
            if not stat.S_ISREG(status.st_mode):
                os.close(new_fd)
                return False
            self._fd, self._identity = new_fd, (status.st_dev, status.st_ino)
            os.close(fd)
        elif os.fstat(fd).st_size < os.lseek(fd, 0, os.SEEK_CUR):
            os.lseek(fd, 0, os.SEEK_SET)
        else:
            return False
        if self._position < len(self._buffer) or self._discarding_long_line:
            self._skip_malformed()  # a line the truncation or rotation cut short
        self._buffer.clear()
        self._position = 0
        self._discarding_long_line = self._dropping_record = False
        self.restarts += 1
        if self.last_sequence is not None:
            self._read_up_to = self.last_sequence
        return True

    def _skip_malformed(self) -> None:
        self.malformed_records += 1
        self._skipped_since_last += 1

    def _accept(self, record: KmsgRecord | None, into: list[KmsgRecord]) -> None:
        if record is None:
            self._skip_malformed()
            return
        if self._read_up_to is not None:
            if record.sequence <= self._read_up_to:
                self.repeated_records += 1
                return
            self._read_up_to = None
        if self.last_sequence is not None:
            gap = record.sequence - self.last_sequence - 1
            # Unparseable records had sequence numbers too; they were skipped, not lost.
            self.lost_records += max(0, gap - self._skipped_since_last)
        self.last_sequence = record.sequence
        self._skipped_since_last = 0
        into.append(record)
