"""The node's verdict: one state, one recommended action, and the evidence behind them.

Pure functions over what the agent and `clusterhealth check` already know: an audit run (the check
results and the observations they judged, `AuditRun`) and the collectors that could not deliver.
A verdict is a **state** (`healthy`, `degraded`, `unhealthy`, `unknown`) and one **action** from a
fixed set ordered by weight (`none` < `restart_job` < `reset_gpu` < `reboot` < `inspect` <
`replace`). The tables below are the whole mapping; docs/remediation.md shows them
(`verdict_markdown`, which a test keeps equal to the page).

Each result that is not OK is a finding, and a finding names an action from its source, in this
order of precedence:

1. NVML's recovery action: the `gpu_recovery_action` result of a GPU, NVML's name of the action
   (`gpu_reset`, `node_reboot`, ...) through `RECOVERY_ACTIONS`;
2. the Xid catalog: the `gpu_xid` result of a GPU, each of its Xids in the window through
   NVIDIA's immediate resolution bucket for the code (`XidInfo.immediate`) and `XID_RESOLUTIONS`;
3. the other checks: `CHECK_RULES`, the first rule of the check that applies to the finding.

The **state** is the node's status under the rule `worst` applies (CRITICAL > UNKNOWN > WARNING >
OK): unhealthy, unknown, degraded, healthy. So data that could not be read (an UNKNOWN result, a
collector failing) makes the node `unknown`, never `healthy`; and it never makes it `unhealthy`:
only a known fault (CRITICAL) does, which a missing reading elsewhere does not make less known.

The **action** is the heaviest that the findings setting the state name: the CRITICAL findings of
an unhealthy node, the WARNING ones of a degraded node. A warning's slower remedy (firmware drift
asks a person to update it) must not turn a fault that a GPU reset cures into a visit; the warning
stays in the evidence. An unknown node's action is `none`: nothing is recommended on data that
could not be read. A healthy node's is `none`.

The **evidence** is every finding, worst status first, then heaviest action, then by source in the
order of precedence above; the first is the verdict's reason, which `check --format line` and a
drain reason quote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from clusterhealth.checks.audit_collector import AuditRun
from clusterhealth.checks.audits import CheckResult, Observations, Status
from clusterhealth.checks.audits.gpu_health import recent_xids, xid_status
from clusterhealth.checks.kernel_watch import SeenEvent
from clusterhealth.checks.policy import Policy
from clusterhealth.checks.xid_catalog import XID_CATALOG, describe
from clusterhealth.exporters.gpu import GpuReading


class Action(IntEnum):
    """The recommended action, valued by weight: a heavier one does what a lighter one does and more."""

    NONE = 0
    RESTART_JOB = 1  # end and restart the jobs on the GPU; the node stays in service
    RESET_GPU = 2  # drain the GPU (its jobs end) and reset it
    REBOOT = 3  # drain the node and reboot it
    INSPECT = 4  # drain the node for a person: something outside the node, a policy or a support case
    REPLACE = 5  # drain the node and have the part replaced

    @property
    def label(self) -> str:
        """The name the metric, the JSON and the line use: `reset_gpu`."""
        return self.name.lower()


ACTIONS = tuple(a.label for a in Action)
STATES = ("healthy", "degraded", "unhealthy", "unknown")
STATE_OF = {
    Status.OK: "healthy",
    Status.WARNING: "degraded",
    Status.CRITICAL: "unhealthy",
    Status.UNKNOWN: "unknown",
}

# The sources of a finding, in their order of precedence; a collector that could not deliver last.
NVML, XID, CHECK, COLLECTOR = "nvml", "xid", "check", "collector"
SOURCES = (NVML, XID, CHECK, COLLECTOR)
_SOURCE_OF_CHECK = {"gpu_recovery_action": NVML, "gpu_xid": XID}

# 1. NVML's recovery actions (exporters/nvml_health.py names them as NVML does, lower case).
# NVIDIA's GPU Memory Error Management, "Error Recovery and Response Flags", says what they mean.
RECOVERY_ACTIONS: Mapping[str, Action] = {
    "none": Action.NONE,
    "gpu_reset": Action.RESET_GPU,
    "drain_and_reset": Action.RESET_GPU,
    "gpu_reset_bus": Action.RESET_GPU,  # nvidia-ml-py 13.580's name of value 5
    "bus_reset": Action.RESET_GPU,
    # End the processes that use the GPU's peer-to-peer traffic; NVML says again what else is needed.
    "drain_p2p": Action.RESTART_JOB,
    "node_reboot": Action.REBOOT,
    "system_reboot": Action.REBOOT,
    # A multi-node NVLink (IMEX) domain spans nodes: recovering it is not one node's action.
    "recover_imex_domain": Action.INSPECT,
}
# A value this nvidia-ml-py has no name for ("unknown_7"): NVML asks for something nobody here knows.
UNNAMED_RECOVERY_ACTION = Action.INSPECT

# 2. NVIDIA's Xid catalog: the immediate resolution bucket of each code (checks/xid_catalog.py).
XID_RESOLUTIONS: Mapping[str, Action] = {
    "IGNORE": Action.NONE,
    # Xid 45 follows another error: the Xid before it says what to do.
    "WORKFLOW_XID_45": Action.NONE,
    # 144-146, 149: fatal or not, the message says; a fatal one is followed by Xid 154 and sets
    # NVML's recovery action, which name the reset.
    "WORKFLOW_NVLINK5_ERR": Action.NONE,
    "RESTART_APP": Action.RESTART_JOB,
    "RESET_GPU": Action.RESET_GPU,
    # Drain, reset so that the page retirement or row remap takes effect (replace when the remap
    # fails: gpu_row_remap's finding says so).
    "WORKFLOW_XID_48": Action.RESET_GPU,
    # NVIDIA's NVLink workflow begins with a reset of the GPU (and, on NVSwitch systems, the switches).
    "WORKFLOW_NVLINK_ERR": Action.RESET_GPU,
    # The recovery the driver now wants is NVML's recovery action (source 1); the code alone asks
    # for at least a GPU reset.
    "XID_154": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT,
    "CONTACT_SUPPORT": Action.INSPECT,
}
# A code missing from the catalog (or a bucket this table lacks, which a test forbids for the
# catalog's codes): a person looks it up.
UNCATALOGUED_XID = Action.INSPECT


def xid_action(code: int) -> Action:
    """The action NVIDIA's catalog asks for an Xid, by its immediate resolution bucket."""
    info = describe(code)
    if not info.known:
        return UNCATALOGUED_XID
    return XID_RESOLUTIONS.get(info.immediate, UNCATALOGUED_XID)


