"""What a node's install puts in place, checked where the files will really be.

The installed tree is the README's own `sudo make install`, run as written into a throwaway root
(the `readme_installed` fixture; tests/node_root.py), laid over the machine's own /etc, /opt and
/usr/local (read-only overlay mounts in a private mount namespace, as root), so that the installed
unit, command, config and Slurm health check are seen at the paths they name, and nothing on the
machine is touched: `systemd-analyze verify` checks the installed unit against the installed
command, and a real slurmd runs the installed health check against the installed policy.
`DESTDIR`, `PREFIX`, `SYSCONFDIR`, `WHEEL=`, a reinstall and `make uninstall` are checked with a
staged install of the wheel.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, SCENARIOS, AgentProcess, require_tool
from .dist import BUILDS_FROM_THE_CLONE, VERSION, make, project_wheel, wheelhouse
from .node_root import in_root
from .slurm import SlurmCluster

pytestmark = BUILDS_FROM_THE_CLONE

UNIT = "usr/local/lib/systemd/system/clusterhealth.service"
REMEDIATE_UNIT = "usr/local/lib/systemd/system/clusterhealth-remediate.service"
CONFIG = "etc/clusterhealth/clusterhealth.yaml"


def install(root: Path, *extra: str) -> None:
    # Offline, from the wheels the image uses: the test installs exactly what ships.
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse())}
    make(
        "install", f"DESTDIR={root}", f"WHEEL={project_wheel()}", f"PYTHON={sys.executable}", *extra, env=env
    )


@pytest.fixture
def root(readme_installed: Path) -> Path:
    return readme_installed


def test_make_install_lays_out_a_node(root: Path) -> None:
    command = root / "usr/local/bin/clusterhealth"
    assert os.readlink(command) == "/opt/clusterhealth/bin/clusterhealth"
    assert (root / CONFIG).read_text() == (ROOT / "deploy" / "clusterhealth.yaml").read_text()
    assert (
        "--config /etc/clusterhealth/clusterhealth.yaml" in (root / "etc/default/clusterhealth").read_text()
    )
    unit = (root / UNIT).read_text()
    assert "\nExecStart=/usr/local/bin/clusterhealth agent $CLUSTERHEALTH_ARGS\n" in unit
    assert "\nEnvironmentFile=-/etc/default/clusterhealth\n" in unit
    # The remediator's unit, flags and config, for the one host that enables it.
    remediate = (root / REMEDIATE_UNIT).read_text()
    assert "\nExecStart=/usr/local/bin/clusterhealth remediate $CLUSTERHEALTH_REMEDIATE_ARGS\n" in remediate
    assert "\nEnvironmentFile=-/etc/default/clusterhealth-remediate\n" in remediate
    (flags,) = [
        line
        for line in (root / "etc/default/clusterhealth-remediate").read_text().splitlines()
        if line.startswith("CLUSTERHEALTH_REMEDIATE_ARGS=")
    ]
    assert "--config /etc/clusterhealth/remediate.yaml" in flags and "--act" not in flags  # dry-run
    assert (root / "etc/clusterhealth/remediate.yaml").read_text() == (
        ROOT / "deploy" / "remediate.yaml"
    ).read_text()
    check = root / "usr/local/sbin/clusterhealth-healthcheck"
    assert stat.S_IMODE(check.stat().st_mode) == 0o755
    npd = (root / "usr/local/share/clusterhealth/node-problem-detector-clusterhealth.json").read_text()
    assert '"path": "/usr/local/bin/clusterhealth"' in npd and "/etc/clusterhealth/clusterhealth.yaml" in npd
    assert (root / "usr/local/share/doc/clusterhealth/LICENSE").exists()


def test_systemd_analyze_verify_passes_on_the_installed_unit(root: Path) -> None:
    systemd_analyze = require_tool("systemd-analyze")
    result = in_root(
        root,
        f"{systemd_analyze} verify /{UNIT} /{REMEDIATE_UNIT}\n/usr/local/bin/clusterhealth --version\n",
        env={"PAGER": "cat"},
    )
    assert result.returncode == 0 and result.stderr == "", result.stdout + result.stderr
    assert result.stdout == f"clusterhealth {VERSION}\n"


def test_the_installed_unit_fails_verify_without_the_installed_command(root: Path) -> None:
    """What the verify test above relies on: verify looks for ExecStart='s command."""
    result = subprocess.run(
        [require_tool("systemd-analyze"), "verify", str(root / UNIT)], capture_output=True, text=True
    )
    assert "/usr/local/bin/clusterhealth" in result.stderr


