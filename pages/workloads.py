"""Workloads: the lesson's six kinds of traffic, each decoded with and without speculation, the lesson's expected
benefit beside the measured one (the operator's checklist: acceptance rate, TTFT, TPOT, throughput, speedup).
The batch-serving row decodes one large batch through batch.py; the others decode prompt by prompt."""
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import limits, measure, sidebar
from specdec_core.bench import sweeps
from specdec_core.bench.workloads import WORKLOADS

KEY = "measure_workloads"
BATCH_SIZES = [4, 8, 16, 32, 64]
measure.settle(KEY, wl_which=list(WORKLOADS), wl_prompts=3, wl_max_new=32, wl_own=True,
               wl_batch=WORKLOADS["batch"].batch_size if "batch" in WORKLOADS else 32)

st.title("Workloads: where does speculation pay?")
st.markdown(
    "The lesson sorts traffic into six kinds and predicts how much speculative decoding helps each. Here every "
    "kind is **measured**: its prompts are decoded plainly and with each drafter you pick, one after the other "
    "on this machine, at the temperature that kind of traffic usually runs at. The table puts the lesson's "
    "expected benefit beside the one we measured, with the numbers an operator reads before keeping the feature "
    "on: acceptance rate, time to first token (TTFT), time per output token (TPOT) and throughput.")

s = sidebar.current()
c1, c2 = st.columns([3, 2])
with c1:
    own = st.toggle("Each workload with the drafter that shows its effect best", key="wl_own",
                    help="Code and JSON: the distilled draft model (the fastest there, measured); extraction and "
                         "batch serving: prompt lookup; chat and creative writing: EAGLE (the most tokens per step "
                         "on fresh chat and creative prompts; a model draft shows what hot sampling does to "
                         "acceptance). Off: every workload with the drafters you pick.")
    names = measure.pick_drafters("wl_drafters") if not own else []
    which = st.multiselect("Workloads", list(WORKLOADS), key="wl_which",
                           format_func=lambda n: WORKLOADS[n].label)
    if own:
        names = list(dict.fromkeys(WORKLOADS[n].drafter for n in WORKLOADS if n in which))
        st.caption("Drafters: " + "; ".join(f"{WORKLOADS[n].name} → `{WORKLOADS[n].drafter}`" for n in which))
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


