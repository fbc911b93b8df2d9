"""The pairwise host rule in PromQL (deploy/prometheus/mixin.py, shown in docs/fabric.md), run by
`promtool test rules`. The series are what agents export (SPEC "Fabric"): each meeting's
`clusterhealth_probe_peer_success{probe,peer}` from both ends for part of a 15-minute round, and
`clusterhealth_node_info{node}`. Groups of five nodes (one sits out each round):

* `hostfault`: h1 is bad, every meeting with it fails; the rule names h1 and none of its partners;
* `pathfault`: h2 and h5 fail together (a meeting and its confirmation), each fine with others;
  not a host: the rule names nobody (that is `analyze`'s job);
* `slowfleet`: every meeting fails; nobody is clean, the rule names nobody (a fleet-wide finding);
* before the third short meeting, nobody.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import yaml

from .conftest import ROOT, require_tool
from .mixin import mixin

DOC = ROOT / "docs" / "fabric.md"
ROUNDS = [
    [("h1", "h2"), ("h3", "h4")],
    [("h1", "h3"), ("h2", "h5")],
    [("h1", "h4"), ("h3", "h5")],
    [("h1", "h5"), ("h2", "h4")],
]


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


def _series(probe: str, fails: Callable[[str, str], bool]) -> list[dict[str, str]]:
    """Each meeting exported by both ends for 5 minutes from its round's start, 1 or 0."""
    values: dict[tuple[str, str], list[str]] = {}
    for k, pairs in enumerate(ROUNDS):
        for a, b in pairs:
            ok = "0" if fails(a, b) else "1"
            for x, y in ((a, b), (b, a)):
                row = values.setdefault((x, y), ["_"] * 60)
                for minute in range(15 * k, 15 * k + 5):
                    row[minute] = ok
    out = []
    for (node, peer), row in values.items():
        labels = f'instance="{node}:9845",job="clusterhealth",peer="{peer}",probe="{probe}"'
        out.append({"series": f"clusterhealth_probe_peer_success{{{labels}}}", "values": " ".join(row)})
    return out


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
    nodes = [
        {
            "series": f'clusterhealth_node_info{{instance="h{i}:9845",job="clusterhealth",node="h{i}"}}',
            "values": "1x60",
        }
        for i in range(1, 6)
    ]
    bad_h1 = _series("hostfault", lambda a, b: "h1" in (a, b))
    path = _series("pathfault", lambda a, b: {a, b} == {"h2", "h5"})
    # The pair meets in round 1; its confirmation, in the second half of round 2, fails too.
    for x, y in (("h2", "h5"), ("h5", "h2")):
        labels = f'instance="{x}:9845",job="clusterhealth",peer="{y}",probe="pathfault"'
        confirming = " ".join(["_"] * 38 + ["0"] * 5 + ["_"] * 17)
        path.append({"series": f"clusterhealth_probe_peer_success{{{labels}}}", "values": confirming})
    fleet = _series("slowfleet", lambda a, b: True)
    suspect = {"job": "clusterhealth", "instance": "h1:9845", "probe": "hostfault", "pairwise": "host"}
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": nodes + bad_h1 + path + fleet,
                "alert_rule_test": [
                    {
                        "eval_time": "50m",
                        "alertname": "PairwiseHostSuspect",
                        "exp_alerts": [{"exp_labels": suspect}],
                    },
                    # Two short meetings of h1 so far: not yet.
                    {"eval_time": "20m", "alertname": "PairwiseHostSuspect", "exp_alerts": []},
                ],
            }
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
