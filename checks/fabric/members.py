"""A group's inventory: node name -> the address its probe server listens on.

The file a group names (``members_file``) is YAML, one ``name: address`` per line, as a
configuration tool writes it from its own inventory::

    gpu-001: 10.1.0.1
    gpu-002: 10.1.0.2

Every problem is named with its line: a member listed twice (YAML itself would silently keep the
last one, and two agents reading two versions of a file would then pair differently), a name that
cannot be a node name, an empty address, two members on one address. Pure: text in, mapping out.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import yaml

from clusterhealth.checks.fabric.schedule import MembershipError, check_node_name

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


def parse_members(text: str) -> dict[str, str]:
    """The inventory in ``text``; MembershipError naming the line of the first problem."""
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise MembershipError(f"{where}not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise MembershipError("expected a mapping of node name to address, one 'name: address' per line")
    return check_members(document)


def check_members(mapping: dict[Any, Any]) -> dict[str, str]:
    """Validate a name -> address mapping (inline in the config, or read from a file)."""
    members: dict[str, str] = {}
    owners: dict[str, str] = {}
    for name, address in mapping.items():
        if (problem := check_node_name(name)) is not None:
            raise MembershipError(f"member {name!r}: expected {problem}")
        if (problem := check_address(address)) is not None:
            raise MembershipError(f"member {name}: expected {problem}, got {address!r}")
        if address in owners:
            raise MembershipError(f"members {owners[address]} and {name} have the same address {address}")
        owners[address] = name
        members[name] = address
    return members
