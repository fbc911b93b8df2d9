"""A small simulated fleet: three agents, a real Prometheus with the generated rules (test
profile), a real Alertmanager running the example config, and a webhook receiving from it.

- `healthy`: the healthy H100 scenario on the healthy sysfs tree, with a node-local nccl-tests
  probe and a peer (iperf3) probe that meet their expectation;
- `gpu`: the faulty H100 scenario (GPU 6 lost from the start) and its kernel log, on the healthy
  sysfs tree: the GPU faults; its Slurm job's process under a simulated /proc, so that the job is
  named on each GPU and GPU 3 (clocked down) and GPU 0 (barely active) are its stragglers;
- `fabric`: the healthy H100 scenario on the faulty sysfs tree, with a probe held to more than it
  measures and one whose NCCL fell back to sockets: the RDMA, network, firmware and fabric faults.

`healthy` and `fabric` also form a pairwise group (real iperf3 over loopback, 12 s rounds) whose
meetings are fine.

The probe commands print saved real outputs (tests/fixtures): no GPU runs them here.
"""

from __future__ import annotations

import contextlib
import copy
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterhealth.agent.demo import kmsg_record
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import load_scenario

from .conftest import FIXTURES, SCENARIOS, AgentProcess, require_tool
from .mixin import ROOT, mixin
from .prom import Alertmanager, Prometheus, Webhook, hurried, wait_for

NCCL_OUTPUT = FIXTURES / "nccl-tests" / "08_single_node_8x_h100_allreduce.txt"
# Real NCCL INFO lines of a run that fell back to sockets, printed before NCCL_OUTPUT's table.
DEBUG_INFO = FIXTURES / "nccl-tests" / "nccl-debug-info"
NCCL_SOCKETS_INFO = DEBUG_INFO / "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log"
IPERF_OUTPUT = FIXTURES / "iperf3" / "01_tcp_loopback.json"
PAIRWISE_MEMBERS = {"healthy": "127.0.0.81", "fabric": "127.0.0.82"}
PAIRWISE_PERIOD = 12
PAGE_WAIT, TICKET_WAIT = "2s", "6s"
FAST_COLLECTORS = {
    "gpu": {"interval_seconds": 1},
    "jobs": {"interval_seconds": 1},
    "rdma": {"interval_seconds": 1},
    "kernel_log": {"interval_seconds": 1},
    "audit": {"interval_seconds": 1},
}


@dataclass
class Fleet:
    agents: dict[str, AgentProcess]
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: Webhook
    sysfs: dict[str, Path]
    rules: Path
    instances: dict[str, str] = field(default_factory=dict)
    # What the same alerts bring without the example's generated inhibitions: a second Alertmanager,
    # the example's routes and grouping without its inhibit_rules, fed by the same Prometheus.
    uninhibited: Webhook | None = None

    def instance(self, node: str) -> str:
        return self.instances[node]

    def exposition(self, node: str) -> str:
        return self.agents[node].metrics()


