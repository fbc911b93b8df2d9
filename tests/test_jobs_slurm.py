"""Slurm attribution: deploy/slurm's Prolog and Epilog run by a real slurmd for real jobs
(tests/slurm.py), and directly with the environment slurmd gives them for what a real Slurm here
does not do (older versions, MIG, an unwritable directory); the agent reads what they wrote (and
what a dcgm-exporter site's scripts write), maps Slurm's GPU numbers to NVML's by minor number,
expires the files of jobs that are gone, and fails safe on files it cannot read or parse."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.jobs import mapping as mapping_module
from clusterhealth.exporters.jobs.mapping import parse_jobs, read_mapping_dir

from .conftest import ROOT, scenario
from .jobs import gauge, info_rows, jobs_node
from .slurm import SlurmCluster

PROLOG = ROOT / "deploy" / "slurm" / "clusterhealth-prolog"
EPILOG = ROOT / "deploy" / "slurm" / "clusterhealth-epilog"
# dcgm-exporter's rule for a mapping file's name (internal/pkg/transformation/hpc.go).
DCGM_NAME = re.compile(r"^\d+(\.\d+)?$")
# Four GPUs whose device files do not follow NVML's PCI order: NVML index -> minor number.
MINORS = {0: 2, 1: 3, 2: 0, 3: 1}
NODE = scenario(gpu_count=4, gpus={i: {"minor_number": m} for i, m in MINORS.items()})


def slurm(script: Path, tmp_path: Path, mapping: Path, **env: str) -> list[str]:
    """Run `script` as slurmd runs it: root, a minimal environment, the job's variables. Returns
    what it logged (logger is a stand-in recording its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    logged = tmp_path / "logged"
    logged.touch()
    logger = bin_dir / "logger"
    logger.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {logged}\n')
    logger.chmod(logger.stat().st_mode | stat.S_IXUSR)
    environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CLUSTERHEALTH_JOB_MAP_DIR": str(mapping), **env}
    done = subprocess.run([str(script)], env=environment, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr  # a failing Prolog or Epilog drains the node
    assert done.stdout == "" and done.stderr == ""
    return logged.read_text().splitlines()


def contents(mapping: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(mapping.iterdir()) if not p.name.startswith(".")}


@pytest.fixture(scope="module")
def slurm_jobs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real Slurm cluster whose slurmd run deploy/slurm's Prolog and Epilog (as
    slurm.conf.example says): two nodes of four GPUs, each GPU in two shards (jobs sharing it)."""
    settings = {"Prolog": str(PROLOG), "Epilog": str(EPILOG)}
    with SlurmCluster(
        tmp_path_factory.mktemp("slurm-jobs"), nodes=2, gpus=4, shards=8, settings=settings
    ) as c:
        yield c


@pytest.fixture
def cluster(slurm_jobs_cluster: SlurmCluster) -> SlurmCluster:
    slurm_jobs_cluster.reset()
    for name in slurm_jobs_cluster.node_names:
        assert node_mapping(slurm_jobs_cluster, name) == {}, "a job's files outlived it"
    return slurm_jobs_cluster


def node_mapping(cluster: SlurmCluster, name: str) -> dict[str, str]:
    """The node's job-mapping directory, the scripts' default /run/clusterhealth/jobs (slurmd
    gives them no environment of its own to move it)."""
    mapping = cluster.node_root(name) / "run" / "clusterhealth" / "jobs"
    return contents(mapping) if mapping.exists() else {}


def start(cluster: SlurmCluster, name: str, *, nodes: list[str], gres: str, hold: bool = False) -> int:
    """A batch job that runs until `cluster.go(name)`, with a step on each of its nodes first
    (slurmd runs the Prolog on a node before the job's first step there)."""
    script = f"srun true && echo started; {cluster.until(name)}"
    return cluster.sbatch(script, nodes=nodes, gres=gres, hold=hold)


def test_prolog_and_epilog_run_by_slurmd_keep_one_file_per_allocated_gpu(cluster: SlurmCluster) -> None:
    four = start(cluster, "four", nodes=["n1"], gres="gpu:2")
    cluster.wait_output(four, "started")  # its steps have run: the Prolog has ended
    wide = start(cluster, "wide", nodes=["n1", "n2"], gres="gpu:1")  # one GPU on each node
    cluster.wait_output(wide, "started")
    gpus = {job: cluster.job_gpus(job) for job in (four, wide)}
    assert len(gpus[four]["n1"]) == 2 and len(gpus[wide]["n1"]) == len(gpus[wide]["n2"]) == 1
    assert node_mapping(cluster, "n1") == {
        **{str(i): f"{four}\n" for i in gpus[four]["n1"]},
        **{str(i): f"{wide}\n" for i in gpus[wide]["n1"]},
    }
    assert node_mapping(cluster, "n2") == {str(i): f"{wide}\n" for i in gpus[wide]["n2"]}
    mapping = cluster.node_root("n1") / "run" / "clusterhealth" / "jobs"
    assert all(DCGM_NAME.match(name) for name in node_mapping(cluster, "n1"))
    assert {oct(p.stat().st_mode & 0o777) for p in mapping.iterdir() if p.name != ".lock"} == {"0o644"}
    # Each job's Epilog removes its lines, on every node of the job, and the files left empty.
    cluster.go("four")
    assert cluster.wait_job(four) == "COMPLETED"
    assert node_mapping(cluster, "n1") == {str(i): f"{wide}\n" for i in gpus[wide]["n1"]}
    cluster.go("wide")
    assert cluster.wait_job(wide) == "COMPLETED"
    assert node_mapping(cluster, "n1") == node_mapping(cluster, "n2") == {}
    assert [p.name for p in mapping.iterdir()] == [".lock"]  # and no temporary file left behind


def test_jobs_whose_ids_contain_one_another_sharing_a_gpu_keep_their_own_lines(cluster: SlurmCluster) -> None:
    """Jobs N and N2 (424 and 4242) on one GPU (Slurm's shards): the Prolog of N, run after
    N2's, adds N's line; the Epilog of N leaves N2's. A substring match would do neither."""
    short = start(cluster, "short", nodes=["n1"], gres="shard:1", hold=True)
    cluster.next_job_id(int(f"{short}2"))
    long = start(cluster, "long", nodes=["n1"], gres="shard:1")
    assert long == int(f"{short}2")
    cluster.wait_output(long, "started")
    cluster.release(short)  # its Prolog runs second, over the file that holds the longer id
    cluster.wait_output(short, "started")
    (gpu,) = cluster.job_gpus(short)["n1"]
    assert cluster.job_gpus(long)["n1"] == [gpu], "Slurm put the two shards on different GPUs"
    assert node_mapping(cluster, "n1") == {str(gpu): f"{long}\n{short}\n"}
    cluster.go("short")
    assert cluster.wait_job(short) == "COMPLETED"
    assert node_mapping(cluster, "n1") == {str(gpu): f"{long}\n"}
    cluster.go("long")
    assert cluster.wait_job(long) == "COMPLETED"
    assert node_mapping(cluster, "n1") == {}


def test_a_prolog_run_twice_or_given_only_cuda_visible_devices(tmp_path: Path) -> None:
    """What a real Slurm here does not do: an older Slurm sets CUDA_VISIBLE_DEVICES only, and a
    Prolog run twice for a job (a requeue) adds no second line."""
    mapping = tmp_path / "run" / "clusterhealth" / "jobs"
    assert slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID="4242", SLURM_JOB_GPUS="0,2") == []
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID="4243", CUDA_VISIBLE_DEVICES="2,3")
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID="4243", CUDA_VISIBLE_DEVICES="2,3")
    assert contents(mapping) == {"0": "4242\n", "2": "4242\n4243\n", "3": "4243\n"}
    slurm(EPILOG, tmp_path, mapping, SLURM_JOB_ID="4242")
    assert contents(mapping) == {"2": "4243\n", "3": "4243\n"}
    slurm(EPILOG, tmp_path, mapping, SLURM_JOB_ID="4243")
    assert contents(mapping) == {}
    assert [p.name for p in mapping.iterdir()] == [".lock"]


