"""Suffix decoding (Oliaro et al. 2024): the index finds the longest earlier suffix, the tree holds the most
frequent continuations (prefix-closed, siblings by count, sized by the match), a second run of the same request
drafts from the first, and the output is the target's token for token greedy (sampled: the chi-square case in
test_e2e_sampling.py)."""
from __future__ import annotations

from specdec_core import SamplingParams, engine
from specdec_core.drafters import make
from specdec_core.drafters.suffix import Suffix, SuffixIndex, grow
from specdec_core.tree import compile_tree
from tests.tiny import tiny_lm


def test_grow_keeps_the_likeliest_prefix_closed_nodes():
    conts = [[5, 6, 7], [5, 6, 8], [5, 9], [4], [5, 6, 7]]
    paths, toks = grow(conts, budget=4, min_prob=0.0)
    compile_tree(paths)                                     # prefix-closed, or this raises
    assert [toks[p] for p in paths] == [5, 6, 7, 4]          # 4/5, 3/5, 2/5, then 1/5 (ties: the first seen)
    assert paths[:3] == [(0,), (0, 0), (0, 0, 0)] and paths[3] == (1,)   # 5 outranks 4 among the roots
    few, _ = grow(conts, budget=10, min_prob=0.3)             # nothing seen in under 30% of occurrences
    assert len(few) == 3


def test_the_index_finds_the_longest_earlier_suffix_and_forgets_old_sequences():
    ix = SuffixIndex(max_match=4, max_tokens=12)
    a = ix.open()
    ix.extend(a, [1, 2, 3, 4, 5, 1, 2, 3])
    n, conts = ix.continuations([9, 1, 2, 3], skip=(a, 8), depth=3)
    assert n == 3 and conts == [[4, 5, 1]]                    # "1 2 3" before, not the text's own end
    b = ix.open()
    ix.extend(b, [7, 7, 7, 7, 7])                             # 13 tokens > 12: the oldest sequence goes
    assert a not in ix.docs and ix.size == 5
    assert all(d == b for v in ix.ends.values() for d, _ in v)


def test_a_second_run_drafts_from_the_first_tiny(one_thread):
    tgt, ix = tiny_lm(1), SuffixIndex()
    prompt = [1, 2, 3, 4, 5, 6]
    plain, _, _ = engine.run(tgt, make("none", tgt), prompt, max_new_tokens=24, stop_at_eos=False)
    first, _, m1 = engine.run(tgt, make("suffix", tgt, index=ix), prompt, max_new_tokens=24, stop_at_eos=False)
    second, recs, m2 = engine.run(tgt, make("suffix", tgt, index=ix), prompt, max_new_tokens=24,
                                  stop_at_eos=False)
    assert first == second == plain
    assert m2.mean_acceptance_length > m1.mean_acceptance_length and m2.acceptance_rate == 1.0
    assert recs[0].info["match"] >= 1 and recs[0].info["nodes"] >= 1


def test_a_drafter_without_a_session_index_starts_each_run_afresh(one_thread):
    """bench and profile time a prompt's repeats with one drafter object: without a session index, a repeat must
    not find the earlier run's answer (it would draft all of it and the timing would be of a memorised reply)."""
    tgt = tiny_lm(1)
    prompt = [1, 2, 3, 4, 5, 6]
    dr = make("suffix", tgt)
    runs = [engine.run(tgt, dr, prompt, max_new_tokens=24, stop_at_eos=False) for _ in range(2)]
    (a, ra, ma), (b, rb, mb) = runs
    assert a == b and mb.steps == ma.steps and [r.drafted for r in ra] == [r.drafted for r in rb]
    ix = SuffixIndex()                                        # with one, the second run drafts from the first
    shared = make("suffix", tgt, index=ix)
    engine.run(tgt, shared, prompt, max_new_tokens=24, stop_at_eos=False)
    assert engine.run(tgt, shared, prompt, max_new_tokens=24, stop_at_eos=False)[2].steps < ma.steps


def test_a_run_limited_to_earlier_sequences_drafts_as_the_first_run_did(one_thread):
    """The race times a run again from the session's index, which by then holds that run's own text: with `before`
    the repeat drafts from what the first run saw (plus its own text), step for step."""
    tgt, ix = tiny_lm(1), SuffixIndex()
    prompt = [1, 2, 3, 4, 5, 6]
    engine.run(tgt, make("suffix", tgt, index=ix), [6, 5, 4, 3, 2, 1], max_new_tokens=12, stop_at_eos=False)
    live_doc = ix.next_id
    a, ra, ma = engine.run(tgt, make("suffix", tgt, index=ix), prompt, max_new_tokens=24, stop_at_eos=False)
    again = make("suffix", tgt, index=ix, before=live_doc)
    for _ in range(2):
        b, rb, mb = engine.run(tgt, again, prompt, max_new_tokens=24, stop_at_eos=False)
        assert b == a and mb.steps == ma.steps and [r.drafted for r in rb] == [r.drafted for r in ra]
    assert engine.run(tgt, make("suffix", tgt, index=ix), prompt, max_new_tokens=24,
                      stop_at_eos=False)[2].steps < ma.steps          # without it: the earlier answers


def test_rerun_on_the_bundled_model_is_faster_per_step_and_identical(bundled):
    ids = bundled.encode("List three colours, one per line.")
    plain, _, _ = engine.run(bundled, make("none", bundled), ids, max_new_tokens=24)
    ix = SuffixIndex()
    a, _, m1 = engine.run(bundled, make("suffix", bundled, index=ix), ids, max_new_tokens=24)
    b, _, m2 = engine.run(bundled, make("suffix", bundled, index=ix), ids, max_new_tokens=24)
    assert a == b == plain
    assert m2.steps < m1.steps and m2.mean_acceptance_length >= 3
