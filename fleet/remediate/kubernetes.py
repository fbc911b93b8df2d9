"""The Kubernetes backend: cordons, node conditions, Events and annotations, through the API server.

What it writes, all of it under one prefix or one of two condition types (docs/remediation.md,
"Kubernetes", says the same for operators):

* a quarantine: ``spec.unschedulable`` (the cordon) and the annotation ``remediate.clusterhealth.io/act``
  in one patch guarded by the resourceVersion it read (a write on a node that changed since is
  refused with 409: it reads the node again, and leaves it alone if it is no longer in service);
  the conditions ``GPUProblem`` / ``RDMAProblem`` (reason: the action, message: our mark
  ``clusterhealth: <action>: <evidence>``) by a strategic-merge patch of ``nodes/status``, which
  merges by condition type and so keeps the kubelet's ``Ready`` (a JSON merge patch would replace
  the list); with ``taint``, the taint ``remediate.clusterhealth.io/quarantined:NoSchedule``; an
  Event on the node;
* the annotation is the ledger of the act: the action, when, the mark, what it applied (the
  cordon, which conditions, the taint) and what was there before (the node in service, a
  condition of that type someone else owns: node-problem-detector's, which it never overwrites);
* a release (the node healthy for ``settle_seconds``): only while the annotation is still the one
  it wrote and the node still cordoned; it removes the conditions it wrote that are still its own,
  its taint and its annotation, and uncordons;
* someone else's move (an uncordon, the annotation removed or edited): the node is theirs; what is
  left of ours on it (the annotation if intact, our conditions, our taint) is removed, the cordon is
  never touched;
* ``do-not-act`` (the annotation ``remediate.clusterhealth.io/do-not-act``, any value but
  ``false``): reported, never touched;
* every reconcile, the heartbeat (``lastHeartbeatTime``) of the conditions it holds, so a stale
  heartbeat shows that the remediator stopped; with ``evict``, once ``evict_after_seconds`` have
  passed, the evictions of the pods that use the node's GPUs (the Eviction API, ``policy/v1`` or,
  on a server without it such as 1.20, ``policy/v1beta1``): a PodDisruptionBudget's 429 is "not
  now", tried again at the next reconcile;
* one actor: a ``coordination.k8s.io/v1`` Lease (client-go's algorithm: a follower takes over
  only after the holder's record has not changed for the lease's duration by its own clock, so
  clocks need not agree); the Lease also keeps the ended acts of the repeat window (annotation
  ``remediate.clusterhealth.io/history``) for the K-acts rule and the slow start;
* dry-run: Events of what it would do (with ``evict``, the evictions asked of the server as a
  dry run, which says whether PodDisruptionBudgets allow them now); it takes no Lease (it reads
  the Lease's ledger, to decide as the leader would) and writes nothing else. A follower of an
  acting remediator writes nothing at all.

The client is the official ``kubernetes`` package (the ``kubernetes`` extra): its configuration
loading (in-cluster service account with its token refresh, or a kubeconfig), TLS and
authentication, and its typed calls. Answers are read as JSON (``_preload_content=False``): the
client's models are those of the newest API and nothing here needs them.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import json
import logging
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from clusterhealth.agent.settings import ConfigError
from clusterhealth.fleet.remediate.backend import (
    FORGET,
    OUTCOMES,
    QUARANTINE,
    RECOVERED,
    RELEASE,
    Act,
    BackendError,
    Lead,
    NodeView,
    Observation,
    Order,
)
from clusterhealth.fleet.remediate.config import QUARANTINE_ACTIONS, KubernetesConfig, RemediateConfig

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from clusterhealth.fleet.remediate.engine import Plan

log = logging.getLogger(__name__)

PREFIX = "remediate.clusterhealth.io/"
ACT = PREFIX + "act"  # on a node: the open act (JSON)
DO_NOT_ACT = PREFIX + "do-not-act"  # on a node, a person's: never touch it
HISTORY = PREFIX + "history"  # on the Lease: the ended acts of the repeat window (JSON)
TAINT = PREFIX + "quarantined"  # the taint's key (NoSchedule; its value is the action)
GPU_PROBLEM, RDMA_PROBLEM = "GPUProblem", "RDMAProblem"
CONDITIONS = (GPU_PROBLEM, RDMA_PROBLEM)
# Which condition a check's finding sets: the split of the node-problem-detector plugin's two rules
# (deploy/kubernetes/node-problem-detector-clusterhealth.json, their --only patterns).
CONDITION_CHECKS = {GPU_PROBLEM: r"gpu_.*", RDMA_PROBLEM: r"mtu|rdma_.*|hca_.*"}
COMPONENT = "clusterhealth-remediate"
# Events about a cluster-scoped object live in `default` (the API refuses them elsewhere).
EVENTS_NAMESPACE = "default"
STRATEGIC = "application/strategic-merge-patch+json"
# A write refused for a stale resourceVersion is read again and tried again, this many times.
ATTEMPTS = 3
# Ended acts kept on the Lease at most (an annotation holds 256 KiB; one act takes about 60 bytes).
MAX_HISTORY = 3000
# An Event that says again what the last one said (a dry-run's "would", a blocked eviction) is
# posted again only after this long: Events live an hour by default.
EVENT_REPEAT_SECONDS = 3600.0
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# The Eviction API's versions, newest first: policy/v1 since 1.22 (1.21 beta), v1beta1 before.
EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")


class _Refused(Exception):
    """The API answered an error status: 409 (a stale resourceVersion, or a name taken), 429 (a
    PodDisruptionBudget), 404 and the others, with its message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def conditions_for(evidence: str) -> tuple[str, ...]:
    """The condition types an act sets, from its evidence (``gpu_xid 3, mtu ib0 (+2)``): GPUProblem
    for the GPU checks, RDMAProblem for the network's (a fabric suspect's evidence included), both
    when both kinds are there; GPUProblem when the evidence names no check of either."""
    found = []
    for kind, pattern in CONDITION_CHECKS.items():
        for item in evidence.split(","):
            words = item.split()
            if words and re.fullmatch(pattern, words[0]):
                found.append(kind)
                break
    if RDMA_PROBLEM not in found and re.search(r"\bfabric\b|<->", evidence):
        found.append(RDMA_PROBLEM)
    return tuple(found) or (GPU_PROBLEM,)


