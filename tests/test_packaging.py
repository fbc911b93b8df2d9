"""The installed package is the source tree: every folder of code is listed in pyproject.toml.

The editable install of development finds any module; a wheel carries only the packages listed,
so a forgotten sub-package works here and is missing on a user's node.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT
from .dist import BUILDS_FROM_THE_CLONE, VERSION, make, project_wheel, wheelhouse

pytestmark = BUILDS_FROM_THE_CLONE

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer

TOP_LEVEL = ("agent", "exporters", "checks", "fleet", "dashboards")


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


def test_no_tracked_file_is_ignored() -> None:
    """A tracked file that .gitignore lists (deploy/clusterhealth.yaml and deploy/members.yaml
    once were) is skipped by `git add -A`, `git status` and the tools that honour .gitignore: an
    edit to it is easily lost."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-i", "-c", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == "", "tracked but ignored:\n" + listed.stdout


# --- the built distribution ------------------------------------------------------------------


def test_the_version_lives_in_pyproject_and_the_rest_follows() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == VERSION
    chart = yaml.safe_load((ROOT / "deploy/kubernetes/helm/clusterhealth/Chart.yaml").read_text())
    assert chart["appVersion"] == version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, flags=re.M)
    assert released[0] == version, "the CHANGELOG's latest release is the package version"
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    )


def test_the_image_pins_every_runtime_dependency_within_pyproject_ranges() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "deploy/container/constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split()[0].split("==")
            assert "--hash=sha256:" in line, line
            pins[canonicalize_name(name)] = version
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned for the image"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {spec}"


def test_the_wheel_installs_and_runs_from_a_fresh_venv_outside_the_clone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--find-links"]
    install = subprocess.run(
        [*pip, str(wheelhouse()), str(project_wheel())],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr
    command = str(venv / "bin/clusterhealth")
    outside = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    version = subprocess.run([command, "--version"], **outside)  # type: ignore[call-overload]
    assert version.stdout == f"clusterhealth {VERSION}\n"
    # The packaged scenario, not the clone's: the wheel carries its data.
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    scenario = site / "clusterhealth/exporters/sim/scenarios/h100-faulty.yaml"
    scrape = subprocess.run(
        [command, "scrape", "--simulate", str(scenario), "--kmsg-path", "/dev/null"], **outside
    )  # type: ignore[call-overload]
    assert scrape.returncode == 0, scrape.stderr
    assert 'clusterhealth_gpu_up{gpu="6",' in scrape.stdout
    # A fleet-side command, from the wheel's fleet/ package.
    workload = ["--params", "7B", "--bytes-per-param", "2", "--gpus", "8", "--compute-seconds", "1"]
    model = subprocess.run([command, "model", *workload, "--bandwidth", "50GB/s", "--json"], **outside)  # type: ignore[call-overload]
    assert model.returncode == 0, model.stderr
    assert json.loads(model.stdout)["gradient_bytes"] == 14e9
    # The report's template rides in the wheel; the image's set of packages leaves the report extra
    # out, and the command says, in one line, what to install.
    assert (site / "clusterhealth/fleet/report/page.html.j2").is_file()
    report = subprocess.run(  # type: ignore[call-overload]
        [command, "report", "--prometheus", "http://127.0.0.1:9", "-o", str(tmp_path / "report.html")],
        **outside,
    )
    assert report.returncode == 2
    assert re.fullmatch(
        r"clusterhealth report: needs the report extra \(\w+ is not installed\): "
        r"pip install 'clusterhealth\[report\]'\n",
        report.stderr,
    ), report.stderr
    assert not (tmp_path / "report.html").exists()
    for data in (
        "clusterhealth.yaml",
        "systemd/clusterhealth.service",
        "prometheus/clusterhealth-rules.yaml",
    ):
        assert (venv / "share/clusterhealth" / data).is_file(), data
    assert list(site.glob("clusterhealth/dashboards/clusterhealth-*.json"))
    demo = subprocess.run(  # type: ignore[call-overload]
        [command, "demo", "--listen", "127.0.0.1:0", "--interval", "1", "--duration", "4"], **outside
    )
    assert demo.returncode == 0, demo.stderr
    assert f"  policy    {venv / 'share/clusterhealth/clusterhealth.yaml'}" in demo.stdout
    assert str(ROOT) not in demo.stdout


def test_the_sdist_holds_what_the_wheel_is_built_from(tmp_path: Path) -> None:
    make("dist")
    (sdist,) = (ROOT / "dist").glob("clusterhealth-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    for needed in (
        "LICENSE",
        "CHANGELOG.md",
        "Containerfile",
        "deploy/container/constraints.txt",
        "agent/cli.py",
        "fleet/pairwise.py",
    ):
        assert needed in names, needed
