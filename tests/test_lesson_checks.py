"""The computations behind the walkthrough, the output contract and the checklist (bench.contract, bench.passes,
bench.lesson, serving.checklist), on tiny random models and known counts: the two-sample test holds its level and
finds a known difference, the sampled first tokens follow the target's exact law, the near-tie probe reads the
target's own probabilities at a real near tie, paired timings follow the measuring rule, and the verdicts keep
speculation off where acceptance is low.
"""
import time

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_core import SamplingParams, drafters, engine
from specdec_core.bench import contract, lesson, passes
from specdec_core.bench.sweeps import NOISY, ratios
from specdec_core.bench.workloads import WORKLOADS, Workload
from specdec_core.serving import checklist
from tiny import AnyTok, tiny_lm


@pytest.fixture(autouse=True)
def _one(one_thread):
    yield


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(1)


# -- two_sample ----------------------------------------------------------------------------------------------

def test_two_sample_on_known_counts():
    same = contract.two_sample({"a": 60, "b": 30, "c": 10}, {"a": 60, "b": 30, "c": 10}, shuffles=200)
    assert same["tv"] == 0.0 and same["p_value"] == pytest.approx(1.0)
    far = contract.two_sample({"a": 150, "b": 50}, {"a": 50, "b": 150}, shuffles=200)
    assert far["tv"] == pytest.approx(0.5) and far["p_value"] < 1e-6
    assert far["tv"] > far["tv_chance_95"]
    # rare outcomes are pooled so every expected count is at least 5
    rare = contract.two_sample({"a": 50, "b": 40, "x": 5, "y": 5}, {"a": 50, "b": 42, "z": 8})
    assert rare["bins"] == 3 and rare["p_value"] > 0.05          # a, b and "other" (x, y, z)
    thin = contract.two_sample({"a": 50, "b": 46, "x": 2, "y": 2}, {"a": 48, "b": 48, "z": 4})
    assert thin["bins"] == 2                                     # a thin "other" joins b
    assert contract.two_sample({"a": 10}, {"a": 20})["p_value"] is None   # one outcome only: nothing to test
    with pytest.raises(ValueError, match="at least one outcome"):
        contract.two_sample({}, {"a": 1})


def test_two_sample_holds_its_level_and_finds_a_small_shift():
    """Samples of one law: p < 0.05 in about 5% of trials. Samples of two laws 0.1 apart in TV: found nearly
    always at 1000 a side."""
    rng = np.random.default_rng(0)
    law = [0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02]
    low = sum(contract.two_sample(*(dict(enumerate(rng.multinomial(200, law))) for _ in range(2)),
                                  shuffles=50)["p_value"] < 0.05 for _ in range(200))
    assert low <= 25       # binomial(200, 0.05): mean 10, P(> 25) < 1e-4
    moved = [0.3, 0.35, 0.15, 0.1, 0.05, 0.03, 0.02]
    found = sum(contract.two_sample(dict(enumerate(rng.multinomial(1000, law))),
                                    dict(enumerate(rng.multinomial(1000, moved))), shuffles=50)["p_value"] < 0.05
                for _ in range(20))
    assert found >= 18


# -- sampling the first tokens, and the target's exact law ----------------------------------------------------

def test_sampled_first_tokens_follow_the_exact_law(tiny):
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]   # lookup finds "3 1 2 ..." to copy: the rule decides some tokens
    sp = SamplingParams(1.0, seed=7)
    seen = []
    counts, checked, accepted = contract.sample_first(tiny, drafters.make("lookup", tiny), prompt, sp, 400, 1, 3,
                                                      tick=lambda i, c: seen.append((i, sum(c.values()))))
    assert seen == [(i, i + 1) for i in range(400)] and sum(counts.values()) == 400
    assert checked > 0 and 0 <= accepted <= checked
    law = contract.exact(tiny, prompt, [(t,) for t in range(tiny.n_tokens)], sp)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-5)
    keep = [t for t in law if law[t] * 400 >= 5]        # chi-square's rule: expected counts of 5 or more
    obs = [counts.get(t, 0) for t in keep] + [400 - sum(counts.get(t, 0) for t in keep)]
    exp = [law[t] * 400 for t in keep] + [400 * (1 - sum(law[t] for t in keep))]
    if exp[-1] < 5:
        obs, exp = obs[:-2] + [obs[-2] + obs[-1]], exp[:-2] + [exp[-2] + exp[-1]]
    assert chisquare(obs, exp).pvalue > 1e-3
    with pytest.raises(ValueError, match="span"):
        contract.first_tokens(tiny, drafters.make("none", tiny), prompt, sp, 0, 3)


