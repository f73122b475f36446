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
    the linear layers and attention's two products alike. Biases are added after the product.
  * Attention's reductions (the softmax sum, p @ v) run over a key length that depends only on the query's
    own position: keys are read in blocks of BLOCK slots, and a query at position t attends to the first
    BLOCK * (t // BLOCK + 1) slots, the rest masked. Masked slots are exact zeros after the softmax.
  * A query's keys sit in the same slots however it is scored: slot == position for chains (the cache holds
    committed tokens only, rollback is setting a length); a tree node's ancestors are gathered into
    position order for its attention (they sit at tree-order slots in the cache until compaction).
  * Attention runs in fp32, its query rows padded like any other product.
  * RoPE's cos/sin come from one table indexed by position, never recomputed per call.
  * Everything else is elementwise or a per-row reduction over a fixed width.

The price: a little padding, a gather for tree nodes, and attention over up to BLOCK - 1 masked keys.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK = 32      # attention key blocks (slots): a query's key length is a function of its position only
ROWS = 4        # matrix products get a row count that is a multiple of this (see above)
ARCHS = ("llama", "mistral", "qwen2")


class Unsupported(ValueError):
    """This model is outside what our forward covers; the message is the one-line reason."""


@dataclass
class Block:
    """One decoder layer's weights, fused where one matmul can do two (q|k|v, gate|up)."""
    ln1: torch.Tensor                 # [H]
    wqkv: torch.Tensor                # [(Hq + 2 Hkv) D, H]
    bqkv: torch.Tensor | None         # Qwen2's q, k, v biases
    wo: torch.Tensor                  # [H, Hq D]
    bo: torch.Tensor | None
    ln2: torch.Tensor                 # [H]
    wgu: torch.Tensor                 # [2 I, H]
    wd: torch.Tensor                  # [H, I]


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


