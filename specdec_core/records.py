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
    info: dict = field(default_factory=dict)  # drafter-specific: n-gram match, tree and accepted path, ...
    done: bool = False
    stop_reason: str = ""             # "eos" | "length" once done

    @property
    def k(self) -> int:
        return len(self.drafted)

    def to_dict(self) -> dict:
        return asdict(self)
