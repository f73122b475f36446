"""The sidebar shared by every page: prompt (free text or a workload preset), drafter, draft model, k,
temperature, top-p, seed and max new tokens. Values live in st.session_state under fixed keys, so they
survive page switches, and each browser tab has its own."""
from __future__ import annotations

import streamlit as st

from specdec_core import drafters
from specdec_core.drafters.registry import WEIGHTS
from specdec_core.sampling import MAX_TEMPERATURE
from specdec_core.bench.workloads import WORKLOADS

from . import limits
from . import runs
from .runs import BUNDLED, FORWARDS, Settings

CUSTOM = "custom"
# batch serving is a throughput story; a one-request demo cannot show it
PRESETS = {n: w for n, w in WORKLOADS.items() if n != "batch" and w.prompts}
DEFAULT_WORKLOAD = "extraction"
# the prompt when a link names no preset and no text
FALLBACK_PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox"

# key -> (lo, hi): the numeric controls' ranges, which a value put into st.session_state (a link, a scene,
# code) must also keep, since a widget given a value outside its range silently falls back to its minimum
BOUNDS = {"k": (1, 12), "temperature": (0.0, min(2.0, MAX_TEMPERATURE)), "top_p": (0.05, 1.0),
          "seed": (0, 2**31 - 1), "max_new_tokens": (1, 512)}
def _ships() -> bool:
    """Whether the distilled draft's weights ship (they are trained for the bundled target, the app's)."""
    stem = drafters.entry("draft").weights
    return bool(stem) and (WEIGHTS / f"{stem}.safetensors").exists()


# the draft model the `draft` drafter starts on: the small one distilled for the bundled target where it ships
# (the target drafting for itself accepts everything at T = 0 and is slower than plain decoding)
DEFAULTS = dict(drafter="lookup", draft_model=drafters.DISTILLED if _ships() else BUNDLED, k=3, top_p=1.0, seed=0,
                max_new_tokens=48,
                workload=DEFAULT_WORKLOAD, example=0, forward="ours", k_policy="fixed", draft_sampling="sample",
                weights="auto")
K_POLICIES = {"fixed": "fixed k", "schedule": "schedule (adaptive)", "confidence": "stop when unsure"}
DRAFTING = {"sample": "sampled", "greedy": "greedy"}


def init_state() -> None:
    ss = st.session_state
    for key, val in DEFAULTS.items():
        ss.setdefault(key, val)
    if "prompt" not in ss:
        w = PRESETS.get(ss.workload)
        ss.prompt = w.prompts[0] if w else FALLBACK_PROMPT
        ss.temperature = float(w.temperature) if w else 0.0
    ss.setdefault("temperature", 0.0)


def clamp() -> list[str]:
    """Bring every numeric control's value into its range (and to its type) before the widgets are drawn;
    what was changed, in words."""
    ss, said = st.session_state, []
    for key, (lo, hi) in BOUNDS.items():
        raw, typ = ss.get(key), type(lo)
        try:
            val = typ(raw)
            if val != val:  # NaN
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            ss[key] = typ(DEFAULTS.get(key, lo))
            said.append(f"{key} = {raw!r} is not a number: set to {ss[key]}")
            continue
        if not lo <= val <= hi:
            ss[key] = min(max(val, lo), hi)
            said.append(f"{key} = {raw!r} is outside its range {lo}..{hi}: set to {ss[key]}")
        elif type(raw) is not typ:
            ss[key] = val
    if ss.get("drafter") not in drafters.NAMES:
        said.append(f"drafter {ss.get('drafter')!r} is not one of {', '.join(drafters.NAMES)}: set to "
                    f"{DEFAULTS['drafter']}")
        ss.drafter = DEFAULTS["drafter"]
    if not isinstance(ss.get("prompt"), str):
        ss.prompt, ss.workload = "", CUSTOM
    if ss.get("weights") not in ("auto", *runs.available()):   # a link from a machine that runs other formats
        said.append(f"weights {ss.get('weights')!r} do not run here: set to auto")
        ss.weights = "auto"
    if not isinstance(ss.get("draft_model"), str):
        ss.draft_model = ""
    return said


def load_preset(name: str, example: int = 0) -> None:
    """Put a workload's prompt and suggested temperature into the controls (a callback: before widgets)."""
    ss = st.session_state
    w = PRESETS.get(name)
    ss.workload = name if w else CUSTOM
    if w:
        ss.example = max(0, min(example, len(w.prompts) - 1))
        ss.prompt = w.prompts[ss.example]
        ss.temperature = float(w.temperature)


def _on_workload() -> None:
    load_preset(st.session_state.workload, 0)


def _on_example() -> None:
    w = PRESETS.get(st.session_state.workload)
    if w:
        st.session_state.prompt = w.prompts[st.session_state.example]


def _on_prompt_edit() -> None:
    w = PRESETS.get(st.session_state.workload)
    if w and st.session_state.prompt != w.prompts[st.session_state.example]:
        st.session_state.workload = CUSTOM


