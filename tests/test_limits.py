"""Operator settings for a shared server (app/limits.py) and the queue's wording (app/turns.py): a visitor may
load only the models the operator lists, and no run asks for more new tokens than the operator's cap; both are
refused or clamped with a message naming the setting, and every run gives its turn at the model back."""
import pytest
from streamlit.testing.v1 import AppTest

import app.runs
from app import limits, runs, turns
from app.runs import Settings, UserError
from test_app import MAIN, TIMEOUT, generate, new_app

HUB_ID = "someone/a-big-model"


@pytest.fixture
def no_settings(monkeypatch):
    for env in (limits.ENV_MODELS, limits.ENV_TOKENS, limits.ENV_TURN):
        monkeypatch.delenv(env, raising=False)


def test_the_default_list_is_the_bundled_set(no_settings, monkeypatch):
    assert limits.allowed_models() == ()
    assert limits.refusal("bundled") is None and limits.refusal(" distilled ") is None
    msg = limits.refusal(HUB_ID)
    assert HUB_ID in msg and limits.ENV_MODELS in msg and "allowed_models" in msg and "`bundled`" in msg
    assert limits.refusal("./some/local/dir") is not None
    monkeypatch.setenv(limits.ENV_MODELS, f" {HUB_ID}, other/model ")
    assert limits.refusal(HUB_ID) is None and limits.refusal("other/model") is None
    assert limits.refusal("third/model") is not None
    monkeypatch.setenv(limits.ENV_MODELS, "*")
    assert limits.allowed_models() is None and limits.refusal("third/model") is None


def test_the_cap_and_turn_settings_are_read_and_checked(no_settings, monkeypatch):
    assert limits.max_new_tokens() == 512 and limits.turn_s() == 0.5
    monkeypatch.setenv(limits.ENV_TOKENS, "64")
    monkeypatch.setenv(limits.ENV_TURN, "0")
    assert limits.max_new_tokens() == 64 and limits.turn_s() == 0.0
    for bad in ("lots", "0", "100000"):
        monkeypatch.setenv(limits.ENV_TOKENS, bad)
        with pytest.raises(ValueError, match=limits.ENV_TOKENS):
            limits.max_new_tokens()
    monkeypatch.setenv(limits.ENV_TURN, "-1")
    with pytest.raises(ValueError, match=limits.ENV_TURN):
        limits.turn_s()


def test_a_run_above_the_cap_is_refused_before_any_work(no_settings, monkeypatch):
    monkeypatch.setattr(app.runs, "target", lambda *a: pytest.fail("the model was asked for"))
    with pytest.raises(UserError, match=f"513 new tokens.*at most 512.*{limits.ENV_TOKENS}"):
        runs.start(Settings(drafter="none", prompt="Hi.", max_new_tokens=513))
    monkeypatch.setenv(limits.ENV_TOKENS, "8")
    with pytest.raises(UserError, match="at most 8"):
        runs.start(Settings(drafter="none", prompt="Hi.", max_new_tokens=9))


def test_the_line_is_said_in_words():
    assert turns.message(3, 11.6) == "Waiting for the model: you are 3rd in line, about 12 s"
    assert [turns.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
    assert turns.message(1, 0.1).endswith("about 1 s")


def test_a_hub_id_not_on_the_list_is_refused_and_nothing_is_loaded(no_settings, monkeypatch):
    asked = []
    real = app.runs.load

    def load(spec, *a, **kw):
        asked.append(spec)
        return real(spec, *a, **kw)
    monkeypatch.setattr(app.runs, "load", load)
    at = new_app(drafter="draft", draft_model=HUB_ID, max_new_tokens=4, prompt="Say hello.")
    assert any("may load on this server: `bundled`, `distilled`" in c.value for c in at.sidebar.caption)
    generate(at)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert HUB_ID in msg and limits.ENV_MODELS in msg and "nothing was loaded" in msg
    assert "Traceback" not in msg and "run" not in at.session_state
    assert HUB_ID not in asked
    # the session keeps working, and its turn at the model was given back
    at.selectbox(key="drafter").set_value("lookup").run()
    generate(at)
    assert not at.error and at.session_state.run.status == "done"
    assert not turns.gate().busy() and turns.gate().waiting() == 0


def test_the_sidebar_and_a_measurement_page_clamp_to_the_cap(no_settings, monkeypatch):
    monkeypatch.setenv(limits.ENV_TOKENS, "16")
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    w = at.number_input(key="max_new_tokens")
    assert w.value == 16                      # the default 48 clamped
    assert any("48 new tokens is more than this server allows per run (16)" in x.value
               and limits.ENV_TOKENS in x.value for x in at.sidebar.warning)
    at.number_input(key="max_new_tokens").set_value(100000).run()   # typed: clamped, and said, never silent
    assert at.number_input(key="max_new_tokens").value == 16
    said = " ".join(x.value for x in at.sidebar.warning)
    assert "100000" in said and "using 16" in said
    at.switch_page("../pages/temperature.py").run()
    assert not at.exception
    w = at.number_input(key="temp_max_new")
    assert w.max == 16 and w.value == 16      # the page's default 32 clamped
    assert any("32 new tokens" in x.value for x in at.main.warning)
