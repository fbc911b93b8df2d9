"""A real headless browser for tests: Debian's chromium, driven by Playwright through the DevTools
protocol, with no network.

Chromium runs in a network namespace of its own (``unshare --net``) in which no interface is up,
not even loopback: it can reach nothing, this machine's servers included. On top of that, every
request a page makes goes through Playwright's routing (the DevTools Fetch domain): the page's own
file is let through, everything else recorded and refused. A page that is self-contained makes
exactly one request, its own file, and no request fails.

Playwright for Python drives the browser through its own driver (shipped in the wheel) and
``executable_path``: no browser is downloaded. What it records of a page: every request, the
failed ones, console messages, uncaught errors; a full-page screenshot at one CSS pixel a pixel.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from PIL import Image
from playwright.sync_api import BrowserContext, Page, Playwright, Request, Route, sync_playwright

from .conftest import require_tool

# A pixel within this distance (summed over R, G, B) of a colormap entry is that entry's colour.
TOLERANCE = 6


@dataclass
class Looked:
    """A page as the browser loaded it, and what happened while it did."""

    page: Page
    context: BrowserContext
    url: str
    requests: list[str] = field(default_factory=list)  # every request, its own file included
    refused: list[str] = field(default_factory=list)  # requests the routing refused
    failed: list[str] = field(default_factory=list)  # requests that failed, with why
    console: list[str] = field(default_factory=list)  # console messages: "type: text"
    errors: list[str] = field(default_factory=list)  # uncaught exceptions

    @property
    def console_errors(self) -> list[str]:
        return [m for m in self.console if m.startswith(("error:", "warning:"))]

    def screenshot(self, path: Path | None = None) -> Image.Image:
        """The whole page, one CSS pixel a pixel."""
        png = self.page.screenshot(full_page=True, path=path)
        return Image.open(io.BytesIO(png)).convert("RGB")

    def data(self, element_id: str = "report-data") -> Any:
        """The JSON of a ``<script type="application/json">`` element."""
        return json.loads(self.page.text_content(f"#{element_id}") or "null")

    def box(self, element_id: str) -> tuple[float, float, float, float]:
        """An element's x, y, width and height on the page (as the full-page screenshot has it)."""
        box = self.page.locator(f"#{element_id}").bounding_box()
        assert box is not None, f"#{element_id} is not displayed"
        scroll = self.page.evaluate("[window.scrollX, window.scrollY]")
        return (box["x"] + scroll[0], box["y"] + scroll[1], box["width"], box["height"])

    def text(self, selector: str = "body") -> str:
        return self.page.inner_text(selector)

    def close(self) -> None:
        self.context.close()


class Browser:
    """One chromium for a session of tests, each page in a context of its own."""

    def __init__(self, tmp: Path):
        chromium, unshare = require_tool("chromium"), require_tool("unshare")
        self.wrapper = tmp / "chromium-offline"
        # As root a network namespace needs nothing more; otherwise an unprivileged user namespace
        # maps the user to root inside it first.
        user = "" if os.geteuid() == 0 else "--map-root-user "
        self.wrapper.write_text(f'#!/bin/sh\nexec {unshare} {user}--net -- {chromium} "$@"\n')
        self.wrapper.chmod(0o755)
        self._playwright: Playwright = sync_playwright().start()
        try:
            self.browser = self._playwright.chromium.launch(executable_path=str(self.wrapper))
        except BaseException:
            self._playwright.stop()
            raise

    @property
    def version(self) -> str:
        return self.browser.version

    def look(
        self,
        path: Path,
        *,
        width: int = 1400,
        height: int = 1000,
        let_through: Callable[[str], bool] | None = None,
    ) -> Looked:
        """Open ``path`` and wait until it has loaded. Only the file itself is let through the
        routing (``let_through`` widens that, to show what the namespace alone does)."""
        url = path.absolute().as_uri()
        context = self.browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=1)
        page = context.new_page()
        looked = Looked(page, context, url)

        def route(r: Route) -> None:
            if r.request.url == url or (let_through is not None and let_through(r.request.url)):
                r.continue_()
            else:
                looked.refused.append(r.request.url)
                r.abort("blockedbyclient")

        def failed(request: Request) -> None:
            looked.failed.append(f"{request.url}: {request.failure}")

        context.route("**/*", route)
        page.on("request", lambda request: looked.requests.append(request.url))
        page.on("requestfailed", failed)
        page.on("console", lambda message: looked.console.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: looked.errors.append(str(error)))
        page.goto(url, wait_until="load")
        return looked

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self._playwright.stop()


# --- reading a report's pixels ---------------------------------------------------------------------


def _table(name: str) -> np.ndarray:
    return np.round(colormaps[name](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.int32)


def ratios(pixels: np.ndarray, colormap: str) -> np.ndarray:
    """The ratio each RGB pixel stands for on the colormap; NaN for a colour not on it (the grey
    of a pair never measured, its hatch, the white of a node's own cell)."""
    table = _table(colormap)
    flat = pixels.reshape(-1, 3).astype(np.int32)
    colours, back = np.unique(flat, axis=0, return_inverse=True)
    distance = np.abs(colours[:, None, :] - table[None, :, :]).sum(axis=2)
    nearest = distance.argmin(axis=1)
    found = np.where(distance[np.arange(len(colours)), nearest] <= TOLERANCE, nearest / 255, np.nan)
    return found[back.reshape(-1)].reshape(pixels.shape[:-1])


@dataclass
class Matrix:
    """A matrix image as the screenshot shows it, and how to find a cell in it."""

    shot: Image.Image
    box: tuple[float, float, float, float]
    cell: int
    nodes: list[str]
    colormap: str

    def ratio(self, a: str, b: str) -> float:
        """The ratio of cell (row a, column b), read at its centre; NaN when not on the colormap."""
        i, j = self.nodes.index(a), self.nodes.index(b)
        x = int(self.box[0] + (j + 0.5) * self.cell)
        y = int(self.box[1] + (i + 0.5) * self.cell)
        pixel = np.array(self.shot.getpixel((x, y)), dtype=np.int32)[None, None, :]
        return float(ratios(pixel, self.colormap)[0, 0])

    def pixels(self) -> np.ndarray:
        x, y, w, h = (round(v) for v in self.box)
        return np.asarray(self.shot.crop((x, y, x + w, y + h)))


def matrix(looked: Looked, which: str = "latest", shot: Image.Image | None = None) -> Matrix:
    data = looked.data()
    if which == "worst":
        looked.page.click("label[for=view-worst]")
    else:
        looked.page.click("label[for=view-latest]")
    return Matrix(
        shot or looked.screenshot(),
        looked.box(data["matrix"]["ids"][which]),
        data["matrix"]["cell"],
        data["nodes"],
        data["colormap"],
    )
