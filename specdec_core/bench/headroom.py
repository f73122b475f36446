"""The headroom as a lesson: the same prompts decoded in each weight format this machine runs, side by side.

Speculation spends the arithmetic a one-token step leaves idle (Leviathan et al. 2023, §3). Lighter weights make
that step quicker to read, so plain decoding gets faster, and leave less idle arithmetic: the verify pass costs
more relative to one token, speculation's speedup shrinks, and its own tokens/s moves far less than plain
decoding's. It is the lesson's batching row again, the spare arithmetic claimed by cheaper weights instead of by
other requests. Per format (regime.FORMATS): one target pass on 8 tokens against 1 (bench.passes, the measuring
rule), then each workload with its own drafter (showcase.workload_rows: code and JSON with EAGLE, extraction
with prompt lookup), plain and speculative back to back by the measuring rule (sweeps.ratios).
"""
from __future__ import annotations

import statistics
from typing import Callable, Iterable, Iterator

from ..models import LM
from . import passes, regime, showcase
from .sweeps import Tick

WORKLOADS = ("code", "json", "extraction")
SPREAD = 0.15    # speculation's tokens/s within this share across formats reads as "about the same"


def rows(load: Callable[[str], LM], fmts: Iterable[str], workloads: Iterable[str] = WORKLOADS, prompts: int = 1,
         max_new: int = 32, k: int | None = None, repeats: int | None = None, reps: int = passes.REPS,
         tick: Tick = None) -> Iterator[dict]:
    """Rows as they are measured: first each format's pass cost (kind "pass": one_ms, big_ms, ratio, noisy), then
    for each workload each format's showcase row (kind "workload"), formats interleaved workload by workload so a
    machine whose load drifts slows every format alike."""
    fmts, workloads = list(fmts), list(workloads)
    if not fmts:
        raise ValueError("no weight format to measure")
    lms = {}
    for f in fmts:
        lms[f] = lm = load(f)
        c = regime.measure(lm, reps=reps)
        if tick:
            tick(f"{regime.FORMATS[f]}: passes")
        yield {"kind": "pass", "format": f, "one_ms": c.one_ms, "big_ms": c.big_ms, "ratio": c.ratio,
               "noisy": c.noisy}
    for w in workloads:
        for f in fmts:
            at = (lambda what, f=f: tick(f"{regime.FORMATS[f]}, {what}")) if tick else None
            for r in showcase.workload_rows(lms[f], [w], prompts, max_new, k, tick=at, repeats=repeats):
                yield {"kind": "workload", "format": f, **r}


def summary(rs: list[dict]) -> list[dict]:
    """Per format, in the order measured: the pass ratio, plain tokens/s and speculation's tokens/s (medians over
    the workloads), and each workload's speedup (`speedup_<workload>`), with whether any figure was noisy."""
    out = {}
    for r in rs:
        s = out.setdefault(r["format"], {"format": r["format"], "label": regime.FORMATS[r["format"]], "plain": [],
                                         "spec": [], "noisy": False, "same": 0, "runs": 0})
        if r["kind"] == "pass":
            s |= {"ratio": r["ratio"], "one_ms": r["one_ms"], "big_ms": r["big_ms"]}
            s["noisy"] |= bool(r["noisy"])
        else:
            s["plain"].append(r["baseline_tokens_per_s"])
            s["spec"].append(r["tokens_per_s"])
            s[f"speedup_{r['workload']}"] = r["speedup"]
            s[f"drafter_{r['workload']}"] = r["drafter"]
            s["noisy"] |= bool(r["noisy"])
            s["same"] += r["identical_outputs"]
            s["runs"] += r["prompts"]
    for s in out.values():
        plain, spec = s.pop("plain"), s.pop("spec")
        s["plain_tokens_per_s"] = statistics.median(plain) if plain else None
        s["spec_tokens_per_s"] = statistics.median(spec) if spec else None
        sp = [v for k, v in s.items() if k.startswith("speedup_")]
        s["speedup"] = statistics.median(sp) if sp else None
    return list(out.values())


def shows(lo: dict, hi: dict, spread: float = SPREAD) -> list[tuple[str, bool, str]]:
    """Whether the lesson shows between two formats' summaries, `hi` the one with more headroom (the lower pass
    ratio), `lo` the lighter one: (claim, held, the measured figures) for each of the four claims."""
    out = [("the verify pass dearer relative to one token", lo["ratio"] > hi["ratio"],
            f"{lo['ratio']:.2f}× against {hi['ratio']:.2f}×")]
    if lo.get("plain_tokens_per_s") is None or hi.get("plain_tokens_per_s") is None:
        return out
    a, b = lo["spec_tokens_per_s"], hi["spec_tokens_per_s"]
    out += [("plain decoding faster", lo["plain_tokens_per_s"] > hi["plain_tokens_per_s"],
             f"{lo['plain_tokens_per_s']:.1f} against {hi['plain_tokens_per_s']:.1f} tok/s"),
            ("speculation's speedup smaller", lo["speedup"] < hi["speedup"],
             f"{lo['speedup']:.2f}× against {hi['speedup']:.2f}×"),
            ("speculation's own tokens/s about the same", abs(a - b) <= spread * max(a, b),
             f"{a:.1f} against {b:.1f} tok/s")]
    return out
