"""clusterhealth's Prometheus recording rules and alerts, generated from code (a mixin).

The rules live in clusterhealth_mixin/ beside this file, one module per alert area, with their
selectors and thresholds the fields of `Config` (clusterhealth_mixin/config.py). `python
deploy/prometheus/mixin.py` writes the committed files (`make generate`: the rules, the chart's
copy, docs/deploy.md's tables, the runbook index and the Xid runbook's table, the Alertmanager
example's inhibitions and tests.yaml, the promtool tests of the areas' cases), and `--config FILE`
regenerates them with a user's own values (a YAML mapping of field names, e.g. `{selector:
'job="gpu-health"', for_sustained: 30m}`). tests/test_prometheus_rules.py regenerates with the
defaults and compares byte for byte; docs/adding-an-alert.md is the recipe for a new alert.

Conventions (kubernetes-mixin, node-mixin): recording rules are named `level:metric:operations`;
every alert has `severity` (`critical` pages someone now, `warning` is a ticket), a summary
naming the node (`instance`) and the device, a description with the likely cause and the first
action, and a `runbook_url` to docs/runbooks/<Alert>.md.

Metric names are the agent's own (README and SPEC); a test checks each one against the
exposition of a real agent.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

# Run as a script, this file's folder is on sys.path; imported by path (tests/mixin.py), the
# package is loaded first under the same name.
from clusterhealth_mixin.alertmanager import inhibit_rules, inhibitions_yaml, with_inhibitions
from clusterhealth_mixin.areas import alerts, cases, groups
from clusterhealth_mixin.cases import Case, Expr, Firing, Sample, promtool_group, tests_file
from clusterhealth_mixin.config import CRITICAL_XIDS, TEST_PROFILE, TICKET_XIDS, Config, load_config
from clusterhealth_mixin.docs import (
    reference_markdown,
    runbook_index,
    with_reference,
    with_runbook_index,
    xid_runbook,
)
from clusterhealth_mixin.fleet import pairwise_host
from clusterhealth_mixin.jobs import job_signals
from clusterhealth_mixin.lib import SUBJECTS, Alert, Group, Record
from clusterhealth_mixin.rulefile import render, render_tests, rule_file
from clusterhealth_mixin.templates import expand

ROOT = Path(__file__).resolve().parent.parent.parent
RULES_FILE = ROOT / "deploy" / "prometheus" / "clusterhealth-rules.yaml"
XID_RUNBOOK = ROOT / "docs" / "runbooks" / "GPUXidCritical.md"
RUNBOOK_INDEX = ROOT / "docs" / "runbooks" / "README.md"
# The Helm chart's PrometheusRule is built from this copy (helm reads files inside the chart only).
CHART_RULES_FILE = (
    ROOT / "deploy" / "kubernetes" / "helm" / "clusterhealth" / "files" / "clusterhealth-rules.yaml"
)
ALERTMANAGER_FILE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
DOC_FILE = ROOT / "docs" / "deploy.md"
# The promtool tests of the rules, beside them: `promtool test rules deploy/prometheus/tests.yaml`.
TESTS_FILE = ROOT / "deploy" / "prometheus" / "tests.yaml"

__all__ = [
    "CRITICAL_XIDS",
    "SUBJECTS",
    "TEST_PROFILE",
    "TICKET_XIDS",
    "Alert",
    "Case",
    "Config",
    "Expr",
    "Firing",
    "Group",
    "Record",
    "Sample",
    "alerts",
    "cases",
    "expand",
    "groups",
    "inhibit_rules",
    "inhibitions_yaml",
    "job_signals",
    "load_config",
    "main",
    "pairwise_host",
    "promtool_group",
    "reference_markdown",
    "render",
    "render_tests",
    "rule_file",
    "runbook_index",
    "tests_file",
    "with_inhibitions",
    "with_reference",
    "with_runbook_index",
    "xid_runbook",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="YAML mapping of Config fields to override")
    parser.add_argument("--output", type=Path, default=RULES_FILE, help=f"default {RULES_FILE}")
    parser.add_argument("--test-profile", action="store_true", help="short durations, for tests")
    args = parser.parse_args(argv)
    config = load_config(args.config, TEST_PROFILE if args.test_profile else None)
    rules = render(config)
    args.output.write_text(rules)
    if args.output == RULES_FILE:
        CHART_RULES_FILE.write_text(rules)
        DOC_FILE.write_text(with_reference(DOC_FILE.read_text(), config))
        XID_RUNBOOK.write_text(xid_runbook(XID_RUNBOOK.read_text(), config))
        RUNBOOK_INDEX.write_text(with_runbook_index(RUNBOOK_INDEX.read_text(), config))
        ALERTMANAGER_FILE.write_text(with_inhibitions(ALERTMANAGER_FILE.read_text(), config))
        if config == Config():
            TESTS_FILE.write_text(render_tests(config))
        else:
            print(f"{TESTS_FILE} not rewritten: its cases are for the default parameters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
