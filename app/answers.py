"""The room's answers to the walkthrough's check-yourself questions: every session's choice is counted, anonymously,
in one `Room` per server process (specdec_core/serving/room.py, behind st.cache_resource), and the presenter sees
the counts per option, live, with buttons to reset them and to reveal the answer to every page.

A student's page works as it did alone: it shows that student's own feedback and never another session's choice;
once the answer is revealed, a page whose question is still unanswered shows it too. Each session votes under a
random id kept in its own session state. The counts live in the server's memory: a restart loses them, and the
presenter's view says so.
"""
from __future__ import annotations

import textwrap
import time
import uuid

import plotly.graph_objects as go
import streamlit as st

from specdec_core.serving.room import Room

PRESENTER_EVERY_S = 2   # the presenter's counts follow the room this closely
STUDENT_EVERY_S = 5     # and a student's page notices a reveal or a reset within this
VOTER = "_room_voter"
ROUNDS = "_room_rounds"   # question -> the room's round this page last drew (a reset starts a new one)
NEUTRAL, RIGHT, OTHER = "#1565c0", "#00c853", "#bdbdbd"


@st.cache_resource(show_spinner=False)
def room() -> Room:
    """The one room of this server process, shared by every session."""
    return Room()


def voter() -> str:
    """This session's opaque voter id (random, made on its first answer)."""
    ss = st.session_state
    if VOTER not in ss:
        ss[VOTER] = uuid.uuid4().hex
    return ss[VOTER]


def presenting() -> bool:
    return bool(st.session_state.get("presenter"))


def widget_key(key: str) -> str:
    return f"wt_quiz_{key}"


def _record(key: str, options: list[str]) -> None:
    """on_change of a question's radio: the session's vote follows its choice (the presenter's is not counted)."""
    st.session_state.setdefault(ROUNDS, {})[key] = room().round(key)
    if presenting():
        return
    ans = st.session_state.get(widget_key(key))
    if ans is None:
        room().withdraw(key, voter())
    else:
        room().answer(key, voter(), options.index(ans), len(options))


def _follow_resets(key: str) -> None:
    """A choice made before the presenter reset the question is cleared, so the page asks afresh."""
    rounds = st.session_state.setdefault(ROUNDS, {})
    now = room().round(key)
    if rounds.get(key, now) != now:
        st.session_state[widget_key(key)] = None
    rounds[key] = now


def question(key: str, question: str, options: list[str], right: int, why: str) -> None:
    """A check-yourself question, counted in the room; live (a fragment that reruns on its own) so a reveal, a
    reset or, for the presenter, a new vote shows without a click."""
    every = PRESENTER_EVERY_S if presenting() else STUDENT_EVERY_S
    st.fragment(_question, run_every=every)(key, question, options, right, why)


def _question(key: str, question: str, options: list[str], right: int, why: str) -> None:
    _follow_resets(key)
    ans = st.radio(question, options, index=None, key=widget_key(key), on_change=_record, args=(key, options))
    revealed = room().revealed(key)
    if ans is None:
        if revealed:
            st.info(f"The answer, revealed to the room: “{options[right]}”. {why}", icon=":material/campaign:")
    elif ans == options[right]:
        st.success(f"Right. {why}")
    else:
        st.error(f"Not quite: the answer is “{options[right]}”. {why}")
    if presenting():
        panel(key, options, right)


def chart(counts: list[int], options: list[str], right: int | None) -> go.Figure:
    """Counts per option as horizontal bars, options top to bottom; `right` (once revealed) is drawn green and the
    others grey, else every bar has one colour, so the chart gives nothing away before the reveal."""
    labels = ["<br>".join(textwrap.wrap(o, 42)) for o in options]
    colours = [NEUTRAL] * len(options) if right is None else \
        [RIGHT if i == right else OTHER for i in range(len(options))]
    fig = go.Figure(go.Bar(x=counts, y=labels, orientation="h", marker_color=colours, text=counts,
                           textposition="outside", textfont=dict(size=22, color="#000000"), cliponaxis=False,
                           hovertemplate="%{x}<extra></extra>"))
    big = dict(size=18, color="#000000")   # read from the back of a room
    fig.update_layout(height=90 + 70 * len(options), margin=dict(l=10, r=40, t=10, b=30), showlegend=False,
                      yaxis=dict(autorange="reversed", tickfont=big),
                      xaxis=dict(title=dict(text="sessions", font=big), tickfont=big, rangemode="tozero",
                                 dtick=1 if max(counts, default=0) <= 10 else None))
    return fig


def _toggle_reveal(key: str) -> None:
    room().reveal(key, not room().revealed(key))


def panel(key: str, options: list[str], right: int) -> None:
    """The presenter's view of one question: the room's counts, and reveal / reset."""
    r = room()
    counts = r.counts(key, len(options))
    revealed = r.revealed(key)
    n = sum(counts)
    st.markdown(f"**The room's answers:** {n} session{'' if n == 1 else 's'} answered"
                + (" (the answer is revealed on every page)" if revealed else ""))
    st.plotly_chart(chart(counts, options, right if revealed else None), key=f"room_chart_{key}",
                    config={"displayModeBar": False, "staticPlot": True})
    row = st.container(horizontal=True)   # wraps where the presenter's large type leaves no room
    row.button("Hide the answer" if revealed else "Reveal the answer", key=f"room_reveal_{key}",
                on_click=_toggle_reveal, args=(key,), icon=":material/visibility:", type="primary")
    row.button("Reset this question", key=f"room_reset_{key}", on_click=r.reset, args=(key,),
                icon=":material/restart_alt:", help="Forget its votes and hide its answer: students answer afresh.")
    row.button("Reset all questions", key="room_reset_all", on_click=r.reset, icon=":material/delete_sweep:")
    since = time.strftime("%H:%M %Z", time.localtime(r.counting_since(key)))
    st.caption(f"Counts every session on this server, once each (a new answer moves its vote; a reloaded tab is a "
               f"new session), refreshed every {PRESENTER_EVERY_S} s. Kept in this server's memory since {since}: "
               "a server restart loses them. Your own choice here is not counted.")
