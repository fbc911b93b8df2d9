"""The data the dashboards are looked at on: three agents and a pairwise group's history in one real
Prometheus that evaluates the generated rules (test profile).

- `faulty`: the demo's node (`clusterhealth demo`): the faulty H100 scenario with GPU 6 lost from the
  start, its kernel log, the faulty sysfs tree and its Slurm job, plus a node-local nccl-tests
  probe that prints a slower real run than the others and is held to more than it measures, and one
  whose NCCL fell back to sockets;
- `healthy`: the healthy H100 scenario on the healthy sysfs tree, its nccl-tests probe fine;
- `jobs`: a healthy node whose GPUs run jobs that the sources attribute badly: Slurm job 3385 on
  GPUs 0 to 3 (their processes' cgroups), a desktop session's process on GPU 4 (busy, no job), a
  Prolog mapping file naming job 9999 on GPU 1 (the cgroup disagrees) and one that is not a
  mapping file (the mapping source fails), and the same nccl-tests probe as `healthy`;
- `pairs`: eight nodes h1..h8 of a pairwise group (probe "pairs") whose last half hour of rounds,
  played by checks/fabric/simulation.py's real schedule with h3 at half bandwidth, is backfilled
  with promtool into Prometheus's data directory before it starts, ending now: the recording rules
  price h3 while the agents are scraped.

Prometheus watches from the agents' start: the faulty node's kernel-log lines, its links' traffic
and errors and its HCA's PCIe retries happen once Prometheus has seen the counters' first values
(`_events`), GPU 2's NVLink errors and GPU 1's PCIe replays a few seconds in (`LATER`). One more
target has no agent behind it: an agent that is down.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clusterhealth.agent.demo import kmsg_record, sample_config, sample_policy
from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import load_scenario

from .conftest import FIXTURES, SCENARIOS, AgentProcess, require_tool
from .mixin import mixin
from .prom import Prometheus, free_port, wait_for

NCCL = FIXTURES / "nccl-tests"
FAST = 1  # seconds: the agents' collectors and probes, Prometheus's scrapes and rule evaluations
PAIRS_PROBE = "pairs"
PAIRS_PERIOD = 60.0  # seconds a round: 30 rounds are half an hour, inside the rules' 1 h window
PAIRS_ROUNDS = 30
PAIRS_NODES = 8
PAIRS_BAD_HOST = "h3"
# Four leaf switches of two nodes each, as a members file places them, not in the order of the
# names (so that a table sorted by name is not sorted by place): h3 sits on leaf3 with h7.
PAIRS_LEAVES = {f"h{i}": f"leaf{(i - 1) % 4 + 1}" for i in range(1, 9)}
SLURM_JOB = "817304"  # the faulty scenario's job
LATER = 8.0  # seconds after the agent's start: the faults that happen under Prometheus's eyes


@dataclass
class DashboardFleet:
    prometheus: Prometheus
    agents: dict[str, AgentProcess]
    sysfs: dict[str, Path]
    started: float  # when every agent had been scraped (Unix time)

    def instance(self, node: str) -> str:
        return self.agents[node].url.removeprefix("http://")


def _probe(name: str, output: list[Path], expect: str) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "nccl-tests",
        "argv": ["cat", *map(str, output)],
        "interval_seconds": 2,
        "jitter_seconds": 0,
        "expect": expect,
    }


def _agent(
    tmp: Path, node: str, scenario: Path, sysfs: Path, procfs: Path, port: int, extra: dict[str, Any]
) -> AgentProcess:
    config = {
        "node_name": node,
        "collectors": {
            name: {"interval_seconds": FAST} for name in ("gpu", "jobs", "rdma", "kernel_log", "audit")
        },
        # The probes print saved outputs: they run beside the simulated jobs' busy GPUs.
        "probing": {"state_dir": str(tmp / f"{node}-state"), "check_gpus_idle": False},
        **extra,
    }
    config["collectors"]["jobs"].update(
        pod_resources_socket=str(tmp / "no-kubelet.sock"),
        mapping_dir=str(config.pop("mapping_dir", tmp / f"{node}-no-mapping-dir")),
    )
    sample = sample_config()
    if sample is not None:
        # The sample config describes the node the demo simulates, as the demo uses it.
        config["policy"] = sample_policy(sample)
    path = tmp / f"{node}-config.yaml"
    path.write_text(yaml.safe_dump(config))
    kmsg = tmp / f"{node}.kmsg"  # the kernel log's lines come once Prometheus watches (_events)
    kmsg.touch()
    return AgentProcess(
        [
            "--listen",
            f"127.0.0.1:{port}",
            "--config",
            str(path),
            "--simulate",
            str(scenario),
            "--sysfs-root",
            str(sysfs),
            "--kmsg-path",
            str(kmsg),
            "--procfs-root",
            str(procfs),
        ]
    )


def _faulty_scenario(tmp: Path) -> Path:
    data = yaml.safe_load((SCENARIOS / "h100-faulty.yaml").read_text())
    for fault in data["faults"]:
        fault.pop("from_seconds", None)  # GPU 6 is lost from the start: no 45 s wait
    # What the demo does not show in its first minute: GPU 2's NVLink 5 keeps erring and GPU 1's
    # narrowed PCIe link replays, a few seconds in, while Prometheus watches.
    data["faults"] += [
        {
            "description": "GPU 2's NVLink 5 keeps erring",
            "gpu": 2,
            "from_seconds": LATER,
            "set": {
                "nvlink_errors": {5: {"crc_flit": 30000, "crc_data": 20, "replay": 1500, "recovery": 40}}
            },
        },
        {
            "description": "GPU 1's link replays",
            "gpu": 1,
            "from_seconds": LATER,
            "set": {"pcie_replays": 120},
        },
    ]
    path = tmp / "faulty.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _jobs_scenario(tmp: Path) -> Path:
    data = yaml.safe_load((SCENARIOS / "h100-healthy.yaml").read_text())
    slurm = (FIXTURES / "cgroup" / "slurm-v2.txt").read_text()  # job 3385
    session = (FIXTURES / "cgroup" / "user-session-v2.txt").read_text()  # no job
    busy = {"utilization": 1.0, "sm_active": 0.8, "sm_clock_mhz": 1980, "clocks_event_reasons": []}
    data["gpus"] = {
        **{i: {**busy, "compute_processes": [{"pid": 3000 + i, "cgroup": slurm}]} for i in range(4)},
        4: {**busy, "compute_processes": [{"pid": 3004, "cgroup": session}]},
    }
    path = tmp / "jobs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _pairs_history(promtool: str, data: Path, now: float) -> None:
    """The pairwise group's rounds up to now, backfilled into a fresh TSDB directory."""
    last = int(now // PAIRS_PERIOD)
    first = last - PAIRS_ROUNDS + 1
    fleet = sim.Fleet(
        sim.node_names(PAIRS_NODES), seed=PAIRS_PROBE, period=PAIRS_PERIOD, p_busy=0.0, leaves=PAIRS_LEAVES
    )
    fleet.bad_hosts[PAIRS_BAD_HOST] = 0.5
    group = sim.Group(fleet, random.Random(3))
    rounds = [group.play(r) for r in range(first, last + 1)]
    families = sim.exposition_history(
        PAIRS_PROBE,
        rounds,
        PAIRS_PERIOD,
        sim.node_names(PAIRS_NODES),
        scrape_interval=15.0,
        leaves=PAIRS_LEAVES,
    )
    # The last round is the current one: what its agents would have exported so far.
    for name, lines in families.items():
        families[name] = [line for line in lines if float(line.rsplit(" ", 1)[1]) < now - 1]
    source = data.parent / "pairs.om"
    source.write_text(sim.openmetrics(families))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
    )


