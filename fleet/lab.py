"""`clusterhealth lab`: a pairwise group on N hosts made of network namespaces, on one switch or on
leaf switches joined by a spine, with a host, a path, a leaf's uplink or a whole leaf degraded on
request, and `analyze`'s verdict on it.

What it builds (root only, every name under a prefix of its own so that labs can run side by side,
every address inside its own namespaces):

* a switch namespace (``PREFIX-sw``) with a bridge, on which Prometheus listens (10.77.0.254);
* with ``--leaves M`` (M > 1), that switch is the spine, and M leaf namespaces ``PREFIX-l1``..
  ``PREFIX-lM`` each hold a leaf bridge joined to the spine's by a veth pair, the leaf's *uplink*
  (port ``uplink`` on the leaf, ``lJ`` on the spine), shaped to the leaf's hosts times the common rate
  (non-blocking); the hosts are spread over the leaves in blocks (h1..h4 on leaf1 for 16 hosts on
  4 leaves), and the members file says each host's leaf;
* N host namespaces ``PREFIX-h1``..``PREFIX-hN``, each with a veth pair to its switch (the one
  bridge, or its leaf's) and the address 10.77.0.i;
* every host link shaped to one common rate with ``tc`` in both directions (tbf on the host's
  end and on the bridge's end), so that the machine's cores are not what the probes measure;
* ``--degrade-host hK``: both ends of hK's link shaped to ``--degrade-factor`` of the rate (tbf;
  half by default); ``--degrade-path hA-hB``: on hA's end an htb class at that fraction of the rate
  with a u32 filter on hB's address, and the same on hB's end towards hA (both directions, as the
  meetings' direction alternates); ``--degrade-uplink leafJ``: both ends of the leaf's uplink
  shaped to the factor of one host link's rate (tbf), so that every meeting across it runs at that
  fraction or less, shared; ``--degrade-leaf leafJ``: every port of the leaf bridge (to its hosts
  and its uplink) shaped so, as a leaf switch that lost its capacity would carry. Several at once,
  so long as they do not overlap (a host or a path away from a degraded leaf or uplink);
* a real agent per host namespace (``clusterhealth agent``, node name hI) with one iperf3 pairwise
  group, its members file written as an inventory tool would;
* the Debian Prometheus scraping the agents every second; ``--restart-prometheus K`` stops it three
  quarters into round K and starts it again a quarter into round K+1, so that the series that
  ended meanwhile (the partners of round K) carry no staleness marker.

It waits for the first round that starts with every agent up, lets K rounds go by, runs `analyze`
(in-process, from the switch namespace) after each, and prints the last verdict: the table or the
JSON of SPEC, plus a ``lab`` object with the history and, in ``remediate``, what `clusterhealth
remediate --fabric` would do in dry-run over the hosts (its orders, priced). Beside it, the report
of the last reading (`clusterhealth report`'s page, fleet/report/) is written to ``--report``
(default ``lab-PREFIX.html`` in the current directory) and its path printed, when the report extra
is installed. Everything it made (processes, namespaces and with them the links, its working
directory) is removed at the end, on Ctrl-C and on failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import yaml

from clusterhealth.checks.fabric import analysis, topology
from clusterhealth.checks.fabric.schedule import RoundTiming, Schedule, round_at
from clusterhealth.checks.probes import runner
from clusterhealth.fleet import analyze as analyzing
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.prometheus import NoVerdict, Prometheus

log = logging.getLogger("clusterhealth.lab")

T = TypeVar("T")

EXIT_USAGE, EXIT_LAB_FAILED, EXIT_INTERRUPTED = 2, 4, 130
SUBNET = "10.77.0"  # inside the lab's own namespaces only
SWITCH_ADDRESS = f"{SUBNET}.254"
AGENT_PORT = 9845
PROMETHEUS_PORT = 9090
GROUP = "fabric"
MAX_HOSTS = 64
# The group's timing in the lab: one kernel clock (no skew but scheduling), one-second iperf3 runs.
RUN_SECONDS, SKEW_SECONDS, STARTUP_SECONDS, CONFIRM_RUNS = 3.0, 0.5, 1.0, 2
SCRAPE_SECONDS = 1.0
_CLONE_NEWNET = 0x40000000


def minimum_period() -> float:
    return RoundTiming(1e9, RUN_SECONDS, SKEW_SECONDS, STARTUP_SECONDS, CONFIRM_RUNS).round_length


class LabError(Exception):
    """The lab cannot be built or run; the message says why."""


@dataclass(frozen=True)
class LabSpec:
    hosts: int
    rounds: int = 5
    period: float = 20.0
    rate_mbit: float = 100.0
    degrade_host: str | None = None
    # Two hosts, or FIRST: the pair that meets first (a path is found when its ends meet, once in
    # N-1 rounds; the pair that meets first makes the shortest lab).
    degrade_path: tuple[str, str] | str | None = None
    factor: float = 0.5  # of the common rate, for what is degraded
    restart_prometheus: int | None = None  # the round across whose end Prometheus is restarted
    leaves: int = 1  # leaf switches joined by a spine; 1: every host on one switch
    degrade_uplink: str | None = None  # a leaf whose uplink is degraded
    degrade_leaf: str | None = None  # a leaf degraded whole
    report: Path | None = None  # where the report goes; None: lab-PREFIX.html in the current directory

    def leaf_of(self, host: str) -> str | None:
        """The leaf a host hangs off (None on a lab of one switch): hosts in blocks, h1 first."""
        if self.leaves <= 1:
            return None
        return f"leaf{(int(host[1:]) - 1) * self.leaves // self.hosts + 1}"

    def leaf_map(self) -> dict[str, list[str]]:
        """Each leaf's hosts (empty on a lab of one switch)."""
        found: dict[str, list[str]] = {}
        for i in range(1, self.hosts + 1):
            if (leaf := self.leaf_of(f"h{i}")) is not None:
                found.setdefault(leaf, []).append(f"h{i}")
        return found

    def clear_of_faults(self, host: str) -> bool:
        """Whether a host is away from the degraded host, leaf and uplink (a path may use it)."""
        leaf = self.leaf_of(host)
        degraded = (self.degrade_leaf, self.degrade_uplink)
        return host != self.degrade_host and (leaf is None or leaf not in degraded)

    def problem(self) -> str | None:
        """None when the lab can be built as asked; otherwise what was expected."""
        names = {f"h{i}" for i in range(1, self.hosts + 1)}
        leaves = {f"leaf{j}" for j in range(1, self.leaves + 1)}
        if not 2 <= self.hosts <= MAX_HOSTS:
            return f"--hosts: expected 2 to {MAX_HOSTS} hosts"
        if not 1 <= self.leaves <= self.hosts:
            return f"--leaves: expected 1 to {self.hosts} (the hosts are spread over them)"
        for flag, leaf in (("--degrade-uplink", self.degrade_uplink), ("--degrade-leaf", self.degrade_leaf)):
            if leaf is None:
                continue
            if self.leaves < 3:
                return f"{flag}: expected --leaves of 3 or more (two leaves share every meeting across)"
            if leaf not in leaves:
                return f"{flag}: expected one of leaf1..leaf{self.leaves}"
        if self.degrade_uplink is not None and self.degrade_uplink == self.degrade_leaf:
            return "--degrade-uplink and --degrade-leaf: expected two different leaves"
        if self.rounds < 1:
            return "--rounds: expected at least 1"
        if self.period < minimum_period():
            return f"--period: expected at least {minimum_period():g} s (the lab's one-second iperf3 rounds)"
        if self.degrade_host is not None and self.degrade_host not in names:
            return f"--degrade-host: expected one of h1..h{self.hosts}"
        degraded_leaves = {leaf for leaf in (self.degrade_leaf, self.degrade_uplink) if leaf is not None}
        if self.degrade_host is not None and self.leaf_of(self.degrade_host) in degraded_leaves:
            return "--degrade-host: expected a host away from the degraded leaf or uplink"
        if isinstance(self.degrade_path, tuple):
            a, b = self.degrade_path
            if a not in names or b not in names or a == b:
                return f"--degrade-path: expected two different hosts among h1..h{self.hosts}, as hA-hB"
            if not (self.clear_of_faults(a) and self.clear_of_faults(b)):
                return "--degrade-path: expected two hosts away from the degraded host, leaf or uplink"
        if not 1 <= self.rate_mbit <= 10_000:
            return "--rate: expected 1 to 10000 Mbit/s"
        if not 0 < self.factor < 1:
            return "--degrade-factor: expected a fraction of the rate between 0 and 1, e.g. 0.25"
        if self.restart_prometheus is not None and not 1 <= self.restart_prometheus < self.rounds:
            return "--restart-prometheus: expected a round before the last, from 1 to --rounds - 1"
        if self.report is not None and (self.report.is_dir() or not self.report.absolute().parent.is_dir()):
            return f"--report: expected a file in an existing directory, got {self.report}"
        return None

    def expected_suspects(self, path: tuple[str, str] | None) -> list[tuple[str, str]]:
        """(kind, suspect) of each fault, as analyze should name it, given the path degraded."""
        found = []
        if self.degrade_uplink is not None:
            found.append(("uplink", self.degrade_uplink))
        if self.degrade_leaf is not None:
            found.append(("leaf", self.degrade_leaf))
        if self.degrade_host is not None:
            found.append(("host", self.degrade_host))
        if path is not None:
            found.append(("path", "<->".join(sorted(path))))
        return found

    def expected_suspect(self, path: tuple[str, str] | None) -> tuple[str, str] | None:
        """The first of ``expected_suspects``, for a lab of one fault."""
        return next(iter(self.expected_suspects(path)), None)


