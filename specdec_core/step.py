"""One verification step over rows (Leviathan et al. 2023, Alg. 1, row by row): the phases the app animates,
written once for the single-sequence loop (engine.py, a batch of one) and the batched one (batch.py).

  0. prefill  - each prompt but its last token, which is pending: committed, not yet run through the target
  1. propose  - each row's drafter proposes up to k tokens after its committed context (with q, or one-hot),
                or a tree
  2. score    - one target forward over every row's pending token and drafts gives p before every drafted
                token, plus one beyond (chain_step.slots; tree_step.slots for a tree)
  3. verify   - the exact rejection rule (verify.py, verify_tree.py) keeps a prefix and draws one more token
  4. commit   - accepted tokens and the drawn one are committed; the cache keeps exactly the committed tokens
                but the newest, which is pending for the next step, never a rejected one
  5. feedback - the drafter hears how many of its tokens survived (and, if it reads them, the hidden states)

The cache is a backend's (backend.py): Single for one sequence, Rows or MaskedRows for a batch. Each row draws from
its own generator, in one order (the drafter's samples, then verification's uniforms and its final draw), so
what a row gets never depends on the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import chain_step, clock, tree_step
from .backend import NOTHING, Slots
from .chain_step import Checked
from .drafters import DraftContext, Drafter, Proposal
from .policy import KPolicy

MAX_K = 64


@dataclass
class Row:
    """One sequence being decoded, and what its latest step did."""
    i: int                      # its row in the cache
    drafter: Drafter
    gen: torch.Generator
    pol: KPolicy
    tokens: list[int]           # committed ids: prompt + generated
    prompt_len: int
    stop: str = ""              # "eos" or "length" once it has ended
    ctx: DraftContext | None = None
    prop: Proposal | None = None
    c: Checked | None = None
    new: list[int] = field(default_factory=list)   # ids committed by the latest step

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


def until_eos(new: list[int], eos: set[int]) -> tuple[list[int], str]:
    """The committed tokens up to and including the first end-of-sequence one, and whether it came."""
    for j, t in enumerate(new):
        if t in eos:
            return new[:j + 1], "eos"
    return new, ""


def prefill(rows: list[Row], kv) -> None:
    """0. prefill: run every prompt but its last token, which stays pending, so every step scores the pending
    token and its drafts in one forward, the first step included. A drafter that reads the target's hidden
    states gets its row's, every position the prefill ran."""
    for r in rows:
        r.drafter.begin(list(r.tokens))
    h = kv.prefill([r.tokens[:-1] for r in rows])                               # per row [n, H], or None
    for r in rows:
        if r.drafter.reads_hidden and len(r.tokens) > 1:
            r.drafter.observe(h[r.i], len(r.tokens) - 1)


def step(rows: list[Row], kv, sp, max_new_tokens: int, eos: set[int]) -> list[float]:
    """One step of every row in `rows` (those still decoding) -> the clock at the start and after each phase
    (propose, score, verify, commit and feedback)."""
    t = [clock.now()]

    # 1. propose: k from the row's policy, capped by the room left (the drawn token takes one)
    for r in rows:
        k = min(r.pol.next_k(len(rows)), max_new_tokens - r.generated - 1, MAX_K)
        r.ctx = DraftContext(r.tokens, r.prompt_len, k, sp, r.gen, r.pol.stop_below)
        r.prop = r.drafter.propose(r.ctx) if k > 0 else Proposal.empty()
    t.append(clock.now())

    # 2. score: every row's pending token and drafts in one target forward
    new = [NOTHING] * kv.B
    for r in rows:
        new[r.i] = Slots(*kind(r.prop).slots(r.tokens[-1], r.prop, r.ctx.k), r.prop.tree)
    out = kv.score(new)                                                         # per row (logits, hidden)
    t.append(clock.now())

    # 3. verify
    for r in rows:
        r.c = kind(r.prop).verify(out[r.i][0], new[r.i].ids, r.prop, sp, r.gen)
    t.append(clock.now())

    # 4. commit / rollback: the cache keeps the pending token and the accepted drafts, never a rejected one
    for r in rows:
        r.new, r.stop = until_eos(r.c.draft[:r.c.v.n_accepted].tolist() + [r.c.v.token], eos)
        kv.commit(r.i, r.c.kept[:len(r.new)])
        r.tokens += r.new
        r.stop = r.stop or ("length" if r.generated >= max_new_tokens else "")
    kv.end_step()

    # 5. feedback
    for r in rows:
        if r.drafter.reads_hidden:
            r.drafter.observe(out[r.i][1][r.c.kept[:len(r.new)]], len(r.tokens) - 1)
        if r.c.draft.numel():
            r.drafter.feedback(r.ctx, r.c.v.n_accepted)
        r.pol.update(r.c.draft.numel(), r.c.v.n_accepted)
    t.append(clock.now())
    return t


def kind(prop: Proposal):
    """The step module for a proposal: tree_step for a candidate tree, chain_step for a chain."""
    return tree_step if prop.tree is not None else chain_step
