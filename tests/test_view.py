"""Every token visible: whitespace and control tokens as glyphs with the raw id on hover, chat-template
tokens as one muted chip, chart labels and captions that never show an empty box or a blank quote.
Pure functions of records: no model, no Streamlit script run."""
from __future__ import annotations

import re

import pytest

from app import view
from app.captions import caption
from app.frames import RESULT, Frame
from specdec_core.records import Candidate, Committed, Position, StepRecord


def visible(html: str) -> str:
    """What the page shows: the markup without hover titles."""
    return re.sub(r' title="[^"]*"', "", html)


@pytest.mark.parametrize("piece,seen", [(" ", "␣"), ("  ", "␣␣"), ("\n", "↵"), ("\n\n", "↵↵"), ("\t", "⇥"),
                                        ("\r\n", "␍↵"), ("\x00", "␀"), ("\x1b", "␛"), ("\u200b", "⟨ZWSP⟩"),
                                        ("\u00a0", "⍽"), ("", "∅")])
def test_a_blank_or_control_token_has_visible_text(piece, seen):
    html = view.chip(piece, "tok-resampled", "resampled", token=216)
    body = html.split(">", 1)[1].rsplit("<", 1)[0]
    assert body == seen
    assert 'title="resampled · id 216 · ' in html      # the raw id (and repr) on hover
    assert view.show(piece) == seen and view.token_label(piece) == seen


def test_spaces_inside_a_word_stay_spaces_but_quotes_show_them():
    assert view.chip_body(" the") == " the"            # the chip's edges show the space
    assert view.chip_body(" a\x07b") == "␣a␇b"          # a control character makes every character explicit
    assert view.show(" the") == "␣the"                  # a quoted token in prose or a label: nothing blank
    assert view.show("<b>") == "&lt;b&gt;"


@pytest.mark.parametrize("piece,name", [("<|im_end|>", "im_end"), ("<|im_start|>", "im_start"), ("</s>", "s")])
def test_template_tokens_are_one_muted_chip(piece, name):
    html = view.chip(piece, "tok-bonus", token=2)
    assert "tok-template" in html and f">template: {name}</span>" in html and "&lt;" not in visible(html)
    assert view.token_label(piece) == f"template: {name}"


def test_the_prompt_shows_template_markers_as_chips():
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    html = view.template_text(text)
    assert "&lt;" not in visible(html)
    for name in ("system", "user", "assistant", "im_end"):
        assert f">template: {name}</span>" in html
    assert "Be brief." in html and "Say hi." in html


def record(final: str, kind: str = "resampled") -> StepRecord:
    pos = Position(5, " cat", 0.1, 0.6, 0.1 / 0.6, 0.9, "rejected", [Candidate(216, final, 0.5)], [])
    return StepRecord(index=0, drafter="lookup", drafted=[5], positions=[pos], n_accepted=0, final_token=216,
                      final_piece=final, final_kind=kind, final_top=[Candidate(216, final, 0.7)],
                      committed=[Committed(216, final, kind, 0.5)], n_generated=1, text=final, cache_len=3,
                      target_forwards=1, draft_forwards=0, t_draft=0, t_score=0, t_verify=0, t_commit=0,
                      elapsed=0)


def test_a_resampled_space_is_visible_in_text_strip_caption_and_chart():
    rec = record(" ")
    strip = view.text_so_far([rec], 0)
    assert 'class="tok tok-resampled"' in strip and ">␣</span>" in strip
    assert "“␣”" in caption(rec, Frame(RESULT, 1, 1), greedy=False)
    fig = view.result_figure(rec)
    assert "␣  #216" in fig.data[0].y[-1] and "“␣”" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "probability"


def test_the_context_strip_never_starts_inside_a_template_marker():
    prompt = "x" * 200 + "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    html = view.context_strip(prompt, [record("!")], 0, Frame(RESULT, 1, 1))
    assert "&gt;" not in visible(html) and "im_start" not in visible(html)
    assert ">template: assistant</span>" in html


# ---- a tree step drawn (tree_view.py) and where the time went (costs.py) ----

