"""The real Slurm cluster of tests/slurm.py does what the tests built on it rely on: jobs run on
the nodes asked for with the GPUs Slurm gives, drains and resumes keep their reasons, a node's
scripts see its own /etc, /run and /dev/log, job ids can be chosen, two clusters run side by side,
and stopping one leaves no process and no port behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from .slurm import SlurmCluster


def processes_of(cluster: SlurmCluster) -> list[int]:
    """Processes on this machine that belong to the cluster: started in its folder, or a job's
    (whose environment names the cluster)."""
    mine = []
    marker = f"SLURM_CLUSTER_NAME={cluster.name}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(cluster.base).encode() in cmdline or marker in environ.split(b"\0"):
            mine.append(int(entry.name))
    return mine


def nothing_listens_on(port: int) -> bool:
    # SO_REUSEADDR, as Slurm's own listeners: a closed connection's TIME_WAIT does not count.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen()
        except OSError:
            return False
    return True


def test_jobs_run_on_the_nodes_asked_for_with_their_gpus(slurm: SlurmCluster) -> None:
    assert len(slurm.nodes()) == 8 and all(n.state == "IDLE" for n in slurm.nodes().values())
    step = slurm.srun("sh", "-c", "echo $SLURMD_NODENAME", nodes=["n2", "n5"])
    assert step.returncode == 0, step.stderr
    assert sorted(step.stdout.split()) == ["n2", "n5"]
    script = f"echo $SLURM_JOB_GPUS; ls /dev/nvidia*; {slurm.until('gpus')}"
    job = slurm.sbatch(script, nodes=["n3"], gres="gpu:2")
    slurm.wait_running(job)
    gpus = slurm.job_gpus(job)
    slurm.go("gpus")
    assert slurm.wait_job(job) == "COMPLETED"
    assert list(gpus) == ["n3"] and len(gpus["n3"]) == 2
    out = (slurm.base / "jobs" / f"{job}.out").read_text().split()
    assert out[0] == ",".join(map(str, gpus["n3"]))
    assert out[1:] == [f"/dev/nvidia{i}" for i in range(4)]


def test_drain_and_resume_keep_the_reason_and_who_set_it(slurm: SlurmCluster) -> None:
    slurm.drain(["n1", "n4"], "clusterhealth: reboot: gpu 3 [Xid 79] a=b")
    for name in ("n1", "n4"):
        node = slurm.node(name)
        assert node.drained and not node.available
        assert node.reason == "clusterhealth: reboot: gpu 3 [Xid 79] a=b" and node.reason_user == "root"
    assert slurm.node("n2").reason is None and slurm.node("n2").available
    slurm.resume("n4")
    assert slurm.node("n4").available and slurm.node("n4").reason is None
    assert slurm.node("n1").drained


def test_a_nodes_scripts_see_its_own_files_and_syslog(slurm: SlurmCluster) -> None:
    """What slurmd runs sees the node's /etc/slurm (scontrol with no SLURM_CONF reaches this
    cluster), writes into the node's /run, and logs to the node's /dev/log."""
    script = (
        "env -u SLURM_CONF scontrol show node $SLURMD_NODENAME | grep -o NodeName=n6;"
        " mkdir -p /run/clusterhealth && echo mine >/run/clusterhealth/x;"
        " logger -t clusterhealth -p daemon.warning hello from $SLURMD_NODENAME"
    )
    job = slurm.sbatch(script, nodes=["n6"])
    assert slurm.wait_job(job) == "COMPLETED"
    assert (slurm.base / "jobs" / f"{job}.out").read_text() == "NodeName=n6\n"
    assert (slurm.node_root("n6") / "run" / "clusterhealth" / "x").read_text() == "mine\n"
    assert not (slurm.node_root("n7") / "run" / "clusterhealth").exists()
    assert not Path("/run/clusterhealth/x").exists()
    (message,) = slurm.syslog("n6")
    assert (message.facility, message.severity, message.tag) == (3, 4, "clusterhealth")
    assert message.text == "hello from n6"
    assert slurm.syslog("n7") == []


def test_job_ids_can_be_chosen_and_a_held_job_started_later(slurm: SlurmCluster) -> None:
    base = slurm.unused_job_id()
    slurm.next_job_id(base)
    small = slurm.sbatch("true", nodes=["n1"], hold=True)
    slurm.next_job_id(int(f"{base}2"))
    large = slurm.sbatch("true", nodes=["n1"])
    assert (small, large) == (base, int(f"{base}2"))
    assert slurm.wait_job(large) == "COMPLETED"
    assert slurm.job(small)["JobState"] == "PENDING"
    slurm.release(small)
    assert slurm.wait_job(small) == "COMPLETED"


def test_restarting_a_node_runs_a_fresh_slurmd(slurm: SlurmCluster) -> None:
    job = slurm.sbatch("sleep 300", nodes=["n8"])
    slurm.wait_running(job)
    before = slurm.node("n8").slurmd_start_time
    after = slurm.restart_node("n8")
    assert after.slurmd_start_time > before and "NOT_RESPONDING" not in after.flags


def test_two_clusters_run_at_once_and_stopping_one_leaves_nothing(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    other = SlurmCluster(tmp_path / "other", nodes=2)
    with other:
        assert other.name != slurm.name and other.ctld_port != slurm.ctld_port
        assert other.startup_seconds < 60
        job = other.sbatch("sleep 300", nodes=["n1"], gres="gpu:1")
        other.wait_running(job)
        mine = slurm.sbatch("true", nodes=["n1"])
        assert slurm.wait_job(mine) == "COMPLETED"
        assert other.job(job)["JobState"] == "RUNNING"  # the other cluster's n1 is its own
        assert processes_of(other)
        ports = [other.ctld_port, other.first_node_port, other.first_node_port + 1]
    assert processes_of(other) == []
    assert all(nothing_listens_on(p) for p in ports)
    assert slurm.node("n1").available


def test_slurmd_gives_a_prolog_none_of_its_own_environment(slurm: SlurmCluster, tmp_path: Path) -> None:
    """What docs/deploy.md tells sites: a variable in slurmd's environment does not reach the
    Prolog (nor PATH), so the scripts' directory is moved with a wrapper, not with slurmd's
    environment."""
    assert "PATH" in slurm.env
    prolog = tmp_path / "prolog"
    prolog.write_text(f'#!/bin/sh\nenv >"{tmp_path}/env.$SLURM_JOB_ID"\n')
    prolog.chmod(0o755)
    slurm.set(Prolog=str(prolog))
    job = slurm.sbatch("srun true", nodes=["n2"])
    assert slurm.wait_job(job) == "COMPLETED"
    env = dict(line.split("=", 1) for line in (tmp_path / f"env.{job}").read_text().splitlines())
    assert env["SLURM_JOB_ID"] == str(job) and env["SLURMD_NODENAME"] == "n2"
    assert "PATH" not in env and "HOME" not in env
