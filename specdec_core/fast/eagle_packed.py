"""The EAGLE head for drafting: the trained `eagle.Head`'s weights in the target forward's packed products.

`eagle.Head` is an nn.Module written for training (autograd, batches of sequences, fp32). Drafting calls it a
few times per step on at most `topk` rows, where every fp32, re-laid-out product and every per-call tensor
rebuild costs more than the arithmetic, so the module path would cost more than a target step. This is the same
network for inference only:

  * every weight is a `packed.Dense`, packed once for oneDNN (rows unpadded: packed.py), in the target's
    dtype, with the products fused where one matmul can do two (q|k|v and gate|up, as forward.Block does); the
    draft-vocabulary LM head too. The residual stream, norms, RoPE and attention stay in fp32.
  * attention runs over a k/v scratch kept for the sequence (the committed rows; each tree level appends its
    rows, dropped after the proposal; no concat), with GQA as an explicit grouping of query heads per key head
    (no repeat_interleave);
  * RoPE's cos/sin, with attention's 1/sqrt(d) folded into the query rows, are one table row per position.

In fp32 it computes what Head.forward computes to about 1e-6 (tests/test_eagle.py). Lower-precision products
round differently; verification is exact whatever the draft computes, so that can only move acceptance.

What is left is mostly reading weights (fc, the layer and the draft-vocabulary LM head, once per tree level), so on
the CPU (`int8=True`, Eagle's default there) every weight is stored in int8 with a scale per output row
(packed.Dense's int8: half the bytes, the activations in the model dtype). The rest of a level is ~60 small ops on
a few rows, each costing more to dispatch than to compute: where native.py builds it, a level runs csrc/kernels.cpp's
`eagle_rows`, the same layer from C++ (bitwise the scripted `_rows` with its own loops off: `draft_loops(False)`,
tests/test_native.py; with them on, the int8 products, the head's attention and the level's top-k run as loops that
round differently, which again can only move the draft). Which nodes a level expands, and when the tree stops, is
decided in Python only (eagle.Eagle._grow). What these choices measure, with the CPU: docs/drafters.md, "EAGLE".
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..forward import grown, mask_bias, scripted
from .packed import native_op, parts, product, product_of


class Scratch:
    """Keys and values of the head's rows in one sequence: k, v [Hkv, N, D] fp32, rows 0..n-1 (the sequence's
    rows, then a proposal's tree rows, dropped by setting n back). Grows by doubling."""

    def __init__(self, n_kv: int, rows: int, head_dim: int, device):
        self.k = torch.empty(n_kv, rows, head_dim, device=device)
        self.v = torch.empty(n_kv, rows, head_dim, device=device)
        self.n = 0

    def reserve(self, rows: int) -> None:
        self.k, self.v = grown(self.k, 1, rows, self.n), grown(self.v, 1, rows, self.n)


