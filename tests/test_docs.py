"""The documentation's promises that can be checked without a model: every relative link in README.md and docs/*.md
reaches a file, every #anchor a heading of that file (GitHub's slugs), every `path:line` reference in the
contributor's page a line that exists, and the README and the results page stay within their sizes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


def test_slug_follows_githubs_rule():
    assert slug("Where a step's time goes: `profile`") == "where-a-steps-time-goes-profile"
    assert slug("A class at once: `make load-test`") == "a-class-at-once-make-load-test"
    assert slug("transformers' forward as the reference") == "transformers-forward-as-the-reference"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for href in links(page):
        if re.match(r"[a-z]+:", href):          # http:, https:, mailto: are not checked (no network)
            continue
        path, _, anchor = href.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{href}: no file {path}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{href}: no heading #{anchor} in {target.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_contributing_points_at_lines_that_exist():
    page = ROOT / "docs" / "contributing.md"
    refs = re.findall(r"`((?:specdec_core|tests|app|pages)/[\w/.-]+\.(?:py|cpp)):(\d+)", page.read_text())
    assert len(refs) >= 10, "the contributor's page walks through the code by path:line"
    missing = [f"{p}:{n}" for p, n in refs
               if not (ROOT / p).exists() or int(n) > len((ROOT / p).read_text().splitlines())]
    assert not missing, missing


def test_readme_and_results_page_stay_short():
    assert len((ROOT / "README.md").read_text()) <= 10_000
    assert len((ROOT / "docs" / "measurements.md").read_text()) <= 25_000
