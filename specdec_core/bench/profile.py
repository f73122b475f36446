"""The cost side of speculative decoding: where a step's time goes, and what that predicts.

A drafter pays off only when its draft is cheap next to one target step and the verify pass over k + 1 tokens
(or a tree) costs little more than a one-token step. This module measures both from the StepRecords' own
timings (engine.py: propose, score, verify, commit/feedback) and sets three speedups side by side:

  Leviathan et al. (2023), eq. 1 and Thm 3.8: (1 - alpha^(k+1)) / ((1 - alpha)(c k + 1)), from the measured
      alpha (accepted / judged guesses, metrics.tested), the measured cost ratio c and the draft length k.
      It assumes a verify pass costs exactly one target step and every step drafts k tokens.
  cost model: tokens per step x plain step ms / speculative step ms, from the measured tokens per step and the
      measured wall time of a step (every phase, the verify pass's real cost and the loop's bookkeeping).
  measured: tokens/s over plain decoding's tokens/s by the project's measuring rule (sweeps.rounds, paired,
      repeated, order alternating; sweeps.ratios).

Plain decoding (drafter `none`) is always measured too: its median score time is the one-token target step
every ratio is taken against. Timings per step leave out each run's first step, whose wall time holds the
prefill (and a draft model's first pass over the prompt); counts (tokens, alpha) take every step.
"""
from __future__ import annotations

import statistics
from ..drafters import PLAIN, Drafter, entry, make
from ..engine import run
from ..metrics import tested
from ..models import LM
from ..records import StepRecord
from ..sampling import SamplingParams
from .sweeps import Tick, ratios, rounds
from .theory import expected_speedup

PHASES = ("draft", "score", "verify", "commit", "bookkeeping")
WARMUP_TOKENS = 8


def scored(r: StepRecord) -> tuple[str, int]:
    """What the step's one target forward scored: ("tree", nodes with the root) or ("chain", drafts + 1)."""
    if r.tree is not None:
        return "tree", len(r.tree.nodes)
    return "chain", r.k + 1


def depth(r: StepRecord) -> int:
    """Draft positions the step proposed: a chain's length, a tree's depth (one draft pass per level for the
    autoregressive drafters, the positions Leviathan et al.'s k counts)."""
    return r.tree.depth if r.tree is not None else r.k


def steady(runs: list[list[StepRecord]]) -> list[tuple[StepRecord, float]]:
    """(record, wall seconds of its step) for every step but each run's first: the time from the previous
    record to this one, so it holds the four timed phases and what they leave out (building the record, the
    loop). A run of one step has nothing steady; then its step stands for itself, its wall time the sum of the
    phases (no bookkeeping measured)."""
    out = [(r, r.elapsed - prev.elapsed) for recs in runs for prev, r in zip(recs, recs[1:])]
    return out or [(r, r.t_draft + r.t_score + r.t_verify + r.t_commit) for recs in runs for r in recs[:1]]


def phase_ms(steps: list[tuple[StepRecord, float]]) -> dict:
    """Mean ms per step in each phase (means, so the phases add up to the step)."""
    n = len(steps)
    mean = lambda f: 1e3 * sum(f(r, w) for r, w in steps) / n
    out = {"step_ms": mean(lambda r, w: w), "draft_ms": mean(lambda r, w: r.t_draft),
           "score_ms": mean(lambda r, w: r.t_score), "verify_ms": mean(lambda r, w: r.t_verify),
           "commit_ms": mean(lambda r, w: r.t_commit)}
    # never negative: each phase is a slice of the interval between two records (one monotonic clock)
    out["bookkeeping_ms"] = max(0.0, out["step_ms"] - sum(out[f"{p}_ms"] for p in PHASES[:-1]))
    return out


def cost(st: list[tuple[StepRecord, float]], plain_ms: float) -> tuple[float, float]:
    """(c, median score ms) of steady steps: c is the draft's ms per drafted position over a one-token target
    step (`plain_ms`); the score pass is the median over steps that scored drafts (all steps when none did)."""
    positions = sum(depth(r) for r, _ in st)
    c = (1e3 * sum(r.t_draft for r, _ in st) / positions / plain_ms) if positions and plain_ms else 0.0
    spec = [r for r, _ in st if r.k] or [r for r, _ in st]
    return c, 1e3 * statistics.median(r.t_score for r in spec)


def split(runs: list[list[StepRecord]], plain: list[list[StepRecord]]) -> dict:
    """Where a speculative step's time went, against a plain step: mean ms per step in each phase of `runs`
    (steady()), plain decoding's mean step ms and median score ms (`plain`, the one-token target step), the
    draft's cost c and the score pass as a multiple of a plain one (score_x)."""
    st, base = steady(runs), steady(plain)
    if not st or not base:
        raise ValueError("split needs at least one step of each")
    plain_ms = 1e3 * statistics.median(r.t_score for r, _ in base)
    c, score_ms = cost(st, plain_ms)
    return {**phase_ms(st), "plain_step_ms": phase_ms(base)["step_ms"], "plain_score_ms": plain_ms,
            "score_median_ms": score_ms, "c": c, "score_x": score_ms / plain_ms if plain_ms else 0.0}


