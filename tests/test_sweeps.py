"""Leviathan et al.'s speedup formula on known values, and the sweep points' bookkeeping on the real model."""
import math

import pytest

from specdec_core import SamplingParams
from specdec_core.sweeps import expected_speedup, expected_tokens_per_step, sweep_k, sweep_temperature


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
