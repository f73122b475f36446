"""The fast path's products: each weight prepared once (oneDNN's blocked layout, or int8 with a scale per row), and
the kernels of csrc/kernels.cpp that native.py builds, looked up by name.

`Dense` is forward.Linear with a prepared weight: the same rows padded the same way (forward.linear_rows), so a
target's logits stay batch-invariant; oneDNN's packed product sums in another order than torch's plain one (equal to
about 1e-4 in fp32), so a forward of Dense products is held to the op-by-op loop over the same products, bit for bit.

Drafts use products without the row padding (`product`, `mm`): a draft needs no batch invariance (verification is
exact whatever the draft proposes), and on a draft of a few rows the padding's extra ops are a share of its cost.
A draft head's products have a few rows, so their time is the time to read their weights: int8 weights with one
scale per output row (symmetric, round to nearest) read half the bytes of bf16 ones (the activations stay in the
model dtype). The rounding moves the draft's logits a little, which can only move acceptance: the exact rule checks
every drafted token against the target.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from .. import forward as fw
from ..forward import MAX_ROWS, Linear, linear_rows, matmul_wt, scripted


class Dense(Linear):
    """y = x @ W^T (+ b) with W packed once for oneDNN on the CPU (plain F.linear elsewhere); rows padded.

    int8=True (a draft's weights, never the target's): W stored in int8 with one scale per output row
    (symmetric, round to nearest) where `int8_ok`, for an int8 product with the activations in W's dtype
    (`int8_product`: csrc/kernels.cpp's kernel wherever native.py builds it, on every path, else ATen's weight-only
    one): a draft's few rows are bound by the bytes they read, and int8 reads half of bf16's. The rounding
    moves the draft's logits a little, which can only move acceptance: the exact rule checks every drafted
    token. That product computes each row alone (a row's bits do not depend on the rows beside it), so a
    draft stays batch-invariant with it."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, pack: bool = True, int8: bool = False):
        self.w, self.b, self.packed, self.s = w, b, None, None   # packed: the prepared weight; s: int8's scales
        self.q4 = None   # the same bf16 weights as 4-bit tiles (q4.attach: the bundled target's layers), or as the
        #                  dot products' bf16 lines (q4.attach_head: its head, without AMX)
        if int8 and int8_ok(w.device, w.dtype):
            s = w.float().abs().amax(1).clamp_min(1e-12) / 127                              # [N]
            self.packed = (w.float() / s[:, None]).round_().clamp_(-127, 127).to(torch.int8).contiguous()
            self.s = s.to(w.dtype)
        elif pack and w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) \
                and torch.backends.mkldnn.is_available():
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w, fw.ROWS)
                x = w.new_zeros(fw.ROWS, w.shape[1])
                torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                self.packed = packed
            except (RuntimeError, AttributeError):   # a build without these ops: the plain product
                pass

    @property
    def weight(self) -> torch.Tensor:
        """What `weight_product` takes: the prepared weight, or W itself."""
        return self.w if self.packed is None else self.packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.q4 is not None:   # the C++ loop's own dense: the 4-bit kernel, or the packed product where it is off
            return native_op("dense")(x, self.packed, self.q4, self.b, MAX_ROWS, fw.ROWS)
        if self.s is not None:   # int8: each row alone, no padding; the C++ loop's kernel where it is built
            y = int8_product(x, self.packed, self.s)
            return y if self.b is None else y + self.b
        return linear_rows(x, self.weight, self.b, self.packed is not None, MAX_ROWS, fw.ROWS)

    @property
    def rows_alone(self) -> bool:
        return self.s is not None


def kernels_now() -> tuple:
    """The switches of csrc/kernels.cpp that decide which kernels a forward runs now (the 4-bit products, on AMX's
    tiles or not, the attention loop, on AMX's tiles or not): tests and benches flip them, and each kernel rounds
    its own way. None where the module is not built."""
    names = ("q4_products", "q4_amx", "tile_attention", "own_attention")
    return tuple(None if op is None else op(None) for op in map(native_op, names))


@functools.lru_cache(maxsize=None)
def native_op(name: str):
    """One of csrc/kernels.cpp's functions where native.py builds it (and SPECDEC_NATIVE is not 0), else None.
    Resolved once a process."""
    from . import native
    return native.op(name)


