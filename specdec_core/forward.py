"""Our own forward for the Llama family, batch-invariant, over a static KV cache.

Llama (Touvron et al. 2023): pre-norm decoder layers, RMSNorm (Zhang & Sennrich 2019), rotary position
embeddings (RoPE, Su et al. 2021), grouped-query attention (GQA, Ainslie et al. 2023) and a SiLU-gated MLP
(SwiGLU, Shazeer 2020), then a final norm and the LM head (tied to the embedding or not). Mistral is the same
network; Qwen2 adds biases to q, k and v. The weights are the transformers-loaded model's own tensors.

Why not the transformers forward: speculative decoding promises that the output is the target's, and at
temperature 0 that means token-identical to plain decoding. That holds for the algorithm; for an
implementation it needs the logits of a position to be *bitwise* the same whether the position is scored
alone (a one-token decode step), inside a k+1-token verify step, inside a tree, or as one row of a batch.
A near-tie between two logits otherwise flips the argmax. "Batch invariance" (He et al., "Defeating
Nondeterminism in LLM Inference", Thinking Machines 2025; vLLM's batch-invariant mode, SGLang's
deterministic inference) is what this file buys, and each choice below says what it guards against:

  * Matrix products: a row of x @ W^T must not depend on how many rows are multiplied, nor where it sits.
    Measured on the CPU: fp32 products take different kernels for 1 row, 2-3 rows and the rows past a
    multiple of 4 when there are fewer than 12; bf16 ones differ for the tail rows of an unpadded product.
    Padding the row count to a multiple of ROWS (4) makes every row bitwise the same in both dtypes, for
    the linear layers and attention's two products alike. Biases are added after the product. On a Xeon whose
    oneDNN offers AMX, bf16 products of more than 32 rows take yet another kernel (every row differs from the
    same row multiplied alone), so bf16 linear layers multiply at most MAX_ROWS (32) rows at a time: a long
    prefill becomes several products, each reading the weights again, and every row is the same as in a decode
    step (fp32 products are invariant without it, and stay equal to transformers' eager forward bit for bit).
  * Attention's reductions (the softmax sum, p @ v) run over a key length that depends only on the query's
    own position: keys are read in blocks of BLOCK slots, and a query at position t attends to the first
    BLOCK * (t // BLOCK + 1) slots, the rest masked. Masked slots are exact zeros after the softmax.
  * A query's keys sit in the same slots however it is scored: slot == position for chains (the cache holds
    committed tokens only, rollback is setting a length); a tree node's ancestors sit at tree-order slots
    until compaction, so its scores are gathered into position order for the softmax, and its values are
    read in place where the product sums them in the same order (Forward._tree_attend).
  * Attention runs in fp32, its query rows padded like any other product (a bf16 model on a CPU with AMX: on
    bf16 tiles over a bf16 cache, each tile element a function of its own row and column; docs/forward.md).
  * RoPE's cos/sin come from one table indexed by position, never recomputed per call.
  * Everything else is elementwise or a per-row reduction over a fixed width.

This file is the reference: every product is a `Linear` (plain torch), and the layers run op by op (`_layers`).
The fast path (specdec_core/fast/, which backend.py attaches as `Forward.fast`) computes the same things faster and
decides nothing: each weight prepared once in oneDNN's blocked layout (fast/packed.py's Dense, a Linear whose rows
are padded the same way), a one-row call's layers as one loop in TorchScript or C++ (fast/loop.py), the C++
attention. Where it is attached, a call asks it for three things (`layers`, `attend`, `kv_dtype`), each of which
it may decline; tests hold each answer to this file's (docs/contributing.md, "The fast path, held to the
reference"). Without it (SPECDEC_FAST=0) nothing here changes but the speed and the products' summation order.

The price: a little padding, a gather for tree nodes, and attention over up to BLOCK - 1 masked keys.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn.functional as F

def scripted(fn):
    """torch.jit.script, without its deprecation warning (see the module docstring's Speed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(fn)


BLOCK = 32      # attention key blocks (slots): a query's key length is a function of its position only
ROWS = 4        # matrix products get a row count that is a multiple of this (see above)
MAX_ROWS = 32   # and linear layers take at most this many rows per product
ARCHS = ("llama", "mistral", "qwen2")


class Unsupported(ValueError):
    """This model is outside what our forward covers; the message is the one-line reason."""


class Linear:
    """y = x @ W^T (+ b), the reference product: rows padded to a multiple of ROWS, and bf16 products in chunks of
    at most MAX_ROWS rows (the module docstring says why). The fast path's products (fast/packed.py's Dense) take
    the same rows and compute the same thing from a prepared weight."""
    rows_alone = False   # True: a product whose rows do not depend on the rows beside it (no padding needed)

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None):
        self.w, self.b = w, b

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear_rows(x, self.w, self.b, False, MAX_ROWS, ROWS)



