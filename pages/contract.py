"""Output contract: the lesson's production check. Greedy decoding with speculation on and off over a fixed prompt
set, diffed token by token; and at temperature > 0, the first tokens sampled many times with and without
speculation, compared as histograms (total variation distance, chi-square two-sample test). The rule is exact
(Leviathan et al. 2023, Thm 3.5; Chen et al. 2023): any difference beyond chance is an implementation bug."""
import html

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
import torch

from app import limits, measure, runs, sidebar
from app.view import show
from specdec_core import SamplingParams, drafters, engine
from specdec_core.bench import invariance
from specdec_core.sampling import probs
from specdec_core.bench.workloads import WORKLOADS

KEY_G, KEY_S, KEY_F = "measure_contract_greedy", "measure_contract_sampled", "measure_contract_forwards"
# the fixed prompt set: the first two prompts of each single-request workload
PROMPTS = [(f"{n}-{i + 1}", w.prompts[i]) for i in range(2) for n, w in WORKLOADS.items()
           if w.batch_size == 1 and len(w.prompts) > i]
SAMPLES = [50, 100, 200, 500, 1000]
NEAR_TIE = 0.1      # a probability gap that bf16 rounding of a many-token pass can plausibly flip
SHOWN = 12          # histogram bars: the most frequent outcomes, the rest pooled as "other"
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


def near_tie(tgt, prompt: list[int], prefix: list[int], a: int, b: int) -> tuple[float, float]:
    """The target's probabilities (temperature 1) of the two tokens that disagree, after their common prefix."""
    with torch.inference_mode():
        logits = tgt.forward(torch.tensor(prompt + prefix), tgt.new_cache(), last_only=True)
    p = torch.softmax(logits[0].float(), -1)
    return float(p[a]), float(p[b])


def greedy_rows(tgt, specs, live):
    sp = SamplingParams(0.0, 0, 1.0, s.seed)
    ids = measure.encode(tgt, [t for _, t in PROMPTS[:n_prompts]])
    none = drafters.make(drafters.PLAIN, tgt)
    for (pname, _), prompt in zip(PROMPTS, ids):
        plain, _, _ = engine.run(tgt, none, prompt, sp=sp, max_new_tokens=max_new, detail=False)
        live.tick(f"{pname}, plain")
        for n, lm in specs:
            spec, _, _ = engine.run(tgt, drafters.make(n, tgt, lm), prompt, sp=sp, k=s.k, max_new_tokens=max_new,
                                    detail=False)
            live.tick(f"{pname}, {n}")
            j = invariance.first_difference(plain, spec)
            row = {"Prompt": pname, "Drafter": measure.label(n, s), "Tokens plain": len(plain),
                   "Tokens spec": len(spec), "Identical": j is None, "First difference at token": j,
                   "p(plain token)": None, "p(spec token)": None,
                   "plain": plain, "spec": spec}
            if j is not None and j < min(len(plain), len(spec)):
                row["p(plain token)"], row["p(spec token)"] = near_tie(tgt, prompt, plain[:j], plain[j], spec[j])
            yield row


