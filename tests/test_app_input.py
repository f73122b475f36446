"""Bad input, anywhere a visitor can type or drag, is a plain message on the page, never a traceback nor a
generic "Something went wrong"; and the same session still runs a good generation afterwards.

First `load()`'s messages for draft model names, directly (fast, no model): local paths that are not
models, hub ids off the local cache while offline or with the hub out of reach (answered in seconds, not
after a minute of retries), and the hub's own refusals. Then the app under streamlit.testing.v1.AppTest on
the real bundled model: the prompt field, the draft model field, every slider and number at its extremes
and beyond them (as a link or code could set), every drafter on the shortest prompt.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specdec_core import ModelError, load
from app import sidebar
from specdec_core.drafters import NAMES
from tests.test_app import set_controls
from tests.test_models import save_tiny

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
TIMEOUT = 240  # a cold model load plus a short run on a busy 2-core machine
FAST_S = 10    # a wrong model name is answered within this, network or not
UNREACHABLE = "not in the local cache and this machine is offline (or cannot reach the hub)"
GENERIC = "Something went wrong"


# ---------------------------------------------------------------- load(): the draft model's name

def timed_error(spec: str, **kw) -> tuple[str, float]:
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as e:
        load(spec, dtype="fp32", device="cpu", **kw)
    return str(e.value), time.perf_counter() - t0


@pytest.mark.parametrize("spec, words", [
    ("docs", "has no config.json"),              # a directory, not a model
    ("README.md", "is a file, not a model directory"),
    ("./no/such/model", "does not exist"),
    ("no such model", "nor a hub id of the form owner/name"),
])
def test_a_local_path_that_is_no_model_says_what_it_is(spec, words, monkeypatch):
    monkeypatch.chdir(ROOT)
    msg, dt = timed_error(spec)
    assert words in msg and dt < FAST_S


def test_a_hub_id_off_the_cache_is_refused_at_once_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg, dt = timed_error("nonexistent-org/no-such-model-xyz")
    assert UNREACHABLE in msg and "HF_HUB_OFFLINE" in msg, msg
    assert dt < FAST_S, f"{dt:.1f} s"


def test_a_hub_id_off_the_cache_is_answered_in_seconds_online_or_not(monkeypatch):
    """No HF_HUB_OFFLINE: one short try of the hub. Without a route to it, the offline message; with one,
    the hub's answer (the id does not exist). Never a minute of retries."""
    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    msg, dt = timed_error("nonexistent-org/no-such-model-xyz")
    assert UNREACHABLE in msg or "does not exist on the hub" in msg, msg
    assert dt < FAST_S, f"{dt:.1f} s"


def _hub_error(cls, text: str):
    """One of huggingface_hub's HTTP errors, as its client raises it for a 404 from the hub."""
    import importlib
    import huggingface_hub.errors as errors
    http = importlib.import_module(errors.Response.__module__)  # the HTTP client the hub's errors are built on
    req = http.Request("GET", "https://huggingface.co/api/models/some-org/some-model")
    return cls(text, response=errors.Response(404, request=req))


@pytest.mark.parametrize("error, words", [
    ("RepositoryNotFoundError", "does not exist on the hub (or is private"),
    ("GatedRepoError", "is gated: request access"),
    ("DisabledRepoError", "has been disabled"),
])
def test_the_hubs_refusals_are_named(error, words, monkeypatch):
    import huggingface_hub.errors as errors
    from huggingface_hub import HfApi, constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def refuse(self, repo_id, **kw):
        raise _hub_error(getattr(errors, error), f"{error} for {repo_id}")
    monkeypatch.setattr(HfApi, "model_info", refuse)
    msg, dt = timed_error("some-org/some-model")
    assert words in msg and "some-org/some-model" in msg, msg
    assert "Traceback" not in msg and dt < FAST_S


def test_a_hub_repo_without_safetensors_is_refused_before_any_download(monkeypatch):
    from types import SimpleNamespace
    from huggingface_hub import HfApi, constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, **kw: SimpleNamespace(
        siblings=[SimpleNamespace(rfilename="config.json"), SimpleNamespace(rfilename="pytorch_model.bin")]))
    msg, _ = timed_error("some-org/pickled-model")
    assert "has no *.safetensors weights" in msg


