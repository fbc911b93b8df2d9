"""The idle guard on a simulated node (real pynvml calls, simulated library) and real commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.checks.probes.idle import IdleGuard
from clusterhealth.exporters.nvml import NvmlSession
from clusterhealth.exporters.sim import nvml as nvml_sim

from .conftest import scenario

Simulate = Callable[[dict[str, Any]], nvml_sim.SimulatedLibrary]


@pytest.fixture
def session() -> Iterator[NvmlSession]:
    s = NvmlSession()
    yield s
    s.shutdown()


def processes(*pids: int) -> dict[str, Any]:
    return {"compute_processes": [{"pid": pid, "used_memory_mib": 70000} for pid in pids]}


def test_a_gpu_with_compute_processes_makes_the_node_busy(simulate: Simulate, session: NvmlSession) -> None:
    simulate(scenario(gpu_count=4, gpus={1: processes(48211, 48212)}))
    assert IdleGuard(session, None, 5).check() == "GPU 1 runs 2 compute processes (pids 48211, 48212)"


def test_every_busy_gpu_is_named(simulate: Simulate, session: NvmlSession) -> None:
    simulate(scenario(gpu_count=8, gpus={3: processes(48213), 6: processes(*range(50000, 50010))}))
    assert IdleGuard(session, None, 5).check() == (
        "GPU 3 runs 1 compute process (pid 48213); "
        "GPU 6 runs 10 compute processes (pids 50000, 50001, 50002, 50003, 50004, 50005, 50006, 50007 "
        "and 2 more)"
    )


def test_no_compute_processes_is_idle(simulate: Simulate, session: NvmlSession) -> None:
    simulate(scenario(gpu_count=8))
    assert IdleGuard(session, None, 5).check() is None


def test_a_job_starting_between_two_checks_is_seen(simulate: Simulate, session: NvmlSession) -> None:
    simulate(scenario(faults=[{"gpu": 0, "from_seconds": 3600, "set": processes(7)}]))
    guard = IdleGuard(session, None, 5)
    assert guard.check() is None
    simulate(scenario(faults=[{"gpu": 0, "from_seconds": 0, "set": processes(7)}]))
    assert guard.check() == "GPU 0 runs 1 compute process (pid 7)"


@pytest.mark.parametrize("state", ["library_missing", "driver_not_loaded"])
def test_nvml_unavailable_is_not_taken_for_idle(simulate: Simulate, session: NvmlSession, state: str) -> None:
    simulate(scenario(nvml=state))
    reason = IdleGuard(session, None, 5).check()
    assert reason is not None and reason.startswith("cannot tell: NVML unavailable (nvmlInit: ")
    assert reason.endswith("set probing.check_gpus_idle: false to probe without this guard")


def test_nvml_coming_back_is_noticed(simulate: Simulate, session: NvmlSession) -> None:
    guard = IdleGuard(session, None, 5)
    simulate(scenario(nvml="library_missing"))
    assert guard.check() is not None
    simulate(scenario())
    assert guard.check() is None


def test_a_lost_gpu_is_not_taken_for_idle(simulate: Simulate, session: NvmlSession) -> None:
    simulate(scenario(gpu_count=4, faults=[{"gpu": 2, "lost": True}]))
    assert IdleGuard(session, None, 5).check() == (
        "cannot tell: GPU 2 does not answer NVML (nvmlDeviceGetHandleByIndex: GpuIsLost)"
    )


@pytest.mark.parametrize("error", ["NotSupported", "Unknown", "NoPermission"])
def test_an_unreadable_process_list_is_not_taken_for_idle(
    simulate: Simulate, session: NvmlSession, error: str
) -> None:
    simulate(scenario(faults=[{"gpu": 1, "errors": {"nvmlDeviceGetComputeRunningProcesses_v3": error}}]))
    assert IdleGuard(session, None, 5).check() == (
        "cannot tell: the compute processes of GPU 1 cannot be read from NVML"
    )


def test_no_session_means_gpus_are_not_looked_at() -> None:
    assert IdleGuard(None, None, 5).check() is None


# -- the busy command: exit 0 busy, 1 idle, anything else cannot tell ---------------------------


def test_busy_command_exiting_0_means_busy() -> None:
    assert IdleGuard(None, ["true"], 5).check() == "busy command exited 0: true"


def test_busy_command_exiting_1_means_idle() -> None:
    assert IdleGuard(None, ["false"], 5).check() is None


def test_what_the_busy_command_found_is_in_the_reason() -> None:
    # The shape of the Slurm check: squeue prints the running job ids, grep -q says whether any.
    command = ["sh", "-c", "printf '812345\\n812346\\n'; true"]
    assert IdleGuard(None, command, 5).check() == (
        "busy command exited 0: sh -c 'printf '\"'\"'812345\\n812346\\n'\"'\"'; true' (printed '812345')"
    )


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (["sh", "-c", "exit 2"], "cannot tell: busy command exited 2 (0 means busy, 1 idle): sh -c 'exit 2'"),
        (
            ["sh", "-c", "kill -TERM $$"],
            "cannot tell: busy command was killed by SIGTERM (0 means busy, 1 idle)",
        ),
        (
            ["squeue-not-here"],
            "cannot tell: busy command squeue-not-here: executable not found: squeue-not-here",
        ),
    ],
)
def test_a_busy_command_that_cannot_answer_is_not_taken_for_idle(command: list[str], reason: str) -> None:
    result = IdleGuard(None, command, 5).check()
    assert result is not None and result.startswith(reason)


def test_a_hanging_busy_command_is_cut_at_its_timeout() -> None:
    reason = IdleGuard(None, ["sleep", "60"], 1).check()
    assert reason == "cannot tell: busy command timed out after 1 s: sleep 60"


def test_busy_gpus_answer_without_running_the_command(
    simulate: Simulate, session: NvmlSession, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w'); raise SystemExit(1)"]
    simulate(scenario(gpus={0: processes(4242)}))
    assert IdleGuard(session, command, 5).check() == "GPU 0 runs 1 compute process (pid 4242)"
    assert not marker.exists()
    simulate(scenario())
    assert IdleGuard(session, command, 5).check() is None
    assert marker.exists()


def test_idle_gpus_and_a_busy_command_is_busy(simulate: Simulate, session: NvmlSession) -> None:
    simulate(scenario())
    assert IdleGuard(session, ["true"], 5).check() == "busy command exited 0: true"


@pytest.mark.parametrize(("command", "timeout"), [([], 5.0), (["true"], 0.0)])
def test_bad_configuration_is_refused(command: list[str], timeout: float) -> None:
    with pytest.raises(ValueError):
        IdleGuard(None, command, timeout)
