"""A draft vocabulary: the drafter scores only the tokens the target actually says.

On a small target the LM head is a large share of a draft forward (49152 x 576 here: about half of a
two-layer draft on a CPU). FR-Spec (Zhao et al. 2025) and EAGLE-3 (Li et al. 2025) restrict the draft's
output layer to the most frequent tokens. q is then zero outside the subset, which the exact rule of
verify.py already handles (a token q never proposes is still reachable through the residual), so the
output distribution is unchanged; only acceptance can drop, by at most the target mass outside the subset.
"""
from __future__ import annotations

import torch


class DraftVocab:
    def __init__(self, ids: torch.Tensor, vocab_size: int):
        self.ids = ids.long().sort().values                    # [v] target ids the draft can propose
        self.size = vocab_size                                 # V, the target's
        self.t2d = torch.full((vocab_size,), -1, dtype=torch.long)
        self.t2d[self.ids] = torch.arange(len(self.ids))       # target id -> draft row, -1 outside

    @classmethod
    def from_counts(cls, seqs: list[list[int]], starts: list[int], n: int, vocab_size: int,
                    always: list[int] = (), soft: list[tuple[torch.Tensor, torch.Tensor]] = (),
                    within: "DraftVocab | None" = None) -> "DraftVocab":
        """The n tokens the target says most: answer tokens (seqs[i][starts[i]:]) counted once each, plus
        the target's probability mass on every token at every position (`soft`: (idx, logp) top-k rows),
        so that tokens it often considers but rarely picked in this data are in too; and `always` (eos).
        `within`: pick among that vocabulary's tokens only (a trained head's vocabulary narrowed: its LM-head
        rows are a subset of the ones it learned to rank)."""
        score = torch.zeros(vocab_size)
        for s, st in zip(seqs, starts):
            score.index_add_(0, torch.tensor(s[st:], dtype=torch.long), torch.ones(len(s) - st))
        for idx, logp in soft:
            score.index_add_(0, idx.reshape(-1).long(), logp.reshape(-1).float().exp())
        score[list(always)] = float("inf")
        if within is not None:
            score[within.t2d < 0] = 0
        top = torch.topk(score, min(n, int((score > 0).sum()))).indices
        return cls(top, vocab_size)

    def coverage(self, seqs: list[list[int]], starts: list[int]) -> float:
        """Share of answer tokens the draft can propose."""
        toks = torch.tensor([t for s, st in zip(seqs, starts) for t in s[st:]])
        return float((self.t2d[toks] >= 0).float().mean())

    def head(self, weight: torch.Tensor) -> torch.Tensor:
        """The LM head's rows for the draft vocabulary: [v, d]."""
        return weight[self.ids.to(weight.device)]

    def scatter(self, sub: torch.Tensor) -> torch.Tensor:
        """Draft logits [.., v] -> full logits [.., V], -inf outside the vocabulary (q = 0 there)."""
        out = sub.new_full((*sub.shape[:-1], self.size), float("-inf"))
        out[..., self.ids.to(sub.device)] = sub
        return out

    def targets(self, idx: torch.Tensor, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k soft targets (target ids) -> draft rows; entries outside the vocabulary get p = 0 and their
        mass joins the rest bucket of training.distill.soft_ce."""
        d = self.t2d[idx.long()]
        return d.clamp_min(0), logp.masked_fill(d < 0, float("-inf"))

    def state(self) -> dict[str, torch.Tensor]:
        return {"draft_vocab": self.ids.to(torch.int32)}
