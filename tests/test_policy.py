"""Draft-length policies (policy.py): the schedule grows after a fully accepted draft and shrinks otherwise, a
model draft stops when unsure under `confidence`, k falls with the batch size; none of them changes the output."""
from __future__ import annotations

import pytest

from specdec_core import InputError, SamplingParams, engine
from specdec_core.drafters import make
from specdec_core.policy import KPolicy, for_batch
from tests.tiny import perturbed, tiny_lm


def test_the_schedule_follows_transformers_heuristic():
    p = KPolicy("schedule", 4)
    seen = []
    for drafted, accepted in [(4, 4), (6, 6), (8, 3), (7, 0), (6, 6), (1, 0), (1, 0)]:
        seen.append(p.next_k())
        p.update(drafted, accepted)
    assert seen == [4, 6, 8, 7, 6, 8, 7] and p.next_k() == 6
    q = KPolicy("schedule", 1)
    q.update(1, 0)
    assert q.next_k() == 1                                   # never below 1


def test_k_by_batch_size_and_bad_policies():
    assert [for_batch(6, b) for b in (1, 2, 4, 5, 16, 17, 64)] == [6, 2, 2, 1, 1, 0, 0]
    assert KPolicy("batch", 6).next_k(batch=8) == 1
    with pytest.raises(InputError, match="unknown k policy 'sometimes'"):
        KPolicy("sometimes")
    with pytest.raises(InputError, match=r"confidence threshold must be in \(0, 1\)"):
        KPolicy("confidence", 4, threshold=1.5)


@pytest.mark.parametrize("policy", ["schedule", "confidence"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_adaptive_k_changes_the_steps_not_the_text(policy, temperature, one_thread):
    tgt = tiny_lm(1)
    dr = perturbed(tgt, 0.3, seed=4)                         # agrees often, not always
    sp = SamplingParams(temperature=temperature, seed=5)
    kw = dict(sp=sp, max_new_tokens=40, stop_at_eos=False)
    fixed, rf, _ = engine.run(tgt, make("draft", tgt, dr), [1, 2, 3], k=4, **kw)
    ours, ra, _ = engine.run(tgt, make("draft", tgt, dr), [1, 2, 3], k=4, k_policy=policy, **kw)
    ks = [r.k for r in ra if r.k]                            # (the last step may have no room to draft)
    assert len(set(ks)) > 1                                   # k really moved
    if policy == "schedule":
        assert max(ks) > 4 or min(ks) < 4
    else:
        assert max(ks) <= 4 and min(ks) >= 1 and min(ks) < 4  # stops early when unsure, never past the bound
    if temperature == 0:
        plain, _, _ = engine.run(tgt, make("none", tgt), [1, 2, 3], **kw)
        assert ours == fixed == plain


def test_k_by_batch_size_in_a_batch_and_per_row_schedules(one_thread):
    """In a batch, 'batch' drafts less the more rows are decoding (none past 16), and per-row schedules match
    each row decoded alone; greedy tokens never change."""
    from specdec_core.batch import run_batch
    tgt = tiny_lm(1, forward="ours")
    dr = perturbed(tgt, 0.3, seed=4)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]]
    kw = dict(max_new_tokens=12, stop_at_eos=False)
    plain = run_batch(tgt, lambda: make("none", tgt), prompts, **kw).tokens
    for pol in ("batch", "schedule"):
        res = run_batch(tgt, lambda: make("draft", tgt, dr), prompts, k=6, k_policy=pol, **kw)
        assert res.tokens == plain
        if pol == "batch":   # 4 rows decoding: k = min(6, 2)
            assert max(max(s.drafted) for s in res.steps) == 2
    alone = [engine.run(tgt, make("draft", tgt, dr), p, k=6, k_policy="schedule", **kw)[1] for p in prompts]
    res = run_batch(tgt, lambda: make("draft", tgt, dr), prompts, k=6, k_policy="schedule", **kw)
    for i, recs in enumerate(alone):
        assert [s.drafted[i] for s in res.steps if s.drafted[i] or s.committed[i]][:len(recs)] == [r.k for r in recs]


