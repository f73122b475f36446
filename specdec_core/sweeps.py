"""Sweeps behind the measurement pages and `python -m specdec_core sweep`: temperature, batch size, draft length.

Each point decodes the same prompts with the baseline (`none`) and the drafter side by side, in one process, and
is yielded as soon as it is measured so plots can fill in point by point. The draft-length page compares the
measurements with Leviathan et al. (2023), eq. 1 and Thm 3.8: with acceptance rate alpha and cost ratio c (one draft
step over one target step), the expected speedup of draft length k is (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)).
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from .batch import run_batch
from .drafters import make
from .engine import run
from .metrics import per_position, tested, timings
from .models import LM
from .sampling import SamplingParams


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. (2023), Thm 3.8: expected walltime improvement for draft length k."""
    if not 0.0 <= alpha <= 1.0 or k < 0 or c < 0:
        raise ValueError(f"need 0 <= alpha <= 1, k >= 0, c >= 0; got alpha={alpha}, k={k}, c={c}")
    tokens = k + 1 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Leviathan et al. (2023), eq. 1: E[committed tokens per step] = (1 - alpha^(k+1)) / (1 - alpha)."""
    return k + 1 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def theory(rows: list[dict]) -> dict[str, dict]:
    """Per drafter, pooled over every measured k: alpha = accepted / tested (metrics.tested); c from the step
    timings."""
    out = {}
    for d in dict.fromkeys(r["drafter"] for r in rows):
        rs = [r for r in rows if r["drafter"] == d]
        drafted = sum(r["drafted"] for r in rs)
        judged = sum(r["tested"] for r in rs)
        alpha = sum(r["accepted"] for r in rs) / judged if judged else 0.0
        draft_ms = sum(r["draft_ms_per_token"] * r["drafted"] for r in rs) / drafted if drafted else 0.0
        fwd = [r["target_forward_ms"] for r in rs if r["target_forward_ms"] > 0]
        fwd_ms = sum(fwd) / len(fwd) if fwd else 0.0
        out[d] = {"alpha": alpha, "c": draft_ms / fwd_ms if fwd_ms else 0.0, "draft_ms": draft_ms,
                  "forward_ms": fwd_ms, "drafted": drafted, "tested": judged}
    return out


def _point(runs: list[tuple], base: list[tuple]) -> dict:
    """Aggregate (ids, records, metrics) runs against their baselines into one point."""
    tok = sum(m.tokens for _, _, m in runs)
    sec = sum(m.total_s for _, _, m in runs)
    btok = sum(m.tokens for _, _, m in base)
    bsec = sum(m.total_s for _, _, m in base)
    drafted = sum(m.drafted for _, _, m in runs)
    accepted = sum(m.accepted for _, _, m in runs)
    steps = sum(m.steps for _, _, m in runs)
    tried, ok = per_position(r for _, recs, _ in runs for r in recs)
    tps, btps = tok / sec if sec else 0.0, btok / bsec if bsec else 0.0
    return {"acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_acceptance_length": tok / steps if steps else 0.0,
            "tokens_per_s": tps, "baseline_tokens_per_s": btps, "speedup": tps / btps if btps else 0.0,
            "tokens": tok, "drafted": drafted, "accepted": accepted, "steps": steps,
            "tested": tested(r for _, recs, _ in runs for r in recs),
            "per_position_acceptance": [o / t if t else 0.0 for o, t in zip(ok, tried)],
            "same_tokens_as_baseline": all(a[0] == b[0] for a, b in zip(runs, base)),
            **timings([recs for _, recs, _ in runs], [recs for _, recs, _ in base])}


def _pairs(target: LM, drafter_name: str, prompts: list, sp: SamplingParams, k: int | None, max_new: int,
           draft_lm=None, tick: Callable[[], None] | None = None):
    base, runs = [], []
    none, dr = make("none", target), make(drafter_name, target, draft_lm)
    for ids in prompts:
        base.append(run(target, none, ids, sp=sp, max_new_tokens=max_new, detail=False))
        runs.append(run(target, dr, ids, sp=sp, k=k, max_new_tokens=max_new, detail=False))
        if tick:
            tick()
    return runs, base


def sweep_temperature(target: LM, drafter: str, prompts: list, temperatures: Iterable[float], k: int | None = None,
                      max_new_tokens: int = 64, seed: int = 0, top_p: float = 1.0, draft_lm=None,
                      tick=None) -> Iterator[dict]:
    for t in temperatures:
        sp = SamplingParams(float(t), 0, top_p, seed)
        runs, base = _pairs(target, drafter, prompts, sp, k, max_new_tokens, draft_lm, tick)
        yield {"temperature": float(t), "drafter": drafter, **_point(runs, base)}


def sweep_k(target: LM, drafter: str, prompts: list, ks: Iterable[int], temperature: float = 0.0,
            max_new_tokens: int = 64, seed: int = 0, draft_lm=None, tick=None) -> Iterator[dict]:
    sp = SamplingParams(temperature, 0, 1.0, seed)
    for k in ks:
        runs, base = _pairs(target, drafter, prompts, sp, int(k), max_new_tokens, draft_lm, tick)
        yield {"k": int(k), "drafter": drafter, **_point(runs, base)}


def sweep_batch(target: LM, drafter: str, prompts: list, batch_sizes: Iterable[int], k: int | None = None,
                temperature: float = 0.0, max_new_tokens: int = 32, seed: int = 0, draft_lm=None,
                tick=None) -> Iterator[dict]:
    """Throughput of one batch of B rows (prompts cycled), baseline and drafter, each through decode_batch."""
    sp = SamplingParams(temperature, 0, 1.0, seed)
    for b in batch_sizes:
        rows = [prompts[i % len(prompts)] for i in range(int(b))]
        out = {}
        for name in ("none", drafter):
            res = run_batch(target, lambda: make(name, target, draft_lm), rows, sp=sp, k=k,
                            max_new_tokens=max_new_tokens)
            tok = sum(len(t) for t in res.tokens)
            sec = res.steps[-1].elapsed
            drafted = sum(sum(s.drafted) for s in res.steps)
            accepted = sum(sum(s.accepted) for s in res.steps)
            row_steps = sum(s.active for s in res.steps)
            out[name] = {"tokens": tok, "seconds": sec, "tokens_per_s": tok / sec, "drafted": drafted,
                         "accepted": accepted, "row_steps": row_steps, "forwards": res.steps[-1].target_forwards,
                         "ids": res.tokens}
            if tick:
                tick()
        d, n = out[drafter], out["none"]
        yield {"batch_size": int(b), "drafter": drafter,
               "acceptance_rate": d["accepted"] / d["drafted"] if d["drafted"] else 0.0,
               "mean_acceptance_length": d["tokens"] / d["row_steps"] if d["row_steps"] else 0.0,
               "tokens_per_s": d["tokens_per_s"], "baseline_tokens_per_s": n["tokens_per_s"],
               "speedup": d["tokens_per_s"] / n["tokens_per_s"], "tokens": d["tokens"],
               "target_forwards": d["forwards"], "baseline_target_forwards": n["forwards"],
               "same_tokens_as_baseline": d["ids"] == n["ids"]}
