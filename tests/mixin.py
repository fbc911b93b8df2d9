"""deploy/prometheus/mixin.py and its package of rules, imported from their paths (deploy/ is not a
package), and helpers."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def area_cases(area: str) -> list[Any]:
    """The promtool cases of one area (deploy/prometheus/clusterhealth_mixin/<area>_cases.py)."""
    return list(importlib.import_module(f"clusterhealth_mixin.{area}_cases").CASES)
