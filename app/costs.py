"""Where the time went: a run's step split into draft, the target's verify pass and the bookkeeping, set
against one plain decoding step, so an acceptance rate and a speedup explain each other.

The split and the step accounting are the cost profile's (specdec_core/bench/profile.py: steady steps, every
phase a slice of the time between two records, the first step left out because it holds the prefill). A step
commits several tokens, so what decides the race is the cost per committed token: a speculative step's ms over
its tokens, against a plain step's ms (one token each). That ratio is the profile's cost-model speedup.
"""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from specdec_core import drafters as entries
from specdec_core.bench import profile
from specdec_core.metrics import RunMetrics
from specdec_core.records import StepRecord

from .view import GREY, ORANGE, P_COLOR, PURPLE

# (name, profile key, colour): the pieces of a step; bookkeeping = the acceptance rule and the commit
PIECES = (("draft", "draft_ms", PURPLE), ("verify pass (target forward)", "score_ms", P_COLOR),
          ("bookkeeping (rule + commit)", "rule_ms", ORANGE), ("loop", "bookkeeping_ms", GREY))


def split(records: list[StepRecord]) -> dict:
    """Mean ms per steady step of each piece (profile.phase_ms), the rule and the commit summed, plus tokens
    committed per step over the same steps."""
    steps = profile.steady([records])
    ms = profile.phase_ms(steps)
    ms["rule_ms"] = ms["verify_ms"] + ms["commit_ms"]
    ms["tokens_per_step"] = sum(len(r.committed) for r, _ in steps) / len(steps)
    ms["steps"] = len(steps)
    return ms


def per_step(rec: StepRecord) -> dict:
    """One step's own pieces in ms (the loop's share is only known between two records)."""
    return {"draft_ms": 1e3 * rec.t_draft, "score_ms": 1e3 * rec.t_score,
            "rule_ms": 1e3 * (rec.t_verify + rec.t_commit), "bookkeeping_ms": 0.0,
            "step_ms": 1e3 * (rec.t_draft + rec.t_score + rec.t_verify + rec.t_commit),
            "tokens_per_step": float(len(rec.committed))}


def predicted(spec: dict, plain: dict) -> float:
    """Speedup from the costs alone: plain ms per token over speculative ms per token (profile's cost model)."""
    return spec["tokens_per_step"] * plain["step_ms"] / spec["step_ms"] if spec["step_ms"] else 0.0


def figure(spec: dict, plain: dict, title: str) -> go.Figure:
    """Stacked bars: a plain step and a speculative step, then each per committed token."""
    rows = [("plain: one step", plain, 1.0), ("speculative: one step", spec, 1.0),
            ("plain: per token", plain, 1.0), ("speculative: per token", spec, spec["tokens_per_step"] or 1.0)]
    fig = go.Figure()
    for name, key, color in PIECES:
        x = [d.get(key, 0.0) / n for _, d, n in rows]
        fig.add_bar(y=[r[0] for r in rows], x=x, name=name, orientation="h", marker_color=color,
                    hovertemplate="%{y}: " + name + " %{x:.1f} ms<extra></extra>")
    tot = [d["step_ms"] / n for _, d, n in rows]
    fig.add_scatter(y=[r[0] for r in rows], x=tot, mode="text", text=[f"  {t:.1f} ms" for t in tot],
                    textposition="middle right", showlegend=False, hoverinfo="skip")
    fig.update_layout(barmode="stack", height=290, title=dict(text=title, font=dict(size=15)),
                      margin=dict(l=10, r=60, t=40, b=10), xaxis=dict(title="ms", range=[0, 1.25 * max(tot)]),
                      yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.42, yanchor="top", x=0),
                      font=dict(size=13))
    return fig


def sentence(spec: dict, plain: dict, acceptance: float | None = None) -> str:
    """The breakdown in words: what a step costs against a plain one, its mean acceptance length, what a token
    costs. No speedup of its own: the page's one speedup is the measured one, and this says where it comes from."""
    x = spec["step_ms"] / plain["step_ms"] if plain["step_ms"] else 0.0
    per = spec["step_ms"] / spec["tokens_per_step"] if spec["tokens_per_step"] else 0.0
    acc = f"{acceptance:.0%} of the guesses accepted; " if acceptance is not None else ""
    return (f"{acc}a speculative step costs **{spec['step_ms']:.1f} ms** ({x:.2f}× a plain step of "
            f"{plain['step_ms']:.1f} ms: draft {spec['draft_ms']:.1f}, verify pass {spec['score_ms']:.1f}, "
            f"bookkeeping {spec['rule_ms'] + spec['bookkeeping_ms']:.1f}) and its mean acceptance length is "
            f"**{spec['tokens_per_step']:.2f}**, so a token costs **{per:.1f} ms** against "
            f"{plain['step_ms']:.1f} ms plain. These are the steady steps: the first step, which also processes "
            f"the prompt, is left out here and counted in the speedup.")


def render(records: list[StepRecord], plain: dict | None, title: str, key: str,
           acceptance: float | None = None) -> None:
    """The breakdown of a run (or one step: pass [record] after per_step) against plain decoding's `plain`
    (split of its records); says so plainly when no plain run was timed."""
    if plain is None:
        st.caption("Where the time went needs a plain run on the same prompt to compare with (none finished).")
        return
    spec = split(records)
    st.plotly_chart(figure(spec, plain, title), key=key)
    st.markdown(sentence(spec, plain, acceptance))


def step_line(rec: StepRecord, plain: dict | None) -> str:
    """One step's pieces in one line, against a plain step (this step's own timings: one run, unpaired)."""
    d = per_step(rec)
    base = f" · a plain step: {plain['step_ms']:.1f} ms" if plain else ""
    return (f"This step: draft {d['draft_ms']:.1f} ms · verify pass {d['score_ms']:.1f} ms · bookkeeping "
            f"{d['rule_ms']:.1f} ms → {len(rec.committed)} token{'s' if len(rec.committed) != 1 else ''}{base}.")


def ttft_tpot(spec: RunMetrics, plain: RunMetrics) -> list[dict]:
    """Time to first token and time per output token, speculation on and off (one pair, as replayed)."""
    return [{"": "speculation on", "TTFT ms": 1e3 * spec.ttft_s, "TPOT ms": 1e3 * spec.tpot_s,
             "tokens/s": spec.tokens_per_s},
            {"": "speculation off", "TTFT ms": 1e3 * plain.ttft_s, "TPOT ms": 1e3 * plain.tpot_s,
             "tokens/s": plain.tokens_per_s}]



def ttft_note(spec: RunMetrics, plain: RunMetrics, drafter: str) -> str:
    """Why speculation's time to first token is longer, where it is: its first step drafts and verifies before it
    commits its first token, and some drafters' prompt reading does more than the target's."""
    if spec.ttft_s <= plain.ttft_s:
        return ""
    e = entries.entry(drafter)
    feed = (" Its prompt reading also feeds the drafter: the draft model reads the prompt too." if e.draft_model
            else " Its prompt reading also keeps the target's hidden states for the drafter's heads."
            if e.reads_hidden else "")
    return (f"Speculation's first token comes later ({1e3 * spec.ttft_s:.1f} against {1e3 * plain.ttft_s:.1f} ms): "
            "after reading the prompt, its first step drafts and runs a verify pass over the guesses before it "
            "commits its first token, where plain decoding commits one after the prompt's pass." + feed
            + (" It makes that up after, committing several tokens per pass (a lower TPOT)."
               if spec.tpot_s < plain.tpot_s else ""))