@dataclass
class Block:
    """One decoder layer's weights, fused where one matmul can do two (q|k|v, gate|up)."""
    ln1: torch.Tensor                 # [H]
    qkv: "Linear"                     # [(Hq + 2 Hkv) D, H], Qwen2's biases included
    o: "Linear"                       # [H, Hq D]
    ln2: torch.Tensor                 # [H]
    gu: "Linear"                      # [2 I, H]
    down: "Linear"                    # [H, I]

    def products(self) -> tuple:
        return self.qkv, self.o, self.gu, self.down

    def remade(self, linear) -> "Block":
        """The same layer with its products made again by `linear(w, b)` (the fast path's int8 copies for a draft)."""
        q = lambda d: linear(d.w, d.b)                                                    # noqa: E731
        return Block(self.ln1, q(self.qkv), q(self.o), self.ln2, q(self.gu), q(self.down))


@dataclass
class TreePlan:
    """One row's tree nodes of one key length S, planned once per call for every layer (Forward._tree_attend).
    Query rows are (node, query head of a key/value head), padded to a multiple of ROWS."""
    S: int
    Sk: int                           # keys scored: slots [0, Sk), every slot a node of the group sees
    base: int                         # the prefix [0, base), which every node sees: slot == position there
    # the tree's own positions and slots past the prefix (w: its depth + 1; t: its nodes, at most S - base):
    gather: torch.Tensor              # [R', w] long, the slot - base at each position - base (unseen: any)
    bias: torch.Tensor                # [R', w] fp32, 0 at the positions it attends to, -inf elsewhere
    inv: torch.Tensor | None          # [R', t] long, the position - base at each slot - base (unseen: w, a
                                      # zero); None: all slow
    slow: torch.Tensor | None         # [m] nodes (index in the group) whose values are gathered instead
    slow_gather: torch.Tensor | None  # [m, S] long, their slot at each position
    rescore: bool = False             # the slow nodes' scores are taken again against their gathered keys
    first: int = -1                   # the call's query index of the first node, when the nodes are consecutive


