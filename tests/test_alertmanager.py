"""The Alertmanager example: its inhibitions are the generator's, amtool accepts it and routes each
severity to its receiver, and a real Alertmanager running it delivers to the right webhook, one
notification per incident: a GPU's page carries the GPU's other pages and stands for its tickets,
a node's failing firmware check for the fleet's drift of the same device, and an agent that is
down for its node's alerts."""

from __future__ import annotations

import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from .mixin import ROOT, mixin
from .prom import Alertmanager, Webhook, binary, hurried, wait_for

CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"

# (labels of an alert, the receiver it must reach)
ROUTES = [
    ({"alertname": "GPUFellOffBus", "severity": "critical", "instance": "n1:9845"}, "pager"),
    (
        {"alertname": "RDMAPortErrors", "severity": "critical", "instance": "n1:9845", "device": "mlx5_0"},
        "pager",
    ),
    (
        {"alertname": "RDMAPortErrors", "severity": "warning", "instance": "n1:9845", "device": "mlx5_0"},
        "ticket",
    ),
    ({"alertname": "FirmwareDrift", "severity": "warning", "instance": "n2:9845"}, "ticket"),
    ({"alertname": "ClusterHealthAgentDown", "severity": "warning", "instance": "n3:9845"}, "ticket"),
    ({"alertname": "ClusterHealthAgentDown", "severity": "critical", "job": "clusterhealth"}, "pager"),
    ({"alertname": "SomebodyElsesAlert"}, "ticket"),
    ({"alertname": "Watchdog", "severity": "info"}, "blackhole"),
]


def amtool() -> str:
    return binary("amtool", "prometheus-alertmanager")


