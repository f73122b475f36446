"""The lesson's production checklist as a procedure: fixed prompts, greedy decoding with speculation off and
on, a token diff, and acceptance, TTFT, TPOT and throughput against the plain baseline, as a report.

Greedy decoding makes the two outputs comparable token by token: the exactness theorem (Leviathan et al.
2023, Thm. 1) says they are the same sequence, so any difference is the implementation: under transformers'
forward, a near-tie in bf16 that a many-token and a one-token pass round differently; our own forward scores
a position the same in both.

Speed is measured by the project's rule (bench.sweeps): after a warm-up, each prompt's plain and speculative runs
go back to back, repeated with the order alternating, and the speedup is the median pair's with the pairs' spread.
The verdict is per prompt: speculation is kept off where acceptance is low (the text is hard to draft, whatever
one timing says) or the paired speedup is below 1, and a prompt whose pairs spread too widely says "noisy: rerun".
"""
from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from specdec_core import SamplingParams, drafters, engine
from specdec_core.bench.invariance import difference, first_difference
from specdec_core.bench.sweeps import ratios, rounds

LOW_ACCEPTANCE = 0.25   # below this a draft of 4 commits under 1.33 tokens a step (Leviathan et al. eq. 1): off
WARMUP_TOKENS = 4       # a short untimed run of each side first: the first call of a shape pays one-off setup


@dataclass
class PromptResult:
    prompt: str
    base_ids: list[int]
    spec_ids: list[int]
    base: object               # RunMetrics of the median pair's plain run
    spec: object               # RunMetrics of the median pair's speculative run
    timing: dict = field(default_factory=dict)   # sweeps.ratios over the pairs: speedup, its min-max, noisy
    pairs: list[tuple] = field(default_factory=list)   # per repeat: (plain tokens, plain s, spec tokens, spec s)

    @property
    def first_diff(self) -> int | None:
        """Index of the first differing token (bench.invariance.first_difference), None when identical."""
        return first_difference(self.base_ids, self.spec_ids)

    @property
    def speedup(self) -> float:
        return self.timing.get("speedup", 0.0)

    def decision(self) -> tuple[bool | None, str]:
        """(keep, why) for this prompt: False where acceptance is low or the paired speedup is below 1, None
        where the pairs spread too widely to tell, True where both earn it."""
        acc = self.spec.acceptance_rate
        if acc < LOW_ACCEPTANCE:
            return False, f"acceptance {acc:.0%}: hard to draft"
        if self.timing.get("noisy"):
            return None, (f"speedup {self.speedup:.2f}x but its pairs ran from {self.timing['speedup_min']:.2f}x "
                          f"to {self.timing['speedup_max']:.2f}x: noisy: rerun")
        if self.speedup < 1.0:
            return False, f"acceptance {acc:.0%} but {self.speedup:.2f}x: the drafts cost more than they save"
        return True, f"acceptance {acc:.0%}, {self.speedup:.2f}x"


def run(target, make_drafter, prompts: list[str], k: int, max_new_tokens: int, on_step=None,
        repeats: int | None = None) -> list[PromptResult]:
    """Greedy, plain and speculative back to back on each prompt, `repeats` times with the order alternating
    (sweeps.rounds), after an untimed warm-up; `on_step(i, n)` reports progress per prompt."""
    if not prompts:
        raise ValueError("the checklist needs at least one prompt")
    sp = SamplingParams(temperature=0.0)
    none = drafters.make(drafters.PLAIN, target)
    ids = [target.encode(text).tolist() for text in prompts]
    engine.run(target, none, ids[0], sp=sp, k=0, max_new_tokens=WARMUP_TOKENS, detail=False)
    engine.run(target, make_drafter(), ids[0], sp=sp, k=k, max_new_tokens=WARMUP_TOKENS, detail=False)
    out = []
    for i, (text, p) in enumerate(zip(prompts, ids)):
        got = {"plain": [], "spec": []}
        for _, _, order in rounds(sp, repeats, ["plain", "spec"]):
            for side in order:
                d, kk = (none, 0) if side == "plain" else (make_drafter(), k)
                got[side].append(engine.run(target, d, p, sp=sp, k=kk, max_new_tokens=max_new_tokens, detail=False))
        timing = ratios([m.tokens_per_s for _, _, m in got["spec"]], [m.tokens_per_s for _, _, m in got["plain"]])
        j = next((j for j, ((_, _, b), (_, _, s)) in enumerate(zip(got["plain"], got["spec"]))
                  if s.tokens_per_s == timing["tokens_per_s"] and b.tokens_per_s == timing["baseline_tokens_per_s"]),
                 0)   # the median pair
        pairs = [(b.tokens, b.total_s, s.tokens, s.total_s) for (_, _, b), (_, _, s) in zip(got["plain"], got["spec"])]
        out.append(PromptResult(text, got["plain"][0][0], got["spec"][0][0], got["plain"][j][2], got["spec"][j][2],
                                timing, pairs))
        if on_step:
            on_step(i + 1, len(prompts))
    return out


