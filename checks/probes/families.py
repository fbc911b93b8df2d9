"""The families of SPEC "Probes" and "Fabric", which the scheduled probes (collector.py) and the
pairwise groups' rounds (checks/fabric/rounds.py) fill together: one of each per exposition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from clusterhealth.checks import probe_parsers
from clusterhealth.checks.fabric.topology import PLACE_KEYS
from clusterhealth.checks.probes.evaluate import RESULTS
from clusterhealth.checks.probes.store import Runs


@dataclass
class ProbeFamilies:
    """The families of SPEC "Probes" and "Fabric": one of each per exposition, whoever fills them
    (scheduled probes and pairwise groups share the probe families)."""

    success: GaugeMetricFamily
    runs: CounterMetricFamily
    last_run: GaugeMetricFamily
    duration: GaugeMetricFamily
    bandwidth: GaugeMetricFamily
    expected: GaugeMetricFamily
    wrong: GaugeMetricFamily
    transport: GaugeMetricFamily
    peer_success: GaugeMetricFamily
    round: GaugeMetricFamily
    members: GaugeMetricFamily
    placement: GaugeMetricFamily

    @classmethod
    def new(cls) -> ProbeFamilies:
        return cls(
            success=GaugeMetricFamily(
                "clusterhealth_probe_success",
                "1 if the probe's last run completed and met its expectation.",
                labels=["probe"],
            ),
            runs=CounterMetricFamily(
                "clusterhealth_probe_runs_total", "Probe runs by result.", labels=["probe", "result"]
            ),
            last_run=GaugeMetricFamily(
                "clusterhealth_probe_last_run_timestamp_seconds",
                "When the probe last ran (Unix time).",
                labels=["probe"],
            ),
            duration=GaugeMetricFamily(
                "clusterhealth_probe_duration_seconds",
                "How long the probe's last run took.",
                labels=["probe"],
            ),
            bandwidth=GaugeMetricFamily(
                "clusterhealth_probe_bandwidth_bytes_per_second",
                f"Headline bandwidth of the last completed run, by kind: {probe_parsers.headline_help()}.",
                labels=["probe", "peer"],
            ),
            expected=GaugeMetricFamily(
                "clusterhealth_probe_expected_bandwidth_bytes_per_second",
                "The configured or learned bandwidth the probe is held to.",
                labels=["probe"],
            ),
            wrong=GaugeMetricFamily(
                "clusterhealth_probe_wrong_values",
                "What the last run found wrong in the data it moved, by kind: "
                f"{probe_parsers.wrong_values_help()}.",
                labels=["probe"],
            ),
            transport=GaugeMetricFamily(
                "clusterhealth_probe_transport_info",
                "The transports NCCL's INFO lines say the probe's last run used, 1: net (IB, Socket, "
                "OFI, ...), gdrdma (whether GPUDirect RDMA carried network channels), intra (P2P, SHM, "
                "NVLS or mixed); empty where the output did not say (NCCL_DEBUG=INFO makes it say).",
                labels=["probe", "net", "gdrdma", "intra"],
            ),
            peer_success=GaugeMetricFamily(
                "clusterhealth_probe_peer_success",
                "1 if this round's meeting with the partner met its expectation, 0 if it was degraded, "
                "failed or timed out; absent when the round was skipped.",
                labels=["probe", "peer"],
            ),
            round=GaugeMetricFamily(
                "clusterhealth_probe_round",
                "The round (Unix time // period) the node's current pairwise results belong to.",
                labels=["probe"],
            ),
            members=GaugeMetricFamily(
                "clusterhealth_probe_group_members",
                "Members of the pairwise group in this node's inventory.",
                labels=["probe"],
            ),
            placement=GaugeMetricFamily(
                "clusterhealth_probe_placement_info",
                "Where this node sits in the pairwise group's fabric, as its members file says: leaf "
                "switch, spine group, pod, rail (empty where not said); value 1, absent when unplaced.",
                labels=["probe", *PLACE_KEYS],
            ),
        )

    def add_runs(self, probe: str, state: Runs[Any]) -> None:
        """A probe's or a group's runs by result, and its last run's series."""
        for result in RESULTS:
            self.runs.add_metric([probe, result], float(state.runs[result]))
        if state.last_any is not None:
            self.last_run.add_metric([probe], state.last_any.started_at)
        if state.last is not None:
            outcome = state.last.outcome
            self.success.add_metric([probe], 1.0 if outcome.success else 0.0)
            self.duration.add_metric([probe], state.last.duration_seconds)
            if outcome.expected_bytes_per_second is not None:
                self.expected.add_metric([probe], outcome.expected_bytes_per_second)

    def all(self) -> list[Metric]:
        families: list[Metric] = [
            self.success,
            self.runs,
            self.last_run,
            self.duration,
            self.bandwidth,
            self.expected,
            self.wrong,
            self.transport,
            self.peer_success,
            self.round,
            self.members,
            self.placement,
        ]
        return [f for f in families if f.samples]
