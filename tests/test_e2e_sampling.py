"""End to end: sampling through the engine with speculation has exactly the target's law.

Leviathan et al. 2023, Thm. 1; for trees, Miao et al. 2024 (SpecInfer). A tiny random Llama (12 tokens) is the
target; the target's exact law of its next three tokens is computed by enumeration from the target alone, and
the first three tokens of 12,000 seeded runs are tested against it by chi-square (tests/gof.py pools the rare
cells). The runs go through the real code: batch.decode_batch (each row
with its own generator, so row i is exactly engine.decode with seed i), the real drafters on tiny models and the
real rules of verify.py and verify_tree.py. With k = 2 and three new tokens, runs cross the step boundary in every
possible way (all accepted + bonus, rejection at either position, then a second step).

Power. 12,000 runs per case is what it takes to see the slips a real drafter makes: a q misreported by 20% on a
fifth of the tokens passes at 1,000 runs (a q one step stale sat on the old 1,000-run test's threshold there),
and both are caught here, at the same count, as must-fail tests. Each case gives five p-values: the three tokens' marginals
(11 degrees of freedom: the most power against a q a little off everywhere) and the two neighbour joints.
Threshold: a case fails when any is below ALPHA = 1e-5. Over the NULL_TESTS = 45 p-values of the cases that must
pass, the chance that an exact engine fails somewhere on a fresh set of seeds is at most 45 * 1e-5 = 4.5e-4
(Bonferroni). The seeds are fixed (case j uses seeds 12,000 j .. 12,000 j + 11,999), so the suite is
deterministic.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from specdec_core import SamplingParams
from specdec_core.batch import run_batch
from specdec_core.drafters import DraftContext
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.drafters.lookup import PromptLookup
from specdec_core.drafters.medusa import Medusa
from specdec_core.drafters.suffix import Suffix, SuffixIndex
from specdec_core.sampling import probs
from tests.gof import gof
from tests.tiny import V, subset_lm, tiny_exit, tiny_heads, tiny_lm

PROMPT = [4, 7, 1, 9, 4, 7]   # lookup matches "4 7" and proposes "1 9", which the target often keeps
SAMPLES = 12_000
CHUNK = 2_000                 # rows per batch; row i of chunk c has seed c * CHUNK + i: runs 0..SAMPLES-1
K, NEW = 2, 3
ALPHA = 1e-5
SUBSET = [0, 1, 2, 4, 6, 7, 8, 10]                     # the draft vocabulary: a strict subset of the 12 ids
TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]       # three branches at depth 1, three nodes at depth 2


@torch.inference_mode()
def exact_law(lm, prompt: list[int], n: int, sp: SamplingParams) -> np.ndarray:
    """[V]*n: the probability of each next-n-token sequence under the target with sp's warps."""
    heads = torch.cartesian_prod(*[torch.arange(V)] * (n - 1)).view(-1, n - 1)    # [V^(n-1), n-1]
    ctx = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1).to(lm.device)
    pr = probs(lm.model(ctx).logits[:, len(prompt) - 1:], sp).cpu().double()       # [B, n, V]
    head_p = pr[:, :n - 1].gather(2, heads.unsqueeze(-1)).squeeze(-1).prod(1)     # [B]
    return (head_p[:, None] * pr[:, n - 1]).view(*[V] * n).numpy()


def sample_runs(target, make_drafter, sp_kw: dict, samples: int = SAMPLES, base: int = 0) -> tuple[np.ndarray, dict]:
    """Counts [V, V, V] of the first three tokens of `samples` runs (seeds base, base + 1, ...), and how the
    drafts fared."""
    counts = np.zeros((V, V, V), dtype=np.int64)
    seen = dict(drafted=0, accepted=0, rejected=0)
    chunk = min(CHUNK, samples)
    with torch.inference_mode():
        for c in range(0, samples, chunk):
            res = run_batch(target, make_drafter, [PROMPT] * chunk, sp=SamplingParams(seed=base + c, **sp_kw), k=K,
                            max_new_tokens=NEW, stop_at_eos=False)
            for t in res.tokens:
                assert len(t) == NEW
                counts[tuple(t)] += 1
            for s in res.steps:
                seen["drafted"] += sum(s.drafted)
                seen["accepted"] += sum(s.accepted)
                seen["rejected"] += sum(a < d for a, d in zip(s.accepted, s.drafted))
    return counts, seen