def build() -> None:
    """The sidebar's controls, once per script run (main.py); pages read the settings with `current()`."""
    init_state()
    ss = st.session_state
    sb = st.sidebar
    for said in clamp():
        sb.warning(f"{said}.", icon=":material/warning:")
    sb.markdown("### Prompt")
    names = [CUSTOM] + list(PRESETS)
    sb.selectbox("Workload preset", names, key="workload", on_change=_on_workload,
                 format_func=lambda n: "Your own text" if n == CUSTOM else
                 f"{PRESETS[n].label} · expected benefit: {PRESETS[n].expected}",
                 help="Each preset loads a prompt from one of the lesson's workloads and its usual temperature.")
    w = PRESETS.get(ss.workload)
    if w:
        if ss.example >= len(w.prompts):
            ss.example = 0
        sb.selectbox("Example", list(range(len(w.prompts))), key="example", on_change=_on_example,
                     format_func=lambda i: f"{i + 1}. {w.prompts[i][:60]}…" if len(w.prompts[i]) > 60
                     else f"{i + 1}. {w.prompts[i]}")
        sb.caption(f"Why: {w.why}.")
    sb.text_area("Prompt text", key="prompt", height=140, on_change=_on_prompt_edit,
                 help="Sent to the model through its chat template, as a user message.")

    sb.markdown("### Drafter")
    sb.selectbox("Drafter", list(drafters.NAMES), key="drafter",
                 format_func=lambda n: n if drafters.entry(n).drafts else f"{n}: plain decoding")
    sb.caption(drafters.DESCRIPTIONS.get(ss.drafter, ""))
    e = drafters.entry(ss.drafter)
    sb.text_input("Draft model", key="draft_model", disabled=not e.draft_model,
                  help="For the `draft` drafter: `distilled` (the default where it ships) uses the small draft "
                       "trained for the bundled target; `bundled` lets the target draft for itself (at "
                       "temperature 0 every draft is accepted, and every draft costs a full target pass); "
                       "or a local model directory / hub id with the same vocabulary. This server lets a visitor "
                       f"load: {limits.described()} (setting `{limits.ENV_MODELS}`).")
    if e.draft_model:
        sb.caption(f"Draft models a visitor may load on this server: {limits.described()}.")
    sb.slider("k: tokens drafted per step", *BOUNDS["k"], key="k", disabled=not e.drafts,
              help="The verify pass scores the pending token and k drafts. On a CPU with AMX our forward "
                   "multiplies rows in blocks of 4, so k = 3, 7 or 11 fill their block and one draft more costs a "
                   "whole block; without matrix units every row costs its own share (the Draft length k page "
                   "says which this machine does).")
    sb.selectbox("Draft length", list(K_POLICIES), key="k_policy", format_func=K_POLICIES.get,
                 disabled=not e.drafts,
                 help="Fixed: k every step. Schedule: start at k, +2 after a fully accepted draft, −1 otherwise "
                      "(transformers' heuristic). Confidence: a model draft stops guessing when its top probability "
                      "falls under 0.4, k being the most. None of them changes the output.")
    sb.radio("Draft guesses (model drafts, T > 0)", list(DRAFTING), key="draft_sampling", format_func=DRAFTING.get,
             horizontal=True, disabled=not e.reports_q,
             help="Sampled: the guess is drawn from the draft's q and kept with probability min(1, p/q). Greedy: "
                  "the draft's most likely token, q one-hot, kept with probability p(x), as serving engines do by "
                  "default. Both are exact.")

    sb.markdown("### Sampling")
    sb.slider("Temperature", *BOUNDS["temperature"], step=0.05, key="temperature",
              help="0 is greedy: the target always takes its most likely token.")
    sb.slider("Top-p", *BOUNDS["top_p"], step=0.05, key="top_p", help="1 keeps the whole distribution.")
    try:
        cap = limits.max_new_tokens()
    except ValueError as e:   # the operator's setting is malformed: say so, keep the default
        sb.error(f"{str(e)[:1].upper()}{str(e)[1:]}; using {limits.DEFAULT_TOKENS}.")
        cap = limits.DEFAULT_TOKENS
    cap = min(cap, BOUNDS["max_new_tokens"][1])
    if int(ss.max_new_tokens) > cap:   # typed, from a link or an older session: clamped, and said, before it draws
        sb.warning(limits.cap_note(int(ss.max_new_tokens), cap), icon=":material/warning:")
        ss.max_new_tokens = cap
    c1, c2 = sb.columns(2)
    c1.number_input("Seed", *BOUNDS["seed"], step=1, key="seed")
    # no max_value: the widget would refuse a larger number silently (a red box, the old value kept); the clamp
    # above says what it does instead
    c2.number_input("Max new tokens", BOUNDS["max_new_tokens"][0], None, step=8, key="max_new_tokens",
                    help=f"At most {cap} on this server (setting `{limits.ENV_TOKENS}`).")

    sb.markdown("### Numerics")
    sb.radio("Forward", list(FORWARDS), key="forward", format_func=FORWARDS.get, horizontal=True,
             help="Ours scores a position bit for bit the same whether alone, in a verify step or in a batch, "
                  "so greedy speculation gives exactly plain decoding's tokens. Transformers' forward (the "
                  "reference) rounds a many-token pass differently: on a near-tie its speculative output can "
                  "drift. The Output contract page shows both.")
    sb.selectbox("Weights", ["auto", *runs.available()], key="weights", format_func=runs.WEIGHTS.get,
                 help="The target's weight format. Auto: the one in which an 8-token verify pass costs at most "
                      "1.35× one token's pass here, the quickest of those (measured when the model loads, never "
                      "read from the CPU's name). Lighter weights make plain decoding faster and can spend the "
                      "spare arithmetic speculation lives on: the Headroom page measures each. Every format "
                      "keeps the output contract within itself.")
    runs.say_weights(sb.empty())


def current() -> Settings:
    ss = st.session_state
    return Settings(drafter=ss.drafter, draft_model=ss.draft_model, k=int(ss.k),
                    temperature=float(ss.temperature), top_p=float(ss.top_p), seed=int(ss.seed),
                    max_new_tokens=int(ss.max_new_tokens), prompt=ss.prompt,
                    k_policy=ss.k_policy if ss.k_policy in K_POLICIES else "fixed",
                    draft_sampling=ss.draft_sampling if ss.draft_sampling in DRAFTING else "sample")
