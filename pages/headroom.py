"""Headroom: the target's weight formats measured side by side on the same prompts (bench/headroom.py): plain
decoding's speed, the verify pass's cost against one token's, speculation's speedup and its own speed. Lighter
weights claim the spare arithmetic speculation lives on, as a full batch does (the lesson's batching row)."""
import pandas as pd
import streamlit as st

from app import headroom, limits, measure, runs, sidebar
from specdec_core.bench import regime
from specdec_core.bench.headroom import WORKLOADS, summary

measure.settle(headroom.KEY, hr_workloads=list(WORKLOADS), hr_prompts=1, hr_max_new=32)

st.title("Headroom: weight formats")
st.markdown(
    "Speculation pays because a one-token step leaves arithmetic idle: the step is bound by reading the weights, "
    "so the drafted tokens of a verify pass ride along almost free. **Lighter weights change that.** They make "
    "the step quicker to read, so plain decoding gets faster, and the verify pass's extra rows now pay for their "
    "arithmetic: relative to one token it costs more, speculation's speedup shrinks, and speculation's own "
    "speed moves far less than plain decoding's. Here the bundled target runs in each weight format this "
    "machine can run, on the same prompts: code and JSON with EAGLE, extraction with prompt lookup.")
st.info(headroom.BATCHING_ROW, icon=":material/stacks:")

s = sidebar.current()
here = runs.available()
c1, c2 = st.columns([3, 2])
with c1:
    st.session_state.setdefault("hr_formats", list(here))
    chosen = st.multiselect("Weight formats", here, key="hr_formats", format_func=regime.FORMATS.get,
                            help="The formats this machine runs the target in.")
    picked = st.multiselect("Workloads", list(WORKLOADS), key="hr_workloads",
                            help="Each with its own drafter (code and JSON: EAGLE; extraction: lookup), greedy.")
fmts, wls = [f for f in here if f in chosen], [w for w in WORKLOADS if w in picked]
with c2:
    prompts = st.slider("Prompts per workload", 1, 3, key="hr_prompts", help="More prompts: steadier, longer.")
    max_new = limits.tokens_input(st, "New tokens per prompt", 4, 128, key="hr_max_new", step=8)
params = {"formats": ", ".join(regime.FORMATS[f] for f in fmts) or "none", "workloads": ", ".join(wls) or "none",
          "prompts each": prompts, "new tokens": max_new, "k": s.k}
clicked = st.button("Measure each weight format", type="primary", key="hr_go", icon=":material/memory:",
                    disabled=not (fmts and wls))
st.caption(f"Sidebar settings used: k = {s.k}. Greedy (temperature 0), so each format's speculative output is "
           "its own plain output, token for token (the table's last column counts it).")
res = measure.results(headroom.KEY, params, clicked,
                      lambda: headroom.run(params, fmts, wls, prompts, max_new, s.k),
                      "Press **Measure each weight format**. On the defaults this takes a minute or two on a "
                      "laptop CPU (each format decodes every prompt plainly and speculatively, three times).")

sm = summary(res.rows)
measure.noise_note([r for r in res.rows if r["kind"] == "workload"])
st.plotly_chart(headroom.figure(sm, wls), key="hr_chart", width="stretch")
if runs.measured_now():
    st.caption(runs.in_use()[1] + ". The dotted line in the second panel is the regime rule's limit.")
st.markdown("**What the figures say here**")
headroom.lesson(sm)
st.markdown(
    "**How to read it.** Each speedup is speculative tokens/s over plain tokens/s on the same prompts in the same "
    "format, by the measuring rule (back-to-back pairs, order alternating, the median pair). The pass ratio "
    f"times one target pass on {regime.BIG} new tokens against one new token. Plain and speculative tok/s are the "
    "medians over the workloads.")
table = pd.DataFrame([{
    "Weights": x["label"], "1-token pass (ms)": x.get("one_ms"), f"{regime.BIG}-token pass (ms)": x.get("big_ms"),
    "Pass ratio": x.get("ratio"), "Plain tok/s": x.get("plain_tokens_per_s"),
    "Speculative tok/s": x.get("spec_tokens_per_s"),
    **{f"Speedup {w}": x.get(f"speedup_{w}") for w in wls}, "Noisy": x["noisy"],
    "Same tokens as plain": f"{x['same']} of {x['runs']}"} for x in sm])
measure.table(table.round(3), "headroom", main=["Weights", "Pass ratio", "Plain tok/s",
                                               *(f"Speedup {w}" for w in wls), "Same tokens as plain"])
