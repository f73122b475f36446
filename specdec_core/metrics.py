"""Run metrics in vLLM's vocabulary, computed from the step records alone.

acceptance rate = accepted / drafted; mean acceptance length = committed tokens / steps (bonus and
resampled tokens counted, so plain decoding scores 1.0); TTFT = time to the first committed token,
prefill included; TPOT = (total - TTFT) / (tokens - 1).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, asdict

from .records import StepRecord


@dataclass
class RunMetrics:
    tokens: int
    total_s: float
    ttft_s: float
    tpot_s: float
    tokens_per_s: float
    steps: int
    drafted: int
    accepted: int
    acceptance_rate: float
    mean_acceptance_length: float
    per_position_acceptance: list[float]
    accepted_histogram: dict[int, int]
    target_forwards: int
    draft_forwards: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accepted_histogram"] = {str(k): v for k, v in sorted(self.accepted_histogram.items())}
        return d


def per_position(records) -> tuple[list[int], list[int]]:
    """(tried, accepted) counts for each draft position over any number of step records."""
    tried, ok = [], []
    for r in records:
        if r.k > len(tried):
            tried += [0] * (r.k - len(tried))
            ok += [0] * (r.k - len(ok))
        for i in range(r.k):
            tried[i] += 1
            ok[i] += i < r.n_accepted
    return tried, ok


def tested(records) -> int:
    """Drafted tokens the target actually judged: every accepted one, plus the first rejected one of a step.

    accepted / tested is Leviathan et al.'s alpha (the chance a guess is kept, given the target got to it);
    accepted / drafted, the acceptance rate, also counts the guesses after a rejection, which nobody looked at."""
    return sum(r.n_accepted + (r.n_accepted < r.k) for r in records if r.k)


def summarize(records: list[StepRecord]) -> RunMetrics:
    if not records:
        raise ValueError("no steps to summarize")
    tokens = records[-1].n_generated
    total = records[-1].elapsed
    ttft = records[0].elapsed
    drafted = sum(r.k for r in records)
    accepted = sum(r.n_accepted for r in records)
    tried, ok = per_position(records)
    return RunMetrics(
        tokens=tokens, total_s=total, ttft_s=ttft,
        tpot_s=(total - ttft) / (tokens - 1) if tokens > 1 else 0.0,
        tokens_per_s=tokens / total if total > 0 else 0.0,
        steps=len(records), drafted=drafted, accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_acceptance_length=tokens / len(records),
        per_position_acceptance=[o / t if t else 0.0 for o, t in zip(ok, tried)],
        accepted_histogram=dict(Counter(r.n_accepted for r in records)),
        target_forwards=records[-1].target_forwards, draft_forwards=records[-1].draft_forwards,
    )


def timings(recs_runs: list[list], base_runs: list[list]) -> dict:
    """Where the time goes, from the StepRecords: draft seconds per drafted token, one plain target forward,
    and one verification forward over the pending token plus the drafts. c = draft per token / target forward
    is Leviathan et al.'s cost ratio. The prefill is no step's work (step.prefill), so every step counts."""
    drafted = sum(r.k for recs in recs_runs for r in recs)
    t_draft = sum(r.t_draft for recs in recs_runs for r in recs if r.k)
    plain = [r.t_score for recs in base_runs for r in recs]
    verify = [r.t_score for recs in recs_runs for r in recs if r.k]
    fwd = sum(plain) / len(plain) if plain else 0.0
    per_tok = t_draft / drafted if drafted else 0.0
    return {"draft_ms_per_token": 1e3 * per_tok, "target_forward_ms": 1e3 * fwd,
            "verify_forward_ms": 1e3 * (sum(verify) / len(verify)) if verify else 0.0,
            "cost_ratio_c": per_tok / fwd if fwd else 0.0}
