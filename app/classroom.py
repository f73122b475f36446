"""Classroom mode: a presenter toggle (large type, high contrast for projectors), preset scenes that
reproduce exactly with their seed, and every setting mirrored in the URL's query parameters so a shared
link opens the same scene.

main.py calls `load()` before the sidebar is built (the URL wins over defaults on a session's first run)
and `build()` after it (the presenter toggle, the scenes, and writing the URL back).
"""
from __future__ import annotations

import streamlit as st

from specdec_core import drafters
from specdec_core.models import FORWARDS

from . import sidebar
from .runs import WEIGHTS

# key -> (type, lo, hi): the numeric ranges are the sidebar's own (sidebar.BOUNDS), so a URL can never set what
# a control could not
FIELDS = {"drafter": (str, None, None), "draft_model": (str, None, None),
          **{key: (type(hi), lo, hi) for key, (lo, hi) in sidebar.BOUNDS.items()},
          "workload": (str, None, None), "example": (int, 0, 99), "prompt": (str, None, None),
          "forward": (str, None, None), "weights": (str, None, None)}
LOADED = "_classroom_loaded"

REPEAT = "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat.\n\nRepeat the text exactly."
SCENES = {
    "Copying from the prompt (lookup, greedy)":
        dict(drafter="lookup", k=4, temperature=0.0, top_p=1.0, seed=0, max_new_tokens=32, workload="extraction",
             example=0),
    "Rejections at high temperature (lookup, T = 1.5)":
        dict(drafter="lookup", k=4, temperature=1.5, top_p=1.0, seed=3, max_new_tokens=16, workload="custom",
             prompt=REPEAT),
    "A tree of guesses on code (Medusa)":
        dict(drafter="medusa", k=4, temperature=0.0, top_p=1.0, seed=0, max_new_tokens=32, workload="code", example=0),
    "The target drafts for itself (early exit)":
        dict(drafter="early-exit", k=1, temperature=0.0, top_p=1.0, seed=0, max_new_tokens=32, workload="chat",
             example=0),
    "A small draft model on JSON":
        dict(drafter="draft", draft_model="distilled", k=3, temperature=0.0, top_p=1.0, seed=0, max_new_tokens=32,
             workload="json", example=0),
    "The baseline: plain decoding":
        dict(drafter="none", k=4, temperature=0.0, top_p=1.0, seed=0, max_new_tokens=32, workload="extraction",
             example=0),
}

PRESENTER_CSS = """
<style>
html, body, [data-testid="stAppViewContainer"], [data-testid="stSidebar"] { font-size: 22px !important; }
[data-testid="stAppViewContainer"] { background: #ffffff !important; color: #000000 !important; }
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 1.35rem !important;
  line-height: 1.6 !important; color: #000000 !important; }
h1 { font-size: 3.0rem !important; } h2 { font-size: 2.3rem !important; } h3 { font-size: 1.9rem !important; }
.tok { font-size: 1.6rem !important; border-width: 3px !important; }
.tok-accepted { background:#00c853 !important; color:#000 !important; border-color:#000 !important; }
.tok-rejected { background:#ff1744 !important; color:#fff !important; border-color:#000 !important; }
.tok-resampled { background:#ff9100 !important; color:#000 !important; border-color:#000 !important; }
.tok-bonus { background:#2962ff !important; color:#fff !important; border-color:#000 !important; }
.tok-target { background:#e0e0e0 !important; color:#000 !important; border-color:#000 !important; }
.strip { background:#fff !important; border:3px solid #000 !important; }
.vtable { font-size: 1.15rem !important; }
/* a projector's whole width for the page: its tables and charts are what the room reads */
[data-testid="stMainBlockContainer"] { max-width: 100% !important; padding-left: 3rem !important;
  padding-right: 3rem !important; }
/* a metric's label wraps at this size instead of being cut to "Accept…" */
[data-testid="stMetricLabel"], [data-testid="stMetricLabel"] * { white-space: normal !important;
  overflow: visible !important; text-overflow: clip !important; }
/* the verify table scrolls inside its column rather than being cut; its gauge gives way first */
.vtable { display:block; overflow-x:auto; } .gauge { min-width: 90px !important; }
/* a column that holds a button is as wide as the button, so a caption beside it is never under it */
[data-testid="stColumn"]:has(.stButton) { flex: 0 0 auto !important; width: auto !important;
  min-width: max-content !important; }
/* charts: no text under 15 px on a projector (plotly writes each size inline: the small ones are raised) */
[data-testid="stPlotlyChart"] text[style*="font-size: 7px"], [data-testid="stPlotlyChart"] text[style*="font-size: 8px"], [data-testid="stPlotlyChart"] text[style*="font-size: 9px"], [data-testid="stPlotlyChart"] text[style*="font-size: 10px"], [data-testid="stPlotlyChart"] text[style*="font-size: 11px"], [data-testid="stPlotlyChart"] text[style*="font-size: 12px"], [data-testid="stPlotlyChart"] text[style*="font-size: 13px"] { font-size: 15px !important; }
/* the navigation at this size: a wider sidebar, and a label that still does not fit wraps (never "Road to pro…") */
[data-testid="stSidebar"] { width: 400px !important; min-width: 400px !important; }
[data-testid="stSidebarNavLink"] { height: auto !important; min-height: 2rem; }
[data-testid="stSidebarNavLink"] span, [data-testid="stSidebarNavLink"] p { white-space: normal !important;
  overflow: visible !important; text-overflow: clip !important; }
/* and a button's label is never cut to "Gene…" in a narrow column */
.stButton button { max-width: none !important; min-width: max-content !important; }
.stButton button p { white-space: nowrap !important; overflow: visible !important; text-overflow: clip !important; }
</style>
"""


