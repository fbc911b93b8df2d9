"""The settings of the scheduled probes (`probes:`, each a `ProbeConfig`) and those all probes share
(`probing:`), declared with `setting()` (checks/schema.py) as every settings file is; the agent's
loader (agent/settings.py) validates them and its reference generator documents them
(docs/configuration.md). The pairwise groups' settings are in checks/fabric/settings.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterhealth.checks import probe_parsers
from clusterhealth.checks.schema import setting

_BANDWIDTH = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([GMT](?:B/s|b/s|bit/s))\s*")
_BANDWIDTH_FACTORS = {
    "TB/s": 1e12,
    "GB/s": 1e9,
    "MB/s": 1e6,
    "Tb/s": 1e12 / 8,
    "Gb/s": 1e9 / 8,
    "Mb/s": 1e6 / 8,
    "Tbit/s": 1e12 / 8,
    "Gbit/s": 1e9 / 8,
    "Mbit/s": 1e6 / 8,
}
PLACEHOLDERS = ("peer", "node", "gpus")


def parse_bandwidth(text: str) -> float | None:
    """`460 GB/s` (bytes, as nccl-tests prints) or `400 Gb/s` / `400Gbit/s` (bits) -> bytes per second."""
    m = _BANDWIDTH.fullmatch(text)
    if not m:
        return None
    value = float(m.group(1)) * _BANDWIDTH_FACTORS[m.group(2)]
    return value if math.isfinite(value) else None  # 400 digits read as a float are inf


def check_expect(value: str) -> str | None:
    if value == "learn" or parse_bandwidth(value):
        return None
    return "learn, or a bandwidth such as '460 GB/s' (bytes, as nccl-tests prints) or '400 Gb/s' (bits)"


def check_name(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value) else "a name of letters, digits, _ . -"


def check_argv(placeholders: tuple[str, ...], example: str) -> Callable[[tuple[str, ...]], str | None]:
    """`check=` for a command whose arguments may hold these {placeholders}; `example` shows one."""

    def check(value: tuple[str, ...]) -> str | None:
        if not value:
            return f"the command and its arguments, e.g. {example}"
        for argument in value:
            for name in re.findall(r"(?<!\{)\{([^{}]*)\}", argument):
                if name not in placeholders:
                    return f"placeholders among {{{'}, {'.join(placeholders)}}} (found {{{name}}})"
        return None

    return check


def degraded_fraction_setting() -> Any:
    """The `degraded_fraction` of a probe or of a pairwise group: its own threshold, if it has one."""
    return setting(
        None,
        doc="degraded below this fraction of expected (default probing.degraded_fraction)",
        min=0.01,
        max=1,
    )


def _check_cron(value: str | None) -> str | None:
    if value is None:
        return None
    # APScheduler only where a probe has a cron schedule (it is ~4 MB of modules).
    from apscheduler.triggers.cron import CronTrigger

    try:
        if len(value.split()) != 5:
            raise ValueError("not five fields")
        CronTrigger.from_crontab(value)
    except ValueError as err:
        return f"a crontab expression of five fields, e.g. '0 */6 * * *' ({err})"
    return None


@dataclass(frozen=True)
class ProbeConfig:
    name: str = setting("", doc="the probe's name: the probe label of its metrics", check=check_name)
    kind: str = setting("nccl-tests", doc="how its output is read", choices=probe_parsers.KINDS)
    argv: tuple[str, ...] = setting(
        (),
        doc="the command, run without a shell; {peer}, {node} and {gpus} are filled in",
        check=check_argv(PLACEHOLDERS, "[iperf3, -c, '{peer}', -J]"),
    )
    peers: tuple[str, ...] = setting((), doc="run once per peer ({peer}); empty: one node-local run")
    enabled: bool = setting(True, doc="schedule this probe")
    interval_seconds: float = setting(
        3600.0, doc="run every this many seconds (unless cron is set)", min=1, max=31 * 86400
    )
    cron: str | None = setting(
        None, doc="or run on this crontab schedule, e.g. '0 */6 * * *'", check=_check_cron
    )
    jitter_seconds: float = setting(
        60.0,
        doc="random delay added to each run, so that nodes do not probe the fabric at once",
        min=0,
        max=86400,
    )
    timeout_seconds: float = setting(
        600.0, doc="the probe's process group is killed after this long", min=1, max=86400
    )
    env: dict[str, str] = setting(
        default_factory=dict, doc="environment variables added for the run (NCCL_*, ...)"
    )
    expect: str = setting(
        "learn",
        doc="expected bandwidth ('460 GB/s', '400 Gb/s'), or learn: the median of the last good runs",
        check=check_expect,
    )
    degraded_fraction: float | None = degraded_fraction_setting()


@dataclass(frozen=True)
class ProbingConfig:
    state_dir: str = setting(
        "/var/lib/clusterhealth", doc="where learned baselines and the probe lock file are kept"
    )
    degraded_fraction: float = setting(
        0.8, doc="a run below this fraction of the expected bandwidth is degraded", min=0.01, max=1
    )
    baseline_window: int = setting(
        10, doc="a learned baseline is the median of this many last good runs", min=1, max=1000
    )
    baseline_min_runs: int = setting(
        3, doc="good runs needed before a learned baseline is used", min=1, max=1000
    )
    check_gpus_idle: bool = setting(True, doc="skip a run while any GPU has compute processes (NVML)")
    busy_command: tuple[str, ...] = setting(
        (), doc="a command that exits 0 while the node is busy (e.g. a Slurm allocation), 1 when idle"
    )
    busy_command_timeout_seconds: float = setting(10.0, doc="time limit of busy_command", min=0.1, max=600)
    max_output_bytes: int = setting(
        1 << 20, doc="output kept per stream (its head and tail)", min=4096, max=1 << 30
    )


def check_probes(probes: tuple[ProbeConfig, ...]) -> str | None:
    names = [p.name for p in probes]
    for i, probe in enumerate(probes):
        if not probe.name:
            return f"a name for every probe (probes[{i}] has none)"
        if not probe.argv:
            return f"an argv for every probe (probes[{i}], {probe.name}, has none)"
    if len(set(names)) != len(names):
        return "probe names to be unique"
    return None
