"""deploy/prometheus/mixin.py and its package of rules, imported from their paths (deploy/ is not a
package), and helpers."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
MIXIN_PATH = ROOT / "deploy" / "prometheus" / "mixin.py"
PACKAGE_PATH = MIXIN_PATH.parent / "clusterhealth_mixin"


def _exec(name: str, path: Path, package: bool = False) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    search = [str(path.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=search)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load() -> ModuleType:
    """mixin.py, after the package of rules beside it (which it imports by its own name, as it
    does when run from its folder)."""
    _exec("clusterhealth_mixin", PACKAGE_PATH / "__init__.py", package=True)
    return _exec("clusterhealth_prometheus_mixin", MIXIN_PATH)


mixin = load()


def _go_float(value: float) -> str:
    """`{{ $value }}` as Go's text/template prints a float64 (%v: shortest, exponent from 1e21)."""
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    return repr(value)


def _humanize(value: float, base: int, prefixes: tuple[str, ...]) -> str:
    """Prometheus's `humanize` (base 1000) and `humanize1024` (base 1024) for values >= 1."""
    if value == 0 or math.isnan(value) or math.isinf(value) or abs(value) < 1:
        return f"{value:.4g}"
    for prefix in prefixes[:-1]:
        if abs(value) < base:
            return f"{value:.4g}{prefix}"
        value /= base
    return f"{value:.4g}{prefixes[-1]}"


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """The alert templates the mixin uses, expanded as Prometheus expands them."""

    def conditional(m: re.Match[str]) -> str:
        return m.group(2) if labels.get(m.group(1)) else (m.group(3) or "")

    # Innermost conditionals first (a body without another `if`), until none is left: they nest.
    body = r"((?:(?!\{\{ if ).)*?)"
    innermost = re.compile(
        r"\{\{ if \$labels\.(\w+) \}\}" + body + r"(?:\{\{ else \}\}" + body + r")?\{\{ end \}\}", re.S
    )
    text = template
    while (expanded := innermost.sub(conditional, text)) != text:
        text = expanded
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
    text = text.replace("{{ $value | humanize }}", _humanize(value, 1000, ("", "k", "M", "G", "T", "P")))
    text = text.replace(
        "{{ $value | humanize1024 }}", _humanize(value, 1024, ("", "ki", "Mi", "Gi", "Ti", "Pi"))
    )
    text = text.replace("{{ $value | humanizePercentage }}", f"{value * 100:.4g}%")
    text = text.replace("{{ $value }}", _go_float(value))
    assert "{{" not in text, f"template construct the test cannot expand: {text}"
    return text
