"""Output contract: the lesson's production check. Greedy decoding with speculation on and off over a fixed prompt
set, diffed token by token; and at temperature > 0, the first tokens sampled many times with and without
speculation, compared as histograms (total variation distance, chi-square two-sample test). The rule is exact
(Leviathan et al. 2023, Thm 3.5; Chen et al. 2023): any difference beyond chance is an implementation bug."""
import pandas as pd
import streamlit as st

from app import limits, measure, runs, sidebar
from app.contract_view import SHOWN, diff_html, forward_row, greedy_figure, hist_figure
from specdec_core.bench import contract
from specdec_core.bench.workloads import WORKLOADS

KEY_G, KEY_S, KEY_F = "measure_contract_greedy", "measure_contract_sampled", "measure_contract_forwards"
# the fixed prompt set: the first two prompts of each single-request workload
PROMPTS = [(f"{n}-{i + 1}", w.prompts[i]) for i in range(2) for n, w in WORKLOADS.items()
           if w.batch_size == 1 and len(w.prompts) > i]
SAMPLES = [50, 100, 200, 500, 1000]
ss = st.session_state
measure.settle(KEY_G)
measure.settle(KEY_S)
measure.settle(KEY_F)
ss.setdefault("ct_f_prompts", 4)
ss.setdefault("ct_f_new", 48)
ss.setdefault("ct_prompts", 3)
ss.setdefault("ct_max_new", 32)
ss.setdefault("ct_temp", 1.0)
ss.setdefault("ct_samples", 200)
ss.setdefault("ct_span", 2)
ss.setdefault("ct_prompt", next((i for i, (n, _) in enumerate(PROMPTS) if n == "extraction-1"), 0))

st.title("Output contract: does speculation change the output?")
st.markdown(
    "Speculation is meant to change the speed, never the text. The theorem says the output has exactly the "
    "target's distribution; the lesson's production advice is not to take that on trust but to check it on "
    "your own traffic: **fix a set of prompts, decode greedily with the feature on and off, and diff the "
    "tokens**. Below that check runs on this app's engine, followed by the same question for sampling, where "
    "outputs differ run to run and only their *distribution* can be compared.")

s = sidebar.current()
names = measure.pick_drafters("ct_drafters")
st.caption(f"Sidebar settings used: k = {s.k}, top-p {s.top_p:g} (sampling part), seed {s.seed}.")

# -- 1. greedy --------------------------------------------------------------------------------------------------
st.header("1 · Greedy: the same tokens, on and off")
c1, c2 = st.columns(2)
n_prompts = c1.slider("Prompts from the fixed set", 1, len(PROMPTS), key="ct_prompts",
                      help="Two prompts from each workload: code, JSON, extraction, chat, creative.")
max_new = limits.tokens_input(c2, "New tokens per prompt", 4, 256, key="ct_max_new", step=8)
g_params = {"drafters": ", ".join(measure.label(n, s) for n in names) or "none", "k": s.k, "prompts": n_prompts,
            "new tokens": max_new}
g_clicked = st.button("Run the greedy check", type="primary", key="ct_greedy_go", icon=":material/difference:",
                      disabled=not names)


if g_clicked:
    res = measure.begin(KEY_G, g_params)
    try:
        tgt = runs.target()
        specs = measure.runnable(res, names, s, tgt)
        prompts = list(zip([n for n, _ in PROMPTS], measure.encode(tgt, [t for _, t in PROMPTS[:n_prompts]])))
        live = measure.Live(KEY_G, n_prompts * (1 + len(specs)), "Decoding")
        rows = contract.greedy_check(tgt, specs, prompts, s.k, max_new, s.seed, lambda n: measure.label(n, s),
                                     live.tick)
        measure.collect(res, rows, live, greedy_figure)
    except runs.UserError as e:
        res.status, res.error = "failed", str(e)
elif (problem := runs.warm()) is not None:
    st.error(problem, icon=":material/error:")

res = measure.section(KEY_G, g_params, "Press **Run the greedy check**.")
if res is not None:
    st.plotly_chart(greedy_figure(res.rows), key="ct_greedy_chart", width="stretch")
    df = pd.DataFrame(res.rows)
    same = int(df["Identical"].sum())
    ties = df[df["p(plain token)"].notna()]
    gaps = (ties["p(plain token)"] - ties["p(spec token)"]).abs().tolist()
    msg = contract.greedy_summary(same, len(df), gaps, runs.forward_choice(), str(runs.target().dtype)[6:])
    (st.success if same == len(df) else st.warning)(msg)
    tgt = runs.target()
    for r in res.rows:
        if not r["Identical"]:
            with st.expander(f"{r['Prompt']} · {r['Drafter']}: differs from token {r['First difference at token']}"):
                st.html(diff_html(tgt, r["plain"], r["spec"], r["First difference at token"]))
    measure.table(df.drop(columns=["plain", "spec"]).round(4), "contract-greedy")

# -- 2. the forward ---------------------------------------------------------------------------------------------
st.header("2 · Why bit for bit: a batch-invariant forward")
st.markdown(
    "Greedy speculation keeps the target's argmax at every position, so it gives plain decoding's tokens only "
    "if the target scores a position **the same whether alone (a one-token step) or as part of a verify step "
    "of k + 1 tokens**. Most forwards do not: a many-token pass adds the same numbers in another order, and "
    "the last bits of the logits move. Where the top two logits are closer than that, the argmax flips and the "
    "texts part. This app runs its own forward, built so that a position's logits are bit for bit the same "
    "however it is scored (serving engines ship the same idea as a *batch-invariant* or *deterministic* mode). "
    "Below, prompt lookup decodes each prompt greedily on and off with both forwards: transformers' own "
    "(the reference) and ours. Where the reference drifts, the table shows the gap between its top two logits "
    "there, and how far that position's logits move between one-token and (k + 1)-token scoring, for both.")
