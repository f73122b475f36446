"""The fast path of our forward (forward.Forward.fast): its one-row layer loop and its attention, where the products
are prepared (packed.Dense). backend.py attaches it; forward.py runs without it, op by op.

A one-row call (a decode step, a chain verify, a tree, a prefill, a draft model's step) runs its decoder layers as
one function, the same ops in the same order as forward.Forward._layers, without Python between them:
csrc/kernels.cpp's `one_row_layers` where native.py builds it (the same ATen ops from C++), else `_one_row_layers`,
the TorchScript function.
TorchScript is deprecated in torch in favour of torch.compile, but inductor cannot lower the pre-packed oneDNN product
(an assertion on the packed weight), and scripting needs no compiler and no per-shape work. Attention runs in
csrc/kernels.cpp's loop where it is built, as that loop runs it (the same bits a query). tests/test_forward.py and
tests/test_native.py hold every one of these to the op-by-op loop, bit for bit.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .. import forward as fw
from ..forward import MAX_ROWS, attention_rows, linear_rows, rms_norm, rotate, scripted, tree_attention
from .packed import kernels_now, native_op, product_of


class Loop:
    """The fast path attached to one Forward: what its calls may run instead of the op-by-op loop."""

    def __init__(self, f):
        self.f = f
        # every product packed (the CPU): the one-row chain runs in the loop, attention in csrc/kernels.cpp's
        self.packed = all(getattr(d, "packed", None) is not None for b in f.blocks for d in b.products())
        self.w = None   # the loop's weights, layer by layer; None: the op-by-op loop runs (tests set it so)
        self.refresh()

    def refresh(self) -> None:
        """The loop's weight lists, from the blocks' Dense (again after q4.attach gives them 4-bit tiles: a tile
        array rides in the scale slot, where the C++ loop's dense takes it and dense_rows ignores it)."""
        blocks = self.f.blocks
        if self.packed:
            self.w = ([b.ln1 for b in blocks], [b.qkv.packed for b in blocks], [b.qkv.b for b in blocks],
                      [b.o.packed for b in blocks], [b.o.b for b in blocks], [b.ln2 for b in blocks],
                      [b.gu.packed for b in blocks], [b.down.packed for b in blocks],
                      [[d.s if d.s is not None else d.q4 for d in b.products()] for b in blocks])

    def kernels(self) -> tuple:
        return kernels_now()

    def kv_dtype(self) -> torch.dtype:
        """fp32, but bf16 where a bf16 model's attention runs on AMX's tiles (csrc/kernels.cpp's attend_tiles reads keys
        and values as bf16: half the bytes a step, and the same bits as from an fp32 cache)."""
        tiles = native_op("tile_attention")
        if self.packed and self.f.dtype == torch.bfloat16 and tiles is not None and tiles():
            return torch.bfloat16
        return torch.float32

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, groups) -> torch.Tensor | None:
        """Forward._attend's result from csrc/kernels.cpp's attention loop; None where it does not run (or fit)."""
        if not self.packed or native_op("attend_chain") is None:
            return None
        N, Hq, D = q.shape
        out = q.new_zeros(N, Hq * D)
        return out if _attend_own(q, kc, vc, groups, out, self.f.dtype == torch.bfloat16) else None

    def layers(self, x, cos, sin, groups, cache, r0: int, s0: int, N: int) -> torch.Tensor | None:
        """Forward._layers for one row's consecutive slots, in one loop; None where the loop is off or the call's
        chain groups are not spans (the op-by-op loop runs them)."""
        if self.w is None or not all(g[6] is not None or g[0] == "tree" for g in groups):
            return None
        f = self.f
        ch, tr = [g for g in groups if g[0] == "chain"], [g[4] for g in groups if g[0] == "tree"]
        return one_row_layers()(x, cos, sin, f.qk_scale, [g[5] for g in ch], [g[6][1] for g in ch],
                             [g[6][2] for g in ch], [g[1] for g in ch], *self.w, cache.k, cache.v, r0, s0, N,
                             f.n_heads, f.n_kv, f.head_dim, f.eps, MAX_ROWS,
                             [g[3] for g in groups if g[0] == "tree"], [t.S for t in tr], [t.Sk for t in tr],
                             [t.base for t in tr], [t.gather for t in tr], [t.bias for t in tr], [t.inv for t in tr],
                             [t.slow for t in tr], [t.slow_gather for t in tr], [t.rescore for t in tr],
                             [t.first for t in tr], fw.ROWS)


