"""Draft-length policies: how many tokens to draft at each step.

Leviathan et al. (2023, sec. 3.5) pick one k from the acceptance rate and the draft's cost; engines adapt it:
  fixed       - k every step (the baseline policy)
  schedule    - transformers' assisted-generation heuristic: +2 after a fully accepted draft, -1 otherwise
                (never below 1), starting from k
  confidence  - stop drafting as soon as the draft's top probability falls under a threshold (the draft stops
                when unsure; at least one token is proposed); k is the upper bound. Drafts without a distribution
                (lookup, suffix, medusa) ignore it
  batch       - k by batch size (vLLM's per-batch-size setting): the fuller the batch, the less spare compute a
                verification can use, so k shrinks and drafting stops past a size (batch.py)
A tree's size has its own rule, `tree_budget` (EAGLE's sized trees): as many nodes as pay for the rows they add;
its depth, `deeper_pays`: a draft level is run only while the nodes it can add may pay for its time; and a copied
continuation grafted onto it, `copy_budget`: as many of its nodes as pay for their rows.
Every policy decides from the draft's own information and the verdicts of earlier steps only, never from the
target's distribution at the positions being drafted, so the exact rule is untouched.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError

POLICIES = ("fixed", "schedule", "confidence", "batch")
CONFIDENCE = 0.4                               # stop below this top probability
BATCH_K = ((1, None), (4, 2), (16, 1))         # batch size up to -> k (None: the run's k); larger: 0 (no drafting)


@dataclass
class KPolicy:
    name: str = "fixed"
    k: int = 4                   # the run's k: the fixed value, the schedule's start, confidence's bound
    threshold: float = CONFIDENCE

    def __post_init__(self):
        if self.name not in POLICIES:
            raise InputError(f"unknown k policy {self.name!r}; use one of {', '.join(POLICIES)}")
        if not 0.0 < self.threshold < 1.0:
            raise InputError(f"the confidence threshold must be in (0, 1), got {self.threshold}")
        self.now = self.k

    def next_k(self, batch: int = 1) -> int:
        """k for the coming step (before the room left caps it)."""
        if self.name == "batch":
            return for_batch(self.k, batch)
        return self.now

    @property
    def stop_below(self) -> float:
        """For the drafter: stop when the top probability of its next guess is under this (0 = never)."""
        return self.threshold if self.name == "confidence" else 0.0

    def update(self, drafted: int, accepted: int) -> None:
        """After verification: the schedule grows after a fully accepted draft and shrinks otherwise."""
        if self.name == "schedule" and drafted:
            self.now = self.now + 2 if accepted == drafted else max(1, self.now - 1)


def for_batch(k: int, batch: int) -> int:
    for size, kk in BATCH_K:
        if batch <= size:
            return k if kk is None else min(k, kk)
    return 0


def tree_budget(p: list[float], most: int, block: int, costs: list[float], fixed_ms: float) -> int:
    """How many of a tree's candidate nodes to verify: the count with the most expected tokens per ms of a step.

    p: each candidate's estimated chance of acceptance (its cumulative draft probability, EAGLE-2), likeliest
    first; most: the cap; costs[j - 1]: the target's measured ms for a score pass of j blocks of `block` rows
    (backend.block_ms); fixed_ms: what the step costs besides (the draft already run). Expected tokens of n
    nodes: 1 (the token drawn at the end) + the sum of their p. The root takes one row of the first block, so
    counts that fill their block, block * j - 1 (at least 1), are the ones weighed. Without costs: `most`."""
    most = min(most, len(p))
    if not costs:
        return most
    best, pick, e, got = -1.0, most, 1.0, 0
    for j, ms in enumerate(costs, 1):
        n = min(block * j - 1, most)
        if n < 1:             # a block of one row holds the root alone: a tree keeps at least one node
            continue
        e += sum(p[got:n])
        got = n
        if e / (fixed_ms + ms) > best:
            best, pick = e / (fixed_ms + ms), n
        if n == most:
            break
    return pick


def deeper_pays(mass: float, level_ms: float, tokens_per_ms: float | None) -> bool:
    """Whether one more level of a tree draft can pay for itself. It adds children to the frontier nodes it
    expands, and the children of a node share at most that node's cumulative probability, so the nodes it could
    add to the verified tree carry at most `mass` expected tokens: the sum of the expanded nodes' cumulative draft
    probabilities (a tighter bound than topk times the likeliest one's, which ran levels that bought nothing:
    docs/drafters.md). The level costs `level_ms`, which at the steps' measured rate buys level_ms * tokens_per_ms
    tokens. Without a rate yet: yes."""
    return tokens_per_ms is None or mass >= level_ms * tokens_per_ms


def copy_budget(a: float, shared: int, new: int, rows: int, block: int, costs: list[float],
                tokens_per_ms: float | None) -> int:
    """How many of a copied continuation's `new` nodes to add to a tree of `rows` rows that already holds its first
    `shared` tokens. Each copied token is right with chance `a` given the one before it (the copies' measured
    rate), so the j-th new node adds at most a^(shared + j) expected tokens. Nodes that fit the rows' last block
    cost nothing; a block past it costs its measured ms (costs, as tree_budget's), worth ms * tokens_per_ms
    tokens. -> the count with the most expected tokens net of that cost. Without a cost table (trees of a fixed
    size, transformers' forward): all of them, as the drafted nodes are; before a rate is measured: the free rows."""
    if not costs:
        return new
    free = min(new, -rows % block)
    if tokens_per_ms is None or -(-rows // block) > len(costs):
        return free
    blocks = lambda n: -(-n // block)                                         # noqa: E731
    best, pick, e = 0.0, 0, 0.0
    for j in range(1, new + 1):
        if blocks(rows + j) > len(costs):
            break
        e += a ** (shared + j)
        net = e - (costs[blocks(rows + j) - 1] - costs[blocks(rows) - 1]) * tokens_per_ms
        if net > best:
            best, pick = net, j
    return max(pick, free)
