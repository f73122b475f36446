"""One verification step over a chain of drafts: what the target scores, the verdict, what the cache keeps.

Leviathan et al. (2023), Alg. 1; Chen et al. (2023), Alg. 2. The tree counterpart is tree_step.py; both give
the step (step.py, row by row, for engine.py's one sequence and batch.py's many) the same three things:

  slots   - what goes through the target after the committed context: the pending token (committed, never
            run yet) and the m drafts, each one position further, each seeing those before it
  verify  - from the target's logits over those slots, p before each draft and one beyond [m+1, V], and the
            exact rule (verify.py, pure) keeps a prefix and draws one more token
  kept    - which slots become committed cache entries: the pending token and the accepted drafts; the
            engine drops the rest (a crop: the rejected drafts are the cache's tail)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafters import Proposal
from .sampling import SamplingParams, probs
from .verify import ChainVerdict, one_hot, verify_chain


@dataclass
class Checked:
    """A verified step, seen as a chain (a tree step shows its accepted path and first rejected child)."""
    draft: torch.Tensor   # [m] drafted ids, in the order the verdict tested them
    p: torch.Tensor       # [m+1, V] the target's distribution before each and after the last
    q: torch.Tensor       # [m, V] the draft's (one-hot for a deterministic draft)
    v: ChainVerdict
    kept: list[int]       # slots that become committed entries, in order (the pending token's first)
    walk: object = None   # a tree step: tree_step.Walk, every candidate and how the rule tested it


def pad_vocab(x: torch.Tensor, v: int) -> torch.Tensor:
    """Zero-pad the vocab dim: a model whose head is padded beyond the tokenizer puts mass nowhere else."""
    return x if x.shape[-1] == v else torch.nn.functional.pad(x, (0, v - x.shape[-1]))


def slots(pending: int, prop: Proposal, k: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """-> (ids [n], position offsets [n], who sees whom [n, n]) of the new slots: causal, one apart."""
    ids = [pending] + prop.tokens[:k].tolist()
    n = len(ids)
    return ids, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril()


def verify(logits: torch.Tensor, ids: list[int], prop: Proposal, sp: SamplingParams,
           gen: torch.Generator | None) -> Checked:
    """The target's logits over the slots [m+1, V] -> the verdict on the m drafts (ids[1:])."""
    dev = logits.device
    draft = torch.tensor(ids[1:], dtype=torch.long, device=dev)                       # [m]
    m = draft.numel()
    V = logits.shape[-1] if prop.q is None else max(logits.shape[-1], prop.q.shape[-1])
    p = pad_vocab(probs(logits, sp), V)                                              # [m+1, V]
    q = pad_vocab(prop.q[:m].to(dev), V) if m and prop.q is not None else one_hot(draft, V)  # [m, V]
    v = verify_chain(p, q, draft, gen)
    return Checked(draft, p, q, v, list(range(1 + v.n_accepted)))
