"""Draft sources behind one small interface.

A drafter proposes up to k new tokens after the committed context, with the distribution q each was drawn
from (None for a deterministic draft, which verification treats as one-hot). After verification it may be
told what was committed. Everything else, including exactness, is the engine's job.
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


@dataclass
class Proposal:
    tokens: torch.Tensor                     # [m] new ids, m <= k
    q: torch.Tensor | None = None            # [m, V] distributions they were drawn from; None = one-hot
    forwards: int = 0                        # draft-model forward passes spent
    info: dict = field(default_factory=dict)  # drafter-specific extras for the animation
    tree: object = None                      # a tree.Tree: tokens are its nodes after the root (tree_step.py)


@runtime_checkable
class Drafter(Protocol):
    name: str
    default_k: int

    def begin(self, prompt: list[int]) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...

    def feedback(self, ctx: DraftContext, n_accepted: int) -> None: ...


NAMES = ("none", "lookup", "draft", "early-exit", "medusa")
DESCRIPTIONS = {
    "none": "plain decoding: one target forward per token (the baseline)",
    "lookup": "prompt lookup: copy the continuation of the latest n-gram match in the context",
    "draft": "a separate, smaller draft model with the same vocabulary",
    "early-exit": "self-speculation: the target's first layers plus a trained exit draft",
    "medusa": "extra heads on the target propose a tree of candidates, verified in one pass",
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
    if name == "early-exit":
        from .early_exit import EarlyExit, load_exit, WEIGHTS as EE_WEIGHTS
        from ..models import BUNDLED_NAME
        if target.name != BUNDLED_NAME or not (EE_WEIGHTS / "early-exit.safetensors").exists():
            raise DrafterUnavailable("drafter 'early-exit' has trained weights only for the bundled target; "
                                     "run `python -m specdec_core train early-exit` to produce them")
        return EarlyExit(target, load_exit(target.model), **kw)
    raise DrafterUnavailable(f"unknown drafter {name!r}; choose one of: {', '.join(NAMES)}")
