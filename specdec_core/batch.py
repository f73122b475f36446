"""Batched speculative decoding with ragged acceptance (batch sizes 1..64+).

Every sequence drafts, is verified and accepts its own number of tokens each step (the rule of verify.py, or of
verify_tree.py for a candidate tree, applied row by row). The batch shares one KV cache; ragged acceptance is
handled with *holes* instead of re-packing: each step appends the same number of slots L to every row (as many
as the longest row's pending token + draft), and a per-row validity mask marks the slots that hold committed
tokens. Rejected drafts and padding stay in the cache but are masked out of every later query, and each row
carries its own position ids, so every sequence sees exactly its own tokens at their own positions: at
temperature 0 its output is what it would be decoded alone. Slots that are invalid in every row at the tail are
cropped after each step.

Candidate trees (medusa) fit the same scheme. A row's tree takes T slots, the pending token (the root) first and
the nodes in tree order. Among the new slots a node sees only itself and its ancestors (tree.mask; a chain slot
sees the slots before it), at position (row position + depth). After verify_tree picks a path, the root and the
path's nodes become valid and every other node is a hole. Each path node was computed at the position it would
have alone, seeing exactly the committed context and its ancestors, so it is the entry decoding alone would keep,
wherever it sits: no compaction (tree_step.py's) is needed, and the next step continues from the row's committed
length. The price is cache width: a tree step leaves up to T - 1 holes per row. A drafter that reads the target's
hidden state (it has `prefill`, as medusa does) gets, per row, the final-norm hidden state of the newest token
the target has run for that row: from the batched prefill through `prefilled`, and after each tree step (the last
accepted node, or the root) through `observe`, as tree_step.py hands it over alone.

This is the padding-and-masking approach of batched assisted decoding (cf. Qian et al., "BASS: Batched
Attention-optimized Speculative Sampling", 2024), kept simple for teaching.
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
from .tree_step import _cache_kw, chain_view
from .verify import one_hot, verify_chain
from .verify_tree import verify_tree


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


def _mask(valid: torch.Tensor, attend: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """4D additive mask [B, 1, L, S+L]: in row b, new query j sees b's valid cached slots and the new slots
    attend[b, j] allows (those before it for a chain, its ancestors for a tree).

    Each query also sees its own slot, so no row is fully masked (a padding query would otherwise give NaNs
    that leak into its keys and values)."""
    B, S = valid.shape
    L = attend.shape[1]
    new = attend | torch.eye(L, dtype=torch.bool, device=valid.device)[None]             # [B, L, L]
    allowed = torch.cat([valid[:, None, :].expand(B, L, S), new], dim=-1)              # [B, L, S+L]
    m = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return m.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def _chain(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets [n] and who-sees-whom [n, n] of n new slots in a chain (causal)."""
    return torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril()


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
    hidden = hasattr(drafters[0], "prefill")   # the drafter reads the target's hidden state (medusa)
    dec, lm_head = target.model.get_decoder(), target.model.get_output_embeddings()

    def forward(ids, attend, position_ids, valid, cache, last_only=False):
        """ids [B, L] -> logits [B, L, V] float32 ([B, 1, V] with last_only), and the final-norm hidden
        states [B, L, H] when the drafter reads them (the LM head's input, as in tree_step.tree_forward)."""
        kw = dict(attention_mask=_mask(valid, attend, mdt), position_ids=position_ids.to(dev), use_cache=True)
        with torch.inference_mode():
            if not hidden:
                out = target.model(ids.to(dev), logits_to_keep=int(last_only), **kw, **{target._cache_kw: cache})
                return out.logits.float(), None
            h = dec(input_ids=ids.to(dev), **kw, **{_cache_kw(dec): cache}).last_hidden_state
            return lm_head(h[:, -1:] if last_only else h).float(), h

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
    ppos = (pvalid.long().cumsum(1) - 1).clamp(min=0)
    logits, h = forward(ids, _chain(P)[1].to(dev)[None] & pvalid[:, None, :], ppos, pvalid[:, :0], cache, True)
    head = logits[:, -1]                                                   # [B, V]
    valid = pvalid                                                         # [B, S]
    pos = pvalid.long().sum(1)                                             # [B] next position per row
    tokens = [list(r) for r in rows]
    gen_ids: list[list[int]] = [[] for _ in rows]
    active = [True] * B
    pending: list[int | None] = [None] * B
    for i, (d, r) in enumerate(zip(drafters, rows)):
        if hidden:
            d.prefilled(h[i, -1], r)
        d.begin(list(r))
    fwd, step = 1, 0
    while any(active):
        # 1. propose, per row
        drafts, ctxs, trees = [], [], []
        for i in range(B):
            room = max_new_tokens - len(gen_ids[i])
            ctx = DraftContext(tokens[i], len(rows[i]), min(k, room - 1), sp, gen)
            prop = drafters[i].propose(ctx) if active[i] and ctx.k > 0 else None
            drafts.append(prop)
            ctxs.append(ctx)
            has_tree = prop is not None and prop.tree is not None and pending[i] is not None
            trees.append(prop.tree if has_tree else None)
        # each row's new slots: ids, position offsets and who sees whom among them
        new = []
        for i in range(B):
            if not active[i]:
                new.append(([],) + _chain(0))
            elif trees[i] is not None:          # root (the pending token) and nodes, in tree order
                new.append(([pending[i]] + drafts[i].tokens.tolist(), trees[i].depth, trees[i].mask))
            else:
                d = drafts[i].tokens[:ctxs[i].k].tolist() if drafts[i] is not None else []
                s = ([] if pending[i] is None else [pending[i]]) + d
                new.append((s,) + _chain(len(s)))
        # 2. score: one forward over the ragged batch, right-padded to L
        L = max(len(s) for s, _, _ in new)
        logits = None
        if L:
            ids = torch.zeros(B, L, dtype=torch.long)
            offs = torch.zeros(B, L, dtype=torch.long)
            attend = torch.zeros(B, L, L, dtype=torch.bool)
            for i, (s, o, a) in enumerate(new):
                ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
                offs[i, :len(s)], attend[i, :len(s), :len(s)] = o, a
            logits, h = forward(ids, attend.to(dev), pos[:, None] + offs.to(dev), valid, cache)   # [B, L, V]
            fwd += 1
        # 3. verify and 4. commit, per row
        keep = torch.zeros(B, L, dtype=torch.bool)
        n_drafted, n_acc, committed = [0] * B, [0] * B, [[] for _ in range(B)]
        was_active = sum(active)
        for i in range(B):
            if not active[i]:
                continue
            prop, first, n = drafts[i], pending[i] is None, len(new[i][0])
            if trees[i] is not None:
                nodes = torch.tensor(new[i][0], device=dev)
                tv = verify_tree(probs(logits[i, :n], sp), nodes, trees[i], gen)
                accepted, token, kept = nodes[tv.path].tolist(), tv.token, [0] + tv.path
                m = len(chain_view(trees[i], tv))
                drafters[i].observe(h[i, kept[-1]], len(tv.path))   # the hidden state of the newest committed
            else:
                draft = prop.tokens[:ctxs[i].k].to(dev) if prop is not None else torch.empty(0, dtype=torch.long,
                                                                                                  device=dev)
                m = draft.numel()
                rl = head[i:i + 1] if first else logits[i, :0]
                if n:
                    rl = torch.cat([rl, logits[i, :n]])                        # [m+1, V]
                V = rl.shape[-1] if prop is None or prop.q is None else max(rl.shape[-1], prop.q.shape[-1])
                p = _pad(probs(rl, sp), V)
                q = _pad(prop.q[:m].to(dev), V) if m and prop.q is not None else one_hot(draft, V)
                v = verify_chain(p, q, draft, gen)
                accepted, token = draft[:v.n_accepted].tolist(), v.token
                # the pending token (if any) and the accepted drafts are now committed cache entries
                kept = list(range((0 if first else 1) + v.n_accepted))
            new_ids = accepted + [token]
            for j, t in enumerate(new_ids):
                if t in eos:
                    new_ids = new_ids[:j + 1]
                    active[i] = False
                    break
            tokens[i] += new_ids
            gen_ids[i] += new_ids
            if len(gen_ids[i]) >= max_new_tokens:
                active[i] = False
            keep[i, kept] = True
            pos[i] += len(kept)
            pending[i] = new_ids[-1]
            n_drafted[i], n_acc[i], committed[i] = m, len(accepted), new_ids
            # 5. feedback
            if m:
                drafters[i].feedback(ctxs[i], len(accepted))
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
