"""What one reconcile of `clusterhealth remediate --backend kubernetes` costs at 1,024 and 16,384 nodes.

benchmarks/remediate_scale.py measures the remediator and Prometheus with an in-memory scheduler;
this measures the Kubernetes backend's own cost (fleet/remediate/kubernetes.py) on top of the same
Prometheus data: a real kube-apiserver 1.20.2 and Debian's etcd (tests/kube.py, the binary that
`make kube-apiserver` caches), holding N Nodes shaped as a GPU node's kubelet registers it (its
labels with a failure domain, `topology.kubernetes.io/zone`, 64 nodes a zone, read through
`kubernetes.domain_labels`; GPU Feature Discovery's labels; the kubelet's conditions with Ready,
capacity `nvidia.com/gpu: 8`, ten images), created by concurrent POSTs (set-up, reported apart).
1 % of the nodes are unhealthy and held, so the acts happen (cordon, conditions, annotation,
Event), through the real KubernetesBackend and Remediator.reconcile.

Per size, with the remediator's wall and CPU time, the API server's and etcd's CPU time (psutil),
the requests by kind and the bytes of JSON read from the API server:

- observe() alone (the Lease's ledger and the Nodes listed in pages);
- dry-run: the first reconcile (an Event per node it would act on) and the next ones (the same
  Events are not posted again within the hour);
- act: the first reconcile (the Lease taken, every held sick node quarantined) and the next ones
  (the Lease renewed, the heartbeat of the conditions it holds);
- the remediator's peak Python memory (tracemalloc, a traced run of its own) and resident set; the
  API server's and etcd's resident set; etcd's database size; the load average (the machine is
  shared).

    .venv/bin/python benchmarks/remediate_kube_scale.py                 # 1,024 and 16,384 nodes
    .venv/bin/python benchmarks/remediate_kube_scale.py --nodes 1024    # one size
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil
import urllib3
from remediate_scale import HISTORY, _names, prepare, serve, the_end

from clusterhealth.fleet.prometheus import Prometheus
from clusterhealth.fleet.remediate.config import BudgetConfig, KubernetesConfig, RemediateConfig
from clusterhealth.fleet.remediate.kubernetes import KubernetesBackend, open_backend
from clusterhealth.fleet.remediate.reconcile import Remediator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.kube import KubeAPI, kubelet_status

NAMESPACE = "clusterhealth"
ZONE = "topology.kubernetes.io/zone"
NODES_PER_ZONE = 64


def node_body(i: int, name: str) -> dict[str, Any]:
    """A GPU node as its kubelet registers it and GPU Feature Discovery labels it (a Node's status
    may be written on create)."""
    status = kubelet_status(gpus=8)["status"]
    status["addresses"] = [
        {"type": "InternalIP", "address": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"},
        {"type": "Hostname", "address": name},
    ]
    status["images"] = [
        {
            "names": [
                f"nvcr.io/nvidia/{image}@sha256:{i * 31 + k:064x}",
                f"nvcr.io/nvidia/{image}:24.{k:02d}",
            ],
            "sizeBytes": 8_000_000_000 + k,
        }
        for k, image in enumerate(
            ["pytorch", "nemo", "tritonserver", "cuda", "k8s/dcgm-exporter", "gpu-operator",
             "k8s-device-plugin", "driver", "cloud-native/gpu-feature-discovery", "mellanox/network-operator"]
        )
    ]  # fmt: skip
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "gpu-8x-h100",
        "topology.kubernetes.io/region": "region-1",
        ZONE: f"zone-{i // NODES_PER_ZONE:03d}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/mig.capable": "true",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podCIDR": f"10.244.{i % 256}.0/24", "providerID": f"bench://{name}"},
        "status": status,
    }


def create_nodes(kube: KubeAPI, n: int, threads: int) -> float:
    """N Nodes by concurrent POSTs over kept connections; the seconds it took."""
    pool = urllib3.PoolManager(
        maxsize=threads, ca_certs=str(kube.ca), cert_reqs="CERT_REQUIRED", retries=urllib3.Retry(3)
    )
    headers = {"Authorization": f"Bearer {kube.admin_token}", "Content-Type": "application/json"}

    def create(item: tuple[int, str]) -> None:
        body = json.dumps(node_body(*item)).encode()
        answer = pool.request("POST", f"{kube.server}/api/v1/nodes", body=body, headers=headers)
        if answer.status not in (201, 409):
            raise RuntimeError(f"POST node {item[1]}: {answer.status} {answer.data[:300]!r}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as executor:
        list(executor.map(create, enumerate(_names(n)), chunksize=64))
    return time.perf_counter() - t0


class Meter:
    """The requests the backend's client sends, by kind, and the bytes of the answers."""

    KINDS: ClassVar[list[tuple[str, str]]] = [
        (r"GET .*/nodes$", "LIST nodes"),
        (r"GET .*/nodes/[^/]+$", "GET node"),
        (r"PATCH .*/nodes/[^/]+/status$", "PATCH node/status"),
        (r"PATCH .*/nodes/[^/]+$", "PATCH node"),
        (r"POST .*/events$", "POST event"),
        (r".* .*/leases(/[^/]+)?$", "Lease"),
    ]

    def __init__(self, backend: KubernetesBackend) -> None:
        self.calls: Counter[str] = Counter()
        self.bytes = 0
        rest = backend.core.api_client.rest_client
        original: Callable[..., Any] = rest.request

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            answer = original(method, url, *args, **kwargs)
            path = url.split("?")[0]
            kind = next((k for p, k in self.KINDS if re.fullmatch(p, f"{method} {path}")), f"{method} other")
            self.calls[kind] += 1
            self.bytes += len(answer.read())  # read now; the answer keeps it for the caller
            return answer

        rest.request = request

    def reset(self) -> None:
        self.calls.clear()
        self.bytes = 0


