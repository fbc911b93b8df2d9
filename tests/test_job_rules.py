"""The job rules (deploy/prometheus/clusterhealth_mixin/jobs.py) under `promtool test rules`: JobStraggler
fires for a slow GPU of a busy multi-GPU job and stays quiet for a healthy job, a GPU just inside
the margin, a single-GPU job and a job whose GPUs all idle; JobHitByNodeFault names the job on a
node with a critical alert, not a warning, nor a node without a job. (The cases join
tests/test_prometheus_rules.py's check that every alert has firing and quiet cases.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from .mixin import mixin
from .test_prometheus_rules import RULES, Case, F, S, gpu, promtool, promtool_test


def job_gpu(instance: str, n: str, job: str, **extra: str) -> dict[str, str]:
    return gpu(n, instance, scheduler="slurm", exported_job=job, **extra)


def job(
    name: str,
    gpus: list[tuple[str, str]],
    *,
    clock: dict[int, str] | None = None,
    active: dict[int, str] | None = None,
    utilization: str = "1x20",
) -> dict[str, str]:
    """A Slurm job's join series on `gpus` ((instance, gpu) pairs) and their GPUs' series: the SM
    clock at 1.98 GHz and SM activity at 0.78 unless `clock` or `active` says otherwise (by position)."""
    series = {}
    for k, (instance, n) in enumerate(gpus):
        series[S("clusterhealth_gpu_job_info", job_gpu(instance, n, name, source="mapping_dir"))] = "1x20"
        where = gpu(n, instance)
        series[S("clusterhealth_gpu_sm_clock_hertz", where)] = (clock or {}).get(k, "1.98e9x20")
        series[S("clusterhealth_gpu_sm_active_ratio", where)] = (active or {}).get(k, "0.78x20")
        series[S("clusterhealth_gpu_utilization_ratio", where)] = utilization
    return series


def straggler(instance: str, n: str, job_id: str, signal: str, value: float) -> F:
    return F(job_gpu(instance, n, job_id, source="mapping_dir", signal=signal), "warning", value)


EIGHT = [(i, str(g)) for i in ("n1", "n2") for g in range(4)]
JOB_CASES = [
    Case(
        "JobStraggler",
        "job 4242 on two nodes: GPU 1 of n2 clocked at 1155 MHz for 10m; job 4243: GPU 2 of n3 barely active",
        {
            **job("4242", EIGHT, clock={5: "1.98e9x2 1.155e9x18"}),
            **job("4243", [("n3", str(g)) for g in range(4)], active={2: "0.04x20"}),
        },
        [
            ("5m", []),  # pending: 10 minutes are asked for
            (
                "15m",
                [
                    straggler("n2", "1", "4242", "sm_clock", 1.155 / 1.98),
                    straggler("n3", "2", "4243", "sm_active", 0.04 / 0.78),
                ],
            ),
        ],
    ),
    Case(
        "JobStraggler",
        "a healthy job: one GPU 9% below the median clock, another at 60% of the median SM activity",
        job("4244", EIGHT, clock={3: "1.80e9x20"}, active={6: "0.47x20"}),
        [("15m", [])],
    ),
    Case(
        "JobStraggler",
        "a single-GPU job has no median to fall below, however slow it is",
        job("4245", [("n1", "0")], clock={0: "1.1e9x20"}, active={0: "0.01x20"}),
        [("15m", [])],
    ),
    Case(
        "JobStraggler",
        "a job whose GPUs all idle (utilization 0): one idles at a lower clock, which is no straggler",
        job(
            "4246",
            EIGHT,
            clock={k: "345e6x20" for k in range(8)} | {2: "210e6x20"},
            active={k: "0x20" for k in range(8)},
            utilization="0x20",
        ),
        [("15m", [])],
    ),
    Case(
        "JobHitByNodeFault",
        "GPU 0 of n1, where job 4242 runs, falls off the bus (job 4245 on GPU 2 of n1 is not hurt); "
        "n2 (the job's other node) has a warning only; n3 has a critical alert and runs no job; n4's "
        "GPU count check fails, which hurts every job on n4 (4246 on GPUs 0 and 1)",
        {
            S("clusterhealth_gpu_job_info", job_gpu("n1", "0", "4242", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n1", "1", "4242", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n1", "2", "4245", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n2", "0", "4242", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n4", "0", "4246", source="cgroup")): "1x20",
            S("clusterhealth_gpu_job_info", job_gpu("n4", "1", "4246", source="cgroup")): "1x20",
            S("clusterhealth_gpu_up", gpu("0", "n1")): "1x5 0x15",
            S("clusterhealth_gpu_row_remap_pending", gpu("0", "n2")): "1x20",
            S("clusterhealth_gpu_up", gpu("0", "n3")): "0x20",
            S(
                "clusterhealth_check_status",
                {"instance": "n4", "check": "gpu_count", "subject": "node"},
            ): "0x5 2x15",
        },
        [
            ("4m", []),
            (
                "10m",
                [
                    F(
                        {"instance": "n1", "scheduler": "slurm", "exported_job": "4242", "gpu": "0"},
                        "critical",
                        1,
                    ),
                    F({"instance": "n4", "scheduler": "slurm", "exported_job": "4246"}, "critical", 1),
                ],
            ),
        ],
    ),
]


@pytest.mark.parametrize("case", JOB_CASES, ids=[f"{c.alert}-{i}" for i, c in enumerate(JOB_CASES)])
def test_promtool_unit_test(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(promtool_test(case, RULES), sort_keys=False))
    result = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{case.why}\n{result.stdout}{result.stderr}"


def test_a_larger_minimum_of_gpus_quiets_a_two_gpu_job(tmp_path: Path) -> None:
    """The thresholds are the generator's parameters: at 3 GPUs, a 2-GPU job's slow GPU is not judged."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(mixin.render(mixin.Config(job_straggler_min_gpus=3)))
    pair = job("4247", [("n1", "0"), ("n1", "1")], clock={1: "1.1e9x20"})
    for fires, path in ((True, RULES), (False, rules)):
        firing = [straggler("n1", "1", "4247", "sm_clock", 1.1 / ((1.98 + 1.1) / 2))] if fires else []
        case = Case("JobStraggler", "two GPUs", pair, [("15m", firing)])
        test = tmp_path / "test.yaml"
        test.write_text(yaml.safe_dump(promtool_test(case, path), sort_keys=False))
        result = subprocess.run([promtool(), "test", "rules", str(test)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_a_new_signal_is_one_entry() -> None:
    """JobStraggler is the `or` of its signals: each has its join, its median and its branch."""
    config = mixin.Config()
    (alert,) = [a for a in mixin.alerts(config) if a.name == "JobStraggler"]
    records = {r.record for g in mixin.groups(config) for r in g.rules if isinstance(r, mixin.Record)}
    for signal in mixin.job_signals(config):
        assert f'"signal", "{signal.name}"' in alert.expr
        assert f"instance_gpu_workload:{signal.metric}:join" in records
        assert f"workload:{signal.metric}:median" in records
