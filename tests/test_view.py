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
    assert view.show(piece) == seen and view._label(piece) == seen


def test_spaces_inside_a_word_stay_spaces_but_quotes_show_them():
    assert view.chip_body(" the") == " the"            # the chip's edges show the space
    assert view.chip_body(" a\x07b") == "␣a␇b"          # a control character makes every character explicit
    assert view.show(" the") == "␣the"                  # a quoted token in prose or a label: nothing blank
    assert view.show("<b>") == "&lt;b&gt;"


@pytest.mark.parametrize("piece,name", [("<|im_end|>", "im_end"), ("<|im_start|>", "im_start"), ("</s>", "s")])
def test_template_tokens_are_one_muted_chip(piece, name):
    html = view.chip(piece, "tok-bonus", token=2)
    assert "tok-template" in html and f">template: {name}</span>" in html and "&lt;" not in visible(html)
    assert view._label(piece) == f"template: {name}"


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
