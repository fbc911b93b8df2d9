"""The report's pictures and its page: rasters coloured with a perceptually uniform colormap, a
legend in % and GB/s, and one self-contained HTML page (or one PNG).

**Colours.** viridis (matplotlib's default, perceptually uniform and readable with every common
colour-vision deficiency) on a linear scale from 0 to 100 % of the reference, above clipped: a
healthy pair is yellow-green, a slow one teal to dark violet, a failed run (0 %) the darkest.
viridis holds no grey, so a pair never measured in the window is light grey with a darker
diagonal hatch, visibly neither fast nor slow, and a node's own cell is white. (cividis, the
other colour-blind-safe choice, runs through greys in its middle: a pair at half speed would look
like one never measured.)

**Rasters.** Each matrix is drawn one block of ``cell`` × ``cell`` pixels per pair, as indices into
a palette of the colormap's colours and the three others (a PNG of one byte a pixel), with no
resampling, so that a pair's pixel box is exact: the page
exposes the node order and the cell sizes (``report-data``) and a test reads a pair's colour at
its cell's centre. The page shows the images at their own size (scrolling at 1,024 nodes), never
scaled.

**Self-contained.** Images are ``data:`` URIs, the style and the one script (the name of the pair
under the pointer) are inline, fonts are the system's: opening the page fetches nothing.
"""

from __future__ import annotations

import base64
import io
import json
import math
import textwrap
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import numpy.typing as npt
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from PIL import Image

from clusterhealth.checks.fabric import analysis as fabric
from clusterhealth.fleet.report.view import LABELLED_NODES, View

COLORMAP = "viridis"
NEVER = (224, 224, 224)  # a pair never measured in the window
HATCH = (170, 170, 170)  # its diagonal hatch
SELF = (255, 255, 255)  # a node's own cell
HATCH_EVERY = 6  # pixels between the hatch's diagonals
VIEWS = ("latest", "worst")
MATRIX_PIXELS = 640  # the pair matrix's side, up to one pixel a pair
GROUP_PIXELS = 512
STRIP_PIXELS = 960
TICK_PIXELS = 100  # at least this far apart, for "11-29 03:10:20" in the page's small type

Pixels = npt.NDArray[np.uint8]


# The colormap's entries, 0 to 100 % of the reference; with the three colours that are not a
# ratio they fill a PNG palette's 256, so a raster is one byte a pixel.
LEVELS = 253
_NEVER, _HATCH, _SELF = 253, 254, 255

Indices = npt.NDArray[np.uint8]


def palette() -> Pixels:
    """The 256 RGB colours of a raster: the colormap's ``LEVELS`` from 0 to 100 %, then never
    measured, its hatch and a node's own cell."""
    rgba = colormaps[COLORMAP](np.linspace(0.0, 1.0, LEVELS))
    scale: Pixels = np.round(rgba[:, :3] * 255).astype(np.uint8)
    return np.vstack([scale, np.array([NEVER, HATCH, SELF], dtype=np.uint8)])


