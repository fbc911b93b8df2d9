"""The built distribution the packaging, install and image tests share: `make wheels` once a session.

`make wheels` puts the project's wheel and its dependencies' wheels (pinned in
deploy/container/constraints.txt, for CPython 3.11 on x86_64 manylinux: the image's platform, and
this machine's) in build/image/wheels. Installing from that folder with `--no-index` needs nothing
from an index, so the tests install exactly what the image installs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

WHEELS = ROOT / "build" / "image" / "wheels"
VERSION = (ROOT / "pyproject.toml").read_text().split('\nversion = "', 1)[1].split('"', 1)[0]
_made: list[Path] = []
# The modules that build from the clone (`make wheels`, `make dist`, `make image`, pip's in-tree
# build of `make install`) write the same folders (build/, dist/, *.egg-info): one worker runs them
# all, one after the other (tests/README.md).
BUILDS_FROM_THE_CLONE = pytest.mark.xdist_group("builds-from-the-clone")


def make(*args: str, timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`make -C ROOT ARGS` with this test run's virtualenv; fails the test on an error."""
    venv = Path(sys.executable).parent.parent
    result = subprocess.run(
        ["make", "-C", str(ROOT), f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )
    assert result.returncode == 0, f"make {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    if args and args[0] in ("wheels", "image"):  # `make image` makes the wheels first
        _made[:] = [WHEELS]
    return result


def wheelhouse() -> Path:
    if not _made:
        make("wheels")
    return _made[0]


def project_wheel() -> Path:
    (wheel,) = wheelhouse().glob("clusterhealth-*.whl")
    return wheel
