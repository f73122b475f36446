"""The measurement pages' charts (plotly), one function per chart: each page lays out its controls and its
table and hands its rows here. Rows are as `specdec_core.bench` yields them (speedup, acceptance, the measuring
rule's spread); colours, layout and the noise marks come from measure.py."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specdec_core.bench import reference
from specdec_core.bench.theory import expected_speedup, expected_tokens_per_step, theory
from specdec_core.bench.workloads import WORKLOADS
from specdec_core.drafters import PLAIN

from . import measure

# the Temperature page's three panels: (row key, title, hover format)
TEMPERATURE_PANELS = [("acceptance_rate", "acceptance rate", ".0%"),
                      ("mean_acceptance_length", "mean acceptance length", ".2f"), ("speedup", "speedup (×)", ".2f")]


def batch_figure(rows: list[dict], sizes: list[int]) -> go.Figure:
    """The Batch size page: throughput and speedup against the batch size, plain decoding dashed; `sizes` are
    the ticks."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["throughput (tokens/s, all requests)", "speedup (×)"],
                        horizontal_spacing=0.08)
    base = {}
    for r in rows:   # plain decoding is measured beside each drafter: show the mean per batch size
        base.setdefault(r["batch_size"], []).append(r["baseline_tokens_per_s"])
    xs = sorted(base)
    fig.add_scatter(x=xs, y=[sum(base[b]) / len(base[b]) for b in xs], name="plain (none)", mode="lines+markers",
                    line=dict(color=measure.BASE_COLOR, width=3, dash="dash"), marker=dict(size=10), row=1, col=1)
    for d in dict.fromkeys(r["drafter"] for r in rows):
        rs = [r for r in rows if r["drafter"] == d]
        c = measure.color(d)
        fig.add_scatter(x=[r["batch_size"] for r in rs], y=[r["tokens_per_s"] for r in rs], name=d,
                        legendgroup=d, mode="lines+markers", line=dict(color=c, width=3), marker=dict(size=10),
                        row=1, col=1)
        fig.add_scatter(x=[r["batch_size"] for r in rs], y=[r["speedup"] for r in rs], name=d, legendgroup=d,
                        showlegend=False, mode="lines+markers+text", line=dict(color=c, width=3),
                        marker=dict(size=10), text=[f"{r['speedup']:.2f}×" for r in rs],
                        # away from the 1× line and beside the whisker, on the side the line does not run
                        textposition=["top right" if r["speedup"] >= 1 else "bottom left" for r in rs],
                        cliponaxis=False, row=1, col=2, error_y=measure.speed_error(rs))
        measure.noisy_marks(fig, rs, "batch_size", row=1, col=2)
    # the line is named on its axis, not beside it, where a point's own label near 1× would land on it
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c", row=1, col=2)
    fig.update_yaxes(title="speedup (dashed: break-even, 1×)", row=1, col=2)
    fig.update_xaxes(title="batch size (requests decoded together)", type="log", tickvals=sizes,
                     ticktext=[str(b) for b in sizes])
    fig.update_yaxes(rangemode="tozero")
    return measure.layout(fig, 470, below=True)


