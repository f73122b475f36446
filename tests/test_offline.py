"""Nothing on a page fetches from the network. Streamlit draws `:material/...:` icons in the page from the font
it ships, but a `:material/...:` favicon is an image it asks fonts.gstatic.com for (its frontend builds that
address); an emoji favicon is drawn in the page. This checks the app's favicon and that the frontend still
builds that address (so the check means something on the installed version)."""
from __future__ import annotations

import ast
from pathlib import Path

import streamlit

ROOT = Path(__file__).resolve().parents[1]


def page_icons() -> list[str]:
    out = []
    for p in [ROOT / "app" / "main.py", *sorted((ROOT / "pages").glob("*.py"))]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "set_page_config":
                out += [ast.literal_eval(k.value) for k in node.keywords if k.arg == "page_icon"]
    return out


def test_the_favicon_is_drawn_in_the_page_not_fetched():
    icons = page_icons()
    assert icons and not any(str(i).startswith(":material") for i in icons), icons
    js = Path(streamlit.__file__).parent / "static" / "static" / "js"
    assert any("fonts.gstatic.com/s/i/short-term/release/materialsymbolsrounded" in f.read_text(errors="ignore")
               for f in js.glob("index.*.js"))   # what a :material: favicon would fetch


def test_the_class_guide_names_only_buttons_the_walkthrough_has():
    """docs/classroom.md's lesson plan quotes each section's button in italics: every quote is a real label."""
    import re
    page = (ROOT / "pages" / "walkthrough.py").read_text()
    tokens = re.search(r"^TOKENS = (\d+)", (ROOT / "app" / "walk.py").read_text(), re.M).group(1)
    labels = [x.replace("{TOKENS}", tokens) for x in re.findall(r'live\("\w+",\s*f?"([^"]+)"', page)]
    plan = [line for line in (ROOT / "docs" / "classroom.md").read_text().splitlines() if line.startswith("| ")]
    # the first italic quote of each row's Press cell is its button (later ones name other controls)
    quoted = [m[0] for line in plan if (m := re.findall(r"(?<![*\w])\*([A-Z][^*]+?)\*(?!\*)", line.split("|")[3]))]
    assert len(quoted) >= 6
    for q in quoted:
        stem = q.rstrip(" …").rstrip()
        assert any(lab.startswith(stem) for lab in labels), (q, labels)