def test_lookup_proposes_k_after_a_full_match_and_weak_after_a_short_one():
    """A max_ngram match proposes up to k tokens; a shorter match at most `weak`; make() sets weak to what the
    target's first row block holds besides the pending token (ours: 3), transformers' forward leaves it open."""
    from specdec_core.drafters import DraftContext, make
    from specdec_core.drafters.lookup import PromptLookup
    from specdec_core.sampling import SamplingParams
    from tests.tiny import tiny_lm
    ctx = lambda toks, k: DraftContext(toks, 1, k, SamplingParams(), None)   # noqa: E731
    seq = [5, 6, 7, 1, 2, 3, 4, 8, 9, 10, 11, 12]
    d = PromptLookup(weak=3)
    # the last 3 tokens (5, 6, 7) matched at the start: what followed, up to k
    assert d.propose(ctx(seq + [5, 6, 7], 6)).tokens.tolist() == [1, 2, 3, 4, 8, 9]
    # only the last token (9) matches: at most 3, where the uncapped lookup proposes k
    assert d.propose(ctx(seq + [20, 9], 6)).tokens.tolist() == [10, 11, 12]
    assert PromptLookup().propose(ctx(seq + [20, 9], 6)).tokens.tolist() == [10, 11, 12, 20, 9]
    assert make("lookup", tiny_lm(0, forward="ours")).weak == 3
    assert make("lookup", tiny_lm(0)).weak is None   # transformers' forward: rows are the GPU's or a reference's
    unpadded = tiny_lm(0, forward="ours")
    unpadded.fwd.pad = 1     # a CPU forward whose products take each row alone (the 4-bit dot products): rows cost
    assert unpadded.backend.row_block == 1 and make("lookup", unpadded).weak == 1
    with pytest.raises(ValueError, match="weak must be >= 1"):
        PromptLookup(weak=0)


def test_lookup_copies_from_the_earliest_match_of_the_longest_tail():
    """What an answer copies sits in the prompt, before the answer's own repeats: of two places the tail occurs,
    the earliest is followed; a longer tail that occurs once wins over a shorter one; 3 tokens are a strong match."""
    from specdec_core.drafters import DraftContext
    from specdec_core.drafters.lookup import PromptLookup
    from specdec_core.sampling import SamplingParams
    ctx = lambda toks, k: DraftContext(toks, 1, k, SamplingParams(), None)   # noqa: E731
    d = PromptLookup(weak=2)
    src = [1, 2, 3, 4, 5, 6, 7, 8]                    # the "prompt"
    ans = [9, 2, 3, 4, 0, 0]                          # an answer that reused 2, 3, 4 differently
    # tail (2, 3, 4) occurs at 1 and at 9: the earliest, the prompt's, is copied, and 3 tokens are strong
    assert d.propose(ctx(src + ans + [2, 3, 4], 4)).tokens.tolist() == [5, 6, 7, 8]
    # tail (1, 2, 3, 4) occurs once: the longer match decides, though (2, 3, 4) occurs earlier elsewhere
    seq = [2, 3, 4, 7, 1, 2, 3, 4, 5, 6]
    assert d.propose(ctx(seq + [1, 2, 3, 4], 2)).tokens.tolist() == [5, 6]


def test_a_copied_continuation_takes_the_nodes_that_pay_for_their_rows():
    """copy_budget: the rows left in the tree's last block are free; a block more is bought only when the copies'
    rate makes its nodes worth its measured ms at the steps' rate; no cost table: every node, as fixed trees do."""
    from specdec_core.policy import copy_budget
    costs = [10.0, 11.0, 12.0, 13.0]                               # a block more costs 1 ms
    assert copy_budget(0.9, 0, 5, 8, 4, [], None) == 5             # no cost table: all five
    assert copy_budget(0.9, 0, 5, 6, 4, costs, None) == 2          # no rate yet: the two free rows of 6 -> 8
    assert copy_budget(0.9, 0, 5, 6, 4, costs, 0.1) == 5           # sure copies, 0.1 token a ms: worth a block
    assert copy_budget(0.2, 0, 5, 6, 4, costs, 0.1) == 2           # unsure: 0.2^3 + ... < 0.1, only the free
    assert copy_budget(0.9, 2, 5, 8, 4, costs, 10.0) == 0          # a dear block, no free row: none
    assert copy_budget(0.9, 0, 9, 14, 4, costs, 0.01) == 2         # never past the cost table (16 rows)


def test_lookup_index_finds_what_a_scan_finds():
    """PromptLookup indexes the context's n-grams as it grows (a proposal costs the same at any length): on random
    growing token streams, with a fresh sequence now and then, it proposes exactly what scanning the whole context
    for the earliest match of the longest tail proposes."""
    import random

    from specdec_core.drafters import DraftContext
    from specdec_core.drafters.lookup import PromptLookup

    def scan(toks, k, lo, weak):
        for n in range(min(5, len(toks) - 1), lo - 1, -1):
            for start in range(len(toks) - n):
                if toks[start:start + n] == toks[-n:]:
                    return toks[start + n:start + n + (k if weak is None or n >= 3 else min(k, weak))], start
        return [], None

    rng = random.Random(1)
    for _ in range(200):
        lo, weak = rng.choice([1, 2]), rng.choice([None, 3])
        lk, toks = PromptLookup(min_ngram=lo, weak=weak), [rng.randint(0, 6) for _ in range(rng.randint(1, 8))]
        for _ in range(25):
            if rng.random() < 0.05:
                toks = [rng.randint(0, 6) for _ in range(rng.randint(1, 8))]
            p = lk.propose(DraftContext(tokens=list(toks), prompt_len=1, k=4, sp=SamplingParams(), gen=None))
            want, at = scan(toks, 4, lo, weak)
            assert p.tokens.tolist() == want and p.info.get("match_at") == at
            toks += [rng.randint(0, 6) for _ in range(rng.randint(1, 3))]
