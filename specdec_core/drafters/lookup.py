"""Prompt-lookup drafting: no neural draft, continuations copied from the context.

Saxena, "Prompt Lookup Decoding" (2023); the n-gram proposer of vLLM and transformers. The last n tokens
(n from max_ngram down to min_ngram) are searched for earlier in the prompt and the text so far; the tokens
that followed the earliest match are proposed. The draft is deterministic, i.e. a one-hot q.

Which match: the earliest, because what an answer copies usually sits in the prompt, before any of the answer;
the most recent match is often the answer's own last use of the same words (a log's repeated date, a list's
repeated unit), which continues differently. Longest first (up to 5 tokens), so a longer tail tells such places
apart. Measured on the fresh extraction prompts (docs/measurements.md): 3.59 tokens a step against 3.17 for the
most recent match of at most 3 tokens; code, JSON, chat and creative unchanged. The context's n-grams are indexed
as it grows (each step adds the few that end in its new tokens), so a proposal costs the same at 2,000 tokens as
at 100, where a scan of the context would grow with it.

How many: k after a match of at least `strong` tokens; after a shorter (weaker) match at most `weak`. On our
forward a score pass costs the same up to a block of rows (backend.row_block, 4 on the CPU) and a block more past
it, so `make` sets weak to what the first block holds besides the pending token: a weak guess then costs
nothing, and k's long copies are bought where a copy is likely (measured: docs/measurements.md).
"""
from __future__ import annotations

import torch

from . import DraftContext, Drafter, Proposal, entry


class PromptLookup(Drafter):
    name = "lookup"
    default_k = entry(name).default_k

    def __init__(self, max_ngram: int = 5, min_ngram: int = 1, weak: int | None = None, strong: int = 3):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if weak is not None and weak < 1:
            raise ValueError(f"weak must be >= 1 (tokens after a short match), got {weak}")
        self.max_ngram, self.min_ngram, self.weak = max_ngram, min_ngram, weak
        self.strong = min(strong, max_ngram)
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self.seq: list[int] = []                 # the tokens indexed so far
        self.first: dict[tuple, int] = {}        # every n-gram (min..max tokens) in them -> where it first starts

    def _index(self, toks: list[int]) -> None:
        """Bring the index up to toks, adding only the n-grams that end in its new tokens (a step adds a few, so
        a proposal costs the same at 100 tokens of context as at 2,000); a context that does not extend the one
        indexed starts it again."""
        if toks[:len(self.seq)] != self.seq:
            self.begin([])
        for e in range(len(self.seq) + 1, len(toks) + 1):
            for n in range(self.min_ngram, min(self.max_ngram, e) + 1):
                self.first.setdefault(tuple(toks[e - n:e]), e - n)
        self.seq.extend(toks[len(self.seq):])

    def propose(self, ctx: DraftContext) -> Proposal:
        cont, n, start = self.continuation(ctx)
        if not cont:
            return Proposal.empty()
        return Proposal(torch.tensor(cont, dtype=torch.long), info={"ngram": n, "match_at": start})

    def continuation(self, ctx: DraftContext) -> tuple[list[int], int, int]:
        """(the tokens that followed the tail's earliest earlier match, the tail's length, where it matched), or
        ([], 0, -1): `propose` without its tensor (EAGLE grafts the list onto its tree)."""
        toks, n_tok = ctx.tokens, len(ctx.tokens)
        self._index(toks)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            start = self.first[tuple(toks[-n:])]     # the earliest occurrence of the tail
            if start < n_tok - n:                   # ... other than the tail itself
                # a match shorter than `strong` is weak evidence: propose at most `weak` tokens
                k = ctx.k if self.weak is None or n >= self.strong else min(ctx.k, self.weak)
                return toks[start + n:start + n + k], n, start
        return [], 0, -1
