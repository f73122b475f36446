"""The acceptance dashboard (bench/dashboard.py and its page): on the real bundled model the scene's template change
lowers the scene's drafter's acceptance while speculative output stays token-identical to plain decoding in both
phases; the sentence that reads the dashboard says what the figures support and nothing more; the page runs under
AppTest with a tiny scene and shows its charts, the greedy diff and the sentence."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specdec_core.bench import dashboard as dash
from specdec_core.engine import run
from specdec_core.drafters import make

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
TINY = dash.Scene(windows=1, per_window=2, tokens=16, repeats=1)


def test_render_applies_each_template_through_the_chat_template(bundled):
    before = dash.render(bundled, dash.BEFORE, "Repeat: hello")
    after = dash.render(bundled, dash.AFTER, "Repeat: hello")
    assert before == bundled.encode("Repeat: hello").tolist()   # as shipped: the chat template's own prompt
    assert after == bundled.encode("Repeat: hello\n\nAnswer in French.").tolist()
    system = dash.render(bundled, dash.Template("s", system="Be brief."), "Repeat: hello")
    assert "Be brief." in bundled.tokenizer.decode(system) and system != before
    with pytest.raises(ValueError, match="empty"):
        dash.render(bundled, dash.AFTER, "  ")


def test_template_change_lowers_acceptance_and_both_phases_stay_exact(bundled, one_thread):
    rows = list(dash.serve(bundled, TINY))
    assert [(r["window"], r["phase"]) for r in rows] == [(1, "before"), (2, "after")]
    before, after = rows
    assert after["acceptance_rate"] < before["acceptance_rate"] - 0.2, (before["acceptance_rate"],
                                                                        after["acceptance_rate"])
    assert after["mean_acceptance_length"] < before["mean_acceptance_length"]
    for r in rows:   # every speculative token equals plain decoding's, in both phases
        assert r["diff_tokens"] == 0 and r["compared"] > 0 and r["identical_outputs"] == r["prompts"] == 2
    # the diff compares real outputs: each request's tokens as a plain decode of its prompt gives them
    ids = dash.render(bundled, dash.AFTER, dash.REQUESTS[0])
    plain, _, _ = run(bundled, make("none", bundled), ids, max_new_tokens=TINY.tokens, detail=False)
    spec, _, _ = run(bundled, make(dash.DRAFTER, bundled), ids, k=TINY.k, max_new_tokens=TINY.tokens, detail=False)
    assert spec == plain and dash.diff_tokens(spec, plain) == 0


def test_bad_scene_sizes_are_refused_before_any_work(bundled):
    with pytest.raises(ValueError, match="windows must be at least 1"):
        next(dash.serve(bundled, dash.Scene(windows=0)))
    with pytest.raises(ValueError, match="tokens must be at least 2"):
        next(dash.serve(bundled, dash.Scene(tokens=1)))
    with pytest.raises(ValueError, match="no requests"):
        next(dash.serve(bundled, TINY, requests=()))


def test_diff_tokens_counts_each_differing_position_and_a_length_difference():
    assert dash.diff_tokens([1, 2, 3], [1, 2, 3]) == 0
    assert dash.diff_tokens([1, 2, 3], [1, 9, 3]) == 1
    assert dash.diff_tokens([1, 2, 3], [1, 2]) == 1
    assert dash.diff_tokens([], [4, 5]) == 2


def row(window, phase, accepted, drafted, speedup, tpot=40.0, diff=0):
    return {"window": window, "phase": phase, "template": phase, "accepted": accepted, "drafted": drafted,
            "tokens": 32, "steps": 16, "speedup": speedup, "tpot_ms": tpot / speedup, "baseline_tpot_ms": tpot,
            "ttft_ms": 90.0, "baseline_ttft_ms": 90.0, "diff_tokens": diff, "compared": 64}


def test_the_reading_says_what_the_figures_support():
    lesson = dash.reading([row(1, "before", 80, 100, 1.6), row(2, "after", 20, 100, 0.9)])
    assert "1.60× to 0.90×" in lesson and "80% to 20%" in lesson and "not the infrastructure slower" in lesson
    slower = dash.reading([row(1, "before", 80, 100, 1.6), row(2, "after", 20, 100, 0.9, tpot=70.0)])
    assert "TPOT swung too (40 → 70 ms" in slower and "not the infrastructure" not in slower
    assert "the traffic became less predictable" in slower
    machine = dash.reading([row(1, "before", 50, 100, 1.6), row(2, "after", 49, 100, 1.0)])
    assert "does not explain this drop" in machine
    held = dash.reading([row(1, "before", 80, 100, 1.3), row(2, "after", 20, 100, 1.28)])
    assert "not a clear fall" in held
    same = dash.reading([row(1, "before", 50, 100, 1.3), row(2, "after", 50, 100, 1.3)])
    assert "neither moved" in same
    broken = dash.reading([row(1, "before", 80, 100, 1.6), row(2, "after", 20, 100, 0.9, diff=3)])
    assert "differed from plain decoding in 3 tokens" in broken and "1.60" not in broken
    assert "both sides" in dash.reading([row(1, "before", 80, 100, 1.6)])


def test_page_serves_a_tiny_scene_and_shows_charts_diff_and_reading(one_thread):
    at = AppTest.from_file(MAIN, default_timeout=300)
    at.run()
    at.switch_page("../pages/dashboard.py").run()
    assert not at.exception, at.exception
    assert not at.get("plotly_chart")   # nothing measured until asked
    for key, v in (("dash_windows", 1), ("dash_per_window", 1), ("dash_tokens", 8), ("dash_repeats", 1)):
        at.number_input(key=key).set_value(v)
    at.button(key="dash_go").click().run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 2
    assert any(s.value.startswith("Greedy diff: 0 of ") for s in at.success)
    reading = at.info[0].value
    assert reading.startswith("At the template change") and "acceptance from" in reading
    rows = at.session_state["measure_dashboard"].rows
    assert [r["phase"] for r in rows] == ["before", "after"] and all(r["diff_tokens"] == 0 for r in rows)