def test_near_tie_reads_the_targets_probabilities_at_a_real_near_tie():
    """Along a greedy text of a near-uniform tiny model, find a position whose top two tokens are within
    NEAR_TIE; near_tie gives exactly their softmax probabilities there."""
    lm = tiny_lm(3, head_std=0.05)
    prompt = [4, 5, 6]
    text = engine.run(lm, drafters.make("none", lm), prompt, max_new_tokens=12, detail=False)[0]
    found = None
    for j in range(len(text)):
        with torch.inference_mode():
            p = torch.softmax(lm.model(torch.tensor([prompt + text[:j]])).logits[0, -1].float(), -1)
        top = torch.topk(p, 2)
        if top.values[0] - top.values[1] < contract.NEAR_TIE:
            found = (j, int(top.indices[0]), int(top.indices[1]), top.values.tolist())
            break
    assert found is not None, "no near tie along the text"
    j, a, b, (pa, pb) = found
    assert a == text[j]                                   # greedy took the top one
    got = contract.near_tie(lm, prompt, text[:j], a, b)
    assert got == pytest.approx((pa, pb), abs=1e-5) and abs(got[0] - got[1]) < contract.NEAR_TIE


def test_summaries_say_what_the_numbers_mean():
    assert contract.greedy_summary(3, 3, [], "ours", "bfloat16").startswith("**3 of 3**")
    assert "bug worth reporting" in contract.greedy_summary(2, 3, [0.01], "ours", "bfloat16")
    assert "near-ties" in contract.greedy_summary(2, 3, [0.01, 0.05], "hf", "bfloat16")
    assert "may be a bug" in contract.greedy_summary(2, 3, [0.5], "hf", "bfloat16")
    row = {"Drafter": "lookup", "Tokens compared": 1, "Drafts checked in the span": 0,
           "Drafts accepted in the span": 0, "Total variation": 0.02, "TV by chance (median)": 0.03,
           "TV by chance (95%)": 0.06, "p-value": 0.7}
    said = contract.sampled_summary(row)
    assert "the first 1 token," in said and "tests nothing" in said and "no evidence" in said
    assert "raise the temperature" in contract.sampled_summary(row | {"p-value": None})
    assert "1-in-20" in contract.sampled_summary(row | {"p-value": 0.01, "Drafts checked in the span": 4})


# -- paired timings ---------------------------------------------------------------------------------------------

def test_paired_follows_the_measuring_rule():
    calls = []

    def nap(side, s):
        return lambda: (calls.append(side), time.sleep(s))
    r = passes.paired(nap("a", 0.004), nap("b", 0.012), reps=4, warm=1)
    # warm-up pair first, then the order flips every repeat
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert r["pairs"] == 4 and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    assert 1.5 < r["ratio"] < 4.5 and r["small_ms"] >= 4 and r["big_ms"] >= 12
    assert r["noisy"] == ((r["ratio_max"] - r["ratio_min"]) / r["ratio"] > NOISY)
    with pytest.raises(ValueError, match="reps"):
        passes.paired(lambda: None, lambda: None, reps=0)


@pytest.mark.parametrize("forward", ["hf", "ours"])
def test_pass_costs_through_the_models_own_forward(forward):
    lm = tiny_lm(0, forward=forward)
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    r = passes.token_cost(lm, ctx, 1, 8, reps=3)
    assert r["pairs"] == 3 and r["small_ms"] > 0 and r["big_ms"] > 0
    rows = passes.batch_cost(lm, (1, 3), (1, 5), context=6, reps=2)
    assert [x["batch"] for x in rows] == [1, 3] and all(x["pairs"] == 2 and x["big_ms"] > 0 for x in rows)
    with pytest.raises(ValueError, match="small < big"):
        passes.token_cost(lm, ctx, 8, 8)
    with pytest.raises(ValueError, match="at least one row"):
        passes.batch_cost(lm, (0,))