def greedy_figure(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    for d in dict.fromkeys(r["Drafter"] for r in rows):
        rs = [r for r in rows if r["Drafter"] == d]
        same = [min(r["First difference at token"] if r["First difference at token"] is not None
                    else r["Tokens plain"], r["Tokens plain"]) for r in rs]
        fig.add_bar(x=[r["Prompt"] for r in rs], y=same, name=f"{d}: identical tokens", marker_color=measure.color(d))
        fig.add_bar(x=[r["Prompt"] for r in rs], y=[r["Tokens plain"] - x for r, x in zip(rs, same)],
                    name=f"{d}: after the first difference", marker_color="#ef9a9a")
    fig.update_yaxes(title="tokens")
    return measure.layout(fig, 320, barmode="stack", title="Tokens identical to plain decoding, per prompt")


def diff_html(tgt, plain: list[int], spec: list[int], j: int | None) -> str:
    dec = tgt.tokenizer.decode
    if j is None:
        return f'<div class="strip">{html.escape(dec(plain))}</div>'
    head = html.escape(dec(plain[:j]))
    a, b = show(dec(plain[j:])), show(dec(spec[j:]))
    return (f'<div class="strip"><b>plain:</b> {head}<span class="tok tok-rejected" style="text-decoration:none">'
            f'{a}</span><br><b>spec:</b> {head}<span class="tok tok-accepted">{b}</span></div>')


if g_clicked:
    res = measure.begin(KEY_G, g_params)
    try:
        tgt = runs.target()
        specs = measure.runnable(res, names, s, tgt)
        live = measure.Live(KEY_G, n_prompts * (1 + len(specs)), "Decoding")
        measure.collect(res, greedy_rows(tgt, specs, live), live, greedy_figure)
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
    msg = f"**{same} of {len(df)}** decodings are token-for-token identical to plain decoding."
    if len(ties):
        gaps = (ties["p(plain token)"] - ties["p(spec token)"]).abs()
        dtype = str(runs.target().dtype).replace("torch.", "")
        if runs.forward_choice() == "ours":
            msg += (" This app's forward scores a position bit for bit the same in a one-token and a many-token "
                    "pass (section 2), so no rounding can explain a difference: it is a bug worth reporting.")
        elif gaps.max() < NEAR_TIE:
            msg += (f" Where they differ, the two competing tokens had target probabilities within "
                    f"**{gaps.max():.3f}** of each other (largest gap): near-ties. The model runs in {dtype}; "
                    "a pass over several tokens rounds differently from a pass over one, which can flip such "
                    "a tie, and from there the texts go their own ways. The acceptance rule itself is exact.")
        else:
            msg += (f" Where they differ, the two competing tokens' target probabilities are up to "
                    f"**{gaps.max():.3f}** apart: more than rounding in {dtype} should flip. Look at the "
                    "rows below; this may be a bug between the rule and the text.")
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
    ours, ref = runs.target("ours"), runs.target("hf")
    for (pname, _), prompt in zip(PROMPTS, measure.encode(ours, [t for _, t in PROMPTS[:f_prompts]])):
        probe = None
        for lm in (ref, ours):   # the reference first: ours is probed where it drifted
            d = invariance.compare(lm, lambda lm=lm: drafters.make("lookup", lm), prompt, s.k, f_new, probe)
            live.tick(f"{pname}, {runs.FORWARDS[d.forward]}")
            probe = d.position if probe is None else probe
            yield {"Prompt": pname, "Forward": runs.FORWARDS[d.forward], "Identical": d.identical,
                   "First difference at token": d.position,
                   "Tokens there (plain / spec)": f"{show(d.plain_token)} / {show(d.spec_token)}" if d.position
                   is not None else "",
                   "Top-2 logit gap": d.top_gap if probe is not None else None,
                   "1-token vs (k+1)-token logit difference": d.scoring_diff if probe is not None else None}


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


def draw_once(tgt, d, prompt, seed: int, k: int) -> tuple[tuple[int, ...], int, int]:
    """The first `span` tokens of one run, and how many drafts within them were checked and accepted."""
    sp = SamplingParams(float(temp), 0, float(s.top_p), seed)
    got, checked, accepted = [], 0, 0
    # room for a full draft after the span, so drafting inside it is never cut short by the length limit
    for rec in engine.decode(tgt, d, prompt, sp=sp, k=k, max_new_tokens=span + k, detail=False):
        for j in range(min(rec.k, rec.n_accepted + 1)):
            if len(got) + j < span:
                checked += 1
                accepted += j < rec.n_accepted
        got += [c.token for c in rec.committed]
        if len(got) >= span or rec.done:
            break
    return tuple(got[:span]), checked, accepted


def outcome(tgt, t: tuple[int, ...]) -> str:
    return "·".join(show(tgt.tokenizer.decode([i])) for i in t) or "∅"


def reference(tgt, prompt: list[int], outs: list[tuple[int, ...]]) -> dict:
    """The target's own probability of each shown outcome, p(t1) p(t2 | t1) ..., one forward per prefix."""
    sp = SamplingParams(float(temp), 0, float(s.top_p), 0)
    memo, ref = {}, {}
    for t in outs:
        pr = 1.0
        for i in range(len(t)):
            pre = t[:i]
            if pre not in memo:
                with torch.inference_mode():
                    memo[pre] = probs(tgt.forward(torch.tensor(prompt + list(pre)), tgt.new_cache(),
                                                  last_only=True), sp)[0]
            pr *= float(memo[pre][t[i]])
        ref[t] = pr
    return ref


def hist_figure(tgt, counts: dict[str, dict], ref: dict | None = None) -> go.Figure:
    tot = {}
    for c in counts.values():
        for t, v in c.items():
            tot[t] = tot.get(t, 0) + v / max(1, sum(c.values()))
    top = sorted(tot, key=lambda t: -tot[t])[:SHOWN]
    labels = [outcome(tgt, t) for t in top] + (["other"] if len(tot) > len(top) else [])
    fig = go.Figure()
    for name, c in counts.items():
        n = max(1, sum(c.values()))
        ys = [c.get(t, 0) / n for t in top]
        if len(labels) > len(top):
            ys.append(1 - sum(ys))
        fig.add_bar(x=labels, y=ys, name=name, marker_color=measure.color(name),
                    text=[f"{y:.0%}" for y in ys], textposition="outside", cliponaxis=False)
    if ref:
        ys = [ref.get(t, 0.0) for t in top] + ([max(0.0, 1 - sum(ref.get(t, 0.0) for t in top))]
                                                 if len(labels) > len(top) else [])
        fig.add_scatter(x=labels, y=ys, mode="markers", name="target p (exact)",
                        marker=dict(symbol="line-ew-open", size=34, color="#000", line=dict(width=3)))
    fig.update_yaxes(title="share of runs", tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(title="first generated token(s) (␣ = space, · separates tokens)")
    return measure.layout(fig, 420, barmode="group")


def sample_all(tgt, specs, live, res):
    prompt = measure.encode(tgt, [PROMPTS[pi][1]])[0]
    counts, stats = {}, {}
    sides = [(drafters.PLAIN, None)] + specs
    for side, (n, lm) in enumerate(sides):
        name = measure.label(n, s)
        d = drafters.make(n, tgt, lm)
        c, checked, accepted = {}, 0, 0
        counts[name] = c
        for i in range(n_samples):   # disjoint seeds per side: the two samples are independent
            t, ch, ac = draw_once(tgt, d, prompt, s.seed + side * n_samples + i, drafters.entry(n).k(s.k))
            c[t] = c.get(t, 0) + 1
            checked, accepted = checked + ch, accepted + ac
            live.tick(name)
            if (i + 1) % max(1, n_samples // 5) == 0:
                live.draw(hist_figure(tgt, counts))
        stats[name] = {"checked": checked, "accepted": accepted}
    res.extra["counts"] = counts
    res.extra["ref"] = reference(tgt, prompt, sorted({t for c in counts.values() for t in c},
                                                      key=lambda t: -sum(c.get(t, 0) for c in counts.values()))[:SHOWN])
    for name in list(counts)[1:]:
        cmp = measure.two_sample(counts["none"], counts[name], s.seed)
        yield {"Drafter": name, "Runs per side": n_samples, "Temperature": temp, "Tokens compared": span,
               "Drafts checked in the span": stats[name]["checked"],
               "Drafts accepted in the span": stats[name]["accepted"],
               "Distinct outcomes": len(set(counts["none"]) | set(counts[name])),
               "Total variation": cmp["tv"], "TV by chance (median)": cmp["tv_chance_median"],
               "TV by chance (95%)": cmp["tv_chance_95"], "Chi-square": cmp["chi2"], "Bins": cmp["bins"],
               "p-value": cmp["p_value"]}


if s_clicked:
    res = measure.begin(KEY_S, s_params)
    try:
        tgt = runs.target()
        specs = measure.runnable(res, names, s, tgt)
        measure.sampling(temp, s)
        live = measure.Live(KEY_S, n_samples * (1 + len(specs)), "Sampling")
        measure.collect(res, sample_all(tgt, specs, live, res), live)
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
    pv, tv = r["p-value"], r["Total variation"]
    said = (f"**`{r['Drafter']}`**: within the first {r['Tokens compared']} token(s) the drafter's guesses "
            f"were checked {r['Drafts checked in the span']} times and accepted {r['Drafts accepted in the span']} "
            f"times, so the acceptance rule really decided these tokens. ")
    if r["Drafts checked in the span"] == 0:
        said = (f"**`{r['Drafter']}`**: the drafter proposed nothing within the first {r['Tokens compared']} "
                "token(s), so both sides are plain decoding here and this comparison tests nothing; compare "
                "more tokens or pick another prompt. ")
    said += (f"The histograms differ by a total variation of **{tv:.3f}** (the share of runs you would have to "
             f"move to turn one into the other); shuffling the runs between the two sides gives "
             f"{r['TV by chance (median)']:.3f} typically and up to {r['TV by chance (95%)']:.3f} in 95% of "
             "shuffles, so that is what chance alone looks like. ")
    if pv is None:
        said += "Every run began the same way, so there is nothing to test: raise the temperature."
    elif pv >= 0.05:
        said += (f"Chi-square test: p = **{pv:.2f}**. A difference at least this large would appear "
                 f"{pv:.0%} of the time even if both came from the same distribution: **no evidence that "
                 "speculation changed the output distribution.**")
    else:
        said += (f"Chi-square test: p = **{pv:.3f}**. A difference this large would appear by chance less than "
                 "5% of the time if both came from the same distribution: either a real difference or a "
                 "1-in-20 fluke. Rerun with another seed or more runs before concluding.")
    (st.success if pv is None or pv >= 0.05 else st.warning)(said)
if res.rows:
    measure.table(pd.DataFrame(res.rows).round(4), "contract-sampled")