def _probe(name: str, kind: str, output: Path, expect: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "argv": ["cat", str(output)],
        "interval_seconds": 2,
        "jitter_seconds": 0,
        "expect": expect,
        **extra,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pairwise_group(ports: tuple[int, int]) -> dict[str, Any]:
    """The healthy and fabric nodes meet every round (a group of two) over loopback, with real
    iperf3 paced well under the expectation: their meetings are fine."""
    iperf3 = require_tool("iperf3")
    return {
        "name": "pairs",
        "members": PAIRWISE_MEMBERS,
        # Each on a leaf of its own, as a members file places them (the Fabric dashboard's leaves).
        "placement": {node: {"leaf": f"leaf-{node}"} for node in PAIRWISE_MEMBERS},
        "period_seconds": PAIRWISE_PERIOD,
        "port": ports[0],
        "confirm_port": ports[1],
        "timeout_seconds": 2.5,
        "skew_seconds": 0.5,
        "startup_seconds": 0.5,
        "confirm_runs": 1,
        "server_argv": [iperf3, "-s", "-1", "-B", "{address}", "-p", "{port}", "-J"],
        "client_argv": [
            iperf3,
            "-c",
            "{peer}",
            "-B",
            "{address}",
            "-p",
            "{port}",
            "-t",
            "1",
            "-b",
            "200M",
            "-J",
        ],
        "expect": "200 Mb/s",
    }


def _config(tmp: Path, node: str, probes: list[dict[str, Any]], group: dict[str, Any] | None = None) -> Path:
    path = tmp / f"{node}.yaml"
    data: dict[str, Any] = {
        "node_name": node,
        "collectors": FAST_COLLECTORS,
        "probing": {"state_dir": str(tmp / f"{node}-state")},
    }
    if probes:
        data["probes"] = probes
    if group is not None and node in group["members"]:
        data["pairwise_groups"] = [group]
    path.write_text(yaml.safe_dump(data))
    return path


def _kmsg(path: Path, scenario: dict[str, Any]) -> None:
    with path.open("wb") as out:
        for sequence, line in enumerate(scenario.get("kernel_log", []), start=1):
            out.write(kmsg_record(sequence, line["message"]))


@contextlib.contextmanager
def running_fleet(tmp: Path, profile: dict[str, Any] | None = None) -> Iterator[Fleet]:
    """The fleet, its rules rendered with ``profile`` (default: the mixin's TEST_PROFILE)."""
    healthy_sys, faulty_sys = tmp / "healthy-sys", tmp / "faulty-sys"
    sim_sysfs.build(healthy_sys, faulty=False)
    sim_sysfs.build(faulty_sys)

    faulty = yaml.safe_load((SCENARIOS / "h100-faulty.yaml").read_text())
    for fault in faulty["faults"]:
        fault.pop("from_seconds", None)  # GPU 6 is lost from the start: no 45 s wait
    gpu_scenario = tmp / "gpu-faults.yaml"
    gpu_scenario.write_text(yaml.safe_dump(faulty))
    gpu_proc = tmp / "gpu-proc"
    sim_procfs.build(gpu_proc, load_scenario(gpu_scenario))
    healthy_scenario = SCENARIOS / "h100-healthy.yaml"

    nodes = {
        "healthy": (
            healthy_scenario,
            healthy_sys,
            [
                _probe("nccl-local", "nccl-tests", NCCL_OUTPUT, "400 GB/s"),
                _probe("storage", "iperf3", IPERF_OUTPUT, "10 Gb/s", peers=["storage-1"]),
            ],
            None,
        ),
        "gpu": (gpu_scenario, healthy_sys, [], faulty),
        "fabric": (
            healthy_scenario,
            faulty_sys,
            [
                _probe("nccl-local", "nccl-tests", NCCL_OUTPUT, "1000 GB/s"),
                # NCCL over sockets on a node with HCAs: NCCLTransportFallback, not ProbeFailing.
                _probe(
                    "nccl-sockets",
                    "nccl-tests",
                    NCCL_OUTPUT,
                    "400 GB/s",
                    argv=["cat", str(NCCL_SOCKETS_INFO), str(NCCL_OUTPUT)],
                ),
            ],
            None,
        ),
    }
    rules = tmp / "rules.yaml"
    rules.write_text(
        mixin.render(mixin.load_config(None, mixin.TEST_PROFILE if profile is None else profile))
    )

    agents: dict[str, AgentProcess] = {}
    servers: list[Any] = []
    group = _pairwise_group((free_port(), free_port()))
    try:
        for node, (scenario, sysfs, probes, kernel_log) in nodes.items():
            kmsg = tmp / f"{node}.kmsg"
            kmsg.touch()
            if kernel_log:
                _kmsg(kmsg, kernel_log)
            extra = ["--procfs-root", str(gpu_proc)] if node == "gpu" else []
            if node == "healthy":
                # The Prolog's mapping directory of a Slurm node with no job running: a second
                # attribution source beside the cgroups, so the conflict count (which takes two)
                # is exported for the Jobs dashboard.
                (tmp / "healthy-jobs").mkdir()
                extra += ["--job-mapping-dir", str(tmp / "healthy-jobs")]
            agents[node] = AgentProcess(
                [
                    "--config",
                    str(_config(tmp, node, probes, group)),
                    "--simulate",
                    str(scenario),
                    "--sysfs-root",
                    str(sysfs),
                    "--kmsg-path",
                    str(kmsg),
                    *extra,
                ]
            )
        instances = {node: agent.url.removeprefix("http://") for node, agent in agents.items()}

        webhook = Webhook().__enter__()
        servers.append(webhook)
        am_config = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
        for receiver in am_config["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = webhook.url("/" + receiver["name"])
        # A page waits 2 s for the rest of its incident (a scrape or two), a ticket 6 s for the page
        # that inhibits it: the example's 30 s and 5 minutes, for a test of seconds.
        hurried(am_config, PAGE_WAIT, TICKET_WAIT)
        alertmanager = Alertmanager(tmp / "alertmanager", am_config)
        alertmanager.start()
        servers.append(alertmanager)
        uninhibited = Webhook().__enter__()
        servers.append(uninhibited)
        bare_config = copy.deepcopy(am_config)
        del bare_config["inhibit_rules"]
        for receiver in bare_config["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = uninhibited.url("/" + receiver["name"])
        bare = Alertmanager(tmp / "alertmanager-uninhibited", bare_config)
        bare.start()
        servers.append(bare)

        prometheus = Prometheus(
            tmp / "prometheus",
            scrape_configs=[
                {
                    "job_name": "clusterhealth",
                    "scrape_interval": "1s",
                    "static_configs": [{"targets": list(instances.values())}],
                }
            ],
            rule_files=[rules],
            alertmanagers=[alertmanager.address, bare.address],
        )
        prometheus.start()
        servers.append(prometheus)
        wait_for(lambda: prometheus.targets_up() == 3, 30, "three agents scraped", prometheus.log)
        yield Fleet(
            agents,
            prometheus,
            alertmanager,
            webhook,
            {"healthy": healthy_sys, "gpu": healthy_sys, "fabric": faulty_sys},
            rules,
            instances,
            uninhibited,
        )
    finally:
        for server in reversed(servers):
            if isinstance(server, Webhook):
                server.__exit__()
            else:
                server.stop()
        for agent in agents.values():
            agent.stop()


def wait_until_series(fleet: Fleet, expr: str, timeout: float = 30) -> None:
    wait_for(lambda: fleet.prometheus.query(expr) != [], timeout, f"series {expr}", fleet.prometheus.log)


def settle(seconds: float) -> None:
    """Let a few scrape and evaluation cycles pass (1 s each in the test profile)."""
    time.sleep(seconds)