@pytest.mark.parametrize("forward", ["hf", "ours"])
def test_a_draft_pass_is_timed_against_the_target_pass_at_the_same_place(forward):
    """Each timed pass scores the same positions every time (its cache rolled back), in its own model's cache."""
    draft, target = tiny_lm(1, forward=forward), tiny_lm(0, forward=forward)
    ctx = [3, 1, 4, 1, 5, 9, 2, 6]
    once = passes.one_pass(draft, ctx, 1)
    a, b = once(), once()
    assert torch.equal(a, b)   # not rolled back, the second call would sit one position later and differ
    assert not torch.equal(a, passes.one_pass(target, ctx, 1)())
    r = passes.draft_cost(draft, target, ctx, reps=3)
    assert r["pairs"] == 3 and r["small_ms"] > 0 and r["big_ms"] > 0 and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    with pytest.raises(ValueError, match="at least one token"):
        passes.draft_cost(draft, target, [])
    with pytest.raises(ValueError, match="k must be"):
        passes.draft_cost(draft, target, ctx, k=0)


# -- the lesson's workload table --------------------------------------------------------------------------------

def test_workload_verdicts_by_acceptance_band():
    code, batch = WORKLOADS["code"], WORKLOADS["batch"]
    assert lesson.band("Low, possibly negative") == lesson.BANDS["Low"]
    with pytest.raises(ValueError, match="no acceptance band"):
        lesson.band("Huge")
    assert lesson.verdict(code, 40, 50)[0] is True
    ok, note = lesson.verdict(code, 2, 100)                 # 2%: its interval is far below 50%
    assert ok is False and "below the band for High" in note and lesson.ASIDE["code"] in note
    assert lesson.verdict(code, 2, 5)[0] is True            # 5 drafts: the interval still reaches the band
    assert lesson.verdict(batch, 0, 0) == (None, lesson.ASIDE["batch"])
    assert lesson.verdict(code, 0, 0)[0] is False


def test_workload_check_measures_each_row_with_its_own_drafter():
    lm = tiny_lm(1, tok=AnyTok())
    rows_of = [Workload("copy", "Copying", "High", "", 0.0, ("abcabcabcabc", "xyzxyzxyz")),
               Workload("hot", "Hot", "Low", "", 1.0, ("hello there",), drafter="suffix"),
               Workload("many", "Batch", "Low", "", 0.0, ("abc",), batch_size=8)]
    built, ticks = [], []
    rows = lesson.check(lm, rows_of, lambda n: built.append(n) or drafters.make(n, lm), tokens=8, k=3,
                        tick=ticks.append)
    assert built == ["lookup", "lookup", "suffix"] and len(ticks) == 3   # the batch row decodes nothing
    a, b, c = rows
    assert (a["drafter"], b["drafter"]) == ("lookup", "suffix")
    assert a["drafted"] > 0 and a["acceptance_lo"] <= a["acceptance"] <= a["acceptance_hi"]
    assert a["agrees"] == lesson.verdict(rows_of[0], round(a["acceptance"] * a["drafted"]), a["drafted"])[0]
    assert c["acceptance"] is None and c["agrees"] is None and "section 6" in c["note"]
    with pytest.raises(ValueError):
        lesson.check(lm, rows_of, lambda n: None, tokens=0)


def test_an_incompatible_draft_is_refused_with_the_reason(tiny):
    assert "vocabulary sizes differ" in lesson.refusal(tiny)


# -- the checklist's verdict -----------------------------------------------------------------------------------

def test_checklist_keeps_speculation_off_where_acceptance_is_low():
    lm = tiny_lm(1, tok=AnyTok())
    res = checklist.run(lm, lambda: drafters.make("lookup", lm), ["abcabcabc", "kjihgfedcb"], k=4, max_new_tokens=24,
                        repeats=2)
    hi, lo = res
    assert hi.spec.acceptance_rate >= checklist.LOW_ACCEPTANCE > lo.spec.acceptance_rate
    assert all(r.first_diff is None and r.timing["repeats"] == 2 for r in res)
    assert lo.decision() == (False, f"acceptance {lo.spec.acceptance_rate:.0%}: hard to draft")
    said = checklist.verdict(res)
    assert "keep it off for prompts like “kjihgfedcb”" in said.lower() and "median of 2 back-to-back pairs" in said
    # the rule on the prompt that drafts well, with paired ratios of known spread
    hi.timing = ratios([2.0, 2.1, 1.9], [1.0, 1.0, 1.0])
    assert hi.decision()[0] is True and "Keep it for prompts like “abcabcabc”" in checklist.verdict(res)
    hi.timing = ratios([0.8, 0.8, 0.8], [1.0, 1.0, 1.0])
    assert hi.decision() == (False, f"acceptance {hi.spec.acceptance_rate:.0%} but 0.80x: the drafts cost more "
                                    "than they save")
    assert "Keep it off for this traffic: “abcabcabc”" in checklist.verdict(res)
    hi.timing = ratios([2.0, 1.0, 3.0], [1.0, 1.0, 1.0])
    assert hi.decision()[0] is None and "noisy: rerun" in checklist.verdict(res)
    table = checklist.table(res)
    assert list(table["speculation"]) == ["rerun", "off"] and "mean acceptance length" in table
    with pytest.raises(ValueError, match="at least one prompt"):
        checklist.run(lm, lambda: None, [], 4, 8)


