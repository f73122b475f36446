"""Measurement points: the baseline (`none`) and drafters decode the same prompts with the same settings, one
after the other in this process, never at the same time, so they do not share the CPU. Speedup as in Leviathan
et al. (2023): tokens/s with speculation over tokens/s without. Sweeps move temperature, draft length or batch
size and yield each point as soon as it is measured, so a plot can fill in point by point.

One point has the same keys wherever it is made (the CLI's sweep, the measurement pages): the metrics of the
design notes for the speculative runs, the baseline's beside them (`baseline_*`), how many outputs were
token-identical, and for single-sequence points the per-position acceptance and step timings (metrics.timings).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

import torch

from ..batch import run_batch
from ..drafters import make
from ..engine import run
from ..metrics import per_position, tested, timings
from ..models import LM
from ..sampling import SamplingParams

Tick = Callable[[str], None] | None   # called after each run with what was run, for progress bars


def at(tick: Tick, where: str) -> Tick:
    """The same progress callback, saying which point of a sweep the run belongs to."""
    return (lambda what: tick(f"{where}, {what}")) if tick else None


def side_by_side(tgt: LM, prompts: list[list[int]], sp: SamplingParams, k: int | None, max_new: int,
                 specs: list[tuple[str, object]], tick: Tick = None):
    """Each prompt: plain decoding once, then each drafter (name, draft model or None), one after the other.
    -> (baseline runs, {name: runs}) with each run = (ids, records, metrics)."""
    base, spec = [], {n: [] for n, _ in specs}
    none = make("none", tgt)
    for i, ids in enumerate(prompts):
        base.append(run(tgt, none, ids, sp=sp, max_new_tokens=max_new, detail=False))
        if tick:
            tick(f"prompt {i + 1}, plain")
        for n, lm in specs:
            spec[n].append(run(tgt, make(n, tgt, lm), ids, sp=sp, k=k, max_new_tokens=max_new, detail=False))
            if tick:
                tick(f"prompt {i + 1}, {n}")
    return base, spec


def compare(s: dict, b: dict, steps: int, identical: int, prompts: int) -> dict:
    """One point: speculative totals `s` against baseline totals `b` (tokens, timings, counts)."""
    return {"acceptance_rate": s["accepted"] / s["drafted"] if s["drafted"] else 0.0,
            "mean_acceptance_length": s["tokens"] / steps if steps else 0.0,
            "ttft_ms": s["ttft_ms"], "baseline_ttft_ms": b["ttft_ms"],
            "tpot_ms": s["tpot_ms"], "baseline_tpot_ms": b["tpot_ms"],
            "tokens_per_s": s["tokens_per_s"], "baseline_tokens_per_s": b["tokens_per_s"],
            "speedup": s["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else 0.0,
            "tokens": s["tokens"], "steps": steps, "drafted": s["drafted"], "accepted": s["accepted"],
            "target_forwards": s["target_forwards"], "baseline_target_forwards": b["target_forwards"],
            "identical_outputs": identical, "prompts": prompts, "same_tokens_as_baseline": identical == prompts}


def point(base: list[tuple], spec: list[tuple]) -> dict:
    """One point from paired runs (same prompts, same settings)."""
    def agg(rs):
        ms = [m for _, _, m in rs]
        tok, sec = sum(m.tokens for m in ms), sum(m.total_s for m in ms)
        later = sum(max(0, m.tokens - 1) for m in ms)
        return {"tokens": tok, "tokens_per_s": tok / sec if sec else 0.0,
                "ttft_ms": 1e3 * sum(m.ttft_s for m in ms) / len(ms),
                "tpot_ms": 1e3 * sum(m.total_s - m.ttft_s for m in ms) / later if later else 0.0,
                "steps": sum(m.steps for m in ms), "drafted": sum(m.drafted for m in ms),
                "accepted": sum(m.accepted for m in ms),
                "target_forwards": sum(m.target_forwards for m in ms)}
    b, s = agg(base), agg(spec)
    tried, ok = per_position(r for _, recs, _ in spec for r in recs)
    return {**compare(s, b, s["steps"], sum(a[0] == c[0] for a, c in zip(base, spec)), len(base)),
            "per_position_acceptance": [o / t if t else 0.0 for o, t in zip(ok, tried)],
            "per_position_tried": tried, "tested": tested(r for _, recs, _ in spec for r in recs),
            **timings([recs for _, recs, _ in spec], [recs for _, recs, _ in base])}


def batch_point(tgt: LM, rows: list[list[int]], sp: SamplingParams, k: int | None, max_new: int,
                specs: list[tuple[str, object]], tick: Tick = None) -> dict[str, dict]:
    """One batch of len(rows) sequences decoded together (batch.py), plain and per drafter -> {name: point}."""
    def one(name, lm):
        res = run_batch(tgt, lambda: make(name, tgt, lm), rows, sp=sp, k=k, max_new_tokens=max_new)
        tok = sum(len(t) for t in res.tokens)
        sec, first = res.steps[-1].elapsed, res.steps[0].elapsed
        per_row = tok / len(rows)
        if tick:
            tick(f"batch of {len(rows)}, {name}")
        return {"tokens": tok, "tokens_per_s": tok / sec if sec else 0.0, "ttft_ms": 1e3 * first,
                "tpot_ms": 1e3 * (sec - first) / (per_row - 1) if per_row > 1 else 0.0,
                "drafted": sum(sum(s.drafted) for s in res.steps), "accepted": sum(sum(s.accepted) for s in res.steps),
                "row_steps": sum(s.active for s in res.steps), "target_forwards": res.steps[-1].target_forwards,
                "ids": res.tokens}
    b = one("none", None)
    out = {}
    for n, lm in specs:
        s = one(n, lm)
        out[n] = compare(s, b, s["row_steps"], sum(x == y for x, y in zip(b["ids"], s["ids"])), len(rows))
    return out


def sweep_temperature(target: LM, drafter: str, prompts: list, temperatures: Iterable[float], k: int | None = None,
                      max_new_tokens: int = 64, seed: int = 0, top_p: float = 1.0, draft_lm=None,
                      tick: Tick = None) -> Iterator[dict]:
    for t in temperatures:
        sp = SamplingParams(float(t), 0, top_p, seed)
        base, spec = side_by_side(target, prompts, sp, k, max_new_tokens, [(drafter, draft_lm)],
                                  at(tick, f"T = {t:g}"))
        yield {"temperature": float(t), "drafter": drafter, **point(base, spec[drafter])}


def sweep_k(target: LM, drafter: str, prompts: list, ks: Iterable[int], temperature: float = 0.0,
            max_new_tokens: int = 64, seed: int = 0, top_p: float = 1.0, draft_lm=None,
            tick: Tick = None) -> Iterator[dict]:
    sp = SamplingParams(temperature, 0, top_p, seed)
    for k in ks:
        base, spec = side_by_side(target, prompts, sp, int(k), max_new_tokens, [(drafter, draft_lm)],
                                  at(tick, f"k = {k}"))
        yield {"k": int(k), "drafter": drafter, **point(base, spec[drafter])}


def sweep_batch(target: LM, drafter: str, prompts: list, batch_sizes: Iterable[int], k: int | None = None,
                temperature: float = 0.0, max_new_tokens: int = 32, seed: int = 0, top_p: float = 1.0,
                draft_lm=None, tick: Tick = None) -> Iterator[dict]:
    """Throughput of one batch of B rows (prompts cycled), baseline and drafter, each through decode_batch."""
    sp = SamplingParams(temperature, 0, top_p, seed)
    for b in batch_sizes:
        rows = [prompts[i % len(prompts)] for i in range(int(b))]
        pt = batch_point(target, rows, sp, k, max_new_tokens, [(drafter, draft_lm)], tick)
        yield {"batch_size": int(b), "drafter": drafter, **pt[drafter]}


def hf_generate(target: LM, ids: torch.Tensor, max_new: int, lookup: bool) -> tuple[int, float, list[int]]:
    """transformers' own greedy generate (with its prompt lookup when `lookup`) -> (tokens, seconds, ids)."""
    kw = {"prompt_lookup_num_tokens": 10} if lookup else {}
    x = ids.view(1, -1).to(target.device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                                    do_sample=False, pad_token_id=target.tokenizer.eos_token_id, **kw)
    el = time.perf_counter() - t
    new = out[0, x.shape[1]:].tolist()
    return len(new), el, new


