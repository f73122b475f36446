"""Workloads: the lesson's six kinds of traffic, each decoded with and without speculation, the lesson's expected
benefit beside the measured one (the operator's checklist: acceptance rate, TTFT, TPOT, throughput, speedup).
The batch-serving row decodes one large batch through batch.py; the others decode prompt by prompt."""
from dataclasses import replace
from functools import partial

import pandas as pd
import streamlit as st

from app import charts, limits, measure, sidebar
from specdec_core.bench import reference, showcase, sweeps
from specdec_core.bench.workloads import WORKLOADS
from specdec_core.drafters import entry

KEY = "measure_workloads"
BATCH_SIZES = [4, 8, 16, 32, 64]
SHORT = {"code": "Code", "json": "JSON", "extraction": "Extraction", "chat": "Chat", "creative": "Creative",
         "batch": "Batch"}
measure.settle(KEY, wl_which=list(WORKLOADS), wl_prompts=3, wl_max_new=32, wl_own=True,
               wl_batch=WORKLOADS["batch"].batch_size if "batch" in WORKLOADS else 32)



def drafter(name: str) -> str:
    """A workload's own drafter as the page names it (a draft model's name in brackets)."""
    w = WORKLOADS[name]
    return f"draft ({w.draft_model})" if entry(w.drafter).draft_model else w.drafter


st.title("Workloads: where does speculation pay?")
st.markdown(
    "The lesson sorts traffic into six kinds and predicts how much speculative decoding helps each. Here every "
    "kind is **measured**: its prompts are decoded plainly and with each drafter you pick, one after the other "
    "on this machine, at the temperature that kind of traffic usually runs at. The table puts the lesson's "
    "expected benefit beside the one we measured, with the numbers an operator reads before keeping the feature "
    "on: acceptance rate, time to first token (TTFT), time per output token (TPOT) and throughput.")

s = sidebar.current()
ref = reference.load()
c1, c2 = st.columns([3, 2])
with c1:
    own = st.toggle("Each workload with the drafter that shows its effect best", key="wl_own",
                    help="Chosen by measurement and kept with the workloads (bench/workloads.py): code and JSON with "
                         "EAGLE's head, extraction and chat with prompt lookup (chat's answers reuse "
                         "the question's words), creative writing with the draft model at its hot temperature, "
                         "batch serving with prompt lookup over one large batch. Off: every workload with the "
                         "drafters you pick (and the sidebar's draft model).")
    names = measure.pick_drafters("wl_drafters") if not own else []
    which = st.multiselect("Workloads", list(WORKLOADS), key="wl_which", format_func=lambda n: SHORT.get(n, n),
                           help="; ".join(f"{n}: {w.label}" for n, w in WORKLOADS.items()))
    if own:
        names = list(dict.fromkeys(WORKLOADS[n].drafter for n in WORKLOADS if n in which))
        st.caption("Drafters: " + "; ".join(f"{n} → `{drafter(n)}`" for n in which))
with c2:
    most = max(len(w.prompts) for w in WORKLOADS.values() if w.batch_size == 1)
    n_prompts = st.slider("Prompts per workload", 1, most, key="wl_prompts",
                          help="More prompts give steadier numbers and take longer.")
    max_new = limits.tokens_input(st, "New tokens per prompt", 4, 256, key="wl_max_new", step=8)
    batch = st.select_slider("Batch size of the batch-serving row", BATCH_SIZES, key="wl_batch",
                             help="That row decodes this many requests together (its prompts repeated as "
                                  "needed), the way a busy server does.")
which = [n for n in WORKLOADS if n in which]
params = {"drafters": "each workload's own" if own else ", ".join(measure.label(n, s) for n in names) or "none",
          "k": s.k,
          "workloads": len(which), "prompts each": n_prompts, "new tokens": max_new, "batch size": batch,
          "top-p": s.top_p, "seed": s.seed}
go_clicked = st.button("Measure the workloads", type="primary", key="wl_go", icon=":material/speed:",
                       disabled=not (names and which))
st.caption(f"Sidebar settings used: k = {s.k}, top-p {s.top_p:g}, seed {s.seed}. The temperature is each "
           "workload's own (in the table); the sidebar's temperature is not used here.")


figure = partial(charts.workloads_figure, ref=ref, which=which, own=own)


