"""Drafters' products with the target forward's packed weights (forward.Dense), without its row padding.

forward.Dense pads a product's rows to a multiple of ROWS so that every row takes one kernel: the target's
logits must be bitwise the same however a position is batched. A draft needs no such invariance
(verification is exact whatever the draft proposes), and on a draft of a few rows the padding's two extra
ops per product are a measurable share of its cost. The packed weight itself is what makes the product
fast (oneDNN's blocked layout, prepared once instead of inside every call).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..forward import Dense


def mm(d: Dense, x: torch.Tensor) -> torch.Tensor:
    """x [m, in] @ W^T (+ b) in W's dtype, with the packed weight where Dense has one."""
    if d.packed is not None:
        y = torch.ops.mkldnn._linear_pointwise(x, d.packed, None, "none", [], "")
    else:
        y = F.linear(x, d.w)
    return y if d.b is None else y + d.b
