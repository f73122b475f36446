"""Leviathan et al.'s speedup formula on known values, and the sweep points' bookkeeping on the real model."""
import math

import pytest

from specdec_core.bench.sweeps import sweep_k, sweep_temperature
from specdec_core.bench.theory import expected_speedup, expected_tokens_per_step


def test_expected_tokens_per_step_known_values():
    # alpha = 0.5, k = 2: 1 + 0.5 + 0.25
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens_per_step(0.0, 5) == pytest.approx(1.0)
    assert expected_tokens_per_step(1.0, 4) == 5
    # continuity at alpha -> 1
    assert expected_tokens_per_step(1 - 1e-9, 4) == pytest.approx(5, rel=1e-6)


def test_expected_speedup_known_values():
    # Leviathan et al. worked example shape: alpha 0.8, k 4, c 0.05 -> (1 - 0.8^5) / (0.2 * 1.2)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    assert expected_speedup(0.8, 0, 0.3) == pytest.approx(1.0)   # k = 0 is plain decoding
    assert expected_speedup(1.0, 3, 0.0) == 4
    # a draft that is never accepted only costs
    assert expected_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    # optimum k exists for alpha < 1 and c > 0
    vals = [expected_speedup(0.7, k, 0.1) for k in range(1, 20)]
    best = max(range(len(vals)), key=vals.__getitem__)
    assert 0 < best < len(vals) - 1 and not math.isnan(vals[best])
    with pytest.raises(ValueError):
        expected_speedup(1.5, 2, 0.1)


def test_sweeps_on_bundled(bundled):
    prompts = [bundled.encode("Repeat exactly: red green blue red green blue.")]
    pts = list(sweep_k(bundled, "lookup", prompts, [1, 4], max_new_tokens=12, repeats=2))
    assert [p["k"] for p in pts] == [1, 4]
    for p in pts:
        assert p["same_tokens_as_baseline"]                     # greedy: identical output
        assert 0.0 <= p["acceptance_lo"] <= p["acceptance_rate"] <= p["acceptance_hi"] <= 1.0
        assert len(p["per_position_acceptance"]) <= p["k"]
        assert p["mean_acceptance_length"] <= p["k"] + 1
        assert p["repeats"] == 2 and p["speedup_min"] <= p["speedup"] <= p["speedup_max"]
        assert p["prompts"] == 1                                # greedy repeats are the same tokens: counted once
    (t,) = sweep_temperature(bundled, "lookup", prompts, [0.9], max_new_tokens=12, repeats=2)
    assert t["temperature"] == 0.9 and t["tokens"] > 0 and t["baseline_tokens_per_s"] > 0
    assert t["prompts"] == 2 and t["tokens"] == 24              # sampled repeats (seed, seed + 1) both count


def test_the_measuring_rule_pairs_runs_and_flags_noise():
    """A busy machine slows both sides of a pair: the paired ratio holds while raw tokens/s swing 2x (the
    temperature page once showed 2.6x then 6.5x from such a swing); a spread of ratios marks the point noisy."""
    from specdec_core.bench.sweeps import NOISY, ratios
    r = ratios([28.0, 15.4, 28.2], [14.0, 7.7, 14.1])           # baseline 14 -> 7.7 tok/s between pairs
    assert r["speedup"] == pytest.approx(2.0) and not r["noisy"] and r["repeats"] == 3
    assert r["baseline_spread"] > 0.4                            # the machine was busy, and it says so
    assert r["speedup"] == r["tokens_per_s"] / r["baseline_tokens_per_s"]   # the quoted pair's own figures
    noisy = ratios([20.0, 40.0, 30.0], [10.0, 10.0, 10.0])
    assert noisy["speedup"] == pytest.approx(3.0) and (noisy["speedup_min"], noisy["speedup_max"]) == (2.0, 4.0)
    assert noisy["speedup_spread"] == pytest.approx(2 / 3) and 2 / 3 > NOISY and noisy["noisy"]
    assert noisy["median_pair"] == 2                             # the pair quoted is the third measured


def test_wilson_interval_known_values():
    from specdec_core.bench.sweeps import wilson
    lo, hi = wilson(45, 100)                                     # textbook: 0.3561 .. 0.5475
    assert (lo, hi) == (pytest.approx(0.3561, abs=1e-4), pytest.approx(0.5475, abs=1e-4))
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)
    a, b = wilson(18, 100), wilson(180, 1000)                    # more drafted tokens, a narrower interval
    assert b[1] - b[0] < 0.4 * (a[1] - a[0])


def test_pairs_run_back_to_back_in_alternating_order(one_thread):
    from specdec_core.bench.sweeps import side_by_side
    from specdec_core.sampling import SamplingParams
    from tests.tiny import tiny_lm
    tgt, seen = tiny_lm(1, layers=1), []
    pair = side_by_side(tgt, [[1, 2, 3, 1, 2], [4, 5, 4, 5]], SamplingParams(temperature=1.0, seed=7), 2, 6,
                        [("lookup", None)], seen.append, repeats=3)
    assert seen == ["prompt 1, plain, repeat 1", "prompt 1, lookup, repeat 1",
                    "prompt 2, plain, repeat 1", "prompt 2, lookup, repeat 1",
                    "prompt 1, lookup, repeat 2", "prompt 1, plain, repeat 2",
                    "prompt 2, lookup, repeat 2", "prompt 2, plain, repeat 2",
                    "prompt 1, plain, repeat 3", "prompt 1, lookup, repeat 3",
                    "prompt 2, plain, repeat 3", "prompt 2, lookup, repeat 3"]
    assert pair.distinct and [len(x) for x in pair.base] == [2, 2, 2]
    assert pair.base[0][0][0] != pair.base[1][0][0] or pair.base[0][1][0] != pair.base[1][1][0]  # seed + r


def test_alpha_counts_only_the_guesses_the_target_judged():
    from types import SimpleNamespace as R
    from specdec_core.metrics import tested
    from specdec_core.bench.theory import theory
    recs = [R(k=4, n_accepted=2), R(k=4, n_accepted=4), R(k=0, n_accepted=0), R(k=3, n_accepted=0)]
    # 2 kept + 1 rejected, 4 kept, nothing drafted, 1 rejected (the two guesses after it were never judged)
    assert tested(recs) == 3 + 4 + 0 + 1
    rows = [{"drafter": "d", "drafted": 11, "accepted": 6, "tested": 8, "draft_ms_per_token": 2.0,
             "target_forward_ms": 20.0}]
    th = theory(rows)["d"]
    assert th["alpha"] == pytest.approx(6 / 8) and th["c"] == pytest.approx(0.1)
    # with i.i.d. guesses kept with probability a, the judged-guess estimate recovers a at every k
    import random
    rng, a = random.Random(0), 0.6
    for k in (1, 4, 8):
        steps = []
        for _ in range(20000):
            n = 0
            while n < k and rng.random() < a:
                n += 1
            steps.append(R(k=k, n_accepted=n))
        kept = sum(s.n_accepted for s in steps)
        assert kept / tested(steps) == pytest.approx(a, abs=0.01)
        if k > 1:  # while the acceptance rate falls with k
            assert kept / (k * len(steps)) < a - 0.05
