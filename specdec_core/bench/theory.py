"""What the measured acceptance and cost predict: Leviathan et al. (2023), eq. 1 and Thm 3.8.

With acceptance rate alpha (the chance a guess is kept, given the target got to it) and cost ratio c (one draft
step over one target step), a step of draft length k commits (1 - alpha^(k+1)) / (1 - alpha) tokens on average
and costs k c + 1 target steps.
"""
from __future__ import annotations


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Leviathan et al. (2023), eq. 1: E[committed tokens per step] = (1 - alpha^(k+1)) / (1 - alpha)."""
    return k + 1 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. (2023), Thm 3.8: expected walltime improvement for draft length k."""
    if not 0.0 <= alpha <= 1.0 or k < 0 or c < 0:
        raise ValueError(f"need 0 <= alpha <= 1, k >= 0, c >= 0; got alpha={alpha}, k={k}, c={c}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1)


def theory(rows: list[dict]) -> dict[str, dict]:
    """Per drafter, pooled over every measured k: alpha = accepted / tested (metrics.tested); c from the step
    timings."""
    out = {}
    for d in dict.fromkeys(r["drafter"] for r in rows):
        rs = [r for r in rows if r["drafter"] == d]
        drafted = sum(r["drafted"] for r in rs)
        judged = sum(r["tested"] for r in rs)
        alpha = sum(r["accepted"] for r in rs) / judged if judged else 0.0
        draft_ms = sum(r["draft_ms_per_token"] * r["drafted"] for r in rs) / drafted if drafted else 0.0
        fwd = [r["target_forward_ms"] for r in rs if r["target_forward_ms"] > 0]
        fwd_ms = sum(fwd) / len(fwd) if fwd else 0.0
        out[d] = {"alpha": alpha, "c": draft_ms / fwd_ms if fwd_ms else 0.0, "draft_ms": draft_ms,
                  "forward_ms": fwd_ms, "drafted": drafted, "tested": judged}
    return out
