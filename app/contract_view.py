"""The Output contract page's drawings (pages/contract.py): tokens identical to plain decoding per prompt, where
a greedy text parts from plain decoding, and the histograms of first tokens sampled with and without speculation
beside the target's exact probabilities (specdec_core.bench.contract)."""
from __future__ import annotations

import html

import plotly.graph_objects as go

from . import measure
from .view import show

SHOWN = 12          # histogram bars: the most frequent outcomes, the rest pooled as "other"


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


def forward_row(prompt: str, d, probe: int | None, names: dict[str, str], tick=None) -> dict:
    """One row of the forwards' table from bench.contract.forward_check's (prompt, drift, probe); `names` are the
    forwards' display names; `tick(what)` for the progress bar."""
    if tick:
        tick(f"{prompt}, {names[d.forward]}")
    return {"Prompt": prompt, "Forward": names[d.forward], "Identical": d.identical,
            "First difference at token": d.position,
            "Tokens there (plain / spec)": f"{show(d.plain_token)} / {show(d.spec_token)}" if d.position
            is not None else "",
            "Top-2 logit gap": d.top_gap if probe is not None else None,
            "1-token vs (k+1)-token logit difference": d.scoring_diff if probe is not None else None}


def diff_html(tgt, plain: list[int], spec: list[int], j: int | None) -> str:
    dec = tgt.tokenizer.decode
    if j is None:
        return f'<div class="strip">{html.escape(dec(plain))}</div>'
    head = html.escape(dec(plain[:j]))
    a, b = show(dec(plain[j:])), show(dec(spec[j:]))
    return (f'<div class="strip"><b>plain:</b> {head}<span class="tok tok-rejected" style="text-decoration:none">'
            f'{a}</span><br><b>spec:</b> {head}<span class="tok tok-accepted">{b}</span></div>')


def outcome(tgt, t: tuple[int, ...]) -> str:
    return "·".join(show(tgt.tokenizer.decode([i])) for i in t) or "∅"


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
