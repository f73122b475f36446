"""Results said for the settings that made them: a result whose settings changed is marked, and an explanation
(a difference in greedy tokens, a slower first token) is given only where there is something to explain."""
from __future__ import annotations

import dataclasses

from app import costs, runs
from specdec_core.metrics import RunMetrics
from specdec_core.serving.checklist import PromptResult, difference_note


def metrics(ttft: float, tpot: float) -> RunMetrics:
    return RunMetrics(tokens=10, total_s=ttft + 9 * tpot, ttft_s=ttft, tpot_s=tpot, tokens_per_s=1.0, steps=5,
                      drafted=8, accepted=6, acceptance_rate=0.75, mean_acceptance_length=2.0,
                      per_position_acceptance=[], accepted_histogram={}, target_forwards=5, draft_forwards=0)


def test_a_result_made_with_other_settings_is_marked_and_the_same_settings_are_not():
    s = runs.Settings(drafter="lookup", prompt="Copy this.")
    assert runs.stale(s, dataclasses.replace(s)) == ""
    moved = runs.stale(s, dataclasses.replace(s, drafter="eagle"), "The race below")
    assert moved.startswith("The race below were made with other settings") and "lookup" in moved and "eagle" in moved
    assert "another prompt" in runs.stale(s, dataclasses.replace(s, prompt="Something else."))


def test_the_checklist_explains_a_difference_only_when_there_is_one():
    m = metrics(0.05, 0.02)
    same = [PromptResult(f"p{i}", [1, 2, 3], [1, 2, 3], m, m) for i in range(3)]
    assert difference_note(same) == ""                      # 3 of 3 identical: nothing to explain
    one = same[:2] + [PromptResult("p2", [1, 2, 3], [1, 2, 4], m, m)]
    assert difference_note(one).startswith("1 of 3 prompts gave different greedy tokens")


def test_a_slower_first_token_is_explained_and_a_faster_one_is_not():
    plain, spec = metrics(0.0506, 0.045), metrics(0.0798, 0.020)
    why = costs.ttft_note(spec, plain, "eagle")
    assert "79.8 against 50.6 ms" in why and "drafts and runs a verify pass" in why and "hidden states" in why
    assert "lower TPOT" in why
    assert "draft model reads the prompt" in costs.ttft_note(spec, plain, "draft")
    assert costs.ttft_note(plain, spec, "lookup") == ""


def test_tables_show_acceptance_as_a_percent_and_no_none():
    import pandas as pd

    from app import measure
    df = pd.DataFrame({"Workload": ["code", "batch"], "Acceptance rate": [0.918, None],
                       "Mean acceptance length": [2.5, 1.0], "Draft ms/step": [3.0, None]})
    out, config = measure.display(df)
    assert list(out["Acceptance rate"]) == ["92%", "—"] and list(out["Draft ms/step"]) == [3.0, "—"]
    assert "None" not in out.astype(str).to_string() and "0.918" not in out.astype(str).to_string()
    out, config = measure.display(df.dropna())
    assert set(config) == {"Acceptance rate"}      # a numeric column, formatted as a percent
