"""Draft sources behind one small interface, the Drafter protocol.

A drafter proposes up to k new tokens after the committed context, with the distribution q each was drawn
from (None for a deterministic draft, which verification treats as one-hot), or a candidate tree. After
verification it is told how many of its tokens survived; a drafter that reads the target's hidden state
(Medusa, EAGLE) is also handed, after every target forward, the final hidden state of the newest token the target
has run. Everything else, including exactness, is the engine's job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from ..sampling import SamplingParams


@dataclass
class DraftContext:
    tokens: list[int]              # committed ids so far: prompt + generated
    prompt_len: int
    k: int                         # propose at most this many
    sp: SamplingParams
    gen: torch.Generator | None
    stop_below: float = 0.0        # a draft with a distribution stops when its top probability is under this


@dataclass
class Proposal:
    tokens: torch.Tensor                     # [m] new ids, m <= k
    q: torch.Tensor | None = None            # [m, V] distributions they were drawn from; None = one-hot
    forwards: int = 0                        # draft-model forward passes spent
    info: dict = field(default_factory=dict)  # drafter-specific extras for the animation
    tree: object = None                      # a tree.Tree: tokens are its nodes after the root (tree_step.py)
    conf: list[float] | None = None          # [m] a tree's nodes: the drafter's own probability of each token
                                             # given its parent, for display (candidates verify as one-hot)

    @classmethod
    def empty(cls, **info) -> "Proposal":
        """Nothing to propose this step."""
        return cls(torch.empty(0, dtype=torch.long), info=info)


@runtime_checkable
class Drafter(Protocol):
    """What the engine (engine.py, batch.py) asks of a draft source, in the order it asks.

    Drafters subclass this for the defaults; only `propose` must be written.
      begin(prompt)          once, before the prompt is prefilled: reset per-sequence state
      observe(h, n)          only if `reads_hidden`: after the prefill and after every verification forward,
                             h [H] is the target's final-norm hidden state (the LM head's input) at committed
                             position n - 1, the newest one the target has run; the pending token comes next
      propose(ctx)           each step with ctx.k >= 1: at most ctx.k new tokens (or a tree, see Proposal)
      feedback(ctx, n)       after verification, when it proposed m >= 1 tokens: n of them were accepted;
                             ctx.tokens already holds what was committed (drafters with a cache may instead
                             roll back lazily against the next ctx, as draft_model.py does)
    """
    name: str = "drafter"
    default_k: int = 4
    reads_hidden: bool = False

    def begin(self, prompt: list[int]) -> None:
        pass

    def observe(self, h: torch.Tensor, n: int) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        raise NotImplementedError

    def feedback(self, ctx: DraftContext, n_accepted: int) -> None:
        pass


NAMES = ("none", "lookup", "suffix", "draft", "early-exit", "medusa", "eagle")
DESCRIPTIONS = {
    "none": "plain decoding: one target forward per token (the baseline)",
    "lookup": "prompt lookup: copy the continuation of the latest n-gram match in the context",
    "suffix": "suffix decoding: a tree of the most frequent continuations seen before in this session",
    "draft": "a separate, smaller draft model with the same vocabulary",
    "early-exit": "self-speculation: the target's first layers plus a trained exit draft",
    "medusa": "extra heads on the target propose a tree of candidates, verified in one pass",
    "eagle": "a one-layer head drafts the target's next hidden states; a tree shaped by its confidence",
}


class DrafterUnavailable(ValueError):
    """The named drafter cannot run with what was given."""


def make(name: str, target, draft_lm=None, **kw) -> Drafter:
    """Build a drafter by name for `target` (an LM). `draft_lm` is the draft model for `draft`."""
    from .lookup import PromptLookup
    from .none import NoDraft
    from .draft_model import DraftModel
    if name == "none":
        return NoDraft()
    if name == "lookup":
        return PromptLookup(**kw)
    if name == "suffix":
        from .suffix import Suffix
        return Suffix(**kw)
    if name == "draft":
        if draft_lm is None:
            from .distilled import available, shipped_draft
            if available(target):  # the bundled target ships its own distilled draft
                return DraftModel(shipped_draft(target), target)
            raise DrafterUnavailable("drafter 'draft' needs a draft model: pass --draft-model SPEC "
                                     "(a hub id or local directory with the target's vocabulary); "
                                     "no trained draft ships for this target yet")
        return DraftModel(draft_lm, target)
    if name == "medusa":
        from .medusa import Medusa
        return Medusa(target, **kw)
    if name == "eagle":
        from .eagle import Eagle
        return Eagle(target, **kw)
    if name == "early-exit":
        from .early_exit import EarlyExit, load_exit, WEIGHTS as EE_WEIGHTS
        from ..models import BUNDLED_NAME
        if target.name != BUNDLED_NAME or not (EE_WEIGHTS / "early-exit.safetensors").exists():
            raise DrafterUnavailable("drafter 'early-exit' has trained weights only for the bundled target; "
                                     "run `python -m specdec_core train early-exit` to produce them")
        return EarlyExit(target, load_exit(target.model), **kw)
    raise DrafterUnavailable(f"unknown drafter {name!r}; choose one of: {', '.join(NAMES)}")
