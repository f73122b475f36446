"""The walkthrough's pieces (pages/walkthrough.py): a live button per section whose result stays in the session,
the check-yourself question (counted in the room: answers.py), the drafters as the app builds them, and the
section tables laid out in words."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from specdec_core import SamplingParams, drafters, engine

from . import answers, runs, turns, view

TOKENS = 24  # the most any widget here decodes: seconds on a CPU
FREE_UP_TO = 1.25   # a pass of 8 tokens at most this many times one still reads as "about the price of one"
GREEDY = SamplingParams(temperature=0.0)


def live(key: str, label: str, fn) -> object | None:
    """A button that runs `fn` once per click and keeps its result in the session; errors are messages."""
    slot = f"wt_result_{key}"
    if st.button(label, key=f"wt_run_{key}", type="primary"):
        line = st.empty()   # the place in line while another session has the model
        with st.spinner("Running the real decoder…"):
            try:
                with turns.hold(lambda place, eta: line.info(turns.message(place, eta) + "…")):
                    line.empty()
                    st.session_state[slot] = fn()
            except Exception as e:  # a message on the page, never a traceback
                st.session_state.pop(slot, None)
                st.error(runs.friendly(e))
    return st.session_state.get(slot)


def quiz(key: str, question: str, options: list[str], right: int, why: str) -> None:
    """The section's question: the session's own feedback, counted in the room (answers.py), whose answers the
    presenter sees."""
    st.markdown("**Check yourself**")
    answers.question(key, question, options, right, why)


def run_drafter(drafter_name: str, prompt: str, k: int = 4, tokens: int = TOKENS, sp=GREEDY):
    """(tokens, records, metrics) of one run of the named drafter on `prompt`, greedy unless `sp` says."""
    tgt = runs.target()
    d = make(drafter_name, tgt, k)
    ids, recs, m = engine.run(tgt, d, tgt.encode(prompt).tolist(), sp=sp, k=drafters.entry(drafter_name).k(k),
                              max_new_tokens=tokens)
    return ids, recs, m


def make(name: str, tgt, k: int = 4):
    """The named drafter as the app builds it; a draft model is the distilled one shipped for the target."""
    return runs.make_drafter(runs.Settings(drafter=name, draft_model=drafters.DISTILLED, k=k), tgt)


def chips(recs) -> None:
    st.html(view.text_so_far(recs, len(recs) - 1))


def spread(r: dict, what: str) -> str:
    """How a paired figure was measured, and 'noisy: rerun' when its pairs spread too widely."""
    return (f"{what}: the median of {r['pairs']} back-to-back pairs (order alternating) through the forward this "
            f"app runs ({runs.FORWARDS[runs.target().forward_name]}); the pairs ran from {r['ratio_min']:.2f}× to "
            f"{r['ratio_max']:.2f}×" + (". **Noisy: rerun** (the machine is busy)." if r["noisy"] else "."))


def workload_table(r: list[dict]) -> pd.DataFrame:
    """lesson.check's rows, in words: narrow columns, and the reason on each row (shown with st.table, which
    wraps text)."""
    return pd.DataFrame([{
        "Workload": x["workload"], "Lesson expects": x["expected"], "Drafter (T)": f"{x['drafter']} "
        f"({x['temperature']:g})", "Acceptance (95% interval)": "not measured here" if x["acceptance"] is None
        else f"{x['acceptance']:.0%} ({x['acceptance_lo']:.0%}–{x['acceptance_hi']:.0%})",
        "Mean acceptance length": "" if x["mean acceptance length"] is None else f"{x['mean acceptance length']:.2f}",
        "Agrees": {True: "yes", False: "no", None: "see section 6"}[x["agrees"]],
        "Why": (f"{x['drafter']}: {x['why this drafter']}. " if x["agrees"] is not None else "")
        + f"{x['note'][0].upper()}{x['note'][1:]}."}
        for x in r]).set_index("Workload")


def batch_table(r: list[dict]) -> pd.DataFrame:
    """passes.batch_cost's rows: ms of each pass, the verify / plain ratio and the pairs' range."""
    return pd.DataFrame([{
        "batch": x["batch"], "ms, 1 per request": round(x["small_ms"], 1), "ms, 5 per request": round(x["big_ms"], 1),
        "verify / plain": round(x["ratio"], 2), "pairs' range": f"{x['ratio_min']:.2f}–{x['ratio_max']:.2f}"
        + (" noisy: rerun" if x["noisy"] else "")} for x in r]).set_index("batch")
