"""Bad input, anywhere a visitor can type or drag, is a plain message on the page, never a traceback nor a
generic "Something went wrong"; and the same session still runs a good generation afterwards.

First `load()`'s messages for draft model names, directly (fast, no model): local paths that are not
models, hub ids off the local cache while offline or with the hub out of reach (answered in seconds, not
after a minute of retries), and the hub's own refusals. Then the app under streamlit.testing.v1.AppTest on
the real bundled model: the prompt field, the draft model field, every slider and number at its extremes
and beyond them (as a link or code could set), every drafter on the shortest prompt.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specdec_core import ModelError, load
from specdec_core.drafters import NAMES
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
