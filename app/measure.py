"""Shared machinery of the measurement pages (workloads, temperature, batch size, draft length, output contract).

The measuring itself is specdec_core.bench's; this module is its Streamlit side. A measurement is a stream of
points: each is drawn as soon as it is measured (a progress bar and a plotly chart redrawn after every point),
and the finished result is kept in st.session_state under the page's key, so a rerun
(any click) shows it again without recomputing. A measurement cut off by a rerun keeps the points it made.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from specdec_core import InputError, SamplingParams, clock, drafters
from specdec_core.bench.sweeps import NOISY
from specdec_core.bench.workloads import WORKLOADS, benefit

from . import runs, turns
from .runs import Settings, UserError

SPEC = drafters.SPECULATIVE   # what can be measured against the baseline
BASE_COLOR = "#546e7a"
COLORS = {drafters.PLAIN: BASE_COLOR, "lookup": "#2e7d32", "suffix": "#00838f", "draft": "#1565c0",
          "early-exit": "#ef6c00", "medusa": "#7b1fa2", "eagle": "#c62828"}
FONT = dict(size=14)


# -- results kept per session ------------------------------------------------------------------------------------

@dataclass
class Result:
    params: dict                     # what was measured (controls included), shown with the result
    rows: list[dict] = field(default_factory=list)
    status: str = "running"          # running | done | stopped | failed
    error: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)   # drafters skipped and why
    extra: dict = field(default_factory=dict)        # page-specific data beyond the table (e.g. histograms)


def settle(key: str, **defaults) -> None:
    """At the top of a page: a measurement still marked running was cut off by a rerun, so it stops there;
    `defaults` are the page's control values on a first visit."""
    r = st.session_state.get(key)
    if r is not None and r.status == "running":
        r.status = "stopped"
    for k, v in defaults.items():
        st.session_state.setdefault(k, v)


def workload_or_first(name: str) -> str:
    return name if name in WORKLOADS else next(iter(WORKLOADS))


def stored(key: str) -> Result | None:
    return st.session_state.get(key)


def begin(key: str, params: dict) -> Result:
    res = Result(dict(params))
    st.session_state[key] = res
    return res


def show_status(res: Result, params: dict) -> None:
    """What the result was measured with, and whether it is complete and current."""
    st.caption("Measured with: " + " · ".join(f"{k} {v}" for k, v in res.params.items())
               + f" · in {res.seconds:.1f} s")
    for n in res.notes:
        st.warning(n, icon=":material/warning:")
    if res.status == "failed":
        st.error(res.error, icon=":material/error:")
    elif res.status == "stopped":
        st.warning("The measurement was interrupted (a control was touched while it ran); showing the points "
                   "it made.", icon=":material/stop_circle:")
    if res.params != params:
        st.info("The controls have changed since this measurement: press the button above to measure again.",
                icon=":material/info:")


class Live:
    """A progress bar and a chart slot; tick() after each prompt, draw() after each point."""

    def __init__(self, key: str, total: int, label: str):
        self.key, self.total, self.label, self.n, self.draws, self.shown = key, max(1, total), label, 0, 0, -1.0
        self.t0 = time.perf_counter()
        self.turn = None        # the turn at the shared model while collecting: ticks are where others get in
        self.box = st.empty()   # cleared when the measurement ends; the finished result takes its place
        with self.box.container(border=True):
            self.bar = st.progress(0.0, text=f"{label}…")
            self.chart = st.empty()

    def waiting(self, place: int, eta: float) -> None:
        self.bar.progress(min(1.0, self.n / self.total), text=turns.message(place, eta) + "…")

    def tick(self, what: str = "") -> None:
        if self.turn is not None:   # between two runs: never inside one, so no run's timing includes a wait
            self.turn.spell(self.waiting)
        self.n += 1
        frac = min(1.0, self.n / self.total)
        if frac - self.shown < 0.01 and self.n < self.total:   # many tiny runs: redraw the bar every 1%
            return
        self.shown = frac
        self.bar.progress(frac, text=f"{self.label}: {self.n} of {self.total} runs, {time.perf_counter() - self.t0:.0f} s"
                               + (f" · {what}" if what else ""))

    def draw(self, fig: go.Figure) -> None:
        self.draws += 1  # a new key per draw: each is a new element within this script run
        self.chart.plotly_chart(fig, key=f"{self.key}_live_{self.draws}", width="stretch")

    def close(self) -> None:
        self.box.empty()


