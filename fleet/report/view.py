"""What the report shows, from a judged history: the nodes' order, the pair matrix, its aggregate
by group, each node's worst meeting per round, and what was missing. Numbers only; render.py
draws them.

A ratio is a meeting's share of the group's reference (``pairwise.seen_ratio``: 0 for a run that
failed); NaN is "never measured" in the window.

**Order.** A bad host is one row and one column of the matrix, a cross, whatever the order. A bad
group (a leaf switch, an uplink) is a block only when its members sit next to each other: the
order is by placement when known (``placement``: node → its places from the outermost, e.g.
(spine, leaf)), then by name, digits compared as numbers (h2 before h10), so that names that
follow the racks keep them together. Nodes without a placement come after those with one.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from clusterhealth.checks.fabric.analysis import Analysis
from clusterhealth.fleet.pairwise import History, seen_ratio

# Above this many nodes the pair matrix is shown by group only: 4,096 nodes is a 16-megapixel
# raster at one pixel a pair, about what a browser still opens in a second or two.
MAX_MATRIX_NODES = 4096
# Up to this many nodes each row and column is labelled with its node's name; above, the page
# names a pixel's pair on hover and adds the view by group.
LABELLED_NODES = 64
MAX_GROUPS = 64  # blocks of the view by group when no placement is known
MAX_STRIP_COLUMNS = 960  # rounds of the per-node strip before consecutive rounds share a column

STALE_ROUNDS = 2  # a newest result older than this many rounds at the window's end is said

Placement = Mapping[str, Sequence[str]]
Matrix = npt.NDArray[np.float32]

_DIGITS = re.compile(r"([0-9]+)")


def natural_key(name: str) -> tuple[str | int, ...]:
    """h2 before h10: the runs of digits of a name compared as numbers."""
    # re.split with a group alternates text and digits, text first: the kinds line up position
    # by position, so two keys always compare.
    return tuple(int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(name)))


def order_nodes(nodes: Iterable[str], placement: Placement | None = None) -> list[str]:
    """The nodes in the order of the matrix's rows and columns (see the module's docstring)."""

    def key(node: str) -> tuple[int, tuple[tuple[str | int, ...], ...], tuple[str | int, ...]]:
        place = placement.get(node) if placement else None
        if place:
            return (0, tuple(natural_key(p) for p in place), natural_key(node))
        return (1, (), natural_key(node))

    return sorted(set(nodes), key=key)


@dataclass(frozen=True)
class Group:
    """A run of consecutive nodes of the order shown as one block."""

    name: str
    start: int  # index of its first node in the order
    stop: int  # one past its last


def groups_of(order: Sequence[str], placement: Placement | None = None) -> list[Group]:
    """The blocks of the view by group: the nodes' innermost place (a leaf) when the placement
    knows any of them, else runs of consecutive names, at most ``MAX_GROUPS`` of them."""
    if placement and any(placement.get(n) for n in order):
        groups: list[Group] = []
        for i, node in enumerate(order):
            name = "/".join(placement.get(node) or ()) or "unplaced"
            if groups and groups[-1].name == name:
                groups[-1] = Group(name, groups[-1].start, i + 1)
            else:
                groups.append(Group(name, i, i + 1))
        return groups
    size = max(1, math.ceil(len(order) / MAX_GROUPS))
    blocks = []
    for start in range(0, len(order), size):
        stop = min(start + size, len(order))
        name = order[start] if stop - start == 1 else f"{order[start]}–{order[stop - 1]}"
        blocks.append(Group(name, start, stop))
    return blocks


@dataclass(frozen=True)
class Pair:
    """A pair that met in the window, by its ends' places in the order (i < j)."""

    i: int
    j: int
    latest: float | None  # seen ratio of its latest meeting; None: nothing known of it
    worst: float | None
    meetings: int
    latest_round: int


@dataclass
class View:
    history: History
    analysis: Analysis
    order: list[str]
    pairs: list[Pair]
    groups: list[Group]
    group_latest: Matrix  # groups × groups: the median of the pairs' ratios between two groups
    group_worst: Matrix
    rounds: list[int]  # the strip's columns: the first round of each (consecutive rounds)
    rounds_per_column: int
    strip: Matrix  # nodes × columns: the node's worst meeting in those rounds
    latest: Matrix | None = None  # nodes × nodes; None above MAX_MATRIX_NODES
    worst: Matrix | None = None
    missing: list[str] = field(default_factory=list)
    placement_known: bool = False

    @property
    def size(self) -> int:
        return len(self.order)

    def matrix(self, which: str) -> Matrix | None:
        return self.latest if which == "latest" else self.worst

    def group_matrix(self, which: str) -> Matrix:
        return self.group_latest if which == "latest" else self.group_worst


