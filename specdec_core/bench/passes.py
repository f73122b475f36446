"""What one target pass costs as the tokens it scores grow: the lesson's "checking k drafts costs about one
step" (Leviathan et al. 2023, §3: the verify pass rides on arithmetic a one-token step leaves idle), measured
through the model's own forward (ours or transformers', whichever the LM runs), by the measuring rule.

The rule (sweeps.ratios): the two passes of a pair run back to back, the order flipping every repeat
(sweeps.rounds), so a busy machine slows both alike; the quoted ratio is the median pair's, with the min-max of
the pairs, and a pair spread over sweeps.NOISY of the median marks the figure "noisy: rerun".
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from .. import clock
from ..backend import Slots, chain_mask
from ..models import LM
from ..sampling import SamplingParams
from .sweeps import ratios, rounds

REPS = 7        # pairs per figure: enough for a median and a spread, a few seconds on a CPU
WARM = 1        # pairs run first and dropped: the first call of a shape pays one-off setup


def paired(small: Callable[[], object], big: Callable[[], object], reps: int = REPS, warm: int = WARM) -> dict:
    """Time `small` and `big` back to back `reps` times (order alternating) -> ms of each (median, min, max)
    and big / small by the measuring rule: `ratio` (median pair), `ratio_min`, `ratio_max`, `noisy`."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    ms = {"small": [], "big": []}
    fns = {"small": small, "big": big}
    for r, _, order in rounds(SamplingParams(0.0), reps + warm, ["small", "big"]):
        for side in order:
            t = clock.now()
            fns[side]()
            if r >= warm:
                ms[side].append((clock.now() - t) * 1e3)
    return _figures(ms)


def _figures(ms: dict[str, list[float]]) -> dict:
    """Paired ms of `small` and `big` -> big / small by the measuring rule, with each side's median and range."""
    # the rule is written for rates (tokens/s); a pass's rate is 1 / ms, so rate(small) / rate(big) = big / small
    rule = ratios([1 / x for x in ms["small"]], [1 / x for x in ms["big"]])
    out = {"ratio": rule["speedup"], "ratio_min": rule["speedup_min"], "ratio_max": rule["speedup_max"],
           "noisy": rule["noisy"], "pairs": rule["repeats"]}
    for side, xs in ms.items():
        out |= {f"{side}_ms": statistics.median(xs), f"{side}_ms_min": min(xs), f"{side}_ms_max": max(xs)}
    return out


def one_pass(lm: LM, context: list[int], q: int) -> Callable[[], object]:
    """A pass of `lm` scoring q new tokens after `context` -> its output; the cache rolled back after each
    call, so every call scores the same positions."""
    cache = lm.new_cache()
    lm.forward(torch.tensor(context), cache)
    ids = torch.tensor(context[:q])

    def f():
        out = lm.forward(ids, cache)
        cache.crop(-q)
        return out
    return f


def token_cost(lm: LM, context: list[int], small: int = 1, big: int = 8, reps: int = REPS) -> dict:
    """One target pass scoring `small` vs `big` new tokens after `context` (the cache rolled back after each):
    a decode step against a verify step of big - 1 drafts. -> paired()'s figures."""
    if not 1 <= small < big <= len(context):
        raise ValueError(f"need 1 <= small < big <= the context's {len(context)} tokens, got {small} and {big}")
    return paired(one_pass(lm, context, small), one_pass(lm, context, big), reps)


def draft_cost(draft: LM, target: LM, context: list[int], reps: int = REPS, k: int = 4) -> dict:
    """A draft model's one-token pass against the target's, both after `context`: what each drafted token costs
    next to a target step, Leviathan et al.'s (2023) c = 1 / ratio. Timed in the order a decode step meets them,
    not alternating: a target pass, then k draft passes (the first reads the draft's weights back from memory,
    the target's pass having evicted them from the caches; the rest find them there), `reps` times after one
    warm-up round. -> paired()'s figures (small: the draft, its mean ms per pass over each round's k)."""
    if not context:
        raise ValueError("need a context of at least one token")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    d, t = one_pass(draft, context, 1), one_pass(target, context, 1)
    ms = {"small": [], "big": []}
    for r in range(reps + WARM):
        a = clock.now()
        t()
        b = clock.now()
        for _ in range(k):
            d()
        if r >= WARM:
            ms["big"].append((b - a) * 1e3)
            ms["small"].append((clock.now() - b) * 1e3 / k)
    return _figures(ms)


def batch_cost(lm: LM, batches=(1, 4, 8), tokens=(1, 5), context: int = 16, reps: int = 5,
               seed: int = 0) -> list[dict]:
    """One target pass over a batch of rows, each row scoring tokens[0] vs tokens[1] new tokens after `context`
    random tokens of its own, through the batch decoder's own forward (batch.py: the static cache with ours,
    masked slots with transformers') -> per batch size, paired()'s figures. Nothing is kept between passes."""
    lo, hi = tokens
    if not 1 <= lo < hi:
        raise ValueError(f"need 1 <= tokens[0] < tokens[1], got {tokens}")
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in batches:
        if b < 1:
            raise ValueError(f"a batch needs at least one row, got {b}")
        kv = lm.backend.rows(b, False)
        kv.prefill(torch.randint(0, lm.n_tokens, (b, context), generator=g).tolist())
        new = {n: [Slots(torch.randint(0, lm.n_tokens, (n,), generator=g).tolist(), torch.arange(n), chain_mask(n))
                   for _ in range(b)] for n in tokens}

        def once(n: int) -> Callable[[], None]:
            def f():
                kv.score(new[n])   # scored, none kept: the cache is as it was
                kv.end_step()
            return f
        rows.append({"batch": b, "tokens": tokens, **paired(once(lo), once(hi), reps)})
    return rows
