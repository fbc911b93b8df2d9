"""One probe run, end to end: the one pipeline of the scheduled probes and the pairwise meetings.

In order, under the node's probe lock (one probe at a time, also against `clusterhealth probe run`
and a second agent):

1. the idle guard: a node that runs a job is not probed (``skipped``);
2. the command, its placeholders filled in (``failed`` when it cannot be);
3. the run, played by the caller's ``step``, which asks the idle guard again right before it
   launches the tool (a job may have started meanwhile). A scheduled probe runs the tool once
   (``run_once``); a pairwise meeting serves or connects, maybe several times
   (checks/fabric/meeting.py);
4. each finished run's output parsed and judged (``Judge``) against the expectation: the configured
   bandwidth, or the one learned from the probe's past good runs (baseline.py); evaluate.py says
   ok, degraded, failed or timeout;
5. the baseline learns from the outcome (only an ``ok`` one, only when nothing is configured).

The machinery of each step is in its own module of this package; this one chains them, so the two
kinds of probes cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterhealth.checks import probe_parsers
from clusterhealth.checks.probe_parsers import ProbeKind, ProbeParse
from clusterhealth.checks.probes.baseline import BaselineStore
from clusterhealth.checks.probes.evaluate import ProbeOutcome, evaluate, skipped
from clusterhealth.checks.probes.idle import IdleGuard
from clusterhealth.checks.probes.lock import ProbeLock
from clusterhealth.checks.probes.runner import RunResult, run, template
from clusterhealth.checks.probes.settings import ProbingConfig, parse_bandwidth
from clusterhealth.checks.probes.transport import NodeLinks
from clusterhealth.exporters.nvml import NvmlSession

LOCK_FILE = "probe.lock"


@dataclass(frozen=True)
class Job:
    """One run of a probe, or one end of a meeting, to play."""

    probe: str  # the probe label: the lock's holder, the baseline's name
    kind: str  # how the output is read (probe_parsers.REGISTRY)
    argv: Sequence[str]  # with {placeholders}
    # What fills them in, asked under the lock once the node is idle ({gpus} asks NVML).
    values: Callable[[], Mapping[str, str]]
    expect: str = "learn"  # a bandwidth ('400 Gb/s'), or learn: the baseline
    degraded_fraction: float | None = None  # None: probing.degraded_fraction
    # Whose baseline: a scheduled probe learns one per peer; a pairwise group one for all partners ("").
    baseline_peer: str = ""
    env: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Judge:
    """Judges one finished run by its parsed output, against a configured bandwidth or the baseline
    learned for (``probe``, ``peer``); and lets the baseline learn from an outcome."""

    kind: str
    degraded_fraction: float
    configured: float | None = None  # bytes/s the config expects; None: the learned baseline
    baselines: BaselineStore | None = None  # None: nothing learned, nothing expected
    probe: str = ""
    peer: str = ""
    # What the node offers NCCL, read when a kind that says its transport is judged; None: unknown.
    node_links: Callable[[], NodeLinks] | None = None

    def __call__(self, result: RunResult, parse: ProbeParse | None) -> ProbeOutcome:
        expected = self.configured
        if expected is None and self.baselines is not None:
            expected = self.baselines.expected(self.probe, self.peer)
        declared = probe_parsers.REGISTRY.get(self.kind)
        says_transport = declared is not None and declared.transport is not None
        links = self.node_links() if self.node_links is not None and says_transport else None
        return evaluate(self.kind, result, parse, expected, self.degraded_fraction, links)

    def learn(self, outcome: ProbeOutcome) -> None:
        if self.configured is None and self.baselines is not None:
            self.baselines.learn(self.probe, self.peer, outcome)


@dataclass(frozen=True)
class Launch:
    """What the step that launches the tool gets: the command, filled in under the lock, and how
    to read, judge and guard it."""

    argv: list[str]
    kind: ProbeKind
    judge: Judge
    env: Mapping[str, str] | None = None
    max_output_bytes: int = 1 << 20
    # The idle guard again, asked right before the tool starts: an outcome (skipped) when the node
    # became busy, else None.
    ready: Callable[[], ProbeOutcome | None] = lambda: None


@dataclass(frozen=True)
class StepResult:
    """What a run, or a meeting, came to."""

    outcome: ProbeOutcome
    command: str = ""  # the command line as run ("" when it never ran)


Step = Callable[[Launch], StepResult]


class Pipeline:
    """The node's probe machinery (lock, idle guard, baselines), and one run through it all."""

    def __init__(
        self,
        state_dir: Path,
        idle: IdleGuard,
        baselines: BaselineStore,
        degraded_fraction: float,
        max_output_bytes: int,
        node_links: Callable[[], NodeLinks] | None = None,
    ):
        """`node_links` reads what the node offers NCCL when a run is judged (RDMA devices,
        NVLink); without it no transport is called a fallback."""
        self.state_dir = state_dir
        self.lock_path = state_dir / LOCK_FILE
        self.idle, self.baselines = idle, baselines
        self.degraded_fraction, self.max_output_bytes = degraded_fraction, max_output_bytes
        self.node_links = node_links

    @classmethod
    def of(
        cls,
        probing: ProbingConfig,
        session: NvmlSession | None,
        node_links: Callable[[], NodeLinks] | None = None,
    ) -> Pipeline:
        """The pipeline `probing:` configures; `session` is the GPUs' NVML session (None: no GPU to
        look at)."""
        state = Path(probing.state_dir)
        return cls(
            state,
            IdleGuard(
                session if probing.check_gpus_idle else None,
                probing.busy_command or None,
                probing.busy_command_timeout_seconds,
            ),
            BaselineStore(state, probing.baseline_window, probing.baseline_min_runs),
            probing.degraded_fraction,
            probing.max_output_bytes,
            node_links,
        )

    def play(self, job: Job, step: Step) -> StepResult:
        """Play ``job`` through the pipeline; ``step`` launches the tool (see the module's docstring)."""
        lock = ProbeLock(self.lock_path, job.probe)
        try:
            acquired = lock.acquire()
        except OSError as err:
            # probing.state_dir without permission or space: a fault to report, not a crash.
            return StepResult(ProbeOutcome("failed", f"cannot take the probe lock {self.lock_path}: {err}"))
        if not acquired:
            return StepResult(
                skipped(f"another probe holds {self.lock_path}: {lock.holder() or 'unknown holder'}")
            )
        try:
            if (busy := self._busy()) is not None:
                return StepResult(busy)
            try:
                argv = template(job.argv, job.values())
            except ValueError as err:
                return StepResult(ProbeOutcome("failed", f"cannot build the command: {err}"))
            judge = self.judge(job)
            launch = Launch(
                argv, probe_parsers.kind(job.kind), judge, job.env, self.max_output_bytes, self._busy
            )
            result = step(launch)
            judge.learn(result.outcome)
            return result
        finally:
            lock.release()

    def judge(self, job: Job) -> Judge:
        """How the runs of ``job`` are judged and learned from."""
        return Judge(
            job.kind,
            job.degraded_fraction or self.degraded_fraction,
            parse_bandwidth(job.expect) if job.expect != "learn" else None,
            self.baselines,
            job.probe,
            job.baseline_peer,
            self.node_links,
        )

    def _busy(self) -> ProbeOutcome | None:
        busy = self.idle.check()
        return skipped(busy) if busy is not None else None


def run_once(timeout: float) -> Step:
    """The step of a scheduled probe: the tool once, for at most ``timeout`` seconds."""

    def step(launch: Launch) -> StepResult:
        if (busy := launch.ready()) is not None:
            return StepResult(busy)
        result = run(launch.argv, timeout=timeout, env=launch.env, max_output_bytes=launch.max_output_bytes)
        if result.cancelled:
            return StepResult(skipped("the agent stopped during the run"), result.command)
        parsed = launch.kind.parse(result.output) if result.error is None else None
        return StepResult(launch.judge(result, parsed), result.command)

    return step