def _parse(key: str, raw: str):
    typ, lo, hi = FIELDS[key]
    try:
        val = typ(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a {typ.__name__}") from None
    if lo is not None and not lo <= val <= hi:
        raise ValueError(f"{key}={raw!r} is outside {lo}..{hi}")
    if key == "drafter" and val not in drafters.NAMES:
        raise ValueError(f"drafter={raw!r} is not one of {', '.join(drafters.NAMES)}")
    if key == "forward" and val not in FORWARDS:
        raise ValueError(f"forward={raw!r} is not one of {', '.join(FORWARDS)}")
    if key == "weights" and val not in WEIGHTS:
        raise ValueError(f"weights={raw!r} is not one of {', '.join(WEIGHTS)}")
    if key == "workload" and val != sidebar.CUSTOM and val not in sidebar.PRESETS:
        raise ValueError(f"workload={raw!r} is not a preset")
    return val


def from_query(params: dict[str, str]) -> tuple[dict, list[str]]:
    """URL query parameters -> (session values, errors). Unknown keys are ignored; bad values are reported
    and skipped, so a mistyped link still opens. A preset workload's prompt is looked up, not carried."""
    vals, errors = {}, []
    for key in FIELDS:
        if key in params:
            try:
                vals[key] = _parse(key, params[key])
            except ValueError as e:
                errors.append(str(e))
    if "presenter" in params:
        vals["presenter"] = params["presenter"] in ("1", "true", "on")
    w = sidebar.PRESETS.get(vals.get("workload", ""))
    if w:
        vals["example"] = min(vals.get("example", 0), len(w.prompts) - 1)
        vals["prompt"] = w.prompts[vals["example"]]
    elif "prompt" in vals:
        vals["workload"] = sidebar.CUSTOM
    return vals, errors


def to_query(state) -> dict[str, str]:
    """Session values -> URL query parameters (strings). The prompt travels only when it is free text."""
    out = {}
    for key in ("drafter", "draft_model", "k", "temperature", "top_p", "seed", "max_new_tokens"):
        v = state[key]
        out[key] = f"{v:g}" if isinstance(v, float) else str(v)
    w = sidebar.PRESETS.get(state["workload"])
    if w and state["prompt"] == w.prompts[state["example"]]:
        out["workload"], out["example"] = state["workload"], str(state["example"])
    else:
        out["workload"], out["prompt"] = sidebar.CUSTOM, state["prompt"]
    if state.get("presenter"):
        out["presenter"] = "1"
    if state.get("forward", "ours") != "ours":   # the reference forward travels only when chosen
        out["forward"] = state["forward"]
    if state.get("weights", "auto") != "auto":   # a weight format travels only when chosen
        out["weights"] = state["weights"]
    return out


def scene_values(name: str) -> dict:
    """A scene as session values, filled in like a URL would be (preset prompts looked up)."""
    sc = dict(SCENES[name])
    sc.setdefault("draft_model", sidebar.DEFAULTS["draft_model"])
    vals, errors = from_query({k: str(v) for k, v in sc.items()})
    assert not errors, errors  # scenes are ours: a bad one is a bug
    return vals


def load_scene(name: str) -> None:
    """Callback: put a scene into the controls (runs before the widgets are drawn)."""
    for key, val in scene_values(name).items():
        st.session_state[key] = val


def load() -> None:
    """On a session's first run, take the scene from the URL. Call before sidebar.build()."""
    ss = st.session_state
    if ss.get(LOADED):
        return
    ss[LOADED] = True
    vals, errors = from_query(dict(st.query_params))
    for key, val in vals.items():
        ss[key] = val
    if errors:
        ss["_classroom_errors"] = errors


def build() -> None:
    """Presenter toggle, scene picker, and the URL kept in step with the controls. Call after sidebar.build()."""
    ss = st.session_state
    sb = st.sidebar
    sb.markdown("### Classroom")
    sb.toggle("Presenter mode", key="presenter", help="Large type and high-contrast colours for a projector.")
    names = list(SCENES)
    sb.selectbox("Scene", names, key="scene", help="A prompt, drafter and settings that replay exactly (fixed seed).")
    sb.button("Load scene", key="load_scene", on_click=lambda: load_scene(ss.scene), width="stretch")
    sb.caption("Every setting is in the page address: copy it to share this exact scene.")
    for e in ss.pop("_classroom_errors", []):
        sb.warning(f"Ignored from the link: {e}.")
    if ss.presenter:
        st.html(PRESENTER_CSS)
    want = to_query(ss)
    if dict(st.query_params) != want:
        st.query_params.from_dict(want)
