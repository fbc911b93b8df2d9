"""clusterhealth's Grafana dashboards as code, with Grafana's foundation SDK.

`python -m clusterhealth.dashboards.build` (`make generate`) writes the committed JSON beside this
file: a fleet overview, a node view, a fabric view and a jobs view, one module each (`fleet.py`,
`node.py`, `fabric.py`, `jobs.py`), built from the panel helpers of `panels.py`. Each has a fixed
uid, the `clusterhealth` tag, variables for the data source, the job and the node, and
`$__rate_interval` in its rates. The tests regenerate them byte for byte, validate them against
Grafana's dashboard JSON schema, check every `clusterhealth_*` name against the agent's exposition
and the recording rules, run every query on a real Prometheus that scraped simulated nodes, and
check that every panel shows the fault it is there for, as Grafana would show it
(tests/test_dashboards_seen.py).

The SDK is a development dependency (the `test` extra); the agent never imports this module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from clusterhealth.dashboards import fabric, fleet, jobs, node

HERE = Path(__file__).resolve().parent

DASHBOARDS = {
    "clusterhealth-fleet.json": fleet.dashboard,
    "clusterhealth-node.json": node.dashboard,
    "clusterhealth-fabric.json": fabric.dashboard,
    "clusterhealth-jobs.json": jobs.dashboard,
}


def render(build: gd.Dashboard) -> str:
    built = build.build()
    # Stable panel ids in reading order: links to a panel (viewPanel=N) survive a regeneration.
    for n, panel in enumerate(built.panels or [], start=1):
        panel.id_val = n
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else HERE
    for name, make in DASHBOARDS.items():
        (out / name).write_text(render(make()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
