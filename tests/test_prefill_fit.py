"""The long-prompt estimate: a pass's cost fitted as a·n + b·n² from two timed lengths predicts a longer pass
roughly (a linear rate from one short pass under-counts attention's n²), and the note says what it covers."""
from __future__ import annotations

import time

import torch

from specdec_core.bench.prefill_fit import fit


def test_the_fit_goes_through_its_points_and_grows_faster_than_linear():
    f = fit((256, 1024), [0.25, 1.5], [0.040, 0.048])
    assert abs(f.read_s(256) - 0.25) < 1e-9 and abs(f.read_s(1024) - 1.5) < 1e-9
    assert f.read_s(4096) > 4 * 1.5                      # attention: more than linear in n
    assert abs(f.step_s(1024) - 0.048) < 1e-9 and f.step_s(4096) > 0.048
    noisy = fit((256, 1024), [0.5, 1.0], [0.05, 0.04])   # the long pass timed cheap per token: no negative terms
    assert noisy.b == 0.0 and noisy.s1 == 0.0 and noisy.read_s(2048) >= noisy.read_s(1024)


def test_the_fit_predicts_a_real_longer_pass_of_the_bundled_model_roughly(bundled):
    """The app's two timed lengths, and a pass twice the longer one predicted within a factor of two (each timing
    the faster of two, since other work on the machine only ever adds time)."""
    def once(n: int) -> tuple[float, float]:
        cache = bundled.new_cache()
        t0 = time.perf_counter()
        bundled.forward(torch.zeros(n, dtype=torch.long), cache, last_only=True)
        t1 = time.perf_counter()
        bundled.forward(torch.zeros(1, dtype=torch.long), cache, last_only=True)
        return t1 - t0, time.perf_counter() - t1

    def timed(n: int) -> tuple[float, float]:
        a, b = once(n), once(n)
        return min(a[0], b[0]), min(a[1], b[1])
    once(32)   # the first call of a shape pays one-off setup
    (p1, s1), (p2, s2) = timed(256), timed(1024)
    f = fit((256, 1024), [p1, p2], [s1, s2])
    real, _ = timed(2048)
    assert 0.5 < f.read_s(2048) / real < 2.0, (f, real)
