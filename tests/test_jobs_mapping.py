"""The job-mapping directory against the node's Slurm cgroups: which files have ended (array tasks
and heterogeneous components as sites' scripts name them, job ids that are prefixes of others), and
files an Epilog removes while the agent reads the directory."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.jobs import mapping as mapping_module
from clusterhealth.exporters.jobs.mapping import read_mapping_dir

from .conftest import scenario
from .jobs import gauge, info_rows, jobs_node

# Four GPUs whose device files do not follow NVML's PCI order: NVML index -> minor number.
MINORS = {0: 2, 1: 3, 2: 0, 3: 1}
NODE = scenario(gpu_count=4, gpus={i: {"minor_number": m} for i, m in MINORS.items()})


def test_array_tasks_and_heterogeneous_components_are_not_looked_up_by_their_notation(tmp_path: Path) -> None:
    """Each array task and each heterogeneous component runs as a job of its own id (SLURM_JOB_ID,
    its cgroup's `job_<id>`): array job 4242's task 7 as job 4249, heterogeneous job 4243's
    component 1 as job 4244. A file that names them `4242_7` and `4243+1` cannot be checked against
    the cgroups; a plain id is looked up whole (job 425 is not job 4250)."""
    mapping, sys_root = tmp_path / "jobs", tmp_path / "sys"
    mapping.mkdir()
    files = {"0": "4242_7", "1": "4243+1", "2": "425", "3": "4250"}  # minor number -> job
    for name, job in files.items():
        (mapping / name).write_text(f"{job}\n")
        old = time.time() - 3600
        os.utime(mapping / name, (old, old))
    scope = sys_root / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope"
    for job in ("4249", "4244", "4250"):
        (scope / f"job_{job}" / "step_0").mkdir(parents=True)
    node = jobs_node(tmp_path, NODE, mapping_dir=str(mapping), sysfs=sys_root, mapping_grace_seconds=300)
    try:
        status = node.run()
        assert status.success, status.reason
        assert info_rows(status) == [
            ("1", "slurm", "4250", "", "", "", "mapping_dir"),
            ("2", "slurm", "4242_7", "", "", "", "mapping_dir"),
            ("3", "slurm", "4243+1", "", "", "", "mapping_dir"),
        ]  # /dev/nvidia2 (GPU 0): job 425 has ended
        assert gauge(status, "clusterhealth_gpu_job_mapping_expired_files") == 1
        # Once Slurm runs no job at all on the node, no task or component of any job runs here.
        for job in ("4249", "4244", "4250"):
            (scope / f"job_{job}" / "step_0").rmdir()
            (scope / f"job_{job}").rmdir()
        status = node.run()
        assert status.success, status.reason
        assert info_rows(status) == []
        assert gauge(status, "clusterhealth_gpu_job_mapping_expired_files") == 4
    finally:
        node.close()


def _three_files(tmp_path: Path) -> Path:
    directory = tmp_path / "jobs"
    directory.mkdir()
    for name, job in (("0", "500"), ("1", "501"), ("2", "502")):
        (directory / name).write_text(f"{job}\n")
    return directory


def test_a_file_an_epilog_removes_after_the_listing_is_no_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _three_files(tmp_path)
    real_scandir = os.scandir

    def listed_then_removed(path: str) -> Any:
        entries = list(real_scandir(path))
        (directory / "1").unlink()  # the Epilog of job 501, between the listing and the stat
        return iter(entries)

    monkeypatch.setattr(mapping_module.os, "scandir", listed_then_removed)
    read = read_mapping_dir(str(directory))
    assert read is not None and read.problems == []
    assert [(f.name, f.jobs) for f in read.files] == [("0", ("500",)), ("2", ("502",))]


def test_a_file_an_epilog_removes_before_it_is_opened_is_no_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _three_files(tmp_path)
    real_open = sysfs._open

    def removed_first(path: str, flags: int, dir_fd: int | None = None) -> int:
        if path == str(directory / "1"):
            os.unlink(path)  # the Epilog of job 501, between the stat and the open
        return real_open(path, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", removed_first)
    node = jobs_node(tmp_path, NODE, mapping_dir=str(directory))
    try:
        status = node.run()
    finally:
        node.close()
    assert status.success, status.reason
    assert gauge(status, "clusterhealth_gpu_job_source_success", source="mapping_dir") == 1
    # Minor numbers 0 and 2 are GPUs 2 and 0.
    assert info_rows(status) == [
        ("0", "slurm", "502", "", "", "", "mapping_dir"),
        ("2", "slurm", "500", "", "", "", "mapping_dir"),
    ]
    # Another reason to fail opening it still fails the source.
    (directory / "1").write_text("501\n")

    def denied(path: str, flags: int, dir_fd: int | None = None) -> int:
        if path == str(directory / "1"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", denied)
    read = read_mapping_dir(str(directory))
    assert read is not None and read.problems == ["1: EACCES"]