@pytest.fixture(scope="module")
def tree_records():
    """A sampled run of untrained Medusa heads on a tiny model over a wide tree: rejections, residuals, trees."""
    from specdec_core import engine
    from specdec_core.drafters.medusa import Heads, Medusa
    from specdec_core.sampling import SamplingParams
    from tests.tiny import tiny_lm
    tgt = tiny_lm(0)
    d = Medusa(tgt, heads=Heads(32, 3), manifest={}, tree=[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    _, recs, _ = engine.run(tgt, d, [1, 2, 3], sp=SamplingParams(temperature=1.0, seed=1), max_new_tokens=16,
                            stop_at_eos=False)
    return [r for r in recs if r.tree is not None]


def test_the_tree_figure_has_one_marker_per_candidate_and_walks_the_trials(tree_records):
    from app import tree_view
    from app.frames import DRAFT, VERIFY, frames
    assert tree_records
    for rec in tree_records:
        fs = frames(rec)
        assert [f.phase for f in fs].count(VERIFY) == len(rec.tree.tried()) >= 1
        for f in fs:
            fig = tree_view.tree_figure(rec, f)
            cand = next(t for t in fig.data if t.name == "candidates")
            assert len(cand.x) == rec.tree.drafted == len(rec.tree.nodes) - 1
            st = tree_view.state(rec.tree, f)
            if f.phase == DRAFT:   # the tree grows a position per frame
                assert sum(s != "hidden" for s in st.values()) == sum(n.depth <= f.shown for n in rec.tree.nodes[1:])
            else:                  # tested nodes keep their verdict's colour, in the order tested
                tested = [n.index for n in rec.tree.tried()[:f.checked]]
                assert all(st[i] in ("testing", "accepted", "rejected") for i in tested)
                assert all(st[n.index] == ("accepted" if n.trial.accepted else "rejected")
                           for n in rec.tree.tried()[:f.checked - 1])
        last = tree_view.tree_figure(rec, fs[-1])
        assert any(t.name in ("resampled", "bonus") for t in last.data)   # the result keeps the drawn token
        assert all(s in ("accepted", "rejected", "pruned") for s in tree_view.state(rec.tree, fs[-1]).values())
        mask = tree_view.mask_figure(rec.tree).data[0].z
        assert [[bool(c) for c in row] for row in mask] == rec.tree.mask


def test_tree_captions_and_table_use_tree_words_not_chain_words(tree_records):
    from app import tree_view
    from app.frames import VERIFY, frames
    rec = next(r for r in tree_records if any(not n.trial.accepted for n in r.tree.tried()))
    for f in frames(rec):
        text = caption(rec, f, greedy=False)
        assert "thrown away too" not in text and "guesses the next" not in text
        if f.phase == VERIFY:
            n = rec.tree.tried()[f.checked - 1]
            assert f"Trial {f.checked}" in text and f"{n.trial.accept_prob:.2f}" in text
            table = tree_view.trial_table(rec, f, greedy=False)
            assert table.count('class="vrow vrow-') == f.checked
            greedy = tree_view.trial_table(rec, f, greedy=True)
            assert "u=" not in greedy and "u=" in table      # at T = 0 no u is drawn
    assert f"{rec.tree.drafted} candidates" in caption(rec, frames(rec)[0], greedy=False)


@pytest.mark.parametrize("shape", [[(0,), (0, 0), (0, 0, 0)], [(0,), (1,), (0, 0), (1, 0)]])
def test_the_result_speaks_of_faded_branches_only_where_some_are_faded(shape):
    """A chain-shaped tree has no branches: its result never says the faded branches were not needed."""
    from app import tree_view
    from app.frames import frames
    from specdec_core import engine
    from specdec_core.drafters.medusa import Heads, Medusa
    from specdec_core.sampling import SamplingParams
    from tests.tiny import tiny_lm
    tgt = tiny_lm(0)
    d = Medusa(tgt, heads=Heads(32, 3), manifest={}, tree=shape)
    _, recs, _ = engine.run(tgt, d, [1, 2, 3], sp=SamplingParams(temperature=1.0, seed=1), max_new_tokens=24,
                            stop_at_eos=False)
    seen = set()
    for rec in (r for r in recs if r.tree is not None):
        last = frames(rec)[-1]
        faded = sum(s == "pruned" for s in tree_view.state(rec.tree, last).values())
        text = caption(rec, last, greedy=False)
        assert ("faded" in text) == (faded > 0), text
        if not faded:
            chain = len(shape) == 3
            assert ("single chain" in text) == chain and ("every candidate was tested" in text) != chain
        seen.add(faded > 0)
    assert (False in seen) if len(shape) == 3 else (True in seen)   # the case each shape is here for was met


def test_the_cost_breakdown_adds_up_and_predicts_from_the_costs():
    from app import costs
    from tests.test_profile import rec as timed
    plain = costs.split([timed(0, 0.1, t_score=0.01), timed(1, 0.120, t_score=0.019), timed(2, 0.140, t_score=0.019)])
    spec = [timed(0, 0.2), timed(1, 0.250, 3, t_draft=0.010, t_score=0.030, t_verify=0.004, t_commit=0.002)]
    spec[1].committed = [Committed(1, "a", "draft", 0.5)] * 4
    s = costs.split(spec)
    assert plain["step_ms"] == pytest.approx(20.0) and s["step_ms"] == pytest.approx(50.0)
    assert s["rule_ms"] == pytest.approx(6.0) and s["bookkeeping_ms"] == pytest.approx(4.0)
    assert s["tokens_per_step"] == 4 and costs.predicted(s, plain) == pytest.approx(4 * 20 / 50)
    fig = costs.figure(s, plain, "t")
    per_token = [sum(t.x[i] for t in fig.data if t.type == "bar") for i in range(4)]
    assert per_token == pytest.approx([20.0, 50.0, 20.0, 12.5])
    words = costs.sentence(s, plain, 0.85)
    assert "85%" in words and "2.50×" in words and "12.5 ms" in words and "mean acceptance length is **4.00**" in words
    assert "1.60×" not in words and "commits" not in words    # one speedup on a page: the measured one
