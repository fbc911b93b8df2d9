"""The remediator in real time: a real Slurm of 8 nodes (tests/slurm.py), 8 real agents on simulated
hardware named after its nodes, a real Prometheus scraping them (and the remediator) with the
generated rules in the test profile.

A node turns CRITICAL the way a real one does, from what its agent reads: its simulated sysfs tree
gets port 1 of mlx5_0 DOWN/Polling (the audit's rdma_port_state, verdict `unhealthy` /
`inspect`), and healthy again when the port comes back. hold_seconds is 3 and settle_seconds 4,
so each test takes seconds. tests/test_remediate_slurm.py covers the same rules on a chosen past.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterhealth.exporters.sim import sysfs as sim_sysfs

from .conftest import CLUSTERHEALTH, SCENARIOS, AgentProcess
from .mixin import mixin
from .prom import Prometheus, free_port, wait_for
from .slurm import SlurmCluster

NODES = [f"n{i}" for i in range(1, 9)]
PORT = "class/infiniband/mlx5_0/ports/1"
REASON = "clusterhealth: inspect: rdma_port_state mlx5_0/1"
COLLECTORS = {name: {"interval_seconds": 1} for name in ("gpu", "rdma", "kernel_log", "audit")}


@dataclass
class Fleet:
    agents: dict[str, AgentProcess]
    trees: dict[str, Path]
    prometheus: Prometheus
    remediator_port: int
    tmp: Path

    def port_down(self, node: str) -> None:
        self._port(node, "1: DOWN", "2: Polling")

    def port_up(self, node: str) -> None:
        self._port(node, "4: ACTIVE", "5: LinkUp")

    def _port(self, node: str, state: str, physical: str) -> None:
        port = self.trees[node] / PORT
        (port / "state").resolve().write_text(state + "\n")
        (port / "phys_state").resolve().write_text(physical + "\n")

    def verdicts(self) -> dict[str, str]:
        """Each node's verdict in Prometheus now: 'unhealthy inspect'."""
        found = self.prometheus.query(
            "clusterhealth_node_verdict * on (instance) group_left (node) clusterhealth_node_info"
        )
        return {s["metric"]["node"]: f"{s['metric']['state']} {s['metric']['action']}" for s in found}

    def wait_verdicts(self, expected: dict[str, str], timeout: float = 60) -> None:
        wait_for(
            lambda: all(self.verdicts().get(n) == v for n, v in expected.items()),
            timeout,
            f"verdicts {expected} (now {self.verdicts()})",
            self.prometheus.log,
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("remediate-fleet")
    healthy = tmp / "healthy-sys"
    sim_sysfs.build(healthy, faulty=False)
    agents: dict[str, AgentProcess] = {}
    trees: dict[str, Path] = {}
    prometheus = None
    try:
        for node in NODES:
            trees[node] = tmp / f"{node}-sys"
            shutil.copytree(healthy, trees[node], symlinks=True)
            config = tmp / f"{node}.yaml"
            config.write_text(yaml.safe_dump({"node_name": node, "collectors": COLLECTORS}))
            (tmp / f"{node}.kmsg").touch()
            agents[node] = AgentProcess(
                [
                    "--config", str(config),
                    "--simulate", str(SCENARIOS / "h100-healthy.yaml"),
                    "--sysfs-root", str(trees[node]),
                    "--kmsg-path", str(tmp / f"{node}.kmsg"),
                ]
            )  # fmt: skip
        rules = tmp / "rules.yaml"
        rules.write_text(mixin.render(mixin.load_config(None, mixin.TEST_PROFILE)))
        remediator_port = free_port()
        prometheus = Prometheus(
            tmp / "prometheus",
            scrape_configs=[
                {
                    "job_name": "clusterhealth",
                    "static_configs": [{"targets": [a.url.removeprefix("http://") for a in agents.values()]}],
                },
                {
                    "job_name": "clusterhealth-remediate",
                    "static_configs": [{"targets": [f"127.0.0.1:{remediator_port}"]}],
                },
            ],
            rule_files=[rules],
        )
        prometheus.start()
        fleet = Fleet(agents, trees, prometheus, remediator_port, tmp)
        fleet.wait_verdicts({n: "healthy none" for n in NODES})
        yield fleet
    finally:
        if prometheus is not None:
            prometheus.stop()
        for agent in agents.values():
            agent.stop()


@pytest.fixture
def healthy_fleet(fleet: Fleet, slurm: SlurmCluster) -> Fleet:
    """Every port up again and every verdict healthy in Prometheus; Slurm reset (`slurm`)."""
    for node in NODES:
        fleet.port_up(node)
    fleet.wait_verdicts({n: "healthy none" for n in NODES})
    return fleet


def remediator_config(tmp: Path, **extra: Any) -> Path:
    config = {
        "interval_seconds": 1,
        "hold_seconds": 3,
        "settle_seconds": 4,
        "stale_seconds": 30,
        "budget": {"max_unavailable": 2, "max_unavailable_per_domain": 8, "slow_start": False},
        "slurm": {"state_dir": str(tmp / "state"), "timeout_seconds": 10},
        **extra,
    }
    path = tmp / "remediate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def remediate(
    fleet: Fleet, slurm: SlurmCluster, config: Path, *extra: str, url: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(CLUSTERHEALTH, "remediate", "--prometheus", url or fleet.prometheus.url, "--backend", "slurm"),
            *("--config", str(config), "--once", *extra),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **slurm.env},
        check=False,
    )


