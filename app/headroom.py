"""The Headroom page's Streamlit side (pages/headroom.py) and the walkthrough's pointer to it: the weight formats
measured side by side (specdec_core.bench.headroom), drawn as four panels, and the lesson read from them in words,
each claim beside the figures that show it or, where they do not, why not here."""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from specdec_core.bench import regime
from specdec_core.bench import headroom
from specdec_core.bench.sweeps import REPEATS
from specdec_core.models import BUNDLED, cpu_has_bf16

from . import measure, nav, runs

KEY = "measure_headroom"
COLORS = {"fp32": "#546e7a", "bf16": "#1565c0", "q4": "#c62828"}
PAGE = next(p for p in nav.PAGES if p.url_path == "headroom")

BATCHING_ROW = (
    "This is the lesson's batching row on one request. A full batch claims the arithmetic a one-token step leaves "
    "idle with other requests' rows; lighter weights claim it too, by making the step so quick to read that the "
    "arithmetic is no longer idle. Either way the verify pass's extra rows stop riding free, and speculation, "
    "which lives on that spare arithmetic, gains less: a latency tool for the regime where a pass of k + 1 tokens "
    "costs about one token's.")


def total(fmts: list[str], workloads: list[str], prompts: int) -> int:
    """Progress ticks: a pass measurement per format, then per workload and format plain and speculative runs."""
    return len(fmts) * (1 + len(workloads) * 2 * prompts * REPEATS)


def run(params: dict, fmts: list[str], workloads: list[str], prompts: int, max_new: int, k: int) -> None:
    """Measure each format on the same prompts, drawing the panels as each row comes (measure.collect)."""
    res = measure.begin(KEY, params)
    live = measure.Live(KEY, total(fmts, workloads, prompts), "Measuring each weight format")
    pts = headroom.rows(lambda f: runs.model(BUNDLED, f), fmts, workloads, prompts, max_new, k, tick=live.tick)
    measure.collect(res, pts, live, lambda rs: figure(headroom.summary(rs), workloads))


def figure(summary: list[dict], workloads: list[str]) -> go.Figure:
    """Four panels, one bar per format: plain tokens/s, the 8-token pass against one token, speculation's speedup
    per workload, speculation's own tokens/s."""
    fig = make_subplots(rows=1, cols=4, horizontal_spacing=0.06, subplot_titles=[
        "plain decoding (tok/s)", f"{regime.BIG}-token pass ÷ 1-token", "speculation's speedup (×)",
        "speculation (tok/s)"])
    for s in summary:
        c, name = COLORS.get(s["format"], "#37474f"), s["label"]
        bar = dict(marker_color=c, legendgroup=name, cliponaxis=False, textposition="outside")
        fig.add_bar(x=[name], y=[s.get("plain_tokens_per_s")], name=name, showlegend=False,
                    text=[_f(s.get("plain_tokens_per_s"), "{:.1f}")], row=1, col=1, **bar)
        fig.add_bar(x=[name], y=[s.get("ratio")], name=name, showlegend=False,
                    text=[_f(s.get("ratio"), "{:.2f}×")], row=1, col=2, **bar)
        ws = [w for w in workloads if f"speedup_{w}" in s]
        fig.add_bar(x=ws, y=[s[f"speedup_{w}"] for w in ws], name=name, showlegend=True,
                    text=[f"{s[f'speedup_{w}']:.2f}×" for w in ws], row=1, col=3, **bar)
        fig.add_bar(x=[name], y=[s.get("spec_tokens_per_s")], name=name, showlegend=False,
                    text=[_f(s.get("spec_tokens_per_s"), "{:.1f}")], row=1, col=4, **bar)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#b71c1c", row=1, col=3)
    fig.add_hline(y=regime.LIMIT, line_dash="dot", line_color="#b71c1c", row=1, col=2,
                  annotation_text=f"rule: {regime.LIMIT:.2f}×", annotation_position="top left")   # off the bars
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(tickangle=0)
    return measure.layout(fig, 430, below=True, barmode="group")


def _f(v, fmt: str) -> str:
    return "" if v is None else fmt.format(v)


def why_not(claim: str, lo: dict, hi: dict) -> str:
    """Why a claim does not show between `lo` (lighter) and `hi` here, in what this machine and run say."""
    if lo.get("noisy") or hi.get("noisy"):
        busy = " Some of these figures are noisy (their pairs spread widely): the machine was busy; rerun."
    else:
        busy = ""
    if lo["format"] != "fp32" and not cpu_has_bf16():
        return ("This CPU has no native bf16 arithmetic (no AVX-512 BF16, no AMX): its bf16 products convert every "
                f"weight to fp32 on the way, so the {lo['label']} weights are lighter to read but no quicker to "
                "compute with, and the format buys little or nothing to spend the headroom on." + busy)
    if claim.startswith("speculation's own"):
        return "The two formats' speculative rates differ by more than " \
               f"{headroom.SPREAD:.0%}: the formats' rounding can also change what the drafts agree on." + busy
    return "Not on this run." + (busy or " Rerun with more prompts for steadier figures.")


def lesson(summary: list[dict]) -> None:
    """The lesson read from the figures: between the format with the most headroom and each lighter one, each
    claim with its figures, and why not where it does not show."""
    done = [s for s in summary if s.get("ratio") is not None]
    if len(done) < 2:
        st.info("Measure at least two formats to compare them.", icon=":material/info:")
        return
    hi = min(done, key=lambda s: s["ratio"])
    for lo in [s for s in done if s is not hi]:
        st.markdown(f"**{lo['label']} against {hi['label']}**, which has the most headroom here:")
        for claim, held, figs in headroom.shows(lo, hi):
            if held:
                st.markdown(f"- :green[shows] {claim}: {figs}.")
            else:
                st.markdown(f"- :orange[not here] {claim}: {figs}. {why_not(claim, lo, hi)}")


def walkthrough_note() -> None:
    """The walkthrough's batching section: the same spare arithmetic, claimed by cheaper weights, one link away."""
    line = runs.in_use()[1] if runs.measured_now() else ""
    st.markdown(
        "**The same headroom, claimed by the weights.** Quantised or lower-precision weights make a one-token step "
        "quicker to read, so plain decoding gets faster, and the verify pass's extra rows stop being free: the "
        "spare arithmetic is claimed by cheaper weights instead of by other requests. The app picks the weight "
        "format in which an 8-token pass costs about one token's on this machine (the sidebar says which and "
        "why); the Headroom page measures each format side by side.")
    if line:
        st.caption(line)
    st.page_link(PAGE.path, label=f"Open {PAGE.link}", icon=PAGE.icon)
