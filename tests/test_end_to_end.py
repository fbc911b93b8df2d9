"""End to end: a real Prometheus loads the generated rules (test profile) and scrapes three agents
on simulated nodes; a real Alertmanager running the example config delivers to a webhook. The
faulty nodes' alerts arrive with their labels at the receiver their severity routes to; the
healthy node raises none; each incident pages (or tickets) once, the alerts that a page or the
node's own check stands for are inhibited. The same fleet checks the dashboards: every name they
use is in an agent's exposition or is a recording rule, and every panel query returns data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterhealth.dashboards import build
from clusterhealth.exporters.gpu import GpuCollector
from clusterhealth.exporters.rdma import RdmaCollector

from .fleet import PAIRWISE_PERIOD, TICKET_WAIT, Fleet, running_fleet, settle, wait_until_series
from .prom import Webhook, wait_for
from .test_dashboards import concrete, exported_names, load, queries, recorded_names, used_names


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Three simulated nodes, a real Prometheus with the rules and a real Alertmanager (tests/fleet.py)."""
    with running_fleet(tmp_path_factory.mktemp("fleet")) as running:
        yield running


RECEIVER = {"critical": "pager", "warning": "ticket"}
REMEDIATION = "clusterhealth_remediation_"

# (node, alertname, labels that single the alert out, severity)
EXPECTED = [
    ("gpu", "GPUFellOffBus", {"gpu": "6"}, "critical"),
    ("gpu", "GPUUncorrectableECC", {"gpu": "5", "error": "uncorrected"}, "critical"),
    ("gpu", "GPURowRemapFailed", {"gpu": "7"}, "critical"),
    ("gpu", "GPURecoveryActionRequired", {"gpu": "4", "action": "gpu_reset"}, "critical"),
    ("gpu", "GPUXidCritical", {"gpu": "2", "xid": "74"}, "critical"),
    ("gpu", "GPUXidCritical", {"gpu": "7", "xid": "64"}, "critical"),
    ("gpu", "GPUXidCritical", {"gpu": "6", "xid": "79"}, "critical"),
    ("gpu", "GPUThermalOrPowerSlowdown", {"gpu": "3", "reason": "hw_thermal_slowdown"}, "warning"),
    ("gpu", "GPUPCIeLinkDegraded", {"gpu": "1"}, "warning"),
    ("gpu", "NVLinkDown", {"gpu": "2"}, "critical"),
    ("gpu", "NodeStraggler", {"gpu": "3"}, "warning"),
    # The scenario's Slurm job, named by its process's cgroup: GPU 3's clock and GPU 0's SM
    # activity hold it back, and the node's critical faults hit it.
    ("gpu", "JobStraggler", {"gpu": "3", "signal": "sm_clock", "exported_job": "817304"}, "warning"),
    ("gpu", "JobStraggler", {"gpu": "0", "signal": "sm_active", "exported_job": "817304"}, "warning"),
    ("gpu", "JobHitByNodeFault", {"scheduler": "slurm", "exported_job": "817304"}, "critical"),
    ("fabric", "RDMAPortDown", {"device": "mlx5_3", "port": "1"}, "critical"),
    ("fabric", "RDMAPortErrorsUnknown", {"device": "mlx5_5", "port": "1"}, "warning"),
    ("fabric", "RDMAPCIeLinkDegraded", {"device": "mlx5_4"}, "warning"),
    ("fabric", "MTUMismatch", {"interface": "enp170s0f1np1", "mtu": "1500"}, "warning"),
    ("fabric", "NodeCheckFailing", {"check": "hca_firmware", "subject": "mlx5_7"}, "warning"),
    ("fabric", "FabricBandwidthDegraded", {"probe": "nccl-local"}, "warning"),
    ("fabric", "NCCLTransportFallback", {"probe": "nccl-sockets", "net": "Socket"}, "warning"),
    ("fabric", "RDMALinkFlapping", {"device": "mlx5_5", "counter": "link_downed"}, "warning"),
    ("fabric", "RDMAPortErrors", {"device": "mlx5_0", "counter": "symbol_error"}, "critical"),
    ("fabric", "RDMAPortErrors", {"device": "mlx5_1", "counter": "port_rcv_errors"}, "warning"),
]

