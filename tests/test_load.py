"""The load test (tests/load.py) at a smaller size: six sessions press Generate at once on the Step by step
page; every one completes, each gets exactly the tokens of its own single-session decode, the model is loaded
at most once, and the queue is empty afterwards. Slow (a few minutes on 2 cores): `pytest -m slow`."""
import pytest

import load


@pytest.mark.slow
def test_six_sessions_at_once_each_get_their_own_correct_result():
    r = load.main(sessions=6)
    assert r["completed"] == 6 and r["failed"] == 0, r["errors"]
    assert r["correct"] == 6 and r["wrong"] == []
    assert r["model_loads"] <= 1          # 0 when an earlier test of this process loaded it
    assert r["gate_free_after"]
    assert 0 <= r["wait_p50_s"] <= r["wait_p95_s"] <= r["total_p95_s"]