def test_a_cached_hub_id_loads_offline_from_the_cache(tmp_path, monkeypatch):
    """A model fetched before loads with HF_HUB_OFFLINE set: the cache is read first, no network."""
    from huggingface_hub import constants
    snap = tmp_path / "models--some-org--tiny" / "snapshots" / ("0" * 40)
    save_tiny(snap)
    (tmp_path / "models--some-org--tiny" / "refs").mkdir()
    (tmp_path / "models--some-org--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = load("some-org/tiny", dtype="fp32", device="cpu")
    assert lm.name == "some-org/tiny" and lm.vocab_size == 12
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    assert UNREACHABLE in timed_error("some-org/tiny")[0]


# ---------------------------------------------------------------- the app: one session takes all the bad input

GOOD = "Say hi."


@pytest.fixture(scope="module")
def at():
    """One session on the Step by step page, shared by every case below (each leaves the controls it set).
    Model ids a visitor may load are opened to all where the app has such a list, so load() is reached."""
    old = os.environ.get("SPECDEC_ALLOWED_MODELS")
    os.environ["SPECDEC_ALLOWED_MODELS"] = "*"
    app = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    app.run()
    app.switch_page("../pages/step.py").run()
    assert not app.exception
    yield app
    if old is None:
        os.environ.pop("SPECDEC_ALLOWED_MODELS", None)
    else:
        os.environ["SPECDEC_ALLOWED_MODELS"] = old


def page_text(at: AppTest) -> str:
    return "\n".join([h.proto.body for h in at.html] + [m.value for m in at.markdown]
                     + [c.value for c in at.caption])


def attempt(at: AppTest, **controls):
    """Set the controls as a visitor would, press Generate: (the page's error message or None, the new run
    or None). Never a traceback, never the generic message."""
    set_controls(at, **controls)
    before = at.session_state["run"] if "run" in at.session_state else None
    at.button(key="generate").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) <= 1, errors
    assert not any(GENERIC in e or "Traceback" in e for e in errors), errors
    run = at.session_state["run"] if "run" in at.session_state else None
    new = run if run is not before else None
    if errors:
        assert new is None, "an error, yet a run was made"
        return errors[0], None
    assert new is not None and new.status == "done", "no error and no finished run"
    return None, new


def good_run(at: AppTest):
    """After bad input the same session still decodes: a short plain-settings run completes."""
    err, run = attempt(at, drafter="lookup", prompt=GOOD, k=4, temperature=0.0, top_p=1.0, seed=0,
                       max_new_tokens=3)
    assert err is None and run.records[-1].n_generated >= 1
    return run


@pytest.mark.parametrize("prompt, words", [
    ("", "prompt is empty"),
    (" \n\t  \n", "prompt is empty"),
])
def test_an_empty_prompt_is_a_message(at, prompt, words):
    err, _ = attempt(at, drafter="none", prompt=prompt, max_new_tokens=2)
    assert err and words in err


def test_a_prompt_past_the_context_is_refused_before_any_work_with_its_length(at):
    t0 = time.perf_counter()
    err, _ = attempt(at, drafter="lookup", prompt=" ".join(["word"] * 10_000), max_new_tokens=2)
    assert err and "tokens" in err and "context of 8192" in err, err
    n = int(err.split("(", 1)[1].split(" tokens", 1)[0])
    assert n > 8192
    assert time.perf_counter() - t0 < 60  # tokenizing only: no pass of the model over 10,000 tokens
    good_run(at)


def test_a_long_prompt_that_fits_says_its_length_and_time_first(at):
    prompt = "Count the words: " + " ".join(["apple"] * 1100)
    err, run = attempt(at, drafter="none", prompt=prompt, max_new_tokens=1)
    assert err is None and len(run.prompt_ids) > 1000
    assert f"{len(run.prompt_ids):,} tokens" in run.note and "context of 8,192" in run.note
    assert " s in all" in run.note
    assert any(run.note in c.value for c in at.caption)  # still said on the page once the run is done


@pytest.mark.parametrize("prompt, shown", [
    ("Echo: 😀🚀 مرحبا بالعالم שלום עולם", "مرحبا بالعالم שלום עולם"),
    ("Echo: a\x00b \x1b[31mred\x1b[0m c\rd", "red"),
])
def test_emoji_right_to_left_and_control_characters_run_and_show(at, prompt, shown):
    err, run = attempt(at, drafter="lookup", prompt=prompt, max_new_tokens=2)
    assert err is None, err
    assert shown in run.prompt_text and shown in page_text(at)


def test_a_lone_surrogate_is_a_message_before_the_model_is_asked():
    """Half a surrogate pair cannot travel through the text widget (neither AppTest's nor a browser's, which
    sends U+FFFD), but a prompt reaches runs.start from code and links too: a message, not a tokenizer crash."""
    from app import runs
    with pytest.raises(runs.UserError, match=r"not text \(U\+D800, half of a surrogate pair, at character 7\)"):
        runs.start(runs.Settings(prompt="Echo: \ud800 x"))


