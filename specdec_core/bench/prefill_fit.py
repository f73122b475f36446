"""How long reading a long prompt takes, and a step after it, from a few passes timed on this machine.

A pass over n prompt tokens costs about a·n + b·n²: the layers' products grow with n, and attention with n² (each
token attends to all before it), which a linear rate from one short pass under-counts badly for long prompts. A
one-token step after a context of c tokens costs about s0 + s1·c (it reads c keys and values). Two timed lengths
fix both lines; negative terms from noisy timings are clamped to zero, so the estimate never shrinks with n.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fit:
    a: float      # s per prompt token
    b: float      # s per prompt token squared
    s0: float     # s of a one-token step after an empty context
    s1: float     # s more per token of context

    def read_s(self, n: int) -> float:
        return self.a * n + self.b * n * n

    def step_s(self, context: int) -> float:
        return self.s0 + self.s1 * context


def fit(lengths: tuple[int, int], pass_s: list[float], step_s: list[float]) -> Fit:
    """The Fit through two timed pass lengths (n1 < n2) and the one-token steps timed after each."""
    (n1, n2), (t1, t2), (u1, u2) = lengths, pass_s, step_s
    b = max(0.0, (t2 / n2 - t1 / n1) / (n2 - n1))     # per-token cost rises with n only through attention
    a = max(0.0, t1 / n1 - b * n1)
    s1 = max(0.0, (u2 - u1) / (n2 - n1))
    s0 = max(0.0, u1 - s1 * n1)
    if a == 0.0 and b == 0.0:
        a = t2 / n2
    return Fit(a, b, s0, s1)
