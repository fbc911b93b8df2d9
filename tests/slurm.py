"""A real Slurm cluster on this one host, for the tests of what runs under Slurm.

Debian's `slurmctld`, `slurmd` and client commands (Slurm 22.05) and a private `munged`, as root.
Everything a cluster keeps is in its own folder: the munge key, slurm.conf and gres.conf,
slurmctld's state, the logs, the nodes' layers. What holds unix sockets (munged's socket,
`AuthInfo=socket=`; each slurmd's spool, where its job steps listen; the nodes' /dev/log) is in a
short folder of its own beside it, `run` in the cluster's folder links to it: a socket's path has at
most 107 bytes, and a test's tmp_path under pytest-xdist can be most of that
(`/tmp/pytest-of-root/pytest-485/popen-gw3/test_the_installed_health_chec0/slurm` is 79). Its ports
are free ones picked at start, its ClusterName is unique: two clusters (two tests, two clones) run
at once.

The nodes are `NodeName=n[1-N] NodeHostname=<this host> Port=A-B`, one `slurmd -N nX` each, as
Slurm's multiple-slurmd build allows. A slurmd does not pass its environment to what it runs: the
HealthCheckProgram gets only SLURMD_NODENAME, Prolog and Epilog the job's variables and SLURM_CONF.
What those scripts read from fixed paths (/etc/slurm/slurm.conf for `scontrol`, /dev/log for
`logger`, /run/clusterhealth/jobs, /usr/local/bin/clusterhealth, /etc/clusterhealth/...) is each
node's own: every slurmd runs in a mount namespace of its own whose /etc, /opt, /run, /usr/local
and /dev are overlays, the machine's below and the node's folder `node_root(name)` on top (the
node's writes land there, the machine is not changed), and in a PID namespace of its own, so
that its job steps die with it. Each node's /dev holds `nvidia0..N-1` (character devices 195:N,
as a GPU node's: Slurm's GRES needs device files, and counts a job's GPUs by their numbers) and
`log`, a socket this harness reads (`syslog(name)`).

Usage (tests/conftest.py has the fixtures):

    with SlurmCluster(tmp_path, nodes=2, settings={"Prolog": "/path/to/prolog"}) as cluster:
        job = cluster.sbatch("true", nodes=["n1"], gres="gpu:1")
        cluster.wait_job(job)
        cluster.node("n1").reason
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import require_tool

# A job in one of these states has ended, and its Epilog has run on every node (until it has,
# Slurm shows COMPLETING).
JOB_ENDED = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE",
}  # fmt: skip
OVERLAID = ("etc", "opt", "run", "usr/local", "dev")
NVIDIA_MAJOR = 195
# A unix socket's path has at most 107 bytes (108 with its NUL).
SOCKET_PATH_MAX = 107


@dataclass(frozen=True)
class Node:
    """A node as slurmctld sees it: `state` is the base state (IDLE, ALLOCATED, MIXED, DOWN, ...),
    `flags` the rest of `State=` (DRAIN, NOT_RESPONDING, ...), `reason` and the user who set it."""

    name: str
    state: str
    flags: frozenset[str]
    reason: str | None
    reason_user: str | None
    slurmd_start_time: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        """Registered and answering slurmctld (drained or not)."""
        return self.state not in ("DOWN", "UNKNOWN", "FUTURE") and "NOT_RESPONDING" not in self.flags

    @property
    def available(self) -> bool:
        """In service: responding, neither drained nor down."""
        return self.state not in ("DOWN", "UNKNOWN", "FUTURE") and not (
            self.flags & {"DRAIN", "NOT_RESPONDING", "FAIL", "MAINT", "REBOOT_REQUESTED"}
        )


@dataclass(frozen=True)
class SyslogMessage:
    """What `logger` sent to a node's /dev/log: severity 0-7 (4 warning, 3 err), tag and text."""

    facility: int
    severity: int
    tag: str
    text: str


def _free_port_range(count: int) -> int:
    """The first of `count` consecutive TCP ports that nothing listens on, below the ephemeral
    range (so that no client connection takes one meanwhile)."""
    for _ in range(200):
        first = random.randrange(20000, 30000 - count)
        sockets = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("0.0.0.0", port))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def _clean_env() -> dict[str, str]:
    # A test run inside a Slurm job must not hand that job's variables to this cluster's commands.
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


