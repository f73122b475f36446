"""Logits to probabilities: temperature, top-k, top-p, applied identically to target (p) and draft (q).

Speculative sampling is exact only if p and q are the distributions actually sampled from, so every
warp the user picks is applied to both (Leviathan et al. 2023, sec. 2.3; Chen et al. 2023, sec. 2).
Temperature 0 is greedy: the distribution is the one-hot of the argmax, with no epsilon temperature.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict

import torch

from .errors import InputError   # raised here; re-exported, so `from .sampling import InputError` keeps working

MAX_TEMPERATURE = 5.0
MIN_TEMPERATURE = 0.01   # below this, logits / T overflow float32 into NaN; 0 itself is greedy
DRAFTING = ("sample", "greedy")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0        # 0 = off
    top_p: float = 1.0    # 1 = off
    seed: int = 0
    draft_mode: str = "sample"  # how a model draft picks its guess at T > 0: "sample" from q, or "greedy" (its
                                # argmax, reported as a one-hot q: engines' default, vLLM draft_sample_method)

    def __post_init__(self):
        if not (0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise InputError(f"temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise InputError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {self.temperature:g}")
        if not (0.0 < self.top_p <= 1.0):
            raise InputError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if self.draft_mode not in DRAFTING:
            raise InputError(f"draft sampling must be one of {', '.join(DRAFTING)}, got {self.draft_mode!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities under sp."""
    if sp.greedy:   # the argmax of the logits as they are: a bf16 value widens exactly, so the same index
        out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return out.scatter_(-1, argmax(logits).unsqueeze(-1), 1.0)
    logits = logits.float()
    logits = logits / sp.temperature
    if sp.top_k and sp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sp.top_p < 1.0:
        srt, idx = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(srt, -1).cumsum(-1)
        # drop a token once the mass before it already reaches top_p; the top token always stays
        drop = (cum - torch.softmax(srt, -1)) >= sp.top_p
        logits = logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return torch.softmax(logits, -1)


def sample(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """Draw one token id per row of [..., V] probabilities. A one-hot row (greedy) is its argmax: the same
    draw, without multinomial's pass over the whole vocabulary (about 1 ms here)."""
    flat = p.reshape(-1, p.shape[-1])
    if bool((flat.amax(-1) == 1.0).all()):
        return argmax(flat).reshape(p.shape[:-1])
    out = torch.multinomial(flat, 1, generator=gen).squeeze(-1)
    return out.reshape(p.shape[:-1])


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] -> [...] the index of each row's first maximum, exactly torch.argmax's (NaN counts as the
    largest, as there). On the CPU argmax's kernel is not vectorized over the last dim (many times amax's cost a
    row), so a row is read in blocks: the first block holding the maximum (argmax over the blocks' amax, which
    propagates NaN as argmax ranks it), then the first maximum inside it."""
    B = _block(x.shape[-1]) if x.device.type == "cpu" and x.dim() > 0 else 0
    if not B:
        return x.argmax(-1) if x.dim() else x.argmax()
    V = x.shape[-1]
    rows = x.reshape(-1, V // B, B)                                              # [R, V/B, B]
    blk = rows.amax(-1).argmax(-1)                                               # [R] the first block with it
    inner = rows[torch.arange(rows.shape[0], device=x.device), blk].argmax(-1)   # [R] its first place there
    return (blk * B + inner).reshape(x.shape[:-1])


def _block(V: int) -> int:
    """The block argmax reads rows of V in: a divisor of V between 128 and 1024, 0 when none (plain argmax)."""
    return next((b for b in (1024, 768, 512, 384, 256, 128) if V % b == 0 and V > b), 0)
