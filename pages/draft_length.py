"""Draft length k: measured speedup against k beside Leviathan et al. (2023), Thm 3.8,
(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), drawn from the measured acceptance rate alpha and the measured cost
ratio c (draft time per drafted token over one plain target forward, from the StepRecords' timings); and the
acceptance at each draft position, which the formula assumes is the same everywhere."""
from functools import partial

import pandas as pd
import streamlit as st

from app import captions, charts, limits, measure, sidebar
from specdec_core.bench import sweeps
from specdec_core.bench.theory import expected_speedup, theory
from specdec_core.bench.workloads import WORKLOADS

KEY = "measure_k"
POLICIES = {"schedule": "schedule: +2 after a fully accepted draft, −1 otherwise (transformers' heuristic)",
            "confidence": "confidence: a model draft stops when its top probability < 0.4 (lookup ignores it)"}
KS = list(range(1, 13))
# the distilled draft on code: its cost (c about 0.2-0.5 of a target step) gives a best k inside the range;
# a near-free drafter (lookup, c ~ 0.001) has a curve that only rises
measure.settle(KEY, k_workload=measure.workload_or_first("code"), k_prompts=2, k_max_new=32,
               k_policies=list(POLICIES))

st.title("Draft length k: how far ahead should the drafter guess?")
st.markdown(
    "**What the theory predicts.** If each drafted token is accepted with probability α, one step commits on "
    "average (1 − α^(k+1)) / (1 − α) tokens, which grows with k but levels off. Drafting costs time too: if one "
    "draft token costs c times one forward pass of the target, a step costs k·c + 1 target passes. Leviathan "
    "et al. (2023) divide the two: **speedup(k) = (1 − α^(k+1)) / ((1 − α)(k·c + 1))**. With a cheap drafter "
    "(small c) longer drafts pay; with a costly one the best k is small. We measure α and c, draw that "
    "prediction, and put the measured speedups on it.")

s = sidebar.current()
c1, c2 = st.columns([3, 2])
with c1:
    names = measure.pick_drafters("k_drafters", default=("draft",),
                                  help="Starts on the draft model (the sidebar's, distilled by default): its "
                                       "cost per guess gives a best k inside the range. Plain decoding is the "
                                       "baseline.")
    ks = measure.pick_values("Draft lengths k", "k_values", KS, [1, 2, 3, 4, 7, 8],
                             help="One point per k and drafter. 3 and 4, 7 and 8 side by side show the row blocks "
                                  "where the forward pads rows to blocks of 4 (a CPU with AMX): k + 1 = 4 or 8 rows "
                                  "fill their block, one draft more pays for a whole block. Without matrix units "
                                  "each row costs its own share, and the points climb step by step.")
with c2:
    wl = st.selectbox("Prompts from the workload", [n for n in WORKLOADS if WORKLOADS[n].batch_size == 1],
                      key="k_workload", format_func=lambda n: WORKLOADS[n].label)
    n_prompts = st.slider("Prompts", 1, len(WORKLOADS[wl].prompts), key="k_prompts")
    max_new = limits.tokens_input(st, "New tokens per prompt", 4, 256, key="k_max_new", step=8)
    policies = st.multiselect("Adaptive draft lengths, measured too", list(POLICIES), key="k_policies",
                              format_func=POLICIES.get,
                              help="Each is one more point per drafter, drawn as a level line beside the fixed-k "
                                   "points. Its k is the largest k above (the schedule's start, confidence's "
                                   "bound).")
params = {"drafters": ", ".join(measure.label(n, s) for n in names) or "none",
          "k": ", ".join(map(str, ks)), "workload": wl, "prompts": n_prompts, "new tokens": max_new,
          "temperature": s.temperature, "top-p": s.top_p, "seed": s.seed,
          "policies": ", ".join(policies) or "none"}
go_clicked = st.button("Sweep the draft length", type="primary", key="k_go", icon=":material/straighten:",
                       disabled=not (names and ks))
st.caption(f"Sidebar settings used: temperature {s.temperature:g}, top-p {s.top_p:g}, seed {s.seed} "
           "(the sidebar's k is replaced by the values above).")


def fixed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "k_policy" not in r]


figure = partial(charts.draft_length_figure, ks=ks)


def points(tgt, specs, live):
    ids = measure.encode(tgt, WORKLOADS[wl].prompts[:n_prompts])
    sp = measure.sampling(s.temperature, s)
    yield from measure.sweep_points(sweeps.sweep_k, tgt, specs, ids, ks, s, live, temperature=sp.temperature,
                                    max_new_tokens=max_new, seed=sp.seed, top_p=sp.top_p)
    if policies:
        yield from measure.sweep_points(sweeps.sweep_policy, tgt, specs, ids, policies, s, live, k=max(ks),
                                        temperature=sp.temperature, max_new_tokens=max_new, seed=sp.seed,
                                        top_p=sp.top_p)


