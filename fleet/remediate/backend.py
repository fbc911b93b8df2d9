"""What a scheduler backend must do for the remediator, and what it reports back.

The remediator's core (fleet/remediate/engine.py) decides from two pictures: every node's verdict
as Prometheus has it, and every node as the scheduler has it. A backend gives the second picture
(`observe`) and carries out the orders the core gives (`quarantine`, `release`, `reboot`,
`forget`, `would`). It decides nothing: budgets, hysteresis, vetoes and ownership rules are the
core's, so that Slurm and Kubernetes follow one set of rules, tested once.

What the words mean on Slurm, then on Kubernetes:

* *out of service*: Slurm's DRAIN, DOWN, FAIL, MAINT or REBOOT_REQUESTED; Kubernetes'
  ``spec.unschedulable`` (cordoned).
* *quarantine*: ``scontrol update State=DRAIN Reason="clusterhealth: ..."``; a cordon, the
  condition ``GPUProblem`` or ``RDMAProblem``, an Event and our annotations (a taint and
  evictions when enabled).
* *our mark*: the drain reason we wrote, unchanged; our annotations, still there and matching.
* *release*: ``State=RESUME``; an uncordon, the condition back to False, our annotations removed.
* *ledger*: a state file on the controller host (atomic writes); annotations under one prefix.
* *veto*: the configuration's ``veto`` list; the node's ``do-not-act`` annotation too.
* *failure domain*: the configuration's map, or a node feature; a node label (a zone, a rack).
* *one actor*: ``flock`` on a file in the state directory; a ``coordination.k8s.io`` Lease.

Ownership is the backend's to see and the core's to respect: a node is *ours* only while the mark
we left is intact (the drain reason is the one we wrote; our annotation is still there). A node
out of service for any other reason is someone else's and is never touched; an act of ours whose
mark someone changed or removed is *orphaned*: the core closes it in the ledger (`forget`) and
leaves the node to whoever changed it.

A backend lives in a module of this package named after it (``slurm``, ``kubernetes``) that has
``open_backend(config: RemediateConfig, dry_run: bool) -> Backend``; fleet/remediate/reconcile.py
imports the one ``--backend`` names, when it runs. A backend reads its own section of the
configuration (``slurm:``, ``kubernetes:``, declared in fleet/remediate/config.py) and the
sections every backend shares (``veto``, ``domains``, ``repeat_window_seconds`` for how long the
ledger keeps an act). In dry-run it is opened all the same (it observes) and only ``would`` is
called to act.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# What an act of ours ended with, in the ledger.
RECOVERED = "recovered"  # we released it: its verdict was healthy for settle_seconds
TAKEN_OVER = "taken_over"  # someone else removed or changed our mark (resumed, re-drained, edited)
FAILED = "failed"  # acted on again without coming back healthy (a reboot after which it is still sick)
OUTCOMES = (RECOVERED, TAKEN_OVER, FAILED)

# The orders the core gives.
QUARANTINE, REBOOT, RELEASE, FORGET = "quarantine", "reboot", "release", "forget"
OPERATIONS = (QUARANTINE, REBOOT, RELEASE, FORGET)


class BackendError(Exception):
    """The scheduler could not be read or did not do what it was told (a command that failed,
    hung or answered what cannot be read). The message says which command and what it answered;
    the reconcile stops there and the next one tries again."""


@dataclass(frozen=True)
class Act:
    """One quarantine of ours in the ledger: from when it was applied until it ended."""

    node: str
    action: str  # the action it was taken for: reset_gpu, reboot, inspect, replace
    at: float  # when it was applied (Unix time)
    reason: str  # the mark we wrote: Slurm's drain reason, Kubernetes' condition message
    # True: never released automatically (the node was acted on K times within the window: a
    # person must look at it).
    hold: bool = False
    rebooted: bool = False  # applied as a reboot (``scontrol reboot``) rather than a drain
    ended: float | None = None  # when it ended; None while it stands
    outcome: str | None = None  # one of OUTCOMES once ended

    @property
    def open(self) -> bool:
        return self.ended is None


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler has it, with what the ledger says we did to it."""

    name: str
    in_service: bool  # schedulable: not drained, down, cordoned or waiting for a reboot
    # Our open act, its mark intact on the node (the reason we wrote, our annotation); or an act
    # carried out as a reboot that the scheduler ended by putting the node back in service
    # (``in_service`` True): released once healthy, acted on again if not.
    ours: Act | None = None
    # Our open act whose mark is gone or changed: someone else took the node over.
    orphan: Act | None = None
    # Out of service for someone else's reason (the reason and who set it, as the scheduler says),
    # or our mark changed by someone; None when the node is in service or ours.
    other: str | None = None
    veto: bool = False  # do-not-act: reported, never touched
    # Failure domains by kind, e.g. {"rack": "r07", "leaf": "leaf3"}; empty when unknown.
    domains: Mapping[str, str] = field(default_factory=dict)
    # Our acts on this node in the ledger, oldest first (the open one included), for the rule of
    # K acts within the window and for the slow start.
    history: tuple[Act, ...] = ()


