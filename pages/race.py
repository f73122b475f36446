"""Race: the same prompt decoded plainly and speculatively, side by side, with the clock and the target's
forward passes counted. The two runs are measured one after the other on this machine (running them at
once would make them share the CPU), then replayed together on one clock."""
import dataclasses
import time

import streamlit as st

from app import play, runs, sidebar, turns, view
from specdec_core import drafters, engine
from specdec_core.bench import sweeps

SPEEDS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
REPLAY_S = 10.0  # the default replay speed is the slowest that finishes within this
TICK_S = 0.1

ss = st.session_state
ss.setdefault("race_speed", 0.25)

st.title("Race: plain vs speculative decoding")
st.markdown(
    "Both runs decode the **same prompt** with the **same settings**; the only difference is the drafter. "
    "Every forward pass of the big target model costs about the same, so the fewer passes, the sooner "
    "the text is done. They are measured one after the other, then replayed here on a shared clock.")

s = sidebar.current()
plain_s = dataclasses.replace(s, drafter=drafters.PLAIN)
c1, c2 = st.columns([1, 4], vertical_alignment="center")
clicked = c1.button("Start the race", type="primary", key="race", icon=":material/sports_score:")
c2.caption(s.summary())
holder, slot = play.slots()
NONE_NOTE = None
if not drafters.entry(s.drafter).drafts:
    NONE_NOTE = ("The drafter in the sidebar is `none`, so both lanes are plain decoding. Pick `lookup` or "
                 "`draft` to see speculation win (or lose).")

LANES = (("race_plain", "Plain decoding", "the target alone, one token per forward pass"),
         ("race_spec", "Speculative decoding", None))


def again(plain: runs.Run, spec: runs.Run, col) -> dict:
    """The race is one pair; the quoted speedup follows the measuring rule of every measurement page
    (sweeps.ratios): more pairs back to back, order alternating, the median ratio with its spread."""
    tgt = runs.target()
    ids, n = plain.prompt_ids, int(s.max_new_tokens)
    lanes = {"none": (drafters.make(drafters.PLAIN, tgt), 0), "spec": (runs.make_drafter(s, tgt), int(s.k))}
    tps = {"none": [plain.metrics.tokens_per_s], "spec": [spec.metrics.tokens_per_s]}
    prog = col.progress(0.0, text="Timing the pair again, so the speedup is a median…")
    with turns.hold(turns.shown(prog)) as turn:   # the shared model, one turn at a time (app/turns.py)
        for r in range(1, sweeps.REPEATS):
            for name in (["spec", "none"] if r % 2 else ["none", "spec"]):
                d, k = lanes[name]
                m = engine.run(tgt, d, ids, sp=s.sampling(), k=k, max_new_tokens=n, detail=False)[2]
                tps[name].append(m.tokens_per_s)
            prog.progress(r / (sweeps.REPEATS - 1), text=f"Timed {r + 1} of {sweeps.REPEATS} pairs")
            turn.spell()   # between pairs (never inside one) others may take a turn
    return sweeps.ratios(tps["spec"], tps["none"])


def race() -> None:
    ss.pop("race_error", None)
    ss.pop("race_timing", None)
    try:  # validate both lanes before either starts
        plain, plain_records = runs.start(plain_s)
        spec, spec_records = runs.start(s)
    except Exception as e:
        ss.race_error = runs.friendly(e)
        return
    ss.race_plain, ss.race_spec = plain, spec
    box = holder.container()
    if spec.note:  # both lanes read the same prompt: one note for the two
        box.info(spec.note, icon=":material/hourglass_top:")
    cols = box.columns(2)
    for col, run, records, name in ((cols[0], plain, plain_records, "plain"),
                                    (cols[1], spec, spec_records, "speculative")):
        with col:
            prog = st.progress(0.0, text=f"Decoding {name}…")
            live = st.empty()
        try:
            play.stream(run, records, prog, live, lambda rec: f"{name}: {rec.n_generated} tokens, "
                        f"{rec.target_forwards} target passes, {rec.elapsed:.2f} s")
        except Exception as e:
            ss.race_error = runs.friendly(e)
            return
    if plain.status == spec.status == "done":
        ss.race_timing = again(plain, spec, cols[1])
    holder.empty()
    end = max(plain.records[-1].elapsed, spec.records[-1].elapsed)
    ss.race_speed = next((x for x in SPEEDS if end / x <= REPLAY_S), SPEEDS[-1])
    ss.race_playing, ss.race_clock = True, time.monotonic()


