"""Which job or pod a process belongs to, from /proc/<pid>/cgroup (exporters/jobs/cgroup.py), on the
cgroup layouts of tests/fixtures/cgroup/ (their sources are in its README), and which Slurm jobs
still have a cgroup under a sysfs tree."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.jobs.cgroup import CgroupOwner, owner_of, read_owner, slurm_jobs

from .conftest import FIXTURES

CGROUPS = FIXTURES / "cgroup"


@pytest.mark.parametrize(
    ("fixture", "owner"),
    [
        ("slurm-v1.txt", CgroupOwner("slurm", job="123")),
        ("slurm-v2.txt", CgroupOwner("slurm", job="3385")),
        ("slurm-v2-multiple-slurmd.txt", CgroupOwner("slurm", job="3385")),
        (
            "kubernetes-cgroupfs-v1.txt",
            CgroupOwner("kubernetes", pod_uid="74c13223-5a00-11e9-b385-42010a80018d"),
        ),
        (
            "kubernetes-systemd-v2.txt",
            CgroupOwner("kubernetes", pod_uid="4b1f4f77-49e6-4e30-98db-e98055c8a54f"),
        ),
        (
            "kubernetes-systemd-v2-guaranteed.txt",
            CgroupOwner("kubernetes", pod_uid="6c1a4e95-6bb6-11e6-bc26-28d2444e470d"),
        ),
        (
            "kubernetes-systemd-v2-cgroupns.txt",
            CgroupOwner("kubernetes", pod_uid="3f9a1c22-7b04-4d51-b2ef-0a9c1d4e88f1"),
        ),
        ("slurmd-itself-v2.txt", None),
        ("user-session-v2.txt", None),
    ],
)
def test_each_layout_names_its_job_or_pod(fixture: str, owner: CgroupOwner | None) -> None:
    assert owner_of((CGROUPS / fixture).read_text()) == owner


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "0::/system.slice/job_12/step_0",  # a job_ directory outside Slurm's tree
        "0::/pod4b1f4f77_49e6_4e30_98db_e98055c8a54f.slice",  # a pod-like name outside kubepods
        "0::/kubepods.slice/kubepods-podnot-a-uid.slice",
        "\x00\xff:::",
    ],
)
def test_what_is_no_job_says_so(text: str) -> None:
    assert owner_of(text) is None


def test_a_process_is_read_under_the_procfs_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text((CGROUPS / "slurm-v2.txt").read_text())
    assert read_owner(str(tmp_path), 4242) == CgroupOwner("slurm", job="3385")
    # A process that exited since NVML listed it has no directory: ENOENT, which callers skip.
    assert read_owner(str(tmp_path), 4243) == sysfs.Failure("ENOENT")


def test_an_unreadable_cgroup_file_is_a_failure_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_1/step_0\n")

    def denied(path: str, flags: int, dir_fd: int | None = None) -> int:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(sysfs, "_open", denied)
    assert read_owner(str(tmp_path), 7) == sysfs.Failure("EACCES")


def test_running_slurm_jobs_are_their_cgroups_v1_or_v2(tmp_path: Path) -> None:
    assert slurm_jobs(str(tmp_path)) is None  # no Slurm cgroup tree: nobody can tell
    v2 = tmp_path / "v2" / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope"
    (v2 / "job_3385" / "step_0").mkdir(parents=True)
    (v2 / "job_3386").mkdir()
    (v2 / "system").mkdir()
    assert slurm_jobs(str(tmp_path / "v2")) == {"3385", "3386"}
    v1 = tmp_path / "v1" / "fs" / "cgroup"
    (v1 / "freezer" / "slurm" / "uid_100" / "job_123" / "step_0").mkdir(parents=True)
    (v1 / "memory" / "slurm" / "uid_101" / "job_124").mkdir(parents=True)
    assert slurm_jobs(str(tmp_path / "v1")) == {"123", "124"}
    (v1 / "freezer" / "slurm" / "uid_100" / "job_123" / "step_0").rmdir()
    (v1 / "freezer" / "slurm" / "uid_100" / "job_123").rmdir()
    assert slurm_jobs(str(tmp_path / "v1")) == {"124"}
    empty = tmp_path / "idle" / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope"
    empty.mkdir(parents=True)
    assert slurm_jobs(str(tmp_path / "idle")) == set()  # Slurm is there and runs no job


def test_running_slurm_jobs_under_each_slurmd_of_a_node(tmp_path: Path) -> None:
    # Several slurmd on one host: cgroup v2 gives each its `<node>_slurmstepd.scope` (the layout of
    # fixtures/cgroup/slurm-v2-multiple-slurmd.txt), v1 its `slurm_<node>`.
    v2 = tmp_path / "v2" / "fs" / "cgroup" / "system.slice"
    (v2 / "gamba1_slurmstepd.scope" / "job_3385" / "step_interactive").mkdir(parents=True)
    (v2 / "gamba2_slurmstepd.scope" / "job_3390").mkdir(parents=True)
    (v2 / "sshd.service").mkdir()
    assert slurm_jobs(str(tmp_path / "v2")) == {"3385", "3390"}
    owner = owner_of((CGROUPS / "slurm-v2-multiple-slurmd.txt").read_text())
    assert owner == CgroupOwner("slurm", job="3385")
    v1 = tmp_path / "v1" / "fs" / "cgroup"
    (v1 / "memory" / "slurm_gamba1" / "uid_100" / "job_77").mkdir(parents=True)
    (v1 / "memory" / "slurm_gamba2" / "uid_100" / "job_78").mkdir(parents=True)
    assert slurm_jobs(str(tmp_path / "v1")) == {"77", "78"}
