"""Where greedy speculative output parts from plain output, and why: batch invariance, measured.

Greedy speculative decoding keeps exactly the target's argmax tokens *if* the target scores a position the
same way in a verify step of k + 1 tokens as in a one-token decode step. A forward that rounds the two
differently (transformers' attention path does, in bf16) flips the argmax wherever the top two logits are
closer than that rounding difference; ours (forward.py) scores both bit for bit the same. This module finds
the first differing position and measures, there, the top-two gap and the 1-token vs (k+1)-token difference.
`first_difference` and `difference` are the one greedy on/off diff the checklists and pages use.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..engine import run
from ..models import LM


def first_difference(a, b) -> int | None:
    """The first position where sequences `a` and `b` (token ids, or text) differ; None when they are equal.
    When one is a prefix of the other it is the shorter one's length: the first position only one of them has."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def difference(a, b, unit: str = "token") -> str:
    """The diff in words: "identical", "differ from token 7", or, when only the lengths differ,
    "same first 5 tokens, then one stops (5 vs 8)". Positions are counted from 1."""
    j = first_difference(a, b)
    if j is None:
        return "identical"
    if j == min(len(a), len(b)):
        return f"same first {j} {unit}s, then one stops ({len(a)} vs {len(b)}): differ from {unit} {j + 1}"
    return f"differ from {unit} {j + 1}"


@dataclass
class Drift:
    forward: str                  # "ours" | "hf"
    identical: bool               # speculative tokens == plain tokens
    position: int | None          # first generated position that differs (None when identical)
    plain_token: str = ""
    spec_token: str = ""
    top_gap: float = 0.0          # logit(top 1) - logit(top 2) at the probed position, 1-token scoring
    scoring_diff: float = 0.0     # max |logit alone - logit as the last of k + 1| over the vocabulary

    def to_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def scoring_diff(lm: LM, ctx: list[int], k: int) -> tuple[float, float]:
    """The next-token logits after ctx, scored as a one-token step and as the last of a (k+1)-token step:
    (max absolute difference, top-1 minus top-2 gap of the one-token logits)."""
    n = min(k + 1, len(ctx) - 1)
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx[:-1]), c)
    alone = lm.forward(torch.tensor(ctx[-1:]), c)[-1]
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx[:-n]), c)
    chunk = lm.forward(torch.tensor(ctx[-n:]), c)[-1]
    top2 = torch.topk(alone, 2).values
    return float((alone - chunk).abs().max()), float(top2[0] - top2[1])


def compare(lm: LM, make_drafter, prompt: list[int], k: int, max_new_tokens: int,
            probe: int | None = None) -> Drift:
    """Greedy plain vs speculative (`make_drafter()` at draft length k) on one forward. The probe position is
    the first difference, or `probe` (e.g. where another forward drifted) when the outputs are identical."""
    from ..drafters import PLAIN, make
    plain = run(lm, make(PLAIN, lm), prompt, k=0, max_new_tokens=max_new_tokens, detail=False)[0]
    spec = run(lm, make_drafter(), prompt, k=k, max_new_tokens=max_new_tokens, detail=False)[0]
    j = first_difference(plain, spec)
    d = Drift(lm.forward_name, j is None, j)
    at = j if j is not None else probe
    if at is not None and at < len(plain):
        d.scoring_diff, d.top_gap = scoring_diff(lm, list(prompt) + plain[:at], k)
    if j is not None and j < min(len(plain), len(spec)):   # past the shorter one's end there is no token pair
        tok = lm.tokenizer
        d.plain_token, d.spec_token = tok.decode([plain[j]]), tok.decode([spec[j]])
    return d
