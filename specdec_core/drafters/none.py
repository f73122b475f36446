"""No draft: plain autoregressive decoding through the speculative loop (k = 0), the baseline."""
from __future__ import annotations

from . import DraftContext, Drafter, Proposal


class NoDraft(Drafter):
    name = "none"
    default_k = 0

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal.empty()
