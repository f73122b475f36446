"""The Step by step page's panels under its replay controls: the step itself (a chain's verify table and
p/q bars, or a tree drawn with its attention mask and walk), the drafter's note, where the time went, and the
metrics (tokens, acceptance, the speedup of this one run, marked as one unpaired run)."""
from __future__ import annotations

import streamlit as st

from specdec_core.drafters import entry
from specdec_core.records import StepRecord

from . import captions, costs, frames, tree_view, view
from .frames import Frame

NAMES = ["Acceptance rate", "Mean acceptance length", "Tokens/s", "Target forward passes", "Speedup"]
ONE_RUN = ("One run against one plain run, unpaired: on a shared or busy machine the same settings can land "
           "anywhere from well under 1× to well over 2×. The **Race** quotes the median of paired repeats "
           "(the measuring rule); the breakdown below says where the time went.")
PART = ("Shown for the whole run only: the first steps also carry the prompt's processing, so a speedup through "
        "them would compare a part against plain decoding's whole")


def step_view(prompt: str, recs: list[StepRecord], i: int, fr: Frame, greedy: bool) -> None:
    """The step at frame fr: context and drafts on the left, the figure for the phase on the right."""
    rec = recs[i]
    if rec.tree is not None:
        return tree_step(prompt, recs, i, fr, greedy)
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.html(view.context_strip(prompt, recs, i, fr))
        if rec.k and fr.phase != frames.DRAFT:
            st.html(view.verify_table(rec, fr, greedy))
        drafter_info(rec)
    with right:
        if fr.phase == frames.VERIFY:
            st.plotly_chart(view.pq_figure(rec.positions[fr.checked - 1], fr.checked - 1), key="chart")
        elif fr.phase == frames.RESULT:
            st.plotly_chart(view.result_figure(rec), key="chart")
        elif rec.k and rec.positions[fr.shown - 1].q_top:
            pos = rec.positions[fr.shown - 1]
            st.plotly_chart(view.bars([("q: draft", pos.q_top, view.Q_COLOR)], pos.token,
                                      f"What the drafter believed for draft #{fr.shown}"), key="chart")
        elif rec.k:
            st.info(captions.no_q(rec))


def tree_step(prompt: str, recs: list[StepRecord], i: int, fr: Frame, greedy: bool) -> None:
    """A tree step: the tree (growing, then walked), the trials so far and what each was tested against;
    the attention mask beside the tree while drafting."""
    rec = recs[i]
    chain = Frame(frames.RESULT, rec.k, frames.n_checked(rec)) if fr.phase == frames.RESULT else Frame(frames.DRAFT, 0, 0)
    st.html(view.context_strip(prompt, recs, i, chain))
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.plotly_chart(tree_view.tree_figure(rec, fr), key="tree")
    with right:
        if fr.phase == frames.VERIFY:
            st.plotly_chart(tree_view.trial_figure(rec, fr), key="chart")
        elif fr.phase == frames.RESULT:
            st.plotly_chart(view.result_figure(rec), key="chart")
        else:
            st.plotly_chart(tree_view.mask_figure(rec.tree), key="mask")
    if fr.phase != frames.DRAFT:
        st.html(tree_view.trial_table(rec, fr, greedy))
    drafter_info(rec, fr.phase == frames.RESULT)


def drafter_info(rec: StepRecord, verdict: bool = True) -> None:
    """Drafter-specific extras, shown when present (the n-gram match; the suffix match; a tree's size and, once
    the `verdict` is out, its accepted path)."""
    info, bits = rec.info, []
    if "ngram" in info:
        bits.append(f"matched a {info['ngram']}-token n-gram at position {info.get('match_at', '?')}")
    if info.get("match"):
        n = info.get("occurrences", 0)
        bits.append(f"the last {captions.count(info['match'], 'token')} were seen {captions.count(n, 'time')} "
                    "before in this "
                    "session; their continuations make the tree")
    if rec.tree is not None:
        bits.append(f"a tree of {captions.count(rec.tree.drafted, 'candidate')} over "
                    f"{captions.count(rec.tree.depth, 'position')}"
                    + (f"; the accepted path kept {len(rec.tree.path)}" if verdict else ""))
    if bits:
        st.caption("Drafter: " + "; ".join(bits) + ".")


def metrics(recs: list[StepRecord], step: int, baseline, plain: dict | None) -> None:
    """The same figures for every phase of a step: the run through this step, and the whole run; then where
    the time went, for this step and for the run."""
    st.markdown(f"##### Metrics through step {step + 1} of {len(recs)}")
    _row(frames.running(recs, step), f"steps 1–{step + 1}", baseline, speedup=step == len(recs) - 1)
    st.markdown(f"##### Whole run: {captions.count(len(recs), 'step')}, "
                f"{captions.count(recs[-1].n_generated, 'token')}")
    m = frames.running(recs, len(recs) - 1)
    _row(m, "the whole run", baseline)
    st.caption(":material/warning: **Speedup** — " + ONE_RUN)
    st.markdown("##### Where the time went")
    st.caption(costs.step_line(recs[step], plain))
    if entry(recs[-1].drafter).drafts:
        costs.render(recs, plain, "The whole run: a step and a token, plain against speculative", "costs",
                     m.acceptance_rate if m.drafted else None)


def _row(m, span: str, base, speedup: bool = True) -> None:
    """The metrics over `span`; the speedup only where it is one (the whole run against the whole plain run)."""
    cols = st.columns(len(NAMES))
    cols[0].metric(NAMES[0], f"{m.acceptance_rate:.0%}" if m.drafted else "—",
                   help=f"Accepted drafted tokens / drafted tokens ({m.accepted} / {m.drafted}), {span}")
    cols[1].metric(NAMES[1], f"{m.mean_acceptance_length:.2f}",
                   help=f"Tokens committed per verification step, {span} (plain decoding: 1.00)")
    cols[2].metric(NAMES[2], f"{m.tokens_per_s:.1f}", help=f"{span.capitalize()}, prompt processing included")
    cols[3].metric(NAMES[3], f"{m.target_forwards}",
                   help=f"For {captions.count(m.tokens, 'token')}, {span}; plain decoding needs one pass per token")
    if not speedup:
        cols[4].metric(NAMES[4], "—", help=PART + ".")
        return
    cols[4].metric(NAMES[4], f"{m.tokens_per_s / base.tokens_per_s:.2f}×" if base and base.tokens_per_s else "—",
                   help=f"One run: tokens/s over {span} divided by tokens/s of one plain run on the same prompt and "
                        "settings" + (f" ({base.tokens_per_s:.1f} tokens/s). " if base else
                                      " (not measured: stopped early). ") + ONE_RUN)
