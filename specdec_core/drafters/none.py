"""No draft: plain autoregressive decoding through the speculative loop (k = 0), the baseline."""
from __future__ import annotations

from . import DraftContext, Drafter, Proposal, entry


class NoDraft(Drafter):
    name = "none"
    default_k = entry(name).default_k   # 0: drafts nothing

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal.empty()
