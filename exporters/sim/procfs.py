"""The simulated node's /proc and job cgroups: where its GPUs' compute processes belong.

A scenario's `compute_processes` name each process's pid and, optionally, its `cgroup`: the line
`/proc/<pid>/cgroup` holds, which places it in a Slurm job or a Kubernetes pod. `build` writes
`<root>/<pid>/cgroup` for each of them (what the jobs collector's cgroup fallback reads under
`--procfs-root`); `build_job_cgroups` makes the Slurm job cgroups under a simulated sysfs tree (what
tells the mapping-directory reader that a job still runs). Both cover every process the GPUs have
at any time of the scenario (its faults' too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clusterhealth.exporters.sim.scenario import Scenario

_SLURM_V2 = re.compile(r"^0::(/system\.slice/[^/]*slurmstepd\.scope/job_\d+)(?:/|$)")
_SLURM_V1 = re.compile(r"^\d+:[^:]*:(/slurm[^/]*/uid_\d+/job_\d+)(?:/|$)")


def processes(scenario: Scenario) -> Iterator[dict[str, Any]]:
    """Every compute process of the scenario's GPUs, in their base state and under each fault."""
    for gpu in scenario.gpus:
        yield from gpu["compute_processes"]
    for fault in scenario.faults:
        yield from fault.set.get("compute_processes", ())


def build(root: Path, scenario: Scenario) -> None:
    """`<root>/<pid>/cgroup` for every compute process that names its cgroup."""
    for process in processes(scenario):
        if "cgroup" in process:
            (root / str(process["pid"])).mkdir(parents=True, exist_ok=True)
            (root / str(process["pid"]) / "cgroup").write_text(process["cgroup"].rstrip("\n") + "\n")


def build_job_cgroups(sysfs_root: Path, scenario: Scenario) -> None:
    """The Slurm job cgroup directory of every process placed in a Slurm job (cgroup v1 or v2)."""
    for process in processes(scenario):
        for line in process.get("cgroup", "").splitlines():
            match = _SLURM_V2.match(line)
            if match:
                (sysfs_root / "fs" / "cgroup" / match.group(1).lstrip("/")).mkdir(parents=True, exist_ok=True)
                continue
            match = _SLURM_V1.match(line)
            if match:
                for controller in line.split(":")[1].split(","):
                    if not controller or "=" in controller:
                        continue  # named hierarchies (name=systemd) are mounted under other names
                    job = sysfs_root / "fs" / "cgroup" / controller / match.group(1).lstrip("/")
                    job.mkdir(parents=True, exist_ok=True)
