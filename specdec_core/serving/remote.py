"""The production checklist against a live OpenAI-compatible server: the fixed prompts at temperature 0 with
speculation off (one server) and on (another server, or the same one restarted with another configuration),
a token/text diff, TTFT and TPOT from the streamed responses, and the speculative-decoding counters the
server's Prometheus /metrics exposes. The report has the shape of the in-process checklist's (Markdown, HTML
with the plot, CSV).

With two servers every prompt's pair runs back to back, repeated with the order alternating, and the speedup
follows the project's one measuring rule (bench.sweeps.ratios). With one server restarted in between, the
two phases cannot be paired; the report says so and quotes the ratio of the phases' totals.

A failure (server down, hung, not OpenAI-compatible, lacking the model) stops only that server's phase: it is
recorded as one line and the rest of the report is kept.
"""
from __future__ import annotations

import csv
import datetime as dt
import html
import io
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
import plotly.graph_objects as go

from ..bench.invariance import first_difference
from ..bench.sweeps import REPEATS, ratios
from . import endpoint
from .checklist import md_table
from .endpoint import EndpointError, SpecCounters, Streamed
from .prompt_set import parse_prompts, prompts_text  # noqa: F401  (the page's prompt box, here since before)


@dataclass
class Phase:
    """One server's side: what it answered for each prompt and repeat (None where it was not reached)."""
    label: str                  # "speculation off" / "speculation on"
    url: str
    model: str = ""
    runs: list[list[Streamed | None]] = field(default_factory=list)   # runs[repeat][prompt]
    error: str = ""
    counters: SpecCounters | None = None
    metrics_before: dict | None = None
    metrics_source: str = ""

    def first(self, i: int) -> Streamed | None:
        return self.runs[0][i] if self.runs and i < len(self.runs[0]) else None


def failed(ph: Phase) -> str:
    """'' when the phase asked every prompt; else one plain line saying it is not done and why: the server
    could not be reached (named by its address), could not be used, or stopped part way."""
    if not ph.error:
        return ""
    why = ph.error.removeprefix(f"{ph.label}: ")
    head = f"{ph.label[:1].upper()}{ph.label[1:]}: not done."
    if not ph.model and why.startswith("cannot reach"):
        reason = why.split(": ", 1)[1] if ": " in why else why
        return f"{head} The server could not be reached at {ph.url}: {reason}. Nothing was asked."
    if not ph.model:
        return f"{head} The server at {ph.url} could not be used: {why}. Nothing was asked."
    return f"{head} The server at {ph.url} stopped answering part way: {why}."


def open_phase(label: str, url: str, model: str | None, timeout: float) -> Phase:
    """Check the server (reachable, OpenAI-compatible, serving the model) and read /metrics before any run."""
    ph = Phase(label, (url or "").strip())
    try:
        ph.model = endpoint.pick_model(ph.url, model, timeout)
    except EndpointError as e:
        ph.error = f"{label}: {e}"
        return ph
    ph.metrics_before, ph.metrics_source = endpoint.scrape(ph.url, timeout)
    return ph


def ask(ph: Phase, prompts: list[str], i: int, r: int, max_tokens: int, timeout: float) -> None:
    """Prompt i, repeat r on this server; the first failure ends the phase with its one-line message."""
    while len(ph.runs) <= r:
        ph.runs.append([None] * len(prompts))
    if ph.error:
        return
    try:
        ph.runs[r][i] = endpoint.stream_chat(ph.url, ph.model, prompts[i], max_tokens, timeout)
    except EndpointError as e:
        ph.error = f"{ph.label}: prompt {i + 1}: {e}"


def close_phase(ph: Phase, timeout: float) -> None:
    """Read /metrics again: the counters' change is what speculation did during the phase."""
    if not ph.model:
        return
    after, src = endpoint.scrape(ph.url, timeout)
    ph.counters = endpoint.spec_counters(ph.metrics_before, after,
                                         src if after is not None else ph.metrics_source or src)


def run_phase(label: str, url: str, prompts: list[str], model: str | None, max_tokens: int, timeout: float,
              repeats: int = 1, on_step: Callable[[str], None] | None = None) -> Phase:
    """Every prompt on one server (the one-server mode, before or after its restart)."""
    ph = open_phase(label, url, model, timeout)
    for r in range(repeats):
        for i in range(len(prompts)):
            ask(ph, prompts, i, r, max_tokens, timeout)
            if on_step:
                on_step(f"{label}: prompt {i + 1} of {len(prompts)}")
    close_phase(ph, timeout)
    return ph


