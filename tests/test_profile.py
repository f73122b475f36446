"""`profile`: where a speculative step's time goes, and the speedups it predicts (bench/profile.py).

Tiny random models (tests/tiny.py) keep the file fast: a chain drafter (lookup), a tree drafter (suffix) and a
separate draft model, each beside plain decoding. The accounting itself is checked on hand-made records with
known timings; the command line with the tiny target standing in for the bundled one."""
from __future__ import annotations

import json

import pytest

from specdec_core import cli
from specdec_core.bench import profile as prof
from specdec_core.cli import main
from specdec_core.drafters import make
from specdec_core.records import StepRecord, TreeNode, TreeView
from specdec_core.tree import compile_tree
from tests.tiny import AnyTok, perturbed, tiny_lm

PROMPT = "abcabcabcdabcabc"      # repeats, so lookup and suffix find matches
PHASE_COLS = [f"{p}_ms" for p in prof.PHASES]


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, forward="ours", tok=AnyTok())


@pytest.fixture(scope="module")
def rows(target):
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        drafters = {"lookup": make("lookup", target), "suffix": make("suffix", target),
                    "draft": make("draft", target, perturbed(target, 0.05, 1))}
        return prof.profile(target, drafters, [target.encode(PROMPT), target.encode("abcdabcdab")],
                            max_new_tokens=16, repeats=2)
    finally:
        torch.set_num_threads(n)


def test_plain_decoding_is_the_reference_row(rows):
    plain = rows[0]
    assert [r["drafter"] for r in rows] == ["none", "lookup", "suffix", "draft"]
    assert plain["c"] == 0 and plain["k"] == 0 and plain["drafted"] == 0
    assert plain["tokens_per_step"] == 1.0 and plain["steps"] == plain["tokens"] == 2 * 2 * 16
    assert (plain["scored"], plain["scored_tokens"], plain["score_x"]) == ("chain", 1.0, 1.0)
    assert plain["predicted_speedup"] == plain["cost_model_speedup"] == plain["speedup"] == 1.0
    assert plain["score_median_ms"] == plain["plain_score_ms"] > 0


def test_phases_are_non_negative_and_add_up_to_the_step(rows):
    for r in rows:
        assert all(r[c] >= 0 for c in PHASE_COLS), r
        timed = r["draft_ms"] + r["score_ms"] + r["verify_ms"] + r["commit_ms"]
        assert timed <= r["step_ms"] + 1e-9
        assert r["bookkeeping_ms"] == pytest.approx(r["step_ms"] - timed)
        assert r["score_ms"] > r["draft_ms"] or r["drafter"] == "draft"   # free drafters: the forward dominates


def test_the_predictions_are_the_formulas_on_the_rows_own_numbers(rows):
    plain = rows[0]
    for r in rows[1:]:
        a, k, c = r["alpha"], r["k"], r["c"]
        assert 0 < a < 1 and k >= 1
        assert r["predicted_speedup"] == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (c * k + 1)))
        assert r["cost_model_speedup"] == pytest.approx(r["tokens_per_step"] * plain["step_ms"] / r["step_ms"])
        assert r["score_x"] == pytest.approx(r["score_median_ms"] / plain["plain_score_ms"])
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / r["baseline_tokens_per_s"])
        assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"] and r["repeats"] == 2
        assert r["same_tokens_as_baseline"] and r["tokens"] == plain["tokens"]     # greedy: plain's text
        assert r["accepted"] <= r["drafted"] and r["acceptance_rate"] <= a       # alpha skips unjudged guesses
        assert 1 < r["tokens_per_step"] <= k + 1


def test_what_the_score_pass_scored(rows):
    by = {r["drafter"]: r for r in rows}
    assert by["lookup"]["scored"] == by["draft"]["scored"] == "chain"
    assert 1 < by["lookup"]["scored_tokens"] <= by["lookup"]["k"] + 1
    assert 1 < by["draft"]["scored_tokens"] <= by["draft"]["k"] + 1
    assert by["suffix"]["scored"] == "tree" and by["suffix"]["scored_tokens"] > 1
    assert by["draft"]["c"] > by["lookup"]["c"] > 0     # a model's forward per guess costs more than a search
    # the rows multiplied: what was scored, rounded up to our forward's blocks of 4, step by step
    assert by["none"]["scored_rows"] == 4
    for r in by.values():
        assert r["scored_tokens"] <= r["scored_rows"] < r["scored_tokens"] + 4
    assert [prof.padded(n, 4) for n in (1, 3, 4, 5, 8, 9)] == [4, 4, 4, 8, 8, 12]
    assert prof.padded(5, 1) == 5


def test_the_backend_measures_its_row_blocks_once(target):
    """Ours pads rows to blocks of 4 and measures a score pass of 1..4 blocks once per forward; transformers'
    forward has no blocks and no table."""
    be = target.backend
    assert be.row_block == 4
    ms = be.block_ms()
    assert len(ms) == 4 and all(x > 0 for x in ms) and be.block_ms() is ms        # kept, not measured again
    assert target.backend.block_ms() is ms                                         # a new wrapper, same forward
    assert tiny_lm(0).backend.row_block == 1 and tiny_lm(0).backend.block_ms() == []


def rec(i: int, elapsed: float, k: int = 0, tree: TreeView | None = None, **t) -> StepRecord:
    tt = {"t_draft": 0.0, "t_score": 0.0, "t_verify": 0.0, "t_commit": 0.0} | t
    return StepRecord(index=i, drafter="x", drafted=[1] * k, positions=[], n_accepted=0, final_token=0,
                      final_piece="", final_kind="bonus", final_top=[], committed=[], n_generated=0, text="",
                      cache_len=0, target_forwards=i + 1, draft_forwards=0, elapsed=elapsed, tree=tree, **tt)