def collect(res: Result, points: Iterable[dict], live: Live | None = None,
            figure: Callable[[list[dict]], go.Figure] | None = None) -> Result:
    """Consume a stream of points into res, redrawing the live chart after each; errors become a message.
    The whole measurement holds a turn at the shared model (app/turns.py), letting others in between runs."""
    t0 = time.perf_counter()
    on_wait = live.waiting if live is not None else None
    try:
        with turns.hold(on_wait) as turn, clock.cpu_work():   # the measuring rule's clock (specdec_core/clock.py)
            if live is not None:
                live.turn = turn
            for p in points:
                res.rows.append(p)
                res.seconds = time.perf_counter() - t0
                if live is not None and figure is not None:
                    live.draw(figure(res.rows))
                turn.spell(on_wait)
        res.status = "done"
    except Exception as e:  # every failure becomes a message on the page, keeping the points made so far
        res.status, res.error = "failed", runs.friendly(e)
    res.seconds = time.perf_counter() - t0
    if live is not None:
        live.close()
    return res


# -- controls ----------------------------------------------------------------------------------------------------

def measure(key: str, params: dict, names: list[str], s: Settings, total: Callable[[list], int],
            points: Callable, figure: Callable | None = None, verb: str = "Sweeping") -> None:
    """Resolve the chosen drafters, then collect points with a progress bar and a chart redrawn per point."""
    res = begin(key, params)
    try:
        tgt = runs.target()
        specs = runnable(res, names, s, tgt)
    except UserError as e:
        res.status, res.error = "failed", str(e)
        return
    res.extra["row_block"] = tgt.backend.row_block   # what a verify pass's rows cost where this was measured
    live = Live(key, total(specs), verb)
    collect(res, points(tgt, specs, live), live, figure)


def row_block(res: Result) -> int:
    """The row block of the forward that measured `res` (captions.row_cost says what it means), else today's."""
    return res.extra.get("row_block") or runs.target().backend.row_block


def section(key: str, params: dict, hint: str) -> Result | None:
    """A page section's stored result with its status, or the hint when there is none; None without rows."""
    res = stored(key)
    if res is None:
        st.info(hint, icon=":material/info:")
        return None
    show_status(res, params)
    return res if res.rows else None


def results(key: str, params: dict, clicked: bool, run: Callable[[], None], hint: str) -> Result:
    """Run on a click (else warm the model), then the stored result with its status; stops the page if empty."""
    if clicked:
        run()
    elif (problem := runs.warm()) is not None:
        st.error(problem, icon=":material/error:")
    res = stored(key)
    if res is None:
        st.info(hint, icon=":material/info:")
        st.stop()
    show_status(res, params)
    if not res.rows:
        st.stop()
    return res


def pick_drafters(key: str, default: tuple[str, ...] = ("lookup",), help: str = "") -> list[str]:
    opts = list(SPEC)
    st.session_state.setdefault(key, [d for d in default if d in opts])
    chosen = st.multiselect("Drafters to measure (each against plain decoding)", opts, key=key,
                            format_func=lambda n: f"{n}: {drafters.DESCRIPTIONS.get(n, '')}",
                            help=help or "Plain decoding (`none`) is always measured too: it is the baseline.")
    return [n for n in opts if n in chosen]


def pick_values(label: str, key: str, options: list, default: list, help: str = "", fmt=str) -> list:
    st.session_state.setdefault(key, list(default))
    chosen = st.multiselect(label, options, key=key, help=help, format_func=fmt)
    return sorted(chosen)


def label(name: str, s: Settings) -> str:
    return f"{name} ({s.draft_model})" if drafters.entry(name).draft_model else name