# Alerts that fire but reach nobody: a page about the same GPU, or the node's own firmware check,
# stands for them (deploy/alertmanager's generated inhibitions).
INHIBITED = [
    ("gpu", "GPURowRemapPending", {"gpu": "5"}, "warning"),
    ("gpu", "GPUXidCritical", {"gpu": "5", "xid": "94"}, "warning"),
    ("gpu", "GPUXidCritical", {"gpu": "5", "xid": "63"}, "warning"),
    (
        "fabric",
        "FirmwareDrift",
        {"component": "hca", "subject": "mlx5_7", "version": "28.36.1010"},
        "warning",
    ),
]

# One incident, one notification: (node, the labels of the incident's alerts, the receiver, the
# alerts its one notification carries). GPU 5's uncorrectable ECC errors raise GPUUncorrectableECC,
# Xid 94 and 63 and GPURowRemapPending; without the inhibitions they are a page and a ticket
# (BASELINE, measured beside them in the same run).
# Slurm job 817304 runs on every GPU of the faulty node that answered NVML (all but 6): its
# JobHitByNodeFault rides in the page of the GPU that hurts it.
INCIDENTS = [
    ("gpu", {"gpu": "5"}, "pager", {"GPUUncorrectableECC", "JobHitByNodeFault"}),
    ("gpu", {"gpu": "2"}, "pager", {"GPUXidCritical", "NVLinkDown", "JobHitByNodeFault"}),
    ("gpu", {"gpu": "6"}, "pager", {"GPUFellOffBus", "GPUXidCritical"}),
    ("gpu", {"gpu": "7"}, "pager", {"GPURowRemapFailed", "GPUXidCritical", "JobHitByNodeFault"}),
    ("gpu", {"gpu": "4"}, "pager", {"GPURecoveryActionRequired", "JobHitByNodeFault"}),
    ("fabric", {"subject": "mlx5_7"}, "ticket", {"NodeCheckFailing"}),
]


# Without the generated inhibitions (deploy/alertmanager/alertmanager.yml's inhibit_rules removed,
# routes and grouping by GPU kept), per incident and receiver: the alerts its notifications carried.
# GPU 5's Xid 94, Xid 63 and GPURowRemapPending open a ticket beside its page, and the drift of
# mlx5_7's firmware reaches the ticket queue as FirmwareDrift beside the node's own check.
# Measured: 1 page and 1 ticket for GPU 5, 1 ticket carrying both drift alerts (docs/deploy.md); a
# slow machine may split a ticket's alerts over two notifications, so only the page is counted.
BASELINE = [
    (
        "gpu",
        {"gpu": "5"},
        {
            "pager": {"GPUUncorrectableECC", "JobHitByNodeFault"},
            "ticket": {"GPUXidCritical", "GPURowRemapPending"},
        },
    ),
    ("fabric", {"subject": "mlx5_7"}, {"ticket": {"NodeCheckFailing", "FirmwareDrift"}}),
]


def bump(sysfs: Path, device: str, counter: str, value: int) -> None:
    """The hardware counts: a new value in the simulated sysfs counter file."""
    (sysfs / "class" / "infiniband" / device / "ports" / "1" / "counters" / counter).write_text(f"{value}\n")


def matches(alert: dict[str, Any], fleet: Fleet, node: str, name: str, labels: dict[str, str]) -> bool:
    got = alert["labels"]
    return (
        got["alertname"] == name
        and got.get("instance") == fleet.instance(node)
        and all(got.get(k) == v for k, v in labels.items())
    )


