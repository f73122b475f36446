"""The weight formats and the regime rule (bench/regime.py), the headroom measurement (bench/headroom.py), the
sidebar's line and switch and the Headroom page.

The rule is a pure function of measured costs; every format this machine runs keeps the output contract within
itself (greedy lookup gives plain decoding's tokens); the sidebar says which format runs, with the measured ratio;
the Headroom page measures each format on tiny settings and its table agrees with its own runs.
"""
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from specdec_core import drafters, engine
from specdec_core.bench import headroom, regime
from specdec_core.bench.regime import Cost, FormatError, choose, reason
from specdec_core.backend import reads_q4
from specdec_core.models import pick_dtype

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
TIMEOUT = 600   # every format loaded cold, then measured, on a busy 2-core machine
REPEAT = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."


def c(one: float, ratio: float) -> Cost:
    return Cost(one, one * ratio, ratio)


# -- the rule, on given costs ------------------------------------------------------------------------------------

def test_rule_keeps_the_format_whose_verify_pass_stays_cheap_even_when_another_steps_faster():
    costs = {"fp32": c(45.0, 1.17), "bf16": c(30.0, 1.62)}      # bf16 steps faster but spent the headroom
    assert choose(costs) == "fp32"
    assert choose(costs, limit=1.7) == "bf16"                     # both under the limit: the quicker step


def test_rule_among_cheap_passes_takes_the_quickest_one_token_step():
    costs = {"fp32": c(45.0, 1.17), "bf16": c(28.0, 1.30), "q4": c(20.0, 1.80)}
    assert choose(costs) == "bf16"


def test_rule_when_no_format_is_cheap_takes_the_lowest_ratio():
    costs = {"fp32": c(45.0, 1.50), "bf16": c(28.0, 1.45), "q4": c(20.0, 1.80)}
    assert choose(costs) == "bf16"
    assert "no format stays under 1.35×" in reason(costs, "bf16")


def test_rule_on_noisy_timings_keeps_the_default_format_and_says_why():
    quiet = {"fp32": c(45.0, 1.17), "bf16": c(30.0, 1.62)}
    busy = {"fp32": Cost(45.0, 70.0, 1.56, noisy=True), "bf16": c(30.0, 1.30)}   # a burst landed on fp32's pairs
    assert choose(busy) == "bf16"                              # read at face value the noise picks the other
    assert choose(busy, default="fp32") == "fp32" and choose(quiet, default="bf16") == "fp32"
    line = reason(busy, "fp32", default="fp32")
    assert "so this machine's default format runs" in line and "so the lowest" not in line
    assert "the choice may differ on a quiet one" in reason(busy, "bf16")


def test_decide_measures_a_noisy_format_once_more():
    seen = []

    def measure(lm):
        seen.append(lm)
        return Cost(45.0, 70.0, 1.56, noisy=True) if seen.count(lm) == 1 and lm == "fp32" else c(45.0, 1.17)
    fmt, costs = regime.decide(lambda f: f, ["fp32"], measure_fn=measure, default="fp32")
    assert seen == ["fp32", "fp32"] and not costs["fp32"].noisy and fmt == "fp32"


def test_rule_refuses_nothing_measured_and_the_line_gives_every_ratio():
    with pytest.raises(FormatError, match="no weight format"):
        choose({})
    line = reason({"fp32": c(45.0, 1.17), "bf16": c(30.0, 1.62)}, "fp32")
    assert line == "dense fp32 — a pass on 8 tokens costs 1.17× one token's here (dense bf16: 1.62×)"


def test_decide_measures_each_loaded_format_and_leaves_out_one_that_fails():
    said = []

    def load(f):
        said.append(f)
        if f == "q4":
            raise FormatError("not here")
        return f

    fmt, costs = regime.decide(load, ["fp32", "bf16", "q4"],
                               measure_fn=lambda lm: {"fp32": c(45.0, 1.2), "bf16": c(40.0, 1.3)}[lm])
    assert said == ["fp32", "bf16", "q4"] and set(costs) == {"fp32", "bf16"} and fmt == "bf16"


def test_unknown_or_unrunnable_formats_are_refused_in_words():
    with pytest.raises(FormatError, match="unknown weight format 'int3'"):
        regime.check("int3")
    here = regime.formats()
    assert here[:2] == ["fp32", "bf16"]
    if "q4" not in here:   # this CPU has no AVX-512 BF16 (or SPECDEC_Q4=0): said, with what it runs instead
        with pytest.raises(FormatError, match="cannot run the 4-bit blocks .*it runs dense fp32, dense bf16"):
            regime.check("q4")
    d = regime.default_format()   # the format models.load picks by itself is one of them, in its dtype
    assert d in here and regime.DTYPES[d] == pick_dtype(torch.device("cpu"))


def test_an_operators_dtype_pins_the_format_instead_of_the_measurement(monkeypatch):
    monkeypatch.delenv("SPECDEC_DTYPE", raising=False)
    assert regime.pinned() is None
    monkeypatch.setenv("SPECDEC_DTYPE", "auto")
    assert regime.pinned() is None
    monkeypatch.setenv("SPECDEC_DTYPE", "fp32")
    assert regime.pinned() == "fp32"


