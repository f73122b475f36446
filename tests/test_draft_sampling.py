"""Greedy vs sampled drafting at T > 0: a model draft either samples its guess from q or takes q's argmax (serving
engines' default) and reports the one-hot q it came from. Both go through the same exact rule, so both keep the
target's law (the chi-square case 'draft-T1.0-greedy-drafting' in test_e2e_sampling.py); only acceptance
differs."""
from __future__ import annotations

import pytest

from specdec_core import InputError, SamplingParams, engine
from specdec_core.drafters import make
from tests.tiny import tiny_lm

PROMPT = [1, 2, 3, 4, 1, 2]


def test_greedy_drafting_reports_a_one_hot_q_of_the_drafts_argmax(one_thread):
    tgt, dr = tiny_lm(1, layers=1), tiny_lm(2, layers=1)
    sp = SamplingParams(temperature=1.0, seed=0, draft_mode="greedy")
    recs = list(engine.decode(tgt, make("draft", tgt, dr), PROMPT, sp=sp, k=3, max_new_tokens=12,
                              stop_at_eos=False))
    for r in recs:
        for pos in r.positions:
            assert pos.q == 1.0 and [c.prob for c in pos.q_top] == [1.0]   # a point mass
            assert pos.accept_prob == pytest.approx(min(1.0, pos.p))         # kept with probability p(x)
    with pytest.raises(InputError, match="draft sampling must be one of sample, greedy"):
        SamplingParams(temperature=1.0, draft_mode="top-1")
