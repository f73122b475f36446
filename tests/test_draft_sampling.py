"""Greedy vs sampled drafting at T > 0: a model draft either samples its guess from q or takes q's argmax (serving
engines' default) and reports the one-hot q it came from. Both go through the same exact rule, so both keep the
target's law; only acceptance differs."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_core import InputError, SamplingParams, engine
from specdec_core.drafters import make
from tests.gof import ALPHA, gof
from tests.tiny import V, exact_joint, tiny_lm

PROMPT = [1, 2, 3, 4, 1, 2]


def test_greedy_drafting_reports_a_one_hot_q_of_the_drafts_argmax(one_thread):
    tgt, dr = tiny_lm(1, layers=1), tiny_lm(2, layers=1)
    sp = SamplingParams(temperature=1.0, seed=0, draft="greedy")
    recs = list(engine.decode(tgt, make("draft", tgt, dr), PROMPT, sp=sp, k=3, max_new_tokens=12,
                              stop_at_eos=False))
    for r in recs:
        for pos in r.positions:
            assert pos.q == 1.0 and [c.prob for c in pos.q_top] == [1.0]   # a point mass
            assert pos.accept_prob == pytest.approx(min(1.0, pos.p))         # kept with probability p(x)
    with pytest.raises(InputError, match="draft sampling must be one of sample, greedy"):
        SamplingParams(temperature=1.0, draft="top-1")


def test_greedy_drafting_keeps_the_target_law(one_thread):
    """(Sampled drafting has the same check in test_e2e_sampling.py.)"""
    tgt, dr = tiny_lm(1, layers=1), tiny_lm(2, layers=1)
    law = exact_joint(tgt, PROMPT, 2, temperature=0.9).numpy()
    counts = np.zeros((V, V), dtype=np.int64)
    for seed in range(2000):
        ids, _, _ = engine.run(tgt, make("draft", tgt, dr), PROMPT, k=2, max_new_tokens=2, detail=False,
                               stop_at_eos=False, sp=SamplingParams(temperature=0.9, seed=seed, draft="greedy"))
        counts[ids[0], ids[1]] += 1
    assert gof(counts, law) > ALPHA
