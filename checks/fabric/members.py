"""A group's inventory: node name -> the address its probe server listens on, and where it sits.

The file a group names (``members_file``) is YAML, one member per key, as a configuration tool
writes it from its own inventory: the address alone, or a mapping with the address and the
member's place in the fabric (checks/fabric/topology.py: ``leaf``, and optionally ``spine``,
``pod`` and ``rail``), or a mix of both::

    gpu-001: 10.1.0.1
    gpu-002: {address: 10.1.0.2, leaf: su1-leaf03, pod: su1, rail: 0}

Every problem is named with its line: a member listed twice (YAML itself would silently keep the
last one, and two agents reading two versions of a file would then pair differently), a name that
cannot be a node name, an empty address, two members on one address, a key a member cannot have,
a place that cannot be a name. Pure: text in, mapping out.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from clusterhealth.checks.fabric.schedule import MembershipError, check_node_name
from clusterhealth.checks.fabric.topology import PLACE_KEYS, Placement, check_place_name

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")


def check_address(value: object) -> str | None:
    """None when ``value`` is an IP address or a host name a client can connect to."""
    if not isinstance(value, str) or not value:
        return "an IP address or a host name"
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    return None if _HOSTNAME.fullmatch(value) else "an IP address or a host name"


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping key given twice, naming both lines."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in lines:
            raise MembershipError(f"line {line}: member {key!r} listed twice (first on line {lines[key]})")
        lines[key] = line
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


@dataclass(frozen=True)
class Inventory:
    """A group's members: their addresses, and the places of those whose entry gives one."""

    addresses: dict[str, str] = field(default_factory=dict)
    placement: dict[str, Placement] = field(default_factory=dict)


def parse_members(text: str) -> dict[str, str]:
    """The addresses of the inventory in ``text``; MembershipError naming the line of the first
    problem."""
    return parse_inventory(text).addresses


def parse_inventory(text: str) -> Inventory:
    """The inventory in ``text``; MembershipError naming the line of the first problem."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        document = loader.construct_document(root) if root is not None else None
        lines = (
            {loader.construct_object(key): key.start_mark.line + 1 for key, _ in root.value}
            if isinstance(root, yaml.MappingNode)
            else {}
        )
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise MembershipError(f"{where}not valid YAML ({getattr(err, 'problem', None) or err})") from None
    finally:
        loader.dispose()
    if document is None:
        return Inventory()
    if not isinstance(document, dict):
        raise MembershipError("expected a mapping of node name to address, one 'name: address' per line")
    return check_inventory(document, lines)


def check_members(mapping: dict[Any, Any]) -> dict[str, str]:
    """Validate a name -> address mapping (inline in the config, or read from a file)."""
    return check_inventory(mapping).addresses


def check_inventory(mapping: dict[Any, Any], lines: dict[Any, int] | None = None) -> Inventory:
    """Validate a name -> address (or -> {address, leaf, ...}) mapping; ``lines`` says where each
    name was read, for the messages."""
    inventory = Inventory()
    owners: dict[str, str] = {}
    for name, entry in mapping.items():
        line = (lines or {}).get(name)
        at = f"line {line}: " if line is not None else ""
        if (problem := check_node_name(name)) is not None:
            raise MembershipError(f"{at}member {name!r}: expected {problem}")
        address, place = _entry(name, entry, at)
        if address in owners:
            raise MembershipError(f"{at}members {owners[address]} and {name} have the same address {address}")
        owners[address] = name
        inventory.addresses[name] = address
        if place is not None:
            inventory.placement[name] = place
    return inventory


def _entry(name: str, entry: Any, at: str) -> tuple[str, Placement | None]:
    """A member's address and place, from ``address`` or ``{address: ..., leaf: ..., ...}``."""
    place = None
    address = entry
    if isinstance(entry, dict):
        unknown = sorted(str(key) for key in entry if key not in ("address", *PLACE_KEYS))
        if unknown:
            keys = ", ".join(("address", *PLACE_KEYS))
            raise MembershipError(f"{at}member {name}: expected the keys {keys}, got {', '.join(unknown)}")
        address = entry.get("address")
        values: dict[str, str] = {}
        for key in PLACE_KEYS:
            if entry.get(key) is None:
                continue
            if (problem := check_place_name(entry[key])) is not None:
                raise MembershipError(f"{at}member {name}: {key}: expected {problem}, got {entry[key]!r}")
            values[key] = str(entry[key])
        place = Placement(**values) if values else None
    if (problem := check_address(address)) is not None:
        raise MembershipError(f"{at}member {name}: expected {problem}, got {address!r}")
    return address, place
