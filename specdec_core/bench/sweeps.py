"""Measurement points: the baseline (`none`) and drafters decode the same prompts with the same settings, one
after the other in this process, never at the same time, so they do not share the CPU. Speedup as in Leviathan
et al. (2023): tokens/s with speculation over tokens/s without. Sweeps move temperature, draft length or batch
size and yield each point as soon as it is measured, so a plot can fill in point by point.

One point has the same keys wherever it is made (the CLI's sweep, the measurement pages): the metrics of the
design notes for the speculative runs, the baseline's beside them (`baseline_*`), how many outputs were
token-identical, and for single-sequence points the per-position acceptance and step timings (metrics.timings).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import torch

from ..batch import run_batch
from ..drafters import PLAIN, entry, make
from ..engine import run
from ..metrics import per_position, tested, timings
from ..models import LM
from ..sampling import SamplingParams

Tick = Callable[[str], None] | None   # called after each run with what was run, for progress bars

REPEATS = 3     # each pair (plain, speculative) is timed this many times; the median ratio is quoted
NOISY = 0.25    # a point whose paired ratios spread over more than this share of their median: "noisy: rerun"
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


def at(tick: Tick, where: str) -> Tick:
    """The same progress callback, saying which point of a sweep the run belongs to."""
    return (lambda what: tick(f"{where}, {what}")) if tick else None


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's binomial interval for k successes in n trials (95% by default); (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    ph, d = k / n, 1 + z * z / n
    mid, half = (ph + z * z / (2 * n)) / d, z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def ratios(spec_tps: list[float], base_tps: list[float]) -> dict:
    """The measuring rule for a speedup: pairs measured back to back (so a busy machine slows both sides of a
    pair alike) give one ratio each; quote the median pair (the lower middle one for an even count, so the
    quoted speedup is exactly its tokens/s over its baseline's), with the min-max spread of the ratios, and call
    the point noisy when that spread passes NOISY of the median. The baseline's own spread between repeats says
    whether the machine was busy. `median_pair` is the quoted pair's index, for a page that replays it."""
    pairs = sorted((a / b, i) for i, (a, b) in enumerate(zip(spec_tps, base_tps)) if b > 0)
    if not pairs:
        return {"speedup": 0.0, "speedup_min": 0.0, "speedup_max": 0.0, "speedup_spread": 0.0, "noisy": False,
                "baseline_spread": 0.0, "repeats": 0, "tokens_per_s": 0.0, "baseline_tokens_per_s": 0.0,
                "median_pair": 0}
    med, i = pairs[(len(pairs) - 1) // 2]
    bt = [b for b in base_tps if b > 0]
    spread = (pairs[-1][0] - pairs[0][0]) / med if med else 0.0
    return {"speedup": med, "speedup_min": pairs[0][0], "speedup_max": pairs[-1][0], "speedup_spread": spread,
            "noisy": spread > NOISY, "baseline_spread": (max(bt) - min(bt)) / statistics.median(bt),
            "repeats": len(pairs), "tokens_per_s": spec_tps[i], "baseline_tokens_per_s": base_tps[i],
            "median_pair": i}


def rounds(sp: SamplingParams, repeats: int | None, order: list) -> Iterator[tuple[int, SamplingParams, list]]:
    """(r, sampling, order) for each repeat: the runs of a pair back to back, the order flipped every other
    repeat (A B, B A, ...) so neither side always runs on a warmer machine; at T > 0 repeat r samples with
    seed + r."""
    for r in range(repeats or REPEATS):
        yield r, (sp if sp.greedy else replace(sp, seed=sp.seed + r)), (order if r % 2 == 0 else order[::-1])


@dataclass
class Paired:
    """The runs of one point: base[r][i] and spec[name][r][i] for repeat r and prompt i, each pair back to back.
    At T > 0 repeat r samples with seed + r, so repeats also add fresh samples for acceptance; at T = 0 they
    repeat the same tokens and only the timing is new (`distinct` False)."""
    base: list[list[tuple]]
    spec: dict[str, list[list[tuple]]]
    distinct: bool


def side_by_side(tgt: LM, prompts: list[list[int]], sp: SamplingParams, k: int | None, max_new: int,
                 specs: list[tuple[str, object]], tick: Tick = None, repeats: int | None = None,
                 k_policy: str = "fixed") -> Paired:
    """Each repeat, each prompt: plain decoding and each drafter (name, draft model or None) back to back, in the
    order rounds() gives."""
    plain = make(PLAIN, tgt)
    base, spec = [], {n: [] for n, _ in specs}
    repeats = repeats or REPEATS
    for r, spr, order in rounds(sp, repeats, [(PLAIN, None)] + list(specs)):
        base.append([])
        for n in spec:
            spec[n].append([])
        for i, ids in enumerate(prompts):
            for n, lm in order:
                e = entry(n)
                dr = make(n, tgt, lm) if e.drafts else plain
                out = run(tgt, dr, ids, sp=spr, k=e.k(k), max_new_tokens=max_new, detail=False,
                          k_policy=e.policy(k_policy))
                (spec[n] if e.drafts else base)[r].append(out)
                if tick:
                    again = f", repeat {r + 1}" if repeats > 1 else ""
                    tick(f"prompt {i + 1}, {n if e.drafts else 'plain'}{again}")
    return Paired(base, spec, not sp.greedy and repeats > 1)


def compare(s: dict, b: dict, steps: int, identical: int, prompts: int, timing: dict | None = None) -> dict:
    """One point: speculative totals `s` against baseline totals `b` (tokens, timings, counts); `timing` is the
    paired-ratio summary (ratios()), else the ratio of the totals."""
    timing = timing or ratios([s["tokens_per_s"]], [b["tokens_per_s"]])
    lo, hi = wilson(s["accepted"], s["drafted"])
    return {"acceptance_rate": s["accepted"] / s["drafted"] if s["drafted"] else 0.0,
            "acceptance_lo": lo, "acceptance_hi": hi,
            "mean_acceptance_length": s["tokens"] / steps if steps else 0.0,
            "ttft_ms": s["ttft_ms"], "baseline_ttft_ms": b["ttft_ms"],
            "tpot_ms": s["tpot_ms"], "baseline_tpot_ms": b["tpot_ms"],
            "tokens_per_s": s["tokens_per_s"], "baseline_tokens_per_s": b["tokens_per_s"],
            **timing,
            "tokens": s["tokens"], "steps": steps, "drafted": s["drafted"], "accepted": s["accepted"],
            "target_forwards": s["target_forwards"], "baseline_target_forwards": b["target_forwards"],
            "identical_outputs": identical, "prompts": prompts, "same_tokens_as_baseline": identical == prompts}


def totals(rs: list[tuple]) -> dict:
    """Counts and timings summed over runs (ids, records, metrics)."""
    ms = [m for _, _, m in rs]
    tok, sec = sum(m.tokens for m in ms), sum(m.total_s for m in ms)
    later = sum(max(0, m.tokens - 1) for m in ms)
    return {"tokens": tok, "tokens_per_s": tok / sec if sec else 0.0,
            "ttft_ms": 1e3 * sum(m.ttft_s for m in ms) / len(ms),
            "tpot_ms": 1e3 * sum(m.total_s - m.ttft_s for m in ms) / later if later else 0.0,
            "steps": sum(m.steps for m in ms), "drafted": sum(m.drafted for m in ms),
            "accepted": sum(m.accepted for m in ms), "target_forwards": sum(m.target_forwards for m in ms)}


def point(pair: Paired, name: str) -> dict:
    """One point for drafter `name`: the speedup by the measuring rule (ratios()), tokens/s of its median pair;
    counts (acceptance and its interval, steps, tokens) over every repeat that drew fresh samples."""
    base, spec = pair.base, pair.spec[name]
    counted = slice(None) if pair.distinct else slice(0, 1)
    flat = lambda rr: [x for rep in rr[counted] for x in rep]
    b, s = totals(flat(base)), totals(flat(spec))
    b_tps = [totals(rep)["tokens_per_s"] for rep in base]
    s_tps = [totals(rep)["tokens_per_s"] for rep in spec]
    same = sum(a[0] == c[0] for ra, rc in zip(base[counted], spec[counted]) for a, c in zip(ra, rc))
    recs = [r for _, rr, _ in flat(spec) for r in rr]
    tried, ok = per_position(recs)
    return {**compare(s, b, s["steps"], same, len(flat(base)), ratios(s_tps, b_tps)),
            "per_position_acceptance": [o / t if t else 0.0 for o, t in zip(ok, tried)],
            "per_position_tried": tried, "tested": tested(recs),
            **timings([rr for _, rr, _ in flat(spec)], [rr for _, rr, _ in flat(base)])}


def batch_point(tgt: LM, rows: list[list[int]], sp: SamplingParams, k: int | None, max_new: int,
                specs: list[tuple[str, object]], tick: Tick = None, repeats: int | None = None,
                k_policy: str = "fixed") -> dict[str, dict]:
    """One batch of len(rows) sequences decoded together (batch.py), plain and per drafter, back to back and
    repeated as side_by_side does -> {name: point}."""
    def one(name, lm, spr):
        res = run_batch(tgt, lambda: make(name, tgt, lm), rows, sp=spr, k=k, max_new_tokens=max_new,
                        k_policy=entry(name).policy(k_policy))
        tok = sum(len(t) for t in res.tokens)
        sec, first = res.steps[-1].elapsed, res.steps[0].elapsed
        per_row = tok / len(rows)
        if tick:
            tick(f"batch of {len(rows)}, {name}")
        return {"tokens": tok, "tokens_per_s": tok / sec if sec else 0.0, "ttft_ms": 1e3 * first,
                "tpot_ms": 1e3 * (sec - first) / (per_row - 1) if per_row > 1 else 0.0,
                "drafted": sum(sum(s.drafted) for s in res.steps), "accepted": sum(sum(s.accepted) for s in res.steps),
                "row_steps": sum(s.active for s in res.steps), "target_forwards": res.steps[-1].target_forwards,
                "step_ms": 1e3 * (sec - first) / (len(res.steps) - 1) if len(res.steps) > 1 else 1e3 * sec,
                "ids": res.tokens}
    got = {n: [] for n in [PLAIN] + [n for n, _ in specs]}
    for _, spr, order in rounds(sp, repeats, [(PLAIN, None)] + list(specs)):
        for n, lm in order:
            got[n].append(one(n, lm, spr))
    out = {}
    b = got[PLAIN][0]
    for n, _ in specs:
        s = got[n][0]
        timing = ratios([x["tokens_per_s"] for x in got[n]], [x["tokens_per_s"] for x in got[PLAIN]])
        out[n] = {**compare(s, b, s["row_steps"], sum(x == y for x, y in zip(b["ids"], s["ids"])), len(rows), timing),
                  "step_ms": s["step_ms"], "plain_step_ms": b["step_ms"]}   # one batch step's wall time, prefill out
    return out


def sweep_temperature(target: LM, drafter: str, prompts: list, temperatures: Iterable[float], k: int | None = None,
                      max_new_tokens: int = 64, seed: int = 0, top_p: float = 1.0, draft_lm=None,
                      tick: Tick = None, repeats: int | None = None, draft_mode: str = "sample") -> Iterator[dict]:
    for t in temperatures:
        sp = SamplingParams(float(t), 0, top_p, seed, draft_mode)
        pair = side_by_side(target, prompts, sp, k, max_new_tokens, [(drafter, draft_lm)], at(tick, f"T = {t:g}"),
                            repeats)
        yield {"temperature": float(t), "drafter": drafter, **point(pair, drafter)}


def sweep_k(target: LM, drafter: str, prompts: list, ks: Iterable[int], temperature: float = 0.0,
            max_new_tokens: int = 64, seed: int = 0, top_p: float = 1.0, draft_lm=None,
            tick: Tick = None, repeats: int | None = None, draft_mode: str = "sample") -> Iterator[dict]:
    sp = SamplingParams(temperature, 0, top_p, seed, draft_mode)
    for k in ks:
        pair = side_by_side(target, prompts, sp, int(k), max_new_tokens, [(drafter, draft_lm)], at(tick, f"k = {k}"),
                            repeats)
        yield {"k": int(k), "drafter": drafter, **point(pair, drafter)}


def sweep_policy(target: LM, drafter: str, prompts: list, policies: Iterable[str], k: int, temperature: float = 0.0,
                 max_new_tokens: int = 64, seed: int = 0, top_p: float = 1.0, draft_lm=None, tick: Tick = None,
                 repeats: int | None = None, draft_mode: str = "sample") -> Iterator[dict]:
    """One point per draft-length policy (policy.py), k being the schedule's start and the confidence bound."""
    sp = SamplingParams(temperature, 0, top_p, seed, draft_mode)
    for pol in policies:
        pair = side_by_side(target, prompts, sp, int(k), max_new_tokens, [(drafter, draft_lm)], at(tick, pol),
                            repeats, k_policy=pol)
        yield {"k_policy": pol, "k": int(k), "drafter": drafter, **point(pair, drafter)}


def sweep_batch(target: LM, drafter: str, prompts: list, batch_sizes: Iterable[int], k: int | None = None,
                temperature: float = 0.0, max_new_tokens: int = 32, seed: int = 0, top_p: float = 1.0,
                draft_lm=None, tick: Tick = None, repeats: int | None = None,
                draft_mode: str = "sample", k_policy: str = "fixed") -> Iterator[dict]:
    """Throughput of one batch of B rows (prompts cycled), baseline and drafter, each through decode_batch."""
    sp = SamplingParams(temperature, 0, top_p, seed, draft_mode)
    for b in batch_sizes:
        rows = [prompts[i % len(prompts)] for i in range(int(b))]
        pt = batch_point(target, rows, sp, k, max_new_tokens, [(drafter, draft_lm)], tick, repeats, k_policy)
        yield {"batch_size": int(b), "drafter": drafter, "k_policy": k_policy, **pt[drafter]}


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
               hf: bool = False, meta: list[dict] | None = None, progress=iter,
               repeats: int | None = None, k_policy: str = "fixed") -> Iterator[dict]:
    """One row per prompt and drafter (`drafters`: name -> drafter, the baseline `none` first); each prompt's
    runs back to back, `repeats` times in alternating order, and the speedup by the measuring rule (ratios());
    with `hf`, transformers' generate and its prompt lookup beside them. First calls pay one-off costs
    (allocator, kernels), so every drafter decodes a short warm-up before anything is timed."""
    warm = target.encode("Hello")
    for dr in drafters.values():
        run(target, dr, warm, sp=sp, max_new_tokens=8)
    if hf:
        hf_generate(target, warm, 8, False), hf_generate(target, warm, 8, True)
    for i, ids in enumerate(progress(prompts)):
        head = meta[i] if meta else {}
        got = {n: [] for n in drafters} | ({"hf-generate": [], "hf-prompt-lookup": []} if hf else {})
        for _, _, order in rounds(sp, repeats, list(got)):   # one seed throughout: each row is one prompt's
            for name in order:
                if name in drafters:
                    toks, recs, m = run(target, drafters[name], ids, sp=sp, k=k, max_new_tokens=max_new, detail=False,
                                        k_policy=entry(name).policy(k_policy))
                    got[name].append((toks, recs, m, m.tokens_per_s))
                else:
                    n, el, toks = hf_generate(target, ids, max_new, name == "hf-prompt-lookup")
                    got[name].append((toks, None, {"tokens": n, "total_s": el}, n / el))
        base_tps = [x[3] for x in got[PLAIN]]
        base_toks = got[PLAIN][0][0]
        for name, rs in got.items():
            toks, recs, m, _ = rs[0]
            row = m.to_dict() if recs is not None else dict(m)
            yield {**head, "drafter": name,
                   "k": max((rc.k for rc in recs), default=0) if recs is not None else 10 * (name == "hf-prompt-lookup"),
                   **row, **ratios([x[3] for x in rs], base_tps),
                   "same_tokens_as_baseline": toks == base_toks if sp.greedy else None}
