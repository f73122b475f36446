"""Temperature: acceptance rate, mean acceptance length and speedup against sampling temperature, per drafter,
each point drawn as soon as it is measured (sweeps.sweep_temperature). Hot sampling flattens p, so a draft
matches what the target would sample less often (the lesson's "high-temperature creative writing" row)."""
import pandas as pd
import streamlit as st

from app import captions, charts, limits, measure, sidebar
from specdec_core import drafters
from specdec_core.bench import sweeps
from specdec_core.bench.workloads import TEMPERATURE_DEMO, WORKLOADS

KEY = "measure_temperature"
DRAFTING = {"sample": "sampled", "greedy": "greedy", "both": "both, side by side"}
MODEL_DRAFTS = drafters.MODEL_DRAFTS   # a drafting mode (greedy or sampled guesses) applies to these
TEMPS = [0.0, 0.25, 0.5, 0.6, 0.75, 1.0, 1.2, 1.25, 1.5]
DEMO_DRAFTER, DEMO_WORKLOAD = TEMPERATURE_DEMO   # where speculation pays at T = 0 (bench/workloads.py)
measure.settle(KEY, temp_workload=measure.workload_or_first(DEMO_WORKLOAD), temp_prompts=3, temp_max_new=32,
               temp_drafting="sample")

st.title("Temperature: does speculation survive hot sampling?")
st.markdown(
    "**What the lesson predicts.** At temperature 0 the target always takes its most likely token, so a good "
    "draft is accepted often. As the temperature rises both distributions flatten: the target may sample any of "
    "many tokens, and a guess is kept only with probability min(1, p/q). Acceptance falls, fewer tokens come "
    "out of each verification pass, and the speedup shrinks, possibly below 1× when drafting costs more than "
    "it saves. Each point below is plotted as soon as it is measured.")

s = sidebar.current()
c1, c2 = st.columns([3, 2])
with c1:
    names = measure.pick_drafters("temp_drafters", (DEMO_DRAFTER,),
                                  help=f"{DEMO_DRAFTER} on {WORKLOADS[DEMO_WORKLOAD].label.lower()} starts where "
                                       "speculation pays (most guesses kept at T = 0), so the fall with temperature "
                                       "shows in acceptance and speed alike; prompt lookup copies text, so its "
                                       "guesses are kept with probability p(x) alone. Plain decoding is always "
                                       "measured too.")
    temps = measure.pick_values("Temperatures", "temp_values", TEMPS, [0.0, 0.6, 1.2], fmt=lambda t: f"{t:g}",
                                help="Each temperature is one point per drafter.")
with c2:
    wl = st.selectbox("Prompts from the workload", [n for n in WORKLOADS if WORKLOADS[n].batch_size == 1],
                      key="temp_workload", format_func=lambda n: WORKLOADS[n].label)
    n_prompts = st.slider("Prompts", 1, len(WORKLOADS[wl].prompts), key="temp_prompts")
    drafting = st.radio("How a model draft guesses (draft, early-exit)", list(DRAFTING), key="temp_drafting",
                        format_func=DRAFTING.get, horizontal=True,
                        help="Sampled: the guess is drawn from q and kept with probability min(1, p/q). Greedy: "
                             "the draft's most likely token, a one-hot q, kept with probability p(x) (serving "
                             "engines' default). Both are exact; only acceptance differs. Copying and tree drafters "
                             "(lookup, suffix, medusa) are deterministic either way.")
    max_new = limits.tokens_input(st, "New tokens per prompt", 4, 256, key="temp_max_new", step=8)
params = {"drafters": ", ".join(measure.label(n, s) for n in names) or "none", "k": s.k,
          "temperatures": ", ".join(f"{t:g}" for t in temps), "workload": wl, "prompts": n_prompts,
          "new tokens": max_new, "top-p": s.top_p, "seed": s.seed, "drafting": DRAFTING[drafting]}
go_clicked = st.button("Sweep the temperature", type="primary", key="temp_go", icon=":material/thermostat:",
                       disabled=not (names and temps))
st.caption(f"Sidebar settings used: k = {s.k}, top-p {s.top_p:g}, seed {s.seed}.")


figure = charts.temperature_figure


