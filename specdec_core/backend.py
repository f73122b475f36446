"""The seam between the decoders and the forward that runs a model's weights.

Two backends run the same weights: ours (forward.py: batch-invariant, a static KV cache with one committed
length per row; the default) and transformers' own (`hf`, the reference: a growing DynamicCache). The decoders
(engine.py, batch.py, the early exit drafter) ask a backend, never which one it is:

  new_cache(batch)                          an empty KV cache
  forward(ids, cache, last_only, hidden)    ids [n] after what the cache holds -> logits [n, V] (and hidden)
  tree_forward(cache, ids, tree)            a candidate tree after the cache (Miao et al., "SpecInfer", 2024)
  keep(cache, start, kept, row)             after a forward appended slots from `start`, keep start + kept
  rows(B, hidden)                           B sequences decoded together: prefill, score (a chain or a tree
                                            per row), commit, end_step (Rows: ours; MaskedRows: transformers')
  derive(...)                               a network over the target's first layers and an exit
  row_block                                 products run rows in blocks of this many: scoring n slots costs
                                            what scoring n rounded up to a block costs (sizes that fit pay)
  block_ms(blocks)                          what a score pass of 1, 2, .. blocks of rows costs on this
                                            machine, measured once per forward (a drafter sizes its tree by it)

`Single` is one sequence through an LM's forward / tree_forward / keep, with either backend: what engine.py
steps. Only this module tells the two backends apart (tests/test_architecture.py holds that).

This module is also the one door to the fast path (the package `fast/`: prepared products, the C++ and TorchScript
layer loops, the 4-bit products, the drafters' packed heads, thread control). Nothing else in the lesson's code
imports it (tests/test_architecture.py holds that too): `forward_of`, `eagle_rows` and `medusa_rows` hand out the
fast versions, which compute what the reference computes, where `fast_on()`; with SPECDEC_FAST=0 the reference
runs instead (forward.py op by op with plain products; the drafters' trained modules).
"""
from __future__ import annotations

import functools
import inspect
import os
import statistics
import time
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import forward as _forward
from .fast import eagle_packed, loop, packed, q4, threads
from .forward import Forward, Linear, block_of


def fast_on() -> bool:
    """Whether the fast path runs (SPECDEC_FAST=0: the reference only, to read, to change, or to hold it against)."""
    return os.environ.get("SPECDEC_FAST", "1") != "0"


def forward_of(model, head: torch.Tensor | None = None, vocab=None, int8: bool = False, q4_from=None) -> Forward:
    """Our forward of a transformers model (Forward.from_model's head and vocab): with the fast path, every product
    prepared (packed.Dense; int8: a draft model's int8 weights) and its loops attached, the layers reading the 4-bit
    blocks of the GGUF file `q4_from` where that kernel runs; without it, the reference."""
    if not fast_on():
        return Forward.from_model(model, head, vocab)
    f = loop.attach(Forward.from_model(model, head, vocab, linear=functools.partial(packed.Dense, int8=int8)))
    if q4_from is not None:
        f.q4_note = q4.attach(f, q4_from)
    return f


def eagle_rows(head, embed: torch.Tensor, lm_w: torch.Tensor, dtype: torch.dtype, int8: bool, ids):
    """EAGLE's head as drafting calls it (a level's rows -> features and top-k), packed (fast/eagle_packed.py, int8
    products where asked); None without the fast path (the drafter runs its trained module: eagle.HeadRows)."""
    if not fast_on():
        return None
    return eagle_packed.PackedHead(head, embed, lm_w, dtype, max_pos=512, int8=int8, ids=ids)


def medusa_rows(heads, w: torch.Tensor, n: int, dtype: torch.dtype, int8: bool):
    """Medusa's first n heads as drafting calls them (h -> each head's top-k), packed (fast/packed.py); None without
    the fast path (the drafter runs its trained module: medusa.HeadRows)."""
    return packed.PackedHeads(heads, w, n, dtype, int8) if fast_on() else None


def kernel(name: str):
    """One of the fast path's C++ functions (a bench's switch or probe), or None where it is off or not built."""
    return packed.native_op(name) if fast_on() else None


def release_threads() -> None:
    """Give the CPU's worker threads back till the next call (fast/threads.py): a shared model's idle turn."""
    threads.release()


def loop_name(f: Forward | None) -> str:
    """Which loop runs our forward's one-row calls, for a figure's header ('' for transformers' forward)."""
    return loop.loop_name(f)


def reads_q4(f: Forward | None) -> bool:
    """Whether f's layer products read 4-bit weights now."""
    return loop.reads_q4(f)


