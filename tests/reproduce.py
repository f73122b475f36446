"""Whether a re-run reproduces a trained drafter's manifest: its held-out acceptance, prompt by prompt, where this
CPU runs the bf16 kernels and the attention the manifest was measured with (reference.kernels, attention); on
another family the target's greedy texts can differ in places, so there the mean is compared, one-sided: the
shipped weights must draft at least about as well as recorded."""
from __future__ import annotations

import statistics

import pytest

from specdec_core.bench.reference import kernels, machine


def same_kernels(acc: dict) -> bool:
    """This CPU's bf16 kernel family, attention and target products are the ones `acc` was measured with (a
    manifest that does not name its CPU's flags is taken at its word on the family; one that names no attention
    was measured before the attention loop existed: ATen's; none that names no products: oneDNN's packed ones)."""
    here = machine()
    # the 4-bit product on AMX is oneDNN's packed product bit for bit (tests/test_q4.py holds it): one family
    fam = lambda p: "packed" if p == "q4-amx" else p   # noqa: E731
    return (("flags" not in acc or kernels(acc["flags"]) == kernels(here["flags"])) and
            acc.get("attention", "aten") == here["attention"] and
            fam(acc.get("products", "packed")) == fam(here["products"]))


def assert_reproduces(acc: dict, rows: list[dict], got: list[float], rel: float = 0.15, tol: float | None = None):
    """got[i]: the mean acceptance length re-measured on rows[i]'s prompt. Per prompt within `rel` (or `tol`,
    absolute) on the manifest's kernels; else the mean at least (1 - rel) of the recorded one."""
    want = [r["mean_acceptance_length"] for r in rows]
    if same_kernels(acc):
        for w, g, r in zip(want, got, rows):
            assert g == pytest.approx(w, rel=None if tol else rel, abs=tol), (r["prompt"], g, w)
    else:
        assert statistics.mean(got) >= (1 - rel) * statistics.mean(want), (acc.get("cpu"), got, want)
