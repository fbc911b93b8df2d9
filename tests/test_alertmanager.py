"""The Alertmanager example: amtool accepts it, routes each severity to its receiver, and a real
Alertmanager running it delivers to the right webhook and inhibits a node's device alerts while
its agent is down."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .mixin import ROOT, mixin
from .prom import Alertmanager, Webhook, binary, wait_for

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


def test_the_agent_down_inhibition_covers_exactly_the_device_alerts() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    rule = next(
        r for r in config["inhibit_rules"] if r["source_matchers"] == ['alertname="ClusterHealthAgentDown"']
    )
    (matcher,) = rule["target_matchers"]
    pattern = re.fullmatch(r'alertname=~"(.*)"', matcher)
    assert pattern is not None
    names = {a.name for a in mixin.alerts(mixin.Config())}
    device = {a.name for a in mixin.alerts(mixin.Config()) if a.device}
    assert {n for n in names if re.fullmatch(pattern.group(1), n)} == device
    assert rule["equal"] == ["instance"]


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
        config = yaml.safe_load(CONFIG.read_text())
        for receiver in config["receivers"]:
            for webhook in receiver.get("webhook_configs", []):
                webhook["url"] = hook.url("/" + receiver["name"])
        config["route"].update(group_wait="1s", group_interval="1s")
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
            # Grouped by node: one notification carries one node's alerts.
            for _, payload in hook.received:
                assert set(payload["groupLabels"]) == {"instance"}
                assert len({a["labels"]["instance"] for a in payload["alerts"]}) == 1
