"""The lesson's claims on their defaults (bench/showcase.py) and the recorded reference run (bench/reference.py):
every drafter on one prompt on a tiny model (one row each, plain's tokens at T = 0, the time split adding up),
the workload rows with their time split and verdict, the why-note from a row's own numbers, the workloads'
own drafters, and the reference that ships with the app."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specdec_core.bench import reference, showcase
from specdec_core.bench.workloads import WORKLOADS, benefit
from tests.tiny import AnyTok, perturbed, tiny_lm

PROMPT = "abcabcabcdabcabc"      # repeats, so lookup and suffix find matches


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, forward="ours", tok=AnyTok())


def test_every_drafter_on_one_prompt_is_one_row_each_with_plains_tokens(target, one_thread):
    draft = perturbed(target, 0.05, 1)
    specs, notes = showcase.buildable(target, ["lookup", "suffix", "draft", "medusa"], draft)
    assert [n for n, _ in specs] == ["lookup", "suffix", "draft"] and specs[2][1] is draft
    assert len(notes) == 1 and notes[0].startswith("medusa:")      # no heads for a tiny target: said, skipped
    rows = showcase.every(target, specs, target.encode(PROMPT).tolist(), showcase.SamplingParams(), 12,
                          repeats=2)
    assert [r["drafter"] for r in rows] == ["none", "lookup", "suffix", "draft"]
    plain = rows[0]
    for r in rows:
        assert r["same_tokens_as_baseline"] is True and r["tokens"] == plain["tokens"]
        assert r["plain_step_ms"] == pytest.approx(plain["step_ms"])
        timed = r["draft_ms"] + r["score_ms"] + r["verify_ms"] + r["commit_ms"]
        assert r["bookkeeping_ms"] == pytest.approx(r["step_ms"] - timed)
        assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"] and r["repeats"] == 2
    assert all(r["tokens_per_step"] > 1 for r in rows[1:])        # each drafted and had guesses kept


def test_workload_rows_carry_the_time_split_and_the_lessons_verdict(target, one_thread, monkeypatch):
    for n in ("extraction", "batch"):   # the tiny model's context is short: its own prompts, same workloads
        monkeypatch.setitem(WORKLOADS, n, replace(WORKLOADS[n], prompts=(PROMPT, "abcdabcdab")))
    rows = list(showcase.workload_rows(target, ["extraction", "batch"], 1, 6, 3, batch=3,
                                       specs=[("lookup", None)], repeats=1))
    assert [(r["workload"], r["drafter"], r["decoded"]) for r in rows] == [
        ("extraction", "lookup", "one at a time"), ("batch", "lookup", "as one batch")]
    one, bat = rows
    assert one["step_ms"] > 0 and one["plain_step_ms"] > 0 and one["score_ms"] > one["draft_ms"] >= 0
    assert bat["requests"] == 3 and bat["step_ms"] > 0 and bat["plain_step_ms"] > 0 and "draft_ms" not in bat
    for r in rows:
        w = WORKLOADS[r["workload"]]
        assert r["benefit"] == benefit(r["speedup"]) and r["lands"] == w.agrees(r["benefit"])
        assert (r["why"] == "") == r["lands"]


def test_why_a_row_disagrees_is_said_in_its_own_numbers():
    w = WORKLOADS["code"]
    r = {"benefit": "Negative", "acceptance_rate": 0.85, "mean_acceptance_length": 3.4, "draft_ms": 30.0,
         "score_ms": 20.0, "step_ms": 60.0, "plain_step_ms": 15.0, "noisy": False}
    txt = showcase.why(w, r)
    assert txt.startswith("worse than the lesson's High") and "acceptance 85%" in txt
    assert "draft 30.0 ms" in txt and "plain step's 15.0 ms" in txt and "4.00× as much" in txt
    assert "≈ 0.85×" in txt                                         # 3.4 tokens / 4x the cost
    assert showcase.why(WORKLOADS["chat"], {**r, "benefit": "High"}).startswith("better than")
    assert showcase.why(w, {**r, "benefit": "High"}) == ""
    assert "noisy" in showcase.why(w, {**r, "noisy": True})
    assert "Scoring the drafted" not in txt                          # no one-token pass to compare with
    dear = showcase.why(w, {**r, "plain_score_ms": 12.5})             # a verify 1.6x a one-token pass
    assert "Scoring the drafted tokens cost 1.60× scoring one here" in dear
    assert "Scoring the drafted" not in showcase.why(w, {**r, "plain_score_ms": 19.5})   # 1.03x: not the reason
    # runs of 30 tokens that spent 100 ms before their first token and then 5 ms a token (10 plain): 41% of a run
    long = {**r, "ttft_ms": 100.0, "tpot_ms": 5.0, "baseline_tpot_ms": 10.0, "tokens": 90, "prompts": 3}
    said = showcase.why(w, long)
    assert "spent 100 ms before its first token" in said and "41% of a speculative run" in said
    assert "the decoding after it ran 2.00× plain's" in said
    assert "before its first token" not in showcase.why(w, {**long, "ttft_ms": 20.0})   # 12%: not the reason
    assert showcase.why(w, {**long, "benefit": "High"}) == ""                          # a row that lands says nothing


def test_each_workload_names_a_drafter_that_can_show_it():
    assert [benefit(x) for x in (0.9, 1.0, 1.2, 1.5)] == ["Negative", "Low", "Moderate", "High"]
    own = {n: (w.drafter, w.draft_model) for n, w in WORKLOADS.items()}
    assert own["code"][0] == own["json"][0] == "eagle"               # the fastest there (docs/measurements.md)
    assert own["extraction"][0] == "lookup" and own["batch"][0] == "lookup"
    assert WORKLOADS["creative"].drafter == "draft" and WORKLOADS["creative"].temperature >= 1.0
    assert WORKLOADS["batch"].agrees("Negative") and not WORKLOADS["code"].agrees("Moderate")
    assert WORKLOADS["chat"].agrees("Moderate") and not WORKLOADS["chat"].agrees("High")


def test_the_shipped_reference_says_what_made_it():
    ref = reference.load()
    assert ref is not None, "the app ships a reference run"
    assert ref["command"].startswith("python -m specdec_core reference")
    assert ref["machine"]["cpu"] and ref["date"] and ref["model"]["name"]
    assert reference.label(ref) == f"reference: {ref['machine']['cpu']}, {ref['date']}"
    rows = reference.rows_by(ref, "workloads", "workload")
    assert list(rows) == list(WORKLOADS)
    for n, r in rows.items():
        assert r["drafter"] == WORKLOADS[n].drafter and r["benefit"] == benefit(r["speedup"])
        assert r["lands"] == WORKLOADS[n].agrees(r["benefit"])
    every = reference.rows_by(ref, "drafters", "drafter")
    assert "none" in every and all(r["same_tokens_as_baseline"] for r in every.values())


def test_a_reference_round_trips_and_a_broken_one_is_none(tmp_path):
    ref = reference.record([{"workload": "code", "speedup": 1.234567, "lands": True}], [{"drafter": "none"}],
                           "hi", {"k": 4}, "python -m specdec_core reference", {"name": "m"})
    p = reference.save(ref, tmp_path / "r.json")
    back = reference.load(p)
    assert back["workloads"][0]["speedup"] == 1.2346 and back["drafters"]["prompt"] == "hi"
    assert reference.label(back).startswith("reference: ")
    (tmp_path / "bad.json").write_text("{not json")
    assert reference.load(tmp_path / "bad.json") is None and reference.load(tmp_path / "none.json") is None
    (tmp_path / "other.json").write_text(json.dumps({"a": 1}))
    assert reference.load(tmp_path / "other.json") is None and reference.rows_by(None, "workloads", "x") == {}