class PackedHead:
    """(features [m, H], tokens [m]) at one tree depth -> (next features [m, H] fp32, draft logits [m, v])."""

    def __init__(self, head, embed: torch.Tensor, lm_w: torch.Tensor, dtype: torch.dtype, max_pos: int = 64,
                 int8: bool = False, ids: torch.Tensor | None = None):
        """head: an eagle.Head (its weights are copied, in `dtype`); embed [V, H]: the target's token embedding;
        lm_w [v, H]: the target's LM-head rows for the draft vocabulary, ids [v] their target ids (None: all V).
        int8: the products' weights in int8 where packed.int8_ok (the CPU, with the kernel)."""
        dev = embed.device
        w = lambda *mods: torch.cat([m.weight.detach() for m in mods]).to(dev, dtype).contiguous()   # noqa: E731
        f32 = lambda t: t.detach().to(dev, torch.float32)                                            # noqa: E731
        self.Hq, self.Hkv, self.D, self.eps = head.n_heads, head.n_kv, head.hd, head.eps
        self.dtype, self.device = dtype, dev
        P = lambda t: product(t, int8)                                                               # noqa: E731
        self.fc, self.fc_b = P(w(head.fc)), f32(head.fc.bias)                              # [H, 2H], [H]
        self.qkv = P(w(head.q, head.k, head.v))                                            # [(Hq + 2 Hkv) D, H]
        self.o = P(w(head.o))                                                              # [H, Hq D]
        self.gu = P(w(head.gate, head.up))                                                 # [2 I, H]
        self.down = P(w(head.down))                                                        # [H, I]
        self.lm = P(lm_w.detach().to(dev, dtype).contiguous())                            # [v, H]
        self.int8 = self.lm.s is not None
        self.ln1, self.ln2, self.norm = f32(head.ln1), f32(head.ln2), f32(head.norm)
        ps = [parts(d) for d in (self.fc, self.qkv, self.o, self.gu, self.down, self.lm)]     # _rows' order
        self._w = ([p[0] for p in ps], [p[1] for p in ps], [p[2] for p in ps], [p[3] for p in ps],
                   self.ln1, self.ln2, self.norm, self.fc_b)
        self.embed = embed.detach().to(dtype)                                              # [V, H]
        self.ids = ids
        self.theta = head.theta
        self._table(max_pos)

    def _table(self, n: int) -> None:
        """cos, sin [n, Hq + Hkv, D] per position (Llama's half-split layout, as eagle._rope), query rows
        pre-scaled by 1/sqrt(D) so attention needs no scaling: [a, b] -> [a cos - b sin, b cos + a sin]."""
        D = self.D
        inv = self.theta ** (-torch.arange(0, D, 2, dtype=torch.float32, device=self.device) / D)   # [D/2]
        ang = torch.arange(n, dtype=torch.float32, device=self.device)[:, None] * inv                # [n, D/2]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([-ang.sin(), ang.sin()], -1)             # [n, D]
        scale = torch.tensor([D ** -0.5] * self.Hq + [1.0] * self.Hkv, device=self.device)[:, None]   # [Hq+Hkv, 1]
        self.cos, self.sin = cos[:, None] * scale, sin[:, None] * scale                              # [n, Hq+Hkv, D]

    def _reach(self, top: int) -> None:
        """The RoPE tables cover position `top` (regrown to twice it where they do not)."""
        if top >= self.cos.shape[0]:
            self._table(2 * top)

    def scratch(self, rows: int) -> Scratch:
        return Scratch(self.Hkv, rows, self.D, self.device)

    def __call__(self, f: torch.Tensor, tok: torch.Tensor, pos, bias: torch.Tensor, kv: Scratch, last: int = 0,
                 k: int = 0):
        """f [m, H] the features read (f_{t-1}), tok [m] the tokens x_t after them, at positions `pos` (an int
        for all m rows, [m], or a slice of consecutive ones); bias [m, c] fp32 attention bias over the last c of
        the kv.n + m rows, 0 where a row attends and -inf elsewhere (see `bias`): every row sees all rows before
        those c (the sequence's).
        Appends the m rows' keys and values to kv. -> (features, draft logits) of the last `last` rows, or of all
        m with last = 0 (the other rows give their keys and values only), or with k > 0 (features, the top-k
        draft log-probs [., k] fp32 of those rows, their target ids [., k]).

        Runs under the caller's inference mode (propose's), not its own: entering one costs as much as an op.
        The layer's ops run in one scripted function (`_rows`): on a draft this small each op's Python call
        is a measurable share of its cost."""
        m = f.shape[0]
        if isinstance(pos, slice):          # consecutive positions: the tables' rows as a view, no gather
            top = pos.stop - 1
        else:
            top = int(pos) if isinstance(pos, int) else int(pos.max())
        self._reach(top)
        R0 = kv.n
        kv.reserve(R0 + m)
        kv.n = R0 + m
        h, y, ix = rows()(f, self.embed[tok.to(self.device)], self.cos[pos], self.sin[pos], bias, kv.k, kv.v, R0,
                         *self._w, self.Hq, self.Hkv, self.D, self.eps, last, k, self.ids)
        return (h, y, ix) if k else (h, y)

    bias = staticmethod(mask_bias)   # a bool attention mask (True: attends) -> the additive bias __call__ takes


