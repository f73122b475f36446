"""Start here: a guided walkthrough of the lesson, one idea per section. Each section has a live widget
that runs the real decoder on the bundled model (behind a button, at most 24 new tokens) and ends with a
check-yourself question answered on the page.
Leviathan et al. (ICML 2023); Chen et al. (2023); Medusa: Cai et al. (2024); prompt lookup: Saxena (2023).
"""
from pathlib import Path

import streamlit as st

from app import captions, nav, runs, sidebar, walk
from app.captions import count
from app.classroom import REPEAT
from app.headroom import walkthrough_note
from app.walk import FREE_UP_TO, TOKENS, chips, live, quiz, run_drafter, spread
from specdec_core import drafters
from specdec_core.bench import passes
from specdec_core.bench.sweeps import NOISY
from specdec_core.bench.workloads import WORKLOADS
from specdec_core.serving import checklist

SECTIONS = {
    "idle": "1 · Why decoding leaves arithmetic idle",
    "two": "2 · Two models, and what they cost",
    "variants": "3 · Variants: where drafts come from",
    "exact": "4 · Why the output stays exact",
    "workloads": "5 · Which workloads win",
    "batching": "6 · The batching interaction",
    "checklist": "7 · The operator's checklist",
}


st.title("Start here: speculative decoding in seven steps")
st.markdown("Read a section, press its button to run the **real** model (a 135 M-parameter SmolLM2 on this "
            "machine), then answer its question. The other pages go deeper: **Step by step** replays every "
            "verification, **Race** times the two decoders side by side, **Road to production** turns your "
            "settings into engine flags.")
# every other page, one click away: the sidebar's navigation lists them too, but a newcomer reads the page
HERE = Path(__file__).parent
ONWARD = [page for page in nav.PAGES if page.path.name != Path(__file__).name]
with st.expander("Where to go next", icon=":material/explore:"):
    cols = st.columns(3)
    for i, page in enumerate(ONWARD):
        with cols[i % 3]:
            st.page_link(page.path, label=page.link, icon=page.icon)
sec = st.radio("Section", list(SECTIONS), format_func=SECTIONS.get, key="wt_section", horizontal=True)
st.header(SECTIONS[sec])

if sec == "idle":
    st.markdown("""
Each new token needs one forward pass, and a forward pass must read **every weight** from memory. For one
token the arithmetic is tiny next to that read, so on a GPU the compute units mostly wait. Scoring several
tokens in the same pass reads the weights once and uses some of the idle arithmetic: almost free.
A **draft** spends exactly that: it guesses *k* tokens cheaply, and the target checks all of them in one pass.
Below: the cost of one target pass on 1 token and on 8, then plain decoding against prompt lookup on a
prompt that repeats itself, counting target passes.""")
    r = live("idle", "Measure one pass, then decode 16 tokens both ways", walk.idle)
    if r:
        cost, plain, look, recs = r
        c = st.columns(3)
        c[0].metric("one pass, 1 token", f"{cost['small_ms']:.0f} ms")
        c[1].metric("one pass, 8 tokens", f"{cost['big_ms']:.0f} ms", f"×{cost['ratio']:.2f}", delta_color="off",
                    delta_arrow="off")
        c[2].metric("target passes for 16 tokens", f"{look.target_forwards} with lookup",
                    f"{plain.target_forwards} plain", delta_color="off", delta_arrow="off")
        (st.warning if cost["noisy"] else st.caption)(spread(cost, "8 tokens against 1"))
        if cost["ratio"] >= FREE_UP_TO:   # the lesson's "almost free" does not hold on this machine: say so here
            st.info(f"Measured: 8 tokens cost {cost['ratio']:.2f}× one, not about the same. "
                    f"{captions.row_cost(runs.target().backend.row_block)}. The idea still works, but each draft "
                    "must be kept more often to pay for its share of the pass.", icon=":material/memory:")
        chips(recs)
    quiz("idle", "Why can the target check k drafted tokens for about the price of one?",
         ["The draft model does the checking", "One pass reads the weights once, whatever the number of tokens",
          "The checked tokens skip the attention layers"], 1,
         "Decoding one token is bound by reading the weights, not by arithmetic, so extra tokens in the same pass "
         "ride along on compute that was idle.")

