"""Shared fixtures: simulated nodes, the real `clusterhealth` command, a running agent process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from hypothesis import HealthCheck, settings
from prometheus_client.parser import text_string_to_metric_families

from clusterhealth.exporters.sim import nvml as nvml_sim
from clusterhealth.exporters.sim.scenario import SCENARIO_DIR, parse_scenario

if TYPE_CHECKING:
    from .kube import KubeAPI
    from .slurm import SlurmCluster

ROOT = Path(__file__).resolve().parent.parent

# Every hypothesis test runs a bounded number of derandomized examples, so `make test` stays fast
# and repeatable; `CLUSTERHEALTH_FUZZ=explore` runs many more from a random seed to hunt for new
# failures. Loaded here, before any test module is imported: a @settings decorator takes the
# profile loaded when its module is imported, so one loaded by a test module misses the modules
# imported before it.
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "explore",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("CLUSTERHEALTH_FUZZ", "ci"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = SCENARIO_DIR
CLUSTERHEALTH = str(Path(sys.executable).parent / "clusterhealth")


def require_tool(name: str) -> str:
    """The path of a real tool a test runs. `make test` installs them (Makefile `sysdeps`), so a
    missing one fails the test rather than skipping it: a skipped test passes in CI unnoticed."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make test` installs it (Makefile sysdeps)")
    return path


def scenario(**overrides: Any) -> dict[str, Any]:
    """A small simulated node (2 H100s unless told otherwise) as scenario data."""
    data: dict[str, Any] = {"gpu_count": 2}
    data.update(overrides)
    return data


@pytest.fixture
def write_scenario(tmp_path: Path) -> Callable[..., Path]:
    def write(data: dict[str, Any], name: str = "scenario.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write


@pytest.fixture
def simulate() -> Iterator[Callable[[dict[str, Any]], nvml_sim.SimulatedLibrary]]:
    """Install a simulated NVML library in this process; removed after the test."""

    def install(data: dict[str, Any]) -> nvml_sim.SimulatedLibrary:
        return nvml_sim.install(parse_scenario(data, "<test>"))

    yield install
    nvml_sim.uninstall()


def samples(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of a text exposition, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(exposition: str, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels`; None when absent."""
    found = [v for (n, ls), v in samples(exposition).items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def run_cli(*args: str, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLUSTERHEALTH, *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


class AgentProcess:
    """`clusterhealth agent` as a real subprocess, listening on a port the kernel picked."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, **popen: Any):
        self.proc = subprocess.Popen(
            [CLUSTERHEALTH, "agent", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            **popen,
        )
        self.lines: list[str] = []
        self._port: int | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self._ready.wait(20) or self._port is None:
            self.stop()
            raise AssertionError("agent did not start:\n" + self.log())

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            m = re.search(r"serving /metrics and /healthz on [^ ]+:(\d+)", line)
            if m:
                self._port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    def log(self) -> str:
        return "\n".join(self.lines)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def get(self, path: str, timeout: float = 5) -> tuple[int, bytes, float]:
        start = time.monotonic()
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            body = response.read()
            return response.status, body, time.monotonic() - start

    def metrics(self) -> str:
        return self.get("/metrics")[1].decode()

    def health(self) -> dict[str, Any]:
        return json.loads(self.get("/healthz")[1])

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; agent log:\n{self.log()}")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def agent_process() -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, **popen: Any) -> AgentProcess:
        agent = AgentProcess(list(args), env, **popen)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: a test (or a module's tests, or an xdist group) of tens of seconds: started first, so "
        "that `make test`'s workers are not left waiting on it at the end (tests/README.md)",
    )


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture set up once for more than one test (module, class or
    package scope): such a module runs on one worker, which sets the fixture up once."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in ("module", "class", "package")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `make test`'s workers (pytest-xdist, `--dist loadgroup`): a module whose tests share a
    module-scoped fixture is one group, so its Prometheus, agents or lab start once; and the slow
    groups and tests go first, in collection order, each group's tests kept together
    (tests/README.md)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))

    def unit(item: pytest.Item) -> str:
        marker = item.get_closest_marker("xdist_group")
        return str(marker.args[0]) if marker is not None else item.nodeid

    slow = {unit(item) for item in items if item.get_closest_marker("slow") is not None}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(unit(item), index)
    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (unit(item) not in slow, first_seen[unit(item)], order[id(item)]))


@pytest.fixture(scope="session")
def readme_installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway root holding what the README's systemd-node install put in place: its
    `sudo make install` run as written, once a session (tests/node_root.py says how). Tests that
    change a file in it put it back."""
    from .node_root import readme_install

    return readme_install(tmp_path_factory.mktemp("readme-install"))


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One real Slurm cluster of 8 nodes for the session (tests/slurm.py); tests take it through
    `slurm`, which resets it first."""
    from .slurm import SlurmCluster

    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=8) as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_session: SlurmCluster) -> SlurmCluster:
    """The session's Slurm cluster as a fresh one: no job, every node IDLE with no reason."""
    slurm_session.reset()
    return slurm_session


@pytest.fixture(scope="session")
def kube_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPI]:
    """One real Kubernetes API (etcd and kube-apiserver 1.20; tests/kube.py) for the session;
    tests take it through `kube`, which resets it first."""
    from .kube import KubeAPI

    with KubeAPI(tmp_path_factory.mktemp("kube")) as api:
        yield api


@pytest.fixture
def kube(kube_session: KubeAPI) -> KubeAPI:
    """The session's Kubernetes API with no Node and no object a test left behind."""
    kube_session.reset()
    return kube_session


@pytest.fixture(scope="session")
def fabric_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Simulated pairwise groups backfilled into three real Prometheus servers (tests/fabric_store.py),
    once a session for every test that reads them."""
    from .fabric_store import serve

    yield from serve(tmp_path_factory)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's chromium without network, driven through the DevTools protocol (tests/browser.py)."""
    from .browser import Browser

    opened = Browser(tmp_path_factory.mktemp("browser"))
    try:
        yield opened
    finally:
        opened.close()