def q4_kernel() -> tuple:
    """(the 4-bit kernel this machine runs or None, why not)."""
    return q4.kernel() if fast_on() else (None, "the fast path is off (SPECDEC_FAST=0)")


class Slots(NamedTuple):
    """What one row sends through the target in a step, after its committed context."""
    ids: list[int]          # [n] the pending token, then the drafts (a tree's nodes in tree order)
    offs: torch.Tensor      # [n] position offsets after the context (a tree node's depth)
    see: torch.Tensor       # [n, n] who sees whom among them (causal for a chain, ancestors for a tree)
    tree: object = None     # the tree.Tree they are, or None for a chain


def chain_mask(n: int) -> torch.Tensor:
    """Who sees whom [n, n] among n slots in a chain (causal)."""
    return torch.ones(n, n, dtype=torch.bool).tril()


NOTHING = Slots([], torch.arange(0), chain_mask(0))   # a row that has finished


def of(lm) -> "OwnForward | HFForward":
    """The backend that runs `lm`: ours when attach_forward gave it our forward, else transformers'."""
    return OwnForward(lm.fwd) if lm.fwd is not None else HFForward.of(lm)


# ---------------------------------------------------------------- ours

class Backend:
    """What both backends share: the rollback decision. Each says how to truncate and how to compact."""

    def keep(self, cache, start: int, kept: list[int], row: int = 0) -> None:
        """After a forward appended slots from `start`: keep start + kept. Kept slots in order (a chain's accepted
        prefix) need only a truncation; others (a tree's path) are moved into place."""
        if kept == list(range(len(kept))):
            self.truncate(cache, start + len(kept), row)
        else:
            self.compact(cache, start, torch.tensor(kept), row)


class OwnForward(Backend):
    """Our forward (forward.py): rows of a static cache; rollback sets a length, a tree's path is compacted."""
    name = "ours"

    def __init__(self, fwd: Forward):
        self.fwd = fwd

    @property
    def row_block(self) -> int:
        """forward.ROWS, read when asked (the GPU check varies it): every product pads its rows to it; 1 where the
        forward pads none (its layers' products take each row alone: the 4-bit dot products), so every row costs."""
        return 1 if self.fwd.pad == 1 else _forward.ROWS

    def new_cache(self, batch: int = 1):
        return self.fwd.new_cache(batch)

    def forward(self, ids: torch.Tensor, cache, last_only: bool = False, hidden: bool = False):
        return self.fwd.append(ids, cache, last_only, hidden)

    def tree_forward(self, cache, ids: torch.Tensor, tree) -> tuple[torch.Tensor, torch.Tensor]:
        T, L = ids.numel(), cache.lens[0]
        anc = [[L + j for j in [0] + tree.path_to(i)] if i else [L] for i in range(T)]
        logits, h = self.fwd(ids, [0] * T, L + tree.depth, cache, slots=torch.arange(L, L + T), anc=anc,
                             hidden=True)
        cache.lens[0] = L + T
        return logits, h

    @torch.inference_mode()
    def compact(self, cache, start: int, keep: torch.Tensor, row: int = 0) -> None:
        cache.compact(row, start, keep)

    def truncate(self, cache, end: int, row: int = 0) -> None:
        cache.set_length(row, end)

    def rows(self, B: int, hidden: bool) -> "Rows":
        return Rows(self, B, hidden)

    @torch.inference_mode()
    def block_ms(self, blocks: int = 4, context: int = 64, reps: int = 5) -> list[float]:
        """ms of one chain forward of row_block * j slots after `context` slots, j = 1..blocks: medians of
        interleaved repetitions, measured at the first call for this forward and kept (a probe like
        forward.in_place_ok: costs depend on the machine's kernels, not on arithmetic)."""
        key = (blocks, context, self.row_block)
        got = _BLOCK_MS.setdefault(self.fwd, {})
        if key not in got:
            cache = self.new_cache()
            n_ids = self.fwd.embed.shape[0]
            self.forward(torch.arange(context) % n_ids, cache)
            sizes = [self.row_block * j for j in range(1, blocks + 1)]
            ms = {n: [] for n in sizes}
            sync = torch.cuda.synchronize if self.fwd.device.type == "cuda" else (lambda: None)
            for r in range(reps + 1):
                for n in sizes:
                    sync()
                    t = time.perf_counter()
                    self.forward(torch.arange(n) % n_ids, cache)
                    sync()
                    if r:                                      # the first round warms the shapes up
                        ms[n].append(1e3 * (time.perf_counter() - t))
                    cache.crop(-n)
            got[key] = [statistics.median(ms[n]) for n in sizes]
        return got[key]

    def derive(self, net, layers: int, layer: torch.nn.Module, norm_w: torch.Tensor, head_w: torch.Tensor,
               vocab) -> "OwnForward":
        """The first `layers` blocks (the target's weights), then `layer`, a norm and a head: an early exit's
        network; with the fast path its products read int8 weights where the CPU has the kernel (packed.Dense: a
        draft's few rows are bound by the bytes they read; the trunk's are int8 copies of the target's)."""
        if self.fwd.fast is None:
            return OwnForward(self.fwd.derive(self.fwd.blocks[:layers] + [block_of(layer)], norm_w, Linear(head_w),
                                              vocab))
        int8 = functools.partial(packed.Dense, int8=True)
        return OwnForward(loop.attach(self.fwd.derive([b.remade(int8) for b in self.fwd.blocks[:layers]]
                                                      + [block_of(layer, int8)], norm_w, int8(head_w), vocab)))


