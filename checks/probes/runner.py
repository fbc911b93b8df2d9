"""The one place that starts processes for checks and probes.

Probes run tools that can misbehave in every way a process can: hang on a dead peer, ignore
SIGTERM, print gigabytes, fork helpers that outlive them (MPI launchers, ``iperf3 -D``, a shell's
``cmd &``), or sit in uninterruptible sleep on a wedged GPU. ``run`` bounds all of it:

* No shell: ``argv`` is executed as given, so a peer name from the config can never become code.
  ``template`` fills ``{peer}``-style placeholders argument by argument.
* The child starts in a new session, so it and everything it forks share one process group that
  can be signalled as a whole, and a terminal's Ctrl-C aimed at the agent does not reach it.
* stdout and stderr are read concurrently from one selector loop, so neither pipe can fill up and
  block the child. Each stream keeps at most ``max_output_bytes`` (the first half and the last
  half: tools print their header first and their verdict last, the nccl-tests footer included);
  the middle is counted and dropped, and reading goes on so the child never blocks on a full pipe.
* On timeout the whole group gets SIGTERM, then SIGKILL after ``kill_grace`` seconds.
* The group dies with its leader. When the direct child exits, any process still in its group is a
  leftover, whether it holds the pipes open (``sh -c 'sleep 100 &'``) or not: left alone it would
  keep a port, a GPU or the pipes busy and skew the next probe. Leftovers get SIGTERM, then
  SIGKILL after the grace period, and ``RunResult.leftovers_killed`` counts them. A process that
  left the group itself (``setsid``, a daemonising server) cannot be reached that way; if it still
  holds the pipes, reading stops after the grace period and it gets EPIPE on its next write.
* The direct child is always reaped. It stays a zombie, and so keeps its process-group id from
  being reused, until the group has been dealt with. If it survives SIGKILL (uninterruptible sleep
  in a driver call) a daemon thread waits for it and the result says so in ``error``.
* A missing or non-executable program is a result with ``error`` set, never an exception.
* ``stop_all()`` ends every run in progress the same way (SIGTERM to its group, then SIGKILL), for
  an agent that is shutting down, and returns once they have ended: the children run in sessions
  of their own, so nothing else would stop a probe server that waits for a client, and it would
  hold its port after the agent. Those results have ``cancelled`` set.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal as signals
import string
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_KILL_GRACE_SECONDS = 5.0
# After SIGKILL the kernel tears a process down in milliseconds; longer means uninterruptible sleep
# or an escaped process holding the pipes, and waiting more would not change the outcome.
_AFTER_KILL_SECONDS = 2.0
# How often leftovers are looked for while the group is being cleaned up, and how often the child
# is polled where pidfd_open (Linux 5.3) is missing.
_POLL_SECONDS = 0.05
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    exit_code: int | None  # None when a signal ended the process, or it never ran
    signal: int | None  # the signal that ended the direct child
    timed_out: bool
    duration_seconds: float  # from start to return, the clean-up of leftovers included
    stdout: str  # decoded with errors="replace"; the middle replaced by a marker when truncated
    stderr: str
    output_truncated: bool  # either stream lost its middle
    error: str | None  # the process could not be started, or could not be reaped
    leftovers_killed: int = 0  # processes found in the group after the direct child exited
    cancelled: bool = False  # stopped by stop_all() (the agent is shutting down)

    @property
    def command(self) -> str:
        """The argv as one shell-quoted line, for log lines and reasons."""
        return shlex.join(self.argv)

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signals.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    @property
    def completed(self) -> bool:
        """The process ran and exited on its own (with any exit code)."""
        return self.error is None and not self.timed_out and self.exit_code is not None

    @property
    def output(self) -> str:
        """stdout, then stderr: what the parsers read (ib_write_bw prints its errors on stderr)."""
        if not self.stderr:
            return self.stdout
        if not self.stdout or self.stdout.endswith("\n"):
            return self.stdout + self.stderr
        return f"{self.stdout}\n{self.stderr}"


class _Capture:
    """Keeps the first and the last bytes of a stream, counting what falls out of the middle."""

    def __init__(self, limit: int):
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (self.head + self.tail).decode(errors="replace")
        # Cut at line boundaries: the parsers read lines, and half a result row could pass for one.
        head, tail = bytes(self.head), bytes(self.tail)
        if (end := head.rfind(b"\n")) >= 0:
            head = head[: end + 1]
        if (start := tail.find(b"\n")) >= 0:
            tail = tail[start + 1 :]
        dropped = self.total - len(head) - len(tail)
        if head and not head.endswith(b"\n"):
            head += b"\n"
        marker = f"[... clusterhealth dropped {dropped} bytes of output here ...]\n"
        return head.decode(errors="replace") + marker + tail.decode(errors="replace")


_RUNNING: set[_Supervisor] = set()
_RUNNING_LOCK = threading.Lock()
# Notified each time a run ends and leaves _RUNNING.
_ENDED = threading.Condition(_RUNNING_LOCK)
_STOPPING = threading.Event()


def stop_all() -> None:
    """End every run in progress, and any started from now on, as on a timeout (``cancelled``), and
    return once the runs in progress have ended. The caller (an agent shutting down) exits next, and
    its threads with it: a supervisor not yet scheduled (a loaded machine) would leave its probe
    running on. Each run ends within its grace and the wait after SIGKILL; that is the bound."""
    _STOPPING.set()
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for supervisor in running:
        supervisor.cancel()
    bound = max((s.kill_grace for s in running), default=0.0) + 2 * _AFTER_KILL_SECONDS
    with _ENDED:
        _ENDED.wait_for(lambda: not _RUNNING.intersection(running), timeout=bound)


def template(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Fill ``{name}`` placeholders in each argument; ``{{`` and ``}}`` stand for braces.

    Each argument stays one argument whatever the values hold (spaces, quotes, ``;``): there is no
    shell to split or interpret them. Only bare names are allowed, so a config cannot reach into
    attributes (``{peer.__class__}``) or apply format specs.
    """
    expanded = []
    for arg in argv:
        try:
            pieces = list(string.Formatter().parse(arg))
        except ValueError as exc:
            raise ValueError(f"argument {arg!r}: {exc}") from None
        out = []
        for literal, name, spec, conversion in pieces:
            out.append(literal)
            if name is None:
                continue
            if not name.isidentifier() or spec or conversion:
                suffix = (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise ValueError(
                    f"argument {arg!r}: placeholders are plain names like {{peer}}, not {{{name}{suffix}}}"
                )
            if name not in values:
                known = ", ".join(f"{{{key}}}" for key in sorted(values)) or "none"
                raise ValueError(f"argument {arg!r}: unknown placeholder {{{name}}}; known: {known}")
            out.append(values[name])
        expanded.append("".join(out))
    return expanded


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    cwd: str | os.PathLike[str] | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_SECONDS,
) -> RunResult:
    """Run ``argv`` (no shell) for at most ``timeout`` seconds; see the module docstring.

    ``env`` is laid over the agent's own environment rather than replacing it: probes need the
    agent's PATH and library paths, and a config only adds NCCL_* and the like.
    """
    argv = tuple(argv)
    if not argv:
        raise ValueError("argv is empty")
    if timeout <= 0 or kill_grace < 0 or max_output_bytes < 0:
        raise ValueError("timeout must be positive, kill_grace and max_output_bytes not negative")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return RunResult(
            argv=argv,
            exit_code=None,
            signal=None,
            timed_out=False,
            duration_seconds=time.monotonic() - started,
            stdout="",
            stderr="",
            output_truncated=False,
            error=_start_error(exc, argv[0], cwd),
        )
    supervisor = _Supervisor(proc, argv, started, timeout, kill_grace, max_output_bytes)
    with _RUNNING_LOCK:
        _RUNNING.add(supervisor)
    try:
        if _STOPPING.is_set():
            supervisor.cancel()
        return supervisor.supervise()
    finally:
        with _ENDED:
            _RUNNING.discard(supervisor)
            _ENDED.notify_all()


