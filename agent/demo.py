"""`clusterhealth demo`: the agent on a simulated faulty node, with a tour of where each fault shows.

The simulated node is the NVML simulator (the scenario's GPUs and faults), the sysfs tree of
exporters/sim/sysfs.py (eight NDR HCAs, RoCE ports and their faults), a simulated /dev/kmsg in
which the scenario's kernel-log lines appear at their time, in the kernel's record format, and a
simulated /proc that places the GPUs' compute processes in their job (exporters/sim/procfs.py).
"""

from __future__ import annotations

import re
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.agent.daemon import Agent, default_scenario
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim import sysfs as sim_sysfs
from clusterhealth.exporters.sim.scenario import Scenario, load_scenario

_SELECTOR = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def matching_lines(exposition: str, selector: str) -> list[str]:
    """Sample lines of `exposition` that match `name{label="value",...}` (equality only)."""
    m = _SELECTOR.match(selector.strip())
    if not m:
        return []
    name, wanted = m.group(1), set(_LABEL.findall(m.group(2) or ""))
    lines = []
    for line in exposition.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        labels = set(_LABEL.findall(line[len(name) : line.rfind("}") + 1]))
        if wanted <= labels:
            lines.append(line)
    return lines


def scenario_path(name: str) -> Path:
    path = Path(name)
    return path if path.suffix in (".yaml", ".yml") or path.exists() else default_scenario(name)


def sample_config() -> Path | None:
    """deploy/clusterhealth.yaml: installed with the wheel under the environment's
    share/clusterhealth/, or in the source tree beside the package's folders."""
    for candidate in (
        Path(sysconfig.get_path("data")) / "share" / "clusterhealth" / "clusterhealth.yaml",
        Path(__file__).resolve().parent.parent / "deploy" / "clusterhealth.yaml",
    ):
        if candidate.is_file():
            return candidate
    return None


def sample_policy(path: Path) -> dict[str, Any]:
    """The sample config's policy: it describes the node the demo simulates (8 GPUs, 8 NDR HCAs,
    RoCE at MTU 9000), so the demo's MTU fault reaches `check` and the MTUMismatch alert."""
    policy = yaml.safe_load(path.read_text()).get("policy", {})
    return policy if isinstance(policy, dict) else {}


def kmsg_record(sequence: int, message: str) -> bytes:
    """A /dev/kmsg record as the kernel writes it (priority 4, microseconds on the monotonic clock)."""
    text = "".join(c if 0x20 <= ord(c) < 0x7F and c != "\\" else f"\\x{ord(c):02x}" for c in message)
    return f"4,{sequence},{int(time.monotonic() * 1e6)},-;{text}\n".encode()


def _replay_kernel_log(path: Path, lines: tuple[tuple[float, str], ...], stop: threading.Event) -> None:
    started = time.monotonic()
    with path.open("ab", buffering=0) as out:
        for sequence, (at, message) in enumerate(lines, start=1):
            if stop.wait(max(0.0, started + at - time.monotonic())):
                return
            out.write(kmsg_record(sequence, message))


def run_demo(scenario: str, listen: str, interval: float, duration: float | None) -> int:
    path = scenario_path(scenario)
    parsed = load_scenario(path)
    with tempfile.TemporaryDirectory(prefix="clusterhealth-demo-") as tmp:
        sysfs, procfs = Path(tmp) / "sys", Path(tmp) / "proc"
        sim_sysfs.build(sysfs)
        # Where the GPUs' compute processes belong: the jobs collector names their job.
        sim_procfs.build(procfs, parsed)
        sim_procfs.build_job_cgroups(sysfs, parsed)
        kmsg = Path(tmp) / "kmsg"
        kmsg.touch()
        sample = sample_config()
        overrides: dict[str, Any] = {
            "listen": listen,
            "simulate": str(path),
            "paths.sysfs": str(sysfs),
            "paths.procfs": str(procfs),
            "paths.kmsg": str(kmsg),
            "collectors.gpu.interval_seconds": interval,
            "collectors.rdma.interval_seconds": interval,
            "collectors.kernel_log.interval_seconds": 1.0,
        }
        if sample is not None:
            overrides["policy"] = sample_policy(sample)
        config = configuration.load(None, overrides)
        try:
            agent = Agent(None, overrides, config)
        except OSError as err:
            print(f"clusterhealth: cannot listen on {listen}: {err.strerror}", file=sys.stderr)
            return 1
        host, port = agent.server.address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        base = f"http://{'localhost' if host in ('0.0.0.0', '127.0.0.1') else host}:{port}"
        print(f"clusterhealth demo: {parsed.description}", flush=True)
        print(f"  scenario  {path}")
        print(f"  sysfs     {sysfs} (simulated HCAs)")
        print(f"  procfs    {procfs} (the GPUs' processes and their jobs)")
        print(f"  policy    {sample or 'none (the sample config was not found)'}")
        print(f"  metrics   {base}/metrics")
        print(f"  health    {base}/healthz")
        print("  stop      Ctrl-C\n", flush=True)
        stop = threading.Event()
        threading.Thread(target=_replay_kernel_log, args=(kmsg, parsed.kernel_log, stop), daemon=True).start()
        threading.Thread(target=_tour, args=(agent, parsed, interval), daemon=True).start()
        if duration is not None:
            timer = threading.Timer(duration, agent.stop)
            timer.daemon = True
            timer.start()
        try:
            return agent.run()
        finally:
            stop.set()


def _tour(agent: Agent, scenario: Scenario, interval: float) -> None:
    """Print each stop's lines once it is due and a collection has seen it."""
    stops = [(f.from_seconds, f.description, f.look) for f in scenario.faults if f.look]
    stops += list(scenario.tour)
    started = time.monotonic()
    pending = sorted(stops, key=lambda stop: stop[0])
    while pending:
        elapsed = time.monotonic() - started
        ready = [stop for stop in pending if elapsed >= stop[0] + interval + 1.5]
        if ready:
            text = agent.exposition.render().decode()
            for stop in ready:
                _, description, look = stop
                lines = matching_lines(text, look) or ["(not in the exposition yet)"]
                print(f"* {description}")
                for line in lines[:4]:
                    print(f"    {line}")
                sys.stdout.flush()
                pending.remove(stop)
            if pending:
                later = min(stop[0] for stop in pending)
                print(f"  (more in {max(0.0, later - elapsed):.0f}s...)\n", flush=True)
        time.sleep(0.5)
