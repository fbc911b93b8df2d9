"""The Slurm backend: drains and resumes nodes with ``scontrol``, on the controller host.

Every call is one ``scontrol`` process through checks/probes/runner.py (no shell, a timeout,
its process group killed when it hangs); a call that fails, hangs or answers what cannot be read
raises `BackendError` naming the command and its answer, and the reconcile stops there.

* **observe**: ``scontrol show node -o`` (one line per node; Debian's Slurm 22.05 has no
  ``--json`` for scontrol), the ledger, the veto list and the failure domains.
* **quarantine**: ``scontrol update NodeName=N State=DRAIN Reason=clusterhealth: <action>:
  <evidence>``. A running job keeps running (DRAINING) and no new job starts on the node.
* **reboot** (``slurm.reboot``): ``scontrol reboot ASAP nextstate=RESUME reason=... N``: Slurm
  drains the node, reboots it with slurm.conf's RebootProgram once it is idle, and puts it back
  in service; the remediator then judges it like any node of ours.
* **release**: ``scontrol update NodeName=N State=RESUME``, only when the node's reason, read
  again just before, is still exactly the one we wrote (an admin who edited it, drained the node
  again or resumed it has taken it over).

A node is ours when the ledger has an open act for it and the node is out of service with that
act's reason, unchanged (for a reboot, Slurm's own " : reboot issued" after it is allowed). The
HealthCheckProgram's drains also begin with ``clusterhealth:``;
they are not in our ledger, so they are someone else's (docs/remediation.md: one owner of the
drain).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterhealth.checks.probes import runner
from clusterhealth.checks.probes.lock import ProbeLock
from clusterhealth.fleet.remediate.backend import (
    RECOVERED,
    Act,
    BackendError,
    Lead,
    NodeView,
    Observation,
    Order,
)
from clusterhealth.fleet.remediate.config import RemediateConfig
from clusterhealth.fleet.remediate.ledger import Ledger

# Flags that take a node out of service (State=IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN+NOT_RESPONDING).
OUT_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})
OUT_STATES = frozenset({"DOWN", "FUTURE", "UNKNOWN"})
# `scontrol show node -o` ends a drained node's line with its reason and who set it, when:
# "Reason=admin: bad DIMM [root@2026-11-29T01:36:12]".
_REASON = re.compile(r"^(?P<text>.*?)(?: \[(?P<user>[^@\]]*)@(?P<time>[^\]]*)\])?$")
_FIELD = re.compile(r"(\w+)=(\S*)")
# What slurmctld appends to a reboot's reason once it sends the reboot to the node (Slurm 22.05:
# "Reason=<ours> : reboot issued [slurm@...]"). The reason is still ours; any other change is not.
REBOOT_ISSUED_SUFFIX = " : reboot issued"


@dataclass(frozen=True)
class SlurmNode:
    """A node as ``scontrol show node -o`` describes it."""

    name: str
    state: str  # the base state: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, REBOOT_REQUESTED, ...
    reason: str | None
    reason_user: str | None
    features: tuple[str, ...]

    @property
    def in_service(self) -> bool:
        return self.state not in OUT_STATES and not self.flags & OUT_FLAGS


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node -o``'s lines by node name; a line that is not a node's is skipped."""
    nodes = {}
    for line in text.splitlines():
        head, sep, tail = line.partition(" Reason=")
        fields = dict(_FIELD.findall(head))
        name, state_text = fields.get("NodeName"), fields.get("State")
        if not name or not state_text:
            continue
        state, *flags = state_text.split("+")
        flagset = set(flags)
        if state.endswith(("*", "~", "#", "%", "$", "@", "^", "-", "!")):
            if state.endswith("*"):
                flagset.add("NOT_RESPONDING")
            state = state.rstrip("*~#%$@^-!")
        reason = user = None
        if sep:
            match = _REASON.match(tail.rstrip("\n"))
            assert match is not None  # the pattern matches any line
            reason, user = match["text"], match["user"]
        features = fields.get("AvailableFeatures", "")
        nodes[name] = SlurmNode(
            name=name,
            state=state,
            flags=frozenset(flagset),
            reason=reason or None,
            reason_user=user,
            features=tuple(f for f in features.split(",") if f and f != "(null)"),
        )
    return nodes


