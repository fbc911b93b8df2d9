"""Which Slurm job or Kubernetes pod a process belongs to, from its /proc/<pid>/cgroup.

Pure parsing (`owner_of`) of the cgroup paths schedulers make, and a bounded reader
(`read_owner`) that reads the file through exporters/sysfs.py's read layer. The layouts, each
from its source (tests/fixtures/cgroup/README.md has the captures):

- Slurm, cgroup v1 (task/cgroup, proctrack/cgroup): one line per hierarchy,
  `4:memory:/slurm/uid_100/job_123/step_0/task_2` (Slurm's cgroups guide; `slurm_<node>` with
  multiple slurmd per host);
- Slurm, cgroup v2: `0::/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0` (Slurm's
  cgroup v2 guide; `<node>_slurmstepd.scope` with multiple slurmd);
- Kubernetes, cgroupfs driver: `/kubepods/besteffort/pod74c13223-5a00-11e9-.../<container id>`
  (Guaranteed pods sit right under `/kubepods`);
- Kubernetes, systemd driver: `/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod4b1f4f77_49e6_4e30_98db_e98055c8a54f.slice/cri-containerd-<id>.scope`: the
  UID's dashes escaped as underscores (the kubelet's cgroup_manager_linux.go).

A reader in its own cgroup namespace (the agent in a container) sees other cgroups' paths relative
to its own, `/../../kubepods-...slice/...`: the parts are matched one by one, so that still parses.

`slurm_jobs` lists the Slurm jobs that have a cgroup under a sysfs root (the mapping directory's
files of other jobs have expired).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from clusterhealth.exporters import sysfs

# /proc/<pid>/cgroup is one line per hierarchy: a dozen lines of a few hundred bytes at most.
MAX_CGROUP_BYTES = 16 * 1024

_JOB = re.compile(r"job_(\d+)")
_POD = re.compile(
    r"(?:kubepods(?:-[a-z]+)*-)?pod"
    r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?"
)


@dataclass(frozen=True)
class CgroupOwner:
    """A Slurm job (`job` its id) or a Kubernetes pod (`pod_uid` its UID)."""

    scheduler: str  # "slurm" or "kubernetes"
    job: str = ""
    pod_uid: str = ""


def _slurm_root(part: str) -> bool:
    """`slurm` (v1), `slurm_<node>` (v1, multiple slurmd), `[<node>_]slurmstepd.scope` (v2)."""
    return part == "slurm" or part.startswith("slurm_") or part.endswith("slurmstepd.scope")


def owner_of(text: str) -> CgroupOwner | None:
    """The job or pod of the process whose /proc/<pid>/cgroup is `text`; None when neither."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        parts = fields[2].split("/")
        for n, part in enumerate(parts):
            job = _JOB.fullmatch(part)
            if job and any(_slurm_root(p) for p in parts[:n]):
                return CgroupOwner("slurm", job=job.group(1))
            pod = _POD.fullmatch(part)
            if pod and any(p.startswith("kubepods") for p in parts[:n]):
                return CgroupOwner("kubernetes", pod_uid=pod.group(1).replace("_", "-"))
    return None


def read_owner(procfs_root: str, pid: int) -> CgroupOwner | sysfs.Failure | None:
    """The owner of process `pid`, None when it belongs to no job or pod, or why the file could not
    be read (ENOENT: the process exited)."""
    raw = sysfs.read_raw(os.path.join(procfs_root, str(pid), "cgroup"), limit=MAX_CGROUP_BYTES)
    if isinstance(raw, sysfs.Failure):
        return raw
    return owner_of(sysfs.decode(raw))


def slurm_jobs(sysfs_root: str) -> set[str] | None:
    """The ids of the Slurm jobs that have a cgroup on this node, or None when no Slurm cgroup tree
    is there at all (Slurm without cgroup plugins, or sysfs not mounted): then nobody can tell."""
    cgroup = Path(sysfs_root) / "fs" / "cgroup"
    roots = [
        *cgroup.glob("system.slice/*slurmstepd.scope"),
        *cgroup.glob("*/slurm"),
        *cgroup.glob("*/slurm_*"),
    ]
    if not roots:
        return None
    jobs: set[str] = set()
    for root in roots:
        # v2 keeps jobs right under the scope; v1 under uid_<uid>.
        for job in (*root.glob("job_*"), *root.glob("uid_*/job_*")):
            match = _JOB.fullmatch(job.name)
            if match:
                jobs.add(match.group(1))
    return jobs


__all__ = ["CgroupOwner", "owner_of", "read_owner", "slurm_jobs"]
