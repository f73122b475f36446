"""Exact verification of a drafted chain: speculative sampling's modified rejection rule.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding" (2023), Alg. 1;
Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023), Alg. 2.

Drafted token x_i ~ q_i is kept with probability min(1, p_i(x_i) / q_i(x_i)). At the first rejection the
replacement is drawn from norm(max(0, p_i - q_i)); if all k survive, a bonus token is drawn from p_k.
The committed tokens are then distributed exactly as k+1 draws from the target. A deterministic draft
(prompt lookup, greedy drafting) is a one-hot q, so the same rule covers it: x is kept with probability p(x).

Pure: tensors in, tensors out, randomness only from the explicit generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass
class ChainVerdict:
    n_accepted: int            # how many drafted tokens survive (0..k)
    token: int                 # the resampled token (on rejection) or the bonus token (all accepted)
    kind: str                  # "resampled" | "bonus"
    p_x: torch.Tensor          # [k] target probability of each drafted token
    q_x: torch.Tensor          # [k] draft probability of each drafted token
    accept_prob: torch.Tensor  # [k] min(1, p/q)
    u: torch.Tensor            # [k] uniform draws; positions after the first rejection were never tested
    final_dist: torch.Tensor   # [V] what `token` was drawn from: the residual, or p_k for the bonus

    @property
    def k(self) -> int:
        return int(self.p_x.numel())


def one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[k] ids -> [k, V] one-hot q for a deterministic draft."""
    q = torch.zeros(tokens.numel(), vocab, device=tokens.device)
    return q.scatter_(1, tokens.view(-1, 1), 1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim; falls back to p where p <= q everywhere (then p == q and a
    rejection has probability zero, so the fallback is never sampled from in exact arithmetic)."""
    r = (p - q).clamp_(min=0)
    z = r.sum(-1, keepdim=True)
    return torch.where(z > 0, r / z.clamp(min=torch.finfo(r.dtype).tiny), p)


def verify_chain(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
                 gen: torch.Generator | None) -> ChainVerdict:
    """p: [k+1, V] target, q: [k, V] draft, draft: [k] ids drawn from q. Returns the verdict."""
    k = draft.numel()
    assert p.shape[0] == k + 1 and q.shape[0] == k, (p.shape, q.shape, k)
    pos = torch.arange(k, device=p.device)
    p_x, q_x = p[pos, draft], q[pos, draft]                                          # [k]
    ratio = torch.where(q_x > 0, p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny), torch.zeros_like(p_x))
    ratio = ratio.clamp(max=1.0)
    u = torch.rand(k, generator=gen, device=p.device)                                # [k]
    rejected = (u >= ratio).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else k
    if n < k:
        dist, kind = residual(p[n], q[n]), "resampled"
    else:
        dist, kind = p[k], "bonus"
    token = int(sample(dist, gen))
    return ChainVerdict(n, token, kind, p_x, q_x, ratio, u, dist)
