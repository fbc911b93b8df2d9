"""The settings of a pairwise group (`pairwise_groups:`, each a `PairwiseGroupConfig`), declared
with `setting()` (checks/schema.py) as every settings file is (docs/fabric.md says how a group
runs). Its `members_file` is read by the agent's loader with the rest of the file (agent/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterhealth.checks import probe_parsers
from clusterhealth.checks.fabric.members import MembershipError, check_members
from clusterhealth.checks.fabric.schedule import RoundTiming
from clusterhealth.checks.fabric.topology import PLACE_KEYS, Placement, check_place_name
from clusterhealth.checks.probes.settings import (
    check_argv,
    check_expect,
    check_name,
    degraded_fraction_setting,
)
from clusterhealth.checks.schema import setting

GROUP_PLACEHOLDERS = ("peer", "peer_node", "address", "node", "port")
PAIRWISE_KINDS = tuple(name for name, kind in probe_parsers.REGISTRY.items() if kind.pairwise)


_check_group_argv = check_argv(GROUP_PLACEHOLDERS, "[iperf3, -s, -1, -p, '{port}', -J]")


def _check_inline_members(value: dict[str, str]) -> str | None:
    try:
        check_members(value)
    except MembershipError as err:
        return f"a mapping of node name to probe address ({err})"
    return None


def _check_placement(value: dict[str, dict[str, str]]) -> str | None:
    for node, place in value.items():
        unknown = sorted(set(place) - set(PLACE_KEYS))
        if unknown:
            return f"a mapping of node name to {{{', '.join(PLACE_KEYS)}}} ({node} has {', '.join(unknown)})"
        for key, name in place.items():
            if (problem := check_place_name(name)) is not None:
                return f"a mapping of node name to its place, each {problem} ({node}'s {key} is {name!r})"
    return None


@dataclass(frozen=True)
class PairwiseGroupConfig:
    name: str = setting(
        "",
        doc="the group's name: the probe label of its results, and the seed of its pairings",
        check=check_name,
    )
    kind: str = setting(
        "iperf3",
        doc="how its output is read (kinds that run as a server and a client)",
        choices=PAIRWISE_KINDS,
    )
    enabled: bool = setting(True, doc="take part in this group's rounds")
    members: dict[str, str] = setting(
        default_factory=dict,
        doc="node name -> the address its probe server listens on (or members_file)",
        check=_check_inline_members,
    )
    members_file: str | None = setting(
        None,
        doc="a YAML file of 'node name: address' lines, or 'node name: {address, leaf, spine, pod, "
        "rail}', read at start and on SIGHUP (instead of members and placement)",
    )
    placement: dict[str, dict[str, str]] = setting(
        default_factory=dict,
        doc="with members: node name -> where it sits in the fabric, {leaf, spine, pod, rail} "
        "(docs/fabric.md); the schedule pairs inside and across leaves when every member has a leaf",
        check=_check_placement,
    )
    period_seconds: float = setting(
        900.0, doc="a round's length: each node meets one partner per round", min=10, max=86400
    )
    port: int = setting(
        5201, doc="the port the server end listens on for the regular meeting", min=1, max=65535
    )
    confirm_port: int = setting(
        5202,
        doc="the port of the confirming meeting (mid-round), apart from the regular one",
        min=1,
        max=65535,
    )
    server_argv: tuple[str, ...] = setting(
        (),
        doc="the server end's command, serving one test and exiting; {port}, {address} (this node's), "
        "{node}, {peer} (the partner's address) and {peer_node} are filled in",
        check=_check_group_argv,
    )
    client_argv: tuple[str, ...] = setting(
        (),
        doc="the client end's command, run against the partner's server; same placeholders",
        check=_check_group_argv,
    )
    timeout_seconds: float = setting(
        30.0, doc="the longest one run may take (the tool's duration and its set-up)", min=1, max=3600
    )
    confirm_runs: int = setting(3, doc="runs of a confirming meeting (its best one counts)", min=1, max=10)
    skew_seconds: float = setting(
        5.0, doc="clock difference between any two members that rounds tolerate", min=0, max=300
    )
    startup_seconds: float = setting(
        2.0, doc="time for the idle guard, the lock and the server process to start", min=0.1, max=60
    )
    expect: str = setting(
        "learn",
        doc="expected bandwidth ('400 Gb/s'), or learn: the median of this node's last good meetings "
        "with any partner of the group",
        check=check_expect,
    )
    degraded_fraction: float | None = degraded_fraction_setting()
    env: dict[str, str] = setting(default_factory=dict, doc="environment variables added for both ends")

    def places(self) -> dict[str, Placement]:
        """Each placed member's place (those without one are left out)."""
        return {node: Placement(**place) for node, place in self.placement.items() if place}

    def timing(self) -> RoundTiming:
        return RoundTiming(
            self.period_seconds,
            self.timeout_seconds,
            skew=self.skew_seconds,
            startup=self.startup_seconds,
            confirm_runs=self.confirm_runs,
        )


def check_groups(groups: tuple[PairwiseGroupConfig, ...]) -> str | None:
    names = [g.name for g in groups]
    for i, group in enumerate(groups):
        where = f"pairwise_groups[{i}]" + (f", {group.name}," if group.name else "")
        if not group.name:
            return f"a name for every group ({where} has none)"
        if not group.server_argv or not group.client_argv:
            return f"a server_argv and a client_argv for every group ({where} lacks one)"
        if group.port == group.confirm_port:
            return f"port and confirm_port to differ ({where} has {group.port} for both)"
        if group.members and group.members_file is not None:
            return f"members or members_file, not both ({where} has both)"
        if group.placement and group.members_file is not None:
            return f"placement in the members file's entries, not beside members_file ({where} has both)"
        strays = sorted(set(group.placement) - set(group.members))
        if group.members and strays:
            return f"placement for members only ({where} places {', '.join(strays)}, not a member)"
        if (problem := group.timing().problem()) is not None:
            return f"{problem} ({where} has period_seconds {group.period_seconds:g})"
        if group.name in names[:i]:
            # Two groups of one name would export one probe label and share one state file.
            first = names.index(group.name)
            return f"group names to be unique (pairwise_groups[{first}] and [{i}] are both {group.name})"
    return None