def _now_text(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(now: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(now, datetime.timezone.utc)


def _seconds(text: object) -> float | None:
    """An API timestamp (``2026-01-02T03:04:05Z``, with or without fractions) as Unix time."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# --- the ledger: an act as the annotation holds it ---------------------------------------------


def act_record(act: Act, applied: Mapping[str, Any], before: Mapping[str, Any], by: str) -> str:
    """The annotation's value: the act, what we applied and what was there before."""
    return json.dumps(
        {
            "action": act.action,
            "at": act.at,
            "reason": act.reason,
            "hold": act.hold,
            "applied": dict(applied),
            "before": dict(before),
            "by": by,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class _Record:
    act: Act
    conditions: tuple[str, ...]  # the condition types we wrote
    taint: bool


def parse_record(node: str, text: str) -> _Record:
    """The act an annotation of ours records; ValueError when it is not one (someone edited it)."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("not an object")
    action, at, reason, hold = data.get("action"), data.get("at"), data.get("reason"), data.get("hold", False)
    applied = data.get("applied")
    if (
        action not in QUARANTINE_ACTIONS
        or not isinstance(at, (int, float))
        or isinstance(at, bool)
        or not math.isfinite(at)
        or not isinstance(reason, str)
        or not reason.startswith("clusterhealth:")
        or not isinstance(hold, bool)
        or not isinstance(applied, dict)
    ):
        raise ValueError("not an act of ours")
    conditions = applied.get("conditions", [])
    if not isinstance(conditions, list) or any(c not in CONDITIONS for c in conditions):
        raise ValueError("not an act of ours (applied.conditions)")
    return _Record(
        Act(node, action, float(at), reason, hold=hold), tuple(conditions), applied.get("taint") is True
    )


def _ours(condition: Mapping[str, Any], act: Act | None = None) -> bool:
    """A condition we wrote: its reason an action, its message our mark (the act's, when given).
    node-problem-detector's (GPUCritical, GPUsHealthy, ...) never is."""
    reason, message = condition.get("reason"), condition.get("message")
    if act is not None:
        return reason == act.action and message == act.reason
    return reason in QUARANTINE_ACTIONS and isinstance(message, str) and message.startswith("clusterhealth:")


def _conditions(node: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and isinstance(c.get("type"), str):
            found[c["type"]] = c
    return found


def _taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]


def _annotations(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def _unschedulable(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def _version(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("resourceVersion", ""))


def vetoed(annotations: Mapping[str, str]) -> bool:
    return DO_NOT_ACT in annotations and annotations[DO_NOT_ACT].strip().lower() != "false"


def _residue(node: Mapping[str, Any]) -> Act | None:
    """What is left of an act of ours whose annotation is gone or edited: our condition, else our
    taint; as an act to close (None when nothing of ours is there)."""
    name = _name(node)
    for kind in CONDITIONS:
        c = _conditions(node).get(kind)
        if c is not None and _ours(c):
            at = _seconds(c.get("lastTransitionTime")) or 0.0
            return Act(name, str(c["reason"]), at, str(c["message"]))
    for t in _taints(node):
        if t.get("key") == TAINT:
            action = t.get("value") if t.get("value") in QUARANTINE_ACTIONS else "inspect"
            return Act(name, str(action), _seconds(t.get("timeAdded")) or 0.0, "")
    return None


def _history_text(acts: Iterable[Act]) -> str:
    return json.dumps(
        [[a.node, a.action, a.at, a.ended, a.outcome, a.hold] for a in acts], separators=(",", ":")
    )


def parse_history(text: str) -> list[Act]:
    """The Lease's ended acts; ValueError when the annotation is not what we write."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("not a list")
    acts = []
    for item in data:
        if not (isinstance(item, list) and len(item) == 6):
            raise ValueError(f"not an ended act: {item!r:.80}")
        node, action, at, ended, outcome, hold = item
        if (
            not isinstance(node, str)
            or action not in QUARANTINE_ACTIONS
            or not all(isinstance(n, (int, float)) and math.isfinite(n) for n in (at, ended))
            or outcome not in OUTCOMES
            or not isinstance(hold, bool)
        ):
            raise ValueError(f"not an ended act: {item!r:.80}")
        acts.append(Act(node, action, float(at), "", hold=hold, ended=float(ended), outcome=outcome))
    return acts


def uses_gpus(pod: Mapping[str, Any], resources: Iterable[str]) -> bool:
    """A pod that asks for one of the GPU resources in a container (or an init container still to
    run: it would get them), and that has not ended."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    patterns = tuple(resources)
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        wanted = (container.get("resources") or {}) if isinstance(container, dict) else {}
        for part in ("limits", "requests"):
            for name in wanted.get(part) or {}:
                if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                    return True
    return False


# --- the backend --------------------------------------------------------------------------------


class KubernetesBackend:
    """See the module's docstring. ``api`` is a kubernetes.client.ApiClient."""

    name = "kubernetes"
    can_reboot = False

    def __init__(
        self, config: RemediateConfig, dry_run: bool, api: ApiClient, *, namespace: str, identity: str
    ) -> None:
        from kubernetes import client

        self.config = config
        self.k: KubernetesConfig = config.kubernetes
        self.dry_run = dry_run
        self.namespace = namespace
        self.identity = identity
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self._client = client
        self.lease_seconds = self.k.lease_duration_seconds or 3 * config.interval_seconds
        self._lease: dict[str, Any] | None = None  # as last read or written by us
        self._renewed: float | None = None  # monotonic time of our last renewal, while we lead
        self._seen_record: tuple[str, str, str] | None = None
        self._seen_at = 0.0  # monotonic time the holder's record last changed, as we saw it
        self._eviction_version = EVICTION_VERSIONS[0]
        self._posted: dict[tuple[str, str], tuple[str, float]] = {}
        self._views: dict[str, NodeView] = {}
        # The nodes we hold, as observe() listed them: the heartbeat's first guess of what they are.
        self._listed: dict[str, dict[str, Any]] = {}
        self._quarantined: dict[str, tuple[Act, tuple[str, ...]]] = {}  # this reconcile's acts

    # --- the API ---------------------------------------------------------------------------

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call, its answer as JSON; _Refused for an error status, BackendError when the
        API cannot be reached or answers what is not JSON."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            answer = method(*args, _preload_content=False, _request_timeout=self.k.timeout_seconds, **kwargs)
            return json.loads(answer.data)
        except ApiException as err:
            message = str(err.reason)
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                message = json.loads(err.body or "").get("message") or message
            raise _Refused(int(err.status or 0), message) from None
        except (HTTPError, OSError) as err:
            raise BackendError(f"the Kubernetes API did not answer {what}: {err}") from None
        except ValueError as err:
            raise BackendError(f"the Kubernetes API answered {what} with what is not JSON: {err}") from None

    def _fail(self, what: str, err: _Refused) -> BackendError:
        return BackendError(f"the Kubernetes API refused {what}: {err}")

    def _read_node(self, name: str) -> dict[str, Any] | None:
        try:
            node: dict[str, Any] = self._call(f"GET node {name}", self.core.read_node, name)
        except _Refused as err:
            if err.status == 404:
                return None
            raise self._fail(f"GET node {name}", err) from None
        return node

    def _patch(self, name: str, body: dict[str, Any], status: bool = False) -> dict[str, Any]:
        """A strategic-merge patch of the node (or of its status); _Refused on 409 (it changed since
        it was read) and 404 (it is gone): the callers read it again and decide. The content type
        is said, never left to the client: some versions send a JSON merge patch for a dict, which
        replaces the conditions list and drops the kubelet's Ready."""
        method = self.core.patch_node_status if status else self.core.patch_node
        what = f"PATCH node {name}{'/status' if status else ''}"
        try:
            node: dict[str, Any] = self._call(
                what, method, name, body, _content_type=STRATEGIC, field_manager=COMPONENT
            )
        except _Refused as err:
            if err.status in (409, 404):
                raise
            raise self._fail(what, err) from None
        return node

    def _event(self, node: Mapping[str, Any] | str, kind: str, reason: str, message: str, now: float) -> None:
        c = self._client
        name = node if isinstance(node, str) else _name(node)
        uid = None if isinstance(node, str) else (node.get("metadata") or {}).get("uid")
        body = c.CoreV1Event(
            metadata=c.V1ObjectMeta(name=f"{name}.{time.time_ns():x}", namespace=EVENTS_NAMESPACE),
            involved_object=c.V1ObjectReference(kind="Node", name=name, uid=uid, api_version="v1"),
            reason=reason,
            message=message[:1024],
            type=kind,
            source=c.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self.identity[:128],
            first_timestamp=_stamp(now),
            last_timestamp=_stamp(now),
            count=1,
        )
        try:
            self._call(
                f"POST event {reason} for {name}", self.core.create_namespaced_event, EVENTS_NAMESPACE, body
            )
        except _Refused as err:
            raise self._fail(f"the Event {reason} for node {name}", err) from None

    def _event_once(
        self, node: Mapping[str, Any] | str, kind: str, reason: str, message: str, now: float
    ) -> None:
        """An Event, unless the last of this reason for the node said the same within the hour."""
        name = node if isinstance(node, str) else _name(node)
        last = self._posted.get((name, reason))
        if last is not None and last[0] == message and now - last[1] < EVENT_REPEAT_SECONDS:
            return
        self._event(node, kind, reason, message, now)
        self._posted[(name, reason)] = (message, now)

    # --- the Lease -------------------------------------------------------------------------

    def lead(self) -> Lead:
        holder = ""
        for _ in range(ATTEMPTS):
            moment = time.monotonic()
            lease = self._read_lease()
            if lease is None:
                try:
                    self._lease = self._write_lease(None, taking=True)
                except _Refused as err:
                    if err.status == 409:
                        continue  # another replica created it first
                    raise self._fail("creating the Lease", err) from None
                self._renewed = moment
                return Lead(True, self.identity)
            spec = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime")), _version(lease))
            if record != self._seen_record:
                self._seen_record, self._seen_at = record, moment
            duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
            if holder and holder != self.identity and moment - self._seen_at < duration:
                self._lease, self._renewed = lease, None
                return Lead(False, holder)
            try:
                self._lease = self._write_lease(lease, taking=holder != self.identity)
            except _Refused as err:
                if err.status == 409:
                    continue
                raise self._fail("renewing the Lease", err) from None
            if holder != self.identity:
                log.info("leading: took the Lease %s/%s from %r", self.namespace, self.k.lease_name, holder)
            self._renewed = moment
            return Lead(True, self.identity)
        self._renewed = None
        return Lead(False, holder)

    def _read_lease(self) -> dict[str, Any] | None:
        what = f"GET Lease {self.namespace}/{self.k.lease_name}"
        try:
            lease: dict[str, Any] = self._call(
                what, self.coordination.read_namespaced_lease, self.k.lease_name, self.namespace
            )
        except _Refused as err:
            if err.status == 404:
                return None
            raise self._fail(what, err) from None
        return lease

    def _write_lease(
        self,
        lease: Mapping[str, Any] | None,
        *,
        taking: bool,
        history: str | None = None,
        giving_up: bool = False,
    ) -> dict[str, Any]:
        """Create the Lease (lease None) or replace it, guarded by its resourceVersion; _Refused.
        Giving it up clears the holder and shortens the duration to 1 s, as client-go does."""
        c = self._client
        now = time.time()
        metadata = dict((lease or {}).get("metadata") or {})
        annotations = dict(metadata.get("annotations") or {})
        if history is not None:
            annotations[HISTORY] = history
        spec = dict((lease or {}).get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
        acquired = spec.get("acquireTime")
        if taking:
            transitions += 1 if spec.get("holderIdentity") else 0
            acquired = None
        body = c.V1Lease(
            metadata=c.V1ObjectMeta(
                name=self.k.lease_name,
                namespace=self.namespace,
                resource_version=metadata.get("resourceVersion"),
                annotations=annotations or None,
            ),
            spec=c.V1LeaseSpec(
                holder_identity=None if giving_up else self.identity,
                lease_duration_seconds=1 if giving_up else max(1, math.ceil(self.lease_seconds)),
                acquire_time=_stamp(now)
                if acquired is None
                else datetime.datetime.fromisoformat(str(acquired).replace("Z", "+00:00")),
                renew_time=_stamp(now),
                lease_transitions=transitions,
            ),
        )
        if lease is None:
            what = f"POST Lease {self.namespace}/{self.k.lease_name}"
            written: dict[str, Any] = self._call(
                what, self.coordination.create_namespaced_lease, self.namespace, body
            )
        else:
            what = f"PUT Lease {self.namespace}/{self.k.lease_name}"
            written = self._call(
                what, self.coordination.replace_namespaced_lease, self.k.lease_name, self.namespace, body
            )
        return written

    def _may_act(self) -> None:
        """A write only while we hold the Lease, renewed recently enough that no follower can have
        taken it over (two thirds of its duration, as client-go's renew deadline)."""
        if self._renewed is None:
            raise BackendError(
                f"not the leader (the Lease {self.namespace}/{self.k.lease_name}): nothing is written"
            )
        age = time.monotonic() - self._renewed
        if age > self.lease_seconds * 2 / 3:
            raise BackendError(
                f"the Lease was renewed {age:.0f} s ago, too long for a leader of a {self.lease_seconds:g} s "
                "Lease: nothing more is written in this reconcile"
            )

    def _history(self) -> list[Act]:
        text = _annotations(self._lease or {}).get(HISTORY)
        if text is None:
            return []
        try:
            return parse_history(text)
        except ValueError as err:
            raise BackendError(
                f"the Lease {self.namespace}/{self.k.lease_name}'s annotation {HISTORY} is not the ledger "
                f"we write ({err}): nothing is done until a person removes or mends it"
            ) from None

    def _close(self, act: Act, outcome: str, now: float) -> None:
        """Add an ended act to the Lease's ledger (and drop the acts older than the repeat window)."""
        ended = replace(act, ended=now, outcome=outcome)
        for _ in range(ATTEMPTS):
            lease = self._lease
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                raise BackendError("the Lease is no longer ours: the ended act is not recorded")
            keep = [a for a in self._history() if (a.ended or 0) > now - self.config.repeat_window_seconds]
            acts = [*keep, ended][-MAX_HISTORY:]
            try:
                self._lease = self._write_lease(lease, taking=False, history=_history_text(acts))
                return
            except _Refused as err:
                if err.status != 409:
                    raise self._fail("recording an ended act on the Lease", err) from None
                self._lease = self._read_lease()
        raise BackendError("the Lease kept changing: the ended act is not recorded")

    def close(self) -> None:
        """Give the Lease up (holder cleared, duration 1 s): the next replica takes it at once."""
        if self._renewed is None or self._lease is None:
            return
        try:
            self._write_lease(self._lease, taking=False, giving_up=True)
        except (_Refused, BackendError) as err:
            log.warning("could not give up the Lease (the next leader waits for it to expire): %s", err)
        self._renewed = None

    # --- observe ---------------------------------------------------------------------------

    def observe(self, now: float) -> Observation:
        if self.dry_run:
            # Dry-run takes no Lease; it reads the ledger of ended acts, to decide as the leader would.
            self._lease = self._read_lease()
        history: dict[str, list[Act]] = {}
        for act in self._history():
            history.setdefault(act.node, []).append(act)
        views: dict[str, NodeView] = {}
        listed: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500}
            if token:
                kwargs["_continue"] = token
            try:
                page = self._call("GET nodes", self.core.list_node, **kwargs)
            except _Refused as err:
                raise self._fail("listing the nodes", err) from None
            for node in page.get("items") or []:
                if isinstance(node, dict) and _name(node):
                    view = views[_name(node)] = self._view(node, history.get(_name(node), []))
                    if view.ours is not None:
                        listed[view.name] = node
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        self._views, self._listed = views, listed
        self._quarantined = {}
        return Observation(views)

    def _view(self, node: Mapping[str, Any], history: list[Act]) -> NodeView:
        name = _name(node)
        annotations = _annotations(node)
        labels = dict((node.get("metadata") or {}).get("labels") or {})
        domains = {kind: labels[label] for kind, label in self.k.domain_labels.items() if labels.get(label)}
        domains.update(
            {kind: members[name] for kind, members in self.config.domains.items() if name in members}
        )
        veto = vetoed(annotations) or any(fnmatch.fnmatchcase(name, p) for p in self.config.veto)
        cordoned = _unschedulable(node)
        ours = orphan = None
        other: str | None = None
        text = annotations.get(ACT)
        if text is not None:
            try:
                act = parse_record(name, text).act
            except ValueError as err:
                other = f"our annotation {ACT} was edited ({err}): the node is someone else's"
                orphan = _residue(node)
            else:
                if cordoned:
                    ours = act
                else:
                    orphan = act  # uncordoned by someone: back in service, theirs
        elif cordoned:
            other = "cordoned by someone else (spec.unschedulable, without our annotation)"
            orphan = _residue(node)
        else:
            orphan = _residue(node)
        acts = tuple(sorted(history + ([ours] if ours else []), key=lambda a: a.at))
        return NodeView(
            name,
            not cordoned,
            ours=ours,
            orphan=orphan,
            other=other,
            veto=veto,
            domains=domains,
            history=acts,
        )

    # --- acts ------------------------------------------------------------------------------

    def quarantine(self, node: NodeView, order: Order, now: float) -> Act:
        self._may_act()
        act = Act(node.name, order.action, now, order.reason, hold=order.hold)
        wanted = conditions_for(order.evidence)
        for _ in range(ATTEMPTS):
            current = self._read_node(node.name)
            if current is None:
                raise BackendError(f"node {node.name} is gone: not quarantined")
            annotations = _annotations(current)
            if _unschedulable(current) or ACT in annotations or vetoed(annotations):
                raise BackendError(
                    f"node {node.name} changed since it was read (cordoned, annotated or vetoed by someone): "
                    "left alone"
                )
            existing = _conditions(current)
            before: dict[str, Any] = {"unschedulable": False}
            others = {
                k: f"{c.get('reason')} ({c.get('status')})"
                for k, c in existing.items()
                if k in wanted and not _ours(c)
            }
            if others:
                before["conditions"] = others
            mine = [k for k in wanted if k not in others]
            applied = {"cordon": True, "conditions": mine, "taint": self.k.taint}
            spec: dict[str, Any] = {"unschedulable": True}
            if self.k.taint:
                taint = {
                    "key": TAINT,
                    "value": order.action,
                    "effect": "NoSchedule",
                    "timeAdded": _now_text(now),
                }
                spec["taints"] = [t for t in _taints(current) if t.get("key") != TAINT] + [taint]
            body = {
                "metadata": {
                    "resourceVersion": _version(current),
                    "annotations": {ACT: act_record(act, applied, before, self.identity)},
                },
                "spec": spec,
            }
            try:
                written = self._patch(node.name, body)
                break
            except _Refused as err:
                log.info("node %s changed since it was read (%s): reading it again", node.name, err.status)
        else:
            raise BackendError(
                f"node {node.name}: the cordon was refused {ATTEMPTS} times for a stale resourceVersion"
            )
        mine = self._set_conditions(written, act, mine, now)
        self._quarantined[node.name] = (act, tuple(mine))
        what = ["cordoned"] + (["tainted"] if self.k.taint else []) + [f"condition {k}" for k in mine]
        if self.k.evict:
            what.append(f"evicting the pods that use its GPUs after {self.k.evict_after_seconds:g} s")
        self._event(written, "Warning", "Quarantined", f"{order.reason} ({', '.join(what)})", now)
        return act

    def _set_conditions(self, node: Mapping[str, Any], act: Act, kinds: list[str], now: float) -> list[str]:
        """Our conditions, those of the kinds no one else holds, guarded by the resourceVersion (NPD
        may have written its own since): the kinds written."""
        for _ in range(ATTEMPTS):
            existing = _conditions(node)
            kinds = [k for k in kinds if k not in existing or _ours(existing[k])]
            if not kinds:
                return []
            stamp = _now_text(now)
            body = {
                "metadata": {"resourceVersion": _version(node)},
                "status": {
                    "conditions": [
                        {"type": k, "status": "True", "reason": act.action, "message": act.reason,
                         "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
                        for k in kinds
                    ]
                },
            }  # fmt: skip
            try:
                self._patch(_name(node), body, status=True)
                return kinds
            except _Refused:
                fresh = self._read_node(_name(node))
                if fresh is None:
                    return []
                node = fresh
        raise BackendError(
            f"node {_name(node)}: its conditions were refused {ATTEMPTS} times (stale resourceVersion)"
        )

    def reboot(self, node: NodeView, order: Order, now: float) -> Act:
        raise BackendError("the Kubernetes backend does not reboot nodes (can_reboot is False)")

    def release(self, node: NodeView, act: Act, now: float) -> bool:
        self._may_act()
        for _ in range(ATTEMPTS):
            current = self._read_node(node.name)
            if current is None or not self._still_ours(current, act):
                return False
            try:
                current = self._remove_conditions(current, act)
                body: dict[str, Any] = {
                    "metadata": {"resourceVersion": _version(current), "annotations": {ACT: None}},
                    "spec": {"unschedulable": False},
                }
                if any(t.get("key") == TAINT for t in _taints(current)):
                    body["spec"]["taints"] = [t for t in _taints(current) if t.get("key") != TAINT]
                self._patch(node.name, body)
                break
            except _Refused as err:
                log.info("node %s changed since it was read (%s): reading it again", node.name, err.status)
        else:
            raise BackendError(
                f"node {node.name}: the uncordon was refused {ATTEMPTS} times for a stale resourceVersion"
            )
        self._close(act, RECOVERED, now)
        self._event(
            current,
            "Normal",
            "Released",
            f"{act.reason}: healthy again, uncordoned and our marks removed",
            now,
        )
        return True

    def _still_ours(self, node: Mapping[str, Any], act: Act) -> bool:
        text = _annotations(node).get(ACT)
        if text is None or not _unschedulable(node):
            return False
        try:
            record = parse_record(_name(node), text).act
        except ValueError:
            return False
        return (record.at, record.reason, record.action) == (act.at, act.reason, act.action)

    def _remove_conditions(self, node: dict[str, Any], act: Act | None) -> dict[str, Any]:
        """Our conditions gone (those of ``act``, or any of ours when None), by a strategic merge's
        delete directive, guarded by the resourceVersion; the node as written (or as given, when
        there was nothing to remove)."""
        kinds = [k for k, c in _conditions(node).items() if k in CONDITIONS and _ours(c, act)]
        if not kinds:
            return node
        body = {
            "metadata": {"resourceVersion": _version(node)},
            "status": {"conditions": [{"type": k, "$patch": "delete"} for k in kinds]},
        }
        return self._patch(_name(node), body, status=True)

    def forget(self, act: Act, outcome: str, now: float) -> None:
        """Close the act; what is left of ours on the node goes (our conditions, our taint, our
        annotation while intact); the cordon, someone else's now, is never touched."""
        self._may_act()
        removed: list[str] = []
        # An act rebuilt from what is left of it (its annotation gone) has no mark to match.
        match = act if act.reason else None
        current: dict[str, Any] | None = None
        for _ in range(ATTEMPTS):
            current = self._read_node(act.node)
            if current is None:
                break
            removed = []
            try:
                written = self._remove_conditions(current, match)
                if written is not current:
                    removed.append("our conditions")
                current = written
                metadata: dict[str, Any] = {"resourceVersion": _version(current)}
                body: dict[str, Any] = {"metadata": metadata}
                text = _annotations(current).get(ACT)
                if text is not None and not _unschedulable(current):
                    try:
                        intact = parse_record(act.node, text).act
                    except ValueError:
                        intact = None
                    if intact is not None and (intact.at, intact.reason) == (act.at, act.reason):
                        metadata["annotations"] = {ACT: None}
                        removed.append("our annotation")
                if any(t.get("key") == TAINT for t in _taints(current)):
                    body["spec"] = {"taints": [t for t in _taints(current) if t.get("key") != TAINT]}
                    removed.append("our taint")
                if "spec" in body or "annotations" in metadata:
                    current = self._patch(act.node, body)
                break
            except _Refused as err:
                log.info("node %s changed since it was read (%s): reading it again", act.node, err.status)
        else:
            raise BackendError(
                f"node {act.node}: removing our marks was refused {ATTEMPTS} times (stale resourceVersion)"
            )
        self._close(act, outcome, now)
        left = f"; removed: {', '.join(removed)}" if removed else ""
        message = (
            f"{act.reason or act.action}: someone else took the node over (uncordoned it, or removed or "
            f"edited our annotation); it is theirs, its cordon is never touched by us{left}"
        )
        self._event(current if current is not None else act.node, "Normal", "TakenOver", message, now)

    def would(self, node: NodeView, order: Order, now: float) -> None:
        """Dry-run: an Event of what it would do. A follower of an acting remediator says nothing
        (the leader acts, and says so)."""
        if not self.dry_run:
            return
        if order.operation == QUARANTINE:
            reason, message = "WouldQuarantine", f"{order.reason} (dry-run: would cordon"
            if self.k.evict:
                asked = self._evictions(node.name, now, dry_run=True)
                message += f", and evict after {self.k.evict_after_seconds:g} s: {asked}"
            message += ")"
        elif order.operation == RELEASE:
            reason, message = "WouldRelease", f"{order.reason} (dry-run: would uncordon and remove our marks)"
        elif order.operation == FORGET:
            reason, message = "WouldForget", f"{order.reason} (dry-run: someone else took it over)"
        else:
            reason, message = "WouldQuarantine", f"{order.reason} (dry-run: would {order.operation})"
        self._event_once(node.name, "Normal", reason, message, now)

    # --- every reconcile: heartbeats and evictions ----------------------------------------------

    def tend(self, plan: Plan, now: float) -> None:
        """After the plan's orders: the heartbeat of our conditions on every node that stays ours,
        and, with ``evict``, the evictions that are due (the grace period over, and the verdict still
        asking for the act: a node getting healthy is left to settle)."""
        if self.dry_run or self._renewed is None:
            return
        from clusterhealth.fleet.remediate.engine import HELD_FOR_PERSON, QUARANTINED

        released = {o.node for o in plan.orders if o.operation in (RELEASE, FORGET)}
        asking = {
            left.node
            for left in plan.left
            if left.status in (QUARANTINED, HELD_FOR_PERSON) and left.action in self.config.act_on_actions
        }
        acts: dict[str, Act] = {
            name: view.ours
            for name, view in self._views.items()
            if view.ours is not None and name not in released
        }
        acts.update({name: act for name, (act, _) in self._quarantined.items()})
        for name, act in sorted(acts.items()):
            self._may_act()
            if name not in self._quarantined:  # those were written with this reconcile's heartbeat
                self._heartbeat(name, act, now)
            due = now >= act.at + self.k.evict_after_seconds
            if self.k.evict and due and (name in asking or name in self._quarantined):
                summary = self._evictions(name, now, dry_run=False)
                if summary:
                    self._event_once(name, "Warning", "Evicting", f"{act.reason}: {summary}", now)

    def _heartbeat(self, name: str, act: Act, now: float) -> None:
        """The heartbeat of our conditions on a node we hold. The node as observe() listed it is the
        first guess (the write is guarded by its resourceVersion): a GET per held node and reconcile
        would double the requests of a steady fleet; it is read again only when it changed since."""
        node: dict[str, Any] | None = self._listed.get(name)
        for _ in range(ATTEMPTS):
            if node is None:
                node = self._read_node(name)
            if node is None or not self._still_ours(node, act):
                return
            kinds = [k for k, c in _conditions(node).items() if k in CONDITIONS and _ours(c, act)]
            if not kinds:
                return
            body = {
                "metadata": {"resourceVersion": _version(node)},
                "status": {"conditions": [{"type": k, "lastHeartbeatTime": _now_text(now)} for k in kinds]},
            }
            try:
                self._patch(name, body, status=True)
                return
            except _Refused:
                node = None

    def _evictions(self, name: str, now: float, *, dry_run: bool) -> str:
        """Evict (or, dry_run, ask the server whether it would evict) the pods that use the node's
        GPUs; what happened, in a few words ("" when there was nothing to evict)."""
        what = f"GET the pods of node {name}"
        try:
            pods = (
                self._call(
                    what, self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}"
                ).get("items")
                or []
            )
        except _Refused as err:
            raise self._fail(what, err) from None
        evicted, blocked = [], []
        for pod in pods:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") or not uses_gpus(pod, self.k.gpu_resources):
                continue
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            answer = self._evict(str(meta.get("namespace")), str(meta.get("name")), dry_run)
            if answer == 429:
                blocked.append(key)
            elif answer != 404:
                evicted.append(key)
        if not evicted and not blocked:
            return "" if not dry_run else "no pod uses its GPUs"
        verb = "would evict" if dry_run else "evicted"
        parts = [f"{verb} {len(evicted)} pod(s) using its GPUs ({', '.join(evicted[:5])})"] if evicted else []
        if blocked:
            parts.append(
                f"{len(blocked)} held by a PodDisruptionBudget now ({', '.join(blocked[:5])})"
                + ("" if dry_run else ", tried again at the next reconcile")
            )
        return "; ".join(parts)

    def _evict(self, namespace: str, pod: str, dry_run: bool) -> int:
        """One eviction: its status (201 done, 429 a PodDisruptionBudget says not now, 404 gone)."""
        c = self._client
        while True:
            body = c.V1Eviction(
                api_version=self._eviction_version,
                kind="Eviction",
                metadata=c.V1ObjectMeta(name=pod, namespace=namespace),
            )
            what = f"POST the eviction ({self._eviction_version}) of pod {namespace}/{pod}"
            try:
                self._call(
                    what, self.core.create_namespaced_pod_eviction, pod, namespace, body,
                    dry_run="All" if dry_run else None,
                )  # fmt: skip
                return 201
            except _Refused as err:
                if err.status in (429, 404):
                    return err.status
                older = EVICTION_VERSIONS.index(self._eviction_version) + 1
                if (
                    err.status == 400
                    and self._eviction_version in err.message
                    and older < len(EVICTION_VERSIONS)
                ):
                    log.info("the API has no %s Eviction (%s): using %s", self._eviction_version, err.message,
                             EVICTION_VERSIONS[older])  # fmt: skip
                    self._eviction_version = EVICTION_VERSIONS[older]
                    continue
                raise self._fail(what, err) from None


# --- opening it ---------------------------------------------------------------------------------


def _api_client(k: KubernetesConfig) -> ApiClient:
    """The API's client: the kubeconfig named, else the pod's service account, else the default
    kubeconfig ($KUBECONFIG, ~/.kube/config)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if k.kubeconfig:
            config.load_kube_config(
                config_file=k.kubeconfig, context=k.context or None, client_configuration=configuration
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(context=k.context or None, client_configuration=configuration)
    except (ConfigException, OSError, ValueError) as err:
        where = k.kubeconfig or "the service account or the default kubeconfig"
        raise BackendError(f"cannot reach the Kubernetes API with {where}: {err}") from None
    # One retry of a request that failed to connect or timed out (urllib3's default is three): a
    # reconcile on an API that does not answer ends after twice timeout_seconds per call.
    configuration.retries = 1
    api = client.ApiClient(configuration)
    # The API's audit log and managedFields name us.
    api.user_agent = f"{COMPONENT}/{version('clusterhealth')}"
    return api


def _namespace(k: KubernetesConfig) -> str:
    if k.namespace:
        return k.namespace
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def open_backend(config: RemediateConfig, dry_run: bool) -> KubernetesBackend:
    """The backend for the configuration's ``kubernetes`` section; ConfigError for a Lease that
    would expire between two renewals, BackendError when the API cannot be configured (the
    ``kubernetes`` extra missing, a kubeconfig that cannot be read)."""
    k = config.kubernetes
    if k.lease_duration_seconds and k.lease_duration_seconds < 2 * config.interval_seconds:
        raise ConfigError(
            "the remediator's configuration",
            "kubernetes.lease_duration_seconds",
            f"at least twice interval_seconds ({2 * config.interval_seconds:g}), or 0",
            k.lease_duration_seconds,
        )
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise BackendError(
            "the Kubernetes backend needs the kubernetes package: pip install 'clusterhealth[kubernetes]'"
        ) from None
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    return KubernetesBackend(config, dry_run, _api_client(k), namespace=_namespace(k), identity=identity)
