"""What the probes keep in `probing.state_dir`: one store for the scheduled probes' results
(``probe-results.json``) and for each pairwise group's (``pairwise-NAME.json``).

A store holds its state in memory and in its file. The file is written atomically after each change
and re-read when another process changed it (statefile.py), so `clusterhealth scrape`, a restarted
agent and `clusterhealth probe run` see what the agent recorded, and the agent what they recorded.
Each change is a read-modify-write under one lock per file, not per store: after a reload, the old
collector or group rounds may still be recording their last run while the new ones record theirs,
each through its own store of the same file.

A file that cannot be written or read is reported as ``problem`` (the probes collector fails with
it, and the agent logs that once); the state stays in memory and the next write replaces the file.

What each file holds is its ``Format``. Both keep runs by result and the last runs (``Runs``),
records of one run each, written as their dataclass fields (``encode_record``, ``decode_record``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, get_type_hints

from clusterhealth.checks.probes import statefile
from clusterhealth.checks.probes.evaluate import RESULTS, ProbeOutcome

if TYPE_CHECKING:
    from pathlib import Path

S = TypeVar("S")


@dataclass(frozen=True)
class Format(Generic[S]):
    """What one kind of state file holds, and how a problem with it is worded."""

    what: str  # "probe results": the problem messages' name for the file's content
    new: Callable[[], S]  # the state before anything was recorded
    encode: Callable[[S], Any]  # the state as a JSON document
    decode: Callable[[Any], S]  # a JSON document as the state; ValueError naming what is wrong
    # Said after the error when the file cannot be read.
    unreadable_note: str = ""


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_of(path: Path) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(os.path.abspath(path), threading.Lock())


class StateStore(Generic[S]):
    """One state file, and its state in memory (see the module's docstring)."""

    def __init__(self, path: Path, format: Format[S]):
        self.path, self.format = path, format
        self._lock = _lock_of(path)
        self._state = format.new()
        self._signature: statefile.Signature | None = None
        self.problem: str | None = None

    def read(self) -> S:
        """A copy of the state, as the file holds it now."""
        with self._lock:
            self._refresh()
            return copy.deepcopy(self._state)

    def update(self, change: Callable[[S], None]) -> None:
        """Apply ``change`` to the state as the file holds it now, and write it back."""
        with self._lock:
            self._refresh()
            change(self._state)
            try:
                self._signature = statefile.write_json(self.path, self.format.encode(self._state))
            except OSError as err:
                self.problem = (
                    f"cannot save {self.format.what} to {self.path}: {err}; they are kept in memory only"
                )
            else:
                self.problem = None

    def _refresh(self) -> None:
        try:
            current = statefile.signature(self.path)
            if current is None or current == self._signature:
                return
            state = self.format.decode(json.loads(self.path.read_bytes()))
        except (OSError, ValueError) as err:
            self.problem = (
                f"cannot read {self.format.what} from {self.path}: {err}{self.format.unreadable_note}"
            )
            return
        self._state, self._signature = state, current


class Record(Protocol):
    """One run (or meeting) as recorded: a frozen dataclass with at least these fields."""

    @property
    def outcome(self) -> ProbeOutcome: ...
    @property
    def started_at(self) -> float: ...  # wall clock
    @property
    def duration_seconds(self) -> float: ...


R = TypeVar("R", bound=Record)


def _no_runs() -> Counter[str]:
    return Counter(dict.fromkeys(RESULTS, 0))


@dataclass
class Runs(Generic[R]):
    """Runs by result and the last runs: what a scheduled probe and a pairwise group both keep."""

    runs: Counter[str] = field(default_factory=_no_runs)
    last: R | None = None  # the last run that was not skipped
    last_any: R | None = None

    def count(self, record: R) -> None:
        self.runs[record.outcome.result] += 1
        self.last_any = record
        if record.outcome.result != "skipped":
            self.last = record


def encode_runs(state: Runs[Any]) -> dict[str, Any]:
    return {
        "runs": dict(state.runs),
        "last": encode_record(state.last),
        "last_any": encode_record(state.last_any),
    }


def decode_counts(runs: Any) -> Counter[str]:
    """``runs`` of a state file: the count of each result (a result it lacks: none)."""
    return Counter({r: int(runs.get(r, 0)) for r in RESULTS})


def encode_record(record: Any) -> dict[str, Any] | None:
    return None if record is None else dataclasses.asdict(record)


def decode_record(cls: type[R], data: Any) -> R | None:
    """A record ``encode_record`` wrote, each field read as the type it is declared with.

    KeyError, TypeError or ValueError when the data is not such a record."""
    if data is None:
        return None
    return cls(**{name: read(data[name]) for name, read in _readers(cls).items()})


_READ: dict[Any, Callable[[Any], Any]] = {
    str: str,
    float: float,
    int: int,
    bool: bool,
    ProbeOutcome: ProbeOutcome.from_state,
}


@functools.cache
def _readers(cls: type[Any]) -> dict[str, Callable[[Any], Any]]:
    hints = get_type_hints(cls)
    return {f.name: _READ[hints[f.name]] for f in dataclasses.fields(cls)}