def test_the_faulty_nodes_page_and_ticket_and_the_healthy_node_stays_quiet(fleet: Fleet) -> None:
    fabric = fleet.instance("fabric")
    # Flaps and errors happen after Prometheus has seen the counters' earlier values.
    wait_until_series(
        fleet, f'clusterhealth_rdma_port_errors_total{{instance="{fabric}",counter="link_downed"}}'
    )
    settle(2)
    bump(fleet.sysfs["fabric"], "mlx5_5", "link_downed", 4)
    bump(fleet.sysfs["fabric"], "mlx5_0", "symbol_error", 5000)
    bump(fleet.sysfs["fabric"], "mlx5_1", "port_rcv_errors", 50)

    def missing() -> list[tuple[str, str, dict[str, str], str]]:
        delivered = fleet.webhook.alerts()
        return [
            e
            for e in EXPECTED
            if not any(
                matches(a, fleet, e[0], e[1], e[2])
                and a["labels"]["severity"] == e[3]
                and a["status"] == "firing"
                for a in delivered
            )
        ]

    wait_for(
        lambda: not missing(),
        90,
        "every expected alert at the webhook",
        lambda: (
            f"missing: {missing()}\nfiring in Prometheus: "
            + str(
                sorted(
                    {
                        (a["labels"]["alertname"], a["labels"].get("instance"))
                        for a in fleet.prometheus.alerts()
                    }
                )
            )
        ),
    )

    delivered = fleet.webhook.alerts()
    names_per_node = {node: {e[1] for e in EXPECTED if e[0] == node} for node in ("gpu", "fabric")}
    for alert in delivered:
        labels = alert["labels"]
        # Each alert reached the receiver its severity routes to, with the agent's job label.
        assert alert["receiver"] == RECEIVER[labels["severity"]], alert
        assert labels["job"] == "clusterhealth"
        node = next((n for n, i in fleet.instances.items() if i == labels.get("instance")), str(labels))
        assert node != "healthy", f"the healthy node alerted: {labels}"
        assert labels["alertname"] in names_per_node.get(node, set()), f"unexpected on {node}: {labels}"
        # The summary names the node, and the device where the alert has one.
        summary = alert["annotations"]["summary"]
        assert labels["instance"] in summary, summary
        for key in ("gpu", "device", "interface"):
            if key in labels:
                assert labels[key] in summary, summary
        assert alert["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{labels['alertname']}.md")

    # GPU 6 was lost before it ever answered its UUID; GPU 5 names its own.
    gpu_lost = next(a for a in delivered if matches(a, fleet, "gpu", "GPUFellOffBus", {"gpu": "6"}))
    assert "uuid" not in gpu_lost["labels"]
    assert gpu_lost["annotations"]["summary"].startswith(f"GPU 6 on {fleet.instance('gpu')} fell off the bus")
    ecc = next(a for a in delivered if matches(a, fleet, "gpu", "GPUUncorrectableECC", {"gpu": "5"}))
    assert ecc["labels"]["uuid"].startswith("GPU-")
    assert ecc["annotations"]["summary"].startswith(
        f"GPU 5 ({ecc['labels']['uuid']}) on {fleet.instance('gpu')}"
    )

    # The join: each answering GPU of the gpu node carries the job, as Prometheus stores it.
    gpu_node = fleet.instance("gpu")
    joined = fleet.prometheus.query(
        f'instance_gpu_workload:clusterhealth_gpu_sm_clock_hertz:join{{instance="{gpu_node}"}}'
    )
    assert sorted(
        (s["metric"]["gpu"], s["metric"]["exported_job"], s["metric"]["source"]) for s in joined
    ) == [(str(g), "817304", "cgroup") for g in (0, 1, 2, 3, 4, 5, 7)]
    assert "job" in joined[0]["metric"] and joined[0]["metric"]["job"] == "clusterhealth"

    healthy = fleet.instance("healthy")
    assert not [a for a in fleet.prometheus.alerts() if a["labels"].get("instance") == healthy]
    assert fleet.prometheus.query(f'ALERTS{{instance="{healthy}"}}') == []


def incident_notifications(
    fleet: Fleet, node: str, labels: dict[str, str], webhook: Webhook | None = None
) -> dict[str, list[set[str]]]:
    """Per receiver, the notifications that brought a new firing alert of the incident, each as
    the names of the incident's alerts it carried (and "other:<alert>" for an alert of another
    incident in the same notification). A notification that only repeats them (another alert of
    the group changed, or one resolved) is an update, not a page. `webhook`: the example's, or
    another Alertmanager's."""
    seen: dict[str, set[str]] = {}
    out: dict[str, list[set[str]]] = {}
    for _, payload in list((webhook or fleet.webhook).received):
        receiver = payload["receiver"]
        mine = [
            a
            for a in payload["alerts"]
            if a["labels"].get("instance") == fleet.instance(node)
            and all(a["labels"].get(k) == v for k, v in labels.items())
        ]
        firing = {a["fingerprint"] for a in mine if a["status"] == "firing"}
        if firing - seen.setdefault(receiver, set()):
            names = {a["labels"]["alertname"] for a in mine}
            if "gpu" in labels:  # a GPU's incident has a notification of its own
                names |= {"other:" + a["labels"]["alertname"] for a in payload["alerts"] if a not in mine}
            out.setdefault(receiver, []).append(names)
        seen[receiver] |= firing
    return out