@dataclass
class Run:
    seconds: float
    own_cpu: float
    apiserver_cpu: float
    etcd_cpu: float
    prometheus_cpu: float
    calls: dict[str, int]
    megabytes: float
    done: int = 0
    would: int = 0
    peak_python_mb: float = 0.0
    rss_mb: float = 0.0
    load: tuple[float, float, float] = field(default_factory=lambda: (0.0, 0.0, 0.0))


class Bench:
    def __init__(self, kube: KubeAPI, prometheus: psutil.Process, url: str, n: int, end: float, root: Path):
        self.kube, self.prometheus, self.url, self.n, self.end, self.root = (
            kube,
            prometheus,
            url,
            n,
            end,
            root,
        )
        assert kube._apiserver is not None and kube._etcd is not None
        # setpriv execs the server: these are the servers' own processes.
        self.apiserver = psutil.Process(kube._apiserver.pid)
        self.etcd = psutil.Process(kube._etcd.pid)
        kubeconfig = kube.kubeconfig(root / "kubeconfig")
        self.config = RemediateConfig(
            hold_seconds=300,
            settle_seconds=900,
            stale_seconds=180,
            budget=BudgetConfig(
                max_unavailable=max(1, n // 20), max_unavailable_per_domain=n, slow_start=False
            ),
            kubernetes=KubernetesConfig(
                kubeconfig=str(kubeconfig), namespace=NAMESPACE, domain_labels={"zone": ZONE}
            ),
        )

    def remediator(self, act: bool) -> tuple[Remediator, KubernetesBackend, Meter]:
        backend = open_backend(self.config, dry_run=not act)
        remediator = Remediator(
            self.config, backend, Prometheus(self.url, timeout=600), act=act, clock=lambda: self.end
        )
        return remediator, backend, Meter(backend)

    def timed(self, meter: Meter, work: Callable[[], Any], traced: bool = False) -> tuple[Run, Any]:
        """One piece of work; with ``traced``, under tracemalloc (its peak; tracemalloc slows Python
        down, so the timed runs are not traced)."""
        meter.reset()
        load = os.getloadavg()
        if traced:
            tracemalloc.start()
        servers = [p.cpu_times() for p in (self.apiserver, self.etcd, self.prometheus)]
        own, t0 = time.process_time(), time.perf_counter()
        out = work()
        seconds = time.perf_counter() - t0
        own = time.process_time() - own
        cpu = [
            a.user + a.system - b.user - b.system
            for a, b in zip(
                [p.cpu_times() for p in (self.apiserver, self.etcd, self.prometheus)], servers, strict=True
            )
        ]
        peak = 0
        if traced:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        run = Run(
            seconds=seconds,
            own_cpu=own,
            apiserver_cpu=cpu[0],
            etcd_cpu=cpu[1],
            prometheus_cpu=cpu[2],
            calls=dict(meter.calls),
            megabytes=meter.bytes / 1e6,
            peak_python_mb=peak / 1e6,
            rss_mb=psutil.Process().memory_info().rss / 1e6,
            load=load,
        )
        return run, out

    def reconcile(self, remediator: Remediator, meter: Meter, traced: bool = False) -> Run:
        run, result = self.timed(meter, remediator.reconcile, traced)
        assert result.plan is not None and result.problem is None, result.problem
        run.done, run.would = len(result.done), len(result.would)
        return run


def _calls(run: Run) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in sorted(run.calls.items(), key=lambda kv: -kv[1]))


