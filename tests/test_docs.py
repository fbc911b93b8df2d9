"""The docs describe what the code does: the config reference, the README's collector table, and the
metric and check tables of docs/metrics.md and docs/checks.md."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from clusterhealth.agent import config as configuration
from clusterhealth.agent.collectors import collectors_markdown
from clusterhealth.checks.audits import checks_markdown

from .conftest import FIXTURES, GOLDEN, ROOT, run_cli, samples

README = (ROOT / "README.md").read_text()
METRICS = (ROOT / "docs" / "metrics.md").read_text()
CHECKS = (ROOT / "docs" / "checks.md").read_text()


def test_configuration_reference_is_the_generated_one() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("<!-- reference:start -->\n", 1)[1].split("<!-- reference:end -->", 1)[0]
    assert section == configuration.reference_markdown(), (
        "regenerate with python -m clusterhealth.agent.config"
    )


def test_readme_collector_table_is_the_collector_table() -> None:
    assert collectors_markdown() in README, "paste clusterhealth.agent.collectors.collectors_markdown()"


def test_the_check_table_is_the_check_table() -> None:
    assert checks_markdown() in CHECKS, "paste checks.audits.checks_markdown() into docs/checks.md"


def test_the_metrics_page_lists_every_metric_the_agent_exports(tmp_path: Path) -> None:
    documented = set(re.findall(r"^\| `(clusterhealth_[a-z0-9_]+)` \|", METRICS, flags=re.M))
    # The golden file is the whole simulated node; it leaves out what changes from run to run.
    golden = (GOLDEN / "h100-faulty.prom").read_text()
    exported = {name for name, _ in samples(golden)} | {
        "clusterhealth_scrape_collector_duration_seconds",
        "clusterhealth_check_last_run_timestamp_seconds",
        "clusterhealth_node_verdict_since_timestamp_seconds",
        "clusterhealth_probe_last_run_timestamp_seconds",
        "clusterhealth_probe_duration_seconds",
    }
    # The counters_ext/ of kernels before 4.5 are only in node_exporter's fixture tree.
    result = run_cli(
        "scrape",
        "--sysfs-root",
        str(FIXTURES / "sysfs" / "node-exporter-fixture" / "sys"),
        "--kmsg-path",
        "/dev/null",
    )
    exported |= {name for name, _ in samples(result.stdout)}
    # The memory repair status is Blackwell's; the simulated node is an H100.
    blackwell = tmp_path / "repair.yaml"
    blackwell.write_text(yaml.safe_dump({"gpu_count": 1, "gpu": {"memory_repair_supported": True}}))
    result = run_cli(
        "scrape", "--simulate", str(blackwell), "--sysfs-root", str(tmp_path), "--kmsg-path", "/dev/null"
    )
    exported |= {name for name, _ in samples(result.stdout)}
    # The legacy counters_ext/ family is one row of the table, its siblings named in it.
    exported = {n for n in exported if "_legacy_" not in n or n.endswith("_legacy_data_received_bytes_total")}
    assert exported - documented == set(), "exported but not in docs/metrics.md"
    assert documented - exported == set(), "in docs/metrics.md but not exported by the simulated node"


def test_readme_gives_the_two_setup_commands() -> None:
    assert "make demo" in README and "make test" in README