def sweep_points(sweep: Callable, tgt, specs: list[tuple[str, object]], prompts: list, values: list, s: Settings,
                 live: Live, **kw) -> Iterable[dict]:
    """Each drafter's points from one of bench.sweeps' sweeps, labelled as the pages show them; every run ticks
    the progress bar."""
    for n, lm in specs:
        for p in sweep(tgt, n, prompts, values, draft_lm=lm, tick=lambda what: live.tick(f"{n}, {what}"), **kw):
            p["drafter"] = label(n, s)
            yield p


def resolve(names: list[str], s: Settings, tgt) -> tuple[list[tuple[str, object]], list[str]]:
    """(name, draft_lm) for each drafter that can be built; a plain-words note for each that cannot."""
    ok, notes = [], []
    for n in names:
        try:
            runs.make_drafter(dataclasses.replace(s, drafter=n), tgt)   # builds one: fails here, not mid-sweep
        except UserError as e:
            notes.append(f"Skipped `{n}`: {e}")
            continue
        ok.append((n, runs.draft_lm(dataclasses.replace(s, drafter=n), tgt)))
    return ok, notes


def runnable(res: Result, names: list[str], s: Settings, tgt) -> list[tuple[str, object]]:
    """`resolve`, its notes kept on `res`; a UserError when none of the chosen drafters can run."""
    specs, res.notes = resolve(names, s, tgt)
    if not specs:
        raise UserError("None of the chosen drafters can run here (see the warnings).")
    return specs


def encode(tgt, texts: Iterable[str]) -> list[list[int]]:
    try:
        return [tgt.encode(t).tolist() for t in texts]
    except InputError as e:
        raise UserError(str(e)) from e


def sampling(temperature: float, s: Settings, seed: int | None = None) -> SamplingParams:
    try:
        return SamplingParams(float(temperature), 0, float(s.top_p), int(s.seed if seed is None else seed))
    except InputError as e:
        raise UserError(str(e)) from e


# -- drawing -----------------------------------------------------------------------------------------------------

def color(name: str) -> str:
    return COLORS.get(name.split(" ")[0], "#37474f")


def layout(fig: go.Figure, height: int = 420, below: bool = False, **kw) -> go.Figure:
    """Shared look. The legend sits top right (titles are on the left), or below the axes for side-by-side
    panels, whose titles run across the top."""
    legend = dict(orientation="h", yanchor="top", y=-0.22, x=0) if below else \
        dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1)
    kw = {"margin": dict(l=10, r=10, t=60, b=10), "legend": legend, **kw}
    fig.update_layout(height=height, font=FONT, **kw)
    return fig


def percents(df: pd.DataFrame) -> dict:
    """Column settings that show every acceptance column as a percent (92%, as the charts and metrics say it)."""
    return {c: st.column_config.NumberColumn(format="percent") for c in df.columns
            if str(c).lower().startswith("acceptance") and "length" not in str(c).lower()}


