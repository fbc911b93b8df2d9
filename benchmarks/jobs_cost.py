#!/usr/bin/env python3
"""What job attribution costs a node: series, bytes per scrape, collection time, memory.

The simulated 8-GPU node (h100-faulty: one Slurm job's process on every GPU) is run by the real
agent, `clusterhealth agent`, in four set-ups:

- off: `collectors.jobs.enabled: false`;
- cgroup: the fallback only (the job's process under a simulated /proc);
- slurm: the Prolog's mapping files and the cgroups (what a Slurm node runs);
- kubelet: a pod-resources server on a unix socket (this process, gRPC) that allocates each GPU to
  `--pods-per-gpu` pods (time-slicing), besides the cgroups.

For each: the samples and bytes (plain and gzip, as Prometheus asks) of /metrics beyond `off`,
the jobs collector's run time (its own duration series, median of the runs seen) and the agent's
resident memory after `--seconds`.

Usage: benchmarks/jobs_cost.py [--seconds 20] [--pods-per-gpu 4]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import psutil
import yaml
from agentproc import start_agent

from clusterhealth.exporters.jobs.kubelet import api_pb2, api_pb2_grpc
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "exporters" / "sim" / "scenarios" / "h100-faulty.yaml"


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, uuids: list[str], per_gpu: int):
        pods = []
        for g, uuid in enumerate(uuids):
            for share in range(per_gpu):
                device = api_pb2.ContainerDevices(
                    resource_name="nvidia.com/gpu", device_ids=[f"{uuid}::{share}"]
                )
                container = api_pb2.ContainerResources(name="trainer", devices=[device])
                pods.append(
                    api_pb2.PodResources(namespace="ml", name=f"train-{g}-{share}", containers=[container])
                )
        self.response = api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def List(self, request: Any, context: Any) -> Any:
        return self.response


def scrape(port: int) -> tuple[str, int]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    text = (
        gzip.decompress(body).decode()
        if response.headers.get("Content-Encoding") == "gzip"
        else body.decode()
    )
    return text, len(gzip.compress(text.encode()))


def samples(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def measure(tmp: Path, name: str, jobs: dict[str, Any], seconds: float) -> dict[str, float]:
    config = tmp / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {"collectors": {"gpu": {"interval_seconds": 2}, "jobs": {"interval_seconds": 2, **jobs}}}
        )
    )
    proc, port, _ = start_agent(
        "--config", str(config), "--simulate", str(SCENARIO), "--procfs-root", str(tmp / "proc"),
        "--sysfs-root", str(tmp / "sys"), "--kmsg-path", "/dev/null",
    )  # fmt: skip
    try:
        durations = []
        deadline = time.monotonic() + seconds
        text, gzipped = "", 0
        while time.monotonic() < deadline:
            time.sleep(2)
            text, gzipped = scrape(port)
            for line in text.splitlines():
                if line.startswith('clusterhealth_scrape_collector_duration_seconds{collector="jobs"}'):
                    durations.append(float(line.split()[-1]))
        rss = psutil.Process(proc.pid).memory_info().rss
    finally:
        proc.terminate()
        proc.wait(10)
    jobs_samples = sum(
        1
        for line in text.splitlines()
        if line.startswith("clusterhealth_gpu_job_") or 'collector="jobs"' in line
    )
    return {
        "samples": samples(text),
        "jobs_samples": jobs_samples,
        "bytes": len(text.encode()),
        "gzip": gzipped,
        "duration_ms": statistics.median(durations) * 1000 if durations else float("nan"),
        "rss_mb": rss / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--pods-per-gpu", type=int, default=4)
    args = parser.parse_args()
    scenario = load_scenario(SCENARIO)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sim_procfs.build(tmp / "proc", scenario)
        (tmp / "sys").mkdir()
        sim_procfs.build_job_cgroups(tmp / "sys", scenario)
        mapping = tmp / "jobs"
        mapping.mkdir()
        for g in range(len(scenario.gpus)):
            (mapping / str(g)).write_text("817304\n")
        socket = tmp / "kubelet.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        kubelet = Kubelet([gpu["uuid"] for gpu in scenario.gpus], args.pods_per_gpu)
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        absent = {"pod_resources_socket": str(tmp / "none.sock"), "mapping_dir": str(tmp / "none")}
        setups = {
            "off": {"enabled": False},
            "cgroup": absent,
            "slurm": {**absent, "mapping_dir": str(mapping)},
            "kubelet": {**absent, "pod_resources_socket": str(socket)},
        }
        results = {n: measure(tmp, n, jobs, args.seconds) for n, jobs in setups.items()}
        server.stop(0)
    base = results["off"]
    print("| set-up | jobs samples | samples | bytes (+ over off) | gzip bytes (+) | jobs run | RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, r in results.items():
        plain = f"{r['bytes']:.0f} (+{r['bytes'] - base['bytes']:.0f})"
        packed = f"{r['gzip']:.0f} (+{r['gzip'] - base['gzip']:.0f})"
        print(
            f"| {n} | {r['jobs_samples']:.0f} | {r['samples']:.0f} | {plain} | {packed} "
            f"| {r['duration_ms']:.2f} ms | {r['rss_mb']:.1f} MB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