def check(counts: np.ndarray, law: np.ndarray) -> dict[str, float]:
    """p-values of each token's marginal and of the joints of neighbours (x1, x2) and (x2, x3)."""
    out = {f"x{i + 1}": gof(counts.sum(tuple(j for j in range(3) if j != i)), law.sum(tuple(j for j in range(3) if j != i)))
           for i in range(3)}
    return {**out, "x1,x2": gof(counts.sum(2), law.sum(2)), "x2,x3": gof(counts.sum(0), law.sum(0))}


class StaleQ(DraftModel):
    """Broken on purpose: samples each draft from its q but reports, for draft position j >= 1, the q of
    position j - 1 (the first position's is right): q one step stale, as an off-by-one in a draft loop makes."""

    def propose(self, ctx):
        prop = super().propose(ctx)
        prop.q = torch.cat([prop.q[:1], prop.q[:-1]])                           # [m, V]
        return prop


class SkewedQ(DraftModel):
    """Broken on purpose: reports q scaled by 1.2 or 0.8 on a fifth of the vocabulary (ids 1, 6, 11, ...: 1.2,
    0.8, 1.2, ...), renormalised; drafts are still sampled from the true q. Which fifth matters: the error shows
    only where q exceeds p; on this fixture the first token's chi-square noncentrality at 12,000 runs is 7, 145,
    68, 17 and 11 for ids = 0, 1, 2, 3, 4 mod 5, and ids 1 mod 5 hold tokens this draft proposes often."""

    def propose(self, ctx):
        prop = super().propose(ctx)
        scale = torch.ones(prop.q.shape[-1])
        scale[1::10], scale[6::10] = 1.2, 0.8
        q = prop.q * scale
        prop.q = q / q.sum(-1, keepdim=True)
        return prop


class UniformQ(DraftModel):
    """Broken on purpose, grossly: samples from the draft model but tells the verifier q is uniform."""

    def propose(self, ctx):
        prop = super().propose(ctx)
        prop.q = torch.full_like(prop.q, 1.0 / prop.q.shape[-1])
        return prop


def seeded_index() -> SuffixIndex:
    """Earlier 'session' text in which "4 7" was followed by three different continuations: suffix decoding then
    proposes a branching tree at the first step (with the prompt's own "4 7 1 9")."""
    ix = SuffixIndex()
    for seq in ([4, 7, 2, 5, 0], [4, 7, 1, 3, 3], [9, 4, 7, 2, 5], [4, 7, 8]):
        ix.extend(ix.open(), seq)
    return ix


@pytest.fixture(scope="module")
def models():
    """One target on each forward (same weights), a different 1-layer draft (it and the target agree on about
    two thirds of the first token's mass at T = 1), and its draft-vocabulary copy."""
    hf, ours = tiny_lm(1), tiny_lm(1, forward="ours")
    draft = tiny_lm(4, layers=1, forward="ours")   # our forward: drafting runs per row, and it is the lighter
    return dict(hf=hf, ours=ours, draft=draft, subset=subset_lm(draft, SUBSET, forward="ours"),
                heads=tiny_heads(32, 2, seed=5))


def maker(name: str, m: dict):
    """(target, drafter factory) for a drafter name."""
    t = m["ours"] if name in ("medusa", "subset", "early-exit") else m["hf"]
    return t, {
        "lookup": lambda: PromptLookup,
        "draft": lambda: lambda: DraftModel(m["draft"], t),
        "subset": lambda: lambda: DraftModel(m["subset"], t),
        "early-exit": lambda: tiny_exit(t, seed=3),
        "medusa": lambda: lambda: Medusa(t, heads=m["heads"], tree=TREE, manifest={}),
        "suffix": lambda: (lambda ix: lambda: Suffix(index=copy.deepcopy(ix)))(seeded_index()),
        "stale-q": lambda: lambda: StaleQ(m["draft"], t),
        "skewed-q": lambda: lambda: SkewedQ(m["draft"], t),
        "uniform-q": lambda: lambda: UniformQ(m["draft"], t),
    }[name]()


T07, T10 = dict(temperature=0.7), dict(temperature=1.0)
T07W, T10W = dict(temperature=0.7, top_k=6, top_p=0.9), dict(temperature=1.0, top_k=5, top_p=0.8)
SP = {"T0.7": T07, "T0.7-topk6-topp0.9": T07W, "T1.0": T10, "T1.0-topk5-topp0.8": T10W,
      "T1.0-greedy-drafting": dict(temperature=1.0, draft_mode="greedy")}