def raster(values: npt.NDArray[np.float32], width: int, height: int, *, diagonal: bool = False) -> Indices:
    """The picture of a values array as palette indices, ``width`` × ``height`` pixels a value,
    never-measured cells hatched, the diagonal a node's own cell when ``diagonal``."""
    scaled = np.clip(values * np.float32(LEVELS - 1) + np.float32(0.5), 0, LEVELS - 1)
    with np.errstate(invalid="ignore"):  # NaN casts to anything: those cells are set just below
        index: Indices = scaled.astype(np.uint8)
    index[np.isnan(values)] = _NEVER
    if diagonal:
        n = min(values.shape)
        index[np.arange(n), np.arange(n)] = _SELF
    if width > 1 or height > 1:
        index = np.repeat(np.repeat(index, height, axis=0), width, axis=1)
    rows, columns = index.shape
    tile = (np.add.outer(np.arange(HATCH_EVERY), np.arange(HATCH_EVERY)) % HATCH_EVERY) == 0
    reps = (-(-rows // HATCH_EVERY), -(-columns // HATCH_EVERY))
    hatch = np.tile(tile, reps)[:rows, :columns]
    np.logical_and(hatch, index == _NEVER, out=hatch)
    index[hatch] = _HATCH
    return index


def rgb(index: Indices) -> Pixels:
    """A raster's colours, for matplotlib."""
    out: Pixels = palette()[index]
    return out


def png_bytes(index: Indices) -> bytes:
    """A raster as a palette PNG (exact colours, one byte a pixel)."""
    image = Image.fromarray(index, "P")
    image.putpalette(palette().tobytes())
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=6)
    return out.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def cell_size(count: int, pixels: int, largest: int, smallest: int = 1) -> int:
    return max(smallest, min(largest, pixels // max(count, 1)))


def legend_figure(reference: float | None, threshold: float, width_px: int = 560) -> Figure:
    """The colour scale in % of the reference, and in GB/s above it when the reference is known,
    with the threshold below which a meeting is short."""
    figure = Figure(figsize=(width_px / 100, 1.25 if reference else 0.85), dpi=100)
    bottom = 0.42 if reference else 0.5
    axes = figure.add_axes((0.04, bottom, 0.92, 0.22 if reference else 0.3))
    mappable = ScalarMappable(norm=Normalize(0, 100), cmap=COLORMAP)
    bar = figure.colorbar(mappable, cax=axes, orientation="horizontal", extend="max")
    bar.set_ticks(list(range(0, 101, 10)))
    bar.set_label(f"share of the reference, % (short below {threshold:.0%}; 0 %: failed)", fontsize=8)
    axes.tick_params(labelsize=8)
    axes.axvline(threshold * 100, color="white", linewidth=1.5)
    axes.axvline(threshold * 100, color="black", linewidth=0.8, linestyle=(0, (2, 2)))
    if reference:
        gbps = reference / 1e9

        def to_gbps(percent: Any) -> Any:
            return percent * gbps / 100

        def to_percent(rate: Any) -> Any:
            return rate * 100 / gbps

        top = axes.secondary_xaxis("top", functions=(to_gbps, to_percent))
        top.set_xlabel("GB/s", fontsize=8, labelpad=2)
        top.tick_params(labelsize=8)
    return figure


def figure_png(figure: Figure, metadata: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=figure.dpi, metadata=metadata)
    return out.getvalue()


def utc(t: float, with_date: bool = True) -> str:
    moment = datetime.fromtimestamp(t, timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC" if with_date else "%H:%M")


def span(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:g} d"
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def time_ticks(view: View, cell_width: int) -> list[dict[str, Any]]:
    """Labels under the strip: a column's left edge in pixels and the start of its round (UTC,
    the date on the first label and where the day changes); rounds are numbered from the Unix
    epoch, so round r starts at r × period."""
    if not view.rounds:
        return []
    every = max(1, math.ceil(TICK_PIXELS / cell_width))
    ticks = []
    last_day = None
    for column in range(0, len(view.rounds), every):
        moment = datetime.fromtimestamp(view.rounds[column] * view.history.period, timezone.utc)
        clock = "%H:%M:%S" if view.history.period < 60 else "%H:%M"  # the lab's rounds are 20 s
        label = moment.strftime(clock if moment.date() == last_day else f"%m-%d {clock}")
        ticks.append({"x": column * cell_width, "label": label})
        last_day = moment.date()
    return ticks


def _pct(value: float | None) -> int | None:
    return None if value is None or math.isnan(value) else round(value * 100)


def _verdict(view: View) -> dict[str, Any]:
    a = view.analysis
    verdict: dict[str, Any] = {
        "headline": fabric.headline(a),
        "fleet": fabric.fleet_lines(a),
        "columns": fabric.COLUMNS,
        "suspects": [{"hosts": s.hosts, "row": fabric.suspect_row(s)} for s in a.suspects],
        "unconfirmed": [{"hosts": s.hosts, "row": fabric.suspect_row(s)} for s in a.unconfirmed],
        "jobs": [fabric.jobs_line(s) for s in a.suspects if s.impact is not None and s.impact.jobs],
        "workload": fabric.workload_text(a.workload),
        "no_verdict": a.not_enough_evidence,
        "partial": a.partial,
    }
    verdict["summary"] = fabric.summary(a)
    return verdict


def _facts(view: View, generated: float) -> list[tuple[str, str]]:
    h, a = view.history, view.analysis
    start = h.end - h.window
    n = view.size
    facts = [
        ("window", f"{utc(start)} to {utc(h.end)} ({span(h.window)})"),
        (
            "rounds",
            f"{a.rounds} with meetings, of {span(h.period)}"
            + (f" (rounds {view.rounds[0]} to {h.rounds[-1]})" if view.rounds else ""),
        ),
        ("nodes", f"{n:,}"),
        (
            "pairs measured",
            f"{len(view.pairs):,} of {n * (n - 1) // 2:,} in {a.meetings:,} meetings (a node meets one "
            "partner a round: most pairs of a large group do not meet within a window)",
        ),
    ]
    if a.reference is not None:
        facts.append(("reference", fabric.rate_text(a.reference) + ": the group's median meeting"))
    if a.expected is not None:
        facts.append(("agents' expectation", fabric.rate_text(a.expected)))
    newest = h.newest
    if newest is not None:
        age = span(max(0.0, h.end - newest))
        facts.append(("newest result", f"scraped {utc(newest)}, {age} before the window's end"))
    facts.append(("report made", utc(generated)))
    return facts


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def html(view: View, *, generated: float) -> str:
    """The page (see the module's docstring)."""
    n = view.size
    threshold = _threshold(view)
    data: dict[str, Any] = {
        "probe": view.analysis.probe,
        "nodes": view.order,
        "colormap": COLORMAP,
        "threshold": threshold,
        "reference_bytes_per_second": view.analysis.reference,
        "colours": {"never_measured": NEVER, "hatch": HATCH, "self": SELF},
        "suspects": [
            {"kind": s.kind, "suspect": s.name, "hosts": list(s.hosts)} for s in view.analysis.suspects
        ],
        "pairs": [[p.i, p.j, _pct(p.latest), _pct(p.worst), p.meetings, p.latest_round] for p in view.pairs],
        "matrix": None,
        "groups": None,
        "strip": None,
    }
    images: dict[str, str] = {}
    if view.latest is not None and view.worst is not None:
        cell = cell_size(n, MATRIX_PIXELS, 80)
        for which in VIEWS:
            values = view.matrix(which)
            assert values is not None
            images[f"matrix-{which}"] = data_uri(png_bytes(raster(values, cell, cell, diagonal=True)))
        data["matrix"] = {"cell": cell, "size": n, "ids": {w: f"matrix-{w}" for w in VIEWS}}
    show_groups = view.latest is None or n > LABELLED_NODES or (view.placement_known and len(view.groups) > 1)
    if show_groups:
        g = len(view.groups)
        gcell = cell_size(g, GROUP_PIXELS, 48, 4)
        for which in VIEWS:
            images[f"groups-{which}"] = data_uri(png_bytes(raster(view.group_matrix(which), gcell, gcell)))
        data["groups"] = {
            "cell": gcell,
            "names": [group.name for group in view.groups],
            "bounds": [[group.start, group.stop] for group in view.groups],
            "ids": {w: f"groups-{w}" for w in VIEWS},
        }
    strip_width = cell_size(len(view.rounds), STRIP_PIXELS, 32)
    strip_height = cell_size(n, MATRIX_PIXELS, 16)
    if view.rounds:
        images["strip"] = data_uri(png_bytes(raster(view.strip, strip_width, strip_height)))
        data["strip"] = {
            "id": "strip",
            "cell_width": strip_width,
            "cell_height": strip_height,
            "rounds": view.rounds,
            "rounds_per_column": view.rounds_per_column,
            "period_seconds": view.history.period,
        }
    legend = data_uri(figure_png(legend_figure(view.analysis.reference, threshold)))
    swatch = data_uri(png_bytes(raster(np.full((1, 1), np.nan, dtype=np.float32), 24, 16)))
    return (
        _environment()
        .get_template("page.html.j2")
        .render(
            title=f"clusterhealth report: {view.analysis.probe}",
            verdict=_verdict(view),
            facts=_facts(view, generated),
            missing=view.missing,
            problems=view.history.problems,
            data=data,
            images=images,
            labelled=view.latest is not None and n <= LABELLED_NODES,
            order=view.order,
            groups=view.groups,
            ticks=time_ticks(view, strip_width),
            legend=legend,
            swatch=swatch,
            rounds_per_column=view.rounds_per_column,
            period=span(view.history.period),
        )
    )


def _threshold(view: View) -> float:
    # The report judges with analyze's default rules (fleet/report/command.py).
    return fabric.Rules().threshold


# --- the PNG -----------------------------------------------------------------------------------

PNG_MATRIX_NODES = 1024  # above, the PNG shows the matrix by group
MATRIX_KEY = "clusterhealth-matrix"  # the PNG text chunk that says where the matrix is
TEXT_LINE_PX = 14
MONOSPACE_CHAR_PX = 7.0  # DejaVu Sans Mono at 8 pt, 100 dpi (6.7), with room
LEGEND_PX = 150
LABEL_MIN_CELL = 9  # pixels a row needs for its name at 7 pt
LABEL_CHAR_PX = 5.2  # DejaVu Sans at 7 pt, 100 dpi


def png(view: View, *, generated: float) -> bytes:
    """The matrix (latest meeting of each pair; by group above ``PNG_MATRIX_NODES``) and the
    verdict, as one PNG for a ticket or a chat message."""
    threshold = _threshold(view)
    if view.latest is not None and view.size <= PNG_MATRIX_NODES:
        cell = cell_size(view.size, MATRIX_PIXELS, 80)
        picture = rgb(raster(view.latest, cell, cell, diagonal=True))
        names: Sequence[str] = view.order if view.size <= LABELLED_NODES else []
        what = "latest meeting of each pair"
        rows = list(view.order)
    else:
        cell = cell_size(len(view.groups), GROUP_PIXELS, 48, 4)
        picture = rgb(raster(view.group_latest, cell, cell))
        names = [g.name for g in view.groups]
        what = f"median of the latest meetings between groups ({len(view.groups)} groups)"
        rows = [g.name for g in view.groups]
    verdict = _verdict(view)
    lines = [verdict["headline"], *verdict["fleet"], *(f"partial data: {p}" for p in view.history.problems)]
    if verdict["no_verdict"]:
        lines.append(verdict["summary"])
    elif verdict["suspects"]:
        lines.append(verdict["summary"])
        for s in verdict["suspects"]:
            row = dict(zip(fabric.COLUMNS, s["row"], strict=True))
            text = (
                f"  {row['SUSPECT']} ({row['KIND']}): ratio {row['RATIO']}, step {row['STEP']}, "
                f"{row['GPU-H/DAY']} GPU-h/day; {row['EVIDENCE']}; rounds {row['ROUNDS']}, "
                f"{row['FIRST SEEN']} to {row['LAST SEEN']}"
            )
            lines.append(text)
    else:
        lines.append("no suspect")
    start, end = view.history.end - view.history.window, view.history.end
    lines.append(f"window {utc(start)} to {utc(end)}; made {utc(generated)}")
    side = picture.shape[0]
    if cell < LABEL_MIN_CELL or len(names) > LABELLED_NODES:
        names = []  # a name a row would overlap its neighbours'
    label_px = round(max((len(n) for n in names), default=0) * LABEL_CHAR_PX) + 12 if names else 0
    margin_left = max(30, label_px)
    width = max(margin_left + side + LEGEND_PX, 900)
    columns = int((width - margin_left - 30) / MONOSPACE_CHAR_PX)
    lines = [
        wrapped
        for line in lines
        for wrapped in textwrap.wrap(line, columns, subsequent_indent="    ", break_on_hyphens=False)
    ]
    margin_top = 40 + label_px
    text_px = TEXT_LINE_PX * (len(lines) + 1) + 20
    height = margin_top + side + 30 + text_px
    figure = Figure(figsize=(width / 100, height / 100), dpi=100)
    axes = figure.add_axes((margin_left / width, (text_px + 30) / height, side / width, side / height))
    axes.imshow(picture, interpolation="nearest", extent=(0, side, side, 0))
    axes.set_xlim(0, side)
    axes.set_ylim(side, 0)
    if names:
        centres = [(i + 0.5) * cell for i in range(len(names))]
        axes.set_xticks(centres, names, rotation=90, fontsize=7)
        axes.set_yticks(centres, names, fontsize=7)
        axes.xaxis.tick_top()
    else:
        axes.set_xticks([])
        axes.set_yticks([])
    figure.text(
        margin_left / width,
        1 - 12 / height,
        f"clusterhealth report: probe {view.analysis.probe}, {what}",
        fontsize=10,
        va="top",
    )
    bar_axes = figure.add_axes(
        ((margin_left + side + 30) / width, (text_px + 30) / height, 18 / width, side / height)
    )
    bar = figure.colorbar(ScalarMappable(norm=Normalize(0, 100), cmap=COLORMAP), cax=bar_axes, extend="max")
    bar.set_ticks(list(range(0, 101, 20)))
    bar.ax.tick_params(labelsize=7)
    bar.ax.axhline(threshold * 100, color="black", linewidth=0.8, linestyle=(0, (2, 2)))
    label = "% of the reference"
    if view.analysis.reference:
        label += f" ({view.analysis.reference / 1e9:.2f} GB/s = 100 %)"
    bar.set_label(label + "; grey hatch: never measured", fontsize=7)
    figure.text(
        margin_left / width,
        (text_px - 5) / height,
        "\n".join(lines),
        fontsize=8,
        family="monospace",
        va="top",
    )
    # Where the matrix lies in the picture, for whoever reads its pixels (the tests), as the page
    # exposes it: a PNG text chunk.
    where = {
        "box": [margin_left, margin_top, side, side],
        "cell": cell,
        "rows": rows,
        "colormap": COLORMAP,
        "threshold": threshold,
    }
    return figure_png(figure, {"Software": "clusterhealth report", MATRIX_KEY: json.dumps(where)})