def test_the_installed_health_check_drains_on_what_only_the_installed_policy_sees(
    root: Path, tmp_path: Path
) -> None:
    """An empty sysfs (no HCA) on a healthy simulated GPU node: only the installed policy's
    `hca_count: mlx5_[0-7] count 8` makes that CRITICAL. The file is the installed default config
    with the simulated node's paths added; the policy in it is untouched. A real slurmd runs the
    installed health check (HealthCheckProgram= as slurm.conf.example says) on a node that has the
    installed tree laid over its /etc, /opt and /usr/local (tests/slurm.py)."""
    (tmp_path / "sys").mkdir()
    config = root / CONFIG
    original = config.read_text()
    healthy = SCENARIOS / "h100-healthy.yaml"
    node = f"simulate: {healthy}\npaths: {{sysfs: {tmp_path / 'sys'}, kmsg: /dev/null}}\n"
    config.write_text(original + "\n" + node)
    settings = {
        "HealthCheckProgram": "/usr/local/sbin/clusterhealth-healthcheck",
        "HealthCheckInterval": "3600",
        "HealthCheckNodeState": "ANY",
    }
    try:
        # slurmd runs the health check as it starts, before it registers.
        with SlurmCluster(
            tmp_path / "slurm", nodes=1, gpus=1, shards=0, settings=settings, lower=root
        ) as cluster:
            drained = cluster.node("n1")
            assert drained.drained and drained.reason is not None, drained
            assert drained.reason.startswith("clusterhealth: hca_count mlx5_[0-7]: "), drained.reason
            assert [m.text.split(":")[0] for m in cluster.syslog("n1")] == ["drained n1"]
            # Without the file, the same node is not drained for it, and the log says why.
            config.unlink()
            cluster.resume("n1")
            again = cluster.restart_node("n1")
            assert "hca_count" not in (again.reason or "")
            logged = [m.text for m in cluster.syslog("n1")][1:]
            assert not any("hca_count" in m for m in logged), logged
            assert any("cannot read /etc/clusterhealth/clusterhealth.yaml" in m for m in logged), logged
    finally:
        config.write_text(original)


def test_a_staged_wheel_install_reinstall_and_uninstall(tmp_path: Path) -> None:
    """`make install WHEEL=... DESTDIR=... PREFIX=/usr SYSCONFDIR=/etc/site` (the README's other
    way, from `make dist`'s wheel; the wheel of `make wheels` is the same build), then again, then
    `make uninstall`. Every installed file that names the config or the environment file names
    them under SYSCONFDIR."""
    root = tmp_path / "root"
    site = ("PREFIX=/usr", "SYSCONFDIR=/etc/site")
    config = "etc/site/clusterhealth/clusterhealth.yaml"
    install(root, *site)
    # The virtualenv was made under DESTDIR but names only its final path.
    for script in (root / "opt/clusterhealth/bin").iterdir():
        if script.is_file() and not script.is_symlink():
            assert str(root) not in script.read_text(errors="replace"), script
    assert os.readlink(root / "usr/bin/clusterhealth") == "/opt/clusterhealth/bin/clusterhealth"
    unit = (root / "usr/lib/systemd/system/clusterhealth.service").read_text()
    assert "\nExecStart=/usr/bin/clusterhealth agent $CLUSTERHEALTH_ARGS\n" in unit
    assert "\nEnvironmentFile=-/etc/site/default/clusterhealth\n" in unit
    assert (
        "--config /etc/site/clusterhealth/clusterhealth.yaml"
        in (root / "etc/site/default/clusterhealth").read_text()
    )
    remediate = (root / "usr/lib/systemd/system/clusterhealth-remediate.service").read_text()
    assert "\nExecStart=/usr/bin/clusterhealth remediate $CLUSTERHEALTH_REMEDIATE_ARGS\n" in remediate
    assert "\nEnvironmentFile=-/etc/site/default/clusterhealth-remediate\n" in remediate
    remediate_flags = (root / "etc/site/default/clusterhealth-remediate").read_text()
    assert "--config /etc/site/clusterhealth/remediate.yaml" in remediate_flags
    assert (root / "etc/site/clusterhealth/remediate.yaml").exists()
    healthcheck = (root / "usr/sbin/clusterhealth-healthcheck").read_text()
    assert "CLUSTERHEALTH=${CLUSTERHEALTH:-/usr/bin/clusterhealth}" in healthcheck
    assert "CONFIG=${CLUSTERHEALTH_CONFIG:-/etc/site/clusterhealth/clusterhealth.yaml}" in healthcheck
    npd = (root / "usr/share/clusterhealth/node-problem-detector-clusterhealth.json").read_text()
    assert '"/etc/site/clusterhealth/clusterhealth.yaml"' in npd
    for installed in (healthcheck, npd, unit, remediate, remediate_flags):
        assert "/etc/clusterhealth" not in installed and "/etc/default" not in installed
    (root / config).write_text("collectors: {gpu: {interval_seconds: 5}}\n")
    install(root, *site)
    assert (root / config).read_text() == "collectors: {gpu: {interval_seconds: 5}}\n"
    assert (root / (config + ".dist")).read_text() == (ROOT / "deploy" / "clusterhealth.yaml").read_text()
    make("uninstall", f"DESTDIR={root}", *site)
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == [
        "etc/site/clusterhealth/clusterhealth.yaml",
        "etc/site/clusterhealth/clusterhealth.yaml.dist",
        "etc/site/clusterhealth/remediate.yaml",
        "etc/site/default/clusterhealth",
        "etc/site/default/clusterhealth-remediate",
    ]


def test_the_default_config_the_install_puts_in_place_starts_the_agent(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    """deploy/clusterhealth.yaml, on a simulated node: every probe of it scheduled (interval and
    crontab, with jitter), the agent serving. Only the state directory is moved out of /var."""
    config = yaml.safe_load((ROOT / "deploy" / "clusterhealth.yaml").read_text())
    config["probing"]["state_dir"] = str(tmp_path / "state")
    assert any(p.get("cron") and p.get("jitter_seconds") for p in config["probes"])
    path = tmp_path / "clusterhealth.yaml"
    path.write_text(yaml.safe_dump(config))
    (tmp_path / "sys").mkdir()
    agent = agent_process(
        "--config",
        str(path),
        "--simulate",
        str(SCENARIOS / "h100-healthy.yaml"),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--kmsg-path",
        "/dev/null",
    )
    assert agent.health()["collectors"]["probes"]["success"] is not False
    assert agent.proc.poll() is None
