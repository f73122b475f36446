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
    pts = list(sweep_k(bundled, "lookup", prompts, [1, 4], max_new_tokens=12))
    assert [p["k"] for p in pts] == [1, 4]
    for p in pts:
        assert p["same_tokens_as_baseline"]                     # greedy: identical output
        assert 0.0 <= p["acceptance_rate"] <= 1.0
        assert len(p["per_position_acceptance"]) <= p["k"]
        assert p["mean_acceptance_length"] <= p["k"] + 1
    (t,) = sweep_temperature(bundled, "lookup", prompts, [0.9], max_new_tokens=12)
    assert t["temperature"] == 0.9 and t["tokens"] > 0 and t["baseline_tokens_per_s"] > 0


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
