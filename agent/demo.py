"""`clusterhealth demo`: the agent on a simulated faulty node, with a tour of where each fault shows."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

from clusterhealth.agent import config as configuration
from clusterhealth.agent.daemon import Agent, default_scenario
from clusterhealth.exporters.nvml_sim import Fault, load_scenario

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


def run_demo(scenario: str, listen: str, interval: float, duration: float | None) -> int:
    path = scenario_path(scenario)
    parsed = load_scenario(path)
    overrides = {"listen": listen, "simulate": str(path), "collectors.gpu.interval_seconds": interval}
    config = configuration.load(None, overrides)
    agent = Agent(None, overrides, config)
    host, port = agent.server.address[:2]
    host = host.decode() if isinstance(host, bytes) else host
    base = f"http://{'localhost' if host in ('0.0.0.0', '127.0.0.1') else host}:{port}"
    print(f"clusterhealth demo: {parsed.description}", flush=True)
    print(f"  scenario  {path}")
    print(f"  metrics   {base}/metrics")
    print(f"  health    {base}/healthz")
    print("  stop      Ctrl-C\n", flush=True)
    threading.Thread(target=_tour, args=(agent, parsed.faults, interval), daemon=True).start()
    if duration is not None:
        threading.Timer(duration, agent.stop).start()
    return agent.run()


def _tour(agent: Agent, faults: tuple[Fault, ...], interval: float) -> None:
    """Print each fault's lines once it is active and a collection has seen it."""
    started = time.monotonic()
    pending = [f for f in faults if f.look]
    while pending:
        elapsed = time.monotonic() - started
        ready = [f for f in pending if elapsed >= f.from_seconds + interval + 1]
        if ready:
            text = agent.exposition.render().decode()
            for fault in ready:
                lines = matching_lines(text, fault.look) or ["(not in the exposition yet)"]
                print(f"* {fault.description}", flush=True)
                for line in lines[:4]:
                    print(f"    {line}")
                sys.stdout.flush()
                pending.remove(fault)
            if pending:
                later = min(f.from_seconds for f in pending)
                print(f"  (more in {max(0, later - elapsed):.0f}s...)\n", flush=True)
        time.sleep(0.5)
