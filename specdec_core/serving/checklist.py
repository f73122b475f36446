"""The lesson's production checklist as a procedure: fixed prompts, greedy decoding with speculation off and
on, a token diff, and acceptance, TTFT, TPOT and throughput against the plain baseline, as a report.

Greedy decoding makes the two outputs comparable token by token: the exactness theorem (Leviathan et al.
2023, Thm. 1) says they are the same sequence, so any difference is the implementation: under transformers'
forward, a near-tie in bf16 that a many-token and a one-token pass round differently; our own forward scores
a position the same in both.
"""
from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from specdec_core import SamplingParams, drafters, engine
from specdec_core.bench.invariance import difference, first_difference


@dataclass
class PromptResult:
    prompt: str
    base_ids: list[int]
    spec_ids: list[int]
    base: object               # RunMetrics
    spec: object               # RunMetrics

    @property
    def first_diff(self) -> int | None:
        """Index of the first differing token (bench.invariance.first_difference), None when identical."""
        return first_difference(self.base_ids, self.spec_ids)


def run(target, make_drafter, prompts: list[str], k: int, max_new_tokens: int, on_step=None) -> list[PromptResult]:
    """Greedy, plain then speculative, on each prompt; `on_step(i, n)` reports progress."""
    if not prompts:
        raise ValueError("the checklist needs at least one prompt")
    sp = SamplingParams(temperature=0.0)
    out = []
    for i, text in enumerate(prompts):
        ids = target.encode(text).tolist()
        b_ids, _, b = engine.run(target, drafters.make("none", target), ids, sp=sp, k=0, max_new_tokens=max_new_tokens)
        s_ids, _, s = engine.run(target, make_drafter(), ids, sp=sp, k=k, max_new_tokens=max_new_tokens)
        out.append(PromptResult(text, b_ids, s_ids, b, s))
        if on_step:
            on_step(i + 1, len(prompts))
    return out


def table(results: list[PromptResult]) -> pd.DataFrame:
    rows = []
    for n, r in enumerate(results, 1):
        rows.append({"prompt": n, "tokens": r.spec.tokens,
                     "greedy tokens": difference(r.base_ids, r.spec_ids),
                     "acceptance rate": round(r.spec.acceptance_rate, 3),
                     "mean acceptance length": round(r.spec.mean_acceptance_length, 2),
                     "TTFT ms (base / spec)": f"{r.base.ttft_s * 1e3:.0f} / {r.spec.ttft_s * 1e3:.0f}",
                     "TPOT ms (base / spec)": f"{r.base.tpot_s * 1e3:.1f} / {r.spec.tpot_s * 1e3:.1f}",
                     "tokens/s (base / spec)": f"{r.base.tokens_per_s:.1f} / {r.spec.tokens_per_s:.1f}",
                     "speedup": round(r.spec.tokens_per_s / r.base.tokens_per_s, 2) if r.base.tokens_per_s else 0.0})
    return pd.DataFrame(rows).set_index("prompt")


def verdict(results: list[PromptResult]) -> str:
    same = sum(r.first_diff is None for r in results)
    speed = [r.spec.tokens_per_s / r.base.tokens_per_s for r in results if r.base.tokens_per_s]
    mean = sum(speed) / len(speed) if speed else 0.0
    keep = "keep it for this traffic" if mean > 1.0 else "the numbers do not earn it for this traffic"
    return (f"{same} of {len(results)} prompts gave identical greedy tokens; mean speedup {mean:.2f}x: {keep}.")


def figure(results: list[PromptResult]) -> go.Figure:
    x = [f"prompt {i}" for i in range(1, len(results) + 1)]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r.base.tokens_per_s for r in results], name="baseline (no draft)", marker_color="#546e7a")
    fig.add_bar(x=x, y=[r.spec.tokens_per_s for r in results], name="speculative", marker_color="#2e7d32")
    fig.update_layout(barmode="group", height=320, yaxis_title="tokens/s", margin=dict(l=10, r=10, t=30, b=10),
                      title="Throughput against the baseline, same prompts, greedy")
    return fig


def md_table(df: pd.DataFrame) -> str:
    cols = [df.index.name or ""] + list(df.columns)
    rows = [[str(i)] + [str(v) for v in row] for i, row in zip(df.index, df.itertuples(index=False))]
    return "\n".join("| " + " | ".join(r) + " |" for r in [cols, ["---"] * len(cols)] + rows)


def report_markdown(settings, results: list[PromptResult], engines_md: str = "") -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Speculative decoding checklist report", "", f"Generated {when} by specdec.", "",
             f"Settings: {settings.summary()} (the checklist always decodes greedily).", "",
             "## Verdict", "", verdict(results), "", "## Per prompt", "", md_table(table(results)), "",
             "## Prompts", ""]
    lines += [f"{i}. {r.prompt!r}" for i, r in enumerate(results, 1)]
    lines += ["", "## Token diff", ""]
    for i, r in enumerate(results, 1):
        d = r.first_diff
        lines.append(f"- prompt {i}: " + ("identical" if d is None else
                     f"first difference at token {d + 1}: baseline id {r.base_ids[d] if d < len(r.base_ids) else '-'}"
                     f", speculative id {r.spec_ids[d] if d < len(r.spec_ids) else '-'}"))
    if engines_md:
        lines += ["", "## The same settings in serving engines", "", engines_md]
    return "\n".join(lines) + "\n"


def report_html(settings, results: list[PromptResult], engines_md: str = "") -> str:
    """The Markdown report with the throughput plot above it, as one self-contained page: plotly.js is
    embedded (about 5 MB) rather than fetched from a CDN, so the report opens offline."""
    md = report_markdown(settings, results, engines_md)
    plot = figure(results).to_html(full_html=False, include_plotlyjs=True)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>specdec checklist report</title></head>"
            f"<body style='font-family:sans-serif;max-width:960px;margin:auto'>{plot}"
            f"<pre style='white-space:pre-wrap'>{html.escape(md)}</pre></body></html>")
