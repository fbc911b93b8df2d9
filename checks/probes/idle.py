"""The idle guard: a probe only starts on a node that runs no job.

A fabric probe saturates the GPUs and links it measures. On a node that runs a training job it
would slow the job down and measure the contention, not the fabric. Two signals, either one
enough to say busy:

* NVML compute processes on any GPU. A training job holds a CUDA context for its whole life, so
  an empty process list on every GPU is a strong "idle". (A permanent compute process such as an
  MPS server would make every check say busy; such nodes need the busy command instead.)
* The busy command, for what NVML cannot see: a job allocated but not yet on the GPUs, or a
  CPU-only job on a node with iperf3 probes. Convention, that of ``grep -q`` and ``pgrep``:
  **exit 0 means busy** (something was found), exit 1 means idle, anything else (another exit
  code, a signal, a timeout, a missing program) means the command could not tell. For Slurm::

      busy_command: [sh, -c, "squeue -h -w $(hostname -s) -t R,CG -o %i | grep -q ."]

  exits 0 while a job runs or completes on the node. The command runs through the probe runner,
  without a shell unless it names one.

The guard fails safe: "cannot tell" counts as busy, with a reason that starts with
``cannot tell:``. NVML unavailable (library missing, driver not loaded), a GPU that stopped
answering, a process list that cannot be read: a skipped probe costs one data point, a probe run
over a job costs the job. ``session=None`` is not "cannot tell": it is the configuration of a
node whose probes do not concern GPUs, or that has none, and the GPU check is left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import pynvml

from clusterhealth.checks.probes import runner
from clusterhealth.exporters.nvml import GpuGone, NvmlSession, NvmlUnavailable

# Beyond this many pids a reason lists the first ones and the count.
_MAX_PIDS_SHOWN = 8
_MAX_OUTPUT_SHOWN = 200


class IdleGuard:
    def __init__(self, session: NvmlSession | None, busy_command: Sequence[str] | None, timeout: float):
        if busy_command is not None and not busy_command:
            raise ValueError("busy_command is empty; use None for no command")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.session = session
        self.busy_command = tuple(busy_command) if busy_command is not None else None
        self.timeout = timeout

    def check(self) -> str | None:
        """None when the node is idle; otherwise why a probe must not start now."""
        if self.session is not None and (reason := self._gpus_busy(self.session)) is not None:
            return reason
        if self.busy_command is not None:
            return self._command_busy(self.busy_command)
        return None

    def _gpus_busy(self, s: NvmlSession) -> str | None:
        try:
            busy = []
            for device in s.devices():
                if device.gone is not None:
                    raise device.gone
                processes = s.query(
                    device.index,
                    "nvmlDeviceGetComputeRunningProcesses",
                    pynvml.nvmlDeviceGetComputeRunningProcesses,
                    device.handle,
                )
                if processes is None:
                    return (
                        f"cannot tell: the compute processes of GPU {device.index} cannot be read from NVML"
                    )
                if processes:
                    busy.append(_gpu_reason(device.index, [int(p.pid) for p in processes]))
        except NvmlUnavailable as exc:
            # The usual case on a node without GPUs, or in a container without the NVIDIA runtime:
            # say how to run the probes anyway.
            return (
                f"cannot tell: NVML unavailable ({exc}); on a node without GPUs set "
                "probing.check_gpus_idle: false to probe without this guard"
            )
        except GpuGone as gone:
            if gone.index < 0:
                return f"cannot tell: NVML failed ({gone.call}: {gone.error})"
            return f"cannot tell: GPU {gone.index} does not answer NVML ({gone.call}: {gone.error})"
        return "; ".join(busy) if busy else None

    def _command_busy(self, argv: tuple[str, ...]) -> str | None:
        result = runner.run(argv, timeout=self.timeout, max_output_bytes=4096)
        if result.error is not None:
            return f"cannot tell: busy command {result.command}: {result.error}"
        if result.timed_out:
            return f"cannot tell: busy command timed out after {self.timeout:g} s: {result.command}"
        if result.exit_code == 1:
            return None
        if result.exit_code == 0:
            first_line = next((line.strip() for line in result.stdout.splitlines() if line.strip()), "")
            shown = f" (printed {first_line[:_MAX_OUTPUT_SHOWN]!r})" if first_line else ""
            return f"busy command exited 0: {result.command}{shown}"
        if result.signal is not None:
            how = f"was killed by {result.signal_name}"
        else:
            how = f"exited {result.exit_code}"
        return f"cannot tell: busy command {how} (0 means busy, 1 idle): {result.command}"


def _gpu_reason(index: int, pids: list[int]) -> str:
    shown = ", ".join(str(pid) for pid in pids[:_MAX_PIDS_SHOWN])
    more = f" and {len(pids) - _MAX_PIDS_SHOWN} more" if len(pids) > _MAX_PIDS_SHOWN else ""
    noun = "process" if len(pids) == 1 else "processes"
    return f"GPU {index} runs {len(pids)} compute {noun} (pid{'s' if len(pids) > 1 else ''} {shown}{more})"
