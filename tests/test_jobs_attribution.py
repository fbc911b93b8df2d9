"""The cgroup fallback on the simulated NVML's compute processes and a synthetic /proc, the
precedence of the sources and their conflicts, busy GPUs no source names, a lost GPU's job, and the
simulator's process, minor-number and MIG answers read through pynvml's own calls."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import pynvml
import pytest

from clusterhealth.exporters import sysfs
from clusterhealth.exporters.jobs.attribution import Claim, Workload, merge
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim.scenario import parse_scenario

from .conftest import FIXTURES, scenario
from .jobs import gauge, info_rows, jobs_node

CGROUPS = FIXTURES / "cgroup"
SLURM = (CGROUPS / "slurm-v2.txt").read_text()  # job 3385
SLURM_V1 = (CGROUPS / "slurm-v1.txt").read_text()  # job 123
POD = (CGROUPS / "kubernetes-systemd-v2.txt").read_text()  # pod 4b1f4f77-...
POD_V1 = (CGROUPS / "kubernetes-cgroupfs-v1.txt").read_text()  # pod 74c13223-...


def node_of(*processes: list[dict[str, Any]]) -> dict[str, Any]:
    return scenario(
        gpu_count=len(processes), gpus={i: {"compute_processes": p} for i, p in enumerate(processes)}
    )


def with_proc(tmp_path: Path, data: dict[str, Any]) -> Path:
    proc = tmp_path / "proc"
    sim_procfs.build(proc, parse_scenario(data, "<test>"))
    return proc


def test_each_gpus_processes_name_their_job_or_pod(tmp_path: Path) -> None:
    data = node_of(
        [{"pid": 101, "cgroup": SLURM}],
        [{"pid": 102, "cgroup": SLURM_V1}],
        [{"pid": 103, "cgroup": POD}, {"pid": 104, "cgroup": POD_V1}],  # two pods share GPU 2
        [{"pid": 105, "cgroup": (CGROUPS / "user-session-v2.txt").read_text()}],  # no job: unattributed
        [{"pid": 106}],  # exited since NVML listed it: no /proc entry
        [],  # idle
    )
    node = jobs_node(tmp_path, data, procfs=with_proc(tmp_path, data))
    try:
        status = node.run()
    finally:
        node.close()
    assert status.success, status.reason
    assert info_rows(status) == [
        ("0", "slurm", "3385", "", "", "", "cgroup"),
        ("1", "slurm", "123", "", "", "", "cgroup"),
        ("2", "kubernetes", "4b1f4f77-49e6-4e30-98db-e98055c8a54f", "", "", "", "cgroup"),
        ("2", "kubernetes", "74c13223-5a00-11e9-b385-42010a80018d", "", "", "", "cgroup"),
    ]
    assert gauge(status, "clusterhealth_gpu_job_source_success", source="cgroup") == 1
    # GPUs 3 and 4 compute, but nothing says for whom.
    assert gauge(status, "clusterhealth_gpu_job_unattributed_busy_gpus") == 2


def test_an_unreadable_proc_fails_the_fallback_and_the_rest_still_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = node_of([{"pid": 101, "cgroup": SLURM}], [{"pid": 102, "cgroup": SLURM}])
    proc = with_proc(tmp_path, data)
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "1").write_text("3385\n")
    real_open = sysfs._open

    def deny_101(path: str, flags: int, dir_fd: int | None = None) -> int:
        if path.endswith("/101/cgroup"):  # hidepid=2, or another user's process without CAP_SYS_PTRACE
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, dir_fd=dir_fd)

    monkeypatch.setattr(sysfs, "_open", deny_101)
    node = jobs_node(tmp_path, data, procfs=proc, mapping_dir=str(mapping))
    try:
        with caplog.at_level(logging.INFO):
            failing = [node.run(), node.run()]
            monkeypatch.undo()
            repaired = node.run()
    finally:
        node.close()
    for status in failing:
        assert not status.success
        assert status.reason == f"cgroup: {proc}/101/cgroup: EACCES"
        assert gauge(status, "clusterhealth_gpu_job_source_success", source="cgroup") == 0
        assert info_rows(status) == [("1", "slurm", "3385", "", "", "", "mapping_dir")]
    # Said once while it lasts (at error level), and its end once.
    said = [r for r in caplog.records if "101/cgroup: EACCES" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    assert repaired.success, repaired.reason
    assert gauge(repaired, "clusterhealth_gpu_job_source_success", source="cgroup") == 1
    assert [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()] == [
        "collector jobs recovered"
    ]


def test_the_allocation_wins_and_a_contradiction_is_counted_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = node_of([{"pid": 101, "cgroup": SLURM}], [{"pid": 102, "cgroup": SLURM}])
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("3385\n")  # agrees with the cgroup
    (mapping / "1").write_text("9999\n")  # the Prolog's file of another job: the cgroup disagrees
    node = jobs_node(tmp_path, data, procfs=with_proc(tmp_path, data), mapping_dir=str(mapping))
    try:
        with caplog.at_level(logging.INFO):
            statuses = [node.run(), node.run()]
    finally:
        node.close()
    for status in statuses:
        assert status.success, status.reason
        assert info_rows(status) == [
            ("0", "slurm", "3385", "", "", "", "mapping_dir"),
            ("1", "slurm", "9999", "", "", "", "mapping_dir"),
        ]
        assert gauge(status, "clusterhealth_gpu_job_conflicting_gpus") == 1
    said = [r.getMessage() for r in caplog.records if "conflict" in r.getMessage()]
    assert said == ["job attribution conflict: GPU 1: cgroup names Slurm job 3385, against Slurm job 9999"]


def _k8s(pod: str = "", job: str = "", namespace: str = "ml") -> Workload:
    return Workload("kubernetes", job=job, namespace=namespace if pod else "", pod=pod)


@pytest.mark.parametrize(
    ("claims", "winners", "conflict"),
    [
        # pod-resources over the mapping files over the cgroups
        (
            [Claim(0, Workload("slurm", "1"), "cgroup"), Claim(0, _k8s("a"), "pod_resources")],
            ["pod_resources"],
            True,
        ),
        (
            [Claim(0, Workload("slurm", "1"), "cgroup"), Claim(0, Workload("slurm", "1"), "mapping_dir")],
            ["mapping_dir"],
            False,
        ),
        (
            [Claim(0, Workload("slurm", "2"), "cgroup"), Claim(0, Workload("slurm", "1"), "mapping_dir")],
            ["mapping_dir"],
            True,
        ),
        # a plain job id is compared whole: job 424 is not job 4242
        (
            [
                Claim(0, Workload("slurm", "4242"), "cgroup"),
                Claim(0, Workload("slurm", "424"), "mapping_dir"),
            ],
            ["mapping_dir"],
            True,
        ),
        # an array task or heterogeneous component as a site's files name it runs as a job of its
        # own id (task 7 of array 4242 as job 4249): the notation and a cgroup's id cannot be compared
        (
            [
                Claim(0, Workload("slurm", "4249"), "cgroup"),
                Claim(0, Workload("slurm", "4242_7"), "mapping_dir"),
            ],
            ["mapping_dir"],
            False,
        ),
        (
            [
                Claim(0, Workload("slurm", "4244"), "cgroup"),
                Claim(0, Workload("slurm", "4243+1"), "mapping_dir"),
            ],
            ["mapping_dir"],
            False,
        ),
        # two tasks of one array named alike can
        (
            [
                Claim(0, Workload("slurm", "4242_8"), "cgroup"),
                Claim(0, Workload("slurm", "4242_7"), "mapping_dir"),
            ],
            ["mapping_dir"],
            True,
        ),
        # a pod's name and a pod's UID cannot be compared; two UIDs or two names can
        (
            [Claim(0, _k8s(job="u1"), "cgroup"), Claim(0, _k8s("a"), "pod_resources")],
            ["pod_resources"],
            False,
        ),
        (
            [Claim(0, _k8s(job="u1"), "cgroup"), Claim(0, _k8s(job="u2"), "cgroup")],
            ["cgroup", "cgroup"],
            False,
        ),
        # a shared GPU: a lower claim that matches any of the winners' is no conflict
        (
            [
                Claim(0, Workload("slurm", "1"), "mapping_dir"),
                Claim(0, Workload("slurm", "2"), "mapping_dir"),
                Claim(0, Workload("slurm", "2"), "cgroup"),
            ],
            ["mapping_dir", "mapping_dir"],
            False,
        ),
    ],
)
def test_precedence_and_conflicts(claims: list[Claim], winners: list[str], conflict: bool) -> None:
    merged = merge(claims)
    assert [c.source for c in merged.claims] == winners
    assert (0 in merged.conflicts) is conflict


def test_a_gpu_that_falls_off_the_bus_keeps_its_job(tmp_path: Path) -> None:
    """The file names /dev/nvidia1, which NVML's GPU 0 was while it answered."""
    data = scenario(gpu_count=2, gpus={0: {"minor_number": 1}, 1: {"minor_number": 0}})
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "1").write_text("4242\n")
    node = jobs_node(tmp_path, data, mapping_dir=str(mapping))
    try:
        assert info_rows(node.run()) == [("0", "slurm", "4242", "", "", "", "mapping_dir")]
        assert node.node.simulator is not None
        node.node.simulator.scenario = parse_scenario(
            {**data, "faults": [{"gpu": 0, "lost": True}]}, "<test>"
        )
        status = node.run()
        assert status.success, status.reason
        assert info_rows(status) == [("0", "slurm", "4242", "", "", "", "mapping_dir")]
    finally:
        node.close()