def test_one_incident_pages_once_and_what_it_stands_for_is_inhibited(fleet: Fleet) -> None:
    def fired(node: str, name: str, labels: dict[str, str]) -> bool:
        where = ",".join(f'{k}="{v}"' for k, v in {**labels, "instance": fleet.instance(node)}.items())
        return bool(fleet.prometheus.query(f'ALERTS{{alertname="{name}",alertstate="firing",{where}}}[10m]'))

    def waiting() -> list[Any]:
        delivered = fleet.webhook.alerts()
        return [i for i in INHIBITED if not fired(*i[:3])] + [
            (node, name, labels)
            for node, labels, _, names in INCIDENTS
            for name in names
            if not any(matches(a, fleet, node, name, labels) for a in delivered)
        ]

    wait_for(lambda: not waiting(), 90, "the incidents' alerts", lambda: str(waiting()))
    # A ticket waits for the page that inhibits it: once that wait is over, nothing more comes.
    settle(float(TICKET_WAIT.rstrip("s")) + 2)
    delivered = fleet.webhook.alerts()
    for node, name, labels, _ in INHIBITED:
        assert not [a for a in delivered if matches(a, fleet, node, name, labels)], (name, labels)
    for node, labels, receiver, names in INCIDENTS:
        sent = incident_notifications(fleet, node, labels)
        assert sent == {receiver: [names]}, (node, labels, sent)
    # The baseline, measured: the same alerts through the example without its generated
    # inhibitions (a second Alertmanager beside it, same routes and grouping) reach people as
    # BASELINE says; the inhibitions are what takes the difference away.
    assert fleet.uninhibited is not None
    for node, labels, carried in BASELINE:
        bare = incident_notifications(fleet, node, labels, fleet.uninhibited)
        assert set(bare) == set(carried), (labels, bare)
        assert len(bare.get("pager", [set()])) == 1, (labels, bare)
        for receiver, names in carried.items():
            assert names <= set().union(*bare[receiver]), (labels, receiver, bare)


def test_every_name_is_emitted_by_the_agent_or_recorded(fleet: Fleet) -> None:
    exported: set[str] = set()
    for node in fleet.agents:
        fleet.agents[node].wait_for(
            lambda n=node: "clusterhealth_check_status" in fleet.exposition(n), 30, "the first audit"
        )
    # the probes' series appear after their first run, a pairwise meeting's after its round's slot
    fleet.agents["healthy"].wait_for(
        lambda: "clusterhealth_probe_wrong_values" in fleet.exposition("healthy"), 30, "a probe run"
    )
    meeting: list[str] = []

    def met() -> bool:
        meeting[:] = [fleet.exposition("healthy")]
        return "clusterhealth_probe_peer_success" in meeting[0]

    # A meeting's series show for the rest of its round only, and a loaded machine may sit a round
    # out (a slot that started too late, a partner's server not up in time): rounds, not seconds.
    fleet.agents["healthy"].wait_for(met, 8 * PAIRWISE_PERIOD, "a pairwise meeting")
    exported |= exported_names(meeting[0])
    for node in fleet.agents:
        exported |= exported_names(fleet.exposition(node))
    # A rule may also read an opt-in family where it is exported (NCCLTransportFallback reads the
    # per-link NVLink flags beside the default per-GPU rate); promtool's cases cover those.
    opt_in = set(GpuCollector.opt_in) | set(RdmaCollector.opt_in)
    known = exported | recorded_names()
    for where, names in used_names().items():
        assert names, where
        # The remediator's own series: tests/test_remediate_fleet.py checks them against its /metrics.
        names = {n for n in names if not n.startswith(REMEDIATION)}
        allowed = known | opt_in if where == "rules" else known
        assert names <= allowed, f"{where} uses names nobody emits: {sorted(names - allowed)}"


def test_every_panel_query_runs_and_returns_data_on_a_real_prometheus(fleet: Fleet) -> None:
    nodes = {
        "clusterhealth-fleet.json": ".*",
        "clusterhealth-fabric.json": ".*",
        # the node with GPU faults; its sysfs is the healthy tree with every RDMA series
        "clusterhealth-node.json": fleet.instance("gpu").replace(".", "\\\\."),
        "clusterhealth-jobs.json": ".*",
    }
    pending = [
        (name, title, concrete(expr, nodes[name]))
        for name in build.DASHBOARDS
        for title, expr in queries(load(name))
    ]
    assert len(pending) > 50

    def answered() -> bool:
        for item in list(pending):
            if fleet.prometheus.query(item[2]):  # an error raises: a query must never fail
                pending.remove(item)
        return not pending

    wait_for(answered, 90, "every panel query to return data", lambda: "\n".join(map(str, pending)))
