"""Race: the same prompt decoded plainly and speculatively, side by side, with the clock and the target's
forward passes counted. The two runs are measured one after the other on this machine (running them at
once would make them share the CPU), then more pairs back to back (app/pairs.py, the measuring rule), and the
median pair is replayed together on one clock, so the lanes show the pair the verdict quotes; below them,
where the time went and TTFT/TPOT with speculation on and off."""
import dataclasses
import time

import streamlit as st

import pandas as pd

from app import captions, costs, pairs, play, runs, sidebar, view
from specdec_core import drafters
from specdec_core.bench import sweeps

SPEEDS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
REPLAY_S = 10.0  # the default replay speed is the slowest that finishes within this
TICK_S = 0.1

ss = st.session_state
ss.setdefault("race_speed", 0.25)

st.title("Race: plain vs speculative decoding")
st.markdown(
    "Both runs decode the **same prompt** with the **same settings**; the only difference is the drafter. "
    "The speculative run's target passes each score the pending token and the guesses together: such a pass "
    "costs more than a one-token pass (how much more on this machine: *Where the time went*, under the "
    "result), but far less than scoring the tokens one by one, so fewer passes can finish the text sooner. "
    "They are measured one after the other, then replayed here on a shared clock.")

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


def race() -> None:
    for key in ("race_error", "race_timing", "race_pair"):
        ss.pop(key, None)
    try:  # validate both lanes before either starts
        plain, plain_records = runs.start(plain_s)
        spec, spec_records = runs.start(s)
    except Exception as e:   # and no older race stays on the page under the error
        ss.race_error = runs.friendly(e)
        ss.pop("race_plain", None)
        ss.pop("race_spec", None)
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
            play.stream(run, records, prog, live, lambda rec: f"{name}: "
                        f"{captions.count(rec.n_generated, 'token')}, "
                        f"{captions.count(rec.target_forwards, 'target pass', 'target passes')}, "
                        f"{rec.elapsed:.2f} s")
        except Exception as e:
            ss.race_error = runs.friendly(e)
            return
    if plain.status == spec.status == "done":
        prog = cols[1].progress(0.0, text="Timing the pair again, so the speedup is a median…")
        t = pairs.time_pairs(s, plain, spec, prog)
        ss.race_timing, ss.race_pair = t.timing, (t.median, len(t.plain))
        ss.race_plain, ss.race_spec = plain, spec = t.plain[t.median], t.spec[t.median]
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
if (old := runs.stale(spec.settings, s, "The race below")):
    notices.warning(old, icon=":material/history:")
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

    pair = ss.get("race_pair")
    if pair and pair[1] > 1:
        st.caption(f"The lanes replay pair {pair[0] + 1} of the {pair[1]} timed back to back: the median pair, the "
                   "one the verdict below quotes.")
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
        p, q, greedy = plain.metrics, spec.metrics, spec.settings.temperature == 0
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
            f"mean acceptance length {q.mean_acceptance_length:.2f} tokens per step."
            + (" Both texts are identical, as they must be at temperature 0." if same and greedy else ""))
        if not same and greedy:
            st.info("At temperature 0 the two texts differ: a near-tie between two tokens was broken differently "
                    "by rounding in a one-token and a many-token forward pass (bf16 arithmetic), after which "
                    "the texts go their own ways. The rule itself is exact.")
        st.markdown("##### Where the time went")
        costs.render(spec.records, costs.split(plain.records), "This pair: a step and a token, plain against "
                     "speculative", "race_costs", q.acceptance_rate if q.drafted else None)
        st.dataframe(pd.DataFrame(costs.ttft_tpot(q, p)).set_index(""), key="race_ttft",
                     column_config={c: st.column_config.NumberColumn(format="%.1f")
                                    for c in ("TTFT ms", "TPOT ms", "tokens/s")})
        st.caption("TTFT: time to the first token (the prompt's reading included). TPOT: time per output token "
                   "after it. Both from the replayed pair. " + costs.ttft_note(q, p, spec.settings.drafter))
        ss.race_playing = False


play.autoplay(board, tick)