def test_the_simulator_answers_pynvmls_own_calls(simulate: Any) -> None:
    simulate(
        scenario(
            gpus={
                0: {"minor_number": 5, "compute_processes": [{"pid": 7, "used_memory_mib": 10}, {"pid": 9}]},
                1: {"mig_devices": [{"gpu_instance_id": 3}, {"gpu_instance_id": 5, "uuid": "MIG-fixed"}]},
            }
        )
    )
    pynvml.nvmlInit()
    try:
        gpu0, gpu1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        assert pynvml.nvmlDeviceGetMinorNumber(gpu0) == 5 and pynvml.nvmlDeviceGetMinorNumber(gpu1) == 1
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0)  # the v3 struct, two calls
        assert [(p.pid, p.usedGpuMemory) for p in processes] == [(7, 10 << 20), (9, 0)]
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(gpu1) == []
        assert pynvml.nvmlDeviceGetMigMode(gpu0) == [0, 0]
        assert pynvml.nvmlDeviceGetMigMode(gpu1) == [1, 1]
        migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, n) for n in range(2)]
        assert pynvml.nvmlDeviceGetUUID(migs[1]) == "MIG-fixed"
        assert pynvml.nvmlDeviceGetUUID(migs[0]).startswith("MIG-")
        assert [pynvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [3, 5]
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 2)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetGpuInstanceId(gpu0)
    finally:
        pynvml.nvmlShutdown()


def test_a_scenarios_job_keys_are_checked() -> None:
    from clusterhealth.exporters.sim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=r"gpus\.0\.compute_processes\[0\]\.pid"):
        parse_scenario(scenario(gpus={0: {"compute_processes": [{"cgroup": SLURM}]}}), "<test>")
    with pytest.raises(ScenarioError, match=r"gpus\.0\.minor_number"):
        parse_scenario(scenario(gpus={0: {"minor_number": -1}}), "<test>")
    with pytest.raises(ScenarioError, match=r"gpu\.mig_devices\[0\]"):
        parse_scenario(scenario(gpu={"mig_devices": [{"gi": 1}]}), "<test>")
