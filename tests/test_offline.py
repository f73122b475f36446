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
