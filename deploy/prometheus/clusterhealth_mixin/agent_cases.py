"""promtool cases of the agent's alerts (agent.py)."""

from __future__ import annotations

from .cases import Case, F, Firing, S

CASES = [
    Case(
        "ClusterHealthAgentDown",
        "one agent unreachable for 5m warns; the others are up",
        {
            S("up", {"instance": "n1"}): "1x5 0x10",
            S("up", {"instance": "n2"}): "1x15",
        },
        [("8m", []), ("14m", [F({"instance": "n1"}, "warning", 0)])],
    ),
    Case(
        "ClusterHealthAgentDown",
        "no target of the job at all pages after 15m; another job's targets do not count",
        {'up{job="node",instance="n1:9100"}': "1x30"},
        [("10m", []), ("20m", [Firing({"job": "clusterhealth"}, "critical", 1)])],
    ),
    Case(
        "CollectorFailing",
        "the gpu collector fails from 6m; rdma keeps succeeding",
        {
            S("clusterhealth_scrape_collector_success", {"collector": "gpu"}): "1x5 0x15",
            S("clusterhealth_scrape_collector_success", {"collector": "rdma"}): "1x20",
        },
        [("8m", []), ("15m", [F({"collector": "gpu"}, "warning", 0)])],
    ),
]
