"""No draft: plain autoregressive decoding through the speculative loop (k = 0), the baseline."""
from __future__ import annotations

import torch

from . import DraftContext, Proposal


class NoDraft:
    name = "none"
    default_k = 0

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal(torch.empty(0, dtype=torch.long))

    def feedback(self, ctx: DraftContext, n_accepted: int) -> None:
        pass
