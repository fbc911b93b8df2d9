"""`clusterhealth report`, looked at in a real browser.

The reports are made by the real command from the backfilled Prometheus the analyze tests read
(tests/fabric_store.py: a bad host, a bad path, a 200-node group with single shorts, a bad host
and a confirmed path, a clean fleet), and opened in Debian's chromium with no network
(tests/browser.py). The page exposes where its cells are (``report-data``: the node order and
the cell sizes; the images' boxes are the page's layout): each test reads the screenshot's pixel
at a cell's centre and turns it back into a ratio through the colormap the page names, and
compares it with what the simulation played (``PLAYED``), never with what the report itself
computed.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from clusterhealth.checks.fabric import simulation as sim
from clusterhealth.fleet import pairwise
from clusterhealth.fleet.report import command, render, view
from tests.browser import Browser, Looked, Matrix, matrix, ratios
from tests.conftest import CLUSTERHEALTH, ROOT
from tests.fabric_history import simulated
from tests.fabric_store import LAST, NOISY, PLAYED, SHIFT, N, Servers, free_port


@dataclass
class Made:
    code: int
    stdout: str
    stderr: str
    path: Path


def _report(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLUSTERHEALTH, "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.fixture(scope="module")
def made(fabric_store: Servers, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Made]:
    folder = tmp_path_factory.mktemp("reports")
    out = {}
    for probe in ("hostfault", "pathfault", "clean", "noisefaults", "fewrounds", "unreachable"):
        path = folder / f"{probe}.html"
        done = _report("--prometheus", fabric_store.url, "--probe", probe, "--window", "2h", "-o", str(path))
        out[probe] = Made(done.returncode, done.stdout, done.stderr, path)
    return out


@pytest.fixture(scope="module")
def pages(made: dict[str, Made], browser: Browser) -> Iterator[dict[str, Looked]]:
    opened = {probe: browser.look(m.path) for probe, m in made.items() if m.path.exists()}
    yield opened
    for looked in opened.values():
        looked.close()


def _assert_clean_load(looked: Looked) -> None:
    """Self-contained: the page asked for its own file only, nothing failed, nothing complained."""
    assert looked.requests == [looked.url]
    assert looked.refused == [] and looked.failed == []
    assert looked.console_errors == [] and looked.errors == []


# --- what the simulation played --------------------------------------------------------------------


def _played(probe: str) -> list[sim.Outcome]:
    """The meetings the group played, numbered as Prometheus holds them."""
    return [m for rnd in sim.shifted(PLAYED[probe], SHIFT[0]) for m in rnd.meetings]


def _pairs(probe: str) -> dict[frozenset[str], list[sim.Outcome]]:
    found: dict[frozenset[str], list[sim.Outcome]] = {}
    for m in _played(probe):
        found.setdefault(frozenset((m.server, m.client)), []).append(m)
    return found


# --- a bad host -------------------------------------------------------------------------------------


def test_a_bad_host_is_a_cross_of_slow_cells_and_its_row_turns_dark_when_it_degraded(
    made: dict[str, Made], pages: dict[str, Looked]
) -> None:
    m = made["hostfault"]
    assert m.code == 1, m.stderr
    assert m.stdout == f"{m.path}: 1 suspect: h3 (host)\n"
    looked = pages["hostfault"]
    _assert_clean_load(looked)
    shot = looked.screenshot()
    latest = matrix(looked, "latest", shot)
    assert latest.nodes == sim.node_names(N), "h1..h8, by name"
    fault = LAST - 2 + SHIFT[0]
    pairs = _pairs("hostfault")
    crossed = {next(iter(p - {"h3"})) for p, ms in pairs.items() if "h3" in p and ms[-1].round >= fault}
    assert len(crossed) >= 3
    for partner in crossed:
        # Row and column: the matrix is symmetric, and both halves are drawn.
        assert latest.ratio("h3", partner) < 0.8 and latest.ratio(partner, "h3") < 0.8, partner
    healthy = [p for p, ms in pairs.items() if "h3" not in p and not any(x.short for x in ms)]
    assert len(healthy) >= 15
    for pair in healthy:
        a, b = sorted(pair)
        assert latest.ratio(a, b) >= 0.8 and latest.ratio(b, a) >= 0.8, pair
    # The worst meeting of each pair: the same cross, and the healthy pairs still healthy.
    worst = matrix(looked, "worst")
    for partner in crossed:
        assert worst.ratio("h3", partner) < 0.8 and worst.ratio(partner, "h3") < 0.8, partner
    for pair in healthy:
        a, b = sorted(pair)
        assert worst.ratio(a, b) >= 0.8, pair
    # Pointing at a cell names its pair and its two ratios.
    partner = sorted(crossed)[0]
    column = latest.nodes.index(partner)
    looked.page.click("label[for=view-latest]")
    looked.page.locator("#matrix-latest").hover(
        position={"x": (column + 0.5) * latest.cell, "y": (latest.nodes.index("h3") + 0.5) * latest.cell}
    )
    tip = looked.text("#tip")
    assert re.fullmatch(rf"h3 ↔ {partner}: latest \d+ % \([\d.]+ GB/s\), worst \d+ % .*", tip), tip
    assert looked.errors == [] and looked.console_errors == []
    # The verdict names the host, with its kind and price.
    suspects = looked.text("#suspects")
    (row,) = [line.split("\t") for line in suspects.splitlines() if line.startswith("h3")]
    assert row[1] == "host" and re.fullmatch(r"x[12]\.\d\d", row[3]) and row[-1] == "h3", row
    assert looked.text("#summary") == "1 suspect: h3 (host)"
    # Each node round by round: h3's row is slow from the round it degraded, not before.
    seen = _strip(looked, shot)["h3"]
    h3 = [x for x in _played("hostfault") if "h3" in (x.server, x.client)]
    assert {x.round for x in h3} == {r for r, v in seen.items() if not math.isnan(v)}
    for meeting in h3:
        others = [o for o in h3 if o.round == meeting.round]
        if meeting.round >= fault:
            assert seen[meeting.round] < 0.8, meeting
        elif not any(o.short for o in others):
            assert seen[meeting.round] >= 0.8, meeting


def test_a_bad_path_is_its_own_cell_not_its_hosts(made: dict[str, Made], pages: dict[str, Looked]) -> None:
    m = made["pathfault"]
    assert m.code == 1, m.stderr
    looked = pages["pathfault"]
    _assert_clean_load(looked)
    for which in ("latest", "worst"):
        cells = matrix(looked, which)
        assert cells.ratio("h2", "h5") < 0.8 and cells.ratio("h5", "h2") < 0.8, which
    # h2's and h5's other pairs, measured fine, are not slow: a path, not a host.
    latest = matrix(looked, "latest")
    fine = [
        p
        for p, ms in _pairs("pathfault").items()
        if p & {"h2", "h5"} and p != {"h2", "h5"} and not any(x.short for x in ms)
    ]
    assert len(fine) >= 6
    for pair in fine:
        a, b = sorted(pair)
        assert latest.ratio(a, b) >= 0.8, pair
    (row,) = [
        line.split("\t") for line in looked.text("#suspects").splitlines() if line.startswith("h2<->h5")
    ]
    assert row[1] == "path" and row[-1] == "h2, h5", row


def test_a_clean_fleet_has_no_slow_colour_anywhere_and_says_no_suspect(
    made: dict[str, Made], pages: dict[str, Looked]
) -> None:
    m = made["clean"]
    assert m.code == 0, m.stderr
    assert m.stdout.endswith(": no suspect\n")
    looked = pages["clean"]
    _assert_clean_load(looked)
    assert looked.text("#summary") == "no suspect"
    assert "No suspect" in looked.text("#verdict")
    data = looked.data()
    for which in ("latest", "worst"):
        cells = matrix(looked, which)
        seen = ratios(cells.pixels(), data["colormap"])
        on_scale = seen[~np.isnan(seen)]
        assert on_scale.size > 0.5 * seen.size, "most of the matrix is measured pairs"
        assert on_scale.min() >= 0.8, f"{which}: a slow colour in a clean fleet"
    x, y, w, h = (round(v) for v in looked.box("strip"))
    strip = ratios(np.asarray(looked.screenshot().crop((x, y, x + w, y + h))), data["colormap"])
    assert np.nanmin(strip) >= 0.8
    # Nothing is missing; the backfilled data may be minutes old by now, which the page says.
    missing = looked.text("#missing").splitlines()
    assert all(line.startswith(("Nothing:", "the newest result was scraped")) for line in missing), missing


def test_two_hundred_noisy_nodes_show_the_bad_host_and_the_confirmed_path(
    made: dict[str, Made], pages: dict[str, Looked]
) -> None:
    m = made["noisefaults"]
    assert m.code == 1, m.stderr
    looked = pages["noisefaults"]
    _assert_clean_load(looked)
    data = looked.data()
    assert len(data["nodes"]) == NOISY and data["groups"] is not None, "a view by group at this size"
    fault = LAST - 8 + SHIFT[0]
    worst = matrix(looked, "worst")
    pairs = _pairs("noisefaults")
    crossed = [
        next(iter(p - {"h3"})) for p, ms in pairs.items() if "h3" in p and any(x.round >= fault for x in ms)
    ]
    assert len(crossed) >= 5
    for partner in crossed:
        assert worst.ratio("h3", partner) < 0.8, partner
    path = next(
        frozenset((x.server, x.client))
        for x in _played("noisefaults")
        if x.confirming and x.short and "h2" in (x.server, x.client)
    )
    a, b = sorted(path)
    assert worst.ratio(a, b) < 0.8
    suspects = looked.text("#suspects")
    assert re.search(r"^h3\s+host", suspects, re.M) and f"{a}<->{b}" in suspects
    # Pairs never measured (most of them at this size) are on no colour of the scale.
    never = [
        (x, y)
        for x in data["nodes"][:20]
        for y in data["nodes"][:20]
        if x != y and frozenset((x, y)) not in pairs
    ]
    assert len(never) > 100
    assert all(math.isnan(worst.ratio(x, y)) for x, y in never)
    # A spurious short whose pair met again, fine, at its confirming meeting: slow in the worst
    # view, not in the latest.
    recovered = [
        sorted(p)
        for p, ms in pairs.items()
        if "h3" not in p and any(x.short for x in ms) and not ms[-1].short
    ]
    assert len(recovered) >= 5
    latest = matrix(looked, "latest")
    for a, b in recovered:
        assert worst.ratio(a, b) < 0.8 <= latest.ratio(a, b), (a, b)
    # Each node round by round, against what was played: every (node, round) with a short meeting
    # is slow, every one with fine meetings only is not, every one without a meeting is off the scale.
    short: dict[tuple[str, int], bool] = {}
    for x in _played("noisefaults"):
        for node in (x.server, x.client):
            short[(node, x.round)] = short.get((node, x.round), False) or x.short
    seen = _strip(looked, looked.screenshot())
    assert sum(short.values()) >= 50
    for (node, r), was_short in short.items():
        assert (seen[node][r] < 0.8) == was_short, (node, r)
    idle = [(n, r) for n in data["nodes"] for r in seen[n] if (n, r) not in short]
    assert idle and all(math.isnan(seen[n][r]) for n, r in idle)


def _strip(looked: Looked, shot: Image.Image) -> dict[str, dict[int, float]]:
    """Each node's ratio in each round, read from the strip's pixels at the cells' centres."""
    data = looked.data()
    strip = data["strip"]
    x0, y0, _, _ = looked.box(strip["id"])
    out: dict[str, dict[int, float]] = {}
    for row, node in enumerate(data["nodes"]):
        y = int(y0 + (row + 0.5) * strip["cell_height"])
        pixels = np.array(
            [
                shot.getpixel((int(x0 + (column + 0.5) * strip["cell_width"]), y))
                for column in range(len(strip["rounds"]))
            ],
            dtype=np.int32,
        )
        found = ratios(pixels[None, :, :], data["colormap"])[0]
        out[node] = {r: float(v) for r, v in zip(strip["rounds"], found, strict=True)}
    return out


