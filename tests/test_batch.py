"""Batched speculative decoding: every row's output is what it would be alone (greedy), and sampling is exact."""
import numpy as np
import pytest
import torch

from specdec_core import InputError, SamplingParams, load, make_drafter, run
from specdec_core.batch import run_batch
from specdec_core.models import attach_forward
from specdec_core.bench.sweeps import sweep_batch
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.drafters.lookup import PromptLookup
from specdec_core.drafters.medusa import WEIGHTS as MEDUSA_WEIGHTS, Heads, Medusa
from specdec_core.drafters.none import NoDraft
from specdec_core import verify_tree as vt

from gof import ALPHA, gof
from tiny import exact_joint, perturbed, tiny_lm

# ragged on purpose: different lengths (left padding) and repetitive rows (lookup drafts long runs)
TINY_PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 4, 5, 6], [2], [7, 7, 7, 7, 7], [3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(0)


@pytest.fixture(scope="module")
def tiny_draft(tiny):
    return perturbed(tiny, 0.3, seed=1)


@pytest.fixture(scope="module")
def tiny_heads():
    """Random Medusa heads for the tiny target: they propose varied trees, of which some nodes are accepted."""
    heads = Heads(32, 4)
    with torch.no_grad():
        heads.w.copy_(0.3 * torch.randn(heads.w.shape, generator=torch.Generator().manual_seed(5)))
    return heads


def makers(tiny, tiny_draft, tiny_heads):
    return {"none": NoDraft, "lookup": PromptLookup, "draft": lambda: DraftModel(tiny_draft, tiny),
            "medusa": lambda: Medusa(tiny, heads=tiny_heads, manifest={})}   # trees of up to 4 positions


@pytest.mark.parametrize("name", ["none", "lookup", "draft", "medusa"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_batched_greedy_equals_alone_tiny(tiny, tiny_draft, tiny_heads, name, k):
    mk = makers(tiny, tiny_draft, tiny_heads)[name]
    res = run_batch(tiny, mk, TINY_PROMPTS, k=k, max_new_tokens=20)
    alone = [run(tiny, mk(), p, k=k, max_new_tokens=20)[0] for p in TINY_PROMPTS]
    assert res.tokens == alone
    if name != "none":  # ragged acceptance actually happened
        assert any(len(set(s.accepted)) > 1 for s in res.steps)


@pytest.mark.parametrize("name", ["lookup", "medusa"])
def test_batch_cache_holds_committed_tokens(tiny, tiny_draft, tiny_heads, name):
    """After every step each row's valid cache entries are exactly its committed tokens but the newest
    (for a tree: the root and the accepted path; the other nodes are holes)."""
    done = [0] * len(TINY_PROMPTS)
    mk = makers(tiny, tiny_draft, tiny_heads)[name]
    steps = run_batch(tiny, mk, TINY_PROMPTS, k=4, max_new_tokens=16, stop_at_eos=False).steps
    for s in steps:
        for i, c in enumerate(s.committed):
            done[i] += len(c)
            assert s.cached[i] == len(TINY_PROMPTS[i]) + done[i] - 1
        assert s.slots >= max(s.cached)


@pytest.fixture(scope="module")
def bundled_fp32():
    # fp32: bf16 rounding differs between batch shapes, which can flip a near-tie argmax (a numeric, not an
    # algorithmic, difference); in fp32 the algorithm's exactness is what is tested
    return load("bundled", dtype="fp32", device="cpu")


@pytest.mark.parametrize("name", ["none", "lookup", "draft",
                                  pytest.param("medusa", marks=pytest.mark.skipif(not MEDUSA_WEIGHTS.exists(),
                                                                                  reason="no shipped Medusa weights"))])
def test_batched_greedy_equals_alone_bundled(bundled_fp32, name):
    lm = bundled_fp32
    texts = ["Repeat exactly: alpha beta gamma delta alpha beta gamma.", "Write a Python function that adds two numbers.",
             "What is the capital of France?"]
    prompts = [lm.encode(t) for t in texts]
    mk = (lambda: make_drafter(name, lm, lm)) if name == "draft" else (lambda: make_drafter(name, lm))
    res = run_batch(lm, mk, prompts, k=4, max_new_tokens=16)
    alone = [run(lm, mk(), p, k=4, max_new_tokens=16)[0] for p in prompts]
    assert res.tokens == alone


@pytest.mark.skipif(not MEDUSA_WEIGHTS.exists(), reason="no shipped Medusa weights")
def test_batch_sweep_drafts_medusa_trees(bundled_fp32):
    """The batch sweep (CLI `sweep batch`, batch-size and workloads pages) runs medusa's trees, not plain decoding."""
    lm = bundled_fp32
    prompts = [lm.encode(t) for t in ("Write a Python function that adds two numbers.",
                                      "Return a JSON object with keys name and age for Ada Lovelace.")]
    (pt,) = sweep_batch(lm, "medusa", prompts, [3], max_new_tokens=12)
    assert pt["mean_acceptance_length"] > 1.0 and pt["same_tokens_as_baseline"]


@pytest.mark.parametrize("drafter", [pytest.param("lookup", marks=pytest.mark.long), "draft"])
def test_batched_sampling_exact(tiny, tiny_draft, drafter):
    """Rows of a batch are independent exact samples: the first two tokens of each row follow the target's law."""
    prompt = [1, 2, 3, 1, 2]
    law = exact_joint(tiny, prompt, 2, temperature=1.0).numpy()
    mk = PromptLookup if drafter == "lookup" else (lambda: DraftModel(tiny_draft, tiny))
    counts = np.zeros_like(law)
    rows = 8
    for seed in range(600):
        res = run_batch(tiny, mk, [prompt] * rows, sp=SamplingParams(1.0, seed=seed * rows), k=3, max_new_tokens=2)
        for t in res.tokens:
            counts[t[0], t[1]] += 1
    assert gof(counts, law) > ALPHA


def medusa_counts(tiny, tiny_heads, seeds: int):
    """Counts of the first three tokens of 8-row batches: with 4 new tokens the second step drafts a tree two
    positions deep, so tokens 2 and 3 come from tree verification (accepted nodes, bonus or resampled)."""
    prompt = [1, 2, 3, 1, 2]
    law = exact_joint(tiny, prompt, 3, temperature=1.0).numpy()
    counts = np.zeros_like(law)
    drafted = 0
    for seed in range(seeds):
        res = run_batch(tiny, lambda: Medusa(tiny, heads=tiny_heads, manifest={}), [prompt] * 8,
                        sp=SamplingParams(1.0, seed=seed * 8), k=3, max_new_tokens=4)
        drafted += sum(sum(s.drafted) for s in res.steps)
        for t in res.tokens:
            counts[tuple(t[:3])] += 1
    assert drafted > seeds * 8, "the rows should draft trees"
    return counts, law


def test_batched_medusa_sampling_exact(tiny, tiny_heads):
    counts, law = medusa_counts(tiny, tiny_heads, 400)
    assert gof(counts, law) > ALPHA


def test_broken_batched_tree_rule_would_be_caught(tiny, tiny_heads, monkeypatch):
    """Forgetting to remove a rejected sibling's mass fails the same test: it has the power to see a subtle error."""
    monkeypatch.setattr(vt, "residual", lambda r, q: r)
    counts, law = medusa_counts(tiny, tiny_heads, 200)
    assert gof(counts, law) < ALPHA


def test_broken_batch_would_be_caught(tiny):
    """The same test rejects rows that are not independent target samples (sanity check of its power)."""
    prompt = [1, 2, 3, 1, 2]
    law = exact_joint(tiny, prompt, 2, temperature=1.0).numpy()
    counts = np.zeros_like(law)
    for seed in range(600):  # greedy rows: every sample is the mode, far from the law
        res = run_batch(tiny, NoDraft, [prompt] * 8, sp=SamplingParams(0.0, seed=seed), max_new_tokens=2)
        for t in res.tokens:
            counts[t[0], t[1]] += 1
    assert gof(counts, law) < ALPHA


def test_batch_errors(tiny):
    with pytest.raises(InputError):
        run_batch(tiny, NoDraft, [[1, 2], []], max_new_tokens=4)
    with pytest.raises(InputError):
        run_batch(tiny, NoDraft, [[1, 2]], k=-1, max_new_tokens=4)


# -- sampling: one generator per row, so a row's tokens do not depend on its batch

SAMPLED = SamplingParams(0.9, top_p=0.95, seed=11)
EIGHT = TINY_PROMPTS + [[5, 6, 5, 6, 5], [8, 9, 10, 11, 8, 9], [0, 1]]


@pytest.fixture(scope="module")
def ours():
    """Tiny target and drafts on our forward, which is batch-invariant bit for bit (forward.py)."""
    from tiny import subset_lm
    t = tiny_lm(0, forward="ours")
    d = perturbed(t, 0.3, seed=1)
    attach_forward(d, "ours")
    return t, d, subset_lm(d, [0, 2, 3, 5, 7, 8, 9, 11])


def sampled_makers(ours, tiny_heads):
    from tiny import tiny_exit
    t, d, sub = ours
    return {"none": NoDraft, "lookup": PromptLookup, "draft": lambda: DraftModel(d, t),
            "subset": lambda: DraftModel(sub, t), "early-exit": tiny_exit(t, seed=3),
            "medusa": lambda: Medusa(t, heads=tiny_heads, tree=[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
                                     manifest={})}


def alone(t, mk, prompt, seed, k, n, sp=SAMPLED):
    sp = SamplingParams(sp.temperature, sp.top_k, sp.top_p, seed)
    return run(t, mk(), prompt, sp=sp, k=k, max_new_tokens=n, detail=False)[0]


@pytest.mark.parametrize("name", ["none", "lookup", "draft", "subset", "early-exit", "medusa"])
def test_batched_sampling_row_equals_alone(ours, tiny_heads, name, one_thread):
    """At T > 0, row i of a batch of 8 gives exactly the tokens engine.decode gives alone with seed sp.seed + i,
    and a row's tokens are the same at batch 1 and batch 8."""
    t = ours[0]
    mk = sampled_makers(ours, tiny_heads)[name]
    res = run_batch(t, mk, EIGHT, sp=SAMPLED, k=3, max_new_tokens=12)
    assert res.tokens == [alone(t, mk, p, SAMPLED.seed + i, 3, 12) for i, p in enumerate(EIGHT)]
    one = run_batch(t, mk, EIGHT[5:6], sp=SAMPLED, k=3, max_new_tokens=12, seeds=[SAMPLED.seed + 5])
    assert one.tokens == res.tokens[5:6]
    assert len({tuple(x) for x in run_batch(t, mk, [EIGHT[0]] * 8, sp=SAMPLED, k=3, max_new_tokens=12).tokens}) > 1
    if name != "none":
        assert any(0 < a < d for s in res.steps for a, d in zip(s.accepted, s.drafted)), "no rejection happened"


def test_batch_seeds_argument(ours, one_thread):
    t = ours[0]
    seeds = [40, 7, 7, 123, 0]
    res = run_batch(t, PromptLookup, TINY_PROMPTS, sp=SAMPLED, k=3, max_new_tokens=10, seeds=seeds)
    assert res.tokens == [alone(t, PromptLookup, p, s, 3, 10) for p, s in zip(TINY_PROMPTS, seeds)]
    for bad in ([1, 2], [1, 2, 3, 4, 5.0]):
        with pytest.raises(InputError, match="seeds"):
            run_batch(t, PromptLookup, TINY_PROMPTS, sp=SAMPLED, max_new_tokens=4, seeds=bad)


def test_batched_sampling_row_equals_alone_bundled(bundled_fp32, one_thread):
    """The same on the bundled model: prompt lookup at T = 0.8, each row as decoded alone with its seed."""
    lm = bundled_fp32
    prompts = [lm.encode(t) for t in ("Repeat exactly: alpha beta gamma delta alpha beta gamma.",
                                      "Name three colours.", "Count: one two three one two three")]
    sp = SamplingParams(0.8, seed=3)
    res = run_batch(lm, PromptLookup, prompts, sp=sp, k=4, max_new_tokens=12)
    assert res.tokens == [alone(lm, PromptLookup, p, 3 + i, 4, 12, sp) for i, p in enumerate(prompts)]
