"""The `probes` collector: the scheduled fabric probes, when they run (APScheduler), their results
and the probe families, with the pairwise groups' rounds (checks/fabric/rounds.py) it starts,
stops and exports beside them.

A run goes through the probe pipeline (pipeline.py), as a pairwise meeting does: the node's probe
lock, the idle guard, the command filled in, the idle guard again right before launch, the run
(runner.py), its output parsed and evaluated against the configured or learned expectation, and
learned from. Its result is kept in `probing.state_dir` (store.py), so that `clusterhealth scrape`,
`clusterhealth probe run` and a restarted agent see it.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import Metric

from clusterhealth.checks.probe_parsers.nccl_transport import Transport
from clusterhealth.checks.probes import ProbeOutcome
from clusterhealth.checks.probes.families import ProbeFamilies
from clusterhealth.checks.probes.pipeline import Job, Pipeline, run_once
from clusterhealth.checks.probes.settings import ProbeConfig, ProbingConfig
from clusterhealth.checks.probes.store import (
    Format,
    Runs,
    StateStore,
    decode_counts,
    decode_record,
    encode_runs,
)
from clusterhealth.exporters.base import CollectorFailed
from clusterhealth.exporters.nvml import GpuGone, NvmlSession, NvmlUnavailable

if TYPE_CHECKING:
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger("clusterhealth.probes")

RESULTS_FILE = "probe-results.json"


@dataclass(frozen=True)
class PeerRun:
    """One run of one probe against one peer ("" for a node-local probe)."""

    probe: str
    peer: str
    outcome: ProbeOutcome
    started_at: float  # wall clock
    duration_seconds: float
    command: str


class ProbeRunner:
    """Runs one configured probe now, against each of its peers in turn, through the pipeline."""

    def __init__(self, pipeline: Pipeline, session: NvmlSession | None, node_name: str | None = None):
        """`session` counts the GPUs for ``{gpus}`` (None: 0)."""
        self.pipeline = pipeline
        self.node_name = node_name or socket.gethostname().split(".", 1)[0]
        self._session = session

    def run(self, probe: ProbeConfig) -> list[PeerRun]:
        return [self.run_peer(probe, peer) for peer in probe.peers or ("",)]

    def run_peer(self, probe: ProbeConfig, peer: str) -> PeerRun:
        started_at, start = time.time(), time.monotonic()
        job = Job(
            probe.name,
            probe.kind,
            probe.argv,
            lambda: {"peer": peer, "node": self.node_name, "gpus": self._gpus()},
            expect=probe.expect,
            degraded_fraction=probe.degraded_fraction,
            baseline_peer=peer,
            env=probe.env,
        )
        played = self.pipeline.play(job, run_once(probe.timeout_seconds))
        return PeerRun(probe.name, peer, played.outcome, started_at, time.monotonic() - start, played.command)

    def _gpus(self) -> str:
        if self._session is None:
            return "0"
        try:
            return str(len(self._session.devices()))
        except (NvmlUnavailable, GpuGone):
            return "0"


@dataclass
class _ProbeState(Runs[PeerRun]):
    bandwidth: dict[str, float] = field(default_factory=dict)  # peer -> bytes/s of its last completed run


def _encode(states: dict[str, _ProbeState]) -> dict[str, Any]:
    probes = {name: {**encode_runs(state), "bandwidth": state.bandwidth} for name, state in states.items()}
    return {"version": 1, "probes": probes}


def _decode(document: Any) -> dict[str, _ProbeState]:
    """The results of a state file; ValueError naming what is wrong."""
    if not isinstance(document, dict) or document.get("version") != 1:
        raise ValueError("not a version 1 probe results file")
    probes = document.get("probes")
    if not isinstance(probes, dict):
        raise ValueError("'probes' is not an object")
    try:
        return {
            str(name): _ProbeState(
                decode_counts(data["runs"]),
                decode_record(PeerRun, data["last"]),
                decode_record(PeerRun, data["last_any"]),
                {str(peer): float(v) for peer, v in data["bandwidth"].items()},
            )
            for name, data in probes.items()
        }
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"malformed probe results ({type(err).__name__}: {err})") from err


# The probes' results (runs by result, last runs, each peer's last bandwidth), kept in
# `probing.state_dir` so that `scrape`, a restarted agent and `probe run` all see them.
RESULTS_FORMAT = Format(
    "probe results", dict, _encode, _decode, unreadable_note="; they are kept in memory only"
)


class ProbeService:
    """The probes' schedule inside the agent, their latest results, and the `probes` collector.

    Without `start()` (one-shot `scrape`, `probe run`) nothing is scheduled and the collector
    exports the results kept in the state directory.
    """

    name = "probes"

    def __init__(
        self,
        probing: ProbingConfig,
        probes: tuple[ProbeConfig, ...],
        runner: ProbeRunner,
        groups: Sequence[Rounds] = (),
    ):
        self.probing, self.probes, self.runner = probing, probes, runner
        self.groups = tuple(groups)
        self.results = StateStore(Path(probing.state_dir) / RESULTS_FILE, RESULTS_FORMAT)
        self.scheduler: BackgroundScheduler | None = None
        scheduled = [probe for probe in probes if probe.enabled]
        if scheduled:
            # APScheduler (and the multiprocessing and zoneinfo modules it loads, ~4 MB) only on
            # a node that schedules probes.
            from apscheduler.executors.pool import ThreadPoolExecutor
            from apscheduler.schedulers.background import BackgroundScheduler

            # One worker: the scheduler never starts a second probe while one runs (the lock
            # file also keeps out `clusterhealth probe run` and other agents).
            self.scheduler = BackgroundScheduler(
                executors={"default": ThreadPoolExecutor(max_workers=1)},
                job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            )
        for probe in scheduled:
            assert self.scheduler is not None
            self.scheduler.add_job(
                self.run_probe, trigger=_trigger(probe), args=[probe], id=probe.name, name=probe.name
            )

    def start(self) -> None:
        for group in self.groups:
            group.start()
        if self.scheduler is not None:
            self.scheduler.start()
            for job in self.scheduler.get_jobs():
                log.info("probe %s scheduled, next run at %s", job.id, job.next_run_time)

    def close(self) -> None:
        for group in self.groups:
            group.close()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def run_probe(self, probe: ProbeConfig) -> list[PeerRun]:
        runs = self.runner.run(probe)

        def record(states: dict[str, _ProbeState]) -> None:
            for peer_run in runs:
                state = states.setdefault(peer_run.probe, _ProbeState())
                state.count(peer_run)
                if peer_run.outcome.bandwidth_bytes_per_second is not None:
                    state.bandwidth[peer_run.peer] = peer_run.outcome.bandwidth_bytes_per_second

        self.results.update(record)
        for peer_run in runs:
            _log_run(peer_run)
        return runs

    def collect(self) -> list[Metric]:
        families = ProbeFamilies.new()
        states = self.results.read()
        for name in (p.name for p in self.probes):
            state = states.get(name, _ProbeState())
            families.add_runs(name, state)
            for peer, value in sorted(state.bandwidth.items()):
                families.bandwidth.add_metric([name, peer], value)
            if state.last is None:
                continue
            outcome = state.last.outcome
            if outcome.wrong_values is not None:
                families.wrong.add_metric([name], float(outcome.wrong_values))
            if outcome.transport is not None and outcome.transport.said:
                families.transport.add_metric([name, *_transport_labels(outcome.transport)], 1.0)
        problems = [self.results.problem] if self.results.problem is not None else []
        for group in self.groups:
            group.collect(families)
            if group.problem is not None:
                problems.append(group.problem)
        if problems:
            raise CollectorFailed("; ".join(problems), families.all())
        return families.all()


class Rounds(Protocol):
    """A pairwise group's rounds on this node (checks/fabric/rounds.py): started and closed with the
    probes' schedule, and exported with the probes' families."""

    @property
    def problem(self) -> str | None: ...
    def start(self) -> None: ...
    def close(self) -> None: ...
    def collect(self, families: ProbeFamilies) -> None: ...


def _transport_labels(transport: Transport) -> list[str]:
    gdrdma = "" if transport.gdrdma is None else str(transport.gdrdma).lower()
    return [transport.net or "", gdrdma, transport.intra or ""]


def _trigger(probe: ProbeConfig) -> CronTrigger | IntervalTrigger:
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    jitter = int(probe.jitter_seconds) or None
    if probe.cron:
        # APScheduler 3's from_crontab takes no jitter: the same five fields, with it.
        minute, hour, day, month, day_of_week = probe.cron.split()
        return CronTrigger(
            minute=minute, hour=hour, day=day, month=month, day_of_week=day_of_week, jitter=jitter
        )
    return IntervalTrigger(seconds=probe.interval_seconds, jitter=jitter)


def _log_run(peer_run: PeerRun) -> None:
    outcome = peer_run.outcome
    where = f"probe {peer_run.probe}" + (f" to {peer_run.peer}" if peer_run.peer else "")
    level = logging.INFO if outcome.result in ("ok", "skipped") else logging.WARNING
    log.log(level, "%s: %s: %s (%.1fs)", where, outcome.result, outcome.reason, peer_run.duration_seconds)