def row(r: dict) -> dict:
    """A showcase.workload_rows row as the table shows it."""
    who = f"draft ({r['draft_model'] or s.draft_model})" if entry(r["drafter"]).draft_model else r["drafter"]
    rf = reference.rows_by(ref, "workloads", "workload").get(r["workload"], {})
    return {"name": r["workload"], "Workload": WORKLOADS[r["workload"]].label, "Drafter": who,
            "Temperature": r["temperature"], "Requests": r["requests"], "Decoded": r["decoded"],
            "Expected benefit (lesson)": r["expected"], "Measured benefit": r["benefit"],
            "Lands": "yes" if r["lands"] else "no", "Why it differs (measured)": r["why"],
            "Speedup": r["speedup"], "Reference speedup": rf.get("speedup"),
            "Acceptance rate": r["acceptance_rate"], "Mean acceptance length": r["mean_acceptance_length"],
            "Draft ms/step": r.get("draft_ms"), "Verify ms/step": r.get("score_ms"),
            "Other ms/step": (r["verify_ms"] + r["commit_ms"] + r["bookkeeping_ms"]) if "draft_ms" in r else None,
            "Step ms": r.get("step_ms"), "Plain step ms": r.get("plain_step_ms"),
            "TTFT plain (ms)": r["baseline_ttft_ms"], "TTFT spec (ms)": r["ttft_ms"],
            "TPOT plain (ms)": r["baseline_tpot_ms"], "TPOT spec (ms)": r["tpot_ms"],
            "Throughput plain (tok/s)": r["baseline_tokens_per_s"], "Throughput spec (tok/s)": r["tokens_per_s"],
            "Speedup min": r["speedup_min"], "Speedup max": r["speedup_max"], "Noisy": r["noisy"],
            "Acceptance 95% low": r["acceptance_lo"], "Acceptance 95% high": r["acceptance_hi"],
            "Drafted": r["drafted"], "Identical outputs": f"{r['identical_outputs']} of {r['prompts']}",
            "point": {k: r[k] for k in ("speedup", "speedup_min", "speedup_max", "noisy", "baseline_spread",
                                        "repeats")}}


def points(tgt, specs, live):
    for r in showcase.workload_rows(tgt, which, n_prompts, max_new, s.k, s.top_p, s.seed, batch,
                                    None if own else specs, live.tick):
        yield row(r)


def total(specs) -> int:
    runs_per = [1 if WORKLOADS[n].batch_size > 1 else min(n_prompts, len(WORKLOADS[n].prompts)) for n in which]
    return sum((1 + (1 if own else len(specs))) * r for r in runs_per) * sweeps.REPEATS


def measure_all() -> None:
    # each workload's own drafters are checked with its own draft model, not the sidebar's
    mine = replace(s, draft_model=next((w.draft_model for w in WORKLOADS.values() if entry(w.drafter).draft_model),
                                       s.draft_model)) if own else s
    measure.measure(KEY, params, names, mine, total, points, figure, "Measuring")


res = measure.results(KEY, params, go_clicked, measure_all,
                      "Pick drafters and press **Measure the workloads**. With the defaults this takes about a "
                      "minute on a laptop CPU.")

measure.noise_note([r["point"] for r in res.rows])
st.plotly_chart(figure(res.rows), key="wl_chart", width="stretch")
if ref:
    m = ref["machine"]
    flags = ", ".join(m.get("flags", [])) or "no AVX-512 or AMX flags"
    st.caption(f"Faint bars: {reference.label(ref)} ({m.get('cores')} cores, {flags}; load average then "
               f"{m.get('load_average', ['?'])[0]}), each workload with its own drafter, made by "
               f"`{ref['command']}`. A recorded run, not this machine now.")
df = pd.DataFrame(res.rows)
best = df.loc[df["Speedup"].idxmax()]
worst = df.loc[df["Speedup"].idxmin()]
agree = int((df["Lands"] == "yes").sum())
st.markdown(
    f"**What we measured.** The best case was **{best['Workload']}** with `{best['Drafter']}` at "
    f"**{best['Speedup']:.2f}×** (acceptance {best['Acceptance rate']:.0%}); the worst was "
    f"**{worst['Workload']}** with `{worst['Drafter']}` at **{worst['Speedup']:.2f}×**. "
    f"**{agree} of {len(df)} rows land in the lesson's own category.**")
for _, r in df[df["Lands"] == "no"].iterrows():
    st.markdown(f"- **{r['name']}** with `{r['Drafter']}`, {r['Speedup']:.2f}× ({r['Measured benefit']}): "
                f"{r['Why it differs (measured)']}.")
st.markdown("**Where the time went**, per row: the draft's ms and the verify pass's ms in one speculative step, "
            "against one plain step (a batch row: one whole batch step). Speedup ≈ tokens per step × plain step "
            "ms / step ms, so good acceptance loses when the step costs more than the tokens it adds.")
times = df[["Workload", "Drafter", "Acceptance rate", "Mean acceptance length", "Draft ms/step", "Verify ms/step",
            "Other ms/step", "Step ms", "Plain step ms", "Speedup"]]
measure.shown_table(times.round(3))
st.markdown(
    "**How to read it.** Speedup is tokens per second with speculation divided by tokens per second without, "
    "for the same prompts and settings; the dashed line is 1×, no gain, and a bar below it means speculation made "
    "decoding slower. *Measured benefit* names it in the lesson's words: High ≥ 1.5×, "
    "Moderate 1.15–1.5×, Low 1–1.15×, Negative below 1× (speculation made it slower). Creative writing and "
    "batch "
    "serving land when Low or Negative: the lesson says of both that the overhead can exceed the win. A low "
    "acceptance rate is not a failure: it is the workload telling you it is not predictable enough to draft.")
num = df.select_dtypes("number").columns
MAIN = ["Workload", "Drafter", "Expected benefit (lesson)", "Measured benefit", "Lands", "Speedup",
        "Reference speedup", "Speedup min", "Speedup max", "Noisy", "Acceptance rate", "Mean acceptance length",
        "Identical outputs", "Why it differs (measured)"]
measure.table(df.drop(columns=["name", "point"]).round({c: 3 for c in num}), "workloads", main=MAIN)
