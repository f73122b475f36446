"""A separate draft model with its own KV cache (Leviathan et al. 2023; Chen et al. 2023).

The draft samples k tokens autoregressively from q (the same temperature/top-k/top-p as the target), or, with
`SamplingParams.draft_mode == "greedy"`, takes q's argmax and reports the one-hot q it was drawn from, as serving engines
do by default; either way the exact rule of verify.py applies to the q actually used.
Its cache is kept in step with the committed text by longest common prefix: after a rejection the
rejected suffix is cropped away; after a full acceptance the last drafted token, which the draft sampled
but never ran, is fed on the next proposal together with the bonus token.
"""
from __future__ import annotations

import torch

from ..models import LM, check_compatible
from ..sampling import argmax, probs, sample
from ..verify import one_hot
from . import DraftContext, Drafter, Proposal, entry


class CachedDraft(Drafter):
    """An autoregressive draft with its own KV cache, kept in step with the committed text.

    Subclasses say how to make a cache and how to run ids through it (`new_cache`, `run`)."""
    name = "cached-draft"
    default_k = 4

    def __init__(self):
        self.cache, self.seen = None, []

    def new_cache(self):
        raise NotImplementedError

    def run(self, ids: list[int]) -> torch.Tensor:
        """Run ids after what the cache holds; returns the logits [V] for the next token."""
        raise NotImplementedError

    def details(self) -> dict:
        """Drafter-specific extras for the animation."""
        return {}

    def begin(self, prompt: list[int]) -> None:
        self.cache, self.seen = self.new_cache(), []

    def sync(self, tokens: list[int]) -> torch.Tensor:
        """Crop the cache to the prefix it shares with `tokens` and run the rest (at least one token).

        Returns the logits for the token after `tokens`."""
        common = 0
        for a, b in zip(self.seen, tokens):
            if a != b:
                break
            common += 1
        keep = min(common, len(tokens) - 1)  # always run at least one token to get fresh logits
        drop = self.cache.get_seq_length() - keep
        if drop > 0:
            self.cache.crop(-drop)
        self.seen = list(tokens)
        return self.run(tokens[keep:])

    def propose(self, ctx: DraftContext) -> Proposal:
        logits = self.sync(ctx.tokens)
        out, qs = [], []
        greedy = ctx.sp.greedy or ctx.sp.draft_mode == "greedy"
        for i in range(ctx.k):
            q = probs(logits, ctx.sp)                                # [V]
            # unsure (its own softmax, since at T = 0 q is one-hot): stop drafting here (policy.py)
            if i and ctx.stop_below and float(torch.softmax(logits.float(), -1).max()) < ctx.stop_below:
                break
            x = int(argmax(q)) if greedy else int(sample(q, ctx.gen))
            if greedy and not ctx.sp.greedy:   # the guess came from a point mass: that is the q to verify against
                q = one_hot(torch.tensor([x], device=q.device), q.shape[-1])[0]
            out.append(x)
            qs.append(q)
            if i < ctx.k - 1:
                logits = self.run([x])
                self.seen.append(x)
        return Proposal(torch.tensor(out, dtype=torch.long), torch.stack(qs) if qs else None,
                        forwards=max(len(out), 1), info=self.details())


    def cache_len(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0


class DraftModel(CachedDraft):
    """A separate model as the draft."""
    name = "draft"
    default_k = entry(name).default_k

    def __init__(self, lm: LM, target: LM | None = None):
        super().__init__()
        if target is not None and lm is not target:
            check_compatible(target, lm)
        self.lm = lm

    def new_cache(self):
        return self.lm.new_cache()

    def run(self, ids: list[int]) -> torch.Tensor:
        return self.lm.forward(torch.tensor(ids), self.cache, last_only=True)[-1]