_BLOCK_MS: "weakref.WeakKeyDictionary[Forward, dict]" = weakref.WeakKeyDictionary()


class Rows:
    """B sequences in one static cache, each row at its own length: a row's new tokens go to the slots after
    its committed ones, at their own positions, and what it keeps is its new length (a tree's accepted path
    compacted into place). No padding enters any row's attention, and the forward is batch-invariant, so
    every row's logits are bitwise those it would get decoded alone."""

    def __init__(self, be: OwnForward, B: int, hidden: bool):
        self.be, self.B, self.hidden = be, B, hidden
        self.cache = be.new_cache(B)

    def _run(self, ids, rows, pos, slots=None, anc=None, out_rows=None):
        return self.be.fwd(torch.tensor(ids, dtype=torch.long), rows, torch.tensor(pos), self.cache,
                           None if slots is None else torch.tensor(slots), anc,
                           None if out_rows is None else torch.tensor(out_rows), hidden=True)

    def prefill(self, rows: list[list[int]]):
        """Each row at its own positions from slot 0 (a row that opens with the chat template's opening from its
        stored rows: Forward.open) -> per row the hidden states of its tokens [n, H], or None."""
        opened = [self.be.fwd.open(r, self.cache, i) for i, r in enumerate(rows)]
        start = [0 if h is None else h.shape[0] for h in opened]
        rest = [r[a:] for r, a in zip(rows, start)]
        flat = [t for r in rest for t in r]
        for i, r in enumerate(rows):
            self.cache.set_length(i, len(r))
        if not flat:
            return None
        owner = [i for i, r in enumerate(rest) for _ in r]
        pos = [j for r, a in zip(rest, start) for j in range(a, a + len(r))]
        end = torch.tensor([len(r) for r in rest]).cumsum(0).tolist()
        last = [max(e - 1, 0) for e in end]      # logits of each row's last token only (rows with none: unused)
        _, h = self._run(flat, owner, pos, out_rows=last)
        if not self.hidden:
            return None
        return [h[e - len(r):e] if h0 is None else torch.cat([h0, h[e - len(r):e]])
                for e, r, h0 in zip(end, rest, opened)]

    def score(self, new: list[Slots]):
        """Per row its new slots -> per row (logits [n, V], hidden [n, H]), in one forward."""
        ids, owner, pos, slots, anc, spans = [], [], [], [], [], []
        for i, s in enumerate(new):
            base, n = self.cache.lens[i], len(s.ids)
            spans.append((len(ids), n))
            ids += s.ids
            owner += [i] * n
            pos += (base + s.offs).tolist()
            slots += range(base, base + n)
            chain = bool(torch.equal(s.see, chain_mask(n)))
            anc += [None if chain else [base + c for c in range(n) if s.see[j, c]] for j in range(n)]
        logits, h = self._run(ids, owner, pos, slots, anc if any(x is not None for x in anc) else None)
        self.base = list(self.cache.lens)
        return [(logits[a:a + n], h[a:a + n]) for a, n in spans]

    def commit(self, i: int, kept: list[int]) -> None:
        self.be.keep(self.cache, self.base[i], kept, row=i)

    def end_step(self) -> None:
        pass

    def slots(self) -> tuple[int, list[int]]:
        """(cache slots per row, committed entries per row)."""
        return max(self.cache.lens), list(self.cache.lens)


# ---------------------------------------------------------------- transformers'

