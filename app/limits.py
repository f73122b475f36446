"""Operator settings for a shared server (a classroom on one machine): which models a visitor may load, the
most new tokens one run may ask for, and the length of a turn at the shared model (app/turns.py).

Each is read from an environment variable, else from `.streamlit/secrets.toml`, else its default:

| setting | environment | secrets.toml | default |
|---|---|---|---|
| models a visitor may load | `SPECDEC_ALLOWED_MODELS` (comma-separated; `*` = any) | `allowed_models = [...]` | the bundled set |
| most new tokens per run | `SPECDEC_MAX_NEW_TOKENS` | `max_new_tokens = 512` | 512 |
| turn at the model, seconds | `SPECDEC_TURN_S` | `turn_s = 0.5` | 0.5 |

The bundled target and its shipped draft (`bundled`, `distilled`) are always allowed: they load nothing new.
Anything else a visitor types (a hub id, a local directory) is loaded only when listed, so one visitor cannot
evict the class's cached models or fill the disk.
"""
from __future__ import annotations

import os

import streamlit as st

from specdec_core.drafters import SHIPPED
from specdec_core.engine import MAX_NEW_TOKENS

BUNDLED_SET = SHIPPED   # draft-model specs that load nothing new: always allowed
ENV_MODELS, ENV_TOKENS, ENV_TURN = "SPECDEC_ALLOWED_MODELS", "SPECDEC_MAX_NEW_TOKENS", "SPECDEC_TURN_S"
DEFAULT_TOKENS, DEFAULT_TURN_S = 512, 0.5


def _raw(env: str, key: str):
    """The environment variable if set, else the secrets.toml key, else None."""
    v = os.environ.get(env, "").strip()
    if v:
        return v
    try:
        return st.secrets.get(key) if st.secrets.load_if_toml_exists() else None
    except Exception:  # an unreadable secrets file counts as none: the defaults are the safe side
        return None


def allowed_models() -> tuple[str, ...] | None:
    """The model specs a visitor may load besides the bundled set; None = any."""
    v = _raw(ENV_MODELS, "allowed_models")
    items = [str(x) for x in v] if isinstance(v, (list, tuple)) else str(v or "").split(",")
    items = [x.strip() for x in items if x.strip()]
    return None if "*" in items else tuple(x for x in items if x not in BUNDLED_SET)


def described() -> str:
    """The allowed list in words, for the draft model field's help and for refusals."""
    extra = allowed_models()
    if extra is None:
        return "any model (`*`)"
    return ", ".join(f"`{m}`" for m in BUNDLED_SET + extra)


def refusal(spec: str) -> str | None:
    """Why a visitor may not load `spec` here (naming the setting to change), or None when allowed."""
    spec = spec.strip()
    extra = allowed_models()
    if spec in BUNDLED_SET or extra is None or spec in extra:
        return None
    return (f"The model `{spec}` is not on this server's list of models a visitor may load ({described()}), so "
            "nothing was loaded. The person running the server can allow it: add it to the environment variable "
            f"`{ENV_MODELS}` (comma-separated, `*` allows any) or to `allowed_models` in `.streamlit/secrets.toml`, "
            "then restart the app.")


def _setting(env: str, key: str, cast, lo, hi, default, what: str):
    """A numeric operator setting in [lo, hi]; unset gives `default`, a bad value a clear error naming it."""
    v = _raw(env, key)
    if v is None:
        return default
    try:
        x = cast(str(v).strip())
    except ValueError:
        x = None
    if x is None or not lo <= x <= hi:
        raise ValueError(f"the setting {env} (or {key} in secrets.toml) must be {what} in [{lo}, {hi}], got {v!r}")
    return x


def max_new_tokens() -> int:
    """The most new tokens one run may ask for; a bad setting is a clear error naming it."""
    return _setting(ENV_TOKENS, "max_new_tokens", int, 1, MAX_NEW_TOKENS, DEFAULT_TOKENS, "a whole number")


def turn_s() -> float:
    """Seconds of model work a run may do before it lets the next one in (0 = after every step)."""
    return _setting(ENV_TURN, "turn_s", float, 0, 60, DEFAULT_TURN_S, "a number of seconds")


SET_CAP = f"The person running the server sets the limit with `{ENV_TOKENS}` or `max_new_tokens` in " \
          "`.streamlit/secrets.toml`."


def cap_note(asked: int, cap: int) -> str:
    return f"{asked} new tokens is more than this server allows per run ({cap}); using {cap}. {SET_CAP}"


def over_cap(asked: int, cap: int) -> str:
    return f"{asked} new tokens is more than this server allows per run ({cap}): ask for at most {cap}. {SET_CAP}"


def tokens_input(where, label: str, lo: int, hi: int, key: str, **kw) -> int:
    """A measurement page's "new tokens" number input, capped at the operator's limit: a state value above it
    (from a link, or a crafted request) is clamped with a notice, here and in the value returned."""
    cap = max_new_tokens()
    hi = min(hi, cap)
    lo = min(lo, hi)
    asked = st.session_state.get(key)
    if asked is not None and int(asked) > hi:
        st.session_state[key] = hi
        where.warning(cap_note(int(asked), hi), icon=":material/warning:")
    val = int(where.number_input(label, lo, hi, key=key, **kw))
    if val > hi:
        where.warning(cap_note(val, hi), icon=":material/warning:")
    return min(val, hi)
