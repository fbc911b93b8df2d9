"""One probe at a time per node, across processes.

Two probes at once measure each other: an nccl-tests run beside an ib_write_bw run halves both
figures and both would be reported as a degraded fabric. The agent's scheduler, a manual
``clusterhealth probe run`` and a second agent started by mistake all take this lock first.

``flock(2)`` rather than a pid file: the kernel drops the lock when its holder dies, however it
dies, so there is no stale lock to detect or break. The lock belongs to the open file
description, which is why the descriptor must stay close-on-exec (Python's default, spelled out
here): a probe's child process, or a leftover that escaped the runner, must not inherit it and
keep holding it after the holder is gone. Two ``ProbeLock`` objects on the same path exclude each
other even within one process.

The file holds the holder's pid and probe name, for the "skipped: probe X (pid N) is running"
reason only; it is rewritten by each new holder and may briefly show the previous one. Use a
local filesystem (``/run``, ``/var/lib``): flock over NFS is emulated with byte-range locks and
not every server honours it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType


class ProbeLockHeld(Exception):
    """Raised by ``with ProbeLock(...)`` when another holder has the lock."""

    def __init__(self, path: Path, holder: str | None):
        self.path, self.holder = path, holder
        super().__init__(f"another probe holds {path}" + (f": {holder}" if holder else ""))


class ProbeLock:
    def __init__(self, path: str | os.PathLike[str], probe: str = ""):
        self.path = Path(path)
        self.probe = probe
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self, probe: str | None = None) -> bool:
        """Take the lock without waiting; False when another holder has it.

        Errors other than contention (the directory cannot be created, no permission) raise
        OSError: they are configuration faults, not a busy node.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this ProbeLock")
        if probe is not None:
            self.probe = probe
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        # Diagnostics only; a failure to write them must not lose the lock just taken.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} probe {self.probe or '-'}\n".encode(), 0)
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        # Closing the last descriptor of the open file description releases the flock.
        os.close(fd)

    def holder(self) -> str | None:
        """What the current holder wrote, e.g. ``pid 4242 probe allreduce``; None if unknown."""
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:
            return None
        return text or None

    def __enter__(self) -> ProbeLock:
        if not self.acquire():
            raise ProbeLockHeld(self.path, self.holder())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