@pytest.mark.parametrize("first", ["424", "4242"])
def test_a_job_id_inside_another_is_another_job(tmp_path: Path, first: str) -> None:
    """424 and 4242 on one GPU, in either order (job ids are not always given in order: arrays,
    requeues, FirstJobId): each Prolog writes its own line, each Epilog removes only its own."""
    second = "4242" if first == "424" else "424"
    mapping = tmp_path / "jobs"
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID=first, SLURM_JOB_GPUS="1")
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID=second, SLURM_JOB_GPUS="1")
    assert contents(mapping) == {"1": f"{first}\n{second}\n"}
    slurm(EPILOG, tmp_path, mapping, SLURM_JOB_ID=first)
    assert contents(mapping) == {"1": f"{second}\n"}
    slurm(EPILOG, tmp_path, mapping, SLURM_JOB_ID=second)
    assert contents(mapping) == {}


def test_jobs_without_gpus_or_with_mig_devices_write_nothing(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID="1")
    slurm(
        PROLOG,
        tmp_path,
        mapping,
        SLURM_JOB_ID="2",
        CUDA_VISIBLE_DEVICES="MIG-9b1a0f1e-0b7e-5d4e-8f5e-1c2d3e4f5a6b",
    )
    slurm(EPILOG, tmp_path, tmp_path / "never-made", SLURM_JOB_ID="3")
    assert not mapping.exists() or contents(mapping) == {}


