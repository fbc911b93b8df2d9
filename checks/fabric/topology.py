"""Where a node sits in the fabric: its leaf switch, and the spine group, pod and rail around it.

A group's members file says it, as an inventory exports it (checks/fabric/members.py); the agents
export it (``clusterhealth_probe_placement_info{probe, leaf, spine, pod, rail}``) and `analyze`
reads it back (fleet/pairwise.py), with each node's NVLink domain where NVML names one (the
chassis serial number of ``clusterhealth_gpu_info``). The schedule pairs by leaf
(schedule.py), the analysis names a leaf or its uplink (analysis.py), and the dashboards and the
report order nodes by place (``ordered``).

Unknown placement is allowed: a node without a leaf is scheduled and judged as before, and a
group in which any member lacks one is scheduled as a flat group.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The keys of a member's place in a members file, and the labels of the series that exports it.
PLACE_KEYS = ("leaf", "spine", "pod", "rail")

_PLACE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")


@dataclass(frozen=True)
class Placement:
    """One node's place; None where nothing says it."""

    leaf: str | None = None  # the leaf (top-of-rack) switch its port of this network hangs off
    spine: str | None = None  # the spine group (plane) its leaf hangs off
    pod: str | None = None  # the pod or scalable unit
    rail: str | None = None  # the rail, in a rail-optimised fabric (a group usually tests one)
    nvlink_domain: str | None = None  # NVML: the chassis its GPUs share an NVLink fabric with

    @property
    def known(self) -> bool:
        return any(getattr(self, key) for key in (*PLACE_KEYS, "nvlink_domain"))

    def labels(self) -> dict[str, str]:
        """The members file's keys as series labels, empty where unknown."""
        return {key: getattr(self, key) or "" for key in PLACE_KEYS}


def placement(labels: Mapping[str, str]) -> Placement:
    """A place from labels named as the members file's keys (``clusterhealth_probe_placement_info``'s),
    empty ones unknown; ``nvlink_domain`` too, when given."""
    return Placement(**{key: labels.get(key) or None for key in (*PLACE_KEYS, "nvlink_domain")})


def check_place_name(value: object) -> str | None:
    """None when ``value`` can name a leaf, a spine group, a pod or a rail; else what was expected."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not _PLACE_NAME.fullmatch(str(value)):
        return "a name of letters, digits, _ . : / - (at most 128), or a number"
    return None


def leaf_of(placement: Mapping[str, Placement] | None, node: str) -> str | None:
    """The leaf of ``node``; None when it is not known."""
    if placement is None:
        return None
    place = placement.get(node)
    return place.leaf if place is not None else None


def leaves(
    placement: Mapping[str, Placement] | None, nodes: Iterable[str] | None = None
) -> dict[str, list[str]]:
    """Each leaf's members (of ``nodes`` when given), leaves and members in natural order."""
    found: dict[str, list[str]] = {}
    for node in (placement or {}) if nodes is None else nodes:
        leaf = leaf_of(placement, node)
        if leaf is not None:
            found.setdefault(leaf, []).append(node)
    return {leaf: sorted(found[leaf], key=natural) for leaf in sorted(found, key=natural)}


def outermost_first(placement: Mapping[str, Placement]) -> dict[str, tuple[str, ...]]:
    """Each placed node's places from the outermost in: (pod, spine, leaf) as far as known, or its
    NVLink domain alone where no leaf is known; as the report groups and orders nodes."""
    found: dict[str, tuple[str, ...]] = {}
    for node, place in placement.items():
        parts = tuple(p for p in (place.pod, place.spine, place.leaf) if p) if place.leaf else ()
        if not parts and place.nvlink_domain:
            parts = (place.nvlink_domain,)
        if parts:
            found[node] = parts
    return found


def natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts h2 before h10 and leaf-9 before leaf-10."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def ordered(nodes: Iterable[str], placement: Mapping[str, Placement] | None = None) -> list[str]:
    """``nodes`` in fabric order: by pod, spine group, leaf, NVLink domain, then name; nodes of
    unknown place after the placed ones, by name. A leaf's members end up side by side, so that a
    matrix of pairs shows a bad leaf as a block and a bad host as a cross."""

    def key(node: str) -> tuple[object, ...]:
        place = (placement or {}).get(node) or Placement()
        parts = (place.pod, place.spine, place.leaf, place.nvlink_domain)
        return (
            not place.known,
            *((part is None, natural(part or "")) for part in parts),
            natural(node),
        )

    return sorted(nodes, key=key)
