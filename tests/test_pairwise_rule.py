"""The pairwise host rule in PromQL (deploy/prometheus/mixin.py, shown in docs/fabric.md), run by
`promtool test rules`. The series are what agents export (SPEC "Fabric"): each meeting's
`clusterhealth_probe_peer_success{probe,peer}` from both ends for part of a 15-minute round, and
`clusterhealth_node_info{node}`. Groups of five nodes (one sits out each round), in the case beside
the rule (deploy/prometheus/clusterhealth_mixin/fleet_cases.py):

* `hostfault`: h1 is bad, every meeting with it fails; the rule names h1 and none of its partners;
* `hostthree`: h1 fails with its first three partners and is fine with the fourth: named with
  three, exactly the partners the rule needs (`pairwise_host_partners`);
* `pathfault`: h2 and h5 fail together (a meeting and its confirmation), each fine with others;
  not a host: the rule names nobody (that is `analyze`'s job);
* `slowfleet`: every meeting fails; nobody is clean, the rule names nobody (a fleet-wide finding);
* before the third short meeting, nobody.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from .conftest import ROOT, require_tool
from .mixin import area_cases, mixin
from .test_prometheus_rules import RULES, promtool_test

DOC = ROOT / "docs" / "fabric.md"


def rule_expression() -> str:
    return str(mixin.pairwise_host(mixin.Config()))


def test_the_doc_shows_the_generated_rule() -> None:
    text = DOC.read_text()
    m = re.search(
        r"<!-- pairwise-host-rule:start -->\n```promql\n(.*?)\n```\n<!-- pairwise-host-rule:end -->",
        text,
        re.S,
    )
    assert m, "docs/fabric.md lost its pairwise host rule"
    assert m.group(1) == rule_expression(), "paste mixin.pairwise_host(Config()) into docs/fabric.md"


def test_the_pairwise_host_rule_names_the_bad_host_only(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {"name": "fabric", "rules": [{"alert": "PairwiseHostSuspect", "expr": rule_expression()}]}
                ]
            }
        )
    )
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The groups above, as the case beside the rule has them (it is in deploy/prometheus/tests.yaml).
    (case,) = [c for c in area_cases("fleet") if c.title == "the pairwise host rule"]
    assert [e.expr for e in case.exprs] == [rule_expression()] * 2
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(promtool_test(case, RULES), sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
