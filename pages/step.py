"""Step by step: run speculative decoding once, then replay every verification step (draft, verify,
result) with play, pause, step and scrub, at any speed, without running the model again."""
import time

import streamlit as st

from app import captions, costs, frames, play, runs, sidebar, step_panels, turns, view
from specdec_core import drafters
from specdec_core.metrics import summarize

BASE_S = 0.9  # seconds per frame at 1x
SPEEDS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]

ss = st.session_state
ss.setdefault("speed", 1.0)

st.title("Speculative decoding, step by step")
st.markdown(
    "A small, fast **drafter** guesses a few tokens ahead; the big **target** model checks all the guesses in "
    "one forward pass and keeps the ones it agrees with. Press **Generate**, then watch each step: "
    "the guesses appear, each is tested, and the text grows.")

settings = sidebar.current()
c1, c2 = st.columns([1, 4], vertical_alignment="center")
go_clicked = c1.button("Generate", type="primary", key="generate", icon=":material/play_circle:")
c2.caption(settings.summary())
if drafters.entry(settings.drafter).session_index:
    ix = ss.get("suffix_index")
    seen = (f"{captions.count(len(ix.docs), 'run')} ({captions.count(ix.size, 'token')}) so far"
            if ix is not None and ix.docs else "nothing yet")
    st.info(f"Suffix decoding drafts from everything this session has decoded: {seen}. Press **Generate** twice "
            "on the same prompt: the second run finds the first one's text and its drafts run long.",
            icon=":material/history:")


holder, notices = play.slots()


def generate(s: runs.Settings) -> None:
    """Stream a run into this session's state, then measure the plain baseline for the speedup (and the
    plain step's cost, for where the time went)."""
    ss.pop("step_error", None)
    try:
        run, records = runs.start(s)
    except Exception as e:  # every failure becomes a message on the page, and no older replay stays under it
        ss.step_error = runs.friendly(e)
        ss.pop("run", None)
        ss.pop("step_plain", None)
        return
    ss.pop("step_plain", None)
    ss.run, ss.cursor = run, frames.Cursor()
    with holder.container(border=True):  # cleared when the run ends; the replay takes its place
        if run.note:
            st.info(run.note, icon=":material/hourglass_top:")
        prog = st.progress(0.0, text="Decoding…")
        st.button("Stop", key="stop", icon=":material/stop_circle:", help="Stop the run here; the steps made so far can still be replayed.")
        live = st.empty()
    try:
        play.stream(run, records, prog, live, lambda rec: f"Step {rec.index + 1}: {rec.n_generated} of up to "
                                                          f"{captions.count(s.max_new_tokens, 'token')}, "
                                                          f"{rec.elapsed:.1f} s")
        base = run.records
        if drafters.entry(s.drafter).drafts:
            prog.progress(1.0, text="Decoding the same prompt plainly (no drafter) to measure the speedup…")
            base = runs.baseline(s, run.prompt_ids, turns.shown(prog))
        run.baseline, ss.step_plain = summarize(base), costs.split(base)
    except Exception as e:
        ss.step_error = runs.friendly(e)
    holder.empty()
    if run.records:
        ss.cursor = frames.Cursor(playing=True)
        ss.last_tick = time.monotonic()


notices = play.begin(go_clicked, lambda: generate(settings), "step_error", notices)

run: runs.Run | None = ss.get("run")
if run is None or not run.records:
    if not ss.get("step_error"):
        notices.info("Pick a prompt and a drafter in the sidebar (or keep the defaults) and press **Generate**.")
    notices.html(view.legend())
    st.stop()

notices.caption(f"Replaying the run of: {run.settings.summary()}" + (f". {run.note}" if run.note else ""))
if run.status == "stopped":
    notices.warning(f"Stopped after {captions.count(len(run.records), 'step')} "
                    f"({captions.count(run.records[-1].n_generated, 'token')}); "
               "the steps made so far can be replayed below.", icon=":material/stop_circle:")

# ----- replay controls (callbacks change the cursor before the fragment redraws) -----
recs = run.records
ss.setdefault("cursor", frames.Cursor())