def _start_error(exc: OSError, program: str, cwd: str | os.PathLike[str] | None) -> str:
    if cwd is not None and exc.filename is not None and Path(exc.filename) == Path(cwd):
        return f"cannot enter working directory {os.fspath(cwd)}: {exc.strerror}"
    if isinstance(exc, FileNotFoundError):
        return f"executable not found: {program}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {program}"
    return f"cannot start {program}: {exc.strerror or exc}"


class _Supervisor:
    """Reads the pipes, enforces the deadline and cleans up the process group of one run."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        argv: tuple[str, ...],
        started: float,
        timeout: float,
        kill_grace: float,
        max_output_bytes: int,
    ):
        self.proc, self.argv, self.started = proc, argv, started
        self.deadline = started + timeout
        self.kill_grace = kill_grace
        # start_new_session makes the child the leader of a group whose id is its pid.
        self.pgid = proc.pid
        assert proc.stdout is not None and proc.stderr is not None
        self.captures = {
            proc.stdout.fileno(): _Capture(max_output_bytes),
            proc.stderr.fileno(): _Capture(max_output_bytes),
        }
        self.stdout_fd, self.stderr_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.selector = selectors.DefaultSelector()
        self.pidfd: int | None = None
        self.leader_exited = False
        self.timed_out = False
        self.term_sent_at: float | None = None
        self.kill_sent_at: float | None = None
        self.leftovers = 0
        # stop_all() writes to this pipe to wake the selector loop, which then ends the run.
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.cancelled = False

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def supervise(self) -> RunResult:
        try:
            self._watch()
        except BaseException:
            # Ctrl-C on `clusterhealth probe run`, or a bug: the terminal's signal never reached the
            # new session, so the probe would run on unsupervised.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signals.SIGKILL)
            self.proc.wait()
            raise
        finally:
            self.selector.close()
            os.close(self._wake_read)
            os.close(self._wake_write)
            if self.pidfd is not None:
                os.close(self.pidfd)
            assert self.proc.stdout is not None and self.proc.stderr is not None
            self.proc.stdout.close()
            self.proc.stderr.close()
        error = None
        if self.leader_exited:
            returncode = self.proc.wait()
        else:
            # Survived SIGKILL: stuck in the kernel. Reap it whenever it dies, without blocking.
            threading.Thread(target=self.proc.wait, name=f"reap-{self.proc.pid}", daemon=True).start()
            returncode = None
            error = f"process {self.proc.pid} did not exit after SIGKILL (uninterruptible sleep?)"
        out, err = self.captures[self.stdout_fd], self.captures[self.stderr_fd]
        return RunResult(
            argv=self.argv,
            exit_code=returncode if returncode is not None and returncode >= 0 else None,
            signal=-returncode if returncode is not None and returncode < 0 else None,
            timed_out=self.timed_out,
            duration_seconds=time.monotonic() - self.started,
            stdout=out.text(),
            stderr=err.text(),
            output_truncated=out.truncated or err.truncated,
            error=error,
            leftovers_killed=self.leftovers,
            cancelled=self.cancelled,
        )

    def _watch(self) -> None:
        for fd in self.captures:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(self.proc.pid)
            self.selector.register(self.pidfd, selectors.EVENT_READ)
        self.selector.register(self._wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select(self._wait_seconds()):
                if key.fd == self._wake_read:
                    self.selector.unregister(self._wake_read)
                    self.cancelled = True
                elif key.fd != self.pidfd:
                    self._read(key.fd)
            now = time.monotonic()
            if self.cancelled and not self.leader_exited and self.term_sent_at is None:
                self._signal_group(signals.SIGTERM, now)
            if not self.leader_exited and self._leader_has_exited():
                self.leader_exited = True
                if self.pidfd is not None:
                    self.selector.unregister(self.pidfd)
            if self.leader_exited:
                if self._cleanup_done(now):
                    return
            elif now >= self.deadline and self.term_sent_at is None:
                self.timed_out = True
                self._signal_group(signals.SIGTERM, now)
            grace_over = self.term_sent_at is not None and now >= self.term_sent_at + self.kill_grace
            if grace_over and self.kill_sent_at is None:
                self._signal_group(signals.SIGKILL, now)
            if self.kill_sent_at is not None and now >= self.kill_sent_at + _AFTER_KILL_SECONDS:
                return

    def _cleanup_done(self, now: float) -> bool:
        """After the leader exits: True once its group is empty and the pipes are closed."""
        members = _group_members(self.pgid, exclude=self.proc.pid)
        pipes_open = any(fd in self.captures for fd in self._registered())
        if not members and not pipes_open:
            return True
        if not members and self.term_sent_at is not None and now >= self.term_sent_at + self.kill_grace:
            # What still holds the pipes left the group (setsid): out of reach, and no longer waited for.
            return True
        if self.term_sent_at is None:
            # Counted once, before any signal: what the probe itself left behind.
            self.leftovers = len(members)
            if members:
                self._signal_group(signals.SIGTERM, now)
            else:
                # Only a process outside the group holds the pipes; it gets the grace to close them.
                self.term_sent_at = now
        return False

    def _registered(self) -> list[int]:
        return [key.fd for key in self.selector.get_map().values()]

    def _wait_seconds(self) -> float:
        now = time.monotonic()
        if self.leader_exited or self.pidfd is None:
            return _POLL_SECONDS
        if self.kill_sent_at is not None:
            return max(0.0, self.kill_sent_at + _AFTER_KILL_SECONDS - now)
        if self.term_sent_at is not None:
            return max(0.0, self.term_sent_at + self.kill_grace - now)
        return max(0.0, self.deadline - now)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.captures[fd].add(data)
        else:
            self.selector.unregister(fd)

    def _leader_has_exited(self) -> bool:
        # WNOWAIT leaves the child a zombie: its pid, and with it the group id, cannot be reused
        # while the group is being signalled.
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def _signal_group(self, signum: signals.Signals, now: float) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)
        if signum == signals.SIGTERM:
            self.term_sent_at = now
        else:
            self.kill_sent_at = now


def _group_members(pgid: int, exclude: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses; the fields after it do not.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members
