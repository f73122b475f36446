"""End to end: sampling through the engine with speculation has exactly the target's law.

Leviathan et al. 2023, Thm. 1. A tiny random Llama (12 tokens) is the target and another, different
one the draft; the target's exact law of its next three tokens is computed by enumeration, and the
first three tokens of many seeded runs are tested against it by chi-square: the joints of (x1, x2) and
(x2, x3). With k = 2 and three new tokens, runs cross the step boundary in every possible way (all
accepted + bonus, rejection at either position, then a second step). A draft that misreports q must fail.
One-layer models: attention still makes p depend on the context, at half the cost per run.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_core import SamplingParams, engine
from specdec_core.drafters import make
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.sampling import probs
from tests.gof import ALPHA, gof
from tests.tiny import V, tiny_lm

PROMPT = [1, 2, 3, 4, 1, 2]   # lookup matches "1 2" and proposes "3 4"
RUNS = 1000


@torch.inference_mode()
def exact_law(lm, prompt: list[int], n: int, sp: SamplingParams) -> np.ndarray:
    """[V]*n: the probability of each next-n-token sequence under the target with sp's warps."""
    heads = torch.cartesian_prod(*[torch.arange(V)] * (n - 1)).view(-1, n - 1)    # [V^(n-1), n-1]
    ctx = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1).to(lm.device)
    pr = probs(lm.model(ctx).logits[:, len(prompt) - 1:], sp).cpu().double()       # [B, n, V]
    head_p = pr[:, :n - 1].gather(2, heads.unsqueeze(-1)).squeeze(-1).prod(1)     # [B]
    return (head_p[:, None] * pr[:, n - 1]).view(*[V] * n).numpy()


def sample_runs(target, drafter_fn, sp_kw: dict, runs: int = RUNS) -> np.ndarray:
    counts = np.zeros((V, V, V), dtype=np.int64)
    for seed in range(runs):
        ids, recs, _ = engine.run(target, drafter_fn(), PROMPT, sp=SamplingParams(seed=seed, **sp_kw), k=2,
                                  max_new_tokens=3, detail=False, stop_at_eos=False)
        assert len(ids) == 3 and recs[-1].stop_reason == "length"
        counts[tuple(ids)] += 1
    return counts


def check(counts: np.ndarray, law: np.ndarray) -> dict[str, float]:
    return {"x1,x2": gof(counts.sum(2), law.sum(2)), "x2,x3": gof(counts.sum(0), law.sum(0))}


class MisreportedQ(DraftModel):
    """Broken on purpose: samples from the draft model but tells the verifier q is uniform. (Subtler
    slips, like a stale q at the second draft position, sit near the threshold at this many runs; the
    10^5-trial tests of verify_chain carry the fine-grained power.)"""

    def propose(self, ctx):
        prop = super().propose(ctx)
        prop.q = torch.full_like(prop.q, 1.0 / prop.q.shape[-1])
        return prop


T08, WARPED = dict(temperature=0.8), dict(temperature=0.8, top_k=6, top_p=0.9)
CASES = [("none", T08), ("lookup", T08), ("draft", T08), ("draft", WARPED)]


@pytest.mark.parametrize("drafter,sp_kw", CASES, ids=["none", "lookup", "draft", "draft-topk6-topp0.9"])
def test_speculative_sampling_has_the_target_law(drafter, sp_kw, device, one_thread):
    target, draft = tiny_lm(1, layers=1, device=device), tiny_lm(2, layers=1, device=device)
    law = exact_law(target, PROMPT, 3, SamplingParams(**sp_kw))
    counts = sample_runs(target, lambda: make(drafter, target, draft), sp_kw)
    pvals = check(counts, law)
    assert min(pvals.values()) > ALPHA, f"{drafter} {sp_kw}: chi-square p-values {pvals}"


def test_misreported_q_is_caught(device, one_thread):
    """The same test sees a wrong q end to end."""
    target, draft = tiny_lm(1, layers=1, device=device), tiny_lm(2, layers=1, device=device)
    law = exact_law(target, PROMPT, 3, SamplingParams(temperature=0.8))
    counts = sample_runs(target, lambda: MisreportedQ(draft, target), dict(temperature=0.8))
    pvals = check(counts, law)
    assert min(pvals.values()) < ALPHA, f"misreported q passed: p-values {pvals}"


def test_fixture_models_are_informative(one_thread):
    """The check is only as strong as the models: the target must depend on its context, be far from
    uniform, differ from the draft, and lookup must actually propose."""
    target, draft = tiny_lm(1, layers=1), tiny_lm(2, layers=1)
    sp = SamplingParams(temperature=0.8)
    law, dlaw = exact_law(target, PROMPT, 2, sp), exact_law(draft, PROMPT, 2, sp)
    p1 = law.sum(1)
    cond = law / law.sum(1, keepdims=True)                               # p(x2 | x1)
    assert p1.max() < 0.9 and (p1 > 0.01).sum() >= 4                     # neither one-hot nor uniform
    assert 0.5 * np.abs(cond[0] - cond[1]).sum() > 0.2                  # x2 depends on x1
    assert 0.5 * np.abs(p1 - dlaw.sum(1)).sum() > 0.2                    # q differs from p
    recs = list(engine.decode(target, make("lookup", target), PROMPT, sp=sp, k=2, max_new_tokens=3,
                              detail=False, stop_at_eos=False))
    assert recs[0].drafted == [3, 4]
