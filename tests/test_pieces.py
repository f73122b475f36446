"""A character split over several tokens (an emoji is two or three byte-level BPE tokens) shows as the
character in the token chips and the text so far, never as "�"; a lone fragment shows as its bytes.
The ids are the bundled tokenizer's own (only the tokenizer is loaded, not the model)."""
from __future__ import annotations

import re

import pytest

from app import view
from app.frames import DRAFT, RESULT, Frame
from specdec_core import pieces
from specdec_core.engine import Recorder
from specdec_core.records import Committed, Position, StepRecord

TEXT = "I love 🍕 and 🚀, café ✨ 😀!"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from specdec_core.models import _GGUF, bundled_dir
    return AutoTokenizer.from_pretrained(bundled_dir(), gguf_file=_GGUF)


def visible(html: str) -> str:
    return re.sub(r' title="[^"]*"', "", html)


def step(index: int, ids: list[int], origins: list[str], show: Recorder, drafted=()) -> StepRecord:
    pos = [Position(x, show.piece(x), 1.0, 1.0, 1.0, 0.0, v) for x, v in drafted]
    return StepRecord(index=index, drafter="lookup", drafted=[x for x, _ in drafted], positions=pos,
                      n_accepted=sum(v == "accepted" for _, v in drafted), final_token=ids[-1],
                      final_piece=show.piece(ids[-1]), final_kind=origins[-1], final_top=[],
                      committed=[Committed(x, show.piece(x), o, 1.0) for x, o in zip(ids, origins)],
                      n_generated=len(ids), text="", cache_len=0, target_forwards=1, draft_forwards=0,
                      t_draft=0, t_score=0, t_verify=0, t_commit=0, elapsed=0)


def test_the_bundled_tokenizer_splits_emoji_and_a_lone_token_decodes_to_fffd(tok):
    """The premise: without joining, every emoji token decodes alone to U+FFFD."""
    ids = tok.encode("🚀")
    assert len(ids) > 1 and all(tok.decode([i]) == "\ufffd" for i in ids)


def test_pieces_join_back_to_the_text_and_groups_keep_every_character(tok):
    ids = tok.encode(TEXT)
    ps = [pieces.piece(tok, i) for i in ids]
    assert pieces.join(ps) == TEXT
    got = pieces.groups(ps)
    assert "".join(t for _, _, t in got) == TEXT and not any("\ufffd" in t or pieces.has_fragment(t) for _, _, t in got)
    assert [t for _, _, t in got if t.strip() in "🍕🚀✨😀" and t.strip()] == [" 🍕", " 🚀", " ✨", " 😀"]
    assert pieces.readable(ps[ids.index(tok.encode(" 🍕")[0])]) == "␣⟨F0 9F⟩".replace("␣", " ")


def test_text_so_far_shows_emoji_split_across_steps_and_origins(tok):
    """Each emoji's tokens straddle a step boundary and two origins: one chip each, no "�"."""
    show = Recorder(tok, True)
    ids = tok.encode(TEXT)
    a = ids.index(tok.encode(" 🍕")[0]) + 1            # cut inside the pizza's bytes
    recs = [step(0, ids[:a], ["draft"] * (a - 1) + ["bonus"], show),
            step(1, ids[a:], ["resampled"] + ["target"] * (len(ids) - a - 1), show)]
    html = view.text_so_far(recs, 1)
    shown = visible(html)
    assert "\ufffd" not in html and "⟨" not in shown
    for e in "🍕🚀✨😀":
        assert e in shown
    assert shown.count('class="tok ') == len(pieces.groups([c.piece for r in recs for c in r.committed]))
    assert "one character over" in html    # the hover names every token of a joined chip
    # only the first step so far: the pizza's lead bytes wait for the rest, shown as bytes
    first = visible(view.text_so_far(recs, 0))
    assert "\ufffd" not in first and "⟨F0 9F⟩" in first


def test_drafts_of_different_verdicts_are_not_joined(tok):
    """In the context strip a drafted fragment stays its own chip (its bytes) when its neighbour's verdict differs."""
    show = Recorder(tok, True)
    e = tok.encode("🚀")
    rec = step(0, [e[0]], ["draft"], show, drafted=[(e[0], "accepted"), (e[1], "rejected")])
    html = view.context_strip("Go", [rec], 0, Frame(RESULT, 2, 2))
    assert "\ufffd" not in html and "⟨F0 9F⟩" in visible(html)
    same = view.context_strip("Go", [rec], 0, Frame(DRAFT, 2, 0))   # both still drafts: one chip
    assert "\ufffd" not in same


def test_a_lone_fragment_in_a_caption_or_label_reads_as_its_bytes(tok):
    p = Recorder(tok, True).piece(tok.encode("🚀")[0])
    assert view.show(p) == "⟨F0 9F⟩" and view.token_label(p) == "⟨F0 9F⟩"   # no ␣ between the bytes
    assert view.show(" " + p) == "␣⟨F0 9F⟩"


def test_a_real_replacement_character_is_kept():
    assert pieces.groups(["a", "\ufffd", "b"]) == [(0, 1, "a"), (1, 2, "\ufffd"), (2, 3, "b")]
    assert pieces.from_bytes("é".encode()[:1]) == chr(pieces.FRAGMENT + 0xC3)