def run_pair(base_url: str, spec_url: str, prompts: list[str], model: str | None = None,
             model_spec: str | None = None, max_tokens: int = 64, timeout: float = endpoint.TIMEOUT_S,
             repeats: int | None = None, on_step: Callable[[str], None] | None = None) -> "Report":
    """Two servers: each prompt on both, back to back, `repeats` times with the order alternating."""
    if not prompts:
        raise ValueError("the checklist needs at least one prompt")
    repeats = repeats or REPEATS
    base = open_phase("speculation off", base_url, model, timeout)
    spec = open_phase("speculation on", spec_url, model_spec or model, timeout)
    for r in range(repeats):
        for i in range(len(prompts)):
            for ph in ((base, spec) if (r + i) % 2 == 0 else (spec, base)):
                ask(ph, prompts, i, r, max_tokens, timeout)
            if on_step:
                on_step(f"repeat {r + 1} of {repeats}, prompt {i + 1} of {len(prompts)}")
    close_phase(base, timeout)
    close_phase(spec, timeout)
    return Report(prompts, base, spec, max_tokens, timeout, paired=True)


@dataclass
class Report:
    prompts: list[str]
    base: Phase
    spec: Phase
    max_tokens: int
    timeout: float
    paired: bool                 # two servers, pairs back to back (else one server restarted in between)

    @property
    def errors(self) -> list[str]:
        return [e for e in (self.base.error, self.spec.error) if e]

    def diff(self, i: int) -> dict:
        """Prompt i: whether the speculative text equals the plain one, and where it first differs."""
        a, b = self.base.first(i), self.spec.first(i)
        if a is None or b is None:
            return {"compared": False}
        tok = None
        if a.tokens and b.tokens:
            tok = first_difference(a.tokens, b.tokens)
        ch = first_difference(a.text, b.text)
        return {"compared": True, "identical": ch is None and tok is None, "first_diff_char": ch,
                "first_diff_token": tok, "by_tokens": bool(a.tokens and b.tokens)}

    def timing(self, i: int) -> dict | None:
        """Prompt i's speedup by the measuring rule over the repeats where both servers answered."""
        pairs = [(rb[i], rs[i]) for rb, rs in zip(self.base.runs, self.spec.runs) if rb[i] and rs[i]]
        if not pairs:
            return None
        return ratios([s.tokens_per_s for _, s in pairs], [b.tokens_per_s for b, _ in pairs])

    def overall(self) -> dict | None:
        """All prompts: per repeat, total tokens over total seconds on each side, paired by repeat."""
        tps = []
        for rb, rs in zip(self.base.runs, self.spec.runs):
            both = [(b, s) for b, s in zip(rb, rs) if b and s]
            if both:
                tps.append((sum(s.n_tokens for _, s in both) / sum(s.total_s for _, s in both),
                            sum(b.n_tokens for b, _ in both) / sum(b.total_s for b, _ in both)))
        return ratios([s for s, _ in tps], [b for _, b in tps]) if tps else None


def _ms(x: Streamed | None, attr: str, f: str) -> str:
    return format(1e3 * getattr(x, attr), f) if x else "-"


def table(rep: Report) -> pd.DataFrame:
    rows = []
    for i in range(len(rep.prompts)):
        a, b, d, t = rep.base.first(i), rep.spec.first(i), rep.diff(i), rep.timing(i)
        if not d["compared"]:
            out = "not compared (a server failed)"
        elif d["identical"]:
            out = "identical" + (" tokens" if d["by_tokens"] else " text")
        else:
            out = (f"differ from character {d['first_diff_char'] + 1}" if d["first_diff_char"] is not None
                   else "same text") + (f", token {d['first_diff_token'] + 1}" if d["first_diff_token"] is not None
                                        else "")
        rows.append({"prompt": i + 1, "tokens (off / on)": f"{a.n_tokens if a else '-'} / {b.n_tokens if b else '-'}",
                     "greedy output": out,
                     "TTFT ms (off / on)": f"{_ms(a, 'ttft_s', '.0f')} / {_ms(b, 'ttft_s', '.0f')}",
                     "TPOT ms (off / on)": f"{_ms(a, 'tpot_s', '.1f')} / {_ms(b, 'tpot_s', '.1f')}",
                     "tokens/s (off / on)": (f"{t['baseline_tokens_per_s']:.1f} / {t['tokens_per_s']:.1f}"
                                             if t else "-"),
                     "speedup": round(t["speedup"], 2) if t else None,
                     "spread": f"{t['speedup_min']:.2f}-{t['speedup_max']:.2f}" + (" noisy" if t["noisy"] else "")
                     if t else ""})
    return pd.DataFrame(rows).set_index("prompt")


def verdict(rep: Report) -> str:
    comp = [rep.diff(i) for i in range(len(rep.prompts))]
    n = sum(d["compared"] for d in comp)
    same = sum(d.get("identical", False) for d in comp)
    ov = rep.overall()
    parts = [f"{same} of {n} compared prompts gave identical greedy output with speculation on"
             + (f" ({len(rep.prompts) - n} not compared)" if n < len(rep.prompts) else "")]
    if ov:
        keep = "keep it for this traffic" if ov["speedup"] > 1.0 and same == n else \
            "the output changed: find out why before keeping it" if same < n else \
            "the numbers do not earn it for this traffic"
        how = (f"median of {ov['repeats']} back-to-back repeats, {ov['speedup_min']:.2f}x-{ov['speedup_max']:.2f}x"
               + (", noisy: rerun" if ov["noisy"] else "")) if rep.paired else \
            "one server restarted in between: the phases are not paired, so a busy machine can move this"
        parts.append(f"speedup {ov['speedup']:.2f}x ({how}): {keep}")
    return "; ".join(parts) + "."