class SlurmBackend:
    """scontrol, the ledger and the lock in ``slurm.state_dir``."""

    name = "slurm"

    def __init__(self, config: RemediateConfig, env: Mapping[str, str] | None = None):
        self.config = config
        self.can_reboot = config.slurm.reboot
        state_dir = Path(config.slurm.state_dir)
        self.ledger = Ledger(state_dir / "ledger.json")
        self._lock = ProbeLock(state_dir / "lock", "remediate")
        self._env = env
        self._features = {kind: re.compile(p) for kind, p in config.slurm.domain_features.items()}

    # --- scontrol ------------------------------------------------------------------------------

    def scontrol(self, *args: str) -> str:
        argv = [self.config.slurm.scontrol, *args]
        result = runner.run(argv, timeout=self.config.slurm.timeout_seconds, env=self._env, kill_grace=2)
        if result.timed_out:
            raise BackendError(f"{result.command} did not answer in {self.config.slurm.timeout_seconds:g} s")
        if result.error is not None:
            raise BackendError(f"{result.command}: {result.error}")
        if result.exit_code != 0:
            said = " ".join(result.output.split())[:300] or "nothing"
            raise BackendError(
                f"{result.command} failed (exit {result.exit_code}, signal {result.signal_name}): {said}"
            )
        return result.stdout

    def _node(self, name: str) -> SlurmNode:
        found = parse_nodes(self.scontrol("show", "node", "-o", name)).get(name)
        if found is None:
            raise BackendError(f"scontrol show node -o {name} did not describe {name}")
        return found

    # --- the interface -------------------------------------------------------------------------

    def lead(self) -> Lead:
        if self._lock.held:
            return Lead(True)
        try:
            if self._lock.acquire():
                return Lead(True)
        except OSError as err:
            raise BackendError(f"cannot take the lock {self._lock.path}: {err}") from None
        return Lead(False, f"{self._lock.path}: {self._lock.holder() or 'another process'}")

    def observe(self, now: float) -> Observation:
        nodes = parse_nodes(self.scontrol("show", "node", "-o"))
        if not nodes:
            raise BackendError("scontrol show node -o described no node")
        acts = self.ledger.load()
        history: dict[str, list[Act]] = {}
        for act in acts:
            history.setdefault(act.node, []).append(act)
        views = {}
        for name, node in nodes.items():
            mine = history.get(name, [])
            open_act = next((a for a in reversed(mine) if a.open), None)
            ours = orphan = other = None
            if open_act is not None:
                if not node.in_service and _reason_is(node.reason, open_act):
                    ours = open_act
                elif open_act.rebooted and node.in_service and node.reason is None:
                    ours = open_act  # rebooted and put back in service by Slurm, as asked
                else:
                    orphan = open_act
            if ours is None and (not node.in_service or orphan is not None):
                other = self._describe(node)
            views[name] = NodeView(
                name=name,
                in_service=node.in_service,
                ours=ours,
                orphan=orphan,
                other=other,
                veto=any(fnmatch.fnmatchcase(name, pattern) for pattern in self.config.veto),
                domains=self._domains(node),
                history=tuple(mine),
            )
        return Observation(views)

    def quarantine(self, node: NodeView, order: Order, now: float) -> Act:
        act = Act(order.node, order.action, now, order.reason, hold=order.hold)
        return self._apply(
            act, ["update", f"NodeName={order.node}", "State=DRAIN", f"Reason={order.reason}"], now
        )

    def reboot(self, node: NodeView, order: Order, now: float) -> Act:
        if not self.can_reboot:
            raise BackendError("reboot is not enabled (slurm.reboot)")
        act = Act(order.node, order.action, now, order.reason, hold=order.hold, rebooted=True)
        argv = ["reboot", "ASAP", "nextstate=RESUME", f"reason={order.reason}", order.node]
        return self._apply(act, argv, now)

    def _apply(self, act: Act, argv: Sequence[str], now: float) -> Act:
        # The ledger first: if we die between the two, the next observe finds the drain ours, or
        # an open act with no mark, which it closes.
        self.ledger.record(act, self.config.repeat_window_seconds, now)
        try:
            self.scontrol(*argv)
        except BackendError as err:
            if "did not answer" not in str(err):
                # Refused: nothing happened. (A hung call may have: the next observe will tell.)
                self.ledger.remove(act)
            raise
        return act

    def release(self, node: NodeView, act: Act, now: float) -> bool:
        current = self._node(node.name)
        if current.in_service and act.rebooted and current.reason is None:
            self.ledger.close(act, RECOVERED, now)
            return True
        if current.in_service or not _reason_is(current.reason, act):
            return False  # taken over since observe: the next one sees the orphan
        self.scontrol("update", f"NodeName={node.name}", "State=RESUME")
        self.ledger.close(act, RECOVERED, now)
        return True

    def forget(self, act: Act, outcome: str, now: float) -> None:
        self.ledger.close(act, outcome, now)

    def would(self, node: NodeView, order: Order, now: float) -> None:
        """Slurm has no place for a record of what was not done: the log and the metrics say it."""

    def close(self) -> None:
        self._lock.release()

    # --- reading a node ------------------------------------------------------------------------

    def _domains(self, node: SlurmNode) -> dict[str, str]:
        found = {}
        for kind, pattern in self._features.items():
            for feature in node.features:
                match = pattern.fullmatch(feature)
                if match:
                    found[kind] = match.group(1)
                    break
        for kind, members in self.config.domains.items():
            if node.name in members:
                found[kind] = members[node.name]
        return found

    @staticmethod
    def _describe(node: SlurmNode) -> str:
        state = "+".join([node.state, *sorted(node.flags)])
        if node.reason is None:
            return state
        who = f" (by {node.reason_user})" if node.reason_user else ""
        return f"{state}: {node.reason}{who}"


def _reason_is(reason: str | None, act: Act) -> bool:
    """Whether a drained node's reason is still the one ``act`` set, as Slurm shows it."""
    if reason == act.reason:
        return True
    return act.rebooted and reason == act.reason + REBOOT_ISSUED_SUFFIX


def open_backend(config: RemediateConfig, dry_run: bool) -> SlurmBackend:
    return SlurmBackend(config)