def tree_view(paths) -> TreeView:
    """A TreeView of a declared tree (tokens 5, 6, ... in node order), nothing tested."""
    t = compile_tree(paths)
    nodes = [TreeNode(i, int(t.parent[i]), int(t.depth[i]), int(t.rank[i]), 5 + i, "", None, None, i == 0)
             for i in range(t.size)]
    return TreeView(nodes, t.mask.tolist(), [])


def test_the_step_accounting_on_known_timings():
    """The first step's wall time holds the prefill, so it is left out; a step's wall time runs from the previous
    record to its own, and what the four phases leave of it is bookkeeping."""
    run = [rec(0, 0.500, t_score=0.010),
           rec(1, 0.520, 3, t_draft=0.002, t_score=0.012, t_verify=0.001, t_commit=0.001),
           rec(2, 0.550, 3, tree_view([(0,), (1,), (0, 0)]),
               t_draft=0.004, t_score=0.020, t_verify=0.002, t_commit=0.002)]
    st = prof.steady([run])
    assert [round(w, 6) for _, w in st] == [0.020, 0.030]
    ph = prof.phase_ms(st)
    assert ph["step_ms"] == pytest.approx(25.0) and ph["draft_ms"] == pytest.approx(3.0)
    assert ph["score_ms"] == pytest.approx(16.0) and ph["bookkeeping_ms"] == pytest.approx((4 + 2) / 2)
    assert prof.scored(run[1]) == ("chain", 4) and prof.scored(run[2]) == ("tree", 4)
    assert prof.depth(run[1]) == 3 and prof.depth(run[2]) == 2
    one = prof.steady([[rec(0, 0.5, t_score=0.01, t_verify=0.002)]])       # a one-step run: its phases
    assert one[0][1] == pytest.approx(0.012)


# ---- the command line ----

@pytest.fixture
def tiny_cli(target, monkeypatch, tmp_path):
    """The CLI with the tiny target in place of a loaded model; -> a prompts file."""
    import torch
    monkeypatch.setattr(cli, "load", lambda *a, **k: target)
    n = torch.get_num_threads()
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "rep", "prompt": PROMPT}) + "\n")
    yield f
    torch.set_num_threads(n)


def test_the_command_prints_json_rows(tiny_cli, capsys):
    assert main(["profile", "--prompts", str(tiny_cli), "--drafter", "lookup", "--drafter", "suffix",
                 "--max-new-tokens", "12", "--repeats", "1", "--threads", "1", "--json"]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["drafter"] for r in out] == ["none", "lookup", "suffix"]
    assert all(r["model"]["name"] == "tiny-0" and r["threads"] == 1 and r["max_new_tokens"] == 12 for r in out)
    assert out[0]["c"] == 0 and out[0]["tokens_per_step"] == 1.0 and out[2]["scored"] == "tree"


def test_the_command_prints_a_table(tiny_cli, capsys):
    assert main(["profile", "--prompts", str(tiny_cli), "--drafter", "lookup", "--max-new-tokens", "12",
                 "--repeats", "1", "--threads", "1"]) == 0
    cap = capsys.readouterr()
    head = cap.out.splitlines()
    assert head[1].startswith("model tiny-0 (float32, cpu, ours forward, 1 thread(s))")
    assert "where a step's time goes" in cap.out and "Leviathan" in cap.out and "cost model" in cap.out
    assert sum(x.startswith("none ") for x in head) == sum(x.startswith("lookup ") for x in head) == 2
    assert "profile" in cap.err                              # the progress bar, on stderr


@pytest.mark.parametrize("argv,words", [
    (["--drafter", "bogus"], "error: unknown drafter 'bogus'; choose from none, lookup"),
    (["--drafter", "lookup", "--repeats", "0"], "error: --repeats must be an integer in [1, 50], got 0"),
    (["--drafter", "lookup", "--limit", "0"], "error: --limit must be at least 1, got 0"),
    (["--drafter", "lookup", "--k", "99"], "error: k (draft length) must be an integer in [0, 64]"),
])
def test_bad_input_is_one_line_before_any_load(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("loaded a model for bad input"))
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\n')
    assert main(["profile", "--prompts", str(f), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(words) and "\n" not in err


def test_a_missing_prompts_file_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("loaded a model for bad input"))
    assert main(["profile", "--prompts", "no/such.jsonl", "--drafter", "lookup"]) == 2
    assert capsys.readouterr().err == "error: --prompts 'no/such.jsonl' does not exist\n"
    assert main(["profile", "--prompts", "specdec_core", "--drafter", "lookup"]) == 2
    assert capsys.readouterr().err == "error: --prompts 'specdec_core' is a directory, not a prompt file\n"


def test_category_picks_rows_and_an_unknown_one_is_one_line(monkeypatch, capsys):
    """--category keeps only that workload's rows of a mixed file; a category no row has is refused by name."""
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("loaded a model for bad input"))
    rows = cli._prompt_rows(["docs/fresh-prompts.jsonl"], None, ["code", "json"])
    assert rows and {r["category"] for r in rows} == {"code", "json"}
    assert len(cli._prompt_rows(["docs/fresh-prompts.jsonl"], 1, ["json"])) == 1
    assert main(["bench", "--prompts", "docs/fresh-prompts.jsonl", "--category", "poetry", "--drafter", "lookup"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --category poetry: no prompt has it") and "code" in err
