"""How `make test` spreads the suite over its workers (tests/README.md): the groups the conftest and
the modules declare stay on one worker each, and the slow ones are collected first. Run as a user
runs it, on files of the suite itself, in a pytest of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT


def _pytest(tmp_path: Path, *args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "XDIST_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.splitlines()


def test_a_module_sharing_a_fixture_and_the_builds_from_the_clone_each_run_on_one_worker(
    tmp_path: Path,
) -> None:
    lines = _pytest(
        tmp_path,
        *("-n", "2", "-v", "tests/test_sysfs.py", "tests/test_packaging.py"),
        *("-k", "fifo or version_lives or every_source_folder"),
    )
    ran = [m.groups() for m in (re.match(r"\[(gw\d+)\] .*PASSED (\S+)", line) for line in lines) if m]
    by_group: dict[str, set[str]] = {}
    for worker, nodeid in ran:
        assert "@" in nodeid, f"{nodeid}: xdist lost the group (pytest-dev/pytest-xdist#1386)"
        by_group.setdefault(nodeid.rsplit("@", 1)[1], set()).add(worker)
    assert len(ran) == 5, lines
    # test_sysfs.py's FIFO tests share its module-scoped tree; the packaging tests build wheels.
    assert set(by_group) == {"tests/test_sysfs.py", "builds-from-the-clone"}, ran
    assert all(len(workers) == 1 for workers in by_group.values()), by_group


def test_the_slow_tests_are_collected_first_each_group_together(tmp_path: Path) -> None:
    files = ("tests/test_config.py", "tests/test_lab.py", "tests/test_web_config.py")
    ids = [line for line in _pytest(tmp_path, "--collect-only", "-q", *files) if "::" in line]
    modules = [i.split("::", 1)[0] for i in ids]
    # test_lab.py is slow as a module, and its tests share its labs: all of them first.
    lab = modules.count("tests/test_lab.py")
    assert lab > 1 and modules[:lab] == ["tests/test_lab.py"] * lab, modules
    # test_web_config.py's testssl scan is slow, and it shares the module's certificates: it and
    # the tests that share them come next, before test_config.py's quick ones.
    assert modules[lab] == "tests/test_web_config.py", modules
    testssl = next(n for n, i in enumerate(ids) if "::test_testssl" in i)
    assert testssl < modules.index("tests/test_config.py")