def attach(f):
    """f with the fast path attached (Forward.fast) -> f."""
    f.fast = Loop(f)
    return f


def _attend_own(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, groups, out: torch.Tensor, half: bool) -> bool:
    """Forward._attend's groups through csrc/kernels.cpp's attention loop, into out [N, Hq D] fp32: chains row by row
    (their real queries), trees per row. -> False where the loop does not fit (nothing written that counts)."""
    chain, tree = native_op("attend_chain"), native_op("attend_tree")
    for kind, S, r, idx, aux, bias, span in groups:
        if kind == "chain" and span is not None:
            row, a, n = span
            qs = list(range(a, a + n))
            if not chain(q, kc[row], vc[row], bias[0, 0], S, qs, out, qs, half):
                return False
        elif kind == "chain":
            rs = list(range(r.start, r.stop)) if isinstance(r, slice) else r.tolist()
            n = idx.shape[1]
            real = aux.view(-1, n).sum(1).tolist()
            for i, (row, qi) in enumerate(zip(rs, idx.tolist())):
                qs = qi[:real[i]]                          # the padding repeats a real query at the end
                if not chain(q, kc[row], vc[row], bias[i, 0], S, qs, out, qs, half):
                    return False
        else:
            qs = idx.tolist()
            if not tree(q, kc[r], vc[r], aux.gather, aux.bias, aux.base, qs, out, qs, half):
                return False
    return True


def loop_name(f) -> str:
    """Which loop runs our forward's one-row calls, for a figure's header: C++, TorchScript, or op by op (products
    not packed: no oneDNN, a GPU); '' for transformers' forward (f None)."""
    if f is None:
        return ""
    if f.fast is None or f.fast.w is None:
        return "op-by-op layer loop"
    if one_row_layers() is _one_row_layers:
        return "TorchScript layer loop"
    return "C++ layer loop, 4-bit products" if reads_q4(f) else "C++ layer loop"


def reads_q4(f) -> bool:
    """Whether f's layer products read 4-bit tiles now (q4.attach gave them; q4_products on)."""
    on = native_op("q4_products")
    return f is not None and any(getattr(b.qkv, "q4", None) is not None for b in f.blocks) and on is not None and on()


def one_row_layers():
    """The one-row layer loop: native.py's C++ build of _one_row_layers where this machine has one (the same ATen
    ops, so the same bits, without the interpreter), else the TorchScript function. Resolved once a process."""
    return native_op("one_row_layers") or _one_row_layers

@scripted
def dense_rows(x: torch.Tensor, w: torch.Tensor, s: Optional[torch.Tensor], b: Optional[torch.Tensor], packed: bool,
               max_rows: int, rows: int) -> torch.Tensor:
    """Dense's product as the loop runs it: W int8 with row scales s (each row alone, unpadded), else
    forward.linear_rows (4-bit tiles in s: only the C++ loop's dense runs them, so they are ignored here)."""
    if s is not None and s.dtype == torch.uint8:
        s = None
    if s is not None:
        return product_of(x, w, s, b, packed)
    return linear_rows(x, w, b, packed, max_rows, rows)