def test_a_host_nobody_can_reach_is_drawn_at_zero_not_as_never_measured(
    made: dict[str, Made], pages: dict[str, Looked]
) -> None:
    # h4's runs measured nothing for the last 4 rounds: failed meetings, the darkest colour.
    assert made["unreachable"].code == 1
    looked = pages["unreachable"]
    _assert_clean_load(looked)
    latest = matrix(looked, "latest")
    fault = LAST - 3 + SHIFT[0]
    failed = {
        next(iter(p - {"h4"}))
        for p, ms in _pairs("unreachable").items()
        if "h4" in p and ms[-1].round >= fault
    }
    assert len(failed) >= 3
    for partner in failed:
        assert latest.ratio("h4", partner) < 0.05 and latest.ratio(partner, "h4") < 0.05, partner


def test_partial_data_is_drawn_only_when_asked_and_the_page_says_what_is_missing(
    fabric_store: Servers, tmp_path: Path, browser: Browser
) -> None:
    out = tmp_path / "partial.html"
    args = ["--prometheus", fabric_store.partial, "--probe", "hostfault", "--window", "2h", "-o", str(out)]
    done = _report(*args)
    assert done.returncode == 3 and "--allow-partial" in done.stderr and not out.exists()
    done = _report(*args, "--allow-partial")
    assert done.returncode == 1, done.stderr
    looked = browser.look(out)
    try:
        _assert_clean_load(looked)
        assert "PARTIAL DATA" in looked.text("header")
        missing = looked.text("#missing")
        assert "partial data: Prometheus answered with partial data" in missing and "remote_read" in missing
        assert looked.text("#summary") == "1 suspect: h3 (host)"
    finally:
        looked.close()