def display(df: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """(table, column settings) as a page shows them: acceptance as percents, an empty cell as "—" (not "None")."""
    out = df.astype(object).where(df.notna(), "—")
    config = percents(df)
    for c in list(config):   # a column with a dash is text: its percents are written out
        if (out[c] == "—").any():
            out[c] = [v if v == "—" else f"{v:.0%}" for v in out[c]]
            del config[c]
    return out, config


def shown_table(df: pd.DataFrame) -> None:
    out, config = display(df)
    st.dataframe(out, hide_index=True, width="stretch", column_config=config)


def table(df: pd.DataFrame, name: str, note: str = "", main: list[str] | None = None) -> None:
    """The table on the page with headers in words: the `main` columns (so it fits a classroom screen without
    scrolling sideways) and every column one click away; a CSV download of all of it."""
    shown = df[[c for c in main if c in df]] if main else df
    shown_table(readable(shown))
    if main and len(shown.columns) < len(df.columns):
        with st.expander(f"All {len(df.columns)} columns"):
            shown_table(readable(df))
    df = readable(df)
    st.download_button("Download CSV", df.to_csv(index=False).encode(), file_name=f"specdec-{name}.csv",
                       mime="text/csv", key=f"{name}_csv", icon=":material/download:", on_click="ignore",
                       help=note or "The table above as a CSV file.")


def verdict(speedup: float) -> str:
    """The measured benefit in the lesson's words (bench.workloads.benefit; thresholds stated on the workloads
    page)."""
    return benefit(speedup)


# -- honest points: spread, noise, intervals ----------------------------------------------------------------------

BUSY = 0.25   # plain decoding's speed varying by more than this between repeats: the machine was busy


def speed_error(rows: list[dict]) -> dict:
    """Whiskers from each point's min to max paired ratio (sweeps.ratios)."""
    return dict(type="data", symmetric=False, thickness=1.5, width=5,
                array=[r.get("speedup_max", r["speedup"]) - r["speedup"] for r in rows],
                arrayminus=[r["speedup"] - r.get("speedup_min", r["speedup"]) for r in rows])


def acceptance_error(rows: list[dict]) -> dict:
    """Whiskers of each point's Wilson 95% interval (sweeps.wilson)."""
    return dict(type="data", symmetric=False, thickness=1.5, width=5,
                array=[r.get("acceptance_hi", r["acceptance_rate"]) - r["acceptance_rate"] for r in rows],
                arrayminus=[r["acceptance_rate"] - r.get("acceptance_lo", r["acceptance_rate"]) for r in rows])


def noisy_marks(fig: go.Figure, rows: list[dict], x: str, **where) -> None:
    """A red ring and 'noisy: rerun' on each point whose paired ratios spread too widely to read."""
    bad = [r for r in rows if r.get("noisy")]
    if bad:
        fig.add_scatter(x=[r[x] for r in bad], y=[r["speedup"] for r in bad], mode="markers+text",
                        marker=dict(size=22, color="rgba(0,0,0,0)", line=dict(color="#b71c1c", width=2)),
                        text=["noisy: rerun"] * len(bad), textposition="bottom center",
                        textfont=dict(color="#b71c1c", size=12), showlegend=False, hoverinfo="skip", **where)


def noise_note(rows: list[dict]) -> None:
    """Above a plot: how speedups were measured, and a warning when the machine was busy or a point is noisy."""
    if not rows:
        return
    reps = max(r.get("repeats", 1) for r in rows)
    busy = max(r.get("baseline_spread", 0.0) for r in rows)
    noisy = sum(bool(r.get("noisy")) for r in rows)
    rule = (f"Each speedup is the median of {reps} back-to-back pairs (plain, then speculative, order "
            f"alternating), each run timed by {clock.RULE}; whiskers span the pairs' min–max. Acceptance whiskers "
            f"are 95% intervals from the number of drafted tokens.")
    if noisy:
        st.warning(f"{noisy} point{'s' if noisy != 1 else ''} spread over {int(NOISY * 100)}% and "
                   f"{'are' if noisy != 1 else 'is'} marked “noisy: rerun” (plain decoding's own speed varied by up "
                   f"to {busy:.0%} between repeats). " + rule, icon=":material/speed:")
    elif busy > BUSY:
        st.caption(f"Plain decoding's own speed varied by up to {busy:.0%} between repeats (a busy machine); every "
                   f"pair stayed within {int(NOISY * 100)}%, so the speedups stand. " + rule)
    else:
        st.caption(rule)


TABLE_NAMES = {"drafter": "Drafter", "temperature": "Temperature", "k": "k", "batch_size": "Batch size",
               "acceptance_rate": "Acceptance", "acceptance_lo": "Acceptance 95% low",
               "acceptance_hi": "Acceptance 95% high", "mean_acceptance_length": "Mean acceptance length",
               "tokens_per_s": "Tokens/s (spec)", "baseline_tokens_per_s": "Tokens/s (plain)",
               "speedup": "Speedup (median)", "speedup_min": "Speedup min", "speedup_max": "Speedup max",
               "noisy": "Noisy", "tokens": "Tokens", "drafted": "Drafted", "accepted": "Accepted",
               "steps": "Steps", "target_forwards": "Target passes", "baseline_target_forwards": "Plain passes",
               "same_tokens_as_baseline": "Same tokens as plain", "repeats": "Repeats"}


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """Column names in words, not snake_case."""
    return df.rename(columns={c: TABLE_NAMES.get(c, c.replace("_", " ").capitalize()) for c in df.columns})
