"""How the package's modules import each other: no circle, the floors apart (exporters/ and checks/
below, agent/ the node's wiring, fleet/ the fleet's side), and no simulator on a real node."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from .conftest import FIXTURES, ROOT, SCENARIOS

FOLDERS = ("agent", "exporters", "checks", "fleet", "dashboards")
SIMULATOR = "clusterhealth.exporters.sim"
# What agent/ holds that the fleet's side shares: the package's version (agent/__init__.py),
# logging, and the YAML loader with the settings machinery whose errors name file, key and
# expectation. The rest of agent/ is the node daemon's wiring.
SHARED_FROM_AGENT = {
    "clusterhealth.agent",
    "clusterhealth.agent.log",
    "clusterhealth.agent.yamlfile",
    "clusterhealth.agent.settings",
}
# The one door from the node's side to the fleet's: the command line dispatches to fleet commands.
FLEET_DOOR = {"clusterhealth.agent.cli"}


def modules() -> dict[str, Path]:
    """clusterhealth.<dotted name> -> its file, for every module of the package."""
    found = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["clusterhealth", *parts])] = path
    return found


def imported(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The package's modules that `module` imports anywhere in its file (at the top, under
    TYPE_CHECKING or inside a function), with the packages whose __init__ those imports run."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            # `from package import module` imports the module; `from module import name`, the module.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name not in known and "." in name:
                name = name.rpartition(".")[0]
            if name not in known:
                continue  # outside the package
            yield name
            # Importing a.b.c runs a.b's __init__ first, unless the importer is inside a.b already.
            parent = name.rpartition(".")[0]
            while parent in known and not (module == parent or module.startswith(parent + ".")):
                yield parent
                parent = parent.rpartition(".")[0]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {module: set(imported(module, path, known)) for module, path in known.items()}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (Tarjan's strongly connected
    components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph[module]:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert len(graph) > 70 and "clusterhealth.agent.node" in graph["clusterhealth.agent.daemon"]
    assert circles(graph) == []
    # The circle this test guards against (issue 18): the check names in the audits, which read
    # the policy, while the policy validated `disabled_checks` against them.
    assert "clusterhealth.checks.policy" in graph["clusterhealth.checks.audits.network"]
    graph["clusterhealth.checks.policy"].add("clusterhealth.checks.audits")
    (circle,) = circles(graph)
    assert {"clusterhealth.checks.audits", "clusterhealth.checks.policy"} <= set(circle)


def _floor(module: str) -> str:
    return module.split(".")[1]


def _reaching(graph: Mapping[str, set[str]], modules: list[str], floor: str) -> dict[str, list[str]]:
    found = {m: sorted(t for t in graph[m] if _floor(t) == floor) for m in modules}
    return {m: targets for m, targets in found.items() if targets}


def test_exporters_and_checks_never_import_the_agent_or_the_fleet() -> None:
    # agent/ wires the others and is the only package that knows them all (docs/adding-a-collector.md):
    # a collector, a probe or a setting that reached back into it, or into the fleet's side, would tie
    # the floors together.
    graph = import_graph()
    below = [m for m in graph if _floor(m) in ("exporters", "checks")]
    assert "clusterhealth.checks.probes.collector" in below and "clusterhealth.checks.fabric.rounds" in below
    assert _reaching(graph, below, "agent") == {}
    assert _reaching(graph, below, "fleet") == {}


def test_the_fleet_side_shares_only_what_is_shared_with_the_node_daemon() -> None:
    graph = import_graph()
    fleet = [m for m in graph if _floor(m) == "fleet"]
    assert {"clusterhealth.fleet.prometheus", "clusterhealth.fleet.pairwise"} <= set(fleet)
    # It reads checks/ (the analysis, the cost model): the floor below.
    assert "clusterhealth.checks.fabric.analysis" in graph["clusterhealth.fleet.pairwise"]
    wired = {
        m: [t for t in ts if t not in SHARED_FROM_AGENT] for m, ts in _reaching(graph, fleet, "agent").items()
    }
    assert {m: ts for m, ts in wired.items() if ts} == {}
    node = [m for m in graph if _floor(m) == "agent"]
    assert set(_reaching(graph, node, "fleet")) <= FLEET_DOOR
    # What the fleet may share must not drag the daemon's wiring in behind it.
    for shared in SHARED_FROM_AGENT:
        assert {t for t in graph[shared] if _floor(t) == "agent"} <= SHARED_FROM_AGENT, shared


# Runs commands through the CLI's main() in one fresh interpreter and records, after each, its exit
# code, whether it printed RDMA series, which simulator modules and which fleet modules are loaded;
# the simulated scrape comes last, as the control.
PROBE = """
import contextlib, io, json, sys
from clusterhealth.agent.cli import main
runs = []
for argv in json.loads(sys.argv[1]):
    out = io.TextIOWrapper(io.BytesIO())
    with contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    out.flush()
    printed = out.buffer.getvalue().decode()
    loaded = sorted(m for m in sys.modules if m.startswith("clusterhealth.exporters.sim"))
    fleet = sorted(m for m in sys.modules if m.startswith("clusterhealth.fleet"))
    runs.append([code, "clusterhealth_rdma_port_state_id" in printed, loaded, fleet])
