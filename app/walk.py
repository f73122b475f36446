"""The walkthrough's pieces (pages/walkthrough.py): a live button per section whose result stays in the session,
the check-yourself question (counted in the room: answers.py), the drafters as the app builds them, what each
section's button measures, and the section tables laid out in words. Section 5 judges the workloads with the
Workloads page's own function (bench.showcase.workload_rows), so the two pages cannot give two verdicts for one
table."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from specdec_core import SamplingParams, clock, drafters, engine
from specdec_core.bench import lesson, passes, showcase
from specdec_core.bench.workloads import WORKLOADS

from . import answers, runs, turns, view
from .classroom import REPEAT

TOKENS = 24  # the most any widget here decodes: seconds on a CPU
FREE_UP_TO = 1.25   # a pass of 8 tokens at most this many times one still reads as "about the price of one"
GREEDY = SamplingParams(temperature=0.0)
# section 3: each variant on the workload whose first prompt it drafts best (greedy, 24 tokens; docs/measurements.md,
# "Demos that land on their defaults")
VARIANTS = {"lookup": ("extraction", "copying from the context"), "medusa": ("code", "code, where heads agree"),
            "early-exit": ("json", "a JSON template, whose keys and braces the first layers already know")}
JUDGED = [n for n, w in WORKLOADS.items() if w.batch_size == 1]   # section 5's rows; batching is section 6's


def live(key: str, label: str, fn) -> object | None:
    """A button that runs `fn` once per click and keeps its result in the session; errors are messages."""
    slot = f"wt_result_{key}"
    if st.button(label, key=f"wt_run_{key}", type="primary"):
        line = st.empty()   # the place in line while another session has the model
        with st.spinner("Running the real decoder…"):
            try:
                with turns.hold(lambda place, eta: line.info(turns.message(place, eta) + "…")), clock.cpu_work():
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
            f"app runs ({runs.FORWARDS[runs.target().forward_name]}), each timed by {clock.RULE}; the pairs ran "
            f"from {r['ratio_min']:.2f}× to "
            f"{r['ratio_max']:.2f}×" + (". **Noisy: rerun** (the machine is busy)." if r["noisy"] else "."))


def idle() -> tuple:
    """Section 1: one pass on 1 token against 8 (passes.token_cost), then 16 tokens plain and with lookup."""
    tgt = runs.target()
    cost = passes.token_cost(tgt, tgt.encode(REPEAT).tolist(), 1, 8)
    _, _, plain = run_drafter(drafters.PLAIN, REPEAT, tokens=16)
    _, recs, look = run_drafter("lookup", REPEAT, tokens=16)
    return cost, plain, look, recs


def two() -> dict:
    """Section 2: the target's and the distilled draft's parameters, a drafted token's cost, and a refused pair."""
    tgt = runs.target()
    out = {"target": sum(p.numel() for p in tgt.model.parameters())}
    try:
        from specdec_core.drafters.distilled import load_draft
        d = load_draft(tgt)
        emb = d.model.get_input_embeddings().weight.numel()   # tied to the target's: count only what the draft adds
        out["draft"] = sum(p.numel() for p in d.model.parameters()) - emb
        out["time"] = passes.draft_cost(d, tgt, tgt.encode(REPEAT).tolist())
    except Exception as e:  # noqa: BLE001 -- shown on the page in words
        out["draft_error"] = runs.friendly(e)
    out["refusal"] = lesson.refusal(tgt)
    return out


def exact() -> tuple:
    a, _, _ = run_drafter(drafters.PLAIN, REPEAT)
    b, recs, m = run_drafter("lookup", REPEAT)
    return a, b, recs, m


def workload_rows(tgt, prompts: int = 2, tokens: int = TOKENS) -> list[dict]:
    """Section 5: the Workloads page's rows (showcase.workload_rows: each workload's own drafter at its own
    temperature, speed by the measuring rule, the lesson's category judged by workloads.benefit) on fewer prompts
    and tokens; the batch row is section 6's."""
    return list(showcase.workload_rows(tgt, JUDGED, prompts, tokens, 4))


def workload_table(r: list[dict]) -> pd.DataFrame:
    """workload_rows' rows, in words: narrow columns, and the reason on each row that does not land (shown with
    st.table, which wraps text)."""
    return pd.DataFrame([{
        "Workload": WORKLOADS[x["workload"]].label, "Lesson expects": x["expected"],
        "Drafter (T)": f"{x['drafter']} ({x['temperature']:g})", "Acceptance": f"{x['acceptance_rate']:.0%}",
        "Speedup (pairs' range)": f"{x['speedup']:.2f}× ({x['speedup_min']:.2f}–{x['speedup_max']:.2f})"
        + (" noisy: rerun" if x["noisy"] else ""), "Measured": x["benefit"], "Lands": "yes" if x["lands"] else "no",
        "Why": x["why"] or f"{x['drafter']}: {lesson.WHY_DRAFTER.get(x['drafter'], '')}."}
        for x in r]).set_index("Workload")


def batch_table(r: list[dict]) -> pd.DataFrame:
    """passes.batch_cost's rows: ms of each pass, the verify / plain ratio and the pairs' range."""
    return pd.DataFrame([{
        "batch": x["batch"], "ms, 1 per request": round(x["small_ms"], 1), "ms, 5 per request": round(x["big_ms"], 1),
        "verify / plain": round(x["ratio"], 2), "pairs' range": f"{x['ratio_min']:.2f}–{x['ratio_max']:.2f}"
        + (" noisy: rerun" if x["noisy"] else "")} for x in r]).set_index("batch")