@contextlib.contextmanager
def running(tmp: Path) -> Iterator[DashboardFleet]:
    promtool = require_tool("promtool")
    faulty, jobs = _faulty_scenario(tmp), _jobs_scenario(tmp)
    scenarios = {"faulty": faulty, "healthy": SCENARIOS / "h100-healthy.yaml", "jobs": jobs}
    sysfs = {node: tmp / f"{node}-sys" for node in scenarios}
    procfs = {node: tmp / f"{node}-proc" for node in scenarios}
    for node, scenario in scenarios.items():
        sim_sysfs.build(sysfs[node], faulty=node == "faulty")
        procfs[node].mkdir()
        sim_procfs.build(procfs[node], load_scenario(scenario))
        sim_procfs.build_job_cgroups(sysfs[node], load_scenario(scenario))
    mapping = tmp / "jobs-mapping"
    mapping.mkdir()
    (mapping / "1").write_text("9999\n")  # the Prolog's file of another job: the cgroup says 3385
    # Job 9999 runs (its cgroup is there), so its file does not expire while the test looks.
    (job,) = sysfs["jobs"].glob("fs/cgroup/**/job_3385")
    (job.parent / "job_9999").mkdir()
    (mapping / "2").write_text("3385\n")
    (mapping / "5").write_text("not a job id!\n")  # not a mapping file: the source fails

    sixteen = NCCL / "10_multinode_2x8_h100_srun_prefixed_nocheck.txt"  # slower than one node's run
    eight = NCCL / "08_single_node_8x_h100_allreduce.txt"
    sockets = NCCL / "nccl-debug-info" / "nccl-issue-952_no_ib_device_socket_and_p2p_ipc.log"
    extra: dict[str, dict[str, Any]] = {
        "faulty": {
            "probes": [
                _probe("nccl-local", [sixteen], "400 GB/s"),
                _probe("nccl-sockets", [sockets, eight], "300 GB/s"),
            ]
        },
        "healthy": {"probes": [_probe("nccl-local", [eight], "300 GB/s")]},
        "jobs": {"probes": [_probe("nccl-local", [eight], "300 GB/s")], "mapping_dir": mapping},
    }
    rules = tmp / "rules.yaml"
    rules.write_text(mixin.render(mixin.load_config(None, mixin.TEST_PROFILE)))
    # Ports picked first, so that Prometheus watches the agents from their start (the scenario's
    # later faults happen under its eyes), and one more target where no agent answers.
    ports = {node: free_port() for node in (*scenarios, "down")}
    prometheus = Prometheus(
        tmp / "prometheus",
        scrape_configs=[
            {
                "job_name": "clusterhealth",
                "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in ports.values()]}],
            }
        ],
        rule_files=[rules],
        interval=f"{FAST}s",
    )
    agents: dict[str, AgentProcess] = {}
    try:
        _pairs_history(promtool, prometheus.tmp / "data", time.time())
        prometheus.start()
        for node, scenario in scenarios.items():
            agents[node] = _agent(tmp, node, scenario, sysfs[node], procfs[node], ports[node], extra[node])
        wait_for(lambda: prometheus.targets_up() == len(agents), 30, "the agents scraped", prometheus.log)
        fleet = DashboardFleet(prometheus, agents, sysfs, time.time())
        _events(fleet, load_scenario(faulty))
        yield fleet
    finally:
        prometheus.stop()
        for agent in agents.values():
            agent.stop()


