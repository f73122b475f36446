"""All drafters, one prompt: every drafter that can run here decodes the sidebar's prompt beside plain decoding,
with its acceptance, tokens per step, where a step's time went (the draft's ms, the verify pass's ms, against a
plain step's) and the speedup by the measuring rule; the recorded reference run drawn faintly beside it."""
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from app import measure, sidebar
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


def figure(rows: list[dict]) -> go.Figure:
    rows = [r for r in rows if r["drafter"] != PLAIN]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["speedup (× plain tokens/s)", "ms per step: where the time went"])
    names = [r["drafter"] for r in rows]
    if REF:
        rr = [REF[n] for n in names if n in REF]
        fig.add_bar(x=[r["drafter"] for r in rr], y=[r["speedup"] for r in rr], name=reference.label(ref),
                    marker=dict(color="rgba(96,125,139,0.22)", line=dict(color="rgba(96,125,139,0.6)", width=1)),
                    row=1, col=1)
    fig.add_bar(x=names, y=[r["speedup"] for r in rows], name="measured now", row=1, col=1,
                marker_color=[measure.color(n) for n in names], error_y=measure.speed_error(rows),
                text=[f"{r['speedup']:.2f}×" + (" noisy" if r["noisy"] else "") for r in rows],
                textposition="outside", cliponaxis=False, constraintext="none")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c", row=1, col=1)
    base = [0.0] * len(rows)
    for key, lab, col in (("draft_ms", "draft", "#ef6c00"), ("score_ms", "verify pass", "#1565c0"),
                          ("other_ms", "verify rule, commit, loop", "#b0bec5")):
        ys = [r[key] for r in rows]   # stacked by hand: the left panel's bars are grouped
        fig.add_bar(x=names, y=ys, base=base, name=lab, marker_color=col, offsetgroup="ms", row=1, col=2,
                    hovertemplate="%{x}: %{y:.1f} ms<extra>" + lab + "</extra>")
        base = [b + y for b, y in zip(base, ys)]
    if rows:
        fig.add_hline(y=rows[0]["plain_step_ms"], line_dash="dot", line_color="#37474f", row=1, col=2,
                      annotation_text=f"plain step {rows[0]['plain_step_ms']:.1f} ms", annotation_position="top left")
    fig.update_yaxes(rangemode="tozero")
    return measure.layout(fig, 440, below=True, barmode="group")


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