elif sec == "two":
    st.markdown("""
The classic setup pairs the target with a **smaller draft model**. It works, and it costs: the draft's weights
and its own KV cache take memory on the same device; it is a second model to build, deploy, version and monitor;
and it must share the target's **vocabulary**, because verification compares p(x) and q(x) for the same token id.
A draft that splits text into different tokens cannot be verified at all, and the pairing is refused.""")

    r = live("two", "Measure the draft's cost and try an incompatible pair", walk.two)
    if r:
        c = st.columns(3)
        c[0].metric("target parameters", f"{r['target'] / 1e6:.1f} M")
        if "draft" in r:
            c[1].metric("extra parameters for the draft", f"{r['draft'] / 1e6:.1f} M",
                        f"{2 * r['draft'] / 2**20:.0f} MiB more in bf16, plus its KV cache", delta_color="off",
                        delta_arrow="off")
            t = r["time"]
            c[2].metric("a drafted token's time, c", f"{t['small_ms'] / t['big_ms']:.2f} of a target step",
                        f"{t['small_ms']:.1f} ms against {t['big_ms']:.1f} ms", delta_color="off", delta_arrow="off")
            (st.warning if t["noisy"] else st.caption)(
                f"The median of {t['pairs']} rounds, each a target pass and then 4 draft passes, the order a "
                "decode step runs them in (so the draft reads its weights back after the target's pass); the "
                f"rounds' target/draft ratios ran from {t['ratio_min']:.1f}× to {t['ratio_max']:.1f}×"
                + (". **Noisy: rerun** (the machine is busy). " if t["noisy"] else ". ")
                + f"Each drafted token costs a draft pass, so a draft of k = 4 adds about "
                f"{4 * t['small_ms'] / t['big_ms']:.1f} target steps of drafting to every verification; the "
                "guesses it gets kept must pay for that (Leviathan et al. call this ratio c).")
        else:
            c[1].warning(r["draft_error"])
        st.markdown("**An incompatible pair, refused:**")
        st.error(r["refusal"])
    quiz("two", "Why must a draft model share the target's vocabulary?",
         ["So it can be trained faster", "Verification compares p(x) and q(x) for the same token id",
          "So both fit on one GPU"], 1,
         "The acceptance rule min(1, p(x)/q(x)) only makes sense when x means the same token to both models.")

elif sec == "variants":
    st.markdown("""
Drafts need not come from a second model. **Self-speculation** runs a cheaper slice of the target itself (here:
its first layers plus a small trained exit). **Multi-head drafting** (Medusa) bolts extra heads onto the target
that guess several tokens ahead at once, as a **tree** of alternatives verified in one pass. **Lookup** copies
the continuation of an n-gram already in the context: no network at all. Each is shown on a prompt where it shines.""")
    which = st.selectbox("Variant", list(walk.VARIANTS), key="wt_variant",
                         format_func=lambda n: f"{n}: {drafters.DESCRIPTIONS[n]}")
    wname, why = walk.VARIANTS[which]
    prompt = sidebar.PRESETS[wname].prompts[0]
    st.caption(f"Prompt ({why}): {prompt[:160]}{'…' if len(prompt) > 160 else ''}")
    r = live("variants", f"Decode {TOKENS} tokens with {which}", lambda: (which, run_drafter(which, prompt)))
    if r and r[0] == which:   # another variant's result is not this one's
        name, (_, recs, m) = r
        c = st.columns(3)
        c[0].metric("drafter", name)
        c[1].metric("acceptance rate", f"{m.acceptance_rate:.0%}")
        c[2].metric("mean acceptance length", f"{m.mean_acceptance_length:.2f}",
                    help="Tokens committed per verification step (one target pass), the bonus token counted; "
                         "plain decoding makes 1.")
        chips(recs)
    quiz("variants", "Which draft source needs no neural network at all?",
         ["Medusa heads", "Early exit", "Prompt lookup"], 2,
         "Lookup only searches the context for an n-gram and copies what followed it.")

elif sec == "exact":
    st.markdown("""
The target has the last word on every token. A drafted token x is kept with probability min(1, p(x)/q(x)); on
the first rejection the target draws a replacement from norm(max(0, p − q)), the part of its distribution the
draft under-covered. Adding the two paths gives exactly p(x) for every x: the text has **the target's
distribution**, whatever the draft (Leviathan et al. 2023, Thm. 1). With greedy decoding that means the
**same tokens**. Below, plain decoding and prompt lookup on the same prompt, token by token.

That is a theorem about the algorithm. An implementation also needs the target to score a position *bit for
bit* the same in a verify pass of k + 1 tokens as in a one-token step: otherwise the last bits of the logits
move, and where two tokens are nearly tied the argmax flips and the texts part. Serving engines sell this as a
mode (vLLM's batch-invariant mode, SGLang's deterministic inference) because it costs speed: their fastest
kernels pick their summation order by batch shape. This app's forward is written that way from the start
(fixed row blocking, attention over position-aligned key blocks), so speculation here is identical by
construction; the sidebar's *Forward* switch brings back transformers' own forward to see the difference, and
the **Output contract** page measures both.""")

    r = live("exact", f"Decode {TOKENS} tokens with and without the draft (greedy)", walk.exact)
    if r:
        a, b, recs, m = r
        same = a == b
        (st.success if same else st.warning)(
            f"{'Identical' if same else 'Different'}: {count(len(a), 'token')} plain, {len(b)} with lookup, "
            f"{count(m.steps, 'verification step')} instead of {len(a)}." + ("" if same else
            " Two nearly tied tokens rounded differently in a many-token pass: the forward, not the rule "
            "(the sidebar's Forward is set to transformers' reference)."))
        chips(recs)
    quiz("exact", "A bad draft is used. What happens to the output distribution?",
         ["It drifts toward the draft's", "It stays the target's; only speed suffers", "It becomes greedy"], 1,
         "Rejections correct every mistake with the residual distribution, so a bad draft costs time, never accuracy.")