def recovery_action(name: str) -> Action:
    """The action for NVML's recovery action of a GPU."""
    return RECOVERY_ACTIONS.get(name, UNNAMED_RECOVERY_ACTION)


def _always(result: CheckResult, gpu: GpuReading | None) -> bool:
    return True


def _sram_past_threshold(result: CheckResult, gpu: GpuReading | None) -> bool:
    return gpu is not None and gpu.health.sram_ecc_threshold_exceeded is True


def _remap_failed(result: CheckResult, gpu: GpuReading | None) -> bool:
    return gpu is not None and gpu.row_remap_failed is True


@dataclass(frozen=True)
class CheckRule:
    """What a check's WARNING or CRITICAL finding asks for; a check's first rule that applies wins."""

    check: str
    finding: str  # for the table
    action: Action
    applies: Callable[[CheckResult, GpuReading | None], bool] = field(default=_always, compare=False)


# 3. The other checks (checks/audits/): what each one's message tells the operator to do.
CHECK_RULES: tuple[CheckRule, ...] = (
    CheckRule(
        "mtu", "an interface's MTU differs from its rule: the network configuration is wrong", Action.INSPECT
    ),
    CheckRule(
        "rdma_port_state",
        "a port is not ACTIVE and LinkUp: its cable, transceiver, switch port or subnet manager",
        Action.INSPECT,
    ),
    CheckRule(
        "rdma_port_rate",
        "a port runs below its rule's rate: its cable, transceiver or switch port",
        Action.INSPECT,
    ),
    CheckRule(
        "hca_count",
        "fewer RDMA devices than the rule counts (find and reseat them), or more (the policy)",
        Action.INSPECT,
    ),
    CheckRule(
        "gpu_count", "fewer GPUs answer NVML than the policy counts, or more (the policy)", Action.INSPECT
    ),
    CheckRule(
        "hca_firmware", "an HCA's firmware differs from its pin or its siblings': update it", Action.INSPECT
    ),
    CheckRule(
        "gpu_driver", "the NVIDIA driver differs from the policy's: install the intended one", Action.INSPECT
    ),
    CheckRule("gpu_vbios", "a GPU's VBIOS differs from its pin or its siblings': update it", Action.INSPECT),
    CheckRule(
        "gpu_pcie_link",
        "the GPU's PCIe link is narrower (or slower) than it can be: reseat it",
        Action.INSPECT,
    ),
    CheckRule(
        "hca_pcie_link",
        "the HCA's PCIe link is narrower (or slower) than it can be: reseat it",
        Action.INSPECT,
    ),
    CheckRule(
        "gpu_lost",
        "the GPU does not answer NVML (off the bus, or waiting for a reset): NVIDIA restarts the node "
        "(Xid 79's RESTART_BM); NVML's recovery action, when it still says one, is a finding of its own",
        Action.REBOOT,
    ),
    CheckRule(
        "gpu_ecc_uncorrectable",
        "SRAM uncorrectable errors past NVIDIA's threshold: its RMA criterion",
        Action.REPLACE,
        _sram_past_threshold,
    ),
    CheckRule(
        "gpu_ecc_uncorrectable",
        "uncorrectable errors since the driver loaded: a reset remaps the bad rows",
        Action.RESET_GPU,
    ),
    CheckRule("gpu_row_remap", "a row remap failed: no spare rows are left", Action.REPLACE, _remap_failed),
    CheckRule("gpu_row_remap", "a row remap is pending: a reset applies it", Action.RESET_GPU),
)
# A check with no rule (one added without its row here): a person looks at it.
UNRULED_CHECK = Action.INSPECT