c1, c2 = st.columns(2)
f_prompts = c1.slider("Prompts from the fixed set", 1, len(PROMPTS), key="ct_f_prompts")
f_new = limits.tokens_input(c2, "New tokens per prompt", 8, 256, key="ct_f_new", step=8)
f_params = {"drafter": "lookup", "k": s.k, "prompts": f_prompts, "new tokens": f_new}
f_clicked = st.button("Compare the two forwards", type="primary", key="ct_forward_go", icon=":material/memory:")


def forward_rows(live):
    ours, ref = runs.target("ours"), runs.target("hf")   # loaded inside the measurement: failures become a message
    prompts = list(zip([n for n, _ in PROMPTS], measure.encode(ours, [t for _, t in PROMPTS[:f_prompts]])))
    for p, d, probe in contract.forward_check(ref, ours, prompts, s.k, f_new):
        yield forward_row(p, d, probe, runs.FORWARDS, live.tick)


if f_clicked:
    res = measure.begin(KEY_F, f_params)
    try:
        live = measure.Live(KEY_F, 2 * f_prompts, "Decoding")
        measure.collect(res, forward_rows(live), live)
    except runs.UserError as e:
        res.status, res.error = "failed", str(e)

res = measure.section(KEY_F, f_params, "Press **Compare the two forwards**.")
if res is not None:
    df = pd.DataFrame(res.rows)
    for name in runs.FORWARDS.values():
        part = df[df["Forward"] == name]
        if len(part):
            same = int(part["Identical"].sum())
            diff = part["1-token vs (k+1)-token logit difference"].dropna()
            said = (f"**{name}**: {same} of {len(part)} prompts token-for-token identical"
                    + (f"; one-token and (k + 1)-token scoring of the probed positions differ by up to "
                       f"**{diff.max():.4g}** in a logit" if len(diff) else "") + ".")
            (st.success if same == len(part) else st.warning)(said)
    measure.table(df.round(4), "contract-forwards")
    st.caption("Ours costs a little padding and bookkeeping per step (see `python -m specdec_core "
               "bench-forward`); engines' batch-invariant modes are slower than their default kernels too, "
               "which is why they are a switch rather than the default everywhere.")

# -- 3. sampled -------------------------------------------------------------------------------------------------
st.header("3 · Sampling: the same distribution, on and off")
st.markdown(
    "At temperature above 0 every run draws different text, so tokens cannot be diffed. Instead the same "
    "prompt is decoded many times with different seeds, plainly and with speculation, and the first tokens "
    "of each run are counted. If the rule is exact the two histograms differ only by chance.")
c1, c2, c3, c4 = st.columns(4)
temp = c1.slider("Temperature", 0.1, 1.5, step=0.1, key="ct_temp")
n_samples = c2.select_slider("Runs per side", SAMPLES, key="ct_samples")
span = c3.select_slider("Tokens compared", [1, 2, 3], key="ct_span",
                        help="The first 1, 2 or 3 generated tokens, taken together as one outcome.")
pi = c4.selectbox("Prompt", list(range(len(PROMPTS))), key="ct_prompt", format_func=lambda i: PROMPTS[i][0])
st.caption(f"Prompt: {PROMPTS[pi][1]}")
s_params = {"drafters": ", ".join(measure.label(n, s) for n in names) or "none", "k": s.k, "temperature": temp,
            "runs per side": n_samples, "tokens compared": span, "prompt": PROMPTS[pi][0], "top-p": s.top_p,
            "seed": s.seed}
s_clicked = st.button("Sample and compare", type="primary", key="ct_sample_go", icon=":material/bar_chart:",
                      disabled=not names)


if s_clicked:
    res = measure.begin(KEY_S, s_params)
    try:
        tgt = runs.target()
        specs = measure.runnable(res, names, s, tgt)
        sp = measure.sampling(temp, s)
        prompt = measure.encode(tgt, [PROMPTS[pi][1]])[0]
        live = measure.Live(KEY_S, n_samples * (1 + len(specs)), "Sampling")

        def tick(name, i, counts):
            live.tick(name)
            if (i + 1) % max(1, n_samples // 5) == 0:
                live.draw(hist_figure(tgt, counts))
        rows = contract.sampled_check(tgt, specs, prompt, sp, n_samples, span, s.k, SHOWN,
                                      lambda n: measure.label(n, s), tick, res.extra)
        measure.collect(res, rows, live)
    except runs.UserError as e:
        res.status, res.error = "failed", str(e)

res = measure.stored(KEY_S)
if res is None:
    st.info("Press **Sample and compare**. With 200 runs per side this takes about a minute on a laptop CPU.",
            icon=":material/info:")
    st.stop()
measure.show_status(res, s_params)
if res.extra.get("counts"):
    tgt = runs.target()
    st.plotly_chart(hist_figure(tgt, res.extra["counts"], res.extra.get("ref")), key="ct_hist", width="stretch")
    st.caption("Bars: share of runs that began with each outcome, plain decoding (`none`) beside each drafter. "
               "Black marks: the target's exact probability of that outcome, computed from its own forward "
               "passes. Both kinds of bar should scatter around the marks.")
for r in res.rows:
    (st.success if r["p-value"] is None or r["p-value"] >= 0.05 else st.warning)(contract.sampled_summary(r))
if res.rows:
    measure.table(pd.DataFrame(res.rows).round(4), "contract-sampled")