def draft_length_figure(rows: list[dict], ks: list[int]) -> go.Figure:
    """The Draft length page: measured speedup beside the formula's, mean acceptance length, and acceptance
    at each draft position, per drafter; an adaptive policy's point (a row with "k_policy") as a level line.
    `ks` are the draft lengths asked for."""
    adaptive, rows = [r for r in rows if "k_policy" in r], [r for r in rows if "k_policy" not in r]
    if not rows:
        return measure.layout(go.Figure(), 480)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=["speedup (×): measured vs predicted", "mean acceptance length",
                                        "acceptance at each draft position"])
    th = theory(rows)
    kmax = max(max(ks, default=1), max(r["k"] for r in rows))
    grid = list(range(0, kmax + 1))
    for d, t in th.items():
        rs = [r for r in rows if r["drafter"] == d]
        c = measure.color(d)
        fig.add_scatter(x=grid, y=[expected_speedup(t["alpha"], k, t["c"]) for k in grid], mode="lines",
                        line=dict(color=c, width=2, dash="dot"), name=f"{d}: predicted (α={t['alpha']:.2f}, "
                        f"c={t['c']:.3f})", legendgroup=d, row=1, col=1)
        fig.add_scatter(x=[r["k"] for r in rs], y=[r["speedup"] for r in rs], mode="markers",
                        marker=dict(color=c, size=12), name=f"{d}: measured", legendgroup=d, row=1, col=1,
                        error_y=measure.speed_error(rs))
        measure.noisy_marks(fig, rs, "k", row=1, col=1)
        fig.add_scatter(x=grid, y=[expected_tokens_per_step(t["alpha"], k) for k in grid], mode="lines",
                        line=dict(color=c, width=2, dash="dot"), showlegend=False, legendgroup=d, row=1, col=2)
        fig.add_scatter(x=[r["k"] for r in rs], y=[r["mean_acceptance_length"] for r in rs], mode="markers",
                        marker=dict(color=c, size=12), showlegend=False, legendgroup=d, row=1, col=2)
        n = max(len(r["per_position_tried"]) for r in rs)
        tried, ok = [0] * n, [0.0] * n
        for r in rs:
            for i, (a, m) in enumerate(zip(r["per_position_acceptance"], r["per_position_tried"])):
                tried[i] += m
                ok[i] += a * m
        pos = [i for i in range(n) if tried[i]]
        fig.add_bar(x=[i + 1 for i in pos], y=[ok[i] / tried[i] for i in pos], marker_color=c, name=d,
                    showlegend=False, legendgroup=d, customdata=[tried[i] for i in pos],
                    hovertemplate="position %{x}: %{y:.0%} of %{customdata} drafts kept<extra>" + d + "</extra>",
                    row=1, col=3)
        fig.add_scatter(x=[i + 1 for i in pos], y=[t["alpha"] ** (i + 1) for i in pos], mode="lines+markers",
                        line=dict(color=c, dash="dot"), showlegend=False, legendgroup=d,
                        hovertemplate="α^%{x} = %{y:.0%}<extra>" + d + ": predicted</extra>", row=1, col=3)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c", row=1, col=1)
    fig.update_xaxes(title="k (tokens drafted per step)", dtick=1, row=1, col=1)
    fig.update_xaxes(title="k", dtick=1, row=1, col=2)
    fig.update_xaxes(title="draft position (1 = first guess)", dtick=1, row=1, col=3)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    # a policy has no single k: a level line across the fixed-k points, its figure in the legend (a label on the
    # chart would land on the prediction's curve or on the other policy's line)
    for r in adaptive:
        fig.add_scatter(x=[grid[0], grid[-1]], y=[r["speedup"]] * 2, mode="lines", row=1, col=1,
                        line=dict(color=measure.color(r["drafter"]), width=2,
                                  dash="dash" if r["k_policy"] == "schedule" else "dashdot"),
                        name=f"{r['drafter']}: {r['k_policy']} (adaptive) {r['speedup']:.2f}×",
                        legendgroup=r["drafter"])
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=1, col=3)
    return measure.layout(fig, 480, below=True, barmode="group")


def drafters_figure(rows: list[dict], ref: dict | None) -> go.Figure:
    """The All drafters page: each drafter's speedup (the recorded reference run `ref` faint behind it) and
    where its step's time went against a plain step."""
    rows = [r for r in rows if r["drafter"] != PLAIN]
    refs = reference.rows_by(ref, "drafters", "drafter")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=["speedup (× plain tokens/s)", "ms per step: where the time went"])
    names = [r["drafter"] for r in rows]
    if refs:
        rr = [refs[n] for n in names if n in refs]
        fig.add_bar(x=[r["drafter"] for r in rr], y=[r["speedup"] for r in rr], name=reference.label(ref),
                    marker=dict(color="rgba(96,125,139,0.22)", line=dict(color="rgba(96,125,139,0.6)", width=1)),
                    row=1, col=1)
    fig.add_bar(x=names, y=[r["speedup"] for r in rows], name="measured now", row=1, col=1,
                marker_color=[measure.color(n) for n in names], error_y=measure.speed_error(rows),
                text=[f"{r['speedup']:.2f}×" + (" noisy" if r["noisy"] else "") for r in rows],
                textposition="outside", cliponaxis=False, constraintext="none")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c", row=1, col=1)
    base = [0.0] * len(rows)
    for key, lab, col in (("draft_ms", "draft", "#ef6c00"), ("score_ms", "verify pass", "#1565c0"),
                          ("other_ms", "verify rule, commit, loop", "#b0bec5")):
        ys = [r[key] for r in rows]   # stacked by hand: the left panel's bars are grouped
        fig.add_bar(x=names, y=ys, base=base, name=lab, marker_color=col, offsetgroup="ms", row=1, col=2,
                    hovertemplate="%{x}: %{y:.1f} ms<extra>" + lab + "</extra>")
        base = [b + y for b, y in zip(base, ys)]
    if rows:
        fig.add_hline(y=rows[0]["plain_step_ms"], line_dash="dot", line_color="#37474f", row=1, col=2,
                      annotation_text=f"plain step {rows[0]['plain_step_ms']:.1f} ms", annotation_position="top left")
    fig.update_yaxes(rangemode="tozero")
    return measure.layout(fig, 440, below=True, barmode="group")