def check_action(result: CheckResult, gpu: GpuReading | None) -> Action:
    rule = next((r for r in CHECK_RULES if r.check == result.check and r.applies(result, gpu)), None)
    return rule.action if rule is not None else UNRULED_CHECK


# --- the verdict ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRef:
    index: int
    uuid: str


@dataclass(frozen=True)
class XidRef:
    """The Xids of one code in a finding."""

    code: int
    name: str
    count: int
    action: Action


@dataclass(frozen=True)
class Evidence:
    """One finding: a result that is not OK, or a collector that could not deliver."""

    source: str  # one of SOURCES
    status: Status
    action: Action
    message: str
    check: str = ""  # the result's check and subject ("" for a collector)
    subject: str = ""
    collector: str = ""  # the collector that could not deliver (source "collector")
    gpu: GpuRef | None = None
    xids: tuple[XidRef, ...] = ()
    recovery_action: str | None = None  # NVML's name (source "nvml")
    since: float | None = None  # Unix time, where known: the first Xid of the finding

    @property
    def about(self) -> str:
        """`gpu_xid 6`, or `collector gpu`: what the finding is about, as a line names it."""
        return f"{self.check} {self.subject}" if self.check else f"collector {self.collector}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "status": self.status.name, "action": self.action.label}
        if self.check:
            out.update(check=self.check, subject=self.subject)
        else:
            out["collector"] = self.collector
        out["message"] = self.message
        if self.gpu is not None:
            out["gpu"] = {"index": self.gpu.index, "uuid": self.gpu.uuid}
        if self.xids:
            out["xids"] = [
                {"code": x.code, "name": x.name, "count": x.count, "action": x.action.label}
                for x in self.xids
            ]
        if self.recovery_action is not None:
            out["recovery_action"] = self.recovery_action
        if self.since is not None:
            out["since"] = self.since
        return out


@dataclass(frozen=True)
class Verdict:
    state: str  # one of STATES
    action: Action
    evidence: tuple[Evidence, ...]
    checks: int  # how many results it judged
    # When it began (Unix time), where known: for a one-shot command the first Xid behind it; the
    # agent keeps its own (VerdictClock).
    since: float | None = None

    @property
    def status(self) -> Status:
        return next(s for s, state in STATE_OF.items() if state == self.state)

    @property
    def reason(self) -> Evidence | None:
        return self.evidence[0] if self.evidence else None

    def as_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "action": self.action.label,
            "since": self.since,
            "checks": self.checks,
            "evidence": [e.as_json() for e in self.evidence],
        }


@dataclass(frozen=True)
class Missing:
    """A collector the verdict reads that could not deliver (failing, hung, or not run yet)."""

    collector: str
    why: str


def decide(
    results: Sequence[CheckResult],
    observations: Observations,
    policy: Policy,
    now: float,
    missing: Iterable[Missing] = (),
) -> Verdict:
    """The verdict of `results`, which judged `observations` under `policy` at `now` (Unix time)."""
    gpus = {g.index: g for g in observations.gpus or ()}
    xids = recent_xids(policy, observations) or {}
    # The events' clock (seconds since boot) against the wall clock, to say when an Xid happened.
    boot_offset = now - observations.now_boot_seconds
    evidence = [_finding(r, gpus, xids, boot_offset) for r in results if r.status != Status.OK]
    return _verdict([*evidence, *_missing(missing)], len(results))


def decide_run(
    run: AuditRun | None,
    missing: Iterable[Missing] = (),
    keep: Callable[[CheckResult], bool] = lambda result: True,
) -> Verdict:
    """The verdict of an audit run's results that `keep` keeps; unknown when there is no run."""
    if run is None:
        return _verdict(_missing(missing) or _missing([Missing("audit", "has not run")]), 0)
    results = [r for r in run.results if keep(r)]
    return decide(results, run.observations, run.policy, run.finished_at, missing)


def _missing(missing: Iterable[Missing]) -> list[Evidence]:
    return [
        Evidence(
            COLLECTOR,
            Status.UNKNOWN,
            Action.NONE,
            f"the {m.collector} collector {m.why}",
            collector=m.collector,
        )
        for m in missing
    ]