def table(results: list[PromptResult], by_prompt: bool = False) -> pd.DataFrame:
    """One row per prompt; `by_prompt`: one column per prompt instead, as text (narrow enough for a page)."""
    rows = []
    for n, r in enumerate(results, 1):
        t = r.timing
        keep, _ = r.decision()
        rows.append({"prompt": f"prompt {n}", "text": _cut(r.prompt, 40), "tokens": r.spec.tokens,
                     "greedy tokens": difference(r.base_ids, r.spec_ids),
                     "acceptance rate": round(r.spec.acceptance_rate, 3),
                     "mean acceptance length": round(r.spec.mean_acceptance_length, 2),
                     "TTFT ms (plain / spec)": f"{r.base.ttft_s * 1e3:.0f} / {r.spec.ttft_s * 1e3:.0f}",
                     "TPOT ms (plain / spec)": f"{r.base.tpot_s * 1e3:.1f} / {r.spec.tpot_s * 1e3:.1f}",
                     "tokens/s (plain / spec)": f"{r.base.tokens_per_s:.1f} / {r.spec.tokens_per_s:.1f}",
                     "speedup (median pair)": round(r.speedup, 2),
                     f"pairs' range ({t.get('repeats', 0)} pair{'s' if t.get('repeats', 0) != 1 else ''})":
                         f"{t.get('speedup_min', 0):.2f}-{t.get('speedup_max', 0):.2f}"
                         + (" noisy: rerun" if t.get("noisy") else ""),
                     "speculation": {True: "keep", False: "off", None: "rerun"}[keep]})
    df = pd.DataFrame(rows).set_index("prompt")
    return df.T.astype(str) if by_prompt else df


