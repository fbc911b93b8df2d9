"""The Slurm backend's ledger of what the remediator did, and its one-actor lock.

Slurm has no place for our own records beside a node's drain reason, so the acts live in a state
file on the controller host (``slurm.state_dir``/ledger.json): every quarantine of ours, open
until we release it or someone else takes the node over, and the closed ones for the repeat
window (the K-acts rule and the slow start read them). It is written atomically (a temporary file,
fsync, rename, fsync of the directory: checks/probes/statefile.py) so a crash leaves the old
ledger or the new one. A ledger that cannot be read is not guessed at: `LedgerError`, and the
reconcile acts on nothing until a person looks (a lost ledger would make our drains look like
someone else's, which is safe: they are then never resumed automatically).

The lock (``lock`` beside it) is checks/probes/lock.py's ``flock``: the kernel drops it when its
holder dies, so there is no stale lock to break.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from clusterhealth.checks.probes.statefile import write_json
from clusterhealth.fleet.remediate.backend import FAILED, OUTCOMES, Act, BackendError

FORMAT = 1


class LedgerError(BackendError):
    """The ledger file cannot be read or written."""


def _act(item: Any, path: Path, i: int) -> Act:
    problem = f"{path}: acts[{i}]: expected an act"
    if not isinstance(item, dict) or set(item) - {f.name for f in fields(Act)}:
        raise LedgerError(f"{problem} with the keys of one, got {item!r:.120}")
    try:
        act = Act(**item)
    except TypeError as err:
        raise LedgerError(f"{problem} ({err})") from None
    numbers = (act.at,) if act.ended is None else (act.at, act.ended)
    if (
        not isinstance(act.node, str)
        or not isinstance(act.action, str)
        or not isinstance(act.reason, str)
        or not all(isinstance(n, (int, float)) and math.isfinite(n) for n in numbers)
        or (act.ended is None) != (act.outcome is None)
        or (act.outcome is not None and act.outcome not in OUTCOMES)
    ):
        raise LedgerError(f"{problem}, got {item!r:.120}")
    return act


class Ledger:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> list[Act]:
        """Every act in the file, oldest first; [] when there is no file yet."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as err:
            raise LedgerError(f"cannot read the ledger {self.path}: {err}") from None
        try:
            document = json.loads(text)
        except ValueError as err:
            raise LedgerError(f"the ledger {self.path} is not JSON ({err})") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise LedgerError(f"the ledger {self.path} is not a format {FORMAT} ledger")
        acts = document.get("acts")
        if not isinstance(acts, list):
            raise LedgerError(f"{self.path}: acts: expected a list")
        return sorted((_act(item, self.path, i) for i, item in enumerate(acts)), key=lambda a: a.at)

    def save(self, acts: Iterable[Act]) -> None:
        try:
            write_json(
                self.path, {"format": FORMAT, "acts": [asdict(a) for a in sorted(acts, key=lambda a: a.at)]}
            )
        except OSError as err:
            raise LedgerError(f"cannot write the ledger {self.path}: {err}") from None

    def record(self, act: Act, keep_seconds: float, now: float) -> None:
        """Add an open act (closing, as ``failed``, an act of ours still open on the node); drop
        the closed acts older than ``keep_seconds``."""
        acts = [
            replace(a, ended=now, outcome=FAILED) if a.open and a.node == act.node else a for a in self.load()
        ]
        self.save([a for a in acts if a.open or (a.ended or 0) > now - keep_seconds] + [act])

    def close(self, act: Act, outcome: str, now: float) -> None:
        """End ``act`` (matched by node, time and reason) with ``outcome``."""
        self.save(
            replace(a, ended=now, outcome=outcome) if _same(a, act) and a.open else a for a in self.load()
        )

    def remove(self, act: Act) -> None:
        """Forget an act that never took effect (the scheduler refused it)."""
        self.save(a for a in self.load() if not _same(a, act))


def _same(a: Act, b: Act) -> bool:
    return (a.node, a.at, a.reason) == (b.node, b.at, b.reason)