def _fuse(mods: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of linear modules along the output dim, then point each
    module's parameters at its slice of the fused tensor, so the model and our forward share memory."""
    w = torch.cat([m.weight.detach() for m in mods])
    b = None
    if any(m.bias is not None for m in mods):
        b = torch.cat([m.bias.detach() if m.bias is not None else w.new_zeros(m.weight.shape[0]) for m in mods])
    i = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight.data = w[i:i + n]
        if m.bias is not None:
            m.bias.data = b[i:i + n]
        i += n
    return w, b


def block_of(layer, linear=None) -> Block:
    """A transformers Llama/Mistral/Qwen2 decoder layer -> its weights (shared with the module), each product made
    by `linear(w, b)` (default Linear: the reference product)."""
    linear = linear or Linear
    a, m = layer.self_attn, layer.mlp
    wqkv, bqkv = _fuse([a.q_proj, a.k_proj, a.v_proj])
    wgu, bgu = _fuse([m.gate_proj, m.up_proj])
    if bgu is not None or m.down_proj.bias is not None:
        raise Unsupported("MLP biases (mlp_bias) are not covered")
    bo = None if a.o_proj.bias is None else a.o_proj.bias.detach()
    return Block(layer.input_layernorm.weight.detach(), linear(wqkv, bqkv),
                 linear(a.o_proj.weight.detach(), bo), layer.post_attention_layernorm.weight.detach(),
                 linear(wgu, None), linear(m.down_proj.weight.detach(), None))


def check_arch(config) -> None:
    """Raise Unsupported with the reason when a config is outside what this file implements."""
    mt = getattr(config, "model_type", "?")
    if mt not in ARCHS:
        raise Unsupported(f"architecture {mt!r} is not one of {', '.join(ARCHS)}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise Unsupported(f"activation {config.hidden_act!r} (only silu is covered)")
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise Unsupported("sliding-window attention is not covered")
    rs = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    kind = rs.get("rope_type", rs.get("type", "default")) if isinstance(rs, dict) else "default"
    if kind not in ("default", "linear", "llama3"):
        raise Unsupported(f"RoPE scaling {kind!r} (covered: default, linear, llama3)")


def grown(t: torch.Tensor, dim: int, rows: int, keep: int) -> torch.Tensor:
    """t, or a copy with at least `rows` entries along `dim` (doubling, so growth stays rare) whose first `keep`
    entries are t's."""
    if rows <= t.shape[dim]:
        return t
    shape = list(t.shape)
    shape[dim] = max(rows, 2 * t.shape[dim])
    new = t.new_empty(shape)
    new.narrow(dim, 0, keep).copy_(t.narrow(dim, 0, keep))
    return new


class KVCache:
    """Preallocated keys and values, [layers][B, Hkv, C, D] each, and a committed length per row.

    Slot i of a row holds position i: rejected drafts are never kept, so rollback is setting a length.
    The methods named like transformers' DynamicCache (get_seq_length, crop) act on every row."""

    def __init__(self, n_layers: int, batch: int, n_kv: int, head_dim: int, dtype, device, capacity: int = 256):
        self.shape = (n_layers, batch, n_kv, head_dim)
        self.dtype, self.device = dtype, device
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.lens = [0] * batch
        self._alloc(capacity)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def _alloc(self, cap: int) -> None:
        """One tensor [2 L, B, Hkv, C, D] holds every layer's keys then values; k[l] and v[l] are views of it,
        so a compaction moves a row's slots in every layer with one gather and one write."""
        L, B, Hkv, D = self.shape
        cap = -(-cap // BLOCK) * BLOCK
        kv = torch.zeros(2 * L, B, Hkv, cap, D, dtype=self.dtype, device=self.device)
        if self.k:
            kv[:, :, :, :self.capacity] = self.kv
        self.kv, self.k, self.v = kv, list(kv[:L].unbind(0)), list(kv[L:].unbind(0))

    def reserve(self, end: int) -> None:
        """Make room up to slot `end` (exclusive), growing by half again so growth stays rare."""
        if end > self.capacity:
            self._alloc(max(end, self.capacity * 3 // 2))

    def get_seq_length(self, row: int = 0) -> int:
        return self.lens[row]

    def crop(self, n: int) -> None:
        """n >= 0: keep the first n slots of every row; n < 0: drop the last -n."""
        self.lens = [n if n >= 0 else max(0, x + n) for x in self.lens]

    def set_length(self, row: int, n: int) -> None:
        self.lens[row] = n

    def compact(self, row: int, start: int, keep: torch.Tensor) -> None:
        """Move slots start + keep (in that order) to start, start + 1, ...; the row's length ends there. Slots
        already in place (a kept prefix) stay; the rest move in every layer at once."""
        n = keep.numel()
        moved = (keep != torch.arange(n)).nonzero()
        if moved.numel():
            j = int(moved[0])
            idx = (start + keep[j:]).to(self.device)
            self.kv[:, row, :, start + j:start + n] = self.kv[:, row, :, idx]   # gather first (a copy), then write
        self.lens[row] = start + n


class Forward:
    """embed -> blocks -> norm -> head over a static KVCache. Tensors in, tensors out; no transformers calls."""

    def __init__(self, embed: torch.Tensor, blocks: list[Block], norm: torch.Tensor | None, head: "Linear",
                 vocab, n_heads: int, n_kv: int, head_dim: int, eps: float, inv_freq: torch.Tensor,
                 rope_scale: float = 1.0):
        self.embed, self.blocks, self.norm, self.head = embed, blocks, norm, head
        self.q4_note = ""   # whether the layers' products read 4-bit weights (the fast path's q4.attach says)
        self.vocab = vocab   # a drafters.vocab.DraftVocab when the head scores a subset (-inf elsewhere)
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self.inv_freq, self.rope_scale = inv_freq.float(), float(rope_scale)
        self.dtype, self.device = embed.dtype, embed.device
        self._cos = self._sin = torch.empty(0, head_dim, device=self.device)
        self._plans: dict = {}   # a tree plan's parts by shape (a step's tree shape recurs): _tree_plan
        self.opening: tuple[int, ...] = ()   # the ids every chat prompt opens with (models.opening_of)
        self._opened = None                  # (the kernels that ran them, their keys and values [2 L, Hkv, P, D],
                                             # their hidden states [P, H])
        self.qk_scale = torch.tensor([head_dim ** -0.5] * n_heads + [1.0] * n_kv, device=self.device)[:, None]
        # a network whose products all compute each row alone (the fast path's int8, a draft model's) needs no
        # row padding
        self.pad = 1 if all(d.rows_alone for b in blocks for d in b.products()) and head.rows_alone else ROWS
        # the fast path, where backend.py attaches one (fast/loop.py's Loop): it may run the one-row layer loop
        # and attention with its own kernels, the same ops computing the same bits; None: this file alone
        self.fast = None

    @classmethod
    def from_model(cls, model, head: torch.Tensor | None = None, vocab=None, linear=None) -> "Forward":
        """From a transformers causal LM: its embedding, decoder layers, final norm and head weight
        (default its LM head's; `vocab` when the head holds only a draft vocabulary's rows), each product made by
        `linear(w, b)` (default Linear: then, in fp32, the logits equal transformers' eager forward bit for bit)."""
        check_arch(model.config)
        inner = model.get_decoder()
        rot = getattr(inner, "rotary_emb", None)
        if rot is None or not hasattr(rot, "inv_freq"):
            raise Unsupported("the model exposes no rotary inv_freq")
        cfg = model.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        head = model.get_output_embeddings().weight.detach() if head is None else head
        emb = inner.get_input_embeddings().weight.detach()
        linear = linear or Linear
        return cls(emb, [block_of(l, linear) for l in inner.layers], inner.norm.weight.detach(), linear(head, None),
                   vocab, cfg.num_attention_heads, cfg.num_key_value_heads, hd, cfg.rms_norm_eps,
                   rot.inv_freq.to(emb.device), getattr(rot, "attention_scaling", 1.0))

    def derive(self, blocks: list[Block], norm: torch.Tensor | None, head: "Linear", vocab=None) -> "Forward":
        """Another network over this one's embedding and rotary table: an early exit's shared trunk and exit."""
        f = Forward(self.embed, blocks, norm, head, vocab, self.n_heads, self.n_kv, self.head_dim, self.eps,
                    self.inv_freq, self.rope_scale)
        f.opening = self.opening
        return f

    def append(self, ids: torch.Tensor, cache: KVCache, last_only: bool = False, hidden: bool = False):
        """One sequence (row 0): ids [n] after what the cache holds; the cache's length grows by n. A prompt's
        prefill (an empty cache, the last row's logits) that opens with `opening` starts from its stored rows."""
        ids = ids.view(-1)
        h0 = self.open(ids.tolist(), cache, 0) if last_only and cache.lens[0] == 0 else None
        if h0 is not None:
            out = self.append(ids[h0.shape[0]:], cache, True, hidden)
            return (out[0], torch.cat([h0, out[1]])) if hidden else out
        n, L = ids.numel(), cache.lens[0]
        out = self(ids, [0] * n, torch.arange(L, L + n), cache,
                   out_rows=torch.tensor([n - 1]) if last_only else None, hidden=hidden)
        cache.lens[0] = L + n
        return out

    @torch.inference_mode()
    def open(self, ids: list[int], cache: KVCache, row: int) -> torch.Tensor | None:
        """A prompt about to be read into an empty cache row: where it opens with `opening` (the chat template's
        fixed start: a system message, the user turn's header) and goes on after it, that row's first P slots
        get the opening's keys and values, run once per forward and kept, and its length is P; -> the opening's
        hidden states [P, H]. Else None and nothing changes. Every row's numbers are the same whatever rows run
        with it (the products, attention and norms each take a row alone), so the prompt's rows after the
        opening get the bits a whole prefill gives them (tests/test_forward.py holds that); every request saves
        the opening's prefill, ~35% of a short prompt's."""
        P = len(self.opening)
        if not P or len(ids) <= P or tuple(ids[:P]) != self.opening:
            return None
        # a switched kernel rounds its own way: run the opening again
        key = (self.fast.kernels() if self.fast is not None else None, self.kv_dtype())
        if self._opened is None or self._opened[0] != key:
            c = self.new_cache(1, P)
            _, h = self(torch.tensor(self.opening), [0] * P, torch.arange(P), c, out_rows=torch.tensor([P - 1]),
                        hidden=True)
            self._opened = (key, c.kv[:, 0, :, :P].clone(), h.clone())
        _, kv, h = self._opened
        cache.reserve(P)
        cache.kv[:, row, :, :P] = kv
        cache.lens[row] = P
        return h

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        return KVCache(len(self.blocks), batch, self.n_kv, self.head_dim, self.kv_dtype(), self.device, capacity)

    def kv_dtype(self) -> torch.dtype:
        """The cache's dtype: on the CPU fp32 (attention runs in fp32 and reads it without a conversion), unless the
        fast path's attention reads another with the same bits; elsewhere the model's dtype."""
        if self.device.type != "cpu":
            return self.dtype
        return self.fast.kv_dtype() if self.fast is not None else torch.float32

    # -- pieces

    def _rope_table(self, end: int) -> None:
        if self._cos.shape[0] < end:
            n = max(end, 2 * self._cos.shape[0], 1024)
            f = torch.arange(n, device=self.device, dtype=torch.float32)[:, None] * self.inv_freq[None]
            c, s = f.cos() * self.rope_scale, f.sin() * self.rope_scale                   # [n, D/2]
            self._cos, self._sin = torch.cat([c, c], -1), torch.cat([-s, s], -1)          # [n, D]

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, h, D] fp32 rotated by its position's angles (the half-split layout transformers uses):
        [a, b] -> [a cos - b sin, b cos + a sin], with cos = [c, c] and sin = [-s, s] from the table."""
        return rotate(x, cos, sin)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.eps)

    # -- the plan: which queries attend over which key slots, computed once per call for all layers

    def _plan(self, rows: list[int], base: list[int], pos: torch.Tensor, anc: list | None):
        """Group the call's queries by key length S (a function of position) for attention, chains across rows
        and tree nodes per row, with their masks already padded to the product's row count."""
        G, dev = self.n_heads // self.n_kv, self.device
        S_of = [BLOCK * (p // BLOCK + 1) for p in pos.tolist()]
        chains: dict[int, dict[int, list[int]]] = {}
        trees: dict[tuple[int, int], list[int]] = {}
        for i, (r, S) in enumerate(zip(rows, S_of)):
            if anc is not None and anc[i] is not None:
                trees.setdefault((r, S), []).append(i)
            else:
                chains.setdefault(S, {}).setdefault(r, []).append(i)
        groups = []
        for S, by_row in chains.items():
            qs = list(by_row.values())
            n = max(len(q) for q in qs)
            idx = torch.tensor([q + [q[0]] * (n - len(q)) for q in qs], device=dev)         # [r, n] padded
            see = torch.arange(S, device=dev) <= pos[idx][..., None]                        # [r, n, S]
            bias = mask_bias(_pad_see(see[:, None].expand(-1, G, -1, -1).reshape(len(qs), 1, G * n, S)))
            rs = list(by_row)
            span = None        # one row, consecutive queries: slices instead of gathers
            if len(rs) == 1 and qs[0] == list(range(qs[0][0], qs[0][0] + n)):
                span = (rs[0], qs[0][0], n)
            real = torch.tensor([j < len(q) for q in qs for j in range(n)], device=dev)
            # consecutive rows (usually the whole batch) are a view of the cache, not a gathered copy
            sel = slice(rs[0], rs[-1] + 1) if rs == list(range(rs[0], rs[-1] + 1)) else torch.tensor(rs, device=dev)
            groups.append(("chain", S, sel, idx, real, bias, span))
        for (r, S), qs in trees.items():
            plan = self._tree_plan(S, base[r], [anc[i] for i in qs], pos[qs].tolist())
            if qs == list(range(qs[0], qs[0] + len(qs))):     # consecutive: read and written as slices
                plan.first = qs[0]
            groups.append(("tree", S, r, torch.tensor(qs, device=dev), plan, None, None))
        whole = len(groups) == 1 and groups[0][6] is not None and groups[0][6][1] == 0
        return groups, whole

    def _attend(self, q: torch.Tensor, n_real: int, l: int, cache: KVCache, groups, whole: bool) -> torch.Tensor:
        """q [N, Hq, D] fp32, roped and pre-scaled -> attention output [N, Hq * D] fp32 for layer l."""
        N, Hq, D = q.shape
        Hkv, G = self.n_kv, Hq // self.n_kv
        kc, vc = cache.k[l], cache.v[l]
        # the fast path's attention where it runs one (as its layer loop runs it: the same bits a query)
        out = self.fast.attend(q, kc, vc, groups) if self.fast is not None else None
        if out is not None:
            return out
        out = None if whole and n_real == N else q.new_zeros(N, Hq, D)
        for kind, S, r, idx, aux, bias, span in groups:   # aux: chains' real-query mask, trees' TreePlan
            if kind == "chain" and span is not None:
                row, a, n = span
                k, v = kc[row, :, :S].float(), vc[row, :, :S].float()                        # [Hkv, S, D]
                x = q[a:a + n].view(n, Hkv, G, D).permute(1, 2, 0, 3).reshape(1, Hkv, G * n, D)
                o = _attention(x, k[None], v[None], bias)                                    # [1, Hkv, G n, D]
                o = o.view(Hkv, G, n, D).permute(2, 0, 1, 3).reshape(n, Hq, D)
                if out is None:
                    return o.reshape(N, Hq * D)
                out[a:a + n] = o
            elif kind == "chain":
                R, n = idx.shape
                k, v = kc[r, :, :S].float(), vc[r, :, :S].float()                           # [R, Hkv, S, D]
                x = q[idx].view(R, n, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(R, Hkv, G * n, D)
                o = _attention(x, k, v, bias)                                                # [R, Hkv, G n, D]
                o = o.view(R, Hkv, G, n, D).permute(0, 3, 1, 2, 4).reshape(R * n, Hq, D)
                out[idx.view(-1)[aux]] = o[aux]
            else:
                out[idx] = self._tree_attend(q[idx], kc[r], vc[r], aux)
        return out.view(N, Hq * D)

    def _layers(self, x, N, cos, sin, scale, cache, groups, whole, one, rows_t, slots, r0, s0) -> torch.Tensor:
        """The decoder layers, op by op: any rows, trees, batches (the fast path's loop runs one row's in one go)."""
        Np, (Hq, Hkv, D) = x.shape[0], (self.n_heads, self.n_kv, self.head_dim)
        for l, b in enumerate(self.blocks):
            qkv = b.qkv(self._rms(x, b.ln1))                                              # [Np, (Hq+2Hkv) D]
            qk = self._rope(qkv[:, :(Hq + Hkv) * D].float().view(Np, Hq + Hkv, D), cos, sin) * scale
            q, k, v = qk[:, :Hq], qk[:N, Hq:], qkv[:N, (Hq + Hkv) * D:].view(N, Hkv, D)
            if one:
                cache.k[l][r0, :, s0:s0 + N] = k.transpose(0, 1)
                cache.v[l][r0, :, s0:s0 + N] = v.transpose(0, 1)
            else:
                cache.k[l][rows_t, :, slots] = k.to(cache.dtype)
                cache.v[l][rows_t, :, slots] = v.to(cache.dtype)
            a = self._attend(q, N, l, cache, groups, whole).to(self.dtype)
            x = x + b.o(a)
            g, u = b.gu(self._rms(x, b.ln2)).chunk(2, -1)                                # [Np, I] each
            x = x + b.down(F.silu(g) * u)
        return x

    def _tree_plan(self, S: int, base: int, ancs: list[list[int]], P: list[int]) -> "TreePlan":
        """Plan one row's tree nodes of key length S: node j at position P[j] sees the prefix slots [0, base)
        and its ancestors' slots ancs[j] (itself last), which increase with position (tree order: a parent
        precedes its children). See _tree_attend for how the plan is used and why it is bitwise a chain's."""
        G, dev, n = self.n_heads // self.n_kv, self.device, len(ancs)
        scores_ok, values_ok = in_place_ok(dev, self.n_kv, G, self.head_dim)
        slow = []
        for j, a in enumerate(ancs):
            if a[0] < base or any(x >= y for x, y in zip(a, a[1:])):
                raise ValueError("a tree node's ancestor slots must follow the prefix and increase with position")
            # p @ v in slot order equals position order iff no K-block of the product's sum separates a key's
            # slot from its position: the CPU GEMM (measured, MKL fp32) splits K only at multiples of
            # BLOCK in the upper half of K, and once at K / 2 for 192 < K < 384. Other devices: unmeasured
            if not (values_ok and scores_ok and base >= S // 2 and a[-1] < S and
                    all(x // BLOCK == (base + i) // BLOCK for i, x in enumerate(a))):
                slow.append(j)
        rel = tuple(tuple(x - base for x in a) for a in ancs)
        t = min(max(a[-1] for a in rel) + 1, S - base)       # the slots past the prefix p @ v reads in place
        key = (rel, tuple(slow), t, ROWS)          # ROWS: the GPU check varies it
        parts = self._plans.get(key)
        if parts is None:
            w = max(len(a) for a in rel)                        # positions past the prefix
            R = n * G + (-n * G % ROWS)
            rows = lambda x, fill: torch.cat([x.repeat_interleave(G, 0), x.new_full((R - n * G, x.shape[1]), fill)])
            gather = torch.tensor([list(a) + [0] * (w - len(a)) for a in rel])           # [n, w]
            see = rows(torch.arange(w) < torch.tensor([len(a) for a in rel])[:, None], False)
            see[n * G:, 0] = True                 # padding rows see position 0 past the prefix (never all masked)
            inv = [[w] * t for _ in rel]
            for a, row in zip(rel, inv):
                for i, x in enumerate(a):
                    if x < t:
                        row[x] = i
            parts = (rows(gather, 0).to(dev), mask_bias(see.to(dev)),
                     rows(torch.tensor(inv), w).to(dev) if len(slow) < n else None,
                     torch.tensor(slow, device=dev) if slow else None)
            if len(self._plans) >= 4096:
                self._plans.clear()
            self._plans[key] = parts
        Sk = -(-(base + max(a[-1] for a in rel) + 1) // BLOCK) * BLOCK   # fewer than 12 columns sum otherwise
        full = [list(range(base)) + list(ancs[j]) + [base] * (S - base - len(ancs[j])) for j in slow]  # [m, S]
        return TreePlan(S, Sk, base, parts[0], parts[1], parts[2], parts[3],
                        torch.tensor(full, device=dev) if slow else None,
                        not scores_ok)

    def _tree_attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, plan: "TreePlan") -> torch.Tensor:
        return tree_attention(q, kc, vc, self.n_kv, plan.S, plan.Sk, plan.base, plan.gather, plan.bias, plan.inv,
                               plan.slow, plan.slow_gather, plan.rescore, ROWS)

    # -- the forward

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, rows: list[int], pos: torch.Tensor, cache: KVCache,
                 slots: torch.Tensor | None = None, anc: list | None = None, out_rows: torch.Tensor | None = None,
                 hidden: bool = False):
        """Run N tokens (flat) through the network, writing their keys and values into the cache.

        ids [N], rows [N] (which cache row), pos [N] (position), slots [N] (cache slot; default = pos),
        anc: None, or per token None (chain: sees the slots up to its own) or the cache slots of its
        ancestors and itself in position order (a tree node). out_rows [M] picks the tokens whose logits are
        wanted (default all). Returns logits [M, V] float32, or (logits, final-norm hidden [N, H]) with
        `hidden`. Lengths are the caller's: this writes slots, it does not change cache.lens."""
        dev = self.device
        N = ids.numel()
        ids, pos = ids.to(dev), pos.to(dev)
        slots = pos if slots is None else slots.to(dev)
        cache.reserve(int(slots.max()) + 1)
        self._rope_table(int(pos.max()) + 1)
        groups, whole = self._plan(rows, list(cache.lens), pos, anc)
        one = len(set(rows)) == 1 and bool((slots[1:] - slots[:-1] == 1).all())   # one row, consecutive slots
        r0, s0 = rows[0], int(slots[0])
        rows_t = torch.tensor(rows, device=dev)
        Np = N + (-N % self.pad)    # pad once: every product below then has a multiple of ROWS rows (of 1: int8)
        if Np > N:
            ids = torch.cat([ids, ids.new_zeros(Np - N)])
            pos = torch.cat([pos, pos[:1].expand(Np - N)])
        cos, sin = self._cos[pos][:, None], self._sin[pos][:, None]                       # [Np, 1, D]
        scale = self.qk_scale                                                               # q pre-scaled, k not
        x = self.embed[ids]                                                               # [Np, H]
        # one row, consecutive slots (a decode step, a chain verify, a tree, a prefill): the fast path may run the
        # same ops in the same order as one loop (fast/loop.py); else, and always without it, op by op
        y = self.fast.layers(x, cos, sin, groups, cache, r0, s0, N) if self.fast is not None and one else None
        x = y if y is not None else self._layers(x, N, cos, sin, scale, cache, groups, whole, one, rows_t, slots,
                                                 r0, s0)
        h = self._rms(x[:N], self.norm) if self.norm is not None else x[:N]
        hs = h if out_rows is None else h[out_rows.to(dev)]
        logits = self.head(hs).float()
        logits = self.vocab.scatter(logits) if self.vocab is not None else logits
        return (logits, h) if hidden else logits


_IN_PLACE: dict = {}


def in_place_ok(dev: torch.device, n_kv: int, G: int, D: int) -> tuple[bool, bool]:
    """Whether this device's products let a tree node's attention skip gathering keys and values (probed once
    per device and shape, a few ms): (scores, values).

    scores: a query's scores against keys in slot order, gathered into position order, equal the scores of the
    same keys in position order (as a chain takes them). values: p @ v with p in slot order (zeros between)
    equals p @ v in position order, for nodes whose ancestors share a BLOCK with their positions in the upper
    half of S. Both hold bit for bit on the CPUs measured (MKL fp32 splits a product's sum over K only at
    points such a node never straddles), but they are properties of a GEMM's blocking, not of arithmetic: a
    device where either fails gathers, as a chain's keys and values would be read (exact, slower)."""
    key = (str(dev), n_kv, G, D)
    if key not in _IN_PLACE:
        ok_s = ok_v = dev.type == "cpu"
        g = torch.Generator().manual_seed(0)
        R = G * 3 + (-G * 3 % ROWS)
        for S in list(range(BLOCK, 1024 + 1, BLOCK)) + list(range(1024 + 2 * BLOCK, 2048 + 1, 2 * BLOCK)):
            if not (ok_s or ok_v):
                break
            base = S // 2 + int(torch.randint(0, S // 2 - 1, (), generator=g))
            d = min(4, S - 1 - base)
            pos = torch.arange(base, base + d + 1)
            # slots: the root at its position, the deeper ancestors shifted later by c, inside their blocks
            room = min(min((int(t) // BLOCK + 1) * BLOCK, S) - 1 - int(t) for t in pos[1:]) if d else 0
            c = int(torch.randint(0, room + 1, (), generator=g))
            slots = torch.cat([pos[:1], pos[1:] + c])
            k = torch.randn(n_kv, S, D, generator=g).to(dev)
            v = torch.randn(n_kv, S, D, generator=g).to(dev)
            q = torch.randn(n_kv, R, D, generator=g).to(dev)
            order = torch.cat([torch.arange(base), slots])                                   # position -> slot
            kp, vp = k.clone(), v.clone()
            kp[:, base:base + d + 1], vp[:, base:base + d + 1] = k[:, slots], v[:, slots]
            Sk = -(-(int(slots[-1]) + 1) // BLOCK) * BLOCK
            chain = q @ kp.transpose(-1, -2)                                                  # [Hkv, R, S]
            tree = (q @ k[:, :Sk].transpose(-1, -2))[..., order]
            ok_s = ok_s and torch.equal(chain[..., :order.numel()], tree)
            p = torch.rand(n_kv, R, S, generator=g).to(dev)
            p[..., base + d + 1:] = 0
            ps = torch.zeros_like(p)
            ps[..., order] = p[..., :order.numel()]
            ok_v = ok_v and torch.equal(p @ vp, ps @ v)
        _IN_PLACE[key] = (ok_s, ok_v)
    return _IN_PLACE[key]


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """Zero rows appended along dim -2 up to a multiple of ROWS: every product row then takes one kernel."""
    return _pad_to(x, ROWS)


def _pad_see(see: torch.Tensor) -> torch.Tensor:
    """A mask [.., R, S] padded like its queries: the extra rows see slot 0 only (no row may be all masked)."""
    extra = -see.shape[-2] % ROWS
    if not extra:
        return see
    pad = torch.zeros(*see.shape[:-2], extra, see.shape[-1], dtype=torch.bool, device=see.device)
    pad[..., 0] = True
    return torch.cat([see, pad], -2)


def mask_bias(see: torch.Tensor) -> torch.Tensor:
    """A bool mask (True: attends) -> the additive fp32 bias attention takes: 0 there, -inf elsewhere. Adding 0
    leaves a score's bits as they are, so this masks as masked_fill would, in one cheap op per layer instead of
    two (a negation and a masked fill), and once per call instead of once per layer."""
    return torch.zeros(see.shape, device=see.device).masked_fill_(~see, float("-inf"))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T + bias) v over the last two dims, fp32: q [.., R, D] (pre-scaled), k, v [.., S, D],
    bias [.., R', S] (mask_bias) with R' = R padded to a multiple of ROWS (attention_rows)."""
    return attention_rows(q, k, v, bias, ROWS)


@scripted
def _pad_to(x: torch.Tensor, rows: int) -> torch.Tensor:
    """pad_rows for TorchScript: zero rows along dim -2 up to a multiple of rows (ROWS, passed at call time)."""
    extra = -x.shape[-2] % rows
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[-2] = extra
    return torch.cat([x, x.new_zeros(shape)], -2)


@scripted
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, back to x's dtype, then the weight (transformers' LlamaRMSNorm, op for op)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@scripted
def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, h, D] fp32 rotated by its position's angles (the half-split layout transformers uses):
    [a, b] -> [a cos - b sin, b cos + a sin], with cos = [c, c] and sin = [-s, s] from the table."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat([x[..., h:], x[..., :h]], -1) * sin


@scripted
def attention_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, rows: int) -> torch.Tensor:
    """softmax(q k^T + bias) v over the last two dims, fp32: q [.., R, D] (pre-scaled), k, v [.., S, D],
    bias [.., R', S] (mask_bias) with R' = R padded to a multiple of rows."""
    R = q.shape[-2]
    s = _pad_to(q, rows) @ k.transpose(-1, -2)                                            # [.., R', S]
    return (torch.softmax(s.add_(bias), -1) @ v)[..., :R, :]


@scripted
def tree_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, Hkv: int, S: int, Sk: int, base: int,
                    gather: torch.Tensor, bias: torch.Tensor, inv: Optional[torch.Tensor],
                    slow: Optional[torch.Tensor], slow_gather: Optional[torch.Tensor], rescore: bool,
                    rows: int) -> torch.Tensor:
    """q [n, Hq, D] (one row's tree nodes of one key length, roped and pre-scaled), kc, vc [Hkv, C, D]
    the row's cache -> attention output [n, Hq, D] fp32, bitwise what each node gets scored as a chain.

    Scores: one product of all the nodes' queries against the keys in slot order, as a chain's (a score
    is a dot product over D, wherever its key sits). The softmax needs position order (its vectorised sum
    depends on the lane an element sits in), so the *scores* are gathered into each node's position
    order (n G S floats per key/value head, where gathering keys and values copied 2 n S D). p @ v then
    reads the values in place: p is put back in slot order, zeros elsewhere, and multiplied by the cache's
    first S value slots, a chain's product of K = S; each node's non-zero terms meet the sum in position
    order, and zero terms add nothing. Nodes for which a K-block of the product would separate a key's
    slot from its position (a tree straddling a BLOCK boundary) gather their values instead. Slot and position
    are the same over the prefix [0, base) every node sees, so only the tree's own entries past it move and
    take a mask (TreePlan's gather, bias, inv): small gathers into place, not gathers over every key."""
    n, Hq, D = q.shape
    G = Hq // Hkv
    x = _pad_to(q.view(n, Hkv, G, D).transpose(0, 1).reshape(Hkv, n * G, D), rows)          # [Hkv, R', D]
    s = x @ kc[:, :Sk].float().transpose(-1, -2)                                   # [Hkv, R', Sk] slots
    w = gather.shape[-1]
    tail = s[..., base:].gather(-1, gather.expand(Hkv, -1, -1)).add_(bias)  # [Hkv, R', w] positions, masked
    s = s[..., :S] if Sk == S else s[..., :S].contiguous()
    s[..., base:base + w] = tail
    s[..., base + w:].fill_(float("-inf"))                                  # past every node's position
    p = torch.softmax(s, -1)                                                # [Hkv, R', S] positions
    if inv is not None:
        # back in slot order: the tree's p moved to its slots, zeros at the slots a node does not see
        tail = torch.nn.functional.pad(p[..., base:base + w], [0, 1]).gather(-1, inv.expand(Hkv, -1, -1))
        ps = p if slow is None else p.clone()                               # the slow nodes read p below
        ps[..., base:base + inv.shape[-1]] = tail                           # [Hkv, R', S] slots
        o = (ps @ vc[:, :S].float())[:, :n * G].view(Hkv, n, G, D)
    else:
        o = q.new_empty(Hkv, n, G, D)
    if slow is not None:
        assert slow_gather is not None
        v = vc[:, slow_gather].float()                                              # [Hkv, m, S, D]
        pm = p[:, :n * G].view(Hkv, n, G, S)[:, slow]                               # [Hkv, m, G, S]
        if rescore:   # this device's slot-order scores are not a chain's (in_place_ok): as a chain
            k = kc[:, slow_gather].float()                                          # [Hkv, m, S, D]
            qm = q.view(n, Hkv, G, D).transpose(0, 1)[:, slow]                      # [Hkv, m, G, D]
            b = torch.zeros(n * G, S, device=q.device)      # [n G, S]: the prefix seen, the tree's part masked
            b[:, base:base + w] = bias[:n * G]
            b[:, base + w:] = float("-inf")
            b = b.view(n, G, S)[slow]                                               # [m, G, S]
            sm = (_pad_to(qm, rows) @ k.transpose(-1, -2))[..., :G, :]
            pm = torch.softmax(sm + b, -1)
        o[:, slow] = (_pad_to(pm, rows) @ v)[..., :G, :]
    return o.transpose(0, 1).reshape(n, Hq, D)


@scripted
def matmul_wt(x: torch.Tensor, w: torch.Tensor, packed: bool) -> torch.Tensor:
    if packed:
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return torch.nn.functional.linear(x, w)


@scripted
def linear_rows(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], packed: bool, max_rows: int,
                rows: int) -> torch.Tensor:
    """y = x @ W^T (+ b), W plain or prepared once in oneDNN's blocked layout (`packed`: the fast path's Dense):
    rows padded to a multiple of `rows`, bf16 products in chunks of at most max_rows rows; the bias added after."""
    n = x.shape[0]
    if n > max_rows and x.dtype != torch.float32:
        parts: List[torch.Tensor] = []
        for i in range(0, n, max_rows):
            xi = x[i:i + max_rows]
            parts.append(matmul_wt(_pad_to(xi, rows), w, packed)[:xi.shape[0]])
        y = torch.cat(parts)
    else:
        y = matmul_wt(_pad_to(x, rows), w, packed)[:n]
    return y if b is None else y + b