def int8_product(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [m, K] @ (w int8 [N, K] * s)^T in x's dtype: csrc/kernels.cpp's int8_product where it is built (its own kernel
    where it fits, else ATen's), which the C++ layer loop also calls, so a draft's products are the same bits on
    every path; ATen's weight-only int8 product elsewhere."""
    op = native_op("int8_product")
    return op(x.contiguous(), w, s) if op is not None else torch.ops.aten._weight_int8pack_mm(x, w, s)


@functools.lru_cache(maxsize=None)
def int8_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether Dense(int8=True) takes int8 weights there: on the CPU only (on a GPU a draft's products are no
    bottleneck), with bf16 activations (with fp32 ones ATen's int8 product is many times slower than a plain fp32
    product), where this build of torch has the kernel (probed once)."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return False
    try:
        torch.ops.aten._weight_int8pack_mm(torch.zeros(1, 32, dtype=dtype, device=device),
                                           torch.zeros(8, 32, dtype=torch.int8, device=device),
                                           torch.ones(8, dtype=dtype, device=device))
        return True
    except (RuntimeError, NotImplementedError):
        return False


@scripted
def weight_product(x: torch.Tensor, w: torch.Tensor, s: Optional[torch.Tensor], packed: bool) -> torch.Tensor:
    """x @ W^T in W's dtype: W int8 with row scales s, oneDNN-packed, or plain (Dense.weight, Dense.s)."""
    if s is not None:
        return torch.ops.aten._weight_int8pack_mm(x, w, s)
    return matmul_wt(x, w, packed)


def product(w: torch.Tensor, int8: bool = False) -> Dense:
    """A draft's product weight: Dense, its weight in int8 where asked and int8_ok, else packed."""
    return Dense(w, int8=int8)


def parts(d: Dense) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], bool]:
    """A product weight as `product_of` takes it: (weight, int8 row scales or None, bias or None, prepared)."""
    return d.weight, d.s, d.b, d.packed is not None


@scripted
def product_of(x: torch.Tensor, w: torch.Tensor, s: Optional[torch.Tensor], b: Optional[torch.Tensor],
               packed: bool) -> torch.Tensor:
    """x [m, in] @ W^T (+ b) in W's dtype, rows unpadded (`parts`)."""
    y = weight_product(x, w, s, packed)
    return y if b is None else y + b


def mm(d: Dense, x: torch.Tensor) -> torch.Tensor:
    """x [m, in] @ W^T (+ b) in W's dtype, with the prepared weight where Dense has one; an int8 weight through
    native.py's int8 product where it is built (the C++ loops' own kernel: csrc/kernels.cpp's int8_product)."""
    return d(x) if d.s is not None else product_of(x, *parts(d))   # int8: Dense's own call, no padding either way


def top_logprobs(y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y [n, v] logits -> (the k largest log-softmax values of each row, fp32 [n, k], their indices [n, k]), largest
    first: csrc/kernels.cpp's one-pass loop where native.py builds it (a top-2 of 4096 logits through torch.topk cost
    30 us), else torch's."""
    op = native_op("draft_top")
    if op is not None:
        return op(y.contiguous(), k)
    return torch.topk(torch.log_softmax(y, -1, dtype=torch.float32), k, -1)


class PackedHeads:
    """The first n heads for drafting: all n blocks as one packed product (they all read the same h: their
    weights stacked [n H, H]) and the shared LM head's draft-vocabulary rows packed, both in the target's
    dtype (Dense, mm), or with int8 weights where int8_ok (Dense's int8: half the
    bytes; the CPU, as EAGLE's head). drafters/medusa.HeadRows is the reference it is held to,
    up to the products' rounding."""

    def __init__(self, heads, w: torch.Tensor, n: int, dtype: torch.dtype, int8: bool = False):
        H = heads.w.shape[-1]
        self.n, self.H, self.dtype = n, H, dtype
        self.blocks = product(heads.w[:n].detach().reshape(n * H, H).to(w.device, dtype).contiguous(), int8)
        self.lm = product(w.detach().to(dtype).contiguous(), int8)                                  # [v, H]
        self.b = heads.b[:n].detach().to(w.device, torch.float32)                                     # [n, H]
        self.ids = heads.vocab.ids.to(w.device) if heads.vocab is not None else None

    def __call__(self, h: torch.Tensor, k: int, probs: bool = False):
        """h [H] -> [n, k] target ids: each head's k best tokens, best first; with `probs` also [n, k] each
        head's probability of them (softmax over the tokens it ranks)."""
        y = mm(self.blocks, h.to(self.dtype)[None]).view(self.n, self.H)                            # [n, H]
        x = h.float() + F.silu(self.b + y)                                                          # [n, H] fp32
        logits = mm(self.lm, x.to(self.dtype))                                                      # [n, v]
        lp, top = top_logprobs(logits, k)                                                           # [n, k]
        ids = self.ids[top] if self.ids is not None else top
        return (ids, lp.exp()) if probs else ids