def figure(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    for d in dict.fromkeys(r["Drafter"] for r in rows):
        rs = [r for r in rows if r["Drafter"] == d]
        fig.add_bar(x=[r["name"] for r in rs], y=[r["Speedup"] for r in rs], name=d,
                    marker_color=measure.color(d), cliponaxis=False,
                    text=[f"{r['Speedup']:.2f}×" + (" noisy: rerun" if r["Noisy"] else "") for r in rs],
                    textposition="outside", error_y=measure.speed_error([r["point"] for r in rs]),
                    customdata=[[r["Workload"], r["Acceptance rate"]] for r in rs],
                    hovertemplate="%{customdata[0]}: %{y:.2f}×, acceptance %{customdata[1]:.0%}<extra>" + d + "</extra>")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c")
    fig.update_xaxes(categoryorder="array", categoryarray=which, tickvals=which,
                     ticktext=[f"<b>{n}</b><br>lesson: {WORKLOADS[n].expected}" for n in which])
    fig.update_yaxes(title="speedup (× plain tokens/s)", rangemode="tozero")
    return measure.layout(fig, 460, barmode="group", title="Measured speedup per workload")


def row(name: str, who: str, p: dict, n: int) -> dict:
    w = WORKLOADS[name]
    return {"name": name, "Workload": w.label, "Drafter": who, "Temperature": w.temperature,
            "Requests": n, "Decoded": "one at a time" if w.batch_size == 1 else "as one batch",
            "Expected benefit (lesson)": w.expected, "Measured benefit": measure.verdict(p["speedup"]),
            "Speedup": p["speedup"], "Acceptance rate": p["acceptance_rate"],
            "Mean acceptance length": p["mean_acceptance_length"],
            "TTFT plain (ms)": p["baseline_ttft_ms"], "TTFT spec (ms)": p["ttft_ms"],
            "TPOT plain (ms)": p["baseline_tpot_ms"], "TPOT spec (ms)": p["tpot_ms"],
            "Throughput plain (tok/s)": p["baseline_tokens_per_s"], "Throughput spec (tok/s)": p["tokens_per_s"],
            "Speedup min": p["speedup_min"], "Speedup max": p["speedup_max"], "Noisy": p["noisy"],
            "Acceptance 95% low": p["acceptance_lo"], "Acceptance 95% high": p["acceptance_hi"],
            "Drafted": p["drafted"], "Identical outputs": f"{p['identical_outputs']} of {p['prompts']}",
            "point": {k: p[k] for k in ("speedup", "speedup_min", "speedup_max", "noisy", "baseline_spread",
                                        "repeats")}}


def mine(name: str, specs: list) -> list:
    """The drafters this workload is measured with."""
    return [(n, lm) for n, lm in specs if n == WORKLOADS[name].drafter] if own else specs


def points(tgt, all_specs, live):
    for name in which:
        w = WORKLOADS[name]
        specs = mine(name, all_specs)
        if not specs:
            continue
        sp = measure.sampling(w.temperature, s)
        if w.batch_size > 1:   # one large batch through batch.py, the way a server batches requests
            ids = measure.encode(tgt, w.prompts)
            rows = [ids[i % len(ids)] for i in range(batch)]
            out = sweeps.batch_point(tgt, rows, sp, s.k, max_new, specs, live.tick)
            for n, _ in specs:
                yield row(name, measure.label(n, s), out[n], batch)
        else:
            ids = measure.encode(tgt, w.prompts[:n_prompts])
            pair = sweeps.side_by_side(tgt, ids, sp, s.k, max_new, specs, lambda what: live.tick(f"{name}, {what}"))
            for n, _ in specs:
                yield row(name, measure.label(n, s), sweeps.point(pair, n), len(ids))


def total(specs) -> int:
    runs_per = [1 if WORKLOADS[n].batch_size > 1 else min(n_prompts, len(WORKLOADS[n].prompts)) for n in which]
    return sum((1 + len(mine(n, specs))) * r for n, r in zip(which, runs_per)) * sweeps.REPEATS


def measure_all() -> None:
    measure.measure(KEY, params, names, s, total, points, figure, "Measuring")


res = measure.results(KEY, params, go_clicked, measure_all,
                      "Pick drafters and press **Measure the workloads**. With the defaults this takes well under a "
                      "minute on a laptop CPU.")

measure.noise_note([r["point"] for r in res.rows])
st.plotly_chart(figure(res.rows), key="wl_chart", width="stretch")
df = pd.DataFrame(res.rows)
best = df.loc[df["Speedup"].idxmax()]
worst = df.loc[df["Speedup"].idxmin()]
agree = sum(m.lower() in e.lower() for m, e in zip(df["Measured benefit"], df["Expected benefit (lesson)"]))
st.markdown(
    f"**What we measured.** The best case was **{best['Workload']}** with `{best['Drafter']}` at "
    f"**{best['Speedup']:.2f}×** (acceptance {best['Acceptance rate']:.0%}); the worst was "
    f"**{worst['Workload']}** with `{worst['Drafter']}` at **{worst['Speedup']:.2f}×**. "
    f"{agree} of {len(df)} rows land in the lesson's own category.")
st.markdown(
    "**How to read it.** Speedup is tokens per second with speculation divided by tokens per second without, "
    "for the same prompts and settings; the dashed line is 1×, no gain, and a bar below it means speculation made "
    "decoding slower. *Measured benefit* names it in the lesson's words: High ≥ 1.5×, "
    "Moderate 1.15–1.5×, Low 1–1.15×, Negative below 1× (speculation made it slower). A low acceptance rate is "
    "not a failure: it is the workload telling you it is not predictable enough to draft.")
st.markdown(
    "**Why this machine may disagree with the lesson.** The lesson reasons about a GPU, where one decode step is "
    "slow because the weights must be read from memory, so checking several tokens costs about as much as "
    "making one. On this CPU a forward pass also has a large fixed cost (per-call overhead), so verifying k "
    "drafts is again nearly free and the same ordering can appear; but a few prompts with short answers give "
    "noisy numbers, and other programs running on the machine move them. Batch serving differs most: on a GPU "
    "a large batch already uses the spare arithmetic speculation would need; here the batch pays for the "
    "longest draft in every row (acceptance is ragged, rows are padded) and for every rejected position, so "
    "verification competes with the other requests. Prompt lookup drafts only when the text repeats, which is "
    "why it does best where the answer copies the prompt.")
num = df.select_dtypes("number").columns
MAIN = ["Workload", "Drafter", "Expected benefit (lesson)", "Measured benefit", "Speedup", "Speedup min", "Speedup max",
        "Noisy", "Acceptance rate", "Mean acceptance length", "Identical outputs"]
measure.table(df.drop(columns=["name", "point"]).round({c: 3 for c in num}), "workloads", main=MAIN)