def rows():
    """The level's layer: native.py's C++ port of _rows where this machine builds it (the same bits, fewer
    interpreter steps), else _rows. Resolved once a process (packed.native_op)."""
    return native_op("eagle_rows") or _rows


@scripted
def _rows(f: torch.Tensor, e: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
          k: torch.Tensor, v: torch.Tensor, R0: int, w: List[torch.Tensor], s: List[Optional[torch.Tensor]],
          b: List[Optional[torch.Tensor]], packed: List[bool], ln1: torch.Tensor, ln2: torch.Tensor,
          norm: torch.Tensor, fc_b: torch.Tensor, Hq: int, Hkv: int, D: int, eps: float, last: int, k_top: int,
          ids: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PackedHead.__call__'s layer: f [m, H] features and e [m, H] token embeddings (model dtype), cos/sin of
    their positions ([Hq + Hkv, D] or [m, Hq + Hkv, D]), bias [m, c], the kv scratch k, v [Hkv, N, D] whose rows
    R0 .. R0 + m this fills; w, s, b, packed: fc, qkv, o, gate|up, down and the LM head (packed.parts); fc_b
    fc's bias, fp32.
    Products take and give the model dtype; the fp32 residual and attention take their outputs by type
    promotion (x += y, y * cos), which saves a conversion per product. -> (h [m, H], the logits, the logits)
    or, k_top > 0, (h, the top-k_top draft log-probs, their ids: target ids through `ids` [v] where given)."""
    m, H, dt = f.shape[0], f.shape[1], e.dtype
    G, R = Hq // Hkv, R0 + m
    x = fc_b + product_of(torch.cat([f.to(dt), e], -1), w[0], s[0], b[0], packed[0])     # [m, H] fp32 residual
    y = torch.rms_norm(x, [H], ln1, eps).to(dt)
    qkv = product_of(y, w[1], s[1], b[1], packed[1])                                    # [m, (Hq+2Hkv) D]
    qk = qkv[:, :(Hq + Hkv) * D].view(m, Hq + Hkv, D)
    qk = qk * cos + qk.roll(D // 2, -1) * sin                                            # fp32, roped, q scaled
    k[:, R0:R] = qk[:, Hq:].transpose(0, 1)
    v[:, R0:R] = qkv[:, (Hq + Hkv) * D:].view(m, Hkv, D).transpose(0, 1)
    # past the keys and values, only the rows whose outputs are wanted (last > 0: a step's committed rows but
    # the root give their keys and values only): n of them
    n0 = m - last if last > 0 else 0
    n = m - n0
    # GQA: the G query heads of a key head are G more query rows against that head's keys
    q = qk[n0:, :Hq].view(n, Hkv, G, D).transpose(0, 1).reshape(Hkv, n * G, D)           # [Hkv, n G, D]
    sc = q @ k[:, :R].transpose(1, 2)                                                    # [Hkv, n G, R]
    sc.view(Hkv, n, G, R)[:, :, :, R - bias.shape[1]:].add_(bias[n0:, None])
    a = torch.softmax(sc, -1) @ v[:, :R]                                                 # [Hkv, n G, D]
    a = a.view(Hkv, n, G * D).transpose(0, 1).reshape(n, Hq * D)                         # heads in q's order
    x = x[n0:] + product_of(a.to(dt), w[2], s[2], b[2], packed[2])                       # [n, H]
    gu = product_of(torch.rms_norm(x, [H], ln2, eps).to(dt), w[3], s[3], b[3], packed[3]).chunk(2, -1)
    x += product_of(torch.nn.functional.silu(gu[0]) * gu[1], w[4], s[4], b[4], packed[4])
    h = torch.rms_norm(x, [H], norm, eps)                                                # [n, H] fp32
    y = product_of(h.to(dt), w[5], s[5], b[5], packed[5])                                # [n, v] logits
    if k_top == 0:
        return h, y, y
    lp, ix = torch.topk(torch.log_softmax(y, -1, dtype=torch.float32), k_top, -1)         # [n, k] each
    return h, lp, ix if ids is None else ids[ix]                                         # target token ids
