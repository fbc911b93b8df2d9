"""The job rules (deploy/prometheus/clusterhealth_mixin/jobs.py) under `promtool test rules`: JobStraggler
fires for a slow GPU of a busy multi-GPU job and stays quiet for a healthy job, a GPU just inside
the margin, a single-GPU job and a job whose GPUs all idle; JobHitByNodeFault names the job on a
node with a critical alert, not a warning, nor a node without a job. The cases live beside the
rules (deploy/prometheus/clusterhealth_mixin/jobs_cases.py) and join tests/test_prometheus_rules.py's
check that every alert has firing and quiet cases."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .mixin import area_cases, mixin
from .test_prometheus_rules import RULES, Case, promtool, promtool_test

JOB_CASES = area_cases("jobs")
job = importlib.import_module("clusterhealth_mixin.jobs_cases").job
straggler = importlib.import_module("clusterhealth_mixin.jobs_cases").straggler


@pytest.mark.parametrize("case", JOB_CASES, ids=[f"{c.alert}-{i}" for i, c in enumerate(JOB_CASES)])
def test_promtool_unit_test(case: Any, tmp_path: Path) -> None:
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
        assert signal.joined in records and signal.joined.startswith("instance_gpu_workload:")
        assert signal.median in records and signal.median.startswith("workload:")
