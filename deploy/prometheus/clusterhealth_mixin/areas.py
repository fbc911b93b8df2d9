"""The rule file's groups, area by area, in the order they are written."""

from __future__ import annotations

from . import agent, fleet, gpu, jobs, rdma, recording
from .config import Config
from .lib import Alert, Group


def groups(c: Config) -> list[Group]:
    return [
        recording.group(c),
        gpu.group(c),
        rdma.group(c),
        fleet.group(c),
        agent.group(c),
        *jobs.groups(c),
    ]


def alerts(config: Config) -> list[Alert]:
    return [rule for group in groups(config) for rule in group.rules if isinstance(rule, Alert)]
