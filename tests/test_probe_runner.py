"""The probe runner against real processes: timeouts, process groups, output caps, start errors.

Every test ends with a check that nothing it started is left (running, or a zombie not reaped):
the runner must reap what it starts and end what that forked, however the run ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterhealth.checks.probes.runner import RunResult, run, template

PY = sys.executable


# Set to a value of each test's own in the environment the runner's children inherit, and their
# children in turn, wherever they are reparented when their parent exits.
MARK = "CLUSTERHEALTH_TEST_PROBE_RUNNER"


@pytest.fixture(autouse=True)
def nothing_left_behind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only what this test started counts: the pytest worker also holds daemons that other modules'
    session fixtures started (a kube-apiserver and its etcd, Prometheus servers) and that live on
    between tests. Left behind is a child of this process that was not there before the test (a run
    not reaped), or any process that carries the test's mark (a grandchild the runner did not end:
    orphaned, it is no child of ours any more)."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    before = set(psutil.Process().children())
    yield
    left = [child for child in psutil.Process().children() if child not in before]
    # A process the test itself killed (the escaped one) may take a moment to die on a busy machine.
    deadline = time.monotonic() + 5
    while (marked := _running_with(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left += [process for process in marked if process not in left]
    assert left == [], f"processes left behind: {[_described(p) for p in left]}"


def _running_with(mark: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get(MARK) == mark:
                found.append(process)
    return found


def _described(process: psutil.Process) -> tuple[int, str, str] | int:
    try:
        return (process.pid, process.name(), process.status())
    except psutil.Error:
        return process.pid


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for init: either way it runs no more."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


# -- exit status ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 2, 7, 255])
def test_exit_code_is_reported(code: int) -> None:
    result = run(["sh", "-c", f"exit {code}"], timeout=10)
    assert (result.exit_code, result.signal, result.timed_out, result.error) == (code, None, False, None)
    assert result.completed


def test_a_signal_that_ends_the_child_is_reported_instead_of_an_exit_code() -> None:
    result = run(["sh", "-c", "kill -USR1 $$"], timeout=10)
    assert (result.exit_code, result.signal, result.signal_name) == (None, signal.SIGUSR1, "SIGUSR1")
    assert not result.timed_out and not result.completed


def test_stdout_and_stderr_are_captured_apart() -> None:
    result = run(["sh", "-c", "echo out; echo err >&2; echo more"], timeout=10)
    assert (result.stdout, result.stderr) == ("out\nmore\n", "err\n")
    assert result.output == "out\nmore\nerr\n"
    assert not result.output_truncated


def test_arguments_reach_the_program_verbatim_without_a_shell() -> None:
    result = run(["echo", "$(id -u)", ";", "rm -rf /", "*"], timeout=10)
    assert result.stdout == "$(id -u) ; rm -rf / *\n"


def test_stdin_is_empty_so_a_program_that_reads_it_does_not_hang() -> None:
    result = run(["cat"], timeout=10)
    assert (result.exit_code, result.timed_out, result.stdout) == (0, False, "")


def test_env_is_laid_over_the_agents_environment(tmp_path: Path) -> None:
    result = run(
        ["sh", "-c", 'echo "$NCCL_IB_HCA|$PATH"; pwd'],
        timeout=10,
        env={"NCCL_IB_HCA": "mlx5_0"},
        cwd=tmp_path,
    )
    first, second = result.stdout.splitlines()
    assert first == f"mlx5_0|{os.environ['PATH']}"
    assert Path(second).resolve() == tmp_path.resolve()


def test_undecodable_output_is_replaced_not_raised() -> None:
    result = run([PY, "-c", "import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')"], timeout=10)
    assert result.stdout == "ok \ufffd\ufffd end\n"


# -- programs that cannot start ---------------------------------------------------------------


def test_missing_binary_is_a_result_not_an_exception() -> None:
    result = run(["ib_write_bw-not-installed-here", "-d", "mlx5_0"], timeout=10)
    assert result.error == "executable not found: ib_write_bw-not-installed-here"
    assert (result.exit_code, result.signal, result.timed_out, result.stdout) == (None, None, False, "")
    assert not result.completed


def test_file_without_execute_permission(tmp_path: Path) -> None:
    tool = tmp_path / "nccl-probe"
    tool.write_text("#!/bin/sh\necho never\n")
    tool.chmod(0o644)
    assert run([str(tool)], timeout=10).error == f"permission denied: {tool}"


def test_file_that_is_not_a_program(tmp_path: Path) -> None:
    tool = tmp_path / "garbage"
    tool.write_bytes(b"\x00\x01\x02 not an executable format")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    result = run([str(tool)], timeout=10)
    assert result.error is not None and result.error.startswith(f"cannot start {tool}: ")


def test_missing_working_directory_is_named(tmp_path: Path) -> None:
    result = run(["true"], timeout=10, cwd=tmp_path / "gone")
    assert result.error == f"cannot enter working directory {tmp_path / 'gone'}: No such file or directory"


@pytest.mark.parametrize(
    ("argv", "kwargs"),
    [([], {"timeout": 1}), (["true"], {"timeout": 0}), (["true"], {"timeout": 1, "kill_grace": -1})],
)
def test_bad_arguments_are_programming_errors(argv: list[str], kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        run(argv, **kwargs)  # type: ignore[arg-type]


# -- timeouts ---------------------------------------------------------------------------------


def test_timeout_terminates_the_child() -> None:
    result = run(["sleep", "60"], timeout=1)
    assert result.timed_out
    assert (result.exit_code, result.signal) == (None, signal.SIGTERM)
    assert 1 <= result.duration_seconds < 6


def test_output_before_the_timeout_is_kept() -> None:
    result = run(["sh", "-c", "echo '# nccl-tests started'; exec sleep 60"], timeout=1)
    assert result.timed_out and result.stdout == "# nccl-tests started\n"


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    result = run(["sh", "-c", "trap '' TERM; sleep 60; echo survived"], timeout=1, kill_grace=1)
    assert result.timed_out
    assert result.signal == signal.SIGKILL
    assert "survived" not in result.stdout
    assert 2 <= result.duration_seconds < 7


def test_timeout_kills_grandchildren_too() -> None:
    # The shell waits on a grandchild that ignores SIGTERM: only the group's SIGKILL ends both.
    result = run(["sh", "-c", "(trap '' TERM; exec sleep 60) & echo $!; wait"], timeout=1, kill_grace=1)
    assert result.timed_out
    grandchild = int(result.stdout.split()[-1])
    assert dead(grandchild)
    assert result.duration_seconds < 8


class Interrupted(Exception):
    pass


def test_an_interrupted_run_takes_its_process_group_down(tmp_path: Path) -> None:
    # Ctrl-C on `clusterhealth probe run`: the terminal's SIGINT never reaches the probe's own
    # session, so the runner has to end it on the way out.
    pid_file = tmp_path / "pid"

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(Interrupted):
            run(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert dead(int(pid_file.read_text()))


# -- leftovers: the group dies with its leader ------------------------------------------------


def test_background_job_holding_the_pipes_is_killed_when_the_child_exits() -> None:
    # Waiting for the background job instead of killing it would end in the timeout.
    result = run(["sh", "-c", "sleep 100 & echo $!"], timeout=20)
    assert (result.exit_code, result.timed_out, result.leftovers_killed) == (0, False, 1)
    assert dead(int(result.stdout))


def test_background_job_that_closed_the_pipes_is_killed_too() -> None:
    result = run(["sh", "-c", "sleep 100 >/dev/null 2>&1 & echo $!"], timeout=60)
    assert (result.exit_code, result.leftovers_killed) == (0, 1)
    assert dead(int(result.stdout))


def test_leftover_that_ignores_sigterm_gets_sigkill() -> None:
    result = run(["sh", "-c", "trap '' TERM; sleep 100 & echo $!"], timeout=60, kill_grace=1)
    assert (result.exit_code, result.timed_out, result.leftovers_killed) == (0, False, 1)
    assert dead(int(result.stdout))
    assert 1 <= result.duration_seconds < 6


def test_output_printed_by_the_child_before_it_exits_is_complete() -> None:
    result = run(["sh", "-c", "sleep 100 & seq 1 20000"], timeout=60)
    assert result.stdout.splitlines() == [str(n) for n in range(1, 20001)]


def test_a_process_that_left_the_group_is_not_waited_for_beyond_the_grace() -> None:
    # A daemonising helper (setsid) keeps the pipes open but is out of the group's reach.
    script = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen(['setsid', 'sleep', '60'])\n"
        "while os.getsid(p.pid) == os.getsid(0): time.sleep(0.01)\n"
        "print(p.pid, flush=True)\n"
    )
    result = run([PY, "-c", script], timeout=60, kill_grace=1)
    escaped = int(result.stdout)
    try:
        assert (result.exit_code, result.timed_out, result.leftovers_killed) == (0, False, 0)
        assert result.duration_seconds < 6
        assert psutil.pid_exists(escaped), "documented limitation: a process in its own session survives"
    finally:
        os.kill(escaped, signal.SIGKILL)


# -- output capture ---------------------------------------------------------------------------


def test_both_pipes_are_drained_concurrently() -> None:
    # 4 MiB on stderr before a byte on stdout: a reader of stdout alone would deadlock at 64 KiB.
    script = "import sys; sys.stderr.write('e' * (4 << 20)); sys.stderr.flush(); sys.stdout.write('done')"
    result = run([PY, "-c", script], timeout=30, max_output_bytes=8 << 20)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert (len(result.stderr), result.stdout, result.output_truncated) == (4 << 20, "done", False)


def test_a_flood_keeps_head_and_tail_and_drops_the_middle() -> None:
    cap = 64 * 1024
    row = len("row 00000000 ") + 40 + 1
    script = (
        "import sys\n"
        "print('# nccl-tests header')\n"
        "for i in range(400000): print(f'row {i:08d} ' + 'x' * 40)\n"
        "print('# Avg bus bandwidth    : 439.369')\n"
        "sys.stderr.write('warn\\n' * 100000)\n"
    )
    result = run([PY, "-c", script], timeout=60, max_output_bytes=cap)
    assert (result.exit_code, result.timed_out, result.output_truncated) == (0, False, True)
    lines = result.stdout.splitlines()
    assert lines[0] == "# nccl-tests header"
    assert lines[-1] == "# Avg bus bandwidth    : 439.369"
    markers = [line for line in lines if "clusterhealth dropped" in line]
    assert len(markers) == 1
    # Whole lines on both sides of the cut: every other line is a complete row.
    rows = [line for line in lines[1:-1] if line not in markers]
    assert all(len(line) + 1 == row for line in rows)
    kept = len(result.stdout.encode()) - len(markers[0]) - 1
    assert cap - 2 * row <= kept <= cap
    dropped = int(markers[0].split("dropped ")[1].split()[0])
    assert kept + dropped == len("# nccl-tests header\n") + 400000 * row + len(
        "# Avg bus bandwidth    : 439.369\n"
    )
    assert result.stderr.startswith("warn\n") and result.stderr.endswith("warn\n")
    assert len(result.stderr.encode()) < cap + 100


def test_output_at_the_cap_is_kept_whole() -> None:
    result = run([PY, "-c", "import sys; sys.stdout.write('a' * 1000)"], timeout=10, max_output_bytes=1000)
    assert (result.stdout, result.output_truncated) == ("a" * 1000, False)


def test_runs_in_parallel_threads_do_not_mix() -> None:
    results: dict[int, RunResult] = {}

    def one(n: int) -> None:
        results[n] = run(["sh", "-c", f"for i in $(seq 1 2000); do echo {n}; done"], timeout=30)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, result in results.items():
        assert result.stdout == f"{n}\n" * 2000


# -- stop_all ---------------------------------------------------------------------------------

# A probe that shrugs SIGTERM off, run on a thread of its own, and stop_all() called from the main
# thread as the agent's shutdown calls it, then the process exits as the agent does. In a process of
# its own: stop_all() leaves the runner stopped for good.
_STOP_ALL = """
import os, sys, threading, time
from clusterhealth.checks.probes import runner
pidfile = sys.argv[1]
results = []
argv = ["sh", "-c", f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done"]
probe = lambda: results.append(runner.run(argv, timeout=60, kill_grace=1))
threading.Thread(target=probe, daemon=True).start()
while not os.path.exists(pidfile) or not open(pidfile).read().strip():
    time.sleep(0.05)
runner.stop_all()
print(results[0].cancelled if results else "still running")
"""


def test_stop_all_returns_once_the_runs_in_progress_have_ended(tmp_path: Path) -> None:
    # The agent exits right after stop_all(), and its threads with it: a probe whose supervisor had
    # not had the time to signal it (a loaded machine) would outlive the agent, holding its port.
    pidfile = tmp_path / "pid"
    try:
        done = subprocess.run([PY, "-c", _STOP_ALL, str(pidfile)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "True", "stop_all() returned before the run ended"
        assert dead(int(pidfile.read_text()))
    finally:
        if pidfile.exists() and pidfile.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)


# -- template ---------------------------------------------------------------------------------


def test_template_fills_placeholders_argument_by_argument() -> None:
    argv = ["ib_write_bw", "-d", "{device}", "-p", "{port}", "{peer}", "--label={peer}:{port}", "{{literal}}"]
    values = {"device": "mlx5_0", "port": "18515", "peer": "node 7; rm -rf /"}
    assert template(argv, values) == [
        "ib_write_bw",
        "-d",
        "mlx5_0",
        "-p",
        "18515",
        "node 7; rm -rf /",
        "--label=node 7; rm -rf /:18515",
        "{literal}",
    ]


def test_template_result_runs_as_one_argument_per_placeholder() -> None:
    argv = template(["printf", "%s|", "{peer}", "{device}"], {"peer": "a b", "device": "$(echo c)"})
    assert run(argv, timeout=10).stdout == "a b|$(echo c)|"


def test_unknown_placeholder_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown placeholder \{hca\}; known: \{peer\}, \{port\}"):
        template(["ib_write_bw", "-d", "{hca}"], {"peer": "n1", "port": "1"})


@pytest.mark.parametrize(
    "arg", ["{peer.__class__}", "{peer[0]}", "{peer!r}", "{port:05}", "{}", "{peer", "x}"]
)
def test_only_plain_names_are_placeholders(arg: str) -> None:
    with pytest.raises(ValueError, match="argument"):
        template([arg], {"peer": "n1", "port": "1"})
