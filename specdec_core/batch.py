"""Batched speculative decoding with ragged acceptance (batch sizes 1..64+).

Every sequence drafts, is verified and accepts its own number of tokens each step (the rule of verify.py, or of
verify_tree.py for a candidate tree, applied row by row). The batch shares one KV cache.

With our forward (forward.py) each row of the static cache keeps its own length: a row's new tokens go to the
slots after its committed ones, at their own positions, and what it keeps is its new length (a tree's accepted
path is compacted into place). No padding enters any row's attention, and the forward is batch-invariant, so
every row's logits are bitwise those it would get decoded alone.

With transformers' forward ragged acceptance is handled with *holes* instead of re-packing: each step appends
the same number of slots L to every row (as many as the longest row's pending token + draft), and a per-row
validity mask marks the slots that hold committed tokens. Rejected drafts and padding stay in the cache but are masked out of every later query, and each row
carries its own position ids, so every sequence sees exactly its own tokens at their own positions: at
temperature 0 its output is what it would be decoded alone. Slots that are invalid in every row at the tail are
cropped after each step.

Candidate trees (medusa) fit that scheme too. A row's tree takes T slots, the pending token (the root) first and
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
from .engine import _pad, check_context, check_run_args
from .models import LM, _cache_kw
from .sampling import InputError, SamplingParams, probs
from .tree_step import chain_view
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


class _Holes:
    """transformers' forward: one DynamicCache, right-aligned prompts, rejected slots kept as masked holes."""

    def __init__(self, target: LM, B: int, hidden: bool):
        self.t, self.B, self.hidden = target, B, hidden
        self.cache = target.new_cache()
        self.valid = None                                                       # [B, S] committed slots

    def _forward(self, ids, attend, position_ids, valid, last_only=False):
        t, dev = self.t, self.t.device
        kw = dict(attention_mask=_mask(valid, attend, t.dtype), position_ids=position_ids.to(dev), use_cache=True)
        with torch.inference_mode():
            if not self.hidden:
                out = t.model(ids.to(dev), logits_to_keep=int(last_only), **kw, **{t._cache_kw: self.cache})
                return out.logits.float(), None
            dec = t.model.get_decoder()
            h = dec(input_ids=ids.to(dev), **kw, **{_cache_kw(dec): self.cache}).last_hidden_state
            return t.model.get_output_embeddings()(h[:, -1:] if last_only else h).float(), h

    def prefill(self, rows: list[list[int]]):
        """Left-padded so every prompt ends in the last slot -> (logits [B, V], hidden [B, H] or None)."""
        dev, B, P = self.t.device, self.B, max(len(r) for r in rows)
        ids = torch.zeros(B, P, dtype=torch.long)
        pvalid = torch.zeros(B, P, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, P - len(r):] = torch.tensor(r)
            pvalid[i, P - len(r):] = True
        pvalid = pvalid.to(dev)
        ppos = (pvalid.long().cumsum(1) - 1).clamp(min=0)
        logits, h = self._forward(ids, _chain(P)[1].to(dev)[None] & pvalid[:, None, :], ppos, pvalid[:, :0], True)
        self.valid = pvalid
        self.keep = torch.zeros(B, 0, dtype=torch.bool)
        self.pos = pvalid.long().sum(1)                                         # [B] next position per row
        return logits[:, -1], None if h is None else h[:, -1]

    def step(self, new):
        """new: per row (ids, position offsets, who-sees-whom) -> per row (logits [n, V], hidden [n, H])."""
        dev, B = self.t.device, self.B
        L = max(len(s) for s, _, _ in new)
        ids = torch.zeros(B, L, dtype=torch.long)
        offs = torch.zeros(B, L, dtype=torch.long)
        attend = torch.zeros(B, L, L, dtype=torch.bool)
        for i, (s, o, a) in enumerate(new):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            offs[i, :len(s)], attend[i, :len(s), :len(s)] = o, a
        logits, h = self._forward(ids, attend.to(dev), self.pos[:, None] + offs.to(dev), self.valid)   # [B, L, V]
        self.keep = torch.zeros(B, L, dtype=torch.bool)
        return [(logits[i, :len(s)], None if h is None else h[i, :len(s)]) for i, (s, _, _) in enumerate(new)]

    def commit(self, i: int, kept: list[int]) -> None:
        """Row i keeps these of its new slots (in order): they become valid, the rest are holes."""
        if not kept:
            return
        self.keep[i, kept] = True
        self.pos[i] += len(kept)

    def end_step(self) -> None:
        self.valid = torch.cat([self.valid, self.keep.to(self.t.device)], dim=1)
        tail = int((~self.valid).flip(1).long().cumprod(1).sum(1).min())     # slots empty in every row at the end
        if tail:
            self.cache.crop(-tail)
            self.valid = self.valid[:, :self.valid.shape[1] - tail]

    def slots(self) -> tuple[int, list[int]]:
        return self.valid.shape[1], self.valid.sum(1).tolist()


