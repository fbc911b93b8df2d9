"""How the package's modules import each other: no circle, and no simulator on a real node."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from .conftest import FIXTURES, ROOT, SCENARIOS

FOLDERS = ("agent", "exporters", "checks", "dashboards")
SIMULATOR = "clusterhealth.exporters.sim"


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


def test_exporters_and_checks_never_import_the_agent() -> None:
    # agent/ wires the others and is the only package that knows them all (docs/adding-a-collector.md):
    # a collector, a probe or a setting that reached back into it would tie the floors together.
    graph = import_graph()
    below = [m for m in graph if m.startswith(("clusterhealth.exporters", "clusterhealth.checks"))]
    assert "clusterhealth.checks.probes.collector" in below and "clusterhealth.checks.fabric.rounds" in below
    reaching = {
        m: sorted(t for t in graph[m] if t.split(".")[:2] == ["clusterhealth", "agent"]) for m in below
    }
    assert {m: targets for m, targets in reaching.items() if targets} == {}


# Runs commands through the CLI's main() in one fresh interpreter and records, after each, its exit
# code, whether it printed RDMA series, and which simulator modules are loaded; the simulated
# scrape comes last, as the control.
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
    runs.append([code, "clusterhealth_rdma_port_state_id" in printed, loaded])
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
    assert help_ == [0, False, []]
    assert print_config == [0, False, []]
    assert scrape == [0, True, []]  # every collector ran, the rdma one on the fixture tree
    assert check[0] in (0, 1, 2, 3) and check[2] == []
    assert simulated[:2] == [0, True]
    assert {f"{SIMULATOR}.nvml", f"{SIMULATOR}.scenario"} <= set(simulated[2])
