"""The README's Install section is the path the tests follow: its commands are run as written
wherever this machine can run them, and each command the test cannot run is named with what
stands for it.

- The systemd node: `sudo make install` runs as written from the clone, as root, into a throwaway
  root (the session's `readme_installed` fixture, shared with tests/test_install.py, which checks
  the installed files). There is no systemd as PID 1 here, so `systemctl daemon-reload` is
  `systemd-analyze verify` of the unit by name (found where systemd looks for units, checked with
  the installed command), `systemctl enable` runs for real (offline, it makes the `WantedBy=`
  link), and `--now` starts the unit's `ExecStart=` with its `EnvironmentFile=` and
  `StateDirectory=` as systemd would, in a network namespace of its own; then the README's `curl`
  runs as written against that agent.
- Kubernetes: tests/test_image.py runs the README's `make image` command (adding only where this
  machine's buildah keeps its storage and a locally bootstrapped base: no registry is reachable);
  `buildah push` needs a registry and is not run; the `helm install` line is rendered with
  `helm template` and the image it names is the one built.
- Slurm: the block runs as written on a node of a real Slurm cluster (tests/slurm.py) whose nodes
  have the install laid over theirs: it appends to the cluster's slurm.conf, and its `scontrol
  reconfigure` makes the cluster run the installed Prolog and Epilog for a real job.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, SCENARIOS, require_tool
from .dist import BUILDS_FROM_THE_CLONE, VERSION, project_wheel
from .node_root import BLOCKS, commands, in_root, readme_install_command, writable_overlays
from .slurm import SlurmCluster

pytestmark = BUILDS_FROM_THE_CLONE

README = (ROOT / "README.md").read_text()
ENABLE = r"sudo systemctl enable --now (\S+)"


def dry_run(command: str) -> str:
    args = command.split()
    assert args[0] == "make", command
    result = subprocess.run(["make", "-n", "-C", str(ROOT), *args[1:]], capture_output=True, text=True)
    assert result.returncode == 0, command + "\n" + result.stderr
    return result.stdout


def test_the_install_section_is_near_the_top_with_three_ways() -> None:
    assert README.index("\n## Install\n") < README.index("\n## Commands\n")
    assert len(BLOCKS) == 3


def unit_settings(unit: str) -> dict[str, str]:
    """The [Service] settings of a unit file (the last of each key)."""
    section = unit.split("\n[Service]\n", 1)[1].split("\n[", 1)[0]
    return dict(
        line.split("=", 1) for line in section.splitlines() if "=" in line and not line.startswith("#")
    )


def started_as_systemd_would(unit_path: Path, log: Path, pid_file: Path) -> str:
    """Shell that starts a unit's ExecStart= the way systemd does for this unit: its environment
    file read (optional with `-`), its state directory made, its command's `$VAR` split into
    words."""
    settings = unit_settings(unit_path.read_text())
    environment = settings["EnvironmentFile"]
    optional = environment.startswith("-")
    environment = environment.removeprefix("-")
    read = f"[ ! -e {environment} ] || . {environment}" if optional else f". {environment}"
    state = f"mkdir -p /var/lib/{settings['StateDirectory']}\n" if "StateDirectory" in settings else ""
    return (
        f"{state}(set -a; {read}; set +a; exec {settings['ExecStart']}) >{log} 2>&1 &\necho $! > {pid_file}\n"
    )


def test_the_systemd_block_runs_as_written(readme_installed: Path, tmp_path: Path) -> None:
    install, *rest = commands(BLOCKS[0])
    assert install == readme_install_command() == "sudo make install"  # run by readme_installed
    log, pid_file, out = tmp_path / "agent.log", tmp_path / "agent.pid", tmp_path / "out"
    out.mkdir()
    unit_dir = readme_installed / "usr/local/lib/systemd/system"
    # /etc and /var are written (the enable link, the state directory) into this test's root.
    script = writable_overlays(tmp_path / "node", ("etc", "var")) + 'ip link set lo up\nsudo() { "$@"; }\n'
    units = [m.group(1) + ".service" for c in rest if (m := re.fullmatch(ENABLE, c))]
    assert units == ["clusterhealth.service"]
    ran = []
    for command in rest:
        enable = re.fullmatch(ENABLE, command)
        if command == "sudo systemctl daemon-reload":
            # What daemon-reload loads: the units, by their names, from systemd's unit path.
            verify = f"PAGER=cat {require_tool('systemd-analyze')} verify {' '.join(units)}"
            script += f"{verify} >{out}/verify 2>&1\n"
        elif enable:
            unit = enable.group(1) + ".service"
            script += f"sudo systemctl enable {enable.group(1)} >{out}/enable 2>&1\n"
            script += started_as_systemd_would(unit_dir / unit, log, pid_file)
        elif command.startswith("curl "):
            # As written, until the agent answers (it starts in about a second) or dies.
            script += (
                f"i=0; pid=$(cat {pid_file}); until {command} >{out}/curl; do\n"
                "  if [ ! -e /proc/$pid ] || grep -qs '^State:.*Z' /proc/$pid/status; then\n"
                "    echo 'the agent exited' >&2; exit 3\n  fi\n"
                "  i=$((i+1)); [ $i -lt 120 ]; sleep 0.5\ndone\n"
            )
        else:
            pytest.fail(f"the README's systemd block has a command this test cannot run: {command!r}")
        ran.append(command)
    assert ran == rest and len(ran) == 3
    script += (
        f"pid=$(cat {pid_file}); tr '\\0' ' ' </proc/$pid/cmdline >{out}/cmdline\n"
        f'kill -TERM "$pid"; rc=0; wait "$pid" || rc=$?; echo "$rc" >{out}/exit\n'
    )
    result = in_root(readme_installed, script, net=True, timeout=180)
    agent_log = log.read_text() if log.exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + agent_log
    assert (out / "verify").read_text() == ""
    wants = tmp_path / "node/etc/systemd/system/multi-user.target.wants/clusterhealth.service"
    assert str(wants.readlink()) == "/usr/local/lib/systemd/system/clusterhealth.service", (
        out / "enable"
    ).read_text()
    # The installed command in the installed virtualenv, with the installed flags and config.
    assert (out / "cmdline").read_text().split() == [
        "/opt/clusterhealth/bin/python",
        "/usr/local/bin/clusterhealth",
        "agent",
        "--config",
        "/etc/clusterhealth/clusterhealth.yaml",
        "--listen",
        ":9845",
    ]
    health = json.loads((out / "curl").read_text())
    assert health["status"] in ("ok", "degraded")
    assert {"gpu", "kernel_log", "rdma", "jobs"} <= set(health["collectors"])
    assert "serving /metrics and /healthz on 0.0.0.0:9845" in agent_log
    assert (out / "exit").read_text() == "0\n", agent_log


def test_the_wheel_the_systemd_block_names_is_the_one_make_dist_builds() -> None:
    (alternative,) = re.findall(r"make install WHEEL=dist/(\S+)", BLOCKS[0])
    assert alternative == project_wheel().name == f"clusterhealth-{VERSION}-py3-none-any.whl"
    assert "ln -sfn /opt/clusterhealth/bin/clusterhealth /usr/local/bin/clusterhealth" in dry_run(
        f"make install WHEEL=dist/{alternative}"
    )


def test_the_kubernetes_block_builds_pushes_and_installs_that_image() -> None:
    make_image, push, helm_install = commands(BLOCKS[1])
    image = make_image.split("IMAGE=", 1)[1]
    assert make_image == f"make image IMAGE={image}"  # what tests/test_image.py runs
    assert f"-t {image}" in dry_run(make_image) and image.endswith(f":{VERSION}")
    assert push == f"buildah push {image}"
    args = shlex.split(helm_install)
    assert args[:2] == ["helm", "install"]
    helm = str(Path(sys.executable).parent / "helm")
    rendered = subprocess.run([helm, "template", *args[2:]], capture_output=True, text=True, cwd=ROOT)
    assert rendered.returncode == 0, rendered.stderr
    daemonset = next(d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image


def test_the_slurm_block_runs_as_written(readme_installed: Path, tmp_path: Path) -> None:
    """Run as written on a node of a real Slurm cluster (tests/slurm.py) whose nodes have the
    README's install laid over their /etc, /opt and /usr/local: the excerpt appended to the node's
    /etc/slurm/slurm.conf (the cluster's own file), `scontrol reconfigure` makes slurmctld and every
    slurmd take it, and a job's GPU is then mapped by the installed Prolog and unmapped by the
    installed Epilog."""
    block = commands(BLOCKS[2])
    assert [c.split()[:2] for c in block] == [["sudo", "tee"], ["sudo", "scontrol"]]
    cluster = SlurmCluster(tmp_path / "slurm", nodes=1, gpus=2, shards=0, lower=readme_installed)
    # The health check the block turns on may run at any time (CYCLE): on this machine's hardware
    # it could drain the node before the job runs, so the node's config is a healthy simulated
    # node's. (tests/test_install.py runs the installed health check under slurmd.)
    (tmp_path / "sys").mkdir()
    node_config = cluster.node_root("n1") / "etc" / "clusterhealth" / "clusterhealth.yaml"
    node_config.parent.mkdir(parents=True)
    node_config.write_text(
        yaml.safe_dump({"simulate": str(SCENARIOS / "h100-healthy.yaml"),
                        "paths": {"sysfs": str(tmp_path / "sys"), "kmsg": "/dev/null"}})
    )  # fmt: skip
    with cluster:
        before = cluster.conf.read_text()
        script = writable_overlays(tmp_path / "node", ("etc",))
        script += f"mkdir -p /etc/slurm && ln -sfn {cluster.conf} /etc/slurm/slurm.conf\n"
        script += f'sudo() {{ "$@"; }}\nunset SLURM_CONF\ncd {ROOT}\n'
        script += "".join(f"{command} >/dev/null\n" for command in block)
        result = in_root(readme_installed, script)
        assert result.returncode == 0, result.stderr
        conf = cluster.conf.read_text()
        assert conf.startswith(before) and conf != before
        settings = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and line[0] != "#")
        for key in ("HealthCheckProgram", "Prolog", "Epilog"):
            installed = readme_installed / settings[key].lstrip("/")
            assert installed.is_file() and installed.stat().st_mode & 0o111, (key, settings[key])
        assert settings["HealthCheckProgram"] == "/usr/local/sbin/clusterhealth-healthcheck"
        # slurmctld reread it ...
        running = dict(
            line.split(" = ", 1) for line in cluster.scontrol("show", "config").splitlines() if " = " in line
        )
        for key in ("HealthCheckProgram", "Prolog", "Epilog"):
            assert running[key.ljust(23)].strip() == settings[key], key
        # ... and so did slurmd: a job's GPU is mapped while it runs, and no longer after.
        job = cluster.sbatch(f"srun true && echo started; {cluster.until('job')}", nodes=["n1"], gres="gpu:1")
        cluster.wait_output(job, "started")
        (gpu,) = cluster.job_gpus(job)["n1"]
        mapping = cluster.node_root("n1") / "run" / "clusterhealth" / "jobs"
        assert (mapping / str(gpu)).read_text() == f"{job}\n"
        cluster.go("job")
        assert cluster.wait_job(job) == "COMPLETED"
        assert not (mapping / str(gpu)).exists()
        assert cluster.node("n1").reason is None