def test_a_prolog_that_cannot_write_logs_and_lets_the_job_run(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    logged = slurm(PROLOG, tmp_path, blocked / "jobs", SLURM_JOB_ID="4242", SLURM_JOB_GPUS="0")
    assert logged == [f"-t clusterhealth -p daemon.warning prolog job 4242: cannot create {blocked}/jobs"]


def test_the_agent_reads_what_the_prolog_wrote_by_minor_number(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    # Slurm's GPUs 0 and 1 are /dev/nvidia0 and /dev/nvidia1: NVML's GPUs 2 and 3.
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID="4242", SLURM_JOB_GPUS="0,1")
    slurm(PROLOG, tmp_path, mapping, SLURM_JOB_ID="4243", SLURM_JOB_GPUS="1")
    node = jobs_node(tmp_path, NODE, mapping_dir=str(mapping))
    try:
        status = node.run()
        assert status.success, status.reason
        assert info_rows(status) == [
            ("2", "slurm", "4242", "", "", "", "mapping_dir"),
            ("3", "slurm", "4242", "", "", "", "mapping_dir"),
            ("3", "slurm", "4243", "", "", "", "mapping_dir"),
        ]
        assert gauge(status, "clusterhealth_gpu_job_mapping_expired_files") == 0
        slurm(EPILOG, tmp_path, mapping, SLURM_JOB_ID="4242")
        assert info_rows(node.run()) == [("3", "slurm", "4243", "", "", "", "mapping_dir")]
    finally:
        node.close()


def test_a_sites_files_of_nvml_indices_are_read_as_such(tmp_path: Path) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("77\n")
    node = jobs_node(tmp_path, NODE, mapping_dir=str(mapping), mapping_index="nvml")
    try:
        assert info_rows(node.run()) == [("0", "slurm", "77", "", "", "", "mapping_dir")]
    finally:
        node.close()


def test_a_file_whose_job_has_no_cgroup_expires_after_the_grace(tmp_path: Path) -> None:
    mapping, sys_root = tmp_path / "jobs", tmp_path / "sys"
    mapping.mkdir()
    for name in ("0", "1", "2"):
        (mapping / name).write_text(f"{500 + int(name)}\n")
    # Slurm's cgroup v2 tree holds job 500 only; the file of job 502 was written a moment ago,
    # those of jobs 500 and 501 an hour ago.
    scope = sys_root / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope"
    (scope / "job_500" / "step_0").mkdir(parents=True)
    old = time.time() - 3600
    for name in ("0", "1"):
        os.utime(mapping / name, (old, old))
    node = jobs_node(tmp_path, NODE, mapping_dir=str(mapping), sysfs=sys_root, mapping_grace_seconds=300)
    try:
        status = node.run()
        assert status.success, status.reason  # an Epilog that did not run is no failure of the agent
        assert info_rows(status) == [
            ("0", "slurm", "502", "", "", "", "mapping_dir"),  # /dev/nvidia2, young: its cgroup may come yet
            ("2", "slurm", "500", "", "", "", "mapping_dir"),  # /dev/nvidia0: its job runs
        ]  # /dev/nvidia1 (GPU 3): job 501 has ended
        assert gauge(status, "clusterhealth_gpu_job_mapping_expired_files") == 1
        # Without a Slurm cgroup tree nobody can tell whether a job runs: every file counts.
        (scope / "job_500" / "step_0").rmdir()
        (scope / "job_500").rmdir()
        scope.rmdir()
        assert len(info_rows(node.run())) == 3
    finally:
        node.close()


def test_unreadable_and_malformed_files_fail_the_source_not_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")  # GPU 2
    (mapping / "1").write_text("rm -rf /\n")  # not a job id
    (mapping / "2").write_bytes(b"\xff\xfe\x00garbage")  # not text
    (mapping / "3").write_text("4243\n")  # unreadable, below
    (mapping / "9").write_text("4244\n")  # no GPU with minor number 9 on this node
    (mapping / "notes.txt").write_text(
        "anything"
    )  # not a mapping file's name: skipped, as dcgm-exporter does
    (mapping / "1.0").mkdir()  # a directory: skipped
    real_open = sysfs._open

    def deny_3(path: str, flags: int, dir_fd: int | None = None) -> int:
        if path.endswith("/jobs/3"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", deny_3)
    node = jobs_node(tmp_path, NODE, mapping_dir=str(mapping))
    try:
        status = node.run()
    finally:
        node.close()
    assert not status.success
    assert status.reason is not None
    for said in (
        "1: line 1 is not a job id ('rm -rf /')",
        "2: not text",
        "3: EACCES",
        "no GPU with minor number 9",
    ):
        assert said in status.reason, status.reason
    assert info_rows(status) == [("2", "slurm", "4242", "", "", "", "mapping_dir")]
    assert gauge(status, "clusterhealth_gpu_job_source_success", source="mapping_dir") == 0


def test_a_mapping_directory_that_is_not_there_is_no_failure_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = jobs_node(tmp_path, NODE, mapping_dir=str(tmp_path / "absent"))
    try:
        with caplog.at_level(logging.INFO):
            statuses = [node.run(), node.run()]
    finally:
        node.close()
    for status in statuses:
        assert status.success, status.reason
        assert gauge(status, "clusterhealth_gpu_job_source_success", source="mapping_dir") is None
    said = [r for r in caplog.records if "no job-mapping directory at" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


@pytest.mark.parametrize("breakage", ["malformed file", "unlistable directory"])
def test_a_failing_mapping_directory_is_said_once_and_its_repair_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, breakage: str
) -> None:
    """Two cycles on the same fault log it once (at error level), not every cycle; the cycle
    after the repair logs that once."""
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")
    if breakage == "malformed file":
        (mapping / "1").write_text("rm -rf /\n")
        reason = "1: line 1 is not a job id"
    else:
        real_scandir = os.scandir

        def denied(path: str) -> Any:
            if path == str(mapping):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            return real_scandir(path)

        monkeypatch.setattr(mapping_module.os, "scandir", denied)
        reason = f"{mapping}: EACCES"
    node = jobs_node(tmp_path, NODE, mapping_dir=str(mapping))
    try:
        with caplog.at_level(logging.INFO):
            failing = [node.run(), node.run()]
            (mapping / "1").write_text("4243\n")
            monkeypatch.undo()
            repaired = node.run()
    finally:
        node.close()
    for status in failing:
        assert not status.success and status.reason is not None and reason in status.reason
        assert gauge(status, "clusterhealth_gpu_job_source_success", source="mapping_dir") == 0
    assert repaired.success, repaired.reason
    assert info_rows(repaired) == [
        ("2", "slurm", "4242", "", "", "", "mapping_dir"),
        ("3", "slurm", "4243", "", "", "", "mapping_dir"),
    ]
    said = [r for r in caplog.records if reason in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR, [r.getMessage() for r in said]
    assert [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()] == [
        "collector jobs recovered"
    ]


@pytest.mark.parametrize(
    ("text", "jobs"),
    [
        ("4242\n", ("4242",)),
        ("4242\n4243\n\n4242\n", ("4242", "4243")),
        ("  4242  \n", ("4242",)),
        ("4242_7\n4243+1\n", ("4242_7", "4243+1")),  # array tasks, heterogeneous jobs
        ("", ()),
        ("4242 4243\n", "line 1 is not a job id ('4242 4243')"),
        ("ok\n$(reboot)\n", "line 2 is not a job id ('$(reboot)')"),
    ],
)
def test_a_files_lines_are_job_ids(text: str, jobs: tuple[str, ...] | str) -> None:
    assert parse_jobs(text) == jobs


def test_dcgm_exporters_mig_file_names_are_read(tmp_path: Path) -> None:
    (tmp_path / "2.1").write_text("job3.0-0")  # as in dcgm-exporter's own test
    (tmp_path / "0").write_text("job1-0\n")
    read = read_mapping_dir(str(tmp_path))
    assert read is not None and read.problems == []
    assert [(f.index, f.gpu_instance, f.jobs) for f in read.files] == [
        (0, None, ("job1-0",)),
        (2, 1, ("job3.0-0",)),
    ]
    assert read_mapping_dir(str(tmp_path / "absent")) is None
