"""The built distribution the packaging, install and image tests share: `make wheels` once a session.

`make wheels` puts the project's wheel and its dependencies' wheels (pinned in
deploy/container/constraints.txt, for CPython 3.11 on x86_64 manylinux: the image's platform, and
this machine's) in build/image/wheels. Installing from that folder with `--no-index` needs nothing
from an index, so the tests install exactly what the image installs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

WHEELS = ROOT / "build" / "image" / "wheels"
VERSION = (ROOT / "pyproject.toml").read_text().split('\nversion = "', 1)[1].split('"', 1)[0]
_made: list[Path] = []
# The modules that build in the clone (`make wheels`, `make dist`, pip's in-tree build of the
# README's `make install`) write the same folders (build/, dist/, *.egg-info): one worker runs them
# all, one after the other (tests/README.md), from the start: about 80 s in all. test_image builds
# in a copy (`source_copy`) instead.
BUILDS_FROM_THE_CLONE = [pytest.mark.xdist_group("builds-from-the-clone"), pytest.mark.slow]


def make(
    *args: str, timeout: float = 600, directory: Path = ROOT, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """`make -C DIRECTORY ARGS` with this test run's virtualenv; fails the test on an error."""
    venv = Path(sys.executable).parent.parent
    result = subprocess.run(
        ["make", "-C", str(directory), f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )
    assert result.returncode == 0, f"make {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    if directory == ROOT and args and args[0] in ("wheels", "image"):  # `make image` makes the wheels
        _made[:] = [WHEELS]
    return result


def source_copy(destination: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the clone's files (what git tracks and what it would add, with their times, so that
    make sees the virtualenv as up to date), and the environment in which `make` there builds what
    it builds in the clone (the wheels' timestamps from the clone's last commit). A build in the
    copy writes its build/ and dist/ there, beside the clone's own builds."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if os.path.lexists(source):  # a tracked file deleted in the working tree is not copied
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name, follow_symlinks=False)
    epoch = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return destination, {**os.environ, "SOURCE_DATE_EPOCH": epoch}


def wheelhouse() -> Path:
    if not _made:
        make("wheels")
    return _made[0]


def project_wheel() -> Path:
    (wheel,) = wheelhouse().glob("clusterhealth-*.whl")
    return wheel