def build(history: History, analysis: Analysis, placement: Placement | None = None) -> View:
    """The view of a history that ``pairwise.judge`` has judged into ``analysis``."""
    recorded = history.pairs()
    met = {node for pair in recorded for node in pair}
    order = order_nodes(history.nodes | met, placement)
    index = {node: i for i, node in enumerate(order)}
    pairs = []
    for (a, b), p in recorded.items():
        i, j = sorted((index[a], index[b]))
        pairs.append(Pair(i, j, seen_ratio(p.latest), seen_ratio(p.worst), p.meetings, p.latest.round))
    pairs.sort(key=lambda p: (p.i, p.j))
    groups = groups_of(order, placement)
    view = View(
        history=history,
        analysis=analysis,
        order=order,
        pairs=pairs,
        groups=groups,
        group_latest=_by_group(pairs, groups, len(order), "latest"),
        group_worst=_by_group(pairs, groups, len(order), "worst"),
        rounds=[],
        rounds_per_column=1,
        strip=np.full((len(order), 0), np.nan, dtype=np.float32),
        placement_known=placement is not None and any(placement.get(n) for n in order),
    )
    if len(order) <= MAX_MATRIX_NODES:
        view.latest, view.worst = _matrix(pairs, len(order), "latest"), _matrix(pairs, len(order), "worst")
    _strip(view, history, index)
    view.missing = _missing(view, history, analysis, met)
    return view


def _matrix(pairs: Sequence[Pair], n: int, which: str) -> Matrix:
    values = np.full((n, n), np.nan, dtype=np.float32)
    for p in pairs:
        v = p.latest if which == "latest" else p.worst
        if v is not None:
            values[p.i, p.j] = values[p.j, p.i] = v
    return values


def _by_group(pairs: Sequence[Pair], groups: Sequence[Group], n: int, which: str) -> Matrix:
    """The median ratio of the pairs measured between each two groups (NaN: none measured). A
    bad group lowers its whole block; one bad host among many barely moves a median, which is
    why the full matrix and the strip are there."""
    of = np.zeros(n, dtype=np.int32)
    for g, group in enumerate(groups):
        of[group.start : group.stop] = g
    found: dict[tuple[int, int], list[float]] = {}
    for p in pairs:
        v = p.latest if which == "latest" else p.worst
        if v is None:
            continue
        a, b = int(of[p.i]), int(of[p.j])
        found.setdefault((a, b), []).append(v)
        if a != b:
            found.setdefault((b, a), []).append(v)
    values = np.full((len(groups), len(groups)), np.nan, dtype=np.float32)
    for (a, b), ratios in found.items():
        values[a, b] = statistics.median(ratios)
    return values


def _strip(view: View, history: History, index: Mapping[str, int]) -> None:
    per_node = history.node_rounds()
    rounds = history.rounds
    if not rounds:
        return
    first, last = rounds[0], rounds[-1]
    span = last - first + 1
    width = max(1, math.ceil(span / MAX_STRIP_COLUMNS))
    columns = math.ceil(span / width)
    strip = np.full((len(view.order), columns), np.nan, dtype=np.float32)
    for node, by_round in per_node.items():
        row = index[node]
        for r, ratio in by_round.items():
            c = (r - first) // width
            old = strip[row, c]
            strip[row, c] = ratio if math.isnan(old) else min(old, ratio)
    view.rounds = [first + c * width for c in range(columns)]
    view.rounds_per_column = width
    view.strip = strip


def _missing(view: View, history: History, analysis: Analysis, met: set[str]) -> list[str]:
    """What the page cannot show, each said once."""
    out = [f"partial data: {problem}" for problem in history.problems]
    if analysis.not_enough_evidence:
        out.append(f"no verdict: {analysis.not_enough_evidence}")
    silent = sorted(history.nodes - met, key=natural_key)
    if silent:
        shown = ", ".join(silent[:20]) + (f" and {len(silent) - 20} more" if len(silent) > 20 else "")
        out.append(f"{_count(len(silent), 'node')} exported the group's series but met nobody: {shown}")
    unknown = sum(1 for m in history.meetings if seen_ratio(m) is None)
    if unknown:
        out.append(f"{_count(unknown, 'meeting')} with neither a bandwidth nor a failure (left out)")
    rounds = history.rounds
    if rounds:
        gaps = (rounds[-1] - rounds[0] + 1) - len(rounds)
        if gaps:
            out.append(f"{_count(gaps, 'round')} between the first and the last without any meeting")
    newest = history.newest
    if newest is not None and history.end - newest > STALE_ROUNDS * history.period:
        out.append(
            f"the newest result was scraped {_age(history.end - newest)} before the window's end, more than "
            f"{STALE_ROUNDS} rounds: agents or Prometheus may have stopped"
        )
    if view.latest is None:
        out.append(
            f"the pair matrix of {view.size:,} nodes is shown by group only (one pixel a pair stops at "
            f"{MAX_MATRIX_NODES:,} nodes); the strip and the verdict name every node"
        )
    return out


def _age(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'s' if n != 1 else ''}"
