"""What one verification step did, as plain data: the engine yields these, the app and CLI consume them."""
from __future__ import annotations

from dataclasses import dataclass, field, asdict


@dataclass
class Candidate:
    """One entry of a distribution's top list, for bar charts."""
    id: int
    piece: str
    prob: float


@dataclass
class Position:
    """The verdict on one drafted token."""
    token: int
    piece: str
    p: float              # target probability p(x)
    q: float              # draft probability q(x); 1.0 for a deterministic draft
    accept_prob: float    # min(1, p/q)
    u: float              # the uniform draw tested against accept_prob
    verdict: str          # "accepted" | "rejected" | "unchecked" (after the first rejection)
    p_top: list[Candidate] = field(default_factory=list)
    q_top: list[Candidate] = field(default_factory=list)


DRAFTED = "draft"   # a committed token's origin when it is an accepted draft token


@dataclass
class Committed:
    token: int
    piece: str
    origin: str           # "draft" (accepted), "resampled", "bonus", or "target" (plain decoding)
    p: float              # target probability of this token where it was committed


@dataclass
class Trial:
    """One child of the tree tested against the current residual (verify_tree.py), in the order tried."""
    order: int            # 0 for the first child tested this step, 1 for the next, ...
    p: float              # the current residual's probability of the child's token (p(.|parent) at first)
    q: float              # what verification used for q(x): 1.0 for a deterministic candidate
    accept_prob: float    # min(1, p/q)
    u: float
    accepted: bool
    residual: list[Candidate] = field(default_factory=list)   # top of the residual after a rejection (detail)


@dataclass
class TreeNode:
    """One node of a candidate tree: node 0 is the root (the pending token, not drafted)."""
    index: int
    parent: int           # -1 for the root
    depth: int            # 0 for the root
    rank: int             # which candidate of its parent it is, 0 = the drafter's first choice (-1: the root)
    token: int
    piece: str
    conf: float | None    # the drafter's own probability of the token given its parent (None: it has none)
    trial: Trial | None   # None: never tested (its parent was rejected, or a sibling was accepted first)
    on_path: bool         # on the accepted path (the root always is)


@dataclass
class TreeView:
    """What a tree step drafted and how verification walked it (Miao et al. 2024, SpecInfer)."""
    nodes: list[TreeNode]
    mask: list[list[bool]]   # [T][T] mask[i][j]: node i sees node j (j is i or an ancestor): tree attention
    path: list[int]          # accepted node indices, root's child first (the root excluded)

    @property
    def drafted(self) -> int:
        """Candidates drafted (the root excluded)."""
        return len(self.nodes) - 1

    @property
    def depth(self) -> int:
        return max((n.depth for n in self.nodes), default=0)

    def tried(self) -> list[TreeNode]:
        """The tested nodes in the order the rule tested them."""
        return sorted((n for n in self.nodes if n.trial), key=lambda n: n.trial.order)


@dataclass
class StepRecord:
    index: int
    drafter: str
    drafted: list[int]
    positions: list[Position]
    n_accepted: int
    final_token: int                  # the resampled, bonus or plain target token
    final_piece: str
    final_kind: str                   # "resampled" | "bonus" | "target"
    final_top: list[Candidate]        # top of the distribution it was drawn from (the residual on rejection)
    committed: list[Committed]
    n_generated: int                  # generated tokens so far, this step included
    text: str                         # generated text so far
    cache_len: int                    # target KV entries after the step
    target_forwards: int              # cumulative target forwards over drafts, one a step (not the prefill)
    draft_forwards: int               # cumulative
    t_draft: float                    # seconds: propose
    t_score: float                    # seconds: target forward over the pending token and the draft
    t_verify: float                   # seconds: the acceptance rule
    t_commit: float                   # seconds: commit / rollback / feedback
    elapsed: float                    # seconds since the run started (prefill included)
    info: dict = field(default_factory=dict)  # drafter-specific extras: the n-gram match, the suffix match, ...
    done: bool = False
    stop_reason: str = ""             # "eos" | "length" once done
    tree: TreeView | None = None      # a tree step: every candidate and its trial; drafted/positions show
                                      # the accepted path and first rejected child as a chain (rates compare)

    @property
    def k(self) -> int:
        return len(self.drafted)

    def to_dict(self) -> dict:
        return asdict(self)
