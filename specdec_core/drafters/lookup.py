"""Prompt-lookup drafting: no neural draft, continuations copied from the context.

Saxena, "Prompt Lookup Decoding" (2023); the n-gram proposer of vLLM and transformers. The last n tokens
(n from max_ngram down to min_ngram) are searched for earlier in the prompt and the text so far; the tokens
that followed the most recent match are proposed. The draft is deterministic, i.e. a one-hot q.
"""
from __future__ import annotations

import torch

from . import DraftContext, Drafter, Proposal, entry


class PromptLookup(Drafter):
    name = "lookup"
    default_k = entry(name).default_k

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, ctx: DraftContext) -> Proposal:
        toks, n_tok = ctx.tokens, len(ctx.tokens)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            tail = toks[-n:]
            for start in range(n_tok - n - 1, -1, -1):  # most recent match first
                if toks[start:start + n] == tail:
                    cont = toks[start + n:start + n + ctx.k]
                    return Proposal(torch.tensor(cont, dtype=torch.long), info={"ngram": n, "match_at": start})
        return Proposal.empty()
