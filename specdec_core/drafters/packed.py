"""Drafters' products with the target forward's packed weights (forward.Dense), without its row padding; or
with int8 weights (Dense's int8), which a draft may use and the target never does.

forward.Dense pads a product's rows to a multiple of ROWS so that every row takes one kernel: the target's
logits must be bitwise the same however a position is batched. A draft needs no such invariance
(verification is exact whatever the draft proposes), and on a draft of a few rows the padding's two extra
ops per product are a measurable share of its cost. The packed weight itself is what makes the product
fast (oneDNN's blocked layout, prepared once instead of inside every call).

A draft head's products have a few rows, so their time is the time to read their weights: int8 weights with
one scale per output row (symmetric, round to nearest) read half the bytes of bf16 ones (the activations stay in
the model dtype). `mm` runs them through csrc/span.cpp's int8 kernel where native.py builds it (int16 activations,
exact integer sums: 2.3x ATen's weight-only int8 product at 1-2 rows, which it falls back to elsewhere). The
rounding moves the draft's logits a little, which can only move acceptance: the exact rule checks every drafted
token against the target.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..forward import Dense, native_op, scripted, weight_product


def product(w: torch.Tensor, int8: bool = False) -> Dense:
    """A draft's product weight: forward.Dense, its weight in int8 where asked and forward.int8_ok, else packed."""
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
    native.py's int8 product where it is built (the C++ loops' own kernel: csrc/span.cpp's int8_product)."""
    return d(x) if d.s is not None else product_of(x, *parts(d))   # int8: Dense's own call, no padding either way


def top_logprobs(y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y [n, v] logits -> (the k largest log-softmax values of each row, fp32 [n, k], their indices [n, k]), largest
    first: csrc/span.cpp's one-pass loop where native.py builds it (a top-2 of 4096 logits through torch.topk cost
    30 us), else torch's."""
    op = native_op("draft_top")
    if op is not None:
        return op(y.contiguous(), k)
    return torch.topk(torch.log_softmax(y, -1, dtype=torch.float32), k, -1)