def padded(n: int, block: int) -> int:
    """The rows a product multiplies to score n slots: n rounded up to the backend's row block."""
    return -(-n // block) * block


def row(name: str, k: int, runs: list[tuple], plain_ms: float, plain_step_ms: float, timing: dict,
        same: bool | None, block: int = 1) -> dict:
    """One drafter's profile from its runs (ids, records, metrics), against plain decoding's median score ms
    (`plain_ms`, the one-token target step) and mean step ms; `timing`: the measured speedup (sweeps.ratios);
    `block`: the target's row block (backend.row_block): what a score pass of n slots really multiplies."""
    recs = [rr for _, rr, _ in runs]
    every = [r for rr in recs for r in rr]
    st = steady(recs)
    ph = phase_ms(st)
    drafted, accepted = sum(r.k for r in every), sum(r.n_accepted for r in every)
    judged = tested(every)
    tokens = sum(len(r.committed) for r in every)
    spec = [(r, w) for r, w in st if r.k]                 # steps whose forward scored drafts
    kinds = {scored(r)[0] for r, _ in spec}
    positions = sum(depth(r) for r, _ in st)
    c, score_ms = cost(st, plain_ms)
    alpha = accepted / judged if judged else 0.0
    tps = tokens / len(every)
    return {"drafter": name, "k": k, "runs": len(runs), "steps": len(every), "tokens": tokens,
            "tokens_per_step": tps, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0, "alpha": alpha,
            "draft_positions_per_step": positions / len(st),
            "scored": "tree" if "tree" in kinds else "chain",
            "scored_tokens": statistics.fmean(scored(r)[1] for r, _ in spec) if spec else 1.0,
            "scored_rows": statistics.fmean(padded(scored(r)[1], block) for r, _ in spec) if spec else block,
            **ph, "score_median_ms": score_ms, "plain_score_ms": plain_ms, "plain_step_ms": plain_step_ms,
            "c": c, "score_x": score_ms / plain_ms if plain_ms else 0.0,
            "predicted_speedup": expected_speedup(alpha, k, c),
            "cost_model_speedup": tps * plain_step_ms / ph["step_ms"] if ph["step_ms"] else 0.0,
            **timing, "same_tokens_as_baseline": same}


def profile(target: LM, drafters: dict[str, Drafter], prompts: list, sp: SamplingParams | None = None,
            k: int | None = None, max_new_tokens: int = 64, repeats: int | None = None, k_policy: str = "fixed",
            tick: Tick = None, warmup: bool = True) -> list[dict]:
    """One row per drafter, plain decoding (`none`) first and always measured: per-phase ms per step, the
    draft's cost c per drafted position over a one-token target step (plain decoding's median score ms), the
    score pass as a multiple of that step and what it scored, measured alpha and tokens per step, and the
    three speedups (module docstring). `prompts`: id lists or tensors; each repeat runs every prompt through
    every drafter back to back, in the order sweeps.rounds gives (flipped every other repeat); at T > 0
    repeat r samples with seed + r. `warmup`: every drafter first decodes a few tokens untimed (allocator,
    kernels, a drafter's own one-off loads)."""
    if not prompts:
        raise ValueError("profile needs at least one prompt")
    sp = sp or SamplingParams()
    drafters = {PLAIN: drafters.get(PLAIN) or make(PLAIN, target)} | {n: d for n, d in drafters.items()
                                                                        if entry(n).drafts}
    kw = lambda n: dict(k=entry(n).k(k), k_policy=entry(n).policy(k_policy), detail=False)
    if warmup:
        for n, d in drafters.items():
            run(target, d, prompts[0], sp=sp, max_new_tokens=WARMUP_TOKENS, **kw(n))
    got: dict[str, list[list[tuple]]] = {n: [] for n in drafters}   # got[name][repeat][prompt]
    for r, spr, order in rounds(sp, repeats, list(drafters)):
        for n in drafters:
            got[n].append([])
        for i, ids in enumerate(prompts):
            for n in order:
                got[n][r].append(run(target, drafters[n], ids, sp=spr, max_new_tokens=max_new_tokens, **kw(n)))
                if tick:
                    tick(f"prompt {i + 1}, {n}, repeat {r + 1}")
    flat = lambda n: [x for rep in got[n] for x in rep]
    tps = lambda rep: sum(m.tokens for _, _, m in rep) / sum(m.total_s for _, _, m in rep)
    base = flat(PLAIN)
    base_steady = steady([rr for _, rr, _ in base])
    plain_ms = 1e3 * statistics.median(r.t_score for r, _ in base_steady)
    plain_step_ms = phase_ms(base_steady)["step_ms"]
    base_tps = [tps(rep) for rep in got[PLAIN]]
    out = []
    for n, d in drafters.items():
        kk = entry(n).k(d.default_k if k is None else k)
        same = all(a[0] == b[0] for a, b in zip(base, flat(n))) if sp.greedy else None
        out.append(row(n, kk, flat(n), plain_ms, plain_step_ms, ratios([tps(rep) for rep in got[n]], base_tps), same,
                       target.backend.row_block))
    return out


COST = {"k": "k", "draft_ms": "draft", "score_ms": "score", "verify_ms": "verify", "commit_ms": "commit",
        "bookkeeping_ms": "bookkeeping", "step_ms": "step", "c": "c", "scored": "scored", "scored_tokens": "tokens",
        "scored_rows": "rows", "score_x": "score_x"}
SPEEDUP = {"alpha": "alpha", "tokens_per_step": "tokens/step", "predicted_speedup": "Leviathan",
           "cost_model_speedup": "cost model", "speedup": "measured", "speedup_min": "min", "speedup_max": "max",
           "tokens_per_s": "tok/s", "baseline_tokens_per_s": "plain tok/s"}


def tables(rows: list[dict]) -> tuple["pandas.DataFrame", "pandas.DataFrame"]:
    """The rows as two tables for the command line, one drafter a line: where a step's time goes (ms per step,
    c, the score pass), and the speedups side by side (predicted by Leviathan et al., by the cost model,
    measured)."""
    import pandas as pd
    df = pd.DataFrame(rows).set_index("drafter")
    return df[list(COST)].rename(columns=COST), df[list(SPEEDUP)].rename(columns=SPEEDUP)