def block_of(layer) -> Block:
    """A transformers Llama/Mistral/Qwen2 decoder layer -> its weights (shared with the module)."""
    a, m = layer.self_attn, layer.mlp
    wqkv, bqkv = _fuse([a.q_proj, a.k_proj, a.v_proj])
    wgu, bgu = _fuse([m.gate_proj, m.up_proj])
    if bgu is not None or m.down_proj.bias is not None:
        raise Unsupported("MLP biases (mlp_bias) are not covered")
    return Block(layer.input_layernorm.weight.detach(), wqkv, bqkv, a.o_proj.weight.detach(),
                 None if a.o_proj.bias is None else a.o_proj.bias.detach(),
                 layer.post_attention_layernorm.weight.detach(), wgu, m.down_proj.weight.detach())


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
        L, B, Hkv, D = self.shape
        cap = -(-cap // BLOCK) * BLOCK
        k = [torch.zeros(B, Hkv, cap, D, dtype=self.dtype, device=self.device) for _ in range(L)]
        v = [torch.zeros(B, Hkv, cap, D, dtype=self.dtype, device=self.device) for _ in range(L)]
        for old, new in zip(self.k + self.v, k + v):
            new[:, :, :old.shape[2]] = old
        self.k, self.v = k, v

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
        """Move slots start + keep (in that order) to start, start + 1, ...; the row's length ends there."""
        idx = (start + keep).to(self.device)
        n = keep.numel()
        for t in self.k + self.v:
            t[row, :, start:start + n] = t[row, :, idx]     # gather first (a copy), then write
        self.lens[row] = start + n


class Forward:
    """embed -> blocks -> norm -> head over a static KVCache. Tensors in, tensors out; no transformers calls."""

    def __init__(self, embed: torch.Tensor, blocks: list[Block], norm: torch.Tensor | None, head,
                 n_heads: int, n_kv: int, head_dim: int, eps: float, inv_freq: torch.Tensor,
                 rope_scale: float = 1.0):
        self.embed, self.blocks, self.norm, self.head = embed, blocks, norm, head
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self.inv_freq, self.rope_scale = inv_freq.float(), float(rope_scale)
        self.dtype, self.device = embed.dtype, embed.device
        self._cos = self._sin = torch.empty(0, head_dim // 2, device=self.device)

    @classmethod
    def from_model(cls, model, layers: list | None = None, norm=None, head=None) -> "Forward":
        """From a transformers causal LM: its embedding, `layers` (default: its decoder layers), final norm
        (default: its own; pass False for none) and head (a callable h -> logits; default: its LM head)."""
        check_arch(model.config)
        inner = model.get_decoder()
        rot = getattr(inner, "rotary_emb", None)
        if rot is None or not hasattr(rot, "inv_freq"):
            raise Unsupported("the model exposes no rotary inv_freq")
        cfg = model.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        layers = list(inner.layers) if layers is None else layers
        norm = inner.norm if norm is None else norm
        if head is None:
            w = model.get_output_embeddings().weight.detach()
            head = lambda h: F.linear(h, w)  # noqa: E731
        return cls(inner.get_input_embeddings().weight.detach(), [block_of(l) for l in layers],
                   norm.weight.detach() if norm is not False else None, head,
                   cfg.num_attention_heads, cfg.num_key_value_heads, hd, cfg.rms_norm_eps,
                   rot.inv_freq.to(inner.get_input_embeddings().weight.device),
                   getattr(rot, "attention_scaling", 1.0))

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        return KVCache(len(self.blocks), batch, self.n_kv, self.head_dim, self.dtype, self.device, capacity)

    # -- pieces

    def _rope_table(self, end: int) -> None:
        if self._cos.shape[0] < end:
            n = max(end, 2 * self._cos.shape[0], 1024)
            f = torch.arange(n, device=self.device, dtype=torch.float32)[:, None] * self.inv_freq[None]
            self._cos, self._sin = f.cos() * self.rope_scale, f.sin() * self.rope_scale   # [n, D/2]

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, h, D] fp32 rotated by its position's angles (the half-split layout transformers uses)."""
        a, b = x.chunk(2, -1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(pad_rows(x), w)[:x.shape[0]]
        return y + b if b is not None else y

    # -- the plan: which queries attend over which key slots, computed once per call for all layers

    def _plan(self, rows: list[int], base: list[int], pos: torch.Tensor, anc: list | None):
        """Group the call's queries by (key length S, tree or chain) for attention.

        Chain groups span rows: (S, rows [r], query index [r, n] into the flat tokens, mask [r, 1, G n, S]).
        Tree groups are one row: (S, row, query index [n], gather [n, S] slots in position order, mask)."""
        G = self.n_heads // self.n_kv
        pos_l = pos.tolist()
        S_of = [BLOCK * (p // BLOCK + 1) for p in pos_l]
        chains: dict[int, dict[int, list[int]]] = {}
        trees = []
        for i, (r, S) in enumerate(zip(rows, S_of)):
            if anc is not None and anc[i] is not None:
                trees.append((i, r, S))
            else:
                chains.setdefault(S, {}).setdefault(r, []).append(i)
        dev = self.device
        groups = []
        for S, by_row in chains.items():
            rs = list(by_row)
            n = max(len(q) for q in by_row.values())
            idx = torch.tensor([q + [q[0]] * (n - len(q)) for q in by_row.values()], device=dev)   # [r, n]
            real = torch.tensor([[j < len(q) for j in range(n)] for q in by_row.values()], device=dev)
            p = pos[idx]                                                                        # [r, n]
            see = torch.arange(S, device=dev)[None, None] <= p[..., None]                      # [r, n, S]
            see = see[:, None].expand(-1, G, -1, -1).reshape(len(rs), 1, G * n, S)
            groups.append(("chain", S, torch.tensor(rs, device=dev), idx, real, see))
        by_key: dict[tuple[int, int], list[int]] = {}
        for i, r, S in trees:
            by_key.setdefault((r, S), []).append(i)
        for (r, S), qs in by_key.items():
            gather = torch.zeros(len(qs), S, dtype=torch.long)
            for j, i in enumerate(qs):
                b = base[r]
                gather[j, :b] = torch.arange(b)
                gather[j, b:b + len(anc[i])] = torch.tensor(anc[i])       # ancestors then itself: slot = position
            idx = torch.tensor(qs, device=dev)
            see = torch.arange(S, device=dev)[None] <= pos[idx][:, None]                       # [n, S]
            groups.append(("tree", S, r, idx, gather.to(dev), see))
        return groups

    def _attend(self, q: torch.Tensor, l: int, cache: KVCache, groups) -> torch.Tensor:
        """q [N, Hq, D] fp32 (roped) -> attention output [N, Hq * D] fp32 for layer l."""
        N, Hq, D = q.shape
        Hkv, G = self.n_kv, Hq // self.n_kv
        out = q.new_empty(N, Hq, D)
        kc, vc = cache.k[l], cache.v[l]
        scale = D ** -0.5
        for kind, S, r, idx, aux, see in groups:
            if kind == "chain":
                R, n = idx.shape
                k = kc[r, :, :S].float()                                                   # [R, Hkv, S, D]
                v = vc[r, :, :S].float()
                x = q[idx].view(R, n, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(R, Hkv, G * n, D)
                o = attention(x, k, v, see.expand(R, Hkv, G * n, S), scale)               # [R, Hkv, G n, D]
                o = o.view(R, Hkv, G, n, D).permute(0, 3, 1, 2, 4).reshape(R * n, Hq, D)
                keep = aux.view(-1)
                out[idx.view(-1)[keep]] = o[keep]
            else:
                n = idx.numel()
                k = kc[r][:, aux].float()                                                   # [Hkv, n, S, D]
                v = vc[r][:, aux].float()
                x = q[idx].view(n, Hkv, G, D).transpose(0, 1)                               # [Hkv, n, G, D]
                o = attention(x, k, v, see[None, :, None].expand(Hkv, n, G, S), scale)      # [Hkv, n, G, D]
                out[idx] = o.transpose(0, 1).reshape(n, Hq, D)
        return out.view(N, Hq * D)

    # -- the forward

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, rows: list[int], pos: torch.Tensor, cache: KVCache,
                 slots: torch.Tensor | None = None, anc: list | None = None, out_rows: torch.Tensor | None = None,
                 hidden: bool = False):
        """Run N tokens (flat) through the network, writing their keys and values into the cache.

        ids [N], rows [N] (which cache row), pos [N] (position), slots [N] (cache slot; default = pos),
        anc: per token None (chain: sees slots <= its own) or its new-slot list in position order, itself last
        (a tree node). out_rows [M] picks the tokens whose logits are wanted (default all).
        Returns logits [M, V] float32, or (logits, final-norm hidden [N, H]) with `hidden`. Lengths are the
        caller's: this writes slots, it does not change cache.lens."""
        dev = self.device
        ids, pos = ids.to(dev), pos.to(dev)
        slots = pos if slots is None else slots.to(dev)
        cache.reserve(int(slots.max()) + 1)
        self._rope_table(int(pos.max()) + 1)
        base = list(cache.lens)
        groups = self._plan(rows, base, pos, anc)
        rows_t = torch.tensor(rows, device=dev)
        cos, sin = self._cos[pos][:, None], self._sin[pos][:, None]                       # [N, 1, D/2]
        N, Hq, Hkv, D = ids.numel(), self.n_heads, self.n_kv, self.head_dim
        x = self.embed[ids]                                                               # [N, H]
        for l, b in enumerate(self.blocks):
            qkv = self._linear(self._rms(x, b.ln1), b.wqkv, b.bqkv)                       # [N, (Hq+2Hkv) D]
            q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)
            q = self._rope(q.float().view(N, Hq, D), cos, sin)
            k = self._rope(k.float().view(N, Hkv, D), cos, sin)
            cache.k[l][rows_t, :, slots] = k.to(self.dtype)
            cache.v[l][rows_t, :, slots] = v.view(N, Hkv, D)
            a = self._attend(q, l, cache, groups).to(self.dtype)
            x = x + self._linear(a, b.wo, b.bo)
            g, u = self._linear(self._rms(x, b.ln2), b.wgu).chunk(2, -1)
            x = x + self._linear(F.silu(g) * u, b.wd)
        h = self._rms(x, self.norm) if self.norm is not None else x
        hs = h if out_rows is None else h[out_rows.to(dev)]
        logits = self.head(pad_rows(hs))[:hs.shape[0]].float()
        return (logits, h) if hidden else logits


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """Zero rows appended along dim -2 up to a multiple of ROWS: every product row then takes one kernel."""
    n = x.shape[-2]
    extra = -n % ROWS
    return torch.cat([x, x.new_zeros(*x.shape[:-2], extra, x.shape[-1])], -2) if extra else x


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, see: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v over the last two dims, fp32: q [.., R, D], k, v [.., S, D],
    see [.., R, S] bool. Padded query rows see slot 0 only (a fully masked row would be NaN)."""
    R = q.shape[-2]
    qp = pad_rows(q)
    if qp.shape[-2] > R:
        pad = torch.zeros(*see.shape[:-2], qp.shape[-2] - R, see.shape[-1], dtype=torch.bool, device=see.device)
        pad[..., 0] = True
        see = torch.cat([see, pad], -2)
    s = (qp @ k.transpose(-1, -2)) * scale
    return (torch.softmax(s.masked_fill_(~see, float("-inf")), -1) @ v)[..., :R, :]
