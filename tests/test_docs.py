"""The docs describe what the code does: the config reference and the README's metric table."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from clusterhealth.agent import config as configuration
from clusterhealth.agent.probing import ProbeRunner, ProbeService
from clusterhealth.checks.audits import checks_markdown

from .conftest import FIXTURES, GOLDEN, ROOT, run_cli, samples

README = (ROOT / "README.md").read_text()


def test_configuration_reference_is_the_generated_one() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("<!-- reference:start -->\n", 1)[1].split("<!-- reference:end -->", 1)[0]
    assert section == configuration.reference_markdown(), (
        "regenerate with python -m clusterhealth.agent.config"
    )


def test_readme_check_table_is_the_check_table() -> None:
    assert checks_markdown() in README, "paste clusterhealth.checks.audits.checks_markdown() into the README"


def _probe_exposition(tmp_path: Path) -> str:
    """The probes' metrics after one real run that replays a real nccl-tests capture."""
    capture = FIXTURES / "nccl-tests" / "08_single_node_8x_h100_allreduce.txt"
    probe = configuration.ProbeConfig(
        name="replay", kind="nccl-tests", argv=("cat", str(capture)), expect="400 GB/s"
    )
    probing = configuration.ProbingConfig(state_dir=str(tmp_path), check_gpus_idle=False)
    service = ProbeService(probing, (probe,), ProbeRunner(probing, None))
    (run,) = service.run_probe(probe)
    assert run.outcome.result == "ok", run.outcome.reason
    return generate_latest(service).decode()


def test_readme_lists_every_metric_the_agent_exports(tmp_path: Path) -> None:
    documented = set(re.findall(r"^\| `(clusterhealth_[a-z0-9_]+)` \|", README, flags=re.M))
    golden = (GOLDEN / "h100-faulty.prom").read_text()
    # The golden file leaves out the durations, which change from run to run.
    exported = {name for name, _ in samples(golden)} | {
        "clusterhealth_scrape_collector_duration_seconds",
        "clusterhealth_check_last_run_timestamp_seconds",
    }
    for tree in ("cluster-node", "node-exporter-fixture"):
        result = run_cli(
            "scrape", "--sysfs-root", str(FIXTURES / "sysfs" / tree / "sys"), "--kmsg-path", "/dev/null"
        )
        exported |= {name for name, _ in samples(result.stdout)}
    exported |= {name for name, _ in samples(_probe_exposition(tmp_path))}
    # The legacy counters_ext/ family is one row of the table, its siblings named in it.
    exported = {n for n in exported if "_legacy_" not in n or n.endswith("_legacy_data_received_bytes_total")}
    assert exported - documented == set(), "exported but not in the README"
    assert documented - exported == set(), "in the README but not exported by the faulty scenario"


def test_readme_gives_the_two_setup_commands() -> None:
    assert "make demo" in README and "make test" in README