# Every drafter and every setting, within the time budget (3 minutes of one core for this file): a drafter
# with q costs ~20 s of one core per 12,000 runs (a draft forward per drafted token per row), lookup ~5 s and
# Medusa ~10 s. So the 5 x 4 grid is cut to 7 cases, each drafter once or twice and each setting at least once:
# a warped q at T = 0.7 (early exit) and at T = 1.0 (draft model), a plain q at T = 1.0 (draft vocabulary and
# the two subtly broken drafters); a plain q at T = 0.7 is left to the 1,000-run gross check below.
CASES = [("lookup", "T0.7"), ("lookup", "T1.0-topk5-topp0.8"),
         ("draft", "T1.0-topk5-topp0.8"),
         ("subset", "T1.0"),
         ("early-exit", "T0.7-topk6-topp0.9"),
         ("medusa", "T1.0"), ("medusa", "T0.7-topk6-topp0.9"),
         ("suffix", "T0.7-topk6-topp0.9"),                  # a data-dependent tree (suffix decoding)
         ("draft", "T1.0-greedy-drafting")]                 # a model draft's argmax as a one-hot q
# make test keeps a one-hot chain (lookup, plain and warped), a tree (suffix) and a model's q made wrong (stale-q);
# a model's q and Medusa's trees in null cases are in tests/test_batch.py's quick run; the rest is make test-long's
LONG_CASES = {("subset", "T1.0"), ("medusa", "T0.7-topk6-topp0.9"), ("draft", "T1.0-greedy-drafting"),
              ("draft", "T1.0-topk5-topp0.8"), ("early-exit", "T0.7-topk6-topp0.9"), ("medusa", "T1.0")}
NULL_TESTS = 5 * len(CASES)


@pytest.mark.parametrize("drafter,sp", [pytest.param(d, s, id=f"{d}-{s}",
                                                    marks=[pytest.mark.long] * ((d, s) in LONG_CASES))
                                       for d, s in CASES])
def test_speculative_sampling_has_the_target_law(models, drafter, sp, one_thread):
    target, mk = maker(drafter, models)
    sp_kw = SP[sp]
    law = exact_law(target, PROMPT, NEW, SamplingParams(**sp_kw))
    counts, seen = sample_runs(target, mk, sp_kw, base=SAMPLES * CASES.index((drafter, sp)))   # own seeds
    # informative: drafts were made, and both kept and rejected
    assert seen["accepted"] > 0.02 * SAMPLES and seen["rejected"] > 0.02 * SAMPLES, seen
    pvals = check(counts, law)
    assert min(pvals.values()) > ALPHA, f"{drafter} {sp_kw}: chi-square p-values {pvals}"


@pytest.mark.parametrize("broken", ["stale-q", pytest.param("skewed-q", marks=pytest.mark.long)])
def test_subtly_broken_q_is_caught(models, broken, one_thread):
    """The same test, at the same count, sees a q one step stale and a q 20% off on a fifth of the tokens."""
    target, mk = maker(broken, models)
    law = exact_law(target, PROMPT, NEW, SamplingParams(**T10))
    counts, _ = sample_runs(target, mk, T10)
    pvals = check(counts, law)
    assert min(pvals.values()) < ALPHA, f"{broken} passed: p-values {pvals}"


def test_grossly_misreported_q_is_caught(models, one_thread):
    target, mk = maker("uniform-q", models)
    law = exact_law(target, PROMPT, NEW, SamplingParams(**T07))
    counts, _ = sample_runs(target, mk, T07, samples=1_000)
    assert min(check(counts, law).values()) < ALPHA


def test_fixture_models_are_informative(models, one_thread):
    """The check is only as strong as the models: the target must depend on its context, be far from
    uniform, differ from the draft, put mass outside the draft vocabulary, and lookup must propose."""
    target, draft = models["hf"], models["draft"]
    sp = SamplingParams(**T07)
    law, dlaw = exact_law(target, PROMPT, 2, sp), exact_law(draft, PROMPT, 2, sp)
    p1 = law.sum(1)
    cond = law / law.sum(1, keepdims=True)                               # p(x2 | x1)
    assert p1.max() < 0.9 and (p1 > 0.01).sum() >= 4                     # neither one-hot nor uniform
    assert 0.5 * np.abs(cond[0] - cond[1]).sum() > 0.2                  # x2 depends on x1
    assert 0.5 * np.abs(p1 - dlaw.sum(1)).sum() > 0.2                    # q differs from p
    outside = sorted(set(range(V)) - set(SUBSET))
    assert law.sum(0)[outside].sum() > 0.1                               # x2 often falls outside the subset
    sub = exact_law(models["subset"], PROMPT, 2, sp)
    assert sub.sum(1)[outside].sum() == 0 and sub.sum(0)[outside].sum() == 0   # where q is exactly zero
    prop = PromptLookup().propose(DraftContext(PROMPT, len(PROMPT), K, sp, None))
    assert prop.tokens.tolist() == [1, 9]