def figure(rep: Report) -> go.Figure:
    x, off, on = [], [], []
    for i in range(len(rep.prompts)):
        t = rep.timing(i)
        if t:
            x.append(f"prompt {i + 1}")
            off.append(t["baseline_tokens_per_s"])
            on.append(t["tokens_per_s"])
    fig = go.Figure()
    fig.add_bar(x=x, y=off, name="speculation off", marker_color="#546e7a")
    fig.add_bar(x=x, y=on, name="speculation on", marker_color="#2e7d32")
    fig.update_layout(barmode="group", height=320, yaxis_title="tokens/s (client-side)",
                      margin=dict(l=10, r=10, t=30, b=10), title="Throughput against the server's own baseline")
    return fig


def report_markdown(rep: Report) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Speculative decoding checklist report: a live server", "", f"Generated {when} by specdec.", "",
             f"- speculation off: {rep.base.url} (model {rep.base.model or '-'})",
             f"- speculation on: {rep.spec.url} (model {rep.spec.model or '-'})",
             f"- temperature 0, top-p 1, seed 0, up to {rep.max_tokens} tokens, timeout {rep.timeout:g} s per wait; "
             + ("each prompt's pair back to back, order alternating" if rep.paired else
                "one server, restarted between the phases"),
             "- TTFT, TPOT and tokens/s are measured by this client from the streamed response (network included)",
             ""]
    if rep.errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in rep.errors] + [""]
    lines += ["## Verdict", "", verdict(rep), "", "## Per prompt", "", md_table(table(rep)), "",
              "## Speculative-decoding counters (the server's /metrics)", ""]
    for ph in (rep.base, rep.spec):
        c = ph.counters
        lines.append(f"- {ph.label}: " + ("; ".join(c.lines()) if c else "not read (the server failed)"))
    lines += ["", "## Prompts", ""] + [f"{i}. {p!r}" for i, p in enumerate(rep.prompts, 1)]
    lines += ["", "## Diff", ""]
    for i in range(len(rep.prompts)):
        d, a, b = rep.diff(i), rep.base.first(i), rep.spec.first(i)
        if not d["compared"]:
            lines.append(f"- prompt {i + 1}: not compared")
        elif d["identical"]:
            lines.append(f"- prompt {i + 1}: identical ({a.n_tokens} tokens)")
        else:
            c = d["first_diff_char"] or 0
            lines.append(f"- prompt {i + 1}: first difference at character {c + 1}"
                         + (f", token {d['first_diff_token'] + 1}" if d["first_diff_token"] is not None else "")
                         + f": off {a.text[max(0, c - 20):c + 20]!r} / on {b.text[max(0, c - 20):c + 20]!r}")
    return "\n".join(lines) + "\n"


def report_html(rep: Report) -> str:
    """The Markdown report under the plot, as one self-contained page (plotly.js embedded, opens offline)."""
    plot = figure(rep).to_html(full_html=False, include_plotlyjs=True)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>specdec checklist report (live server)"
            f"</title></head><body style='font-family:sans-serif;max-width:960px;margin:auto'>{plot}"
            f"<pre style='white-space:pre-wrap'>{html.escape(report_markdown(rep))}</pre></body></html>")


def report_csv(rep: Report) -> str:
    """One row per prompt and repeat, both servers' figures and the diff, for a spreadsheet."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["prompt", "repeat", "url_off", "url_on", "tokens_off", "tokens_on", "ttft_ms_off", "ttft_ms_on",
                "tpot_ms_off", "tpot_ms_on", "tokens_per_s_off", "tokens_per_s_on", "identical",
                "first_diff_char", "first_diff_token", "error"])
    for r in range(max(len(rep.base.runs), len(rep.spec.runs), 1)):
        for i in range(len(rep.prompts)):
            a = rep.base.runs[r][i] if r < len(rep.base.runs) else None
            b = rep.spec.runs[r][i] if r < len(rep.spec.runs) else None
            d = rep.diff(i) if r == 0 else {"compared": False}
            f = lambda x, attr, k=1.0: "" if x is None else round(k * getattr(x, attr), 3)
            w.writerow([i + 1, r + 1, rep.base.url, rep.spec.url, f(a, "n_tokens"), f(b, "n_tokens"),
                        f(a, "ttft_s", 1e3), f(b, "ttft_s", 1e3), f(a, "tpot_s", 1e3), f(b, "tpot_s", 1e3),
                        f(a, "tokens_per_s"), f(b, "tokens_per_s"), d.get("identical", ""),
                        "" if d.get("first_diff_char") is None else d["first_diff_char"],
                        "" if d.get("first_diff_token") is None else d["first_diff_token"],
                        " | ".join(rep.errors) if a is None or b is None else ""])
    return buf.getvalue()