FIRST = "first"  # --degrade-path first: the first pair to meet, away from the other faults


def parse_path(text: str) -> tuple[str, str] | str:
    if text == FIRST:
        return FIRST
    m = re.fullmatch(r"(h\d+)-(h\d+)", text)
    if not m:
        raise ValueError(f"--degrade-path: expected hA-hB (e.g. h2-h5) or {FIRST}, got {text!r}")
    return m.group(1), m.group(2)


# --- running things ------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def in_namespace(name: str, work: Callable[[], T]) -> T:
    """Run ``work`` on a thread that entered network namespace ``name`` (setns affects one thread)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc().setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {name}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = work()
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def _command(*argv: str, timeout: float = 30) -> str:
    """One short command (ip, tc) through the probe runner; LabError with its output on failure."""
    result = runner.run(argv, timeout=timeout, max_output_bytes=65536)
    if not result.completed or result.exit_code != 0:
        detail = (result.error or result.stderr.strip() or result.stdout.strip() or "no output")[-500:]
        raise LabError(f"{result.command} failed: {detail}")
    return result.stdout


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


# --- the lab ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spawned:
    """A long-running process of the lab: an agent or Prometheus, in its namespace."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def exited(self) -> str | None:
        """Why it is no longer running, with the end of its log; None while it runs."""
        if self.popen.poll() is None:
            return None
        try:
            tail = self.log.read_text(errors="replace").strip()[-600:] or "no output"
        except OSError:
            tail = "no log"
        return f"{self.name} exited {self.popen.returncode}: {tail}"