def test_too_few_rounds_draws_what_there_is_and_says_there_is_no_verdict(
    made: dict[str, Made], pages: dict[str, Looked]
) -> None:
    m = made["fewrounds"]
    assert m.code == 3, m.stderr
    looked = pages["fewrounds"]
    _assert_clean_load(looked)
    assert looked.text("#summary").startswith("no verdict: 2 rounds of probe fewrounds")
    assert "no verdict: 2 rounds" in looked.text("#missing")


# --- bad input ---------------------------------------------------------------------------------------


def _nothing_written(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["old.html"], "no report, no temporary file"
    assert (folder / "old.html").read_text() == "the previous report\n", "left as it was"


@pytest.mark.parametrize(
    ("case", "args", "said"),
    [
        ("unreachable", ["--probe", "hostfault"], "cannot reach Prometheus"),
        ("no such probe", ["--probe", "nosuch"], "no results of probe nosuch"),
        ("an empty window", ["--probe", "hostfault", "--window", "1m"], "no results of probe hostfault"),
        ("one node", ["--probe", "lonely"], "no pairwise results of probe lonely"),
        ("several groups", [], "choose one with --probe"),
    ],
)
def test_nothing_to_draw_is_said_and_leaves_no_file(
    fabric_store: Servers, tmp_path: Path, case: str, args: list[str], said: str
) -> None:
    (tmp_path / "old.html").write_text("the previous report\n")
    url = f"http://127.0.0.1:{free_port()}" if case == "unreachable" else fabric_store.url
    window = [] if "--window" in args else ["--window", "2h"]
    done = _report("--prometheus", url, *args, *window, "-o", str(tmp_path / "old.html"))
    assert done.returncode == 3, done.stderr
    assert said in done.stderr and done.stderr.endswith("; no report written\n"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    _nothing_written(tmp_path)


def test_bad_arguments_exit_2_before_anything_is_read(tmp_path: Path) -> None:
    (tmp_path / "old.html").write_text("the previous report\n")
    out = str(tmp_path / "old.html")
    cases = [
        (["--prometheus", "http://127.0.0.1:9", "--window", "soon", "-o", out], "expected a duration"),
        (["--prometheus", "127.0.0.1:9090", "-o", out], "expected http(s)://HOST:PORT"),
        (["--prometheus", "http://127.0.0.1:9", "--probe", 'x"}', "-o", out], "expected a probe name"),
        (
            ["--prometheus", "http://127.0.0.1:9", "-o", str(tmp_path / "nowhere" / "r.html")],
            "does not exist",
        ),
        (["--prometheus", "http://127.0.0.1:9", "-o", str(tmp_path)], "is a directory"),
        (["--prometheus", "http://127.0.0.1:9", "-o", out, "--format", "pdf"], "invalid choice"),
        (["--prometheus", "http://127.0.0.1:9", "-o", out, "--overlap", "2"], "overlap"),
    ]
    for args, said in cases:
        done = _report(*args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    _nothing_written(tmp_path)


def test_without_the_report_extra_it_says_what_to_install(tmp_path: Path) -> None:
    # A matplotlib that cannot be imported, ahead of the real one on the path: as in an environment
    # where `pip install clusterhealth` left the extra out.
    blocker = tmp_path / "blocked" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n"
    )
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "old.html").write_text("the previous report\n")
    done = _report(
        "--prometheus", "http://127.0.0.1:9", "-o", str(folder / "old.html"),
        env={"PYTHONPATH": str(blocker.parent)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "clusterhealth report: needs the report extra (matplotlib is not installed): "
        "pip install 'clusterhealth[report]'\n"
    )
    # The same interpreter without the blocker has it: the message is the blocker's doing.
    probe = [sys.executable, "-c", "import matplotlib"]
    assert subprocess.run(probe, capture_output=True, check=False).returncode == 0
    blocked = subprocess.run(
        probe, capture_output=True, check=False, env={**os.environ, "PYTHONPATH": str(blocker.parent)}
    )
    assert blocked.returncode == 1
    _nothing_written(folder)


def test_a_failed_write_leaves_neither_the_file_nor_a_part(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.mkdir()  # os.replace cannot put a file over a directory
    (target / "inside").write_text("x")
    with pytest.raises(OSError):
        command.replace_whole(target, b"<html></html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    written = tmp_path / "ok.html"
    command.replace_whole(written, b"<html></html>")
    assert written.read_bytes() == b"<html></html>" and oct(written.stat().st_mode & 0o777) != "0o600"


# --- the PNG ------------------------------------------------------------------------------------------


def test_the_png_holds_the_matrix_and_the_verdict(fabric_store: Servers, tmp_path: Path) -> None:
    out = tmp_path / "hostfault.png"
    done = _report(
        "--prometheus",
        fabric_store.url,
        "--probe",
        "hostfault",
        "--window",
        "2h",
        "-o",
        str(out),
        "--format",
        "png",
    )
    assert done.returncode == 1, done.stderr
    picture = Image.open(out)
    where = json.loads(picture.text[render.MATRIX_KEY])
    shot = picture.convert("RGB")
    cells = Matrix(shot, tuple(where["box"]), where["cell"], where["rows"], where["colormap"])
    fault = LAST - 2 + SHIFT[0]
    pairs = _pairs("hostfault")
    crossed = {next(iter(p - {"h3"})) for p, ms in pairs.items() if "h3" in p and ms[-1].round >= fault}
    for partner in crossed:
        assert cells.ratio("h3", partner) < 0.8 and cells.ratio(partner, "h3") < 0.8
    healthy = [p for p, ms in pairs.items() if "h3" not in p and not any(x.short for x in ms)]
    for pair in healthy:
        a, b = sorted(pair)
        assert cells.ratio(a, b) >= 0.8, pair
    clean = tmp_path / "clean.png"
    done = _report(
        "--prometheus",
        fabric_store.url,
        "--probe",
        "clean",
        "--window",
        "2h",
        "-o",
        str(clean),
        "--format",
        "png",
    )
    assert done.returncode == 0, done.stderr
    picture = Image.open(clean)
    where = json.loads(picture.text[render.MATRIX_KEY])
    x, y, w, h = where["box"]
    seen = ratios(
        np.asarray(picture.convert("RGB").crop((x + 1, y + 1, x + w - 1, y + h - 1))), where["colormap"]
    )
    assert np.nanmin(seen) >= 0.8


# --- sizes ---------------------------------------------------------------------------------------------


def test_five_thousand_nodes_are_drawn_by_group_and_the_page_says_so(
    tmp_path: Path, browser: Browser
) -> None:
    history, _ = simulated(5000, 4, first=2_000_000, fault_from=2_000_000, bad_hosts={"h3": 0.5})
    result = pairwise.judge(history)
    out = command.write(history, result, tmp_path / "big.html")
    looked = browser.look(out)
    try:
        _assert_clean_load(looked)
        data = looked.data()
        assert data["matrix"] is None and len(data["nodes"]) == 5000
        size = math.ceil(5000 / view.MAX_GROUPS)
        assert len(data["groups"]["names"]) <= view.MAX_GROUPS and data["groups"]["names"][0] == f"h1–h{size}"
        assert "shown by group only" in looked.text("#missing")
        assert looked.box("groups-latest")[2] > 0 and looked.box("strip")[3] >= 5000
    finally:
        looked.close()
    assert out.stat().st_size < 8e6


def test_the_order_keeps_a_placement_together_and_names_in_number_order() -> None:
    nodes = ["h10", "h2", "h1", "gpu-b7", "gpu-a12", "gpu-a3"]
    assert view.order_nodes(nodes) == ["gpu-a3", "gpu-a12", "gpu-b7", "h1", "h2", "h10"]
    placement = {"h10": ("spine1", "leaf1"), "h1": ("spine1", "leaf2"), "gpu-b7": ("spine1", "leaf1")}
    ordered = view.order_nodes(nodes, placement)
    assert ordered == ["gpu-b7", "h10", "h1", "gpu-a3", "gpu-a12", "h2"], "placed first, leaf by leaf"
    groups = view.groups_of(ordered, placement)
    assert [(g.name, g.start, g.stop) for g in groups] == [
        ("spine1/leaf1", 0, 2),
        ("spine1/leaf2", 2, 3),
        ("unplaced", 3, 6),
    ]
    blocks = view.groups_of(sim.node_names(130))
    # At most MAX_GROUPS (64) blocks: 130 nodes go by three, the last alone.
    assert len(blocks) == 44 and blocks[0].name == "h1–h3" and blocks[-1].name == "h130"


def test_a_page_is_drawn_for_a_single_node_and_a_single_pair(tmp_path: Path, browser: Browser) -> None:
    history, _ = simulated(2, 6, first=2_000_000)
    result = pairwise.judge(history)
    looked = browser.look(command.write(history, result, tmp_path / "pair.html"))
    try:
        _assert_clean_load(looked)
        assert looked.data()["nodes"] == ["h1", "h2"]
        assert matrix(looked).ratio("h1", "h2") >= 0.8
        assert looked.text("#missing").startswith("Nothing:")
    finally:
        looked.close()
    # The same read three rounds later with nothing new: the page says the data is stale.
    history.end += 3 * history.period
    looked = browser.look(command.write(history, pairwise.judge(history), tmp_path / "stale.html"))
    try:
        assert re.search(
            r"the newest result was scraped 4[45] min before the window's end, more than 2",
            looked.text("#missing"),
        )
    finally:
        looked.close()
    history.meetings = []
    history.nodes = {"h1"}
    result = pairwise.judge(history)
    looked = browser.look(command.write(history, result, tmp_path / "one.html"))
    try:
        _assert_clean_load(looked)
        assert looked.text("#summary").startswith("no verdict: 0 rounds")
        assert "1 node exported the group's series but met nobody: h1" in looked.text("#missing")
    finally:
        looked.close()


# --- the sandbox ---------------------------------------------------------------------------------------


def test_the_browser_reaches_nothing_even_when_the_routing_lets_a_request_through(
    tmp_path: Path, browser: Browser
) -> None:
    # A server on this machine's loopback, and a page asking for it: inside chromium's network
    # namespace there is no loopback to reach it on.
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.png"
        page = tmp_path / "page.html"
        page.write_text(
            f'<html><head><link rel="icon" href="data:,"></head><body><img src="{url}"></body></html>'
        )
        looked = browser.look(page, let_through=lambda u: u == url)
        try:
            assert looked.requests == [looked.url, url]
            assert looked.refused == [] and len(looked.failed) == 1 and url in looked.failed[0]
        finally:
            looked.close()
        refused = browser.look(page)
        try:
            assert refused.refused == [url], "the routing alone refuses it too"
        finally:
            refused.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert asked == []


# --- the README's picture ------------------------------------------------------------------------------


def test_the_readme_picture_is_the_report_as_drawn_today(tmp_path: Path, browser: Browser) -> None:
    from tests import report_image

    fresh = tmp_path / "report.png"
    where = report_image.draw(browser, fresh)
    committed = ROOT / report_image.IMAGE
    assert committed.exists(), "run `make generate`"
    old = np.asarray(Image.open(committed).convert("RGB")).astype(np.int32)
    new = np.asarray(Image.open(fresh).convert("RGB")).astype(np.int32)
    assert old.shape == new.shape, "the picture changed size: run `make generate`"
    differing = (np.abs(old - new).sum(axis=2) > 48).mean()
    # Another build of chromium may move the antialiasing of some text edges, never a cell.
    assert differing < 0.01, f"{differing:.1%} of the pixels differ: run `make generate`"
    assert committed.stat().st_size < 250_000, "keep the README's picture small"
    # What it shows: the bad host's cross and the bad path's cell, in the committed picture.
    cells = Matrix(
        Image.open(committed).convert("RGB"), where["box"], where["cell"], where["nodes"], where["colormap"]
    )
    host, path = report_image.BAD_HOST, report_image.BAD_PATH
    slow = [n for n in where["nodes"] if n != host and cells.ratio(host, n) < 0.8]
    assert len(slow) >= 3
    assert cells.ratio(*path) < 0.8 and cells.ratio(path[1], path[0]) < 0.8


# --- by leaf --------------------------------------------------------------------------------------


def test_a_placed_group_is_drawn_by_leaf_and_its_bad_uplink_named(
    fabric_store: Servers, tmp_path: Path
) -> None:
    # The tree of tests/fabric_store.py: its members' leaves, read back from Prometheus, order the
    # matrix (a leaf's members side by side, so a bad uplink is a block) and name its groups.
    path = tmp_path / "tree.html"
    done = _report(
        "--prometheus", fabric_store.url, "--probe", "treeuplink", "--window", "2h", "-o", str(path)
    )
    assert done.returncode == 1, done.stderr
    page = path.read_text()
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert found is not None
    data = json.loads(found.group(1))
    assert data["nodes"] == [f"t{i}" for i in range(1, 65)], "by leaf (8 a leaf), then by name"
    assert data["groups"]["names"] == [f"leaf{j}" for j in range(1, 9)]
    assert data["groups"]["bounds"][2] == [16, 24]
    assert {"kind": "uplink", "suspect": "leaf3", "hosts": [f"t{i}" for i in range(17, 25)]} in data[
        "suspects"
    ]
    assert "leaf3" in page and "t17" in page