def until(fleet: Fleet, slurm: SlurmCluster, config: Path, done: Any, *extra: str) -> str:
    """Reconcile once a second until ``done(result)``; the last output."""
    seen: list[subprocess.CompletedProcess[str]] = []

    def reconciled() -> bool:
        seen[:] = [remediate(fleet, slurm, config, *extra)]
        assert seen[0].returncode in (0, 1), seen[0].stdout + seen[0].stderr
        return bool(done(seen[0]))

    wait_for(reconciled, 60, "the remediator", lambda: seen[0].stdout + seen[0].stderr if seen else "")
    return seen[0].stdout


def drained(slurm: SlurmCluster) -> dict[str, str | None]:
    return {name: node.reason for name, node in slurm.nodes().items() if node.drained}


def test_one_critical_node_is_drained_then_resumed_once_healthy_again(
    healthy_fleet: Fleet, slurm: SlurmCluster, tmp_path: Path
) -> None:
    fleet, config = healthy_fleet, remediator_config(tmp_path)
    fleet.port_down("n1")
    fleet.wait_verdicts({"n1": "unhealthy inspect"})
    out = until(fleet, slurm, config, lambda r: r.returncode == 1, "--act")
    assert f"quarantine n1: {REASON}" in out
    assert drained(slurm) == {"n1": REASON}
    fleet.port_up("n1")
    fleet.wait_verdicts({"n1": "healthy none"})
    out = until(fleet, slurm, config, lambda r: r.returncode == 1, "--act")
    assert f"release n1: {REASON}" in out
    slurm.wait_node("n1", lambda n: n.available, what="n1 resumed")
    assert drained(slurm) == {}
    (act,) = yaml.safe_load((tmp_path / "state" / "ledger.json").read_text())["acts"]
    assert (act["node"], act["reason"], act["outcome"]) == ("n1", REASON, "recovered")


