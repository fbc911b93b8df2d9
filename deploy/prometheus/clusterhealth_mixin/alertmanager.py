"""The Alertmanager example's inhibitions, from the alerts' own labels (what each is `about`):
the block between the markers in deploy/alertmanager/alertmanager.yml."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

from .areas import alerts
from .config import Config
from .lib import SUBJECTS, Alert, alternation, splice

INHIBIT_BEGIN = "# BEGIN GENERATED INHIBIT RULES: deploy/prometheus/mixin.py (`make generate`)\n"
INHIBIT_END = "# END GENERATED INHIBIT RULES\n"
AGENT_DOWN = "ClusterHealthAgentDown"
CHECK_FAILING = "NodeCheckFailing"
NOUNS = {
    "gpu": "a GPU",
    "rdma_port": "an RDMA port",
    "pci_function": "a PCI function",
    "check": "a node's check",
    "job": "a job on a node",
    "remediator": "the remediator",
}
# An audit check and the firmware component whose version it checks (checks/audits/firmware.py):
# NodeCheckFailing of the check and FirmwareDrift of the component are the same finding.
FIRMWARE_CHECKS = (("hca_firmware", "hca"), ("gpu_vbios", "gpu_vbios"), ("gpu_driver", "gpu_driver"))


def _names(alerts: Iterable[Alert]) -> str:
    return alternation(sorted({a.name for a in alerts}))


def inhibit_rules(config: Config) -> list[tuple[str, dict[str, Any]]]:
    """(why, inhibit rule) for the Alertmanager example, from each alert's `about` labels:

    - while a node's agent is down, its alerts (every alert with an `instance`) wait for it;
    - a page about a thing (a GPU, an RDMA port, ...) makes the tickets about the same thing
      redundant: one incident pages once;
    - a node's firmware check, failing, makes the fleet's FirmwareDrift for the same device
      redundant (the check fires first: `for_sustained` is shorter than `for_drift`)."""
    every = alerts(config)
    # The remediator's instance is its own process, not a node's agent.
    on_nodes = [
        a
        for a in every
        if "instance" in SUBJECTS[a.about] and a.name != AGENT_DOWN and a.about != "remediator"
    ]
    rules: list[tuple[str, dict[str, Any]]] = [
        (
            "While a node's agent cannot be scraped, its alerts describe a state nobody can see: the "
            "agent-down alert stands for them until the agent is back.",
            {
                "source_matchers": [f'alertname="{AGENT_DOWN}"'],
                "target_matchers": [f'alertname=~"{_names(on_nodes)}"'],
                "equal": ["instance"],
            },
        )
    ]
    for about, labels in SUBJECTS.items():
        noun = NOUNS.get(about, about)
        pages = [a for a in every if a.about == about and a.severity == "critical"]
        tickets = [a for a in every if a.about == about and a.severity == "warning"]
        if not (pages and tickets and labels):
            continue
        rules.append(
            (
                f"A page about {noun} stands for the tickets about the same one: one incident, one page.",
                {
                    "source_matchers": ['severity="critical"', f'alertname=~"{_names(pages)}"'],
                    "target_matchers": ['severity="warning"', f'alertname=~"{_names(tickets)}"'],
                    "equal": list(labels),
                },
            )
        )
    drift = _names(a for a in every if a.about == "firmware")
    shared = [label for label in SUBJECTS["check"] if label in SUBJECTS["firmware"]]
    for check, component in FIRMWARE_CHECKS:
        if check not in config.uncovered_checks or not drift:
            continue
        rules.append(
            (
                f"Check {check} failing and the fleet's drift of {component} firmware on the same "
                "device are one finding.",
                {
                    "source_matchers": [f'alertname="{CHECK_FAILING}"', f'check="{check}"'],
                    "target_matchers": [f'alertname=~"{drift}"', f'component="{component}"'],
                    "equal": shared,
                },
            )
        )
    return rules


def inhibitions_yaml(config: Config) -> str:
    """The `inhibit_rules` block of the Alertmanager example, each rule after a comment saying why."""

    def quoted(items: list[str]) -> str:
        return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"

    lines = ["inhibit_rules:"]
    for why, rule in inhibit_rules(config):
        lines += ["  # " + line for line in textwrap.wrap(why, 96, break_on_hyphens=False)]
        lines += [
            f"  - source_matchers: {quoted(rule['source_matchers'])}",
            f"    target_matchers: {quoted(rule['target_matchers'])}",
            f"    equal: [{', '.join(rule['equal'])}]",
        ]
    return "\n".join(lines) + "\n"


def with_inhibitions(text: str, config: Config) -> str:
    """The Alertmanager example with its generated block refreshed."""
    return splice(text, INHIBIT_BEGIN, INHIBIT_END, inhibitions_yaml(config))