@pytest.mark.parametrize("spec, words", [
    ("", "draft model is empty"),
    ("nonexistent-org/no-such-model-xyz", None),   # offline or not: see the test
    ("docs", "has no config.json"),
    ("./no/such/model", "does not exist"),
    ("README.md", "is a file, not a model directory"),
])
def test_a_bad_draft_model_is_a_message_at_once(at, spec, words, monkeypatch):
    monkeypatch.chdir(ROOT)
    t0 = time.perf_counter()
    err, _ = attempt(at, drafter="draft", draft_model=spec, max_new_tokens=2)
    assert err, "a bad draft model ran"
    if words is None:  # no route to the hub here: said at once; with one, the hub says it does not exist
        assert UNREACHABLE in err or "does not exist on the hub" in err or "not allowed" in err, err
    else:
        assert words in err, err
    assert time.perf_counter() - t0 < FAST_S + 5
    if spec == "README.md":
        at.text_input(key="draft_model").input("bundled")
        good_run(at)


def test_the_draft_model_id_is_refused_fast_offline_too(at, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    err, _ = attempt(at, drafter="draft", draft_model="nonexistent-org/no-such-model-xyz", max_new_tokens=2)
    assert err and (UNREACHABLE in err or "not allowed" in err), err
    assert time.perf_counter() - t0 < FAST_S + 5
    at.text_input(key="draft_model").input("bundled")
    good_run(at)


@pytest.mark.parametrize("controls", [
    dict(k=1), dict(k=12), dict(temperature=0.0), dict(temperature=2.0), dict(top_p=0.05),
    dict(seed=0), dict(seed=2**31 - 1), dict(max_new_tokens=1),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_every_control_at_its_extreme_runs(at, controls):
    err, run = attempt(at, drafter="lookup", prompt=GOOD, **{"max_new_tokens": 2, **controls})
    assert err is None, err
    for key, val in controls.items():
        assert getattr(run.settings, key) == val
    assert 1 <= run.records[-1].n_generated <= run.settings.max_new_tokens


def test_the_most_new_tokens_are_accepted(at):
    """512 new tokens allowed; the prompt asks for one word, so the model's end of sequence ends it soon."""
    err, run = attempt(at, drafter="none", prompt="Reply with one word: yes or no? Is water wet?",
                       temperature=0.0, max_new_tokens=512)
    assert err is None, err
    assert run.settings.max_new_tokens == 512
    assert run.records[-1].stop_reason == "eos" or run.records[-1].n_generated == 512


@pytest.mark.parametrize("key, bad, kept", [
    ("k", 999, 12), ("k", 0, 1), ("temperature", -1.0, 0.0), ("temperature", 9.0, 2.0), ("top_p", 0.0, 0.05),
    ("seed", -5, 0), ("seed", 2**31, 2**31 - 1), ("max_new_tokens", 0, 1), ("max_new_tokens", 100_000, 512),
    ("k", "many", sidebar.DEFAULTS["k"]), ("temperature", float("nan"), 0.0),
])
def test_a_value_out_of_range_in_the_session_is_brought_in_and_said(key, bad, kept):
    """As code, a scene or a link would put it in st.session_state before the controls are drawn: the
    nearest allowed value (the default for what is no number), said in the sidebar. Left alone, a slider
    stretches its range to take it, and the run fails on it, or worse, runs with it."""
    app = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    app.session_state["prompt"] = GOOD  # else a first visit takes the preset's prompt and temperature
    app.session_state[key] = bad
    app.run()
    assert not app.exception, app.exception
    assert app.session_state[key] == kept
    said = [w.value for w in app.warning]
    assert any(f"{key} = {bad!r}" in w for w in said), said
    if key in ("k", "max_new_tokens") and kept != 512:  # and a run takes the value the control shows
        app.switch_page("../pages/step.py").run()
        err, run = attempt(app, drafter="lookup", **({} if key == "max_new_tokens" else {"max_new_tokens": 2}))
        assert err is None and getattr(run.settings, key) == kept


@pytest.mark.parametrize("drafter", NAMES)
def test_every_drafter_on_the_shortest_prompt_runs_or_says_why(at, drafter):
    controls = dict(draft_model="bundled") if drafter == "draft" else {}
    if drafter != "none":
        controls["k"] = 4
    err, run = attempt(at, drafter=drafter, prompt="a", temperature=0.0, max_new_tokens=2, **controls)
    if err:
        assert drafter in err or "draft" in err, err
    else:
        assert run.settings.drafter == drafter and run.records[-1].n_generated >= 1
