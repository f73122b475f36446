"""Where greedy speculative output parts from plain output, and why: batch invariance, measured.

Greedy speculative decoding keeps exactly the target's argmax tokens *if* the target scores a position the
same way in a verify step of k + 1 tokens as in a one-token decode step. A forward that rounds the two
differently (transformers' attention path does, in bf16) flips the argmax wherever the top two logits are
closer than that rounding difference; ours (forward.py) scores both bit for bit the same. This module finds
the first differing position and measures, there, the top-two gap and the 1-token vs (k+1)-token difference.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..engine import run
from ..models import LM


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
    from ..drafters import make
    plain = run(lm, make("none", lm), prompt, k=0, max_new_tokens=max_new_tokens, detail=False)[0]
    spec = run(lm, make_drafter(), prompt, k=k, max_new_tokens=max_new_tokens, detail=False)[0]
    j = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    d = Drift(lm.forward_name, j is None and len(plain) == len(spec), j)
    at = j if j is not None else probe
    if at is not None and at < len(plain):
        d.scoring_diff, d.top_gap = scoring_diff(lm, list(prompt) + plain[:at], k)
    if j is not None:
        tok = lm.tokenizer
        d.plain_token, d.spec_token = tok.decode([plain[j]]), tok.decode([spec[j]])
    return d