@dataclass(frozen=True)
class Observation:
    """Every node the scheduler knows, by name."""

    nodes: Mapping[str, NodeView]


@dataclass(frozen=True)
class Order:
    """What the core tells a backend to do to one node."""

    node: str
    operation: str  # one of OPERATIONS
    action: str  # the verdict's action it serves (inspect when the K-in-window rule applies)
    # The mark to write: ``clusterhealth: <action>: <evidence>`` (one line, short), or for a
    # release or a forget the reason of the act it ends.
    reason: str
    evidence: str = ""  # the checks (or the fabric suspect) behind it, for messages and Events
    hold: bool = False  # never to be released automatically
    why: str = ""  # why the core decided it, for the log
    # The price of the fault behind it, where one is known (an `analyze` suspect's impact: the
    # all-reduce and step slowdown and the GPU-hours a day it costs), for messages and reports.
    impact: Mapping[str, object] | None = None


@dataclass(frozen=True)
class Lead:
    """Whether this process is the one actor now, and if not, who is (for the log)."""

    leader: bool
    holder: str = ""


class Backend(Protocol):
    """A scheduler the remediator acts on. Every method raises BackendError when the scheduler
    cannot be read or does not do what it is told, and nothing else escapes for a scheduler's
    fault; dry-run calls ``would`` in place of the others (and ``observe``, ``lead``, ``close``)."""

    name: str  # "slurm", "kubernetes": the metrics' ``backend`` label
    can_reboot: bool  # whether ``reboot`` is supported and enabled in its configuration

    def lead(self) -> Lead:
        """Take or renew the right to act (a lock, a Lease); called at every reconcile before
        ``observe``. A follower still observes and decides, and acts on nothing."""
        ...

    def observe(self, now: float) -> Observation:
        """Every node the scheduler knows, its state, our marks and ledger, vetoes and domains."""
        ...

    def quarantine(self, node: NodeView, order: Order, now: float) -> Act:
        """Take the node out of service with our mark, record it in the ledger (before the
        scheduler is told: a crash between the two leaves an open act whose mark `observe`
        finds, or an orphan `forget` closes) and return the act. An act of ours still open on the
        node (a reboot after which it is sick again) is closed as failed."""
        ...

    def reboot(self, node: NodeView, order: Order, now: float) -> Act:
        """Like ``quarantine``, as a reboot the scheduler carries out when the node is idle and
        that puts it back in service itself (Slurm: ``scontrol reboot ASAP nextstate=RESUME``).
        Only called when ``can_reboot``."""
        ...

    def release(self, node: NodeView, act: Act, now: float) -> bool:
        """Put the node back in service and remove our mark, only if the mark is still ``act``'s
        (checked again against the scheduler just before: an admin may have changed it since
        ``observe``), and close the act in the ledger as recovered. False when the mark had
        changed: nothing was done (the next ``observe`` reports the orphan)."""
        ...

    def forget(self, act: Act, outcome: str, now: float) -> None:
        """Close an open act in the ledger without touching the node (its mark is gone)."""
        ...

    def would(self, node: NodeView, order: Order, now: float) -> None:
        """Dry-run: record that ``order`` would be carried out, where the scheduler has a place
        for it (Kubernetes posts an Event); touch nothing else."""
        ...

    def close(self) -> None:
        """Give up the lock or the Lease."""
        ...