# -- each format, the real model ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", regime.formats())
def test_each_format_keeps_the_output_contract_and_measures_its_passes(fmt, bundled_fp32, one_thread):
    lm = bundled_fp32 if fmt == "fp32" else regime.load_format(fmt)
    assert lm.dtype == regime.DTYPES[fmt] and reads_q4(lm.fwd) == (fmt == "q4")
    ids = lm.encode(REPEAT).tolist()
    plain, _, _ = engine.run(lm, drafters.make(drafters.PLAIN, lm), ids, max_new_tokens=16, detail=False)
    spec, _, m = engine.run(lm, drafters.make("lookup", lm), ids, k=4, max_new_tokens=16, detail=False)
    assert spec == plain and len(plain) >= 8 and m.accepted > 0   # exactly, drafts kept (EOS may end it early)
    cost = regime.measure(lm, reps=1)
    assert cost.one_ms > 0 and cost.big_ms > 0 and cost.ratio == pytest.approx(cost.big_ms / cost.one_ms, rel=1e-6)


# -- the headroom summary, on given rows -------------------------------------------------------------------------

def _rows():
    out = []
    for f, (one, ratio, plain, spec) in {"fp32": (40.0, 1.2, 100.0, 220.0), "q4": (25.0, 1.8, 144.0, 237.0)}.items():
        out.append({"kind": "pass", "format": f, "one_ms": one, "big_ms": one * ratio, "ratio": ratio,
                    "noisy": False})
        for w, k in (("code", 1.0), ("extraction", 1.1)):
            out.append({"kind": "workload", "format": f, "workload": w, "drafter": "eagle",
                        "baseline_tokens_per_s": plain * k, "tokens_per_s": spec * k,
                        "speedup": spec / plain, "noisy": False, "identical_outputs": 1, "prompts": 1})
    return out


def test_summary_and_the_four_claims_read_from_the_figures():
    sm = {s["format"]: s for s in headroom.summary(_rows())}
    assert sm["q4"]["plain_tokens_per_s"] == pytest.approx(144.0 * 1.05)
    assert sm["q4"]["speedup"] == pytest.approx(237.0 / 144.0) and sm["fp32"]["same"] == 2
    claims = headroom.shows(sm["q4"], sm["fp32"])
    assert [h for _, h, _ in claims] == [True, True, True, True]
    slow = dict(sm["q4"], plain_tokens_per_s=90.0, spec_tokens_per_s=150.0)   # lighter but slower: said so
    assert [h for _, h, _ in headroom.shows(slow, sm["fp32"])] == [True, False, True, False]


# -- the app -----------------------------------------------------------------------------------------------------

def _captions(at: AppTest) -> str:
    return "\n".join(x.value for x in at.sidebar.caption)


def test_sidebar_says_which_weights_run_and_why_and_the_link_carries_a_switch(one_thread):
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, at.exception
    at.switch_page("../pages/headroom.py").run()   # the page loads the model: the line is filled in that run
    assert not at.exception, at.exception
    line = next(x for x in _captions(at).splitlines() if x.startswith("Weights: "))
    chosen, costs = __import__("app.runs", fromlist=["measured"]).measured()
    assert line == "Weights: " + reason(costs, chosen)                  # the measured ratios, every format's
    assert at.selectbox(key="weights").value == "auto" and "weights" not in at.query_params
    other = next(f for f in costs if f != chosen)
    at.selectbox(key="weights").set_value(other).run()
    assert not at.exception, at.exception
    assert at.query_params["weights"] == other
    assert f"Weights: {reason(costs, other)}; chosen in the sidebar" in _captions(at)


def test_a_link_naming_weights_this_machine_cannot_run_is_ignored_in_words():
    from app.classroom import from_query
    vals, errors = from_query({"weights": "int3", "k": "3"})
    assert "weights" not in vals and errors == ["weights='int3' is not one of auto, fp32, bf16, q4"]
    assert from_query({"weights": "bf16"})[0]["weights"] == "bf16"


def test_headroom_page_measures_each_format_on_tiny_settings(one_thread, monkeypatch):
    from specdec_core.bench import sweeps
    monkeypatch.setattr(sweeps, "REPEATS", 2)
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("../pages/headroom.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Headroom: weight formats" and not at.get("plotly_chart")
    here = at.multiselect(key="hr_formats").value
    assert here == regime.formats()
    at.multiselect(key="hr_workloads").set_value(["extraction"]).run()
    at.number_input(key="hr_max_new").set_value(4).run()
    at.button(key="hr_go").click().run()
    assert not at.exception, at.exception
    assert at.get("plotly_chart")
    df = at.dataframe[0].value
    assert list(df["Weights"]) == [regime.FORMATS[f] for f in here]
    assert list(df["Same tokens as plain"]) == ["1 of 1"] * len(here)   # greedy: each format's own plain tokens
    assert (df["Pass ratio"] > 0).all() and (df["Plain tok/s"] > 0).all()
    assert "against" in "\n".join(m.value for m in at.markdown)        # the claims, each with its figures
