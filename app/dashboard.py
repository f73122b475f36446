"""The acceptance dashboard's charts (bench/dashboard.py measures them): acceptance rate and mean acceptance length
over time beside speedup over time, and TTFT and TPOT over time, each with the prompt-template change drawn as a
line between the windows before and after it."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import measure

SPEC = "#2e7d32"       # the drafter's line (measure.COLORS' lookup)
PLAIN = "rgba(84,110,122,0.55)"   # plain decoding, drawn fainter: the machine's own speed
ACCEPT = "#6a1b9a"
CHANGE = "#b71c1c"


def change_at(rows: list[dict]) -> float | None:
    """The x where the template changed: halfway between the last window before and the first after."""
    before = [r["window"] for r in rows if r["phase"] == "before"]
    after = [r["window"] for r in rows if r["phase"] == "after"]
    if before and after:
        return (max(before) + min(after)) / 2
    return max(before) + 0.5 if before else None


def mark(fig: go.Figure, rows: list[dict], cols: int) -> None:
    """The template change as a dashed line through every panel, labelled once; each phase's template on hover."""
    x = change_at(rows)
    if x is None:
        return
    for c in range(1, cols + 1):   # plotly labels a line given any annotation keyword: only the first gets them
        label = dict(annotation_text="template change", annotation_position="top right",
                     annotation_font_color=CHANGE) if c == 1 else {}
        fig.add_vline(x=x, line_dash="dash", line_color=CHANGE, line_width=2, row=1, col=c, **label)


def axes(fig: go.Figure, rows: list[dict], cols: int) -> None:
    last = max([r["window"] for r in rows], default=1)
    fig.update_xaxes(title="window of requests (time →)", dtick=1, range=[0.5, max(last, 2) + 0.5])
    mark(fig, rows, cols)


def acceptance_figure(rows: list[dict]) -> go.Figure:
    """Left: acceptance rate (95% whiskers) and mean acceptance length on its own axis; right: speedup (whiskers:
    the paired repeats' min-max), break-even dashed."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, specs=[[{"secondary_y": True}, {}]],
                        subplot_titles=["acceptance rate and mean acceptance length", "speedup (× plain tokens/s)"])
    x = [r["window"] for r in rows]
    hover = [r["template"] for r in rows]
    fig.add_scatter(x=x, y=[r["acceptance_rate"] for r in rows], name="acceptance rate", mode="lines+markers",
                    line=dict(color=ACCEPT, width=3), marker=dict(size=10), error_y=measure.acceptance_error(rows),
                    customdata=hover, hovertemplate="window %{x}: %{y:.0%}<br>%{customdata}<extra></extra>",
                    row=1, col=1)
    fig.add_scatter(x=x, y=[r["mean_acceptance_length"] for r in rows], name="mean acceptance length",
                    mode="lines+markers", line=dict(color=ACCEPT, width=2, dash="dot"), marker=dict(symbol="square"),
                    hovertemplate="window %{x}: %{y:.2f} tokens a step<extra></extra>", row=1, col=1,
                    secondary_y=True)
    fig.add_scatter(x=x, y=[r["speedup"] for r in rows], name="speedup", mode="lines+markers",
                    line=dict(color=SPEC, width=3), marker=dict(size=10), error_y=measure.speed_error(rows),
                    customdata=hover, hovertemplate="window %{x}: %{y:.2f}×<br>%{customdata}<extra></extra>",
                    row=1, col=2)
    measure.noisy_marks(fig, rows, "window", row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#90a4ae", row=1, col=2)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], title="acceptance", row=1, col=1, secondary_y=False)
    top = max([r["mean_acceptance_length"] for r in rows] + [2.0])
    fig.update_yaxes(range=[0, top * 1.1], title="tokens a step", showgrid=False, row=1, col=1, secondary_y=True)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    axes(fig, rows, 2)
    return measure.layout(fig, 430, below=True)


def latency_figure(rows: list[dict]) -> go.Figure:
    """TTFT and TPOT over time, speculative and plain decoding (fainter) on the same requests."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["TTFT (ms, prefill included)", "TPOT (ms per later token)"])
    x = [r["window"] for r in rows]
    for c, (spec, base) in enumerate((("ttft_ms", "baseline_ttft_ms"), ("tpot_ms", "baseline_tpot_ms")), 1):
        fig.add_scatter(x=x, y=[r[spec] for r in rows], name="speculative", legendgroup="spec", showlegend=c == 1,
                        mode="lines+markers", line=dict(color=SPEC, width=3), marker=dict(size=9),
                        hovertemplate="window %{x}: %{y:.0f} ms<extra>speculative</extra>", row=1, col=c)
        fig.add_scatter(x=x, y=[r[base] for r in rows], name="plain decoding", legendgroup="plain",
                        showlegend=c == 1, mode="lines+markers", line=dict(color=PLAIN, width=2, dash="dot"),
                        hovertemplate="window %{x}: %{y:.0f} ms<extra>plain</extra>", row=1, col=c)
    fig.update_yaxes(rangemode="tozero")
    axes(fig, rows, 2)
    return measure.layout(fig, 380, below=True)
