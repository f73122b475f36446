"""Between the pages and the engine: settings, cached models, and runs that live in one browser session.

Models sit behind st.cache_resource, loaded once per server process and shared by every tab; they hold
no per-session state (each run builds its own drafter and KV caches). A run's records live in
st.session_state, so tabs never see each other's runs. Every failure a user can cause comes back as a
plain-words message (UserError), never a traceback.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import streamlit as st
import torch

from specdec_core import LM, IncompatibleModels, InputError, ModelError, SamplingParams, engine, load
from specdec_core import clock, drafters
from specdec_core.bench import prefill_fit
from specdec_core.bench import regime as formats
from specdec_core.models import BUNDLED, FORWARDS as FORWARD_NAMES
from specdec_core.drafters.suffix import SuffixIndex
from specdec_core.metrics import RunMetrics, summarize
from specdec_core.records import StepRecord

from . import captions, limits, turns



class UserError(Exception):
    """Something the person can fix; the message is shown as is."""


@dataclass(frozen=True)
class Settings:
    drafter: str = "lookup"
    draft_model: str = BUNDLED
    k: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 48
    prompt: str = ""
    draft_sampling: str = "sample"   # how a model draft guesses at T > 0 (SamplingParams.draft_mode)
    k_policy: str = "fixed"          # draft length per step (specdec_core/policy.py)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=float(self.temperature), top_p=float(self.top_p), seed=int(self.seed),
                              draft_mode=self.draft_sampling)

    def summary(self) -> str:
        e = drafters.entry(self.drafter)
        d = self.drafter + (f" ({self.draft_model})" if e.draft_model else "")
        k = f" · k = {self.k}" if e.drafts else ""
        k += f" ({self.k_policy})" if e.policy(self.k_policy) != "fixed" else ""
        d += " · greedy drafting" if self.draft_sampling == "greedy" and e.reports_q else ""
        return (f"{d}{k} · temperature {self.temperature:g} · top-p {self.top_p:g} · seed {self.seed} · "
                f"up to {captions.count(self.max_new_tokens, 'token')}")


def stale(shown: Settings, now: Settings, what: str = "These results") -> str:
    """A line saying the results on a page were made with other settings than the sidebar's now ("" when they
    match: the prompt and every setting a run depends on)."""
    if shown == now:
        return ""
    return (f"{what} were made with other settings ({shown.summary()}"
            + ("" if shown.prompt == now.prompt else ", another prompt")
            + f"); the sidebar now says {now.summary()}. Run again to see these settings.")


@dataclass
class Run:
    """One generation in one session: the records so far and, once measured, the plain baseline."""
    settings: Settings
    prompt_ids: list[int]
    prompt_text: str = ""            # the prompt as the model sees it (chat template included)
    records: list[StepRecord] = field(default_factory=list)
    status: str = "running"          # running | done | stopped
    baseline: RunMetrics | None = None
    note: str = ""                   # said before the run starts: a long prompt's length and time
    index_from: int | None = None    # suffix decoding: the id its text takes in the session's index

    @property
    def metrics(self) -> RunMetrics | None:
        return summarize(self.records) if self.records else None


FORWARDS = dict(zip(FORWARD_NAMES, ("ours: batch-invariant", "transformers' (reference)")))   # models.FORWARDS, in words


@st.cache_resource(show_spinner="Loading the model: once per server, a few seconds (about 20 the first time on a machine)…", max_entries=6)
def _model(spec: str, fmt: str | None):
    lm = load(spec) if fmt is None else formats.load_format(fmt, spec)
    try:
        with turns.hold():   # the warm-up runs the model: in turn, like every run (and its CPU workers given back)
            engine.warm(lm)
    except Exception:   # noqa: BLE001 -- a model that cannot decode says so, in words, at its first run
        pass
    return lm


def model(spec: str, fmt: str | None = None):
    """`spec` loaded once per server and weight format (regime.FORMATS; None: models.load's own choice, which
    for the bundled model is the format it names, so both share one copy)."""
    return _model(spec, fmt or formats.default_format(spec))


WEIGHTS = {formats.AUTO: "auto (measured)", **formats.FORMATS}   # the sidebar's switch: key -> words


_DECIDED: dict = {}   # measured()'s answer once made in this server: the sidebar says it without causing a load


@st.cache_resource(show_spinner=False)
def available() -> list[str]:
    """The weight formats this machine runs the bundled target in (regime.formats), asked once per server."""
    return formats.formats()


@st.cache_resource(show_spinner="Measuring each weight format's passes: once per server…")
def measured() -> tuple[str, dict]:
    """(the format regime.choose picks, each format's Cost): every format this machine runs, loaded and timed
    once per server, in turn at the model (nothing else runs while it is timed), by the decoding thread's own CPU
    time on one thread (clock.cpu_work): the browser that opened the page is busy drawing it meanwhile. Only the
    passes are timed so; each format loads on all the threads."""
    def timed(lm: LM) -> formats.Cost:
        with clock.cpu_work():
            return formats.measure(lm)
    with turns.hold():
        _DECIDED["auto"] = out = formats.decide(lambda f: model(BUNDLED, f), available(), measure_fn=timed,
                                                default=formats.default_format())
    return out


def measured_now() -> bool:
    """Whether this server has measured the formats yet (asking in_use() before then loads every format)."""
    return bool(_DECIDED)


def say_weights(slot) -> None:
    """The sidebar's weights line into `slot`: which format runs and why once measured; before that a line
    saying when it will be, and the slot kept so that target() fills it in this same run once it has loaded."""
    if measured_now() or (weights_choice() == formats.AUTO and formats.pinned()):
        slot.caption(in_use()[1])
        return
    slot.caption("Weights: chosen when the model first loads, by timing a 1-token and an 8-token pass in each "
                 "format this machine runs.")
    st.session_state["_weights_slot"] = slot


def _said() -> None:
    slot = st.session_state.pop("_weights_slot", None)
    if slot is not None:
        try:
            slot.caption(in_use()[1])
        except Exception:   # noqa: BLE001 -- e.g. a fragment's rerun may not write outside it: the next run says it
            pass


def weights_choice() -> str:
    """The weight format the sidebar asks for (auto unless switched)."""
    w = st.session_state.get("weights", formats.AUTO)
    return w if w in WEIGHTS else formats.AUTO


def in_use() -> tuple[str, str]:
    """(the format the target runs in for this session, one line saying which and why)."""
    pick = weights_choice()
    if pick == formats.AUTO and (pin := formats.pinned()):
        return pin, f"Weights: {formats.FORMATS[pin]}, set on this server (SPECDEC_DTYPE)"
    chosen, costs = measured()
    if pick == formats.AUTO or pick not in costs:
        line = "Weights: " + formats.reason(costs, chosen, default=formats.default_format())
        if pick != formats.AUTO:
            line += f" ({WEIGHTS[pick]} does not run here)"
        return chosen, line
    line = f"Weights: {formats.reason(costs, pick)}; chosen in the sidebar"
    if pick != chosen:
        line += f" (auto would run {formats.FORMATS[chosen]})"
    return pick, line


def reference(lm: LM) -> LM:
    """The same weights run by transformers' forward: no second copy, nothing loaded."""
    return LM(lm.model, lm.tokenizer, lm.name, lm.dtype, lm.device)


def forward_choice() -> str:
    return st.session_state.get("forward", "ours")


def target(forward: str | None = None):
    """The bundled target, in the weight format this session runs (in_use) and run by the forward chosen in the
    sidebar (or `forward`)."""
    try:
        lm = model(BUNDLED, in_use()[0])
    except (ModelError, formats.FormatError) as e:
        raise UserError(f"The bundled model could not be loaded: {e}") from e
    _said()
    return reference(lm) if (forward or forward_choice()) == "hf" else lm


def warm() -> str | None:
    """Load the target as soon as a page opens, so the first Generate is quick; the error message if it fails."""
    try:
        target()
    except UserError as e:
        return str(e)
    return None


def draft_lm(s: Settings, tgt):
    """The draft model these settings name (drafters.resolve_draft resolves the spec), loaded and cached; None for
    a drafter that runs no separate draft model."""
    try:
        if not drafters.entry(s.drafter).draft_model:
            return None
        spec = (s.draft_model or "").strip()
        if spec and (why := limits.refusal(spec)) is not None:   # before anything is loaded
            raise UserError(why)
        return drafters.resolve_draft(spec, tgt, load=model)
    except ModelError as e:
        raise UserError(f"The draft model could not be loaded. {e}") from e
    except drafters.DrafterUnavailable as e:
        raise UserError(f"The drafter {s.drafter!r} cannot run: {e}") from e


def session_index() -> SuffixIndex:
    """This session's suffix index: every suffix-decoding run of the session adds its text, later ones draft from it."""
    return st.session_state.setdefault("suffix_index", SuffixIndex())


def make_drafter(s: Settings, tgt, before: int | None = None):
    """The drafter for these settings; a draft model is loaded (cached) only for a drafter that runs one. `before`:
    a session-index drafter drafts only from the runs before that one (suffix.Suffix)."""
    lm = draft_lm(s, tgt)
    kw = {}
    if drafters.entry(s.drafter).session_index:   # a later run drafts from this session's earlier ones
        kw = {"index": session_index(), "before": before}
    try:
        return drafters.make(s.drafter, tgt, draft_lm=lm, **kw)
    except IncompatibleModels as e:
        raise UserError(f"These two models cannot be paired: {e}. Speculative decoding compares p and q "
                        "token by token, so the draft must share the target's vocabulary.") from e
    except drafters.DrafterUnavailable as e:
        raise UserError(f"The drafter {s.drafter!r} cannot run: {e}") from e


def check_prompt(text: str) -> None:
    if not text or not text.strip():
        raise UserError("The prompt is empty: type some text in the sidebar or pick a preset.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # half a surrogate pair: no tokenizer can read it
        raise UserError(f"The prompt holds a character that is not text (U+{ord(text[e.start]):04X}, half of a "
                        f"surrogate pair, at character {e.start + 1}): delete it or paste the text again.") from e


LONG_PROMPT = 1000  # tokens: from here the reading of the prompt takes long enough to say so first
FIT_AT = (256, 1024)  # prompt lengths whose passes are timed to fit the reading's cost (attention grows as n²)
_RATES: dict = {}   # (model, forward) -> fit.Fit, per server


def _rate(tgt) -> "prefill_fit.Fit":
    """The cost of reading a prompt and of a step after it, on this machine, measured once per server and forward:
    a pass over each of FIT_AT's lengths, then three one-token steps after each (prefill_fit.fit)."""
    key = (id(tgt.model), tgt.forward_name)
    if key not in _RATES:
        passes, steps = [], []
        for n in FIT_AT:
            cache = tgt.new_cache()
            t0 = time.perf_counter()
            tgt.forward(torch.zeros(n, dtype=torch.long), cache, last_only=True)
            t1 = time.perf_counter()
            for _ in range(3):
                tgt.forward(torch.zeros(1, dtype=torch.long), cache, last_only=True)
            passes.append(t1 - t0)
            steps.append((time.perf_counter() - t1) / 3)
        _RATES[key] = prefill_fit.fit(FIT_AT, passes, steps)
    return _RATES[key]


def note(tgt, n_prompt: int, max_new: int, again: bool = False) -> str:
    """For a long prompt, before any work: its length, the context left, and roughly how long the run takes, from
    passes timed on this machine (prefill_fit); `again`: a plain run on the same prompt follows for the speedup."""
    if n_prompt < LONG_PROMPT:
        return ""
    f = _rate(tgt)
    read, write = f.read_s(n_prompt), max_new * f.step_s(n_prompt + max_new // 2)
    return (f"A long prompt: {n_prompt:,} tokens of the model's context of {tgt.max_len:,}. Reading it takes "
            f"roughly {read:.0f} s, then up to {max_new} new tokens about {write:.0f} s more (at most one target "
            f"pass each, slower than after a short prompt), so about {read + write:.0f} s in all for one run on "
            "this machine, from passes timed here (other work on the machine moves it)."
            + (" The plain run on the same prompt that the speedup is measured against takes about as long again "
               "(and the Race times more pairs)." if again else ""))


def start(s: Settings) -> tuple[Run, Iterator[StepRecord]]:
    """Validate everything first (so errors come before any output), then return the run and its stream."""
    check_prompt(s.prompt)
    if int(s.max_new_tokens) > (cap := limits.max_new_tokens()):
        raise UserError(limits.over_cap(int(s.max_new_tokens), cap))
    tgt = target()
    drafter = make_drafter(s, tgt)
    try:
        sp = s.sampling()
        k = drafters.entry(s.drafter).k(s.k)
        ids = tgt.encode(s.prompt).tolist()
        # decode checks k, the lengths and the context at the call, before any output; the steps come as read
        steps = engine.decode(tgt, drafter, ids, sp=sp, k=k, max_new_tokens=int(s.max_new_tokens),
                              k_policy=s.k_policy if k else "fixed")
    except InputError as e:
        raise UserError(str(e)[:1].upper() + str(e)[1:] + ".") from e
    run = Run(s, ids, tgt.tokenizer.decode(ids), note=note(tgt, len(ids), int(s.max_new_tokens), drafters.entry(s.drafter).drafts),
              index_from=session_index().next_id if drafters.entry(s.drafter).session_index else None)
    # one turn at the shared model at a time (app/turns.py); the page sets .on_wait to show the line
    return run, turns.queued(steps)


def baseline(s: Settings, prompt_ids: list[int], on_wait=None) -> list[StepRecord]:
    """Plain decoding (the `none` drafter) on the same prompt and settings: the speedup's denominator."""
    tgt = target()
    return list(turns.queued(engine.decode(tgt, drafters.make(drafters.PLAIN, tgt), prompt_ids, sp=s.sampling(), k=0,
                                           max_new_tokens=int(s.max_new_tokens)), on_wait))


def friendly(e: BaseException) -> str:
    """A message for an error no check anticipated: its kind and first line, no traceback."""
    if isinstance(e, UserError):
        return str(e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"Something went wrong ({type(e).__name__}){': ' + first if first else ''}. Try other settings."


RUN_KEYS = ("run", "race_plain", "race_spec")


def settle() -> None:
    """Called at the top of every full script run: a run still marked running was cut off by a rerun
    (the Stop button, or any control touched mid-run), so it ends there, keeping the steps it made."""
    for key in RUN_KEYS:
        r = st.session_state.get(key)
        if r is not None and r.status == "running":
            r.status = "stopped"
