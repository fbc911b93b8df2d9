"""A settings file's YAML, read with the limits a file from anyone must be held to.

PyYAML's safe loader builds no objects but plain data; it still lets a few hundred bytes stand for
billions of values (aliases), nest deeply enough to exhaust the stack, and give a key twice (the
last silently wins). `read_yaml` reads the agent's config file and the web config file
(agent/config.py, agent/webconfig.py) and refuses all of that, and bytes that are not UTF-8, with
a `ConfigError` naming the file, the key and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clusterhealth.agent.settings import ConfigError, key_path

# A config file holds a few hundred values. YAML aliases let a few hundred bytes stand for billions
# (each alias repeats what its anchor names), so the expanded document is bounded before anything
# is built from it; so is its nesting, which PyYAML walks recursively.
MAX_DOCUMENT_VALUES = 100_000
MAX_DEPTH = 32
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _DocumentProblem(Exception):
    def __init__(self, key: str, expected: str):
        super().__init__(f"{key}: expected {expected}")
        self.key, self.expected = key, expected


class _HardenedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what YAML allows but a config file must not hold.

    A key given twice in one mapping (PyYAML keeps the last silently; keys merged in with ``<<``
    may still be overridden), aliases that expand to more than MAX_DOCUMENT_VALUES values, an alias
    inside the value it names, and nesting deeper than MAX_DEPTH. A scalar that its YAML type
    cannot hold (the date 2001-13-45, a 5000-digit integer) is a YAML error at its line.
    """

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, "", 0, {}, set())
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as err:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.tag.rpartition(':')[2]} value ({err})", node.start_mark
            ) from err


def _expanded_size(node: yaml.Node, key: str, depth: int, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values `node` stands for once aliases are expanded (memoized: aliases share nodes)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    if depth > MAX_DEPTH:
        raise _DocumentProblem(key, f"values nested at most {MAX_DEPTH} levels deep")
    if id(node) in open_:
        raise _DocumentProblem(key, "no alias inside the value its anchor names")
    open_.add(id(node))
    total = 1
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *defaults` lands its keys in this mapping
                total += _expanded_size(value_node, key, depth + 1, sizes, open_)
                continue
            child = key
            if isinstance(key_node, yaml.ScalarNode):
                child = key_path(key, key_node.value)
                line, identity = key_node.start_mark.line + 1, (key_node.tag, key_node.value)
                if identity in first_line:
                    raise _DocumentProblem(
                        child,
                        f"each key once per mapping (lines {first_line[identity]} and {line} both set it)",
                    )
                first_line[identity] = line
            total += _expanded_size(key_node, child, depth + 1, sizes, open_)
            total += _expanded_size(value_node, child, depth + 1, sizes, open_)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            total += _expanded_size(item, f"{key}[{i}]", depth + 1, sizes, open_)
    open_.discard(id(node))
    if total > MAX_DOCUMENT_VALUES:
        raise _DocumentProblem(
            key, f"at most {MAX_DOCUMENT_VALUES} values once YAML aliases are expanded (found {total})"
        )
    sizes[id(node)] = total
    return total


def read_yaml(path: str | Path, source: str) -> Any:
    """The document in the file at `path`, or ConfigError naming `source` and what is wrong with it."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(source, "", "a readable file", err.strerror or str(err)) from err
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        got = f"byte 0x{raw[err.start]:02x} on line {line}"
        raise ConfigError(source, "", "a UTF-8 text file", got) from err
    loader: _HardenedLoader | None = None
    try:
        loader = _HardenedLoader(text)  # the reader already refuses characters YAML does not allow
        return loader.get_single_data()
    except _DocumentProblem as err:
        raise ConfigError(source, err.key, err.expected) from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"valid YAML (line {mark.line + 1})" if mark is not None else "valid YAML"
        raise ConfigError(source, "", where, getattr(err, "problem", None) or str(err)) from err
    except RecursionError as err:  # PyYAML composes nested collections recursively
        raise ConfigError(source, "", f"values nested at most {MAX_DEPTH} levels deep") from err
    finally:
        if loader is not None:
            loader.dispose()