def points(tgt, specs, live):
    ids = measure.encode(tgt, WORKLOADS[wl].prompts[:n_prompts])
    for t in temps:
        measure.sampling(t, s)   # a clear message for a bad value, before any work
    modes = ["sample", "greedy"] if drafting == "both" else [drafting]
    for mode in modes:
        use = [(n, lm) for n, lm in specs if mode == modes[0] or n in MODEL_DRAFTS]
        for p in measure.sweep_points(sweeps.sweep_temperature, tgt, use, ids, temps, s, live, k=s.k,
                                      max_new_tokens=max_new, seed=s.seed, top_p=s.top_p, draft_mode=mode):
            if mode == "greedy" and p["drafter"].split(" ")[0] in MODEL_DRAFTS:
                p["drafter"] += " · greedy drafting"
            yield p


def sweep() -> None:
    twice = lambda specs: len(specs) + (drafting == "both") * sum(n in MODEL_DRAFTS for n, _ in specs)
    measure.measure(KEY, params, names, s, lambda specs: 2 * sweeps.REPEATS * twice(specs) * len(temps) * n_prompts,
                    points, figure, "Sweeping")


res = measure.results(KEY, params, go_clicked, sweep,
                      "Pick drafters and temperatures, then press **Sweep the temperature**.")

measure.noise_note(res.rows)
st.plotly_chart(figure(res.rows), key="temp_chart", width="stretch")
df = pd.DataFrame(res.rows)
lines = []
for d, g in df.groupby("drafter", sort=False):
    g = g.sort_values("temperature")
    lo, hi = g.iloc[0], g.iloc[-1]
    apart = lo["acceptance_lo"] > hi["acceptance_hi"] or hi["acceptance_lo"] > lo["acceptance_hi"]
    lines.append(f"- `{d}`: acceptance {lo['acceptance_rate']:.0%} (95%: {lo['acceptance_lo']:.0%}–"
                 f"{lo['acceptance_hi']:.0%}, {int(lo['drafted'])} drafted) at T = {lo['temperature']:g} → "
                 f"{hi['acceptance_rate']:.0%} ({hi['acceptance_lo']:.0%}–{hi['acceptance_hi']:.0%}, "
                 f"{int(hi['drafted'])} drafted) at T = {hi['temperature']:g}"
                 + ("" if apart else " (the intervals overlap: more prompts or tokens would tell them apart)")
                 + f"; speedup {lo['speedup']:.2f}× → {hi['speedup']:.2f}×.")
st.markdown("**What we measured.**\n" + "\n".join(lines))
st.markdown(
    "**How to read it.** Left: the share of drafted tokens the target kept. Middle: tokens committed per "
    "target forward pass (1 means no gain; the dotted line). Right: tokens per second with speculation over "
    "tokens per second without, same prompts and seed (the dashed line is break-even). "
    "At temperature above 0 each run samples, so plain and speculative runs produce different, equally valid "
    "texts of possibly different lengths: expect some noise with few prompts.")
st.markdown(
    "**Sampled or greedy drafting.** A model draft that *samples* its guess x from its own distribution q keeps "
    "it with probability min(1, p(x)/q(x)); on average that is Σ min(p, q), high when the draft's distribution "
    "resembles the target's. A draft that takes its *most likely* token reports q as certain (one-hot), so the "
    "guess is kept with probability p(x) alone; after a rejection the replacement comes from p with x taken out. "
    "Both rules are exact. At temperature 0 they are the same; as the temperature rises p flattens, p(x) of any "
    "single token shrinks, and greedy drafting's acceptance falls faster (choose *both* above to see the two "
    "curves, greedy dotted).")
block = measure.row_block(res)   # where the sweep ran
st.markdown(
    "**Why a CPU may differ from the lesson.** On a GPU one forward pass over k + 1 tokens costs little more "
    f"than over one, so even a modest acceptance rate can pay. {captions.row_cost(block)}"
    + (". So here every rejected guess costs time of its own, and the speedup falls below 1× at a higher "
       "acceptance than on a GPU. " if block == 1 else ". ")
    + "The drop with temperature comes from acceptance: a drafter that copies text (`lookup`) proposes one exact "
    "token with q = 1, which is kept with probability p(x): when sampling is hot, p(x) of the copied token is "
    "small, so its acceptance falls fastest.")
cols = ["drafter", "temperature", "acceptance_rate", "acceptance_lo", "acceptance_hi", "drafted",
        "mean_acceptance_length", "tokens_per_s", "baseline_tokens_per_s", "speedup", "speedup_min", "speedup_max",
        "noisy", "tokens", "accepted", "steps", "same_tokens_as_baseline"]
measure.table(df[[c for c in cols if c in df]].round(3), "temperature",
              main=["drafter", "temperature", "acceptance_rate", "acceptance_lo", "acceptance_hi", "drafted",
                    "mean_acceptance_length", "speedup", "speedup_min", "speedup_max", "noisy"])
