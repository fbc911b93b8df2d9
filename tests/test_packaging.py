"""The installed package is the source tree: every folder of code is listed in pyproject.toml.

The editable install of development finds any module; a wheel carries only the packages listed,
so a forgotten sub-package works here and is missing on a user's node.
"""

from __future__ import annotations

import pytest

from .conftest import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer

TOP_LEVEL = ("agent", "exporters", "checks", "dashboards")


def test_every_source_folder_is_a_listed_package() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    mapping = setuptools["package-dir"]
    assert {f"clusterhealth.{top}" for top in TOP_LEVEL} <= listed
    assert all(mapping[f"clusterhealth.{top}"] == top for top in TOP_LEVEL)
    found = set()
    for top in TOP_LEVEL:
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            if "__pycache__" in folder.parts:
                continue
            if any(folder.glob("*.py")) or any(folder.glob("*.yaml")):
                relative = folder.relative_to(ROOT).parts
                found.add(".".join(("clusterhealth", *relative)))
    assert found == listed
