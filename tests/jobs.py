"""Helpers of the job-attribution tests: a simulated node whose `jobs` collector runs in this
process, through the agent's own table of collectors (the gpu collector first, on the NVML
simulator), and the rows it exports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.core import Metric

from clusterhealth.agent import config as configuration
from clusterhealth.agent.collectors import Collectors
from clusterhealth.agent.node import Node
from clusterhealth.agent.sampling import Status
from clusterhealth.exporters.sim import nvml as nvml_sim
from clusterhealth.exporters.sim.scenario import parse_scenario

ABSENT_SOCKET = "/nonexistent/kubelet.sock"


@dataclass
class JobsNode:
    """A simulated node; `run()` runs its gpu and jobs collectors once and returns the jobs status."""

    node: Node
    collectors: Collectors

    def run(self) -> Status:
        self.collectors.run_once()
        (sampler,) = [s for s in self.collectors.active if s.name == "jobs"]
        return sampler.status()

    def close(self) -> None:
        self.collectors.stop()
        self.node.close()
        nvml_sim.uninstall()


def jobs_node(tmp_path: Path, scenario: dict[str, Any], **settings: Any) -> JobsNode:
    """`settings`: keys of collectors.jobs, and `sysfs`/`procfs` roots (default: empty trees)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    overrides: dict[str, Any] = {
        "simulate": str(path),
        "paths.sysfs": str(settings.pop("sysfs", tmp_path / "no-sys")),
        "paths.procfs": str(settings.pop("procfs", tmp_path / "no-proc")),
        "collectors.jobs.pod_resources_socket": ABSENT_SOCKET,
        "collectors.jobs.mapping_dir": str(tmp_path / "no-mapping-dir"),
        "collectors.gpu.gpm": False,
    }
    overrides.update({f"collectors.jobs.{k}": v for k, v in settings.items()})
    config = configuration.load(None, overrides)
    node = Node(config, one_shot=True)
    collectors = Collectors(node)
    collectors.apply(config, only=("jobs",), start=False)
    return JobsNode(node, collectors)


def samples(families: Any, name: str) -> Iterator[tuple[dict[str, str], float]]:
    for family in families:
        assert isinstance(family, Metric)
        for s in family.samples:
            if s.name == name:
                yield dict(s.labels), s.value


def info_rows(status: Status) -> list[tuple[str, ...]]:
    """(gpu, scheduler, job, namespace, pod, container, source) of each clusterhealth_gpu_job_info."""
    rows = []
    for labels, value in samples(status.families, "clusterhealth_gpu_job_info"):
        assert value == 1
        keys = ("gpu", "scheduler", "job", "namespace", "pod", "container", "source")
        rows.append(tuple(labels[k] for k in keys))
    return sorted(rows)


def gauge(status: Status, name: str, **labels: str) -> float | None:
    found = [v for ls, v in samples(status.families, name) if labels.items() <= ls.items()]
    assert len(found) <= 1
    return found[0] if found else None


def gpu_uuids(scenario: dict[str, Any]) -> list[str]:
    return [gpu["uuid"] for gpu in parse_scenario(scenario, "<test>").gpus]


def mig_uuids(scenario: dict[str, Any], gpu: int) -> list[str]:
    return [m["uuid"] for m in parse_scenario(scenario, "<test>").gpus[gpu]["mig_devices"]]