def temperature_figure(rows: list[dict]) -> go.Figure:
    """The Temperature page: acceptance rate, mean acceptance length and speedup against the temperature, one
    line per drafter (greedy drafting dotted)."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in TEMPERATURE_PANELS], horizontal_spacing=0.07)
    for d in dict.fromkeys(r["drafter"] for r in rows):
        rs = [r for r in rows if r["drafter"] == d]
        bars = {"acceptance_rate": measure.acceptance_error(rs), "speedup": measure.speed_error(rs)}
        for j, (col, _, fmt) in enumerate(TEMPERATURE_PANELS, 1):
            fig.add_scatter(x=[r["temperature"] for r in rs], y=[r[col] for r in rs], name=d, legendgroup=d,
                            showlegend=j == 1, mode="lines+markers", marker=dict(size=10), error_y=bars.get(col),
                            line=dict(color=measure.color(d), width=3, dash="dot" if "greedy" in d else None),
                            row=1, col=j,
                            customdata=[r.get("drafted", 0) for r in rs],
                            hovertemplate=f"T=%{{x:g}}: %{{y:{fmt}}} (%{{customdata}} drafted)<extra>{d}</extra>")
        measure.noisy_marks(fig, rs, "temperature", row=1, col=3)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c", row=1, col=3)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#90a4ae", row=1, col=2)
    fig.update_xaxes(title="temperature", range=[-0.08, 1.58])
    fig.update_yaxes(tickformat=".0%", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", row=1, col=3)
    return measure.layout(fig, 470, below=True)


def workloads_figure(rows: list[dict], ref: dict | None, which: list[str], own: bool) -> go.Figure:
    """The Workloads page: measured speedup per workload (`which`, in order; the recorded reference run `ref`
    faint behind), one bar per workload with its own drafter (`own`) or per drafter, the lesson's expectation
    under each name."""
    fig = go.Figure()
    refs = reference.rows_by(ref, "workloads", "workload")
    if refs:   # the recorded run, faint, first so the live bars draw over the same slots
        rr = [refs[n] for n in which if n in refs]
        fig.add_bar(x=[r["workload"] for r in rr], y=[r["speedup"] for r in rr], name=reference.label(ref),
                    marker=dict(color="rgba(96,125,139,0.22)", line=dict(color="rgba(96,125,139,0.6)", width=1)),
                    text=[f"{r['speedup']:.2f}×" for r in rr], textposition="outside", textfont=dict(color="#90a4ae"),
                    customdata=[r["drafter"] for r in rr], cliponaxis=False,
                    hovertemplate="%{x} with %{customdata}: %{y:.2f}×<extra>reference</extra>")
    names = dict.fromkeys(r["Drafter"] for r in rows)
    groups = [rows] if own else [[r for r in rows if r["Drafter"] == d] for d in names]
    for rs in groups:   # each workload's own drafter: one bar per workload, coloured by its drafter
        fig.add_bar(x=[r["name"] for r in rs], y=[r["Speedup"] for r in rs],
                    name="measured now, each workload's own drafter" if own else rs[0]["Drafter"],
                    marker_color=[measure.color(r["Drafter"]) for r in rs], cliponaxis=False,
                    text=[f"{r['Speedup']:.2f}×" + (" noisy: rerun" if r["Noisy"] else "") for r in rs],
                    # a label just above a bar near 1× would sit on the dashed line: inside the bar there
                    textposition=["inside" if 0.8 < r["Speedup"] < 1.2 else "outside" for r in rs],
                    insidetextanchor="end", constraintext="none",
                    error_y=measure.speed_error([r["point"] for r in rs]),
                    customdata=[[r["Drafter"], r["Acceptance rate"]] for r in rs],
                    hovertemplate="%{x} with %{customdata[0]}: %{y:.2f}×, acceptance %{customdata[1]:.0%}"
                                  "<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c")
    fig.update_xaxes(categoryorder="array", categoryarray=which, tickvals=which,
                     ticktext=[f"<b>{n}</b><br>lesson: {WORKLOADS[n].expected}" for n in which])
    fig.update_yaxes(title="speedup (× plain tokens/s)", rangemode="tozero")
    return measure.layout(fig, 460, barmode="group", title="Measured speedup per workload")
