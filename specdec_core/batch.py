"""Batched speculative decoding with ragged acceptance (batch sizes 1..64+).

Every sequence drafts, is verified and accepts its own number of tokens each step (the rule of verify.py, or of
verify_tree.py for a candidate tree, applied row by row). The batch shares one KV cache.

With our forward (forward.py) each row of the static cache keeps its own length: a row's new tokens go to the
slots after its committed ones, at their own positions, and what it keeps is its new length (a tree's accepted
path is compacted into place). No padding enters any row's attention, and the forward is batch-invariant, so
every row's logits are bitwise those it would get decoded alone.

With transformers' forward ragged acceptance is handled with *holes* instead of re-packing: each step appends
the same number of slots L to every row (as many as the longest row's pending token + draft), and a per-row
validity mask marks the slots that hold committed tokens. Rejected drafts and padding stay in the cache but are
masked out of every later query, and each row carries its own position ids, so every sequence sees exactly its
own tokens at their own positions: at temperature 0 its output is what it would be decoded alone. Slots that are invalid in every row at the tail are
cropped after each step.

Candidate trees (medusa) fit that scheme too. A row's tree takes T slots, the pending token (the root) first and
the nodes in tree order. Among the new slots a node sees only itself and its ancestors (tree.mask; a chain slot
sees the slots before it), at position (row position + depth). After verify_tree picks a path, the root and the
path's nodes become valid and every other node is a hole. Each path node was computed at the position it would
have alone, seeing exactly the committed context and its ancestors, so it is the entry decoding alone would keep,
wherever it sits: no compaction (models.keep's, alone) is needed, and the next step continues from the row's committed
length. The price is cache width: a tree step leaves up to T - 1 holes per row. A drafter that reads the target's
hidden state (`reads_hidden`, as medusa does) gets, per row, the final-norm hidden state of the newest token the
target has run for that row, after the batched prefill and after every step, as engine.py hands it over alone.

This is the padding-and-masking approach of batched assisted decoding (cf. Qian et al., "BASS: Batched
Attention-optimized Speculative Sampling", 2024), kept simple for teaching.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from . import chain_step, tree_step
from .drafters import DraftContext, Drafter, Proposal
from .engine import MAX_K, check_prompt, check_run_args, until_eos
from .models import LM, cache_kw, keep
from .policy import KPolicy
from .sampling import InputError, SamplingParams


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


def chain_mask(n: int) -> torch.Tensor:
    """Who sees whom [n, n] among n slots in a chain (causal)."""
    return torch.ones(n, n, dtype=torch.bool).tril()


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
                out = t.model(ids.to(dev), logits_to_keep=int(last_only), **kw, **{t.cache_arg: self.cache})
                return t.cut(out.logits.float()), None
            dec = t.model.get_decoder()
            h = dec(input_ids=ids.to(dev), **kw, **{cache_kw(dec): self.cache}).last_hidden_state
            return t.cut(t.model.get_output_embeddings()(h[:, -1:] if last_only else h).float()), h

    def prefill(self, rows: list[list[int]]):
        """Left-padded so every prompt ends in the last slot -> hidden [B, H] of each row's last token or None."""
        dev, B, P = self.t.device, self.B, max(len(r) for r in rows)
        ids = torch.zeros(B, P, dtype=torch.long)
        pvalid = torch.zeros(B, P, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
            pvalid[i, P - len(r):] = True
        pvalid = pvalid.to(dev)
        self.valid, self.pos = pvalid, pvalid.long().sum(1)                     # [B, S], [B] next position
        if not P:
            return None
        ppos = (pvalid.long().cumsum(1) - 1).clamp(min=0)
        _, h = self._forward(ids, chain_mask(P).to(dev)[None] & pvalid[:, None, :], ppos, pvalid[:, :0], True)
        return None if h is None else h[:, -1]

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
        """Each row at its own positions from slot 0 -> hidden [B, H] of each row's last token or None."""
        flat = [t for r in rows for t in r]
        for i, r in enumerate(rows):
            self.cache.set_length(i, len(r))
        if not flat:
            return None
        owner = [i for i, r in enumerate(rows) for _ in r]
        pos = [j for r in rows for j in range(len(r))]
        last = (torch.tensor([len(r) for r in rows]).cumsum(0) - 1).clamp(min=0)   # rows with no token: unused
        _, h = self._run(flat, owner, pos, out_rows=last.tolist())
        return h[last] if self.hidden else None

    def step(self, new):
        ids, owner, pos, slots, anc, spans = [], [], [], [], [], []
        for i, (s, o, a) in enumerate(new):
            base, n = self.cache.lens[i], len(s)
            spans.append((len(ids), n))
            ids += s
            owner += [i] * n
            pos += (base + o).tolist()
            slots += range(base, base + n)
            chain = bool(torch.equal(a, chain_mask(n)))
            anc += [None if chain else [base + c for c in range(n) if a[j, c]] for j in range(n)]
        logits, h = self._run(ids, owner, pos, slots, anc if any(x is not None for x in anc) else None)
        self.base = list(self.cache.lens)
        return [(logits[a:a + n], h[a:a + n]) for a, n in spans]

    def commit(self, i: int, kept: list[int]) -> None:
        keep(self.cache, self.base[i], kept, row=i)

    def end_step(self) -> None:
        pass

    def slots(self) -> tuple[int, list[int]]:
        return max(self.cache.lens), list(self.cache.lens)


def rows(target: LM, B: int, hidden: bool = False) -> "_Rows | _Holes":
    """B sequences through the target's own forward as decode_batch runs them: prefill, step, commit, end_step."""
    return (_Rows if target.fwd is not None else _Holes)(target, B, hidden)


def decode_batch(target: LM, make_drafter: Callable[[], Drafter], prompts: list[list[int]] | list[torch.Tensor],
                 sp: SamplingParams | None = None, k: int | None = None, max_new_tokens: int = 64,
                 stop_at_eos: bool = True, seeds: list[int] | None = None,
                 k_policy: str = "fixed") -> Iterator[BatchStep]:
    """Decode every prompt; one drafter per row (drafters may keep per-sequence state). Yields BatchStep.

    The steps are engine.py's, row by row, around one forward over the ragged batch. Each row draws from its
    own generator, seeded `seeds[i]` (default sp.seed + i), in the order engine.decode draws (the drafter's
    samples, then verification's uniforms and its final draw): with a batch-invariant forward, row i's tokens
    are exactly those engine.decode gives alone with that seed, whatever else runs in the batch. `k_policy`
    (policy.py) runs per row; "batch" sets every row's k from how many rows are still decoding."""
    sp = sp or SamplingParams()
    drafters = [make_drafter() for _ in prompts]
    k = drafters[0].default_k if k is None else k
    check_run_args(k, max_new_tokens)
    rows = [[int(t) for t in (p.tolist() if torch.is_tensor(p) else p)] for p in prompts]
    if not rows:
        raise InputError("the batch is empty: give at least one prompt")
    for r in rows:
        check_prompt(target, r, max_new_tokens, k)
    B = len(rows)
    eos = target.eos_ids if stop_at_eos else set()
    seeds = [sp.seed + i for i in range(B)] if seeds is None else list(seeds)
    if len(seeds) != B or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise InputError(f"seeds must be one integer per prompt ({B}), got {seeds!r}")
    gens = [torch.Generator(device=target.device).manual_seed(x) for x in seeds]
    pols = [KPolicy(k_policy, k) for _ in rows]
    hidden = drafters[0].reads_hidden
    kv = (_Rows if target.fwd is not None else _Holes)(target, B, hidden)

    t0 = time.perf_counter()
    # 0. prefill: each prompt but its last token, which is pending (engine.prefill)
    for d, r in zip(drafters, rows):
        d.begin(list(r))
    h = kv.prefill([r[:-1] for r in rows])                                 # [B, H] or None
    for i, r in enumerate(rows):
        if hidden and len(r) > 1:
            drafters[i].observe(h[i], len(r) - 1)
    tokens = [list(r) for r in rows]
    active, fwd = [True] * B, 0
    for index in itertools.count():
        live = [i for i in range(B) if active[i]]
        # 1. propose, per row
        ctxs, props, steps, new = {}, {}, {}, []
        for i in live:
            room = max_new_tokens - (len(tokens[i]) - len(rows[i]))
            ctxs[i] = ctx = DraftContext(tokens[i], len(rows[i]), min(pols[i].next_k(len(live)), room - 1, MAX_K), sp,
                                         gens[i], pols[i].stop_below)
            props[i] = drafters[i].propose(ctx) if ctx.k > 0 else Proposal.empty()
            steps[i] = tree_step if props[i].tree is not None else chain_step
        # 2. score: one forward over the ragged batch; per row, the new slots' ids, offsets and who sees whom
        new = [steps[i].slots(tokens[i][-1], props[i], ctxs[i].k) if active[i] else ([], torch.arange(0),
                                                                                       chain_mask(0))
               for i in range(B)]
        out = kv.step(new)
        fwd += 1
        # 3. verify and 4. commit, per row
        drafted, accepted, committed = [0] * B, [0] * B, [[] for _ in range(B)]
        for i in live:
            logits, hs = out[i]
            c = steps[i].verify(logits, new[i][0], props[i], sp, gens[i])
            ids, stop = until_eos(c.draft[:c.v.n_accepted].tolist() + [c.v.token], eos)
            kept = c.kept[:len(ids)]
            kv.commit(i, kept)
            tokens[i] += ids
            active[i] = not stop and len(tokens[i]) - len(rows[i]) < max_new_tokens
            drafted[i], accepted[i], committed[i] = c.draft.numel(), c.v.n_accepted, ids
            # 5. feedback
            if hidden:
                drafters[i].observe(hs[kept[-1]], len(tokens[i]) - 1)
            if drafted[i]:
                drafters[i].feedback(ctxs[i], c.v.n_accepted)
            pols[i].update(c.draft.numel(), c.v.n_accepted)
        kv.end_step()
        width, cached = kv.slots()
        yield BatchStep(index, drafted, accepted, committed, len(live), time.perf_counter() - t0, fwd,
                        width, cached, done=not any(active))
        if not any(active):
            return


def run_batch(target: LM, make_drafter, prompts, **kw) -> BatchResult:
    res = BatchResult([[] for _ in prompts])
    for s in decode_batch(target, make_drafter, prompts, **kw):
        res.steps.append(s)
        for i, c in enumerate(s.committed):
            res.tokens[i] += c
    return res