def per_prompt(target: LM, drafters: dict, prompts: list, sp: SamplingParams, k: int | None, max_new: int,
               hf: bool = False, meta: list[dict] | None = None, progress=iter) -> Iterator[dict]:
    """One row per prompt and drafter (`drafters`: name -> drafter, the baseline `none` first), one run after
    the other; with `hf`, transformers' generate and its prompt lookup beside them. First calls pay one-off
    costs (allocator, kernels), so every drafter decodes a short warm-up before anything is timed."""
    warm = target.encode("Hello")
    for dr in drafters.values():
        run(target, dr, warm, sp=sp, max_new_tokens=8)
    if hf:
        hf_generate(target, warm, 8, False), hf_generate(target, warm, 8, True)
    for i, ids in enumerate(progress(prompts)):
        head, base = (meta[i] if meta else {}), None
        for name, dr in drafters.items():
            toks, recs, m = run(target, dr, ids, sp=sp, k=k, max_new_tokens=max_new, detail=False)
            base = base or (m, toks)
            yield {**head, "drafter": name, "k": max((rc.k for rc in recs), default=0), **m.to_dict(),
                   "speedup": m.tokens_per_s / base[0].tokens_per_s,
                   "same_tokens_as_baseline": toks == base[1] if sp.greedy else None}
        if hf:
            for name, lk in (("hf-generate", False), ("hf-prompt-lookup", True)):
                n, el, toks = hf_generate(target, ids, max_new, lk)
                yield {**head, "drafter": name, "k": 10 * lk, "tokens": n, "total_s": el, "tokens_per_s": n / el,
                       "speedup": (n / el) / base[0].tokens_per_s,
                       "same_tokens_as_baseline": toks == base[1] if sp.greedy else None}
