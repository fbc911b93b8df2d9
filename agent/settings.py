"""Settings read from plain data: the one validator of every settings file the agent reads.

Settings are frozen dataclasses whose fields are declared with checks/schema.py's `setting()`: a
default, a `doc`, and bounds (`min`, `max`, `choices`, a `check` hook). `from_mapping` builds one
from a parsed YAML mapping, checking every key and value against those declarations; an unknown
key, a wrong type or an out-of-range value raises `ConfigError` naming the file, the key path and
what was expected, which the command line turns into exit code 2. `reference` documents every key
from `doc`, `to_mapping` gives the plain data back (--print-config). The agent's config file
(agent/config.py, with the sections checks/ declares: checks/policy.py, checks/probes/settings.py,
checks/fabric/settings.py) and the web config file (agent/webconfig.py) are read this way, from
YAML read by agent/yamlfile.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
import sys
import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(Exception):
    """A configuration value that is not what the agent expects."""

    def __init__(self, source: str, key: str, expected: str, got: object = dataclasses.MISSING):
        self.source, self.key, self.expected = source, key, expected
        detail = f"{source}: {key or '<top level>'}: expected {expected}"
        if got is not dataclasses.MISSING:
            detail += f", got {_show(got)}"
        super().__init__(detail)


class _Preview(reprlib.Repr):
    """A bounded repr: a value that aliases expand to billions of items renders in microseconds."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 60, 60
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 6

    def repr_int(self, x: int, level: int) -> str:
        # repr() of an int longer than 4300 digits raises; a YAML hex literal can be that long.
        return (
            super().repr_int(x, level) if x.bit_length() <= 128 else f"<an integer of {x.bit_length()} bits>"
        )


_PREVIEW = _Preview()


def _show(value: object) -> str:
    text = _PREVIEW.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(key: object) -> str:
    """A mapping key as it appears in a key path, cut short like values are."""
    text = key if isinstance(key, str) else _show(key)
    return text if len(text) <= 60 else text[:57] + "..."


def key_path(prefix: str, key: object) -> str:
    """The path of `key` inside the mapping at `prefix` ("" at the top), as errors name it."""
    return _join(prefix, _name(key))


def from_mapping(cls: type[T], data: Any, source: str, prefix: str = "") -> T:
    """Build dataclass `cls` from a parsed YAML mapping, checking every key and value."""
    if not isinstance(data, dict):
        raise ConfigError(source, prefix, "a mapping of keys to values", data)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(source, _join(prefix, _name(key)), f"one of the known keys ({known})", key)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            values[name] = _convert(hints[name], data[name], f.metadata, source, _join(prefix, name))
    return cls(**values)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _convert(hint: Any, value: Any, meta: Mapping[str, Any], source: str, key: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = get_origin(hint), get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, source, key)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(source, key, "a list", value)
        items = tuple(_convert(args[0], item, {}, source, f"{key}[{i}]") for i, item in enumerate(value))
        check = meta.get("check")
        problem = check(items) if check is not None else None
        if problem:
            raise ConfigError(source, key, problem, value)
        return items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, "a mapping", value)
        mapping = {
            _convert(args[0], k, {}, source, key): _convert(args[1], v, {}, source, f"{key}.{_name(k)}")
            for k, v in value.items()
        }
        check = meta.get("check")
        problem = check(mapping) if check is not None else None
        if problem:
            raise ConfigError(source, key, problem, value)
        return mapping
    converted = _scalar(hint, value, source, key)
    _check_bounds(converted, meta, source, key)
    return converted


def _scalar(hint: Any, value: Any, source: str, key: str) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, "true or false", value)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, "an integer", value)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, key, "a number", value)
        if isinstance(value, int) and abs(value) > sys.float_info.max:
            return math.inf if value > 0 else -math.inf  # out of every range: _check_bounds says which
        return float(value)
    if hint is str:
        if isinstance(value, float) or (
            isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 64
        ):
            # YAML reads an unquoted -1 or 10 in a command line as a number.
            raise ConfigError(
                source, key, f"a string (YAML read a number: write it quoted, '{value}')", value
            )
        if not isinstance(value, str):
            raise ConfigError(source, key, "a string", value)
        return value
    raise TypeError(f"config field {key} has unsupported type {hint!r}")


def _check_bounds(value: Any, meta: Mapping[str, Any], source: str, key: str) -> None:
    lo, hi, choices, check = meta.get("min"), meta.get("max"), meta.get("choices"), meta.get("check")
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # NaN compares false with every bound, so it has to be refused by name (.nan, .inf are YAML floats).
    if is_number and (
        (isinstance(value, float) and not math.isfinite(value))
        or (lo is not None and value < lo)
        or (hi is not None and value > hi)
    ):
        if lo is not None and hi is not None:
            expected = f"a number between {lo:g} and {hi:g}"
        elif lo is not None or hi is not None:
            expected = f"a number of at least {lo:g}" if lo is not None else f"a number of at most {hi:g}"
        else:
            expected = "a finite number"
        raise ConfigError(source, key, expected, value)
    if choices is not None and value not in choices:
        raise ConfigError(source, key, "one of " + ", ".join(choices), value)
    if check is not None:
        problem = check(value)
        if problem:
            raise ConfigError(source, key, problem, value)


def to_mapping(obj: Any) -> Any:
    """The plain-data form of a config object, for --print-config."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    return obj


def reference(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key path, default, doc) for every leaf key of the settings class `cls`: the configuration
    reference of docs/configuration.md."""
    rows: list[tuple[str, str, str]] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows.extend(reference(hint, key))  # type: ignore[arg-type]
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        rows.append((key, json.dumps(to_mapping(default)), f.metadata["doc"]))
        args = get_args(hint)
        if get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
            rows.extend(reference(args[0], f"{key}[]"))  # type: ignore[arg-type]  # each item's keys
    return rows
