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
from typing import Optional

import torch

from ..forward import Dense, _script


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


def parts(d: Dense | Int8) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], bool]:
    """A product weight as `product_of` takes it: (weight, int8 row scales or None, bias or None, packed)."""
    if isinstance(d, Int8):
        return d.q, d.s, d.b, False
    return (d.w, None, d.b, False) if d.packed is None else (d.packed, None, d.b, True)


@_script
def product_of(x: torch.Tensor, w: torch.Tensor, s: Optional[torch.Tensor], b: Optional[torch.Tensor],
               packed: bool) -> torch.Tensor:
    """x [m, in] @ W^T (+ b) in W's dtype: W int8 with row scales s (Int8), oneDNN-packed, or plain (`parts`)."""
    if s is not None:
        y = torch.ops.aten._weight_int8pack_mm(x, w, s)
    elif packed:
        y = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    else:
        y = torch.nn.functional.linear(x, w)
    return y if b is None else y + b


def mm(d: Dense | Int8, x: torch.Tensor) -> torch.Tensor:
    """x [m, in] @ W^T (+ b) in W's dtype, with the packed weight where Dense has one, or Int8's."""
    return product_of(x, *parts(d))
