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
from .registry import (BUNDLED, DESCRIPTIONS, DISTILLED, MODEL_DRAFTS, NAMES, PLAIN, SHIPPED, SPECULATIVE, TRAINED,
                       DrafterUnavailable, Entry, entry, load_weights, manifest, runs_on, trained_for,
                       target_record, untrained, weights_for)


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
                             h [j, H] are the target's final-norm hidden states (the LM head's input) at the
                             committed positions n - j .. n - 1 that forward ran (the prompt but its pending
                             token; the pending token and the accepted drafts), the newest last; the pending
                             token comes next
      propose(ctx)           each step with ctx.k >= 1: at most ctx.k new tokens (or a tree, see Proposal)
      feedback(ctx, n)       after verification, when it proposed m >= 1 tokens: n of them were accepted;
                             ctx.tokens already holds what was committed (drafters with a cache may instead
                             roll back lazily against the next ctx, as draft_model.py does)
    """
    name: str = "drafter"
    default_k: int = 4        # registry.Entry.default_k for the registered drafters
    reads_hidden: bool = False

    def begin(self, prompt: list[int]) -> None:
        pass

    def observe(self, h: torch.Tensor, n: int) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        raise NotImplementedError

    def feedback(self, ctx: DraftContext, n_accepted: int) -> None:
        pass


def make(name: str, target, draft_lm=None, *, clock: bool = False, **kw) -> Drafter:
    """Build a drafter by name for `target` (an LM). `draft_lm` is the draft model for `draft` (resolve_draft
    resolves a spec to one); without it, `draft` runs the draft trained for this target, if one ships."""
    e = entry(name)
    if e.draft_model and draft_lm is None and not weights_for(name, target):
        raise DrafterUnavailable(f"drafter {name!r} needs a draft model: pass --draft-model SPEC "
                                 "(a hub id or local directory with the target's vocabulary); "
                                 "no trained draft ships for this target yet")
    if clock and name == "eagle":   # the one drafter that sizes its trees by cost: by each step's own clock
        kw["clock"] = True
    return _BUILD[name](target, draft_lm, **kw)


def resolve_draft(spec: str | None, target, load=None, target_spec: str = BUNDLED):
    """A draft-model spec -> the draft LM for drafter `draft`: the spec the target was loaded from (`bundled`
    unless said) is the target itself, drafting for itself; "distilled" the draft trained for it
    (DrafterUnavailable if none was); anything else a local directory or hub id read by `load` (models.load by
    default; the app passes its cached loader, the CLI its dtype and device). Empty -> DrafterUnavailable."""
    spec = (spec or "").strip()
    if not spec:
        raise DrafterUnavailable("the draft model is empty: give `bundled` (the target drafts for itself), "
                                 "`distilled` (the small draft trained for it), a local model directory or a hub id")
    if spec == target_spec:
        return target
    if spec == DISTILLED:
        if not weights_for("draft", target):
            raise untrained("draft", target)
        from .distilled import shipped_draft
        return shipped_draft(target)
    if load is None:
        from ..models import load
    return load(spec)


def _draft(target, draft_lm, **kw):
    from .draft_model import DraftModel
    if draft_lm is None:
        from .distilled import shipped_draft
        draft_lm = shipped_draft(target)
    return DraftModel(draft_lm, target)


def _none(target, draft_lm, **kw):
    from .none import NoDraft
    return NoDraft()


def _lookup(target, draft_lm, **kw):
    from .lookup import PromptLookup
    # a weak match proposes no more than the target's first row block holds: those rows cost nothing extra; where
    # the CPU's products pad no rows, every row costs its share of a step, so one token
    block = target.backend.row_block
    weak = block - 1 if block > 1 else 1 if target.forward_name == "ours" and target.device.type == "cpu" else None
    return PromptLookup(**{"weak": weak} | kw)


def _suffix(target, draft_lm, **kw):
    from .suffix import Suffix
    return Suffix(**kw)


def _early_exit(target, draft_lm, **kw):
    from .early_exit import EarlyExit
    return EarlyExit(target, **kw)


def _medusa(target, draft_lm, **kw):
    from .medusa import Medusa
    return Medusa(target, **kw)


def _eagle(target, draft_lm, **kw):
    from .eagle import Eagle
    return Eagle(target, **kw)


_BUILD = {"none": _none, "lookup": _lookup, "suffix": _suffix, "draft": _draft, "early-exit": _early_exit,
          "medusa": _medusa, "eagle": _eagle}
assert tuple(_BUILD) == NAMES, "every registry entry has a builder"