def _say(what: str, runs: list[Run], traced: Run | None = None) -> None:
    best = min(runs, key=lambda r: r.seconds)

    def median(attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in runs)

    line = (
        f"  {what}: {best.seconds:.2f} s best, {median('seconds'):.2f} s median of {len(runs)}; "
        f"CPU: remediator {median('own_cpu'):.2f} s, apiserver {median('apiserver_cpu'):.2f} s, "
        f"etcd {median('etcd_cpu'):.2f} s, prometheus {median('prometheus_cpu'):.2f} s; "
        f"{best.megabytes:.1f} MB read in {_calls(best)}"
    )
    if best.done or best.would:
        line += f"; {best.done} done, {best.would} would"
    if traced is not None:
        line += f"; peak Python {traced.peak_python_mb:.0f} MB"
    line += f"; RSS {max(r.rss_mb for r in runs):.0f} MB; load {' '.join(f'{x:.1f}' for x in best.load)}"
    print(line, flush=True)


def etcd_db(root: Path) -> int:
    """The size of etcd's database file (its quota, 2 GiB by default, is on this)."""
    return sum(p.stat().st_size for p in (root / "kube" / "etcd").glob("data*/member/snap/db"))


def measure(n: int, runs: int, threads: int) -> None:
    end = the_end()
    with tempfile.TemporaryDirectory(prefix="remediate-kube-scale-") as tmp:
        root = Path(tmp)
        kinds, prepared = prepare(root, n, end)
        server, url = serve(root)
        try:
            with KubeAPI(root / "kube") as kube:
                created = create_nodes(kube, n, threads)
                kube.admin.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}).ok()
                listed = kube.admin.get("/api/v1/nodes?limit=1").ok().body
                sample = kube.node(_names(n)[0])
                sick = sum(1 for k in kinds.values() if k == "sick")
                print(
                    f"{n} nodes ({sick} sick and held; history of {HISTORY:.0f} s prepared in "
                    f"{prepared:.0f} s; API up in {kube.startup_seconds:.1f} s; {n} Nodes created in "
                    f"{created:.0f} s ({n / created:.0f}/s, {threads} threads); a Node is "
                    f"{len(json.dumps(sample))} bytes of JSON; etcd db {etcd_db(root) / 1e6:.0f} MB; "
                    f"{listed['metadata'].get('remainingItemCount', 0) + 1} listed",
                    flush=True,
                )
                bench = Bench(kube, psutil.Process(server.pid), url, n, end, root)

                remediator, backend, meter = bench.remediator(act=False)
                observed = [bench.timed(meter, lambda: backend.observe(end))[0] for _ in range(runs)]
                traced = bench.timed(meter, lambda: backend.observe(end), traced=True)[0]
                _say("observe() (dry-run: the Lease's ledger and the Nodes)", observed, traced)

                first = bench.reconcile(remediator, meter)
                _say("dry-run reconcile, first (Events of what it would do)", [first])
                again = [bench.reconcile(remediator, meter) for _ in range(runs)]
                traced = bench.reconcile(remediator, meter, traced=True)
                _say("dry-run reconcile, again (no Event repeated)", again, traced)

                remediator, backend, meter = bench.remediator(act=True)
                first = bench.reconcile(remediator, meter)
                _say("act reconcile, first (Lease taken, the held sick nodes quarantined)", [first])
                again = [bench.reconcile(remediator, meter) for _ in range(runs)]
                traced = bench.reconcile(remediator, meter, traced=True)
                _say("act reconcile, again (Lease renewed, heartbeats of our conditions)", again, traced)
                backend.close()

                cordoned = sum(
                    1
                    for item in kube.admin.get("/api/v1/nodes").ok().body["items"]
                    if item["spec"].get("unschedulable")
                )
                rss = [p.memory_info().rss / 1e6 for p in (bench.apiserver, bench.etcd)]
                print(
                    f"  after: {cordoned} Nodes cordoned; apiserver RSS {rss[0]:.0f} MB, etcd RSS "
                    f"{rss[1]:.0f} MB, etcd db {etcd_db(root) / 1e6:.0f} MB",
                    flush=True,
                )
        finally:
            server.terminate()
            server.wait()


def main() -> None:
    logging.getLogger("clusterhealth").setLevel(logging.ERROR)  # not a line per cordon
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="fleet sizes (default 1024 and 16384)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16, help="concurrent POSTs creating the Nodes")
    args = parser.parse_args()
    for n in args.nodes or [1024, 16384]:
        measure(n, args.runs, args.threads)


if __name__ == "__main__":
    main()