class _Rows:
    """Our forward: a static cache with one length per row; kept tokens are compacted into place."""

    def __init__(self, target: LM, B: int, hidden: bool):
        self.fwd, self.hidden = target.fwd, hidden
        self.cache = target.new_cache(B)

    def _run(self, ids, rows, pos, slots=None, anc=None, out_rows=None):
        return self.fwd(torch.tensor(ids, dtype=torch.long), rows, torch.tensor(pos), self.cache,
                        None if slots is None else torch.tensor(slots), anc,
                        None if out_rows is None else torch.tensor(out_rows), hidden=True)

    def prefill(self, rows: list[list[int]]):
        flat = [t for r in rows for t in r]
        owner = [i for i, r in enumerate(rows) for _ in r]
        pos = [j for r in rows for j in range(len(r))]
        last = torch.tensor([len(r) for r in rows]).cumsum(0) - 1
        logits, h = self._run(flat, owner, pos, out_rows=last.tolist())
        for i, r in enumerate(rows):
            self.cache.set_length(i, len(r))
        self.base = list(self.cache.lens)
        return logits, h[last] if self.hidden else None

    def step(self, new):
        ids, owner, pos, slots, anc, spans = [], [], [], [], [], []
        for i, (s, o, a) in enumerate(new):
            base, n = self.cache.lens[i], len(s)
            spans.append((len(ids), n))
            ids += s
            owner += [i] * n
            pos += (base + o).tolist()
            slots += range(base, base + n)
            chain = bool(torch.equal(a, _chain(n)[1]))
            anc += [None if chain else [base + c for c in range(n) if a[j, c]] for j in range(n)]
        logits, h = self._run(ids, owner, pos, slots, anc if any(x is not None for x in anc) else None)
        self.base = list(self.cache.lens)
        return [(logits[a:a + n], h[a:a + n]) for a, n in spans]

    def commit(self, i: int, kept: list[int]) -> None:
        if kept == list(range(len(kept))):
            self.cache.set_length(i, self.base[i] + len(kept))
        else:
            self.cache.compact(i, self.base[i], torch.tensor(kept))

    def end_step(self) -> None:
        pass

    def slots(self) -> tuple[int, list[int]]:
        return max(self.cache.lens), list(self.cache.lens)


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
    for r in rows:
        check_context(target, len(r), max_new_tokens, k)
    B, dev = len(rows), target.device
    eos = target.eos_ids if stop_at_eos else set()
    gen = torch.Generator(device=dev).manual_seed(sp.seed)
    hidden = hasattr(drafters[0], "prefill")   # the drafter reads the target's hidden state (medusa)
    kv = (_Rows if target.fwd is not None else _Holes)(target, B, hidden)

    t0 = time.perf_counter()
    # 0. prefill
    head, h = kv.prefill(rows)                                             # [B, V], [B, H]
    tokens = [list(r) for r in rows]
    gen_ids: list[list[int]] = [[] for _ in rows]
    active = [True] * B
    pending: list[int | None] = [None] * B
    for i, (d, r) in enumerate(zip(drafters, rows)):
        if hidden:
            d.prefilled(h[i], r)
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
        # 2. score: one forward over the ragged batch
        L = max(len(s) for s, _, _ in new)
        out = kv.step(new) if L else None
        fwd += bool(L)
        # 3. verify and 4. commit, per row
        n_drafted, n_acc, committed = [0] * B, [0] * B, [[] for _ in range(B)]
        was_active = sum(active)
        for i in range(B):
            if not active[i]:
                continue
            prop, first, n = drafts[i], pending[i] is None, len(new[i][0])
            if trees[i] is not None:
                nodes = torch.tensor(new[i][0], device=dev)
                tv = verify_tree(probs(out[i][0], sp), nodes, trees[i], gen)
                accepted, token, kept = nodes[tv.path].tolist(), tv.token, [0] + tv.path
                m = len(chain_view(trees[i], tv))
                drafters[i].observe(out[i][1][kept[-1]], len(tv.path))   # the hidden state of the newest committed
            else:
                draft = prop.tokens[:ctxs[i].k].to(dev) if prop is not None else torch.empty(0, dtype=torch.long,
                                                                                                  device=dev)
                m = draft.numel()
                rl = head[i:i + 1] if first else head[i, :0]
                if n:
                    rl = torch.cat([rl, out[i][0]])                            # [m+1, V]
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
            kv.commit(i, kept)
            pending[i] = new_ids[-1]
            n_drafted[i], n_acc[i], committed[i] = m, len(accepted), new_ids
            # 5. feedback
            if m:
                drafters[i].feedback(ctxs[i], len(accepted))
        if L:
            kv.end_step()
        width, cached = kv.slots()
        yield BatchStep(step, n_drafted, n_acc, committed, was_active, time.perf_counter() - t0, fwd,
                        width, cached, done=not any(active))
        step += 1


def run_batch(target: LM, make_drafter, prompts, **kw) -> BatchResult:
    res = BatchResult([[] for _ in prompts])
    for s in decode_batch(target, make_drafter, prompts, **kw):
        res.steps.append(s)
        for i, c in enumerate(s.committed):
            res.tokens[i] += c
    return res