def _events(fleet: DashboardFleet, faulty: Any) -> None:
    """What happens on the faulty node once Prometheus has seen its counters: the kernel log's
    lines, traffic on its links (symbol errors on mlx5_0, receive errors on mlx5_1, mlx5_5's link
    going down four times, data on every port but the one that is down) and mlx5_4's PCIe function
    retrying."""
    instance = fleet.instance("faulty")
    for family in ("clusterhealth_rdma_port_errors_total", "clusterhealth_pcie_aer_errors_total"):
        selector = f'{family}{{instance="{instance}"}}'
        wait_for(
            lambda s=selector: fleet.prometheus.query(s) != [],
            30,
            f"a first sample of {family}",
            fleet.prometheus.log,
        )
    with (fleet.sysfs["faulty"].parent / "faulty.kmsg").open("ab") as kmsg:
        for sequence, (_, message) in enumerate(faulty.kernel_log, start=1):
            kmsg.write(kmsg_record(sequence, message))
    ports = fleet.sysfs["faulty"] / "class" / "infiniband"
    for device, name, value in (
        ("mlx5_0", "symbol_error", 5000),
        ("mlx5_1", "port_rcv_errors", 50),
        ("mlx5_5", "link_downed", 4),
    ):
        (ports / device / "ports" / "1" / "counters" / name).write_text(f"{value}\n")
    for counters in ports.glob("mlx5_*/ports/1/counters"):
        if counters.parts[-4] != "mlx5_3":
            for name in ("port_rcv_data", "port_xmit_data"):
                data = counters / name
                data.write_text(f"{int(data.read_text()) + 250_000_000}\n")  # 1 GB in 4-byte words
    (aer,) = (fleet.sysfs["faulty"] / "devices").glob("**/0000:9a:00.0/aer_dev_correctable")
    lines = dict(line.split() for line in aer.read_text().splitlines())
    lines.update(RxErr="4", TOTAL_ERR_COR=str(int(lines["TOTAL_ERR_COR"]) + 3))
    aer.write_text("".join(f"{k} {v}\n" for k, v in lines.items()))
