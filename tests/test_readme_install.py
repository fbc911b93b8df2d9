"""The README's Install section is the path the tests follow: each of its commands is checked
here against what it runs (make's targets and variables, the chart with the README's values, the
Slurm excerpt), and tests/test_install.py, tests/test_image.py and tests/test_packaging.py run the
same targets for real."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from .conftest import ROOT
from .dist import VERSION, project_wheel

README = (ROOT / "README.md").read_text()
SECTION = README.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
BLOCKS = re.findall(r"```sh\n(.*?)```", SECTION, flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and `sudo` dropped."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        for command in line.split("#", 1)[0].split("&&"):
            command = command.strip().removeprefix("sudo ").strip()
            if command:
                out.append(command)
    return out


def dry_run(command: str) -> str:
    args = command.split()
    assert args[0] == "make", command
    result = subprocess.run(["make", "-n", "-C", str(ROOT), *args[1:]], capture_output=True, text=True)
    assert result.returncode == 0, command + "\n" + result.stderr
    return result.stdout


def test_the_install_section_is_near_the_top_with_three_ways() -> None:
    assert README.index("\n## Install\n") < README.index("\n## Commands\n")
    assert len(BLOCKS) == 3


def test_the_systemd_block_installs_the_command_where_the_unit_looks() -> None:
    systemd = commands(BLOCKS[0])
    assert systemd[0] == "make install"
    planned = dry_run("make install")
    assert "ln -sfn /opt/clusterhealth/bin/clusterhealth /usr/local/bin/clusterhealth" in planned
    assert "/usr/local/lib/systemd/system/clusterhealth.service" in planned
    # The wheel the comment names is the one `make dist` builds (its name carries the version).
    (alternative,) = re.findall(r"make install WHEEL=dist/(\S+)", BLOCKS[0])
    assert alternative == project_wheel().name == f"clusterhealth-{VERSION}-py3-none-any.whl"
    assert systemd[1:3] == ["systemctl daemon-reload", "systemctl enable --now clusterhealth"]


def test_the_kubernetes_block_builds_pushes_and_installs_that_image() -> None:
    make_image, push, helm_install = commands(BLOCKS[1])
    planned = dry_run(make_image)
    image = make_image.split("IMAGE=", 1)[1]
    assert f"-t {image}" in planned and image.endswith(f":{VERSION}")
    assert push == f"buildah push {image}"
    args = helm_install.split()
    assert args[:2] == ["helm", "install"]
    helm = str(Path(sys.executable).parent / "helm")
    rendered = subprocess.run([helm, "template", *args[2:]], capture_output=True, text=True, cwd=ROOT)
    assert rendered.returncode == 0, rendered.stderr
    daemonset = next(d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image


def test_the_slurm_block_points_slurmd_at_the_installed_health_check() -> None:
    append, reconfigure = commands(BLOCKS[2])
    excerpt = append.split("< ", 1)[1]
    settings = dict(
        line.split("=", 1) for line in (ROOT / excerpt).read_text().splitlines() if not line.startswith("#")
    )
    assert settings["HealthCheckProgram"] == "/usr/local/sbin/clusterhealth-healthcheck"
    assert "/usr/local/sbin/clusterhealth-healthcheck" in dry_run("make install")
    # and the job-mapping Prolog and Epilog that make install puts beside it
    assert settings["Prolog"] == "/usr/local/sbin/clusterhealth-prolog"
    assert settings["Epilog"] == "/usr/local/sbin/clusterhealth-epilog"
    assert "deploy/slurm/clusterhealth-prolog deploy/slurm/clusterhealth-epilog" in dry_run("make install")
    assert reconfigure == "scontrol reconfigure"
