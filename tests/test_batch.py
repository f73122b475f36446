"""Batched speculative decoding: every row's output is what it would be alone (greedy), and sampling is exact."""
import numpy as np
import pytest
import torch

from specdec_core import InputError, SamplingParams, load, make_drafter, run
from specdec_core.batch import run_batch
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.drafters.lookup import PromptLookup
from specdec_core.drafters.none import NoDraft

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


@pytest.mark.parametrize("name", ["none", "lookup", "draft"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_batched_greedy_equals_alone_tiny(tiny, tiny_draft, name, k):
    mk = {"none": NoDraft, "lookup": PromptLookup, "draft": lambda: DraftModel(tiny_draft, tiny)}[name]
    res = run_batch(tiny, mk, TINY_PROMPTS, k=k, max_new_tokens=20)
    alone = [run(tiny, mk(), p, k=k, max_new_tokens=20)[0] for p in TINY_PROMPTS]
    assert res.tokens == alone
    if name != "none":  # ragged acceptance actually happened
        assert any(len(set(s.accepted)) > 1 for s in res.steps)


def test_batch_cache_holds_committed_tokens(tiny):
    """After every step each row's valid cache entries are exactly its committed tokens but the newest."""
    done = [0] * len(TINY_PROMPTS)
    steps = run_batch(tiny, PromptLookup, TINY_PROMPTS, k=4, max_new_tokens=16, stop_at_eos=False).steps
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


@pytest.mark.parametrize("name", ["none", "lookup", "draft"])
def test_batched_greedy_equals_alone_bundled(bundled_fp32, name):
    lm = bundled_fp32
    texts = ["Repeat exactly: alpha beta gamma delta alpha beta gamma.", "Write a Python function that adds two numbers.",
             "What is the capital of France?"]
    prompts = [lm.encode(t) for t in texts]
    mk = (lambda: make_drafter(name, lm, lm)) if name == "draft" else (lambda: make_drafter(name, lm))
    res = run_batch(lm, mk, prompts, k=4, max_new_tokens=16)
    alone = [run(lm, mk(), p, k=4, max_new_tokens=16)[0] for p in prompts]
    assert res.tokens == alone


@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_batched_sampling_exact(tiny, tiny_draft, drafter):
    """Rows of a batch are independent exact samples: the first two tokens of each row follow the target's law."""
    prompt = [1, 2, 3, 1, 2]
    law = exact_joint(tiny, prompt, 2, temperature=1.0).numpy()
    mk = PromptLookup if drafter == "lookup" else (lambda: DraftModel(tiny_draft, tiny))
    counts = np.zeros_like(law)
    rows = 8
    for seed in range(600):
        res = run_batch(tiny, mk, [prompt] * rows, sp=SamplingParams(1.0, seed=seed), k=3, max_new_tokens=2)
        for t in res.tokens:
            counts[t[0], t[1]] += 1
    assert gof(counts, law) > ALPHA


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
