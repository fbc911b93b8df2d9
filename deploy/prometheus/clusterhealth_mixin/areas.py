"""The rule file's groups, area by area, in the order they are written, and the areas' promtool
cases in the same order."""

from __future__ import annotations

from . import (
    agent,
    agent_cases,
    fleet,
    fleet_cases,
    gpu,
    gpu_cases,
    jobs,
    jobs_cases,
    rdma,
    rdma_cases,
    recording,
    recording_cases,
    remediation,
    remediation_cases,
)
from .cases import Case
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
        remediation.group(c),
    ]


def alerts(config: Config) -> list[Alert]:
    return [rule for group in groups(config) for rule in group.rules if isinstance(rule, Alert)]


def cases() -> list[Case]:
    return [
        *recording_cases.CASES,
        *gpu_cases.CASES,
        *rdma_cases.CASES,
        *fleet_cases.CASES,
        *agent_cases.CASES,
        *jobs_cases.CASES,
        *remediation_cases.CASES,
    ]
