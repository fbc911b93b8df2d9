"""The probe lock across real processes: exclusion, holder diagnostics, release on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterhealth.checks.probes.lock import ProbeLock, ProbeLockHeld

# A second process (another agent, a manual `clusterhealth probe run`): tries the lock, says what
# it got, and holds it until told to stop on stdin.
OTHER_PROCESS = """
import sys
from clusterhealth.checks.probes.lock import ProbeLock
lock = ProbeLock(sys.argv[1])
got = lock.acquire(sys.argv[2])
print("acquired" if got else "busy " + str(lock.holder()), flush=True)
sys.stdin.readline()
"""


class Other:
    def __init__(self, path: Path, probe: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OTHER_PROCESS, str(path), probe],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.said = self.proc.stdout.readline().strip()

    def finish(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(10)


@pytest.fixture
def other() -> Iterator[type[Other]]:
    started: list[Other] = []

    class Tracked(Other):
        def __init__(self, path: Path, probe: str):
            super().__init__(path, probe)
            started.append(self)

    yield Tracked
    for proc in started:
        proc.proc.kill()
        proc.proc.wait()


def test_a_second_process_cannot_take_a_held_lock(tmp_path: Path, other: type[Other]) -> None:
    path = tmp_path / "probe.lock"
    lock = ProbeLock(path)
    assert lock.acquire("allreduce")
    second = other(path, "ib_pairwise")
    assert second.said == f"busy pid {os.getpid()} probe allreduce"
    lock.release()
    third = other(path, "ib_pairwise")
    assert third.said == "acquired"


def test_a_lock_held_by_another_process_is_refused_here(tmp_path: Path, other: type[Other]) -> None:
    path = tmp_path / "probe.lock"
    holder = other(path, "allreduce")
    assert holder.said == "acquired"
    lock = ProbeLock(path)
    assert not lock.acquire("ib_pairwise")
    assert not lock.held
    assert lock.holder() == f"pid {holder.proc.pid} probe allreduce"
    holder.finish()
    assert lock.acquire("ib_pairwise")
    lock.release()


def test_the_lock_dies_with_its_holder(tmp_path: Path, other: type[Other]) -> None:
    path = tmp_path / "probe.lock"
    holder = other(path, "allreduce")
    assert holder.said == "acquired"
    assert not ProbeLock(path).acquire()
    holder.proc.send_signal(signal.SIGKILL)  # no cleanup code runs
    holder.proc.wait(10)
    lock = ProbeLock(path)
    assert lock.acquire("ib_pairwise")
    assert lock.holder() == f"pid {os.getpid()} probe ib_pairwise"
    lock.release()


def test_a_probes_child_does_not_inherit_the_lock(tmp_path: Path, other: type[Other]) -> None:
    # A leftover of a probe (or any child started while the lock is held) must not keep holding it
    # after the agent released it or died.
    path = tmp_path / "probe.lock"
    lock = ProbeLock(path)
    assert lock.acquire("allreduce")
    child = subprocess.Popen(["sleep", "60"], close_fds=False)
    try:
        lock.release()
        assert other(path, "ib_pairwise").said == "acquired"
    finally:
        child.kill()
        child.wait()


def test_two_locks_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    # The agent's scheduler threads and an in-process manual run.
    first, second = ProbeLock(tmp_path / "probe.lock"), ProbeLock(tmp_path / "probe.lock")
    assert first.acquire("allreduce")
    assert not second.acquire("ib_pairwise")
    first.release()
    assert second.acquire("ib_pairwise")
    second.release()


def test_context_manager_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "run" / "clusterhealth" / "probe.lock"  # the directory is created
    with ProbeLock(path, "allreduce") as lock:
        assert lock.held
        with pytest.raises(ProbeLockHeld, match=f"pid {os.getpid()} probe allreduce"), ProbeLock(path, "ib"):
            pass
    assert not lock.held
    with ProbeLock(path, "ib"):
        pass


def test_the_file_is_emptied_on_release(tmp_path: Path) -> None:
    lock = ProbeLock(tmp_path / "probe.lock", "allreduce")
    assert lock.acquire()
    lock.release()
    assert lock.holder() is None


def test_acquiring_twice_is_a_programming_error(tmp_path: Path) -> None:
    lock = ProbeLock(tmp_path / "probe.lock")
    assert lock.acquire()
    with pytest.raises(RuntimeError):
        lock.acquire()
    lock.release()
    lock.release()  # releasing a released lock is harmless
