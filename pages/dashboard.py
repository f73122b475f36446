"""Acceptance dashboard: the lesson's operator dashboard, replayed live. The same traffic is served in windows of
requests before and after a prompt-template change; acceptance and mean acceptance length are drawn beside
speedup, TTFT and TPOT over time, with the greedy diff and a sentence read from the figures
(specdec_core.bench.dashboard measures; app/dashboard.py draws)."""
import dataclasses

import pandas as pd
import streamlit as st

from app import dashboard as charts
from app import measure, runs
from specdec_core.bench import dashboard as scene

KEY = "measure_dashboard"
measure.settle(KEY, dash_windows=3, dash_per_window=1, dash_tokens=32, dash_repeats=2)

st.title("Acceptance dashboard: a template change, read the way the lesson reads it")
st.markdown(
    "The lesson's advice to an operator: *make acceptance rate a first-class dashboard metric next to TTFT and "
    "TPOT — it explains speedup changes that would otherwise look like infrastructure noise, such as a "
    "prompt-template change quietly making your traffic less predictable.* This page replays that: the **same "
    "requests** (the extraction workload's that ask for a text verbatim: copy, repeat, extract) are served in "
    f"windows over time with **{scene.DRAFTER}** drafting, first with the template as shipped, then after "
    "one line is added to it asking for the answer in French (a product going international). Every window is "
    "measured live on this "
    "machine: plain decoding and speculative decoding back to back per request, repeated in alternating order, "
    "the median pair's speedup quoted.")

c1, c2 = st.columns(2)
with c1:
    st.markdown(f"**Before** — {scene.BEFORE.name}")
    st.code(scene.BEFORE.user + "\n(system message: the chat template's own)", language=None, wrap_lines=True)
with c2:
    st.markdown(f"**After** — {scene.AFTER.name}")
    st.code(scene.AFTER.user + "\n(system message: the chat template's own)", language=None, wrap_lines=True)

with st.expander("Scene size", icon=":material/tune:"):
    a, b, c, d = st.columns(4)
    windows = a.number_input("Windows per phase", 1, 8, key="dash_windows",
                             help="Time buckets of requests on each side of the template change.")
    per_window = b.number_input("Requests per window", 1, 5, key="dash_per_window")
    tokens = c.number_input("New tokens per request", 2, 128, key="dash_tokens", step=8)
    repeats = d.number_input("Timed pairs per request", 1, 5, key="dash_repeats",
                             help="Plain and speculative back to back, order alternating; the median pair's "
                                  "speedup is quoted, whiskers span them all.")
size = scene.Scene(windows=int(windows), per_window=int(per_window), tokens=int(tokens), repeats=int(repeats))
params = {"drafter": size.drafter, "k": size.k, "windows per phase": size.windows,
          "requests per window": size.per_window, "new tokens": size.tokens, "pairs per request": size.repeats}
go_clicked = st.button("Serve the traffic, before and after the change", type="primary", key="dash_go",
                       icon=":material/monitoring:")
secs = size.runs() * size.tokens / 23 * 0.75   # a plain token ~1/23 s on a laptop CPU; speculative runs are faster
st.caption(f"{size.runs()} decodes of up to {size.tokens} tokens each: about {secs:.0f} s on a laptop CPU. "
           f"Temperature 0, k = {size.k}; the sidebar's settings are not used here.")


def serve() -> None:
    res = measure.begin(KEY, params)
    try:
        tgt = runs.target()
    except runs.UserError as e:
        res.status, res.error = "failed", str(e)
        return
    live = measure.Live(KEY, size.runs(), "Serving")
    measure.collect(res, scene.serve(tgt, size, tick=live.tick), live, charts.acceptance_figure)


res = measure.results(KEY, params, go_clicked, serve,
                      "Press the button: each window's requests are decoded plainly and speculatively, before "
                      "and after the template change, and drawn as they are measured.")

st.subheader("What the dashboard says")
st.info(scene.reading(res.rows), icon=":material/insights:")
measure.noise_note(res.rows)
st.plotly_chart(charts.acceptance_figure(res.rows), key="dash_acceptance", width="stretch")
st.plotly_chart(charts.latency_figure(res.rows), key="dash_latency", width="stretch")

bad, compared = scene.exact(res.rows)
if bad:
    st.error(f"Greedy diff: {bad} of {compared} speculative tokens differ from plain decoding's. The output "
             "contract is broken.", icon=":material/error:")
else:
    st.success(f"Greedy diff: 0 of {compared} speculative tokens differ from plain decoding's, before and after "
               "the change: the template changed what the model says, speculation changed none of it.",
               icon=":material/check_circle:")

before, after = scene.phase(res.rows, "before"), scene.phase(res.rows, "after")
if before and after:
    st.dataframe(pd.DataFrame([
        {"": "before the change", **{k: before[k] for k in before}},
        {"": "after the change", **{k: after[k] for k in after}}]).rename(columns={
            "acceptance": "Acceptance", "acceptance_lo": "95% low", "acceptance_hi": "95% high",
            "mal": "Mean acceptance length", "speedup": "Speedup (median window)", "speedup_lo": "lowest window",
            "speedup_hi": "highest window", "tpot": "TPOT ms", "plain_tpot": "Plain TPOT ms", "ttft": "TTFT ms",
            "plain_ttft": "Plain TTFT ms"}).round(3), hide_index=True, width="stretch")
st.markdown(
    "**How to read it.** Plain decoding's TPOT (the faint line) is the machine's own speed: where it stays flat "
    "while the speedup falls, the infrastructure did not change. Acceptance is what changed: the shipped "
    "template's answers copy the request, which prompt lookup drafts for free; the new one asks for a "
    "translation, which shares no spans with the request, so fewer guesses survive, fewer tokens come out of "
    "each verification pass (mean acceptance length), and speculative TPOT rises toward plain decoding's. "
    "TTFT moves with the prompt's length (the added line is read at every request), for both sides alike. "
    "A dashboard that shows only speedup, TTFT "
    "and TPOT would show a slowdown with no cause.")
cols = ["window", "phase", "template", "acceptance_rate", "acceptance_lo", "acceptance_hi", "drafted",
        "mean_acceptance_length", "ttft_ms", "baseline_ttft_ms", "tpot_ms", "baseline_tpot_ms", "speedup",
        "speedup_min", "speedup_max", "noisy", "diff_tokens", "compared"]
df = pd.DataFrame(res.rows)
measure.table(df[[c for c in cols if c in df]].round(3), "dashboard",
              main=["window", "phase", "acceptance_rate", "mean_acceptance_length", "ttft_ms", "tpot_ms",
                    "baseline_tpot_ms", "speedup", "diff_tokens"])