def sweep() -> None:
    measure.measure(KEY, params, names, s,
                    lambda specs: 2 * sweeps.REPEATS * len(specs) * (len(ks) + len(policies)) * n_prompts,
                    points, figure, "Sweeping")


res = measure.results(KEY, params, go_clicked, sweep,
                      "Pick drafters and draft lengths, then press **Sweep the draft length**.")

measure.noise_note(res.rows)
st.plotly_chart(figure(res.rows), key="k_chart", width="stretch")
adaptive = [r for r in res.rows if "k_policy" in r]
df = pd.DataFrame(fixed(res.rows))
th = theory(fixed(res.rows))
for d, t in th.items():
    g = df[df["drafter"] == d].sort_values("k")
    best = g.loc[g["speedup"].idxmax()]
    pred = {k: expected_speedup(t["alpha"], k, t["c"]) for k in range(1, max(KS) + 1)}
    kbest = max(pred, key=pred.get)
    verify = g[g["verify_forward_ms"] > 0]
    vtxt = (f" One verification pass over the pending token and k drafts took "
            + ", ".join(f"{r['verify_forward_ms']:.0f} ms (k = {int(r['k'])})" for _, r in verify.iterrows())
            + f", against {t['forward_ms']:.0f} ms for one plain pass.") if len(verify) else ""
    st.markdown(
        f"**`{d}`.** Measured α = **{t['alpha']:.2f}** (guesses kept out of the {int(t['tested'])} the target "
        f"judged, all k pooled; a guess after a rejection is never judged). "
        f"Cost ratio **c = {t['c']:.3f}**: drafting took {t['draft_ms']:.2f} ms per drafted token and one plain "
        f"target forward pass {t['forward_ms']:.1f} ms (both from the steps' own timers, prefill left out). "
        f"Among k = 1…{max(KS)} the formula peaks at **k = {kbest}** (predicted {pred[kbest]:.2f}×); the best "
        f"measured k was "
        f"**{int(best['k'])}** at **{best['speedup']:.2f}×**.{vtxt}"
        + "".join(f" Adaptive **{r['k_policy']}** (k up to {r['k']}): **{r['speedup']:.2f}×**, "
                  f"{r['mean_acceptance_length']:.2f} tokens per step." for r in adaptive if r["drafter"] == d))
st.markdown(
    "**How to read it.** Dotted lines are the prediction, dots the measurement. Left: speedup. Middle: tokens "
    "committed per target pass, (1 − α^(k+1)) / (1 − α), which ignores cost. Right: the share of guesses at "
    "position i that were kept, which needs every earlier guess kept too; the dotted line is the formula's "
    "α^i, one α for every position.")
st.markdown(
    "**Why the measurement may differ from the prediction.** The formula assumes each guess is kept "
    "independently with the same probability α, and that verifying k + 1 tokens costs the same as one target "
    f"pass. {captions.row_cost(measure.row_block(res))}; and Python bookkeeping per step adds a fixed cost the "
    "formula does not count. Acceptance "
    "is not independent either: the right panel may show it changing with position (a drafter that copies text, "
    "once its first guesses are right, is usually copying the right span, so later positions are kept more "
    "often). Prompt lookup also drafts nothing when "
    "it finds no match, so some steps are plain decoding whatever k is.")
cols = ["drafter", "k", "acceptance_rate", "acceptance_lo", "acceptance_hi", "mean_acceptance_length", "tokens_per_s",
        "baseline_tokens_per_s", "speedup", "speedup_min", "speedup_max", "noisy", "draft_ms_per_token",
        "target_forward_ms", "verify_forward_ms", "cost_ratio_c", "drafted",
        "accepted", "identical_outputs", "prompts"]
out = df[cols].copy()
out["predicted_speedup"] = [expected_speedup(th[d]["alpha"], int(k), th[d]["c"]) for d, k in zip(df["drafter"], df["k"])]
out["per_position_acceptance"] = [" ".join(f"{a:.2f}" for a in p) for p in df["per_position_acceptance"]]
measure.table(out.round(4), "draft-length",
              main=["drafter", "k", "acceptance_rate", "acceptance_lo", "acceptance_hi", "drafted",
                    "mean_acceptance_length", "speedup", "speedup_min", "speedup_max", "noisy", "predicted_speedup"])
