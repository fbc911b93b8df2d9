"""The remediator's configuration file and command line: what it accepts, and how it refuses the
rest (exit 2 naming the file, the key and what was expected)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clusterhealth.agent.settings import ConfigError
from clusterhealth.fleet.remediate.config import RemediateConfig, load, reference_markdown, with_reference

from .conftest import ROOT, run_cli
from .prom import free_port

DOC = ROOT / "docs" / "remediation.md"


def test_the_shipped_example_and_no_file_load() -> None:
    assert load(None) == RemediateConfig()
    example = load(ROOT / "deploy" / "remediate.yaml")
    assert example.budget.max_unavailable == 1 and example.budget.slow_start


def test_the_reference_in_the_docs_is_the_declarations() -> None:
    page = DOC.read_text()
    assert reference_markdown() in page and with_reference(page) == page, "run `make generate`"


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("hold_seconds: -1\n", "hold_seconds", "a number between 0 and"),
        ("budget: {max_unavailable: two}\n", "budget.max_unavailable", "an integer"),
        ("budget: {max_unavailabel: 2}\n", "budget.max_unavailabel", "one of the known keys"),
        ("act_on_states: [healthy]\n", "act_on_states", "never healthy or unknown"),
        ("act_on_actions: [restart_job]\n", "act_on_actions", "take a node out of service"),
        ("veto: ['n 1']\n", "veto", "node names or glob patterns"),
        ("domains: {Rack: {n1: r1}}\n", "domains", "a mapping of domain kinds"),
        ("slurm: {domain_features: {rack: 'rack-.+'}}\n", "slurm.domain_features", "one group"),
        ("fabric: {action: restart_job}\n", "fabric.action", "one of reset_gpu"),
    ],
)
def test_a_bad_value_names_the_file_the_key_and_what_was_expected(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    path = tmp_path / "remediate.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert err.value.source == str(path) and err.value.key == key and expected in err.value.expected


def test_a_bad_config_exits_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "remediate.yaml"
    path.write_text("budget:\n  max_unavailable: -3\n")
    done = run_cli(
        "remediate", "--prometheus", "http://127.0.0.1:9", "--backend", "slurm", "--config", str(path)
    )
    assert done.returncode == 2
    assert f"{path}: budget.max_unavailable: expected a number between 0 and" in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--prometheus", "prometheus:9090", "--backend", "slurm"],
            "--prometheus: expected http(s)://HOST:PORT",
        ),
        (["--prometheus", "http://p:9090", "--backend", "pbs"], "invalid choice: 'pbs'"),
        (["--prometheus", "http://p:9090", "--backend", "slurm", "--listen", "9846"], "--listen: expected"),
        (["--prometheus", "http://p:9090", "--backend", "slurm", "--fabric", "a b"], "--fabric: expected"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], said: str) -> None:
    done = run_cli("remediate", *args)
    assert done.returncode == 2 and said in done.stderr


def test_an_unreachable_prometheus_exits_3_and_touches_nothing(tmp_path: Path) -> None:
    config = tmp_path / "remediate.yaml"
    config.write_text(f"slurm: {{state_dir: {tmp_path / 'state'}}}\n")
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli(
        "remediate", "--prometheus", url, "--backend", "slurm", "--config", str(config), "--once", "--act"
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert re.search(r"^no action: cannot reach Prometheus at http://127\.0\.0\.1:\d+", done.stdout, re.M)
    assert not (tmp_path / "state").exists()