@dataclass
class Lab:
    spec: LabSpec
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
    prefix: str = field(default_factory=lambda: f"chl{secrets.token_hex(3)}")
    namespaces: list[str] = field(default_factory=list)
    processes: list[Spawned] = field(default_factory=list)
    workdir: Path | None = None
    tools: dict[str, str] = field(default_factory=dict)
    path: tuple[str, str] | None = None  # the path degraded, once chosen (at the first round)
    history: pairwise.History | None = None  # the last reading, for the report

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def host_ns(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i}"

    # -- building --------------------------------------------------------------------------------

    def leaf_ns(self, j: int) -> str:
        return f"{self.prefix}-l{j}"

    def switch_of(self, i: int) -> str:
        """The namespace of host i's switch: its leaf's, or the one switch."""
        leaf = self.spec.leaf_of(f"h{i}")
        return self.switch if leaf is None else self.leaf_ns(int(leaf.removeprefix("leaf")))

    def build(self) -> None:
        for tool in ("ip", "tc", "iperf3", "prometheus"):
            path = shutil.which(tool)
            if path is None:
                raise LabError(f"{tool} is missing (Debian packages iproute2, iperf3, prometheus)")
            self.tools[tool] = path
        existing = _command(self.tools["ip"], "netns", "list")
        if self.prefix in existing:
            raise LabError(f"namespaces named {self.prefix}-* exist already")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"clusterhealth-lab-{self.prefix}-"))
        spec = self.spec
        on = f" on {spec.leaves} leaves" if spec.leaves > 1 else ""
        self.say(f"lab {self.prefix}: {spec.hosts} hosts{on}, work directory {self.workdir}")
        ip = self.tools["ip"]
        self._add_namespace(self.switch)
        _command(ip, "-n", self.switch, "link", "set", "lo", "up")
        _command(ip, "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _command(ip, "-n", self.switch, "addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0")
        _command(ip, "-n", self.switch, "link", "set", "br0", "up")
        leaves = spec.leaf_map()
        for j in range(1, len(leaves) + 1):
            self._add_leaf(j, len(leaves[f"leaf{j}"]))
        for i in range(1, spec.hosts + 1):
            ns = self.host_ns(i)
            switch = self.switch_of(i)
            self._add_namespace(ns)
            # Created in the switch namespace with its peer in the host's: nothing in ours.
            _command(
                ip, "-n", switch, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", ns
            )  # fmt: skip
            _command(ip, "-n", switch, "link", "set", f"h{i}", "master", "br0")
            _command(ip, "-n", switch, "link", "set", f"h{i}", "up")
            _command(ip, "-n", ns, "link", "set", "lo", "up")
            _command(ip, "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _command(ip, "-n", ns, "link", "set", "eth0", "up")
            self._shape(i, switch)
        degraded = spec.rate_mbit * spec.factor
        if spec.degrade_host is not None:
            self.say(
                f"lab {self.prefix}: host {spec.degrade_host} degraded to "
                f"{degraded:g} of {spec.rate_mbit:g} Mbit/s (tbf)"
            )
        if spec.degrade_uplink is not None:
            self.say(
                f"lab {self.prefix}: {spec.degrade_uplink}'s uplink degraded to {degraded:g} Mbit/s (tbf)"
            )
        if spec.degrade_leaf is not None:
            self.say(
                f"lab {self.prefix}: {spec.degrade_leaf}'s every port degraded to {degraded:g} Mbit/s (tbf)"
            )

    def _add_leaf(self, j: int, hosts: int) -> None:
        """Leaf j's bridge in its namespace, joined to the spine's by its uplink."""
        ip, ns, spec = self.tools["ip"], self.leaf_ns(j), self.spec
        self._add_namespace(ns)
        _command(ip, "-n", ns, "link", "set", "lo", "up")
        _command(ip, "-n", ns, "link", "add", "br0", "type", "bridge")
        _command(ip, "-n", ns, "link", "set", "br0", "up")
        _command(
            ip,
            "-n",
            self.switch,
            "link",
            "add",
            f"l{j}",
            "type",
            "veth",
            "peer",
            "name",
            "uplink",
            "netns",
            ns,
        )
        for where, port in ((self.switch, f"l{j}"), (ns, "uplink")):
            _command(ip, "-n", where, "link", "set", port, "master", "br0")
            _command(ip, "-n", where, "link", "set", port, "up")
        # Non-blocking: as much as its hosts' links together. A degraded uplink carries one link's
        # share both ways; a degraded leaf's own port does (the spine's end is the spine's).
        leaf, whole = f"leaf{j}", spec.rate_mbit * hosts
        slow = spec.rate_mbit * spec.factor
        up = slow if leaf in (spec.degrade_uplink, spec.degrade_leaf) else whole
        down = slow if leaf == spec.degrade_uplink else whole
        self._tc(ns, "qdisc", "add", "dev", "uplink", "root", *self._tbf(up))
        self._tc(self.switch, "qdisc", "add", "dev", f"l{j}", "root", *self._tbf(down))

    def _add_namespace(self, name: str) -> None:
        _command(self.tools["ip"], "netns", "add", name)
        self.namespaces.append(name)

    def _tc(self, ns: str, *args: str) -> None:
        _command(self.tools["ip"], "netns", "exec", ns, self.tools["tc"], *args)

    @staticmethod
    def _tbf(rate_mbit: float) -> list[str]:
        # A burst of a few GSO packets: veth hands tbf 64 KB segments.
        return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", "256kb", "latency", "20ms"]

    def _shape(self, i: int, switch: str) -> None:
        """The host's link at the common rate, both ways (its switch's end slow on a degraded leaf)."""
        spec = self.spec
        rate = spec.rate_mbit * (spec.factor if spec.degrade_host == f"h{i}" else 1)
        on_slow_leaf = spec.degrade_leaf is not None and spec.leaf_of(f"h{i}") == spec.degrade_leaf
        port = rate * spec.factor if on_slow_leaf else rate
        self._tc(self.host_ns(i), "qdisc", "add", "dev", "eth0", "root", *self._tbf(rate))
        self._tc(switch, "qdisc", "add", "dev", f"h{i}", "root", *self._tbf(port))

    def _degrade_path(self, first: int) -> tuple[str, str] | None:
        """Shape the path asked for (before the first round), and say which it is."""
        if self.spec.degrade_path is None:
            return None
        if isinstance(self.spec.degrade_path, tuple):
            a, b = self.spec.degrade_path
        else:
            a, b = self._first_pair(first)
        self.path = (a, b)
        self._shape_path(a, b)
        rate, slow = self.spec.rate_mbit, self.spec.rate_mbit * self.spec.factor
        self.say(f"lab {self.prefix}: path {a}<->{b} degraded to {slow:g} of {rate:g} Mbit/s (htb + u32)")
        return a, b

    def _first_pair(self, first: int) -> tuple[str, str]:
        """The pair that meets first from round ``first`` on, away from every other fault; inside a
        leaf when a leaf or an uplink is degraded too (a path across is confirmed once both ends
        were fine across, and on four leaves one of them meets the degraded leaf in every round
        across)."""
        spec, schedule = self.spec, self.schedule()
        inside = spec.degrade_leaf is not None or spec.degrade_uplink is not None
        for r in range(first, first + max(schedule.cycle, 1)):
            pairs = [
                sorted((p.server, p.client), key=topology.natural)
                for p in schedule.matching(r).pairs
                if spec.clear_of_faults(p.server)
                and spec.clear_of_faults(p.client)
                and (not inside or spec.leaf_of(p.server) == spec.leaf_of(p.client))
            ]
            if pairs:
                a, b = min(pairs, key=lambda pair: [topology.natural(h) for h in pair])
                return a, b
        raise LabError("no pair away from the other faults ever meets")

    def schedule(self) -> Schedule:
        """The group's schedule, as its agents derive it from the members file the lab writes."""
        hosts = [f"h{i}" for i in range(1, self.spec.hosts + 1)]
        return Schedule(hosts, GROUP, {h: leaf for h in hosts if (leaf := self.spec.leaf_of(h))})

    def _shape_path(self, a: str, b: str) -> None:
        rate, slow = self.spec.rate_mbit, self.spec.rate_mbit * self.spec.factor
        for here, there in ((a, b), (b, a)):
            ns, peer = self.host_ns(int(here[1:])), self.address(int(there[1:]))
            self._tc(ns, "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
            # 1:10 every other destination at the common rate, 1:20 the partner's at the slow one.
            for classid, mbit in (("1:10", rate), ("1:20", slow)):
                self._tc(
                    ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", classid,
                    "htb", "rate", f"{mbit:g}mbit", "quantum", "60000",
                )  # fmt: skip
            self._tc(
                ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
                "u32", "match", "ip", "dst", f"{peer}/32", "flowid", "1:20",
            )  # fmt: skip

    def set_degraded(self, degraded: bool) -> None:
        """Take the degraded host or path back to the common rate (False) or degrade it again
        (True), as built: for a workload measured on the same links with and without the fault
        (benchmarks/impact.py; a leaf or an uplink stays as built)."""
        rate = self.spec.rate_mbit
        if self.spec.degrade_host is not None:
            i = int(self.spec.degrade_host[1:])
            shaped = self._tbf(rate * self.spec.factor if degraded else rate)
            self._tc(self.host_ns(i), "qdisc", "replace", "dev", "eth0", "root", *shaped)
            self._tc(self.switch_of(i), "qdisc", "replace", "dev", f"h{i}", "root", *shaped)
        elif self.path is not None:
            for end in self.path:
                ns = self.host_ns(int(end[1:]))
                self._tc(ns, "qdisc", "replace", "dev", "eth0", "root", *self._tbf(rate))
            if degraded:
                self._shape_path(*self.path)

    # -- starting --------------------------------------------------------------------------------

    def start(self) -> None:
        assert self.workdir is not None
        members = {f"h{i}": self.address(i) for i in range(1, self.spec.hosts + 1)}
        members_file = self.workdir / "members.yaml"
        # As an inventory tool writes it: each host's address, and its leaf when there are leaves.
        members_file.write_text(
            "".join(
                f"{name}: {{address: {address}, leaf: {leaf}}}\n"
                if (leaf := self.spec.leaf_of(name))
                else f"{name}: {address}\n"
                for name, address in members.items()
            )
        )
        iperf3 = self.tools["iperf3"]
        group = {
            "name": GROUP,
            "kind": "iperf3",
            "members_file": str(members_file),
            "period_seconds": self.spec.period,
            "port": 5201,
            "confirm_port": 5202,
            "timeout_seconds": RUN_SECONDS,
            "skew_seconds": SKEW_SECONDS,
            "startup_seconds": STARTUP_SECONDS,
            "confirm_runs": CONFIRM_RUNS,
            "server_argv": [iperf3, "-s", "-1", "-B", "{address}", "-p", "{port}", "-J"],
            "client_argv": [
                *(iperf3, "-c", "{peer}", "-B", "{address}", "-p", "{port}", "-t", "1", "-J"),
                *("--connect-timeout", "1000"),
            ],
            "expect": f"{self.spec.rate_mbit:g} Mb/s",
        }
        for i in range(1, self.spec.hosts + 1):
            home = self.workdir / f"h{i}"
            home.mkdir()
            config = {
                "node_name": f"h{i}",
                "listen": f"{self.address(i)}:{AGENT_PORT}",
                "collectors": {
                    "gpu": {"enabled": False},
                    "kernel_log": {"enabled": False},
                    "rdma": {"enabled": False},
                    "audit": {"enabled": False},
                    "probes": {"interval_seconds": 0.5},
                },
                "probing": {"state_dir": str(home / "state"), "check_gpus_idle": False},
                "pairwise_groups": [group],
            }
            (home / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            agent = [
                sys.executable,
                "-m",
                "clusterhealth.agent.cli",
                "agent",
                "--config",
                str(home / "config.yaml"),
            ]
            self._spawn(f"the agent of h{i}", self.host_ns(i), agent, home / "agent.log")
        targets = [f"{self.address(i)}:{AGENT_PORT}" for i in range(1, self.spec.hosts + 1)]
        prometheus_yml = self.workdir / "prometheus.yml"
        prometheus_yml.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_SECONDS:g}s",
                        "scrape_timeout": f"{SCRAPE_SECONDS:g}s",
                    },
                    "scrape_configs": [
                        {"job_name": "clusterhealth", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        self._start_prometheus(prometheus_yml)
        self._wait_until_up()

    def _start_prometheus(self, config: Path) -> None:
        assert self.workdir is not None
        prometheus = [
            self.tools["prometheus"],
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address={SWITCH_ADDRESS}:{PROMETHEUS_PORT}",
            "--log.level=warn",
        ]
        self._spawn("prometheus", self.switch, prometheus, self.workdir / "prometheus.log")

    def _restart_prometheus(self, stop_at: float, start_at: float) -> dict[str, Any]:
        """Stop Prometheus at ``stop_at`` and start it again on the same data at ``start_at``."""
        assert self.workdir is not None
        self._sleep_until(stop_at)
        (running,) = [p for p in self.processes if p.name == "prometheus"]
        os.killpg(running.popen.pid, signal.SIGTERM)
        running.popen.wait(30)
        self.processes.remove(running)
        stopped = time.time()
        self.say(f"lab {self.prefix}: Prometheus stopped")
        self._sleep_until(start_at)
        self._start_prometheus(self.workdir / "prometheus.yml")
        self._wait_until_up()
        self.say(f"lab {self.prefix}: Prometheus started again on the same data")
        return {"stopped": round(stopped, 3), "started": round(time.time(), 3)}

    def _spawn(self, name: str, ns: str, argv: list[str], log_path: Path) -> None:
        with log_path.open("ab") as out:
            # A session of its own: a Ctrl-C at the terminal reaches the lab, which stops them in order.
            process = subprocess.Popen(
                [self.tools["ip"], "netns", "exec", ns, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(Spawned(name, process, log_path))

    @property
    def prometheus_url(self) -> str:
        return f"http://{SWITCH_ADDRESS}:{PROMETHEUS_PORT}"

    def _wait_until_up(self, timeout: float = 60) -> None:
        targets = self.spec.hosts
        deadline = time.monotonic() + timeout
        query = self.prometheus_url + "/api/v1/query?query=sum(up%7Bjob%3D%22clusterhealth%22%7D)"
        while True:
            self._check_processes()

            def scraped() -> float:
                document = json.loads(_get(query))
                result = document["data"]["result"]
                return float(result[0]["value"][1]) if result else 0.0

            try:
                if in_namespace(self.switch, scraped) == targets:
                    self.say(f"lab {self.prefix}: {targets} agents up, Prometheus scraping them")
                    return
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise LabError(f"the agents and Prometheus were not all up within {timeout:g} s")
            time.sleep(0.5)

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> tuple[analysis.Analysis | None, str | None, dict[str, Any]]:
        """Wait the rounds, analysing after each; the last analysis (or why there is none) and the
        lab's own report."""
        period = self.spec.period
        # The path is shaped for the pair that meets first, before that round starts: half a
        # period ahead at least, since a loaded machine takes its time over the tc commands (a
        # round that starts before its pair is shaped measures it at full speed, and the path
        # is never confirmed).
        first = round_at(time.time() + period / 2, period) + 1
        path = self._degrade_path(first)
        if path is not None and time.time() >= first * period:
            raise LabError(f"shaping the path {path[0]}<->{path[1]} took past the start of its round")
        self.say(f"lab {self.prefix}: rounds {first} to {first + self.spec.rounds - 1}, {period:g} s each")
        history: list[dict[str, Any]] = []
        last: analysis.Analysis | None = None
        why: str | None = None
        restarted: dict[str, Any] | None = None
        for k in range(1, self.spec.rounds + 1):
            if k == self.spec.restart_prometheus:
                # Down across the round's end: the partners' series of round k end while nobody
                # scrapes, so no staleness marker ends them. The verdict after round k waits for it.
                restarted = self._restart_prometheus(
                    (first + k - 1 + 0.75) * period, (first + k + 0.25) * period
                )
                restarted["round"] = k
            # After the round's end, once Prometheus has scraped the last results.
            self._sleep_until((first + k) * period + 2 * SCRAPE_SECONDS + 0.5)
            at = time.time()
            try:
                last = in_namespace(self.switch, functools.partial(self._analyze, first, at))
                why = last.not_enough_evidence
            except NoVerdict as err:
                last, why = None, str(err)
            entry: dict[str, Any] = {"after_round": k, "round": first + k - 1}
            if last is not None and not last.not_enough_evidence:
                entry["suspects"] = [{"kind": s.kind, "suspect": s.name} for s in last.suspects]
                named = ", ".join(f"{s.name} ({s.kind})" for s in last.suspects) or "no suspect"
            else:
                entry["no_verdict"] = why
                named = f"no verdict ({why})"
            history.append(entry)
            self.say(f"lab {self.prefix}: after round {k} of {self.spec.rounds}: {named}")
        report: dict[str, Any] = {
            "prefix": self.prefix,
            "hosts": self.spec.hosts,
            "leaves": self.spec.leaf_map(),
            "rounds": self.spec.rounds,
            "period_seconds": self.spec.period,
            "rate_mbit_per_second": self.spec.rate_mbit,
            "degraded": None,
            "faults": [],
            "first_round": first,
            "history": history,
        }
        if restarted is not None:
            report["prometheus_restarted"] = restarted
        # At the moment of the last analysis: the same window, the same suspects, the same prices.
        report["remediate"] = in_namespace(self.switch, functools.partial(self._remediate, first, at))
        for kind, suspect in self.spec.expected_suspects(path):
            after = next(
                (
                    e["after_round"]
                    for e in history
                    if {"kind": kind, "suspect": suspect} in e.get("suspects", [])
                ),
                None,
            )
            fault = {"kind": kind, "suspect": suspect, "factor": self.spec.factor}
            report["faults"].append({**fault, "named_after_round": after})
            if report["degraded"] is None:  # the first fault, as a lab of one fault reports it
                report["degraded"], report["named_after_rounds"] = fault, after
        return last, why, report

    def _window(self, first: int, at: float) -> float:
        # The window starts once the first round's number has been scraped: before, the agents were
        # starting (a round they played while Prometheus was not yet up would count).
        return at - (first * self.spec.period + 2 * SCRAPE_SECONDS)

    def _analyze(self, first: int, at: float) -> analysis.Analysis:
        self.history = None
        prometheus = Prometheus(self.prometheus_url)
        window = self._window(first, at)
        history = pairwise.read_history(prometheus, GROUP, window, step=SCRAPE_SECONDS, now=at)
        result = pairwise.judge(history)
        self.history = history
        return result

    def _remediate(self, first: int, at: float) -> dict[str, Any]:
        """What `clusterhealth remediate --fabric` would do now, in dry-run, over the lab's hosts as
        the nodes of a scheduler that has none (fleet/remediate/memory.py): the orders it would
        give, each with the price analyze put on its suspect."""
        from clusterhealth.fleet.remediate.config import BudgetConfig, FabricConfig, RemediateConfig
        from clusterhealth.fleet.remediate.memory import MemoryBackend
        from clusterhealth.fleet.remediate.reconcile import Remediator

        hosts = [f"h{i}" for i in range(1, self.spec.hosts + 1)]
        config = RemediateConfig(
            budget=BudgetConfig(max_unavailable=len(hosts), max_unavailable_per_domain=len(hosts)),
            # analyze's own window and step in the lab (_analyze).
            fabric=FabricConfig(window_seconds=self._window(first, at), step_seconds=SCRAPE_SECONDS),
        )
        backend = MemoryBackend(hosts)
        prometheus = Prometheus(self.prometheus_url)
        result = Remediator(config, backend, prometheus, fabric=GROUP, clock=lambda: at).reconcile()
        return {
            "exit": result.code,
            "problem": result.problem,
            "would": [
                {
                    "node": o.node,
                    "operation": o.operation,
                    "action": o.action,
                    "reason": o.reason,
                    "impact": o.impact,
                }
                for o in result.would
            ],
        }

    def write_report(self, result: analysis.Analysis | None) -> dict[str, Any]:
        """The report of the last reading, beside the verdict: ``{"report": path}``, or why none
        was written (``report_error``)."""
        if result is None or self.history is None:
            return {"report": None, "report_error": "no reading of the group to draw"}
        from clusterhealth.fleet.report import command

        path = (self.spec.report or Path(f"lab-{self.prefix}.html")).absolute()
        try:
            command.write(self.history, result, path)
        except (command.MissingExtra, OSError) as err:
            self.say(f"lab {self.prefix}: report not written: {err}")
            return {"report": None, "report_error": str(err)}
        self.say(f"lab {self.prefix}: report written to {path}")
        return {"report": str(path)}

    def _sleep_until(self, until: float) -> None:
        while (remaining := until - time.time()) > 0:
            self._check_processes()
            time.sleep(min(remaining, 1.0))

    def _check_processes(self) -> None:
        for process in self.processes:
            if (why := process.exited()) is not None:
                raise LabError(why)

    # -- cleaning up -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the agents and Prometheus, and whatever still runs in the lab's namespaces (a probe
        an agent left behind); the namespaces and their links stay."""
        for spawned in self.processes:
            if spawned.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(spawned.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for spawned in self.processes:
            try:
                spawned.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(spawned.popen.pid, signal.SIGKILL)
                spawned.popen.wait()
        self.processes.clear()
        ip = self.tools.get("ip") or shutil.which("ip") or "ip"
        for ns in self.namespaces:
            with contextlib.suppress(LabError):
                for pid in _command(ip, "netns", "pids", ns).split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)

    def cleanup(self) -> None:
        """Stop every process, delete every namespace (and with them the links), remove the files."""
        self.stop()
        ip = self.tools.get("ip") or shutil.which("ip") or "ip"
        for ns in reversed(self.namespaces):
            try:
                _command(ip, "netns", "del", ns)
            except LabError as err:
                self.say(f"lab {self.prefix}: {err}")
        self.namespaces.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def main(spec: LabSpec, as_json: bool) -> int:
    """The command: build, run, print analyze's verdict, clean up; the exit code."""
    if (problem := spec.problem()) is not None:
        print(f"clusterhealth lab: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if os.geteuid() != 0:
        print("clusterhealth lab: needs root (network namespaces, tc)", file=sys.stderr)
        return EXIT_USAGE
    lab = Lab(spec)

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # Both installed before anything is built: a lab started from a background job inherits
    # SIGINT ignored, and Python then leaves it ignored.
    previous = signal.signal(signal.SIGTERM, interrupted)
    previous_int = signal.signal(signal.SIGINT, interrupted)
    try:
        lab.build()
        lab.start()
        result, why, report = lab.run()
    except KeyboardInterrupt:
        lab.say(f"lab {lab.prefix}: interrupted, cleaning up")
        return EXIT_INTERRUPTED
    except (LabError, OSError) as err:
        print(f"clusterhealth lab: {err}", file=sys.stderr)
        return EXIT_LAB_FAILED
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            lab.cleanup()
            lab.say(f"lab {lab.prefix}: cleaned up")
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)
    report.update(lab.write_report(result))
    summary = _summary(report)
    if as_json:
        document: dict[str, Any] = (
            result.to_dict() if result is not None else {"probe": GROUP, "error": why, "suspects": []}
        )
        document["lab"] = report
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        if result is not None:
            sys.stdout.write(analysis.render_table(result))
        else:
            print(f"no verdict: {why}")
        print(f"report: {report['report'] or 'not written, ' + report['report_error']}")
        print(summary)
    if result is None or result.not_enough_evidence:
        return analyzing.EXIT_NO_VERDICT
    return analyzing.EXIT_SUSPECTS if result.suspects else analyzing.EXIT_NO_SUSPECT


def _summary(report: dict[str, Any]) -> str:
    on = f" on {len(report['leaves'])} leaves" if report.get("leaves") else ""
    head = f"lab: {report['hosts']} hosts{on}, {report['rounds']} rounds of {report['period_seconds']:g} s"
    orders = (report.get("remediate") or {}).get("would") or []
    would = "; the remediator (dry-run) would " + (
        ", ".join(f"{o['operation']} {o['node']} ({o['action']})" for o in orders)
        if orders
        else "act on nothing"
    )
    faults = report.get("faults") or []
    if not faults:
        return head + ", nothing degraded" + would
    said = []
    for fault in faults:
        named = fault["named_after_round"]
        when = f"named after round {named}" if named is not None else "not named"
        said.append(f"{fault['kind']} {fault['suspect']} degraded to {fault['factor']:g}: {when}")
    return f"{head}; " + "; ".join(said) + would
