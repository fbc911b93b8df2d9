"""The systemd unit: `systemd-analyze verify` finds nothing, `systemd-analyze security` scores it
under the recorded threshold, and the agent speaks the notify protocol to a socket the test binds."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from clusterhealth.agent.notify import Notifier

from .conftest import CLUSTERHEALTH, SCENARIOS, AgentProcess
from .mixin import ROOT
from .prom import binary

UNIT = ROOT / "deploy" / "systemd" / "clusterhealth.service"
ENVIRONMENT = ROOT / "deploy" / "systemd" / "clusterhealth.default"
# `systemd-analyze security --offline=yes` exposure (0 best, 10 worst); README records it.
SECURITY_THRESHOLD = 3.0


def systemd_analyze() -> str:
    return binary("systemd-analyze", "systemd")


@pytest.fixture
def unit_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart= pointing at this virtualenv's command, which exists here:
    `verify` checks that the binary exists, and /usr/local/bin/clusterhealth does not on a test
    machine. Nothing else is changed."""
    text = UNIT.read_text()
    assert "\nExecStart=/usr/local/bin/clusterhealth agent $CLUSTERHEALTH_ARGS\n" in text
    copy = tmp_path / "clusterhealth.service"
    copy.write_text(text.replace("ExecStart=/usr/local/bin/clusterhealth", f"ExecStart={CLUSTERHEALTH}"))
    return copy


def test_systemd_analyze_verify_is_silent(unit_copy: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "verify", str(unit_copy)], capture_output=True, text=True, cwd=unit_copy.parent
    )
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", (
        result.stdout + result.stderr
    )


def test_systemd_analyze_verify_can_fail(tmp_path: Path) -> None:
    """The verify test above would notice a broken unit."""
    broken = tmp_path / "clusterhealth.service"
    broken.write_text(UNIT.read_text().replace("Type=notify", "Type=notyfy"))
    result = subprocess.run([systemd_analyze(), "verify", str(broken)], capture_output=True, text=True)
    assert "notyfy" in result.stderr


def test_security_exposure_is_under_the_threshold(unit_copy: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", str(unit_copy)], capture_output=True, text=True
    )
    m = re.search(r"Overall exposure level for clusterhealth\.service: ([0-9.]+)", result.stdout)
    assert m, result.stdout + result.stderr
    assert float(m.group(1)) < SECURITY_THRESHOLD, result.stdout
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert f"under {SECURITY_THRESHOLD}" in deploy, "docs/deploy.md records the threshold"


def test_the_unit_keeps_what_nvml_kmsg_and_probes_need() -> None:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    assert settings["Type"] == ["notify"]
    assert settings["EnvironmentFile"] == ["-/etc/default/clusterhealth"]
    for absent in (
        "PrivateDevices",
        "DeviceAllow",
        "ProtectClock",
        "ProtectKernelLogs",
        "MemoryDenyWriteExecute",
    ):
        assert absent not in settings, absent
    assert settings["CapabilityBoundingSet"] == ["CAP_SYSLOG CAP_IPC_LOCK"]
    assert "WatchdogSec" in settings
    assert re.fullmatch(r'CLUSTERHEALTH_ARGS="[^"]*"', ENVIRONMENT.read_text().splitlines()[-1])


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
        sock.bind(address)
    else:
        name = f"clusterhealth-test-{time.monotonic_ns()}"
        sock.bind("\0" + name)
        address = "@" + name
    sock.settimeout(0.2)
    yield address, sock
    sock.close()


