"""The drafter registry: what each drafter is, whether trained weights ship for a target (by the manifest's
recorded target, not by a display name), one weight loader with one error, one draft-model resolution, and the
greedy on/off diff's length case."""
from __future__ import annotations

import json

import pytest

from specdec_core import drafters
from specdec_core.bench.invariance import difference, first_difference
from specdec_core.drafters import (DrafterUnavailable, distilled, eagle, early_exit, entry, make, resolve_draft,
                                   medusa, registry, trained_for, weights_for)
from specdec_core.models import LM
from tiny import tiny_lm

TRAINED = ("draft", "early-exit", "medusa", "eagle")


@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(0, name="tiny")


def test_every_name_has_one_entry_and_the_lists_follow_from_it():
    assert drafters.NAMES == tuple(registry.ENTRIES) == ("none", "lookup", "suffix", "draft", "early-exit",
                                                         "medusa", "eagle")
    assert drafters.TRAINED == TRAINED
    assert drafters.MODEL_DRAFTS == ("draft", "early-exit")            # the drafters that report a q
    assert drafters.SPECULATIVE == drafters.NAMES[1:]                  # everything but plain decoding
    assert set(drafters.DESCRIPTIONS) == set(drafters.NAMES)
    assert [n for n in drafters.NAMES if entry(n).tree] == ["suffix", "medusa", "eagle"]
    assert [n for n in drafters.NAMES if entry(n).reads_hidden] == ["medusa", "eagle"]


def test_plain_decoding_is_the_entry_that_drafts_nothing():
    plain = entry(drafters.PLAIN)
    assert not plain.drafts and plain.k(6) == 0 and plain.k(None) == 0 and plain.policy("schedule") == "fixed"
    look = entry("lookup")
    assert look.drafts and look.k(6) == 6 and look.k(None) is None and look.policy("schedule") == "schedule"


def test_unknown_names_are_refused_with_the_choices():
    for bad in ("bogus", "", None, "None"):
        with pytest.raises(DrafterUnavailable, match="unknown drafter .*choose from none, lookup"):
            entry(bad)


def test_built_drafters_start_from_the_registrys_default_k(tiny):
    for n in ("none", "lookup", "suffix"):
        assert make(n, tiny).default_k == entry(n).default_k
    assert make("draft", tiny, tiny).default_k == entry("draft").default_k


def test_a_tiny_target_has_no_trained_weights(tiny):
    for n in TRAINED:
        assert not weights_for(n, tiny), n
        assert not drafters.runs_on(n, tiny), n
    for n in ("none", "lookup", "suffix"):
        assert not weights_for(n, tiny) and drafters.runs_on(n, tiny)   # they need none
    with pytest.raises(DrafterUnavailable, match="needs a draft model"):
        make("draft", tiny)
    for n in ("early-exit", "medusa", "eagle"):
        with pytest.raises(DrafterUnavailable, match=f"drafter '{n}' has no trained weights for 'tiny'"):
            make(n, tiny)


def test_the_manifest_decides_not_the_display_name(bundled):
    for n in TRAINED:
        assert weights_for(n, bundled), n
    # the same weights under another name: not the target the manifests record
    other = LM(bundled.model, bundled.tokenizer, "some other target", bundled.dtype, bundled.device)
    assert not any(weights_for(n, other) for n in TRAINED)
    # the recorded name on a model of another shape does not match either
    impostor = tiny_lm(0, name=bundled.name)
    assert not any(weights_for(n, impostor) for n in TRAINED)
    man = registry.manifest("medusa")
    assert trained_for(man, bundled) and not trained_for({}, bundled)
    assert not trained_for({**man, "target_shape": {**man["target_shape"], "num_hidden_layers": 29}}, bundled)


def test_weights_for_reads_the_manifest_beside_the_weights(tmp_path, tiny):
    (tmp_path / "medusa.safetensors").write_bytes(b"")
    assert not weights_for("medusa", tiny, tmp_path)                                   # no manifest
    rec = registry.target_record(tiny)
    (tmp_path / "medusa.manifest.json").write_text(json.dumps({**rec, "tree": [[0]]}))
    assert weights_for("medusa", tiny, tmp_path)                                       # recorded for it
    (tmp_path / "medusa.manifest.json").write_text(json.dumps({**rec, "target": "tiny-2"}))
    assert not weights_for("medusa", tiny, tmp_path)


def test_one_loader_one_error_for_missing_weights(tmp_path, tiny):
    calls = [lambda: medusa.load_heads(tmp_path / "medusa.safetensors"),
             lambda: eagle.load_head(tiny.model, tmp_path / "eagle.safetensors"),
             lambda: early_exit.load_exit(tiny.model, tmp_path / "early-exit.safetensors")]
    for kind, call in zip(("medusa", "eagle", "early-exit"), calls):
        with pytest.raises(DrafterUnavailable, match=f"no trained {kind} weights at {kind}.safetensors: run "
                                                     f"`python -m specdec_core train {kind}`"):
            call()
    (tmp_path / "draft.config.json").write_text("{}")
    with pytest.raises(DrafterUnavailable, match="no trained draft weights at draft.safetensors"):
        distilled.load_draft(tiny, tmp_path)


def test_a_draft_model_spec_is_resolved_in_one_place(tiny):
    loaded = []
    load = lambda spec: loaded.append(spec) or tiny_lm(1, name=spec)
    assert resolve_draft("bundled", tiny, load) is tiny and not loaded               # the target drafts for itself
    assert resolve_draft(" hub/id ", tiny, load).name == "hub/id" and loaded == ["hub/id"]
    assert resolve_draft("mine", tiny, load, target_spec="mine") is tiny              # the CLI's --model spec
    with pytest.raises(DrafterUnavailable, match="draft model is empty"):
        resolve_draft("  ", tiny, load)
    with pytest.raises(DrafterUnavailable, match="drafter 'draft' has no trained weights for 'tiny'"):
        resolve_draft("distilled", tiny, load)
    assert loaded == ["hub/id"]


def test_the_distilled_spec_gives_the_shipped_draft(bundled):
    assert resolve_draft("distilled", bundled) is distilled.shipped_draft(bundled)


def test_first_difference_counts_a_length_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None and difference([1, 2], [1, 2]) == "identical"
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1 and difference([1, 2, 3], [1, 9, 3]) == "differ from token 2"
    # one a prefix of the other: not identical, and the position is where only one of them goes on
    assert first_difference([1, 2], [1, 2, 3, 4]) == 2 == first_difference([1, 2, 3, 4], [1, 2])
    assert difference([1, 2], [1, 2, 3, 4]) == "same first 2 tokens, then one stops (2 vs 4): differ from token 3"
    assert first_difference([], [5]) == 0
    assert first_difference("abc", "abd") == 2 and difference("ab", "abc", "character").startswith("same first 2")


def test_the_checklist_reports_a_length_difference():
    from specdec_core.serving.checklist import PromptResult
    r = PromptResult("p", [1, 2, 3], [1, 2], None, None)
    assert r.first_diff == 2