def _verdict(evidence: list[Evidence], checks: int) -> Verdict:
    status = max((e.status for e in evidence), key=lambda s: s.rank, default=Status.OK)
    ranked = tuple(sorted(evidence, key=lambda e: (-e.status.rank, -e.action, SOURCES.index(e.source))))
    deciding = [e for e in ranked if e.status == status]
    # An UNKNOWN finding asks for nothing (_finding), so an unknown node's action is none.
    action = max((e.action for e in deciding), default=Action.NONE)
    # The earliest moment known to carry this very state and action (an Xid's time), if any.
    known = [e.since for e in deciding if e.since is not None and e.action == action]
    return Verdict(STATE_OF[status], action, ranked, checks, min(known) if known else None)


def _finding(
    result: CheckResult,
    gpus: Mapping[int, GpuReading],
    xids: Mapping[str, list[SeenEvent]],
    boot_offset: float,
) -> Evidence:
    gpu = (
        gpus.get(int(result.subject))
        if result.check.startswith("gpu_") and result.subject.isdigit()
        else None
    )
    ref = GpuRef(gpu.index, gpu.uuid) if gpu is not None else None
    source = _SOURCE_OF_CHECK.get(result.check, CHECK)
    base = Evidence(source, result.status, Action.NONE, result.message, result.check, result.subject, gpu=ref)
    if result.status == Status.UNKNOWN:
        return base  # data that could not be read asks for nothing
    if source == NVML:
        name = gpu.recovery_action if gpu is not None else None
        if name is None:
            return replace(base, action=UNNAMED_RECOVERY_ACTION)
        return replace(base, action=recovery_action(name), recovery_action=name)
    if source == XID:
        # The Xids that made the result what it is (a CRITICAL result's critical ones).
        events = [e for e in xids.get(result.subject, []) if xid_status(e) == result.status]
        counts = Counter(e.code or 0 for e in events)
        refs = tuple(
            XidRef(code, describe(code).name, n, xid_action(code)) for code, n in sorted(counts.items())
        )
        first = min((e.boot_seconds for e in events), default=None)
        return replace(
            base,
            action=max((x.action for x in refs), default=Action.NONE),
            xids=refs,
            since=None if first is None else first + boot_offset,
        )
    return replace(base, action=check_action(result, gpu))


class VerdictClock:
    """When the current verdict began, as the agent saw it: the time its state and action were
    first computed with no change since. The first verdict after the agent starts may begin
    earlier, at the first Xid behind it (Verdict.since)."""

    def __init__(self) -> None:
        self._current: tuple[str, Action] | None = None
        self._since = 0.0

    def since(self, verdict: Verdict, now: float) -> float:
        key = (verdict.state, verdict.action)
        if key != self._current:
            first = self._current is None
            self._current = key
            self._since = min(now, verdict.since) if first and verdict.since is not None else now
        return self._since


# --- the tables, for docs/remediation.md ---------------------------------------------------------


def verdict_markdown() -> str:
    """docs/remediation.md's tables of the mapping."""
    lines = ["| NVML's recovery action | action |", "| --- | --- |"]
    lines += [f"| `{name}` | `{action.label}` |" for name, action in RECOVERY_ACTIONS.items()]
    lines += [
        f"| any other (a value this nvidia-ml-py has no name for) | `{UNNAMED_RECOVERY_ACTION.label}` |"
    ]
    lines += ["", "| NVIDIA's immediate resolution | Xids of the catalog | action |", "| --- | --- | --- |"]
    codes: dict[str, list[int]] = {}
    for code, info in XID_CATALOG.items():
        codes.setdefault(info.immediate, []).append(code)
    for bucket, action in XID_RESOLUTIONS.items():
        listed = ", ".join(str(c) for c in sorted(codes.get(bucket, [])))
        lines.append(f"| `{bucket}` | {listed} | `{action.label}` |")
    lines += [f"| a code the catalog lacks | | `{UNCATALOGUED_XID.label}` |"]
    lines += ["", "| check | finding | action |", "| --- | --- | --- |"]
    lines += [f"| `{r.check}` | {r.finding} | `{r.action.label}` |" for r in CHECK_RULES]
    return "\n".join(lines) + "\n"


__all__ = [
    "ACTIONS",
    "CHECK_RULES",
    "RECOVERY_ACTIONS",
    "SOURCES",
    "STATES",
    "XID_RESOLUTIONS",
    "Action",
    "CheckRule",
    "Evidence",
    "Missing",
    "Verdict",
    "VerdictClock",
    "check_action",
    "decide",
    "decide_run",
    "recovery_action",
    "verdict_markdown",
    "xid_action",
]