notices = play.begin(clicked, race, "race_error", slot)
if NONE_NOTE:
    notices.info(NONE_NOTE)

plain, spec = ss.get("race_plain"), ss.get("race_spec")
if not (plain and spec and plain.records and spec.records):
    if not ss.get("race_error"):
        notices.info("Press **Start the race**.")
    st.stop()
if "stopped" in (plain.status, spec.status):
    notices.warning("The race was interrupted before both runs finished; showing what was decoded.", icon=":material/stop_circle:")

end_s = max(plain.records[-1].elapsed, spec.records[-1].elapsed)


def _replay():
    ss.race_playing, ss.race_clock = True, time.monotonic()


def _finish():
    ss.race_playing = False


def tick() -> float | None:
    return TICK_S if ss.get("race_playing") else None


def board():
    playing = bool(ss.get("race_playing"))
    t = (time.monotonic() - ss.race_clock) * float(ss.race_speed) if playing else end_s
    done = t >= end_s
    b = st.columns([1, 1, 2, 4], vertical_alignment="center")
    b[0].button("Replay", key="race_replay", icon=":material/replay:", on_click=_replay)
    b[1].button("Finish", key="race_finish", icon=":material/last_page:", on_click=_finish)
    b[2].select_slider("Replay speed", SPEEDS, key="race_speed", format_func=lambda x: f"{x:g}×")
    b[3].markdown(f"### :material/timer: {min(t, end_s):.2f} s")

    cols = st.columns(2, gap="large")
    for col, (key, title, sub) in zip(cols, LANES):
        run = ss[key]
        shown = [r for r in run.records if r.elapsed <= t]
        last = shown[-1] if shown else None
        finished = last is run.records[-1]
        with col:
            name = sub or f"drafter `{run.settings.drafter}`" + (f", k = {run.settings.k}"
                                                                 if drafters.entry(run.settings.drafter).drafts else "")
            st.subheader((":material/trophy: " if finished and last.elapsed == min(plain.records[-1].elapsed,
                                                                      spec.records[-1].elapsed) else "") + title)
            st.caption(name)
            m = st.columns(3)
            m[0].metric("Time", f"{(last.elapsed if finished else t):.2f} s")
            m[1].metric("Tokens", last.n_generated if last else 0)
            m[2].metric("Target forward passes", last.target_forwards if last else 0)
            st.progress(min(1.0, (last.n_generated if last else 0) / run.settings.max_new_tokens))
            st.html(view.text_so_far(shown, len(shown) - 1) if shown else
                    '<div class="strip text-so-far"><i>reading the prompt…</i></div>')
    st.html(view.legend())
    if done:
        p, q = plain.metrics, spec.metrics
        same = [c.token for r in plain.records for c in r.committed] == \
               [c.token for r in spec.records for c in r.committed]
        tm = ss.get("race_timing") or sweeps.ratios([q.tokens_per_s], [p.tokens_per_s])
        spread = (f" (median of {tm['repeats']} back-to-back pairs; {tm['speedup_min']:.2f}×–"
                  f"{tm['speedup_max']:.2f}× between them" + ("; **noisy: rerun**, the machine was busy"
                                                               if tm["noisy"] else "") + ")"
                  if tm["repeats"] > 1 else " (one pair: a busy machine can move it)")
        st.success(
            f"Speculative decoding: **{tm['tokens_per_s']:.1f} tokens/s** against **{tm['baseline_tokens_per_s']:.1f}**"
            f" plain, a speedup of **{tm['speedup']:.2f}×**{spread}, using {q.target_forwards} target forward "
            f"passes instead of {p.target_forwards}. Acceptance rate {q.acceptance_rate:.0%}, "
            f"{q.mean_acceptance_length:.2f} tokens per step."
            + (" Both texts are identical, as they must be at temperature 0." if same and s.temperature == 0
               else ""))
        if not same and s.temperature == 0:
            st.info("At temperature 0 the two texts differ: a near-tie between two tokens was broken differently "
                    "by rounding in a one-token and a many-token forward pass (bf16 arithmetic), after which "
                    "the texts go their own ways. The rule itself is exact.")
        ss.race_playing = False


play.autoplay(board, tick)