@scripted
def _one_row_layers(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: torch.Tensor,
                    biases: List[torch.Tensor], starts: List[int], counts: List[int], key_lens: List[int],
                    ln1: List[torch.Tensor], qkv_w: List[torch.Tensor], qkv_b: List[Optional[torch.Tensor]],
                    o_w: List[torch.Tensor], o_b: List[Optional[torch.Tensor]], ln2: List[torch.Tensor],
                    gu_w: List[torch.Tensor], down_w: List[torch.Tensor],
                    scales: List[List[Optional[torch.Tensor]]], ks: List[torch.Tensor], vs: List[torch.Tensor],
                    row: int, s0: int, N: int, Hq: int, Hkv: int, D: int, eps: float, max_rows: int,
                    tree_nodes: List[torch.Tensor], tree_S: List[int], tree_Sk: List[int], tree_base: List[int],
                    tree_gather: List[torch.Tensor], tree_bias: List[torch.Tensor],
                    tree_inv: List[Optional[torch.Tensor]], tree_slow: List[Optional[torch.Tensor]],
                    tree_slow_gather: List[Optional[torch.Tensor]], tree_rescore: List[bool], tree_first: List[int],
                    rows: int) -> torch.Tensor:
    """forward.Forward._layers for one row whose N tokens take consecutive slots from s0: chain groups, each a run of
    queries [start, start + count) over key_lens slots (slot == position), and tree groups (tree_*: a TreePlan's
    fields, the nodes tree_nodes, consecutive from tree_first or -1), the same ops in the same order (so the same
    bits), with no Python between them. scales[l]: layer l's int8 row scales of qkv, o, gate|up and down (Dense.s;
    None where a product is not int8: always, for a target). The C++ loop (csrc/kernels.cpp's one_row_layers) takes the
    same arguments in the same order.
    x [Np, H] embedded, padded to a multiple of ROWS."""
    Np = x.shape[0]
    G = Hq // Hkv
    for l in range(len(ln1)):
        qkv = dense_rows(rms_norm(x, ln1[l], eps), qkv_w[l], scales[l][0], qkv_b[l], True, max_rows, rows)  # [Np, ..]
        qk = rotate(qkv[:, :(Hq + Hkv) * D].float().view(Np, Hq + Hkv, D), cos, sin) * scale
        ks[l][row, :, s0:s0 + N] = qk[:N, Hq:].transpose(0, 1)
        vs[l][row, :, s0:s0 + N] = qkv[:N, (Hq + Hkv) * D:].view(N, Hkv, D).transpose(0, 1)
        out = torch.zeros(0)
        if len(starts) + len(tree_nodes) > 1 or N != Np:
            out = qk.new_zeros(Np, Hq, D)
        for j in range(len(starts)):
            a, n, S = starts[j], counts[j], key_lens[j]
            k, v = ks[l][row, :, :S].float(), vs[l][row, :, :S].float()                 # [Hkv, S, D]
            q = qk[a:a + n, :Hq].view(n, Hkv, G, D).permute(1, 2, 0, 3).reshape(1, Hkv, G * n, D)
            o = attention_rows(q, k[None], v[None], biases[j], rows)                     # [1, Hkv, G n, D]
            o = o.view(Hkv, G, n, D).permute(2, 0, 1, 3).reshape(n, Hq, D)
            if out.dim() == 1:
                out = o
            else:
                out[a:a + n] = o
        for j in range(len(tree_nodes)):
            a, n = tree_first[j], tree_nodes[j].shape[0]        # a >= 0: the nodes are queries a .. a + n - 1 (slices)
            o = tree_attention(qk[a:a + n, :Hq] if a >= 0 else qk[tree_nodes[j], :Hq], ks[l][row], vs[l][row], Hkv,
                               tree_S[j], tree_Sk[j], tree_base[j], tree_gather[j], tree_bias[j], tree_inv[j],
                               tree_slow[j], tree_slow_gather[j], tree_rescore[j], rows)
            if out.dim() == 1:
                out = o
            elif a >= 0:
                out[a:a + n] = o
            else:
                out[tree_nodes[j]] = o
        att = out.reshape(Np, Hq * D).to(x.dtype)
        x = x + dense_rows(att, o_w[l], scales[l][1], o_b[l], True, max_rows, rows)
        gu = dense_rows(rms_norm(x, ln2[l], eps), gu_w[l], scales[l][2], None, True, max_rows, rows).chunk(2, -1)
        x = x + dense_rows(torch.nn.functional.silu(gu[0]) * gu[1], down_w[l], scales[l][3], None, True, max_rows,
                           rows)                                                                     # gu: [Np, I] each
    return x