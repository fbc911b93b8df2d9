"""`clusterhealth report`: read a pairwise group as `analyze` does, judge it, write the page.

The history is read and judged by fleet/pairwise.py (``read_history``, ``judge``), the one reader
`analyze` and `lab` use; the page adds what the judged history shows (fleet/report/view.py).

The file is written whole or not at all: into a temporary file beside it, renamed over it at the
end. When there is no history to show (Prometheus unreachable or answering an error, no such
probe, nothing in the window, partial data without ``--allow-partial``) nothing is written and the
message says why; a history too short for a verdict is still drawn, and the page says so.

Exit codes, as `analyze`'s: 0 no suspect, 1 suspects, 2 bad arguments or the report extra
missing, 3 no verdict.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from clusterhealth.checks import cost
from clusterhealth.checks.fabric import topology
from clusterhealth.checks.fabric.analysis import Analysis, summary
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.analyze import EXIT_NO_SUSPECT, EXIT_NO_VERDICT, EXIT_SUSPECTS, EXIT_USAGE
from clusterhealth.fleet.pairwise import History
from clusterhealth.fleet.prometheus import NoVerdict, Prometheus, parse_duration, valid_url

FORMATS = ("html", "png")
# The modules of the report extra (pyproject's `report`), by the name an ImportError gives.
EXTRA_MODULES = ("matplotlib", "PIL", "jinja2", "numpy", "markupsafe")
INSTALL = "pip install 'clusterhealth[report]'"


class MissingExtra(Exception):
    """The report extra is not installed; the message says what to install."""


def renderer() -> tuple[ModuleType, ModuleType]:
    """fleet/report/view.py and render.py; MissingExtra when the report extra is not installed."""
    try:
        from clusterhealth.fleet.report import render, view
    except ImportError as err:
        missing = (err.name or "").partition(".")[0]
        if missing not in EXTRA_MODULES:
            raise
        raise MissingExtra(f"needs the report extra ({missing} is not installed): {INSTALL}") from None
    return view, render


def write(
    history: History,
    analysis: Analysis,
    path: Path,
    fmt: str = "html",
    *,
    generated: float | None = None,
    placement: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """Draw a judged history into ``path`` (html or png), whole or not at all; the path written.
    ``placement`` (node → its places, outermost first, e.g. (spine, leaf)) orders the nodes and
    groups them; without it, the places the history read back (its members file's leaves, else the
    NVLink domains), else by name. MissingExtra without the report extra; OSError when the file
    cannot be written."""
    view, render = renderer()
    if placement is None:
        placement = topology.outermost_first(history.placement) or None
    shown = view.build(history, analysis, placement)
    made = time.time() if generated is None else generated
    body = render.html(shown, generated=made).encode() if fmt == "html" else render.png(shown, generated=made)
    replace_whole(path, body)
    return path


def replace_whole(path: Path, body: bytes) -> None:
    """Write ``body`` to a temporary file in ``path``'s directory and rename it over ``path``: a
    reader sees the old file or the new one, never a part, and a failure leaves nothing behind."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes it 0600; a report is for reading
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def main(
    url: str,
    probe: str | None,
    window_text: str,
    output: str,
    fmt: str = "html",
    *,
    step_text: str | None = None,
    allow_partial: bool = False,
    workload: cost.Workload = cost.IMPACT_WORKLOAD,
) -> int:
    """The command: writes the report and prints its path and the verdict's summary; the exit code."""

    def usage(problem: str) -> int:
        print(f"clusterhealth report: {problem}", file=sys.stderr)
        return EXIT_USAGE

    try:
        window = parse_duration(window_text)
        step = parse_duration(step_text) if step_text else None
    except ValueError as err:
        return usage(str(err))
    if probe is not None and not pairwise.valid_probe(probe):
        return usage(f"--probe: expected a probe name, got {probe!r}")
    if not valid_url(url):
        return usage(f"--prometheus: expected http(s)://HOST:PORT, got {url!r}")
    if fmt not in FORMATS:
        return usage(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    path = Path(output)
    if path.is_dir():
        return usage(f"-o: {output} is a directory; expected a file to write")
    folder = path.parent
    if not folder.is_dir():
        return usage(f"-o: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        return usage(f"-o: cannot write in {folder}")
    try:
        renderer()
    except MissingExtra as err:
        return usage(str(err))
    try:
        history = pairwise.read_history(
            Prometheus(url), probe, window, step=step, allow_partial=allow_partial
        )
    except NoVerdict as err:
        print(f"clusterhealth report: {err}; no report written", file=sys.stderr)
        return EXIT_NO_VERDICT
    result = pairwise.judge(history, workload=workload)
    try:
        write(history, result, path, fmt)
    except OSError as err:
        return usage(f"cannot write {output}: {err.strerror or err}")
    print(f"{path}: {summary(result)}")
    if result.not_enough_evidence:
        return EXIT_NO_VERDICT
    return EXIT_SUSPECTS if result.suspects else EXIT_NO_SUSPECT