def _pause_then(fn):
    def cb():
        ss.cursor.playing = False
        fn(ss.cursor)
    return cb


def _toggle_play():
    cur = ss.cursor
    if not cur.playing and cur.at_end(recs):
        cur.step, cur.frame = 0, 0
    cur.playing = not cur.playing
    ss.last_tick = time.monotonic()


def _to_rejection(cur):
    i = frames.next_rejection(recs, cur.step)
    if i is not None:
        cur.goto(recs, i)


def _scrub():
    ss.cursor.playing = False
    ss.cursor.goto(recs, int(ss.scrub) - 1)


def interval() -> float | None:
    return BASE_S / float(ss.speed) if ss.cursor.playing else None


def player():
    cur = ss.cursor.clamp(recs)
    if cur.playing:
        now = time.monotonic()
        # a fragment also reruns when a control is touched: advance only once per tick
        if now - ss.get("last_tick", 0.0) >= 0.8 * interval():
            cur.advance(recs)
            ss.last_tick = now

    bar = st.container(horizontal=True, vertical_alignment="bottom", gap="small")
    bar.button("First", key="first", icon=":material/first_page:",
               on_click=_pause_then(lambda c: c.goto(recs, 0, whole=False)), help="The first step, from its start")
    bar.button("Back", key="back", icon=":material/skip_previous:", shortcut="PageUp",
               on_click=_pause_then(lambda c: c.goto(recs, c.step - 1)), help="The previous step, shown whole")
    bar.button("Pause" if cur.playing else "Play", key="play", shortcut="P", type="primary",
               icon=":material/pause:" if cur.playing else ":material/play_arrow:", on_click=_toggle_play,
               help="Animate phase by phase, step after step")
    bar.button("Next", key="next", icon=":material/skip_next:", shortcut="PageDown",
               on_click=_pause_then(lambda c: c.goto(recs, c.step + 1)), help="The next step, shown whole")
    bar.button("Last", key="last", icon=":material/last_page:",
               on_click=_pause_then(lambda c: c.goto(recs, len(recs) - 1)), help="The last step, shown whole")
    bar.button("Phase", key="phase_back", icon=":material/chevron_left:", shortcut="Left",
               on_click=_pause_then(lambda c: c.retreat(recs)), help="One phase back: draft, verify, result")
    bar.button("Phase", key="phase_next", icon=":material/chevron_right:", icon_position="right",
               shortcut="Right", on_click=_pause_then(lambda c: c.advance(recs)),
               help="One phase forward: draft, verify, result")
    bar.button("Next rejection", key="next_rejection", icon=":material/report:",
               on_click=_pause_then(_to_rejection), disabled=frames.next_rejection(recs, cur.step) is None,
               help="Jump to the next step where the target rejected a draft")
    row = st.columns([4, 1], gap="medium", vertical_alignment="bottom")   # "Speed" fits in presenter mode
    if len(recs) > 1:
        ss.scrub = cur.step + 1
        row[0].slider("Step", 1, len(recs), key="scrub", on_change=_scrub, help="Drag to scrub through the steps")
    row[1].select_slider("Speed", SPEEDS, key="speed", format_func=lambda x: f"{x:g}×")

    rec = recs[cur.step]
    fr = frames.frames(rec)[cur.frame]
    st.html(view.phase_pills(fr))
    st.subheader(f"Step {cur.step + 1} of {len(recs)} · {captions.phase_title(rec, fr)}")
    st.markdown(f'<div class="bigcap">{captions.caption(rec, fr, run.settings.temperature == 0)}</div>',
                unsafe_allow_html=True)

    step_panels.step_view(run.prompt_text, recs, cur.step, fr, run.settings.temperature == 0)

    st.markdown("##### The text so far")
    st.html(view.text_so_far(recs, cur.step, include_last=fr.phase == frames.RESULT))
    st.html(view.legend())
    st.caption("Hover over a token to see its probabilities.")
    step_panels.metrics(recs, cur.step, run.baseline, ss.get("step_plain"))

    if cur.at_end(recs):
        cur.playing = False


play.autoplay(player, interval)