class Listener:
    """Reads the notify socket in the background, as systemd does."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.got: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def wait_for(self, wanted: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(wanted in message.splitlines() for message in list(self.got)):
                return
            time.sleep(0.05)
        raise AssertionError(f"no {wanted} within {timeout}s; received {self.got}")

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)


def test_the_agent_notifies_ready_watchdog_and_stopping(
    notify_socket: tuple[str, socket.socket],
    agent_process: Callable[..., AgentProcess],
    tmp_path: Path,
) -> None:
    address, sock = notify_socket
    env_dump = tmp_path / "probe-env.txt"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "probing": {"state_dir": str(tmp_path / "state")},
                "probes": [
                    {
                        "name": "env",
                        "kind": "iperf3",
                        "argv": ["sh", "-c", f"env > {env_dump}"],
                        "interval_seconds": 1,
                        "jitter_seconds": 0,
                    }
                ],
            }
        )
    )
    (tmp_path / "sys").mkdir()
    (tmp_path / "kmsg").touch()
    agent = agent_process(
        "--config",
        str(config),
        "--simulate",
        str(SCENARIOS / "h100-healthy.yaml"),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--kmsg-path",
        str(tmp_path / "kmsg"),
        env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"},
    )
    listener = Listener(sock)
    listener.wait_for("READY=1", 10)
    assert agent.get("/healthz")[0] == 200  # READY=1 came once the agent serves
    listener.wait_for("WATCHDOG=1", 5)
    agent.wait_for(lambda: env_dump.exists() and env_dump.stat().st_size > 0, 20, "a probe run")
    environment = env_dump.read_text()
    assert "PATH=" in environment
    assert "NOTIFY_SOCKET" not in environment and "WATCHDOG_USEC" not in environment
    assert agent.stop() == 0
    listener.wait_for("STOPPING=1", 5)
    listener.close()
    assert listener.got.index("READY=1") < listener.got.index("STOPPING=1") == len(listener.got) - 1


def test_without_systemd_nothing_is_sent_and_nothing_breaks() -> None:
    environ = {"PATH": "/bin"}
    notifier = Notifier.from_environ(environ)
    assert notifier.notify("READY=1") is False
    assert notifier.wait_seconds(5) == 5
    notifier.watchdog()


def test_a_watchdog_meant_for_another_process_is_ignored() -> None:
    environ = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    notifier = Notifier.from_environ(environ)
    assert notifier.watchdog_usec is None and environ == {}
    assert Notifier.from_environ({"WATCHDOG_USEC": "1000000"}).wait_seconds(5) == 0.5


def test_a_reader_that_does_not_keep_up_never_blocks_the_agent(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "full.sock"))
    notifier = Notifier(str(tmp_path / "full.sock"), 1_000_000)
    sent: list[bool] = []
    sender = threading.Thread(target=lambda: sent.extend(notifier.notify("WATCHDOG=1") for _ in range(500)))
    sender.start()
    sender.join(30)
    sock.close()
    assert not sender.is_alive() and len(sent) == 500
    assert sent[0] is True and sent[-1] is False  # the queue filled up and later beats were dropped


# --- the remediator's unit (deploy/systemd/clusterhealth-remediate.service) --------------------

REMEDIATE_UNIT = ROOT / "deploy" / "systemd" / "clusterhealth-remediate.service"
REMEDIATE_ENVIRONMENT = ROOT / "deploy" / "systemd" / "clusterhealth-remediate.default"
REMEDIATE_SECURITY_THRESHOLD = 2.5


@pytest.fixture
def remediate_unit(tmp_path: Path) -> Path:
    text = REMEDIATE_UNIT.read_text()
    assert "\nExecStart=/usr/local/bin/clusterhealth remediate $CLUSTERHEALTH_REMEDIATE_ARGS\n" in text
    copy = tmp_path / "clusterhealth-remediate.service"
    copy.write_text(text.replace("ExecStart=/usr/local/bin/clusterhealth", f"ExecStart={CLUSTERHEALTH}"))
    return copy


def test_the_remediators_unit_verifies_and_scores_under_its_threshold(remediate_unit: Path) -> None:
    verify = subprocess.run(
        [systemd_analyze(), "verify", str(remediate_unit)],
        capture_output=True,
        text=True,
        cwd=remediate_unit.parent,
    )
    assert verify.returncode == 0 and verify.stdout == verify.stderr == "", verify.stdout + verify.stderr
    security = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", str(remediate_unit)], capture_output=True, text=True
    )
    m = re.search(r"Overall exposure level for clusterhealth-remediate\.service: ([0-9.]+)", security.stdout)
    assert m and float(m.group(1)) < REMEDIATE_SECURITY_THRESHOLD, security.stdout + security.stderr
    assert f"under {REMEDIATE_SECURITY_THRESHOLD}" in (ROOT / "docs" / "remediation.md").read_text()


def test_the_remediators_unit_starts_in_dry_run_with_its_state_where_the_config_says() -> None:
    from clusterhealth.fleet.remediate.config import load

    settings: dict[str, list[str]] = {}
    for line in REMEDIATE_UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    assert settings["CapabilityBoundingSet"] == [""]
    (args,) = re.findall(r'^CLUSTERHEALTH_REMEDIATE_ARGS="([^"]*)"$', REMEDIATE_ENVIRONMENT.read_text(), re.M)
    assert "--act" not in args.split() and "--backend slurm" in args
    config = load(ROOT / "deploy" / "remediate.yaml")
    assert config.slurm.state_dir == "/var/lib/" + settings["StateDirectory"][0]
    assert "--config /etc/clusterhealth/remediate.yaml" in args