def test_amtool_check_config() -> None:
    result = subprocess.run([amtool(), "check-config", str(CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize(("labels", "receiver"), ROUTES, ids=[f"{r}-{i}" for i, (_, r) in enumerate(ROUTES)])
def test_amtool_routes(labels: dict[str, str], receiver: str) -> None:
    result = subprocess.run(
        [
            amtool(),
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            f"--verify.receivers={receiver}",
            *(f"{k}={v}" for k, v in labels.items()),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_route_test_can_fail() -> None:
    """The route table above means something: a wrong receiver is refused."""
    result = subprocess.run(
        [
            amtool(),
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            "--verify.receivers=pager",
            "severity=warning",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0


def test_the_inhibitions_regenerate_byte_for_byte() -> None:
    text = CONFIG.read_text()
    assert text == mixin.with_inhibitions(text, mixin.Config()), "run `make generate` and commit the result"


def test_the_agent_down_inhibition_covers_every_alert_of_a_node() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    rule = next(
        r for r in config["inhibit_rules"] if r["source_matchers"] == ['alertname="ClusterHealthAgentDown"']
    )
    (matcher,) = rule["target_matchers"]
    pattern = re.fullmatch(r'alertname=~"(.*)"', matcher)
    assert pattern is not None
    every = mixin.alerts(mixin.Config())
    # The remediator's alerts name its own process, not a node's agent.
    on_nodes = {
        a.name for a in every if "instance" in mixin.SUBJECTS[a.about] and a.about != "remediator"
    } - {"ClusterHealthAgentDown"}
    assert {a.name for a in every if re.fullmatch(pattern.group(1), a.name)} == on_nodes
    assert rule["equal"] == ["instance"]


def test_a_page_inhibits_the_tickets_of_its_own_gpu_and_port() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    by_equal = {tuple(r["equal"]): r for r in config["inhibit_rules"]}
    gpu = by_equal[("instance", "gpu")]
    assert gpu["source_matchers"][0] == 'severity="critical"'
    assert gpu["target_matchers"][0] == 'severity="warning"'
    for name in ("GPUUncorrectableECC", "GPUXidCritical", "NVLinkDown", "GPUFellOffBus"):
        assert re.search(rf"[~|\"]{name}[|\"]", gpu["source_matchers"][1]), name
    for name in ("GPUXidCritical", "GPURowRemapPending", "GPUThermalOrPowerSlowdown"):
        assert re.search(rf"[~|\"]{name}[|\"]", gpu["target_matchers"][1]), name
    assert ("instance", "device", "port") in by_equal


def test_a_ticket_waits_longer_than_a_page() -> None:
    """A ticket is sent after the page that makes it redundant had time to arrive and inhibit it."""
    route = yaml.safe_load(CONFIG.read_text())["route"]
    ticket = next(r for r in route["routes"] if r["receiver"] == "ticket")
    seconds = {"s": 1, "m": 60, "h": 3600}

    def parse(text: str) -> int:
        return int(text[:-1]) * seconds[text[-1]]

    assert parse(ticket["group_wait"]) >= 4 * parse(route["group_wait"])
    assert route["group_by"] == ["instance", "gpu"]


def alert(name: str, severity: str, instance: str, **labels: str) -> dict[str, Any]:
    return {
        "labels": {
            "alertname": name,
            "severity": severity,
            "instance": instance,
            "job": "clusterhealth",
            **labels,
        },
        "annotations": {"summary": f"{name} on {instance}"},
    }


def test_a_real_alertmanager_routes_by_severity_and_inhibits_while_the_agent_is_down(tmp_path: Path) -> None:
    with Webhook() as hook:
        config = hurried(yaml.safe_load(CONFIG.read_text()), "1s", "3s")
        for receiver in config["receivers"]:
            for webhook in receiver.get("webhook_configs", []):
                webhook["url"] = hook.url("/" + receiver["name"])
        with Alertmanager(tmp_path / "am", config) as am:
            am.post(
                [
                    alert("ClusterHealthAgentDown", "warning", "n1:9845"),
                    alert("GPUFellOffBus", "critical", "n1:9845", gpu="6"),
                    alert("RDMAPortDown", "critical", "n1:9845", device="mlx5_3", port="1"),
                    alert("GPUFellOffBus", "critical", "n2:9845", gpu="6"),
                    alert(
                        "RDMAPortErrors",
                        "critical",
                        "n2:9845",
                        device="mlx5_0",
                        port="1",
                        counter="symbol_error",
                    ),
                    alert(
                        "RDMAPortErrors",
                        "warning",
                        "n2:9845",
                        device="mlx5_0",
                        port="1",
                        counter="symbol_error",
                    ),
                    alert(
                        "RDMAPortErrors",
                        "warning",
                        "n2:9845",
                        device="mlx5_1",
                        port="1",
                        counter="symbol_error",
                    ),
                ]
            )

            def delivered() -> set[tuple[str, str, str, str]]:
                return {
                    (
                        a["receiver"],
                        a["labels"]["alertname"],
                        a["labels"]["instance"],
                        a["labels"].get("device", ""),
                    )
                    for a in hook.alerts()
                }

            expected = {
                ("ticket", "ClusterHealthAgentDown", "n1:9845", ""),
                ("pager", "GPUFellOffBus", "n2:9845", ""),
                ("pager", "RDMAPortErrors", "n2:9845", "mlx5_0"),
                ("ticket", "RDMAPortErrors", "n2:9845", "mlx5_1"),
            }
            wait_for(
                lambda: delivered() >= expected, 20, "the deliveries", lambda: str(delivered()) + am.log()
            )
            inhibited = {
                (a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("device", ""))
                for a in am.alerts()
                if a["status"]["inhibitedBy"]
            }
            assert inhibited == {
                ("GPUFellOffBus", "n1:9845", ""),
                ("RDMAPortDown", "n1:9845", "mlx5_3"),
                ("RDMAPortErrors", "n2:9845", "mlx5_0"),
            }
            assert delivered() == expected
            # Grouped by GPU, and the rest by node: one notification carries one node's alerts.
            for _, payload in hook.received:
                assert set(payload["groupLabels"]) <= {"instance", "gpu"}
                assert len({a["labels"]["instance"] for a in payload["alerts"]}) == 1


# One incident on a GPU raises several alerts; one on another GPU of the node and a firmware drift
# come with it. (alert, what it is, the receiver it must reach or None when inhibited)
INCIDENTS = [
    # GPU 5: uncorrectable ECC errors, reported by a contained Xid 94; the remap waits (Xid 63).
    (alert("GPUUncorrectableECC", "critical", "n1:9845", gpu="5", error="uncorrected"), "pager"),
    (alert("GPUXidCritical", "warning", "n1:9845", gpu="5", xid="94"), None),
    (alert("GPUXidCritical", "warning", "n1:9845", gpu="5", xid="63"), None),
    (alert("GPURowRemapPending", "warning", "n1:9845", gpu="5"), None),
    # GPU 2: an NVLink down after Xid 74, two pages of one incident.
    (alert("GPUXidCritical", "critical", "n1:9845", gpu="2", xid="74"), "pager"),
    (alert("NVLinkDown", "critical", "n1:9845", gpu="2", link="5"), "pager"),
    # GPU 3 runs hot: its own ticket, whatever happens to GPU 5.
    (alert("GPUThermalOrPowerSlowdown", "warning", "n1:9845", gpu="3", reason="hw_slowdown"), "ticket"),
    # mlx5_7 runs old firmware: the node's check and the fleet's drift say it once.
    (alert("NodeCheckFailing", "warning", "n2:9845", check="hca_firmware", subject="mlx5_7"), "ticket"),
    (alert("FirmwareDrift", "warning", "n2:9845", component="hca", subject="mlx5_7", version="1"), None),
    # mlx5_6's drift the node's check cannot see (the node's HCAs agree): a ticket.
    (alert("FirmwareDrift", "warning", "n2:9845", component="hca", subject="mlx5_6", version="1"), "ticket"),
    # A CRITICAL check pages; another check of the node is its own ticket.
    (alert("NodeCheckFailing", "critical", "n3:9845", check="gpu_count", subject="node"), "pager"),
    (alert("NodeCheckFailing", "warning", "n3:9845", check="hca_count", subject="node"), "ticket"),
]


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_one_incident_pages_once_with_its_alerts_and_stands_for_its_tickets(tmp_path: Path) -> None:
    with Webhook() as hook:
        config = hurried(yaml.safe_load(CONFIG.read_text()), "1s", "3s")
        for receiver in config["receivers"]:
            for webhook in receiver.get("webhook_configs", []):
                webhook["url"] = hook.url("/" + receiver["name"])
        with Alertmanager(tmp_path / "am", config) as am:
            am.post([a for a, _ in INCIDENTS])
            expected = {_key(a["labels"]): receiver for a, receiver in INCIDENTS if receiver}

            def delivered() -> dict[tuple[tuple[str, str], ...], str]:
                return {_key(a["labels"]): a["receiver"] for a in hook.alerts()}

            wait_for(lambda: len(delivered()) >= len(expected), 20, "the deliveries", am.log)
            # The tickets' wait, and a little more: nothing else arrives.
            time.sleep(4)
            assert delivered() == expected
            inhibited = {_key(a["labels"]) for a in am.alerts() if a["status"]["inhibitedBy"]}
            assert inhibited == {_key(a["labels"]) for a, receiver in INCIDENTS if receiver is None}
            # One notification per incident: GPU 2's two pages arrive together, GPU 5 pages once.
            notifications: dict[tuple[str, str], list[set[str]]] = defaultdict(list)
            for _, payload in hook.received:
                group = (payload["receiver"], str(sorted(payload["groupLabels"].items())))
                notifications[group].append({a["labels"]["alertname"] for a in payload["alerts"]})
            gpu = "[('gpu', '{}'), ('instance', 'n1:9845')]"
            assert notifications[("pager", gpu.format(5))] == [{"GPUUncorrectableECC"}]
            assert notifications[("pager", gpu.format(2))] == [{"GPUXidCritical", "NVLinkDown"}]
            assert notifications[("ticket", gpu.format(3))] == [{"GPUThermalOrPowerSlowdown"}]
            assert ("ticket", gpu.format(5)) not in notifications
            assert all(len(sent) == 1 for sent in notifications.values()), dict(notifications)
