"""The long-prompt estimate: a pass's cost fitted as a·n + b·n² from two timed lengths (a linear rate from one
short pass under-counts attention's n²). How well it predicts a real long pass is a timing, so it is measured
by hand (docs/app.md), not asserted here."""
from __future__ import annotations

from specdec_core.bench.prefill_fit import fit


def test_the_fit_goes_through_its_points_and_grows_faster_than_linear():
    f = fit((256, 1024), [0.25, 1.5], [0.040, 0.048])
    assert abs(f.read_s(256) - 0.25) < 1e-9 and abs(f.read_s(1024) - 1.5) < 1e-9
    assert f.read_s(4096) > 4 * 1.5                      # attention: more than linear in n
    assert abs(f.step_s(1024) - 0.048) < 1e-9 and f.step_s(4096) > 0.048
    noisy = fit((256, 1024), [0.5, 1.0], [0.05, 0.04])   # the long pass timed cheap per token: no negative terms
    assert noisy.b == 0.0 and noisy.s1 == 0.0 and noisy.read_s(2048) >= noisy.read_s(1024)
