"""Reading sysfs attributes: the one read layer of the exporters that read /sys (procfs's habit).

exporters/infiniband.py (RDMA devices and their interfaces), exporters/pci.py (PCI functions),
exporters/pcie_aer.py (AER counts) and exporters/netdev.py (MTUs) read their files through this
module, so that every file under /sys is read with the same bounds and the same errno policy:

- Bounded reads. A sysfs attribute is at most a page and the kernel hands the whole of it to the
  first read at offset 0, so a file is read with one open, one read and one close (no buffered
  file object), at most `MAX_ATTRIBUTE_BYTES` (less where the caller says so), and opened with
  O_NONBLOCK: a FIFO put in the tree reads as empty instead of blocking the collector.
- Errno policy. A read never raises: it returns the bytes without surrounding whitespace, or a
  `Failure` naming the errno. ENOENT means the file is absent, which is normal (drivers and
  kernels differ); any other errno means it is present but unreadable (EACCES, EINVAL or ENOSYS
  from a counter the kernel could not query, EIO), which a caller reports or leaves out, never
  reads as 0.
- Held files. A reader that reads the same files on every collection keeps them open between
  reads (`held_files`, `read_held_directory` with a `ReadCache`): a held descriptor read with
  pread at offset 0 gives the attribute's current value in one system call, without the open and
  close that cost two thirds of a read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# sysfs attributes are at most a page; anything much longer is not a sysfs value.
MAX_ATTRIBUTE_BYTES = 64 * 1024

# O_NONBLOCK: a FIFO put in the tree must not block the read (an empty one reads as empty).
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_open = os.open  # the seam tests use to raise the errors a kernel returns


@dataclass(frozen=True)
class Failure:
    reason: str  # the errno's name


def errno_name(error: OSError) -> str:
    return errno.errorcode.get(error.errno or 0, type(error).__name__)


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def read_raw(path: str, dir_fd: int | None = None, limit: int = MAX_ATTRIBUTE_BYTES) -> bytes | Failure:
    """A sysfs attribute's bytes (at most `limit`), stripped. sysfs hands a whole attribute to the
    first read. `path` is relative to `dir_fd` when one is given."""
    try:
        fd = _open(path, OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        return Failure(errno_name(error))
    try:
        return os.read(fd, limit).strip()
    except OSError as error:
        return Failure(errno_name(error))
    finally:
        os.close(fd)


def read_text(path: str) -> str | Failure:
    raw = read_raw(path)
    return raw if isinstance(raw, Failure) else decode(raw)


def open_directory(path: str, dir_fd: int | None = None) -> int:
    """A descriptor of the directory `path` to open its files relative to (the kernel then walks a
    few path parts instead of the whole path and its symlinks, for each file); raises OSError."""
    return _open(path, DIR_FLAGS, dir_fd=dir_fd)


def identity(status: os.stat_result) -> tuple[int, int, int]:
    """What a directory is while the kernel keeps it registered: its inode and its change time."""
    return status.st_dev, status.st_ino, status.st_ctime_ns


def link_name(link: str) -> str:
    """The last part of the target of a sysfs link (a `device` link: 0000:18:00.0; a `driver`
    link: mlx5_core). Raises OSError when `link` is no link."""
    return os.path.basename(os.readlink(link).rstrip("/"))


class ReadCache:
    """What sysfs does not change while a device stays registered, kept from one read to the next.

    The reader decides what is kept (exporters/infiniband.py says what it keeps); each value is
    keyed by the identity of the directory it sits in: its inode and its change time. A device the
    kernel registers again (driver reload, firmware reset) gets a new sysfs directory, hence a new
    key, and is read afresh, new firmware version included; a directory that gains or loses an
    entry changes its times, so its names are listed again. Only values read without a problem are
    kept; a value not asked for in one read is dropped.
    """

    def __init__(self, held_budget: int | None = None) -> None:
        self._current: dict[tuple[object, ...], Any] = {}
        self._previous: dict[tuple[object, ...], Any] = {}
        # Counter files held open between reads, at most a quarter of the open-file limit: the HTTP
        # server takes up to another quarter, and the rest is headroom (a batch of accepted
        # connections before the cap closes them, files opened for one read, the kernel log, NVML).
        self.held_budget = held_budget if held_budget is not None else _a_quarter_of_the_open_file_limit()
        self.held = 0

    def get(self, key: tuple[object, ...]) -> Any:
        if key in self._current:
            return self._current[key]
        value = self._previous.get(key)
        if value is not None:
            self._current[key] = value
        return value

    def put(self, key: tuple[object, ...], value: Any) -> None:
        replaced = self._current.get(key, self._previous.get(key))
        if replaced is not None and replaced is not value:
            self._release(replaced)
        if isinstance(value, HeldFiles):
            self.held += value.count
        self._current[key] = value

    def turn(self) -> None:
        """End of one read: what it did not use goes (and held descriptors are closed)."""
        for key, value in self._previous.items():
            if key not in self._current:
                self._release(value)
        self._previous, self._current = self._current, {}

    def close(self) -> None:
        """Close every descriptor held; the cache is empty afterwards."""
        for value in {id(v): v for v in (*self._previous.values(), *self._current.values())}.values():
            self._release(value)
        self._previous, self._current = {}, {}

    def _release(self, value: Any) -> None:
        if isinstance(value, HeldFiles):
            self.held -= value.count
            value.close()


def _a_quarter_of_the_open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 14 if soft == resource.RLIM_INFINITY else soft // 4


class HeldFiles:
    """Files kept open from one read to the next, each read again with pread at offset 0.

    A sysfs attribute is generated again by a read at offset 0, so a held descriptor read with
    pread(fd, n, 0) gives the current value without the open() and close() that cost two thirds
    of a read. The files are named up front (a port's `state`, `rate`, ...) or are the entries of
    a directory (`counters/`), which is then held open too, so that one fstat() tells whether its
    entries changed (its times): a file that comes or goes, or a device registered again, means
    new descriptors. Over the cache's budget of descriptors (a low open-file limit), a file is
    opened for one read at a time instead.
    """

    __slots__ = ("base", "count", "dir_fd", "files", "stamp")

    def __init__(
        self,
        base: str,
        names: list[str],
        *,
        hold: bool,
        dir_fd: int | None = None,
        stamp: tuple[int, int] | None = None,
    ) -> None:
        # Files are opened relative to `dir_fd` (held, and closed with these files) when there is
        # one, else at `base`/name.
        self.base, self.dir_fd, self.stamp = base, dir_fd, stamp
        # (name, descriptor, or None and the errno's name of why it could not be opened, or None
        # and "" for a file not held: opened for each read)
        self.files: list[tuple[str, int | None, str]] = []
        for name in names:
            if not hold:
                self.files.append((name, None, ""))
                continue
            try:
                if dir_fd is None:
                    fd = _open(f"{base}/{name}", OPEN_FLAGS)
                else:
                    fd = _open(name, OPEN_FLAGS, dir_fd=dir_fd)
            except OSError as error:
                self.files.append((name, None, errno_name(error)))
            else:
                self.files.append((name, fd, ""))
        self.count = sum(1 for _, fd, _ in self.files if fd is not None) + (dir_fd is not None)

    def read(self) -> list[tuple[str, bytes | Failure]]:
        """(name, stripped bytes or why not) of every file, in order."""
        # This loop runs for every counter file of every port: the calls are bound to locals.
        pread = os.pread
        values: list[tuple[str, bytes | Failure]] = []
        append = values.append
        for name, fd, why in self.files:
            if fd is not None:
                try:
                    append((name, pread(fd, MAX_ATTRIBUTE_BYTES, 0).strip()))
                except OSError as read_error:
                    append((name, _read_unseekable(fd, read_error)))
            elif why:
                append((name, Failure(why)))
            elif self.dir_fd is not None:  # not held (over the budget): opened for this read only
                append((name, read_raw(name, self.dir_fd)))
            else:
                append((name, read_raw(f"{self.base}/{name}")))
        return values

    def close(self) -> None:
        for _, fd, _ in self.files:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.dir_fd)
        self.files, self.count, self.dir_fd = [], 0, None


def held_files(cache: ReadCache, key: tuple[object, ...], base: str, names: list[str]) -> HeldFiles:
    """The files `base`/name, held open in `cache` under `key` (which must change when `base` is
    another directory: a device registered again)."""
    held = cache.get(key)
    if not isinstance(held, HeldFiles):
        held = HeldFiles(base, names, hold=cache.held + len(names) <= cache.held_budget)
        cache.put(key, held)
    return held


_ABSENT = Failure("ENOENT")


def read_held_directory(
    cache: ReadCache, key: tuple[object, ...], path: str, wanted: Callable[[str], bool] | None = None
) -> list[tuple[str, bytes | Failure]] | Failure:
    """(name, stripped bytes or why not) of the files of the directory `path` whose names
    `wanted` accepts, by name, or why the directory cannot be listed. The directory and its files
    are held open in `cache` under `key` while its entries stay the same and the cache's budget
    of descriptors allows; over the budget, they are opened for this read only. A directory that
    is absent is remembered as absent under `key` too (a device's key: its counter directories
    come and go with the device)."""
    held = cache.get(key)
    if held is _ABSENT:
        return _ABSENT
    if isinstance(held, HeldFiles) and held.dir_fd is not None:
        try:
            status = os.fstat(held.dir_fd)
        except OSError as error:
            return Failure(errno_name(error))
        if (status.st_mtime_ns, status.st_ctime_ns) == held.stamp:
            return held.read()
        dir_fd = os.dup(held.dir_fd)  # the same directory, listed again
    else:
        try:
            dir_fd = _open(path, DIR_FLAGS)
            status = os.fstat(dir_fd)
        except FileNotFoundError:
            cache.put(key, _ABSENT)
            return _ABSENT
        except OSError as error:
            return Failure(errno_name(error))
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as error:
        os.close(dir_fd)
        return Failure(errno_name(error))
    if wanted is not None:
        names = [name for name in names if wanted(name)]
    stamp = (status.st_mtime_ns, status.st_ctime_ns)
    hold = cache.held + len(names) + 1 <= cache.held_budget
    held = HeldFiles(path, names, hold=hold, dir_fd=dir_fd, stamp=stamp)
    if not hold:
        try:
            return held.read()
        finally:
            held.close()
    cache.put(key, held)
    return held.read()


def _read_unseekable(fd: int, error: OSError) -> bytes | Failure:
    """What a FIFO put in the tree holds (pread cannot seek it: ESPIPE); other errors as such."""
    if error.errno != errno.ESPIPE:
        return Failure(errno_name(error))
    try:
        return os.read(fd, MAX_ATTRIBUTE_BYTES).strip()
    except OSError as read_error:
        return Failure(errno_name(read_error))
