"""The agent's own alerts (group `clusterhealth.agent`): an agent not scraped, none scraped at
all, a collector failing. Cases: agent_cases.py; runbooks: docs/runbooks/<Alert>.md."""

from __future__ import annotations

from .config import Config
from .lib import Alert, Group, selector


def group(c: Config) -> Group:
    return Group("clusterhealth.agent", [agent_down_warning(c), agent_down_critical(c), collector_failing(c)])


def agent_down_warning(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "ClusterHealthAgentDown",
        "warning",
        f"up{m()} == 0",
        "The clusterhealth agent on {{ $labels.instance }} cannot be scraped.",
        "Prometheus cannot scrape the agent: the node is down, or the agent stopped or "
        "hangs. Its GPUs and HCAs are not watched (their alerts are inhibited meanwhile). "
        "Check `systemctl status clusterhealth` or the DaemonSet pod on the node.",
        c.for_agent,
        about="node",
    )


def agent_down_critical(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "ClusterHealthAgentDown",
        "critical",
        f"absent(up{m()})",
        "No clusterhealth agent is scraped by Prometheus.",
        "No target of the clusterhealth job exists: the scrape configuration or service "
        "discovery lost the agents, and no GPU node is watched. Check the scrape job, the "
        "ServiceMonitor or the DaemonSet.",
        c.for_absent,
        about="fleet",
    )


def collector_failing(c: Config) -> Alert:
    m = selector(c)
    return Alert(
        "CollectorFailing",
        "warning",
        f"clusterhealth_scrape_collector_success{m()} == 0",
        "Collector {{ $labels.collector }} of the agent on {{ $labels.instance }} is failing.",
        "The collector's last run failed or hangs (NVML unusable, sysfs or the kernel log "
        "unreadable): its series are missing, so alerts on them cannot fire. Read the "
        "agent's log and /healthz on the node.",
        c.for_agent,
        about="collector",
    )