def dynamic_cache(config):
    """transformers' growing KV cache (older releases take no config)."""
    from transformers import DynamicCache
    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def cache_kw(module) -> str:
    """The name `module.forward` gives its KV cache argument: transformers 5.2x says `cache`, earlier 5.x and
    4.x say `past_key_values`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class HFForward(Backend):
    """transformers' forward: a DynamicCache that grows by what is run and is cropped (or a tree's path
    compacted) on rollback. `model` (the causal LM) may be None: then `dec` and `head` run it."""
    name = "hf"
    row_block = 1                      # no padding: each product runs the rows it is given

    def block_ms(self, blocks: int = 4, context: int = 64, reps: int = 5) -> list[float]:
        """Not measured for transformers' forward: [] (a drafter keeps its fixed size)."""
        return []

    def __init__(self, model, dec, head, cut, dtype: torch.dtype, device: torch.device, config):
        self.model, self.dec, self.head, self.cut = model, dec, head, cut
        self.dtype, self.device, self.config = dtype, device, config

    @classmethod
    def of(cls, lm) -> "HFForward":
        m = lm.model
        return cls(m, m.get_decoder(), lambda h: lm.cut(m.get_output_embeddings()(h).float()), lm.cut, lm.dtype,
                   lm.device, m.config)

    def new_cache(self, batch: int = 1):
        return dynamic_cache(self.config)

    def run(self, cache, last_only: bool = False, hidden: bool = False, **kw):
        """[B, n] inputs after what `cache` holds (kw: input_ids or inputs_embeds, attention_mask, position_ids)
        -> (logits [B, n or 1, V] float32, final-norm hidden [B, n, H] or None)."""
        if not hidden and self.model is not None:
            out = self.model(logits_to_keep=int(last_only), use_cache=True, **kw, **{cache_kw(self.model): cache})
            return self.cut(out.logits.float()), None
        h = self.dec(use_cache=True, **kw, **{cache_kw(self.dec): cache}).last_hidden_state
        return self.head(h[:, -1:] if last_only else h), h

    def forward(self, ids: torch.Tensor, cache, last_only: bool = False, hidden: bool = False):
        logits, h = self.run(cache, last_only, hidden, input_ids=ids.view(1, -1).to(self.device))
        return (logits[0], h[0]) if hidden else logits[0]

    def tree_forward(self, cache, ids: torch.Tensor, tree) -> tuple[torch.Tensor, torch.Tensor]:
        T, L, dev = ids.numel(), cache.get_seq_length(), self.device
        emb = self.dec.get_input_embeddings()(ids.view(1, -1).to(dev))                  # [1, T, H]
        seen = torch.ones(T, L + T, dtype=torch.bool, device=dev)
        seen[:, L:] = tree.mask.to(dev)
        mask = torch.zeros(1, 1, T, L + T, dtype=emb.dtype, device=dev)
        mask.masked_fill_(~seen, torch.finfo(emb.dtype).min)                             # additive: eager and sdpa
        pos = (L + tree.depth).view(1, -1).to(dev)
        logits, h = self.run(cache, hidden=True, inputs_embeds=emb, attention_mask=mask, position_ids=pos)
        return logits[0], h[0]

    @torch.inference_mode()
    def compact(self, cache, start: int, keep: torch.Tensor, row: int = 0) -> None:
        for layer in cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            idx = (start + keep).to(layer.keys.device)
            n = keep.numel()
            layer.keys[..., start:start + n, :] = layer.keys[..., idx, :]   # gather first (a copy), then write
            layer.values[..., start:start + n, :] = layer.values[..., idx, :]
            layer.keys = layer.keys[..., :start + n, :]
            layer.values = layer.values[..., :start + n, :]

    def truncate(self, cache, end: int, row: int = 0) -> None:
        if (drop := cache.get_seq_length() - end) > 0:
            cache.crop(-drop)

    def rows(self, B: int, hidden: bool) -> "MaskedRows":
        return MaskedRows(self, B, hidden)

    def derive(self, net, layers: int, layer: torch.nn.Module, norm_w: torch.Tensor, head_w: torch.Tensor,
               vocab) -> "HFForward":
        """`net` (a decoder over the first layers, `layer` and its norm) and the head rows `head_w` (a draft
        vocabulary's, scattered back to the whole one)."""
        def head(h: torch.Tensor) -> torch.Tensor:
            logits = F.linear(h, head_w).float()                                              # [.., v]
            return vocab.scatter(logits) if vocab is not None else logits                     # [.., V]
        return HFForward(None, net, head, lambda x: x, self.dtype, self.device, net.config)


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


