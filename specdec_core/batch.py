"""Batched speculative decoding with ragged acceptance (batch sizes 1..64+).

Every sequence drafts, is verified and accepts its own number of tokens each step (the rule of verify.py, applied
row by row). The batch shares one KV cache; ragged acceptance is handled with *holes* instead of re-packing:
each step appends the same number of slots L = 1 + max_i k_i to every row, and a per-row validity mask marks the
slots that hold committed tokens. Rejected drafts and padding stay in the cache but are masked out of every later
query, and each row carries its own position ids, so every sequence sees exactly its own tokens at their own
positions: at temperature 0 its output is what it would be decoded alone. Slots that are invalid in every row at
the tail are cropped after each step. This is the padding-and-masking approach of batched assisted decoding
(cf. Qian et al., "BASS: Batched Attention-optimized Speculative Sampling", 2024), kept simple for teaching.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .drafters import DraftContext, Drafter
from .engine import _pad, check_run_args
from .models import LM
from .sampling import InputError, SamplingParams, probs
from .verify import one_hot, verify_chain


@dataclass
class BatchStep:
    index: int
    drafted: list[int]          # [B] tokens drafted per row this step (0 for finished rows)
    accepted: list[int]         # [B] tokens accepted per row
    committed: list[list[int]]  # [B] ids committed per row this step
    active: int                 # rows still decoding before this step
    elapsed: float              # seconds since the start, prefill included
    target_forwards: int
    slots: int                  # cache slots per row after the step (holes included)
    cached: list[int] = field(default_factory=list)  # [B] valid (committed) cache entries per row
    done: bool = False


@dataclass
class BatchResult:
    tokens: list[list[int]] = field(default_factory=list)   # [B] generated ids
    steps: list[BatchStep] = field(default_factory=list)


def _mask(valid: torch.Tensor, new_valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """4D additive mask [B, 1, L, S+L]: a query sees valid cached slots, and valid new slots up to itself.

    Each query also sees its own slot, so no row is fully masked (a padding query would otherwise give NaNs
    that leak into its keys and values)."""
    B, S = valid.shape
    L = new_valid.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=valid.device).tril()           # [L, L]
    new = causal[None] & new_valid[:, None, :]                                           # [B, L, L]
    new |= torch.eye(L, dtype=torch.bool, device=valid.device)[None]
    allowed = torch.cat([valid[:, None, :].expand(B, L, S), new], dim=-1)              # [B, L, S+L]
    m = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return m.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def decode_batch(target: LM, make_drafter: Callable[[], Drafter], prompts: list[list[int]] | list[torch.Tensor],
                 sp: SamplingParams | None = None, k: int | None = None, max_new_tokens: int = 64,
                 stop_at_eos: bool = True) -> Iterator[BatchStep]:
    """Decode every prompt; one drafter per row (drafters may keep per-sequence state). Yields BatchStep."""
    sp = sp or SamplingParams()
    drafters = [make_drafter() for _ in prompts]
    k = drafters[0].default_k if k is None else k
    check_run_args(k, max_new_tokens)
    rows = [[int(t) for t in (p.tolist() if torch.is_tensor(p) else p)] for p in prompts]
    if not rows or any(not r for r in rows):
        raise InputError("every prompt in a batch must hold at least one token")
    B, dev = len(rows), target.device
    eos = target.eos_ids if stop_at_eos else set()
    gen = torch.Generator(device=dev).manual_seed(sp.seed)
    mdt = target.dtype
    kw_cache = target._cache_kw

    def forward(ids, new_valid, pos, valid, cache):
        L = ids.shape[1]
        position_ids = pos[:, None] + torch.arange(L, device=dev)[None]   # [B, L]
        out = target.model(ids.to(dev), attention_mask=_mask(valid, new_valid, mdt), position_ids=position_ids,
                           use_cache=True, **{kw_cache: cache})
        return out.logits.float()                                          # [B, L, V]

    t0 = time.perf_counter()
    # 0. prefill, left-padded so every prompt ends in the last slot
    P = max(len(r) for r in rows)
    ids = torch.zeros(B, P, dtype=torch.long)
    pvalid = torch.zeros(B, P, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r)
        pvalid[i, P - len(r):] = True
    pvalid = pvalid.to(dev)
    cache = target.new_cache()
    with torch.inference_mode():
        ppos = (pvalid.long().cumsum(1) - 1).clamp(min=0)
        out = target.model(ids.to(dev), attention_mask=_mask(pvalid[:, :0], pvalid, mdt), position_ids=ppos,
                           use_cache=True, **{kw_cache: cache})
    head = out.logits[:, -1].float()                                       # [B, V]
    valid = pvalid                                                         # [B, S]
    pos = pvalid.long().sum(1)                                             # [B] next position per row
    tokens = [list(r) for r in rows]
    gen_ids: list[list[int]] = [[] for _ in rows]
    active = [True] * B
    pending: list[int | None] = [None] * B
    for d, r in zip(drafters, rows):
        d.begin(list(r))
    fwd, step = 1, 0
    while any(active):
        # 1. propose, per row
        drafts, ctxs = [], []
        for i in range(B):
            room = max_new_tokens - len(gen_ids[i])
            ctx = DraftContext(tokens[i], len(rows[i]), min(k, room - 1), sp, gen)
            prop = drafters[i].propose(ctx) if active[i] and ctx.k > 0 else None
            drafts.append(prop)
            ctxs.append(ctx)
        seqs = []
        for i in range(B):
            d = drafts[i].tokens[:ctxs[i].k].tolist() if drafts[i] is not None else []
            seqs.append(([] if pending[i] is None else [pending[i]]) + d if active[i] else [])
        # 2. score: one forward over the ragged batch, right-padded to L
        L = max(len(s) for s in seqs)
        logits = None
        if L:
            ids = torch.zeros(B, L, dtype=torch.long)
            new_valid = torch.zeros(B, L, dtype=torch.bool)
            for i, s in enumerate(seqs):
                ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
                new_valid[i, :len(s)] = True
            new_valid = new_valid.to(dev)
            with torch.inference_mode():
                logits = forward(ids, new_valid, pos, valid, cache)        # [B, L, V]
            fwd += 1
        # 3. verify and 4. commit, per row
        keep = torch.zeros(B, L, dtype=torch.bool)
        n_drafted, n_acc, committed = [0] * B, [0] * B, [[] for _ in range(B)]
        was_active = sum(active)
        for i in range(B):
            if not active[i]:
                continue
            prop = drafts[i]
            draft = prop.tokens[:ctxs[i].k].to(dev) if prop is not None else torch.empty(0, dtype=torch.long,
                                                                                              device=dev)
            m = draft.numel()
            first = pending[i] is None
            rl = head[i:i + 1] if first else logits[i, :0]
            if len(seqs[i]):
                rl = torch.cat([rl, logits[i, :len(seqs[i])]])             # [m+1, V]
            V = rl.shape[-1] if prop is None or prop.q is None else max(rl.shape[-1], prop.q.shape[-1])
            p = _pad(probs(rl, sp), V)
            q = _pad(prop.q[:m].to(dev), V) if m and prop.q is not None else one_hot(draft, V)
            v = verify_chain(p, q, draft, gen)
            new = draft[:v.n_accepted].tolist() + [v.token]
            for j, t in enumerate(new):
                if t in eos:
                    new = new[:j + 1]
                    active[i] = False
                    break
            tokens[i] += new
            gen_ids[i] += new
            if len(gen_ids[i]) >= max_new_tokens:
                active[i] = False
            # the pending token (if any) and the accepted drafts are now committed cache entries
            keep[i, :(0 if first else 1) + v.n_accepted] = True
            pos[i] += (0 if first else 1) + v.n_accepted
            pending[i] = new[-1]
            n_drafted[i], n_acc[i], committed[i] = m, v.n_accepted, new
            # 5. feedback
            if m:
                drafters[i].feedback(ctxs[i], v.n_accepted)
        if L:
            valid = torch.cat([valid, keep.to(dev)], dim=1)
            tail = int((~valid).flip(1).long().cumprod(1).sum(1).min())    # slots empty in every row at the end
            if tail:
                cache.crop(-tail)
                valid = valid[:, :valid.shape[1] - tail]
        yield BatchStep(step, n_drafted, n_acc, committed, was_active, time.perf_counter() - t0, fwd,
                        valid.shape[1], valid.sum(1).tolist(), done=not any(active))
        step += 1


def run_batch(target: LM, make_drafter, prompts, **kw) -> BatchResult:
    res = BatchResult([[] for _ in prompts])
    for s in decode_batch(target, make_drafter, prompts, **kw):
        res.steps.append(s)
        for i, c in enumerate(s.committed):
            res.tokens[i] += c
    return res