elif sec == "workloads":
    st.markdown(f"""
The lesson's expectations are about speed. Each workload is decoded plainly and with the drafter that fits it
(the Drafter column), at its usual temperature, on two of its prompts ({TOKENS} tokens each), timed by the
measuring rule and judged exactly as the **Workloads** page judges it (the same function, on more prompts there):
High ≥ 1.5×, Moderate 1.15–1.5×, Low 1–1.15×. Batch serving is section 6's.""")
    r = live("workloads", "Measure each workload with its own drafter",
             lambda: walk.workload_rows(runs.target()))
    if r is not None:
        st.table(walk.workload_table(r))
        st.caption(f"{sum(x['lands'] for x in r)} of {len(r)} rows land in the lesson's category. Acceptance: the "
                   "share of drafted tokens the target kept; speed is what the category is about, acceptance what "
                   "drives it. Creative writing lands when Low or slower: the lesson says the overhead can exceed "
                   "the win.")
    quiz("workloads", "Why does high-temperature creative writing gain little?",
         ["The prompts are longer", "Hot sampling flattens p, so drafts rarely match what the target samples",
          "The draft refuses to run"], 1,
         "Acceptance falls when the target's distribution is flat, and the drafting overhead can exceed the win.")

elif sec == "batching":
    st.markdown("""
Batching many requests into each step is another way to turn idle arithmetic into work, and it needs no
acceptance luck. Once a batch fills the compute, verifying k extra tokens per request competes with other
requests: speculation is a **latency** tool for interactive, low-batch traffic, not a throughput tool for
saturated serving. Below: the cost of one target pass as the batch grows, with 1 token per request (plain)
and 5 (four drafts plus the bonus). On this CPU there is little idle arithmetic, so the gap shows early.""")

    r = live("batching", "Time target passes at batch 1, 4 and 8",
             lambda: passes.batch_cost(runs.target(), (1, 4, 8), (1, 5)))
    if r is not None:
        st.dataframe(walk.batch_table(r))
        grows = all(a["ratio"] < b["ratio"] for a, b in zip(r, r[1:]))
        noisy = sum(x["noisy"] for x in r)
        (st.warning if noisy or not grows else st.caption)(
            f"Each ratio is the median of {r[0]['pairs']} back-to-back pairs (order alternating) through the "
            "forward this app runs. *Verify / plain* is what 4 drafts cost over plain decoding in one pass; as it "
            "grows with the batch, the drafts must be accepted more often just to break even."
            + (f" **{noisy} of {len(r)} rows are noisy: rerun** (their pairs spread over "
               f"{NOISY:.0%}: the machine is busy)." if noisy else "")
            + ("" if grows else " **Here the ratio did not grow at every step: rerun on a quieter machine.**"))
    walkthrough_note()
    quiz("batching", "A server runs saturated batches all day. What should it expect from speculative decoding?",
         ["A large throughput gain", "Little or even a loss: the idle compute is already used by the batch",
          "Different output text"], 1,
         "At high load batching already spends the spare compute, so verification FLOPs compete with other requests.")

else:
    st.markdown("""
1. Enable speculation on a **copy of real traffic**, not a benchmark you picked.
2. Read the **acceptance rate** the engine reports.
3. Compare **TTFT, TPOT and throughput** against the baseline, same prompts, same process.
4. Check the **output contract**: fixed prompts, greedy on and off, diff the tokens.
5. Keep it only where the numbers earn it. Low acceptance is the workload telling you it is hard to draft.

The **Road to production** page runs this on the prompts you pick; here, two: one that repeats itself, one that
does not, with prompt lookup.""")
    st.page_link(HERE / "production.py", label="Open Road to production", icon=":material/rocket_launch:")
    TWO = [REPEAT, WORKLOADS["creative"].prompts[0]]

    def _check():
        tgt = runs.target()
        return checklist.run(tgt, lambda: drafters.make("lookup", tgt), TWO, k=4, max_new_tokens=16)
    r = live("checklist", "Run the checklist on two prompts (lookup, 16 tokens, 3 pairs each)", _check)
    if r:
        st.markdown(checklist.verdict(r))
        st.table(checklist.table(r, by_prompt=True))
    quiz("checklist", "Acceptance is 15 % on your traffic. What does it tell you?",
         ["The implementation is broken", "This workload is hard to draft: keep speculation off here",
          "Increase k until it improves"], 1,
         "A low acceptance rate is the technique reporting that the text is not predictable enough to draft.")

