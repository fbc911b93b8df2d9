"""The README and docs/ hold together: every relative link names a file that exists and, with an
anchor, a heading that file has (GitHub's anchors), and every page of docs/ is linked from the
README, so a reader who starts there reaches all of them."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from .conftest import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(kept)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered from -1."""
    seen: Counter[str] = Counter()
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} +(.*?) *#*$", line)
        if m is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def test_the_anchor_rule_is_githubs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Series per scrape (`benchmarks/series.py`), 2026-11-26\n\n## Jobs: which job a fault hits\n\n"
        "```sh\n# not a heading\n```\n\n## Jobs: which job a fault hits\n"
    )
    assert anchors(page) == {
        "series-per-scrape-benchmarksseriespy-2026-11-26",
        "jobs-which-job-a-fault-hits",
        "jobs-which-job-a-fault-hits-1",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for m in LINK.finditer(prose(page.read_text())):
        target = m.group("target")
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    linked = {
        (ROOT / m.group("target").partition("#")[0]).resolve()
        for m in LINK.finditer(prose((ROOT / "README.md").read_text()))
    }
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")} | {ROOT / "docs" / "runbooks" / "README.md"}
    assert sorted(str(p.relative_to(ROOT)) for p in pages - linked) == []


def test_the_readme_stays_an_overview() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