class SlurmCluster:
    """A munged, a slurmctld and `nodes` slurmd; see the module's docstring.

    `settings` are slurm.conf lines (key -> value) added to or replacing the defaults, e.g.
    HealthCheckProgram, HealthCheckInterval, Prolog, Epilog. `lower`: a root folder whose etc,
    opt, run, usr/local are laid under every node's own, above the machine's (an installed tree;
    a node sees a change to it when its slurmd is restarted).
    `gpus` GPUs per node, `shards` GRES shards per node (jobs that share a GPU).
    `startup_seconds` is how long `start()` took.
    """

    def __init__(
        self,
        base: Path,
        nodes: int = 8,
        *,
        gpus: int = 4,
        shards: int = 8,
        settings: Mapping[str, str] | None = None,
        lower: Path | None = None,
    ) -> None:
        self.base = base
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.gpus = gpus
        self.shards = shards
        self.settings = dict(settings or {})
        self.lower = lower
        self.name = "ch" + uuid.uuid4().hex[:10]
        self.conf = base / "etc" / "slurm.conf"
        self.env = {**_clean_env(), "SLURM_CONF": str(self.conf)}
        self.startup_seconds = 0.0
        self._step = "not started"
        self._munged: subprocess.Popen[bytes] | None = None
        self._slurmctld: subprocess.Popen[bytes] | None = None
        self._slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._syslog_sockets: dict[str, socket.socket] = {}
        self._syslog: dict[str, list[SyslogMessage]] = {n: [] for n in self.node_names}
        self._syslog_lock = threading.Lock()
        self._syslog_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.ctld_port = 0
        self.first_node_port = 0
        self._conf_as_made = ""
        self._sockets: Path | None = None

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120) -> None:
        """Start everything and wait until every node is IDLE. On any failure everything started
        is stopped again and the error says what the logs said."""
        if os.geteuid() != 0:
            pytest.fail("the real Slurm cluster runs its daemons as root (as `make test` does)")
        began = time.monotonic()
        try:
            for attempt in range(3):
                try:
                    self._start_once(timeout)
                    break
                except _PortTaken:
                    self._stop_daemons()
                    if attempt == 2:
                        raise
        except Exception as exc:
            # What failed, where, and what the daemons said: an exception before any daemon wrote
            # a line (a path, a port, a tool) has nothing in the logs.
            logs = self.logs() or "(no daemon wrote to its log)"
            self.stop()
            raise RuntimeError(
                f"the Slurm cluster in {self.base} did not start: {self._step}: "
                f"{type(exc).__name__}: {exc}\n{logs}"
            ) from exc
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def _start_once(self, timeout: float) -> None:
        self._step = "making its folders"
        for d in ("etc", "state", "log", "jobs", "munge"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        self._make_sockets_folder()
        self._step = "picking its ports"
        self.ctld_port = _free_port_range(1 + len(self.node_names))
        self.first_node_port = self.ctld_port + 1
        self._step = "starting munged"
        self._start_munged()
        self._step = "writing slurm.conf"
        self._write_config()
        self._step = "preparing the nodes' folders"
        self._prepare_nodes()
        self._step = "opening the nodes' /dev/log sockets"
        self._start_syslog()
        self._step = "starting slurmctld"
        self._slurmctld = self._spawn(
            [require_tool("slurmctld"), "-D", "-f", str(self.conf)], self.base / "log" / "slurmctld.out"
        )
        for name in self.node_names:
            self._step = f"starting slurmd {name}"
            self._start_slurmd(name)
        # Responding, not necessarily in service: a HealthCheckProgram may drain a node as its
        # slurmd starts.
        self._step = "waiting for every node to respond"
        self.wait(lambda: all(n.responding for n in self.nodes().values()), timeout, "every node responding")

    def stop(self) -> None:
        """Stop every process of the cluster, jobs included; safe to call twice."""
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            # Jobs die with their node's PID namespace anyway; cancelling first ends them cleanly.
            self._cancel_all(timeout=10)
        self._stop_daemons()
        self._stopping.set()
        if self._syslog_thread is not None:
            self._syslog_thread.join(timeout=10)
            self._syslog_thread = None
        with self._syslog_lock:
            for s in self._syslog_sockets.values():
                s.close()
            self._syslog_sockets.clear()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None

    def _make_sockets_folder(self) -> None:
        if self._sockets is not None:
            return
        self._sockets = Path(tempfile.mkdtemp(prefix=f"{self.name}."))
        self._sockets.chmod(0o755)
        # The longest socket in it: a job step's in its slurmd's spool, `<node>_<job id>.<step
        # id>[.<het component>]` (Slurm's slurmstepd/req.c), 32-bit numbers.
        node = max(self.node_names, key=len)
        longest = self._spool(node) / f"{node}_{2**32 - 1}.{2**32 - 1}.{2**32 - 1}"
        if len(str(longest)) > SOCKET_PATH_MAX:
            raise RuntimeError(
                f"{self._sockets} (in $TMPDIR) is too long a path for the cluster's unix sockets"
            )
        link = self.base / "run"
        link.unlink(missing_ok=True)
        link.symlink_to(self._sockets)

    def _stop_daemons(self) -> None:
        for name in list(self._slurmd):
            self._kill_slurmd(name)
        for attr in ("_slurmctld", "_munged"):
            process = getattr(self, attr)
            if process is not None:
                _terminate(process)
                setattr(self, attr, None)

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        # setpriv's parent-death signal: a test run killed outright leaves no daemon behind.
        with log.open("ab") as out:
            return subprocess.Popen(
                [require_tool("setpriv"), "--pdeathsig", "SIGKILL", "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.base,
                start_new_session=True,
            )

    def _start_munged(self) -> None:
        key_dir = self.base / "munge" / "key"
        key_dir.mkdir(mode=0o700, exist_ok=True)
        key = key_dir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        assert self._sockets is not None
        sock_dir = self._sockets / "munge"
        sock_dir.mkdir(mode=0o755, exist_ok=True)
        self.munge_socket = sock_dir / "munge.socket"
        self._munged = self._spawn(
            [
                require_tool("munged"), "--foreground", "--force",
                f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--log-file={self.base / 'log' / 'munged.log'}", f"--pid-file={sock_dir / 'munged.pid'}",
                f"--seed-file={key_dir / 'munged.seed'}",
            ],
            self.base / "log" / "munged.out",
        )  # fmt: skip
        munge, unmunge = require_tool("munge"), require_tool("unmunge")

        def answers() -> bool:
            if not self.munge_socket.exists():
                return False
            cred = subprocess.run([munge, "-n", "-S", str(self.munge_socket)], capture_output=True)
            if cred.returncode != 0:
                return False
            back = subprocess.run(
                [unmunge, "-S", str(self.munge_socket)], input=cred.stdout, capture_output=True
            )
            return back.returncode == 0

        self.wait(answers, 30, "munged answering", process=self._munged)

    def _write_config(self) -> None:
        host = socket.gethostname()
        last = self.first_node_port + len(self.node_names) - 1
        nodes = f"n[1-{len(self.node_names)}]" if len(self.node_names) > 1 else "n1"
        gres = f"gpu:{self.gpus}" + (f",shard:{self.shards}" if self.shards else "")
        defaults = {
            "ClusterName": self.name,
            "SlurmctldHost": f"{host}(127.0.0.1)",
            "SlurmctldPort": str(self.ctld_port),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "CredType": "cred/munge",
            "StateSaveLocation": str(self.base / "state"),
            "SlurmdSpoolDir": str(self._spool("%n")),
            "SlurmctldPidFile": str(self.base / "state" / "slurmctld.pid"),
            "SlurmdPidFile": str(self.base / "state" / "slurmd.%n.pid"),
            "SlurmctldLogFile": str(self.base / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(self.base / "log" / "slurmd.%n.log"),
            # No cgroup plugins: they would need the machine's cgroup tree for each node.
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "MpiDefault": "none",
            "SwitchType": "switch/none",
            "ReturnToService": "2",
            "KillWait": "2",
            "FirstJobId": "100",
            "GresTypes": "gpu,shard" if self.shards else "gpu",
        }
        settings = {**defaults, **self.settings}
        lines = [f"{k}={v}" for k, v in settings.items()]
        lines.append(
            f"NodeName={nodes} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.first_node_port}-{last}"
            f" CPUs={os.cpu_count() or 1} RealMemory=1000 Gres={gres} State=UNKNOWN"
        )
        lines.append("PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        self._conf_as_made = self.conf.read_text()
        gres_conf = [f"Name=gpu File=/dev/nvidia[0-{self.gpus - 1}]"]
        if self.shards:
            gres_conf.append(f"Name=shard Count={self.shards}")
        (self.conf.parent / "gres.conf").write_text("\n".join(gres_conf) + "\n")

    def set(self, **settings: str) -> None:
        """Change slurm.conf settings and have every daemon reread it (`scontrol reconfigure`)."""
        text = self.conf.read_text()
        for key, value in settings.items():
            text, found = re.subn(rf"(?m)^{key}=.*$", f"{key}={value}", text)
            if not found:
                text = f"{key}={value}\n" + text
        self.conf.write_text(text)
        self.settings.update(settings)
        self.scontrol("reconfigure")

    # --- nodes ---------------------------------------------------------------------------

    def node_root(self, name: str) -> Path:
        """The node's own layer over /etc, /opt, /run, /usr/local and /dev (folders of those names).
        Write what the node should see before its slurmd starts (or restart it): files changed
        under a mounted overlay need not show. For a file that changes during a test, put a
        symlink here to a file outside it."""
        return self.base / "nodes" / name

    def _prepare_nodes(self) -> None:
        for name in self.node_names:
            root = self.node_root(name)
            for d in OVERLAID:
                (root / d).mkdir(parents=True, exist_ok=True)
                (root / ".work" / d).mkdir(parents=True, exist_ok=True)
            (root / ".keep").mkdir(exist_ok=True)
            self._spool(name).mkdir(parents=True, exist_ok=True)
            # What a node's tools read from /etc/slurm: `scontrol` in the HealthCheckProgram.
            (root / "etc" / "slurm").mkdir(exist_ok=True)
            for conf in ("slurm.conf", "gres.conf"):
                link = root / "etc" / "slurm" / conf
                if not link.is_symlink():
                    link.symlink_to(self.conf.parent / conf)
            for i in range(self.gpus):
                device = root / "dev" / f"nvidia{i}"
                if not device.exists():
                    os.mknod(device, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, i))
            log = root / "dev" / "log"
            log.unlink(missing_ok=True)
            log.symlink_to(self._syslog_path(name))

    def _spool(self, name: str) -> Path:
        assert self._sockets is not None
        return self._sockets / "spool" / name

    def _syslog_path(self, name: str) -> Path:
        assert self._sockets is not None
        return self._sockets / "log" / f"{name}.sock"

    def _node_script(self, name: str) -> str:
        root = self.node_root(name)
        lines = ["set -e"]
        # /dev's own mounts (pts, shm, mqueue) are kept: moved aside, overlaid, put back.
        lines.append(f"mount --rbind /dev {root}/.keep")
        for d in OVERLAID:
            lower = f"/{d}"
            if self.lower is not None and d != "dev" and (self.lower / d).is_dir():
                lower = f"{self.lower / d}:/{d}"
            layers = f"lowerdir={lower},upperdir={root}/{d},workdir={root}/.work/{d}"
            lines.append(f"mount -t overlay overlay -o {layers} /{d}")
        lines.append(
            f"for sub in $(awk -v k='{root}/.keep/' 'index($2, k) == 1 {{ s = substr($2, length(k) + 1);"
            f" if (s !~ /\\//) print s }}' /proc/self/mounts); do"
            f' mount --bind "{root}/.keep/$sub" "/dev/$sub"; done'
        )
        lines.append(f"exec {require_tool('slurmd')} -D -N {name} -f {self.conf}")
        return "\n".join(lines)

    def _start_slurmd(self, name: str) -> None:
        argv = [
            require_tool("unshare"), "--mount", "--propagation", "private", "--pid", "--fork",
            "--mount-proc", "--kill-child", "sh", "-c", self._node_script(name),
        ]  # fmt: skip
        self._slurmd[name] = self._spawn(argv, self.base / "log" / f"slurmd.{name}.out")

    def _kill_slurmd(self, name: str) -> None:
        # Killing slurmd, the namespace's first process, makes the kernel kill everything else
        # in the namespace (job steps, scripts) before unshare's wait for it returns: once
        # unshare has exited, the node's processes and its port are gone.
        process = self._slurmd.pop(name, None)
        if process is None or process.poll() is not None:
            return
        try:
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        _terminate(process, signal.SIGKILL if not children else signal.SIGTERM)

    def restart_node(self, name: str, timeout: float = 60) -> Node:
        """Restart the node's slurmd (its jobs die with it). slurmd runs the HealthCheckProgram
        when it starts, before it registers: when this returns, that run has ended."""
        before = self.node(name).slurmd_start_time
        self._kill_slurmd(name)
        # SlurmdStartTime has whole seconds: the new one must differ from the old one.
        started = time.mktime(time.strptime(before, "%Y-%m-%dT%H:%M:%S")) if before else 0
        self.wait(lambda: time.time() >= started + 1, 5, "the next second")
        self._start_slurmd(name)
        return self.wait_node(
            name,
            lambda n: n.slurmd_start_time != before and n.responding,
            timeout,
            f"{name}'s new slurmd registered",
        )

    def nodes(self) -> dict[str, Node]:
        out = self.scontrol("show", "node", "-o")
        reasons = {}
        for line in self.run("sinfo", "-h", "-N", "-O", "NodeList:|,User:|,Reason:0").stdout.splitlines():
            node, user, reason = line.split("|", 2)
            reasons[node.strip()] = (user.strip(), reason.strip())
        nodes = {}
        for line in out.splitlines():
            # The reason (free text) comes last; sinfo gave it above.
            fields = dict(re.findall(r"(\w+)=(\S*)", line.split(" Reason=", 1)[0]))
            if "NodeName" not in fields:
                continue
            state, *flags = fields["State"].split("+")
            state = state.rstrip("*")
            flagset = set(flags)
            if fields["State"].split("+")[0].endswith("*"):
                flagset.add("NOT_RESPONDING")
            user, reason = reasons.get(fields["NodeName"], ("", ""))
            nodes[fields["NodeName"]] = Node(
                name=fields["NodeName"],
                state=state,
                flags=frozenset(flagset),
                reason=reason if reason and reason != "none" else None,
                reason_user=user if reason and reason != "none" and user != "Unknown" else None,
                slurmd_start_time=fields.get("SlurmdStartTime", ""),
            )
        return nodes

    def node(self, name: str) -> Node:
        return self.nodes()[name]

    def wait_node(
        self, name: str, predicate: Callable[[Node], bool], timeout: float = 60, what: str = "the node"
    ) -> Node:
        found: list[Node] = []

        def check() -> bool:
            found[:] = [self.node(name)]
            return predicate(found[0])

        self.wait(check, timeout, f"{what} ({found[-1] if found else name})")
        return found[0]

    def drain(self, names: str | Iterable[str], reason: str) -> None:
        self.scontrol("update", f"nodename={_hostlist(names)}", "state=drain", f"reason={reason}")

    def resume(self, names: str | Iterable[str], timeout: float = 60) -> None:
        """Resume the nodes and wait until they answer slurmctld's ping that follows (Slurm
        shows a resumed node NOT_RESPONDING until then)."""
        hostlist = _hostlist(names)
        self.scontrol("update", f"nodename={hostlist}", "state=resume")
        wanted = set(self.scontrol("show", "hostnames", hostlist).split())
        self.wait(lambda: all(self.nodes()[n].available for n in wanted), timeout, f"{hostlist} resumed")

    # --- jobs ----------------------------------------------------------------------------

    def sbatch(
        self,
        script: str,
        *,
        nodes: Iterable[str],
        gres: str | None = None,
        hold: bool = False,
        args: Iterable[str] = (),
    ) -> int:
        """Submit `script` (a shell command line) on exactly `nodes`; its job id."""
        names = list(nodes)
        argv = ["sbatch", "--parsable", f"--nodelist={_hostlist(names)}", f"--nodes={len(names)}"]
        argv += [f"--chdir={self.base / 'jobs'}", f"--output={self.base / 'jobs' / '%j.out'}"]
        argv += [f"--gres={gres}"] if gres else []
        argv += ["--hold"] if hold else []
        argv += [*args, "--wrap", script]
        return int(self.run(*argv).stdout.strip().split(";")[0])

    def until(self, signal_name: str) -> str:
        """A job script's line that waits until `go(signal_name)`: a job that ends when told."""
        flag = self.base / "jobs" / f"{signal_name}.go"
        return f"while [ ! -e {flag} ]; do sleep 0.1; done"

    def go(self, signal_name: str) -> None:
        (self.base / "jobs" / f"{signal_name}.go").touch()

    def srun(
        self, *command: str, nodes: Iterable[str], gres: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `command` as a job step on exactly `nodes` and wait for it (not for its Epilog)."""
        names = list(nodes)
        argv = ["srun", f"--nodelist={_hostlist(names)}", f"--nodes={len(names)}"]
        argv += [f"--chdir={self.base / 'jobs'}"]
        argv += [f"--gres={gres}"] if gres else []
        return self.run(*argv, *command, check=False, timeout=timeout)

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -d`'s fields (one line each; GRES of each node as `GRES`)."""
        out = self.scontrol("show", "job", "-d", "-o", str(job_id))
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def _cancel_all(self, timeout: float = 60) -> None:
        jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=timeout).stdout.split()
        if jobs:
            self.run("scancel", "--quiet", *jobs, check=False, timeout=timeout)

    def wait_job(self, job_id: int, timeout: float = 60) -> str:
        """Wait until the job has ended and its Epilog has run everywhere; its final state."""
        state: list[str] = []

        def ended() -> bool:
            state[:] = [self.job(job_id)["JobState"]]
            return state[0] in JOB_ENDED

        self.wait(ended, timeout, f"job {job_id} ended ({state[-1] if state else '?'})")
        return state[0]

    def wait_running(self, job_id: int, timeout: float = 60) -> None:
        """Wait until the job runs (its Prolog has run on every node: PrologFlags=Alloc,
        or its first step has started)."""
        self.wait(lambda: self.job(job_id)["JobState"] == "RUNNING", timeout, f"job {job_id} running")

    def output(self, job_id: int) -> str:
        """What the batch job wrote so far (its --output file)."""
        path = self.base / "jobs" / f"{job_id}.out"
        return path.read_text() if path.exists() else ""

    def wait_output(self, job_id: int, text: str, timeout: float = 60) -> None:
        """Wait until the batch job has written `text`: its script runs after its Prolog ended."""
        self.wait(lambda: text in self.output(job_id), timeout, f"job {job_id} writing {text!r}")

    def next_job_id(self, job_id: int) -> None:
        """The next job gets this id, which must be above every id given so far: FirstJobId,
        reread on `scontrol reconfigure`, moves Slurm's counter up, not down while a job is
        known. (A smaller id for a later job: submit it first with `hold=True`, then release.)"""
        self.set(FirstJobId=str(job_id))

    def unused_job_id(self) -> int:
        """An id above every id this cluster has given (a held job, submitted and cancelled,
        tells Slurm's counter)."""
        probe = self.sbatch("true", nodes=[self.node_names[0]], hold=True)
        self.run("scancel", str(probe))
        return probe + 1

    def release(self, job_id: int) -> None:
        self.scontrol("release", str(job_id))

    def job_gpus(self, job_id: int) -> dict[str, list[int]]:
        """The GPUs (GRES gpu or shard indices) Slurm gave a running job, by node (Slurm forgets
        them when the job ends)."""
        out = self.scontrol("show", "job", "-d", str(job_id))
        gpus: dict[str, list[int]] = {}
        for nodes, kinds in re.findall(r"Nodes=(\S+) .*?GRES=(\S+)", out):
            for index in re.findall(r"(?:gpu|shard)[^(]*\(IDX:([\d,-]+)\)", kinds):
                for part in index.split(","):
                    first, _, last = part.partition("-")
                    for node in self.scontrol("show", "hostnames", nodes).split():
                        gpus.setdefault(node, []).extend(range(int(first), int(last or first) + 1))
        return gpus

    # --- commands, logs ----------------------------------------------------------------------

    def run(
        self, command: str, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (scontrol, sinfo, squeue, srun, sbatch, scancel) against this
        cluster."""
        done = subprocess.run(
            [require_tool(command), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{command} {' '.join(args)}: rc={done.returncode}: {done.stderr.strip()}")
        return done

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args).stdout

    def _start_syslog(self) -> None:
        if self._syslog_thread is not None:
            return
        self._stopping.clear()
        selector = selectors.DefaultSelector()
        for name in self.node_names:
            if name in self._syslog_sockets:
                continue
            path = self._syslog_path(name)
            path.parent.mkdir(exist_ok=True)
            path.unlink(missing_ok=True)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(str(path))
            path.chmod(0o666)
            self._syslog_sockets[name] = s
        for name, s in self._syslog_sockets.items():
            selector.register(s, selectors.EVENT_READ, name)

        def serve() -> None:
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.2):
                    with self._syslog_lock:
                        self._receive(key.data)
            selector.close()

        self._syslog_thread = threading.Thread(target=serve, name=f"syslog-{self.name}", daemon=True)
        self._syslog_thread.start()

    def _receive(self, name: str) -> None:
        """Take every datagram waiting on the node's socket (the caller holds the lock)."""
        sock = self._syslog_sockets.get(name)
        while sock is not None:
            try:
                data = sock.recv(65536, socket.MSG_DONTWAIT)
            except OSError:  # nothing left (or the socket closed)
                return
            message = _parse_syslog(data.decode(errors="replace"))
            if message is not None:
                self._syslog[name].append(message)

    def syslog(self, name: str) -> list[SyslogMessage]:
        """What the node's programs sent to /dev/log so far (all of it: what is still waiting on
        the socket is taken first)."""
        with self._syslog_lock:
            self._receive(name)
            return list(self._syslog[name])

    def logs(self, lines: int = 20) -> str:
        """The last lines of every daemon's log, for a failure's message."""
        out = []
        for path in sorted((self.base / "log").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    # --- between tests -----------------------------------------------------------------------

    def reset(self, timeout: float = 60) -> None:
        """Back to a fresh cluster's state for the next test: no job, every node IDLE with no
        reason, every node's syslog forgotten, slurm.conf's settings as they were made."""
        self._cancel_all()
        if self.conf.read_text() != self._conf_as_made:
            self.conf.write_text(self._conf_as_made)
            self.scontrol("reconfigure")
        self.wait(lambda: not self.run("squeue", "-h", "-o", "%i").stdout.strip(), timeout, "no job left")
        for name in self.node_names:
            if self._slurmd.get(name) is None or self._slurmd[name].poll() is not None:
                self._start_slurmd(name)
        out = [n.name for n in self.nodes().values() if n.flags & {"DRAIN", "FAIL"} or n.state == "DOWN"]
        if out:
            self.resume(out)
        self.wait(lambda: all(n.available and n.reason is None for n in self.nodes().values()), timeout,
                  "every node IDLE")  # fmt: skip
        with self._syslog_lock:
            for name, messages in self._syslog.items():
                self._receive(name)
                messages.clear()

    def wait(
        self,
        condition: Callable[[], bool],
        timeout: float,
        what: str,
        *,
        process: subprocess.Popen[Any] | None = None,
    ) -> None:
        """Poll `condition` until it holds; fail after `timeout` seconds or when a daemon died."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                if condition():
                    return
            except RuntimeError:
                pass  # a client command failing while a daemon starts
            for p in [process, self._slurmctld, self._munged, *self._slurmd.values()]:
                if p is not None and p.poll() is not None:
                    log = self.logs()
                    if "Address already in use" in log:
                        raise _PortTaken(log)
                    raise RuntimeError(f"a Slurm daemon exited ({p.args!r}) waiting for {what}:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout} s for {what}\n{self.logs()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


class _PortTaken(RuntimeError):
    pass


def _terminate(process: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def _hostlist(names: str | Iterable[str]) -> str:
    return names if isinstance(names, str) else ",".join(names)


_SYSLOG = re.compile(r"<(\d+)>(?:\w{3} [ \d]\d \d\d:\d\d:\d\d )?([^:\[\s]+)(?:\[\d+\])?: ?(.*)", re.S)


def _parse_syslog(datagram: str) -> SyslogMessage | None:
    match = _SYSLOG.match(datagram)
    if match is None:
        return None
    priority = int(match.group(1))
    return SyslogMessage(priority >> 3, priority & 7, match.group(2), match.group(3).rstrip("\n"))