def test_a_node_an_admin_drained_stays_drained(
    healthy_fleet: Fleet, slurm: SlurmCluster, tmp_path: Path
) -> None:
    """n2, drained by an admin, and n3 turn sick and come back together: n3 (ours) is drained and
    resumed, n2 is reported as someone else's and stays as the admin left it."""
    fleet, config = healthy_fleet, remediator_config(tmp_path)
    slurm.drain("n2", "admin: maintenance")
    for node in ("n2", "n3"):
        fleet.port_down(node)
    fleet.wait_verdicts({"n2": "unhealthy inspect", "n3": "unhealthy inspect"})
    out = until(fleet, slurm, config, lambda r: r.returncode == 1, "--act")
    assert "other n2: IDLE+DRAIN: admin: maintenance" in out and f"quarantine n3: {REASON}" in out
    for node in ("n2", "n3"):
        fleet.port_up(node)
    fleet.wait_verdicts({"n2": "healthy none", "n3": "healthy none"})
    out = until(fleet, slurm, config, lambda r: r.returncode == 1, "--act")
    assert f"release n3: {REASON}" in out and "n2" not in out.split("budget:")[0].replace("other n2", "")
    assert drained(slurm) == {"n2": "admin: maintenance"}


def test_dry_run_touches_nothing(healthy_fleet: Fleet, slurm: SlurmCluster, tmp_path: Path) -> None:
    fleet, config = healthy_fleet, remediator_config(tmp_path)
    fleet.port_down("n4")
    fleet.wait_verdicts({"n4": "unhealthy inspect"})
    out = until(fleet, slurm, config, lambda r: r.returncode == 1)
    assert f"would quarantine n4: {REASON}" in out and "dry-run: nothing was touched" in out
    assert drained(slurm) == {}
    assert not (tmp_path / "state").exists()


def test_six_critical_at_once_the_budget_holds_at_its_cap_and_the_alert_fires(
    healthy_fleet: Fleet, slurm: SlurmCluster, tmp_path: Path
) -> None:
    fleet, config = healthy_fleet, remediator_config(tmp_path)
    daemon = subprocess.Popen(
        [
            *(
                CLUSTERHEALTH,
                "remediate",
                "--prometheus",
                fleet.prometheus.url,
                "--backend",
                "slurm",
                "--act",
            ),
            *("--config", str(config), "--listen", f"127.0.0.1:{fleet.remediator_port}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "remediate.log").open("w"),
        env={**os.environ, **slurm.env},
    )
    log = lambda: (tmp_path / "remediate.log").read_text()[-4000:]  # noqa: E731
    try:
        sick = NODES[2:]
        for node in sick:
            fleet.port_down(node)
        fleet.wait_verdicts({n: "unhealthy inspect" for n in sick})

        def firing() -> bool:
            return any(
                a["labels"]["alertname"] == "RemediationBudgetExhausted" and a["state"] == "firing"
                for a in fleet.prometheus.alerts()
            )

        wait_for(firing, 90, "RemediationBudgetExhausted firing", log)
        assert len(drained(slurm)) == 2 and set(drained(slurm)) <= set(sick)
        assert set(drained(slurm).values()) == {REASON}
        exposition = get_url(f"http://127.0.0.1:{fleet.remediator_port}/metrics")
        assert 'clusterhealth_remediation_budget_remaining{backend="slurm"} 0.0' in exposition
        assert 'clusterhealth_remediation_deferred_nodes{backend="slurm",reason="budget"} 4.0' in exposition
        # Every remediation series the rules read is one it exports.
        rules = yaml.safe_load(mixin.RULES_FILE.read_text())
        used = {
            n
            for g in rules["groups"]
            for r in g["rules"]
            for n in re.findall(r"clusterhealth_remediation_[a-z_]+", r["expr"])
        }
        assert used and all(re.search(rf"^{n}\{{", exposition, re.M) for n in used), used
        assert len(drained(slurm)) == 2  # still at its cap
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, log()


def get_url(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_prometheus_stopped_is_no_action(healthy_fleet: Fleet, slurm: SlurmCluster, tmp_path: Path) -> None:
    """Last in the module: it stops the module's Prometheus."""
    fleet, config = healthy_fleet, remediator_config(tmp_path)
    fleet.port_down("n5")
    fleet.wait_verdicts({"n5": "unhealthy inspect"})
    fleet.prometheus.stop()
    done = remediate(fleet, slurm, config, "--act")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no action: cannot reach Prometheus" in done.stdout
    assert drained(slurm) == {}