# -- the Output contract's three checks, as the page runs them ------------------------------------------------------

def test_greedy_check_diffs_each_prompt_plain_and_speculative(tiny):
    prompts = [("a", [1, 2, 3, 1, 2, 3, 1, 2]), ("b", [4, 5, 6, 4, 5])]
    ticks = []
    rows = list(contract.greedy_check(tiny, [("lookup", None)], prompts, 3, 10, 0, lambda n: n.upper(), ticks.append))
    assert ticks == ["a, plain", "a, lookup", "b, plain", "b, lookup"]
    assert [(r["Prompt"], r["Drafter"]) for r in rows] == [("a", "LOOKUP"), ("b", "LOOKUP")]
    for r, (_, prompt) in zip(rows, prompts):
        plain = engine.run(tiny, drafters.make("none", tiny), prompt, sp=SamplingParams(0.0, 0, 1.0, 0),
                           max_new_tokens=10, detail=False)[0]
        assert r["plain"] == plain and r["Tokens plain"] == len(plain)
        # greedy speculation gives plain decoding's tokens: no difference, so no near-tie probe
        assert r["spec"] == plain and r["Identical"] and r["First difference at token"] is None
        assert r["p(plain token)"] is None and r["p(spec token)"] is None


def test_forward_check_probes_ours_where_the_reference_drifted():
    ref, ours = tiny_lm(1), tiny_lm(1, forward="ours")
    prompts = [("a", [1, 2, 3, 1, 2, 3, 1, 2])]
    got = list(contract.forward_check(ref, ours, prompts, 3, 8))
    assert [(p, d.forward) for p, d, _ in got] == [("a", "hf"), ("a", "ours")]   # the reference first
    (_, d_ref, probe_ref), (_, d_ours, probe_ours) = got
    assert d_ours.identical                      # ours is batch-invariant: the contract holds bit for bit
    assert probe_ref == probe_ours == d_ref.position


def test_sampled_check_counts_each_side_and_compares_them(tiny):
    prompt, runs, shown = [1, 2, 3, 1, 2, 3, 1, 2], 40, 5
    sp = SamplingParams(1.0, seed=3)
    ticks, out = [], {}
    rows = list(contract.sampled_check(tiny, [("lookup", None)], prompt, sp, runs, 2, 3, shown,
                                       tick=lambda name, i, counts: ticks.append((name, i, sum(counts[name].values()))),
                                       out=out))
    assert ticks == [(n, i, i + 1) for n in ("none", "lookup") for i in range(runs)]
    assert set(out["counts"]) == {"none", "lookup"} and all(sum(c.values()) == runs for c in out["counts"].values())
    assert all(len(t) == 2 for c in out["counts"].values() for t in c)
    # each side on its own seeds: plain decoding's side is sample_first from sp.seed, the drafter's from seed + runs
    plain, _, _ = contract.sample_first(tiny, drafters.make("none", tiny), prompt, sp, runs, 2, 0)
    assert out["counts"]["none"] == plain
    assert len(out["ref"]) == min(shown, len(set(out["counts"]["none"]) | set(out["counts"]["lookup"])))
    (r,) = rows
    cmp = contract.two_sample(out["counts"]["none"], out["counts"]["lookup"], sp.seed)
    assert r["Drafter"] == "lookup" and r["Runs per side"] == runs and r["Total variation"] == cmp["tv"]
    assert r["p-value"] == cmp["p_value"] and r["Drafts checked in the span"] >= r["Drafts accepted in the span"]