def _cut(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text[:n] + ("…" if len(text) > n else "")


def _like(results: list[PromptResult], cut: int = 40) -> str:
    """The prompts quoted (cut at `cut` characters), each with why it is kept or not."""
    return ", ".join(f"“{r.prompt[:cut]}{'…' if len(r.prompt) > cut else ''}” ({r.decision()[1]})"
                     for r in results)


def difference_note(results: list[PromptResult]) -> str:
    """Why greedy tokens differed, said only where some did ("" when every prompt gave identical tokens)."""
    diff = [r for r in results if r.first_diff is not None]
    if not diff:
        return ""
    return (f"{len(diff)} of {len(results)} prompt{'s' if len(results) != 1 else ''} gave different greedy tokens. "
            "That is the implementation, not the algorithm (the rule is exact): where two tokens are nearly tied, "
            "a many-token verify pass and a one-token step can round them differently (transformers' own "
            "forward does; this app's own forward scores a position the same in both).")


def overall(results: list[PromptResult]) -> dict:
    """The whole set as one workload: per repeat, all prompts' tokens over all their seconds on each side, the
    repeats paired by the measuring rule (sweeps.ratios); with the set's acceptance (accepted over drafted)."""
    n = min((len(r.pairs) for r in results), default=0)
    spec, base = [], []
    for i in range(n):
        bt, bs, st, ss = (sum(r.pairs[i][j] for r in results) for j in range(4))
        if bs > 0 and ss > 0:
            base.append(bt / bs)
            spec.append(st / ss)
    drafted = sum(r.spec.drafted for r in results)
    return ratios(spec, base) | {"acceptance_rate": sum(r.spec.accepted for r in results) / drafted if drafted
                                 else 0.0}


def set_verdict(results: list[PromptResult]) -> str:
    """One line for the set: its acceptance and paired speedup, and how many prompts keep speculation."""
    o = overall(results)
    keep = sum(r.decision()[0] is True for r in results)
    off = sum(r.decision()[0] is False for r in results)
    if not o["repeats"]:
        return ""
    how = (f"the set's speedup {o['speedup']:.2f}x (each repeat summed over the prompts, median of {o['repeats']}, "
           f"{o['speedup_min']:.2f}-{o['speedup_max']:.2f}x" + (", noisy: rerun" if o["noisy"] else "") + ")")
    if keep == len(results):
        word = "keep speculation on for this traffic"
    elif off == len(results):
        word = "keep it off for this traffic"
    elif o["noisy"]:
        word = "undecided: rerun"
    elif o["acceptance_rate"] < LOW_ACCEPTANCE:   # the per-prompt rule, on the set: low acceptance rules it out
        word = "the set is hard to draft, keep it off (whatever one timing says)"
    elif o["speedup"] >= 1.0:
        word = "on pays for the set as a whole; the prompts marked off are where it does not"
    else:
        word = "as a whole the set runs slower with it: keep it off, or send only prompts like the kept ones to it"
    return (f"Over the whole set: acceptance {o['acceptance_rate']:.0%}, {how}; {keep} of {len(results)} "
            f"prompt{'s' if len(results) != 1 else ''} earn it: {word}.")


def verdict(results: list[PromptResult]) -> str:
    """The checklist's conclusion, per prompt: where the numbers earn speculation, and where to keep it off."""
    same = sum(r.first_diff is None for r in results)
    reps = max((r.timing.get("repeats", 0) for r in results), default=0)
    head = (f"{same} of {len(results)} prompt{'s' if len(results) != 1 else ''} gave identical greedy tokens; "
            f"speedups are the median of {reps} back-to-back pair{'s' if reps != 1 else ''} (plain and "
            "speculative, order alternating). ")
    keep = [r for r in results if r.decision()[0] is True]
    off = [r for r in results if r.decision()[0] is False]
    noisy = [r for r in results if r.decision()[0] is None]
    parts = []
    if keep:
        parts.append(("Keep it for this traffic: " if len(keep) == len(results) else "Keep it for prompts like ")
                     + _like(keep) + ".")
    if off:
        parts.append(("Keep it off for this traffic: " if len(off) == len(results) else "Keep it off for prompts "
                      "like ") + _like(off) + ".")
    if noisy:
        parts.append("Undecided, the machine was too busy to tell (rerun): " + _like(noisy) + ".")
    whole = set_verdict(results) if len(results) > 1 else ""
    return head.rstrip() + (" " + whole if whole else "") + "\n\n" + "\n".join(f"- {p}" for p in parts)


def figure(results: list[PromptResult]) -> go.Figure:
    x = [f"prompt {i}" for i in range(1, len(results) + 1)]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r.base.tokens_per_s for r in results], name="plain (no draft)", marker_color="#546e7a")
    fig.add_bar(x=x, y=[r.spec.tokens_per_s for r in results], name="speculative", marker_color="#2e7d32",
                text=[f"{r.speedup:.2f}x" + (" noisy: rerun" if r.timing.get("noisy") else "") for r in results],
                textposition="outside", cliponaxis=False)
    fig.update_layout(barmode="group", height=320, yaxis_title="tokens/s", margin=dict(l=10, r=10, t=30, b=10),
                      title="Throughput against the baseline, same prompts, greedy (the median pair of each)")
    return fig


def md_table(df: pd.DataFrame) -> str:
    cols = [df.index.name or ""] + list(df.columns)
    rows = [[str(i)] + [str(v).replace("|", "\\|") for v in row]   # a prompt's own "|" stays in its cell
            for i, row in zip(df.index, df.itertuples(index=False))]
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