print(json.dumps(runs))
"""


def test_a_node_that_is_not_simulated_never_imports_the_simulator(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    tree = ["--sysfs-root", str(FIXTURES / "sysfs" / "cluster-node" / "sys"), "--kmsg-path", str(kmsg)]
    commands = [
        ["check", "--help"],
        ["agent", "--print-config"],
        ["scrape", *tree],
        ["check", *tree, "--format", "json"],
        ["scrape", *tree, "--simulate", str(SCENARIOS / "h100-healthy.yaml")],
    ]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "NODE_NAME": "node-1"},
    )
    assert result.returncode == 0, result.stderr
    (help_, print_config, scrape, check, simulated) = json.loads(result.stdout)
    # The fleet's commands are on the command line (their options), none of them loaded.
    door = ["clusterhealth.fleet", "clusterhealth.fleet.cli"]
    assert help_ == [0, False, [], door]
    assert print_config == [0, False, [], door]
    assert scrape == [0, True, [], door]  # every collector ran, the rdma one on the fixture tree
    assert check[0] in (0, 1, 2, 3) and check[2:] == [[], door]
    assert simulated[:2] == [0, True]
    assert {f"{SIMULATOR}.nvml", f"{SIMULATOR}.scenario"} <= set(simulated[2])


# The libraries the node daemon loads only for what asks for them, after one command run through
# the CLI's main() in a fresh interpreter.
HEAVY = """
import contextlib, io, json, sys
from clusterhealth.agent.cli import main
with contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):
    code = main(json.loads(sys.argv[1]))
print(json.dumps([code, sorted({m.split(".")[0] for m in sys.modules} & {"apscheduler", "bcrypt", "grpc"})]))
"""


def test_the_node_loads_apscheduler_bcrypt_and_grpc_only_for_what_needs_them(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    node = ["--sysfs-root", str(FIXTURES / "sysfs" / "cluster-node" / "sys"), "--kmsg-path", str(kmsg)]
    probe = tmp_path / "probe.yaml"
    probe.write_text(
        json.dumps(
            {
                "probing": {"state_dir": str(tmp_path / "state")},
                "probes": [{"name": "p", "argv": ["true"], "cron": "0 */6 * * *", "expect": "1 GB/s"}],
            }
        )
    )

    def loaded(*argv: str) -> list[object]:
        result = subprocess.run(
            [sys.executable, "-c", HEAVY, json.dumps(["scrape", *node, *argv])],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "NODE_NAME": "node-1"},
        )
        assert result.returncode == 0, result.stderr
        return list(json.loads(result.stdout))

    # ~6 MB of modules a node at its defaults does without: no probe schedule, no basic auth, no
    # kubelet socket.
    assert loaded() == [0, []]
    assert loaded("--config", str(probe)) == [0, ["apscheduler"]]
