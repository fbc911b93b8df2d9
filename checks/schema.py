"""How settings are declared: `setting()`, a dataclass field carrying its documentation and bounds.

Every settings file declares its keys this way and no other: the agent's config file
(agent/config.py), with its sections that live in checks/, apart from the agent (the audit policy,
checks/policy.py; the probes, checks/probes/settings.py; the pairwise groups,
checks/fabric/settings.py), and the web config file (agent/webconfig.py). The agent's loader
(agent/settings.py) validates every field from this metadata and its reference generator documents
every key from `doc`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any


def _meta(
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> dict[str, Any]:
    """A field's metadata: `check` returns what was expected when a value is wrong, else None."""
    return {"doc": doc, "min": min, "max": max, "choices": choices, "check": check}


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    check: Callable[[Any], str | None] | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A settings field with its documentation and bounds."""
    metadata = _meta(doc, min=min, max=max, choices=choices, check=check)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_pattern(value: str) -> str | None:
    """`check=` for a regular expression matched against a whole name."""
    if not value:
        return "a non-empty regular expression matched against the whole name, e.g. ibp.*"
    try:
        re.compile(value)
    except re.error as err:
        return f"a valid regular expression ({err})"
    return None
