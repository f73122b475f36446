"""Decode live, then replay: the loop the Step by step and Race pages share.

A run streams its records into st.session_state under a progress bar and the text so far; the replay is
then drawn inside an st.fragment, so play, pause, step and scrub rerun only the fragment, never the
generation above it.
"""
from __future__ import annotations

import time
from typing import Callable

import streamlit as st

from specdec_core.records import StepRecord
from specdec_core.serving.gate import Gated

from . import runs, turns, view

# Redraw the live text at most this often: every redraw is work for the server and the browser, and on a small
# machine that work lands between the decoder's phases and inflates the very step times the pages show.
REDRAW_S = 0.5


def slots():
    """(live view, notices slot): drawn on every run, so the replay fragment after them keeps its place."""
    return st.empty(), st.empty()


def stream(run: runs.Run, records: Gated, prog, live, label: Callable[[StepRecord], str]) -> None:
    """Append each record to the run as it is decoded, moving `prog` and redrawing the text in `live`.
    While the run waits for its turn at the shared model, `prog` says its place in line.
    On an error the run is marked stopped (its steps so far stay replayable) and the error goes on up;
    however the loop ends (a Stop or rerun included), the records are closed, giving the model's turn back."""
    def waiting(place: int, eta: float) -> None:
        done = run.records[-1].n_generated / run.settings.max_new_tokens if run.records else 0.0
        prog.progress(min(1.0, done), text=turns.message(place, eta) + "…")
    records.on_wait = waiting
    drawn = 0.0
    try:
        for rec in records:
            run.records.append(rec)
            if rec.done or time.perf_counter() - drawn >= REDRAW_S:
                prog.progress(min(1.0, rec.n_generated / run.settings.max_new_tokens), text=label(rec))
                live.html(view.text_so_far(run.records, len(run.records) - 1))
                drawn = time.perf_counter()
    except Exception:
        run.status = "stopped"
        raise
    finally:
        records.close()
    run.status = "done"


def begin(clicked: bool, generate: Callable[[], None], error: str, notices):
    """Generate on a click; otherwise load the model now, so the first click is quick. Then show the
    page's error (kept in st.session_state[error]) if there is one. Returns the container for the page's
    notices.

    On a click the notices slot is emptied first: what it said before ("press Generate") would otherwise stay
    on the page, faded, under the live run until the script ends."""
    ss = st.session_state
    if clicked:
        notices.empty()
        generate()
    elif (problem := runs.warm()) is not None:
        ss[error] = problem
    box = notices.container()
    if ss.get(error):
        box.error(ss[error], icon=":material/error:")
    return box


def autoplay(body: Callable[[], None], every: Callable[[], float | None]) -> None:
    """Draw `body` in a fragment that reruns every `every()` seconds (None: only when touched).

    A fragment's run_every is fixed when the page draws it, so when `every()` changes (play, pause, a new
    speed, the end reached), before or after `body`, the whole page reruns to redraw it with the new one."""
    interval = every()

    @st.fragment(run_every=interval)
    def replay():
        if every() == interval:
            body()
        if every() != interval:
            st.rerun()

    replay()
