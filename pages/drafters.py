"""All drafters, one prompt: every drafter that can run here decodes the sidebar's prompt beside plain decoding,
with its acceptance, tokens per step, where a step's time went (the draft's ms, the verify pass's ms, against a
plain step's) and the speedup by the measuring rule; the recorded reference run drawn faintly beside it."""
from functools import partial

import pandas as pd
import streamlit as st

from app import charts, measure, sidebar
from specdec_core.bench import reference, showcase, sweeps
from specdec_core.drafters import PLAIN

KEY = "measure_drafters"
measure.settle(KEY)

st.title("All drafters, one prompt")
st.markdown(
    "Every drafter decodes **the sidebar's prompt** with the sidebar's temperature, top-p, seed and max new "
    "tokens, each at its own draft length, back to back with plain decoding and repeated, order alternating "
    "(the measuring rule). For each: how many guesses were kept, how many tokens a step committed, and **where "
    "a step's time went**: the draft's ms and the verify pass's ms against one plain step's ms. A drafter with "
    "good acceptance still loses when its step costs more than the tokens it adds.")

s = sidebar.current()
ref = reference.load()
params = {"prompt": s.prompt[:60], "temperature": s.temperature, "top-p": s.top_p, "seed": s.seed,
          "new tokens": s.max_new_tokens, "draft model": s.draft_model}
go_clicked = st.button("Run every drafter", type="primary", key="all_go", icon=":material/compare_arrows:")
st.caption(f"Sidebar settings used: the prompt, temperature {s.temperature:g}, top-p {s.top_p:g}, seed {s.seed}, "
           f"up to {s.max_new_tokens} new tokens, draft model `{s.draft_model}` for `draft`; each drafter's own k "
           "(in the table).")
REF = reference.rows_by(ref, "drafters", "drafter")
SAME_PROMPT = bool(ref) and ref["drafters"].get("prompt") == s.prompt


figure = partial(charts.drafters_figure, ref=ref)


def tidy(r: dict) -> dict:
    return {**r, "other_ms": r["verify_ms"] + r["commit_ms"] + r["bookkeeping_ms"]}


def points(tgt, specs, live):
    ids = measure.encode(tgt, [s.prompt])[0]
    for r in showcase.every(tgt, specs, ids, measure.sampling(s.temperature, s), s.max_new_tokens, None, live.tick):
        yield tidy(r)


def run_all() -> None:
    measure.measure(KEY, params, list(measure.SPEC), s, lambda specs: sweeps.REPEATS * (1 + len(specs)), points,
                    None, "Running every drafter")


res = measure.results(KEY, params, go_clicked, run_all,
                      "Press **Run every drafter**: each drafter and plain decoding, three times each, on the "
                      "sidebar's prompt (about a minute on a laptop CPU).")
measure.noise_note([r for r in res.rows if r["drafter"] != PLAIN])
st.plotly_chart(figure(res.rows), key="all_chart", width="stretch")
if ref:
    st.caption(f"Faint bars: {reference.label(ref)}, on "
               + ("this same prompt" if SAME_PROMPT else
                  f"the prompt “{ref['drafters'].get('prompt', '')[:70]}…”, not the sidebar's")
               + f", made by `{ref['command']}`. A recorded run, not this machine now.")
df = pd.DataFrame(res.rows)
df["same"] = df["same_tokens_as_baseline"].map({True: "yes", False: "no", None: "sampled (T > 0)"})
df["reference"] = [REF.get(n, {}).get("speedup") if ref else None for n in df["drafter"]]
out = df[["drafter", "k", "acceptance_rate", "tokens_per_step", "draft_ms", "score_ms", "other_ms", "step_ms",
          "plain_step_ms", "c", "speedup", "speedup_min", "speedup_max", "noisy", "same", "reference"]]
out = out.rename(columns={"acceptance_rate": "Acceptance", "tokens_per_step": "Mean acceptance length",
                          "draft_ms": "Draft ms/step", "score_ms": "Verify pass ms/step",
                          "other_ms": "Other ms/step", "step_ms": "Step ms", "plain_step_ms": "Plain step ms",
                          "c": "c (draft / plain step, per position)", "same": "Same tokens as plain",
                          "reference": "Reference speedup"})
measure.table(out.round(3), "drafters")
losers = df[(df["drafter"] != PLAIN) & (df["speedup"] < 1) & (df["acceptance_rate"] >= 0.5)]
for _, r in losers.iterrows():
    st.markdown(f"- **`{r['drafter']}`** kept {r['acceptance_rate']:.0%} of its guesses ({r['tokens_per_step']:.2f} "
                f"tokens a step) yet ran at {r['speedup']:.2f}×: its step took {r['step_ms']:.1f} ms (draft "
                f"{r['draft_ms']:.1f}, verify pass {r['score_ms']:.1f}) against a plain step's "
                f"{r['plain_step_ms']:.1f} ms.")
st.markdown(
    "**How to read it.** Speedup is tokens per second over plain decoding's, the median of the paired repeats "
    "(whiskers: their min–max). Tokens per step ÷ (step ms ÷ plain step ms) predicts it. *c* is the draft's "
    "cost per drafted position over a plain target step (Leviathan et al. 2023): near 0 for lookup and suffix, "
    "which copy text, larger for a model draft. *Same tokens as plain* checks the output contract at T = 0.")