class MaskedRows:
    """B sequences in one DynamicCache with right-aligned prompts; ragged acceptance leaves *holes* instead of
    re-packing. Each step appends the same number of slots to every row (the longest row's pending token and
    drafts), and a per-row validity mask marks the slots that hold committed tokens: rejected drafts, a tree's
    other nodes and padding stay in the cache but are masked out of every later query, and each row carries its
    own position ids, so every sequence sees exactly its own tokens at their own positions. Slots invalid in
    every row at the tail are cropped after each step."""

    def __init__(self, be: HFForward, B: int, hidden: bool):
        self.be, self.B, self.hidden = be, B, hidden
        self.cache = be.new_cache()
        self.valid = None                                                       # [B, S] committed slots

    def _forward(self, ids, attend, position_ids, valid, last_only=False):
        dev = self.be.device
        with torch.inference_mode():
            return self.be.run(self.cache, last_only, self.hidden, input_ids=ids.to(dev),
                               attention_mask=_mask(valid, attend, self.be.dtype), position_ids=position_ids.to(dev))

    def prefill(self, rows: list[list[int]]):
        """Left-padded so every prompt ends in the last slot -> per row the hidden states of its tokens [n, H],
        or None."""
        dev, B, P = self.be.device, self.B, max(len(r) for r in rows)
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
        return None if h is None else [h[i, P - len(r):] for i, r in enumerate(rows)]

    def score(self, new: list[Slots]):
        """Per row its new slots -> per row (logits [n, V], hidden [n, H] or None), in one forward."""
        dev, B = self.be.device, self.B
        L = max(len(s.ids) for s in new)
        ids = torch.zeros(B, L, dtype=torch.long)
        offs = torch.zeros(B, L, dtype=torch.long)
        attend = torch.zeros(B, L, L, dtype=torch.bool)
        for i, s in enumerate(new):
            n = len(s.ids)
            ids[i, :n] = torch.tensor(s.ids, dtype=torch.long)
            offs[i, :n], attend[i, :n, :n] = s.offs, s.see
        logits, h = self._forward(ids, attend.to(dev), self.pos[:, None] + offs.to(dev), self.valid)   # [B, L, V]
        self.keep = torch.zeros(B, L, dtype=torch.bool)
        return [(logits[i, :len(s.ids)], None if h is None else h[i, :len(s.ids)]) for i, s in enumerate(new)]

    def commit(self, i: int, kept: list[int]) -> None:
        """Row i keeps these of its new slots (in order): they become valid, the rest are holes."""
        if not kept:
            return
        self.keep[i, kept] = True
        self.pos[i] += len(kept)

    def end_step(self) -> None:
        self.valid = torch.cat([self.valid, self.keep.to(self.be.device)], dim=1)
        tail = int((~self.valid).flip(1).long().cumprod(1).sum(1).min())     # slots empty in every row at the end
        if tail:
            self.cache.crop(-tail)
            self.valid = self.valid[:, :self.valid.shape[1] - tail]

    def slots(self) -> tuple[int, list[int]]:
        """(cache slots per row, holes included; committed entries per row)."""
        return self.valid.shape[1], self.valid.sum(1).tolist()


# ---------------------------------------------------------------- one sequence, either backend

class Single:
    """One sequence through an LM's own forward and cache: the engine's batch of one. A chain's rejected
    drafts are the cache's tail (a crop), a tree's path is compacted into place."""
    B = 1

    def __init__(self, lm, hidden: bool):
        self.be, self.hidden = lm.backend, hidden   # ours (OwnForward) or transformers' (HFForward)
        self.cache = lm.new_cache()

    @torch.inference_mode()
    def prefill(self, rows: list[list[int]]):
        """All the prompt but its pending token, in one pass -> [hidden states [n, H]], or None."""
        if not rows[0]:
            return None
        out = self.be.forward(torch.tensor(rows[0]), self.cache, last_only=True, hidden=self.hidden)
        return [out[1]] if self.hidden else None

    @torch.inference_mode()
    def score(self, new: list[Slots]):
        """[the row's new slots] -> [(logits [n, V], final-norm hidden [n, H] or None)], in one forward."""
        s = new[0]
        self.base = self.cache.get_seq_length()
        if s.tree is not None:
            return [self.be.tree_forward(self.cache, torch.tensor(s.ids, dtype=torch.long), s.tree)]
        out = self.be.forward(torch.tensor(s.ids), self.cache, hidden=self.hidden)
        return [out if self.hidden else (out, None)]

    def commit(self, i: int, kept: list[int]) -> None:
        self.be.keep(self.cache, self.base, kept)

    def end_step(self) -> None:
        pass

    def slots(self) -> tuple[int, list[int]]:
        n = self.cache.get_seq_length()
        return n, [n]
