"""Every session's model work goes through one fair queue (specdec_core/serving/gate.py), made once per server
process: runs take turns at the model, round-robin, and a waiting page says its place in line and about how long.

Streamlit runs each session in its own thread; without the queue, twenty students pressing Generate at once
would run twenty decodes on two cores, each twenty times slower, in no particular order.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import streamlit as st

from specdec_core.records import StepRecord
from specdec_core.serving.gate import Gate, Gated, OnWait, Ticket

from . import limits


@st.cache_resource(show_spinner=False)
def gate() -> Gate:
    return Gate(turn_s=limits.turn_s())


def who() -> str:
    """The session's id (a label for the queue; each run gets its own place in line)."""
    try:
        from streamlit.runtime.scriptrunner import get_script_run_ctx
        ctx = get_script_run_ctx()
        return ctx.session_id if ctx else ""
    except Exception:
        return ""


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def message(place: int, eta: float) -> str:
    """'Waiting for the model: you are 3rd in line, about 12 s'."""
    return f"Waiting for the model: you are {ordinal(place)} in line, about {max(1, round(eta))} s"


def _unpause(rec: StepRecord, seconds: float) -> StepRecord:
    """A step record's clock runs through the time queued between steps and the time the page spent drawing
    between them: take that time off, so a run read live times as the decoder ran."""
    return dataclasses.replace(rec, elapsed=rec.elapsed - seconds)


def queued(records: Iterable[StepRecord], on_wait: OnWait = None) -> Gated:
    """A stream of step records, each made while holding a turn at the model; set `.on_wait` to show the wait."""
    return Gated(gate(), records, who=who(), on_wait=on_wait, shift=_unpause, last=lambda rec: rec.done)


@contextmanager
def hold(on_wait: OnWait = None) -> Iterator[Ticket]:
    """Hold a turn at the model for a block of work (`ticket.spell()` at safe points lets others in)."""
    with gate().hold(who(), on_wait) as t:
        yield t


def shown(bar) -> Callable[[int, float], None]:
    """on_wait for an st.progress bar: its text says the place in line and the wait."""
    return lambda place, eta: bar.progress(0.0, text=message(place, eta) + "…")
