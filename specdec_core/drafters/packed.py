"""Drafters' products with the target forward's packed weights (forward.Dense), without its row padding; or
with int8 weights (`Int8`), which a draft may use and the target never does.

forward.Dense pads a product's rows to a multiple of ROWS so that every row takes one kernel: the target's
logits must be bitwise the same however a position is batched. A draft needs no such invariance
(verification is exact whatever the draft proposes), and on a draft of a few rows the padding's two extra
ops per product are a measurable share of its cost. The packed weight itself is what makes the product
fast (oneDNN's blocked layout, prepared once instead of inside every call).

A draft head's products have a few rows, so their time is the time to read their weights: int8 weights with
one scale per output row (symmetric, round to nearest) read half the bytes of bf16 ones, through ATen's
weight-only int8 product (the activations stay in the model dtype). The rounding moves the draft's logits a
little, which can only move acceptance: the exact rule checks every drafted token against the target.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..forward import Dense


class Int8:
    """y = x @ W^T (+ b) with W stored as int8 [N, K] and a scale per row [N] in x's dtype."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None):
        s = w.float().abs().amax(1).clamp_min(1e-12) / 127                              # [N]
        self.q = (w.float() / s[:, None]).round_().clamp_(-127, 127).to(torch.int8).contiguous()
        self.s, self.b = s.to(w.dtype), b


@functools.lru_cache(maxsize=None)
def int8_ok(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether drafts use Int8 there: on the CPU only (a draft head's few rows are bound by the bytes read; on
    a GPU the packed product is no bottleneck), where this build of torch has the kernel (probed once)."""
    if device.type != "cpu" or not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return False
    try:
        torch.ops.aten._weight_int8pack_mm(torch.zeros(1, 32, dtype=dtype, device=device),
                                           torch.zeros(8, 32, dtype=torch.int8, device=device),
                                           torch.ones(8, dtype=dtype, device=device))
        return True
    except (RuntimeError, NotImplementedError):
        return False


def product(w: torch.Tensor, int8: bool = False) -> Dense | Int8:
    """A draft's product weight: Int8 where asked and `int8_ok`, else forward.Dense (packed)."""
    return Int8(w) if int8 and int8_ok(w.device, w.dtype) else Dense(w)


def mm(d: Dense | Int8, x: torch.Tensor) -> torch.Tensor:
    """x [m, in] @ W^T (+ b) in W's dtype, with the packed weight where Dense has one, or Int8's."""
    if isinstance(d, Int8):
        y = torch.ops.aten._weight_int8pack_mm(x, d.q, d.s)
    elif d.packed is not None:
        y = torch.ops.mkldnn._linear_pointwise(x, d.packed, None, "none", [], "")
    else:
        y = F.linear(x, d.w)
    return y if d.b is None else y + d.b
