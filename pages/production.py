"""Road to production: the sidebar's settings in the serving engines' own terms, and the lesson's checklist
(fixed prompts, greedy with speculation off and on, token diff, acceptance/TTFT/TPOT/throughput against the
baseline) run here on the real model, with a report to download; then the same lesson on llama.cpp (same
model file, side by side with our engine) and the checklist against any OpenAI-compatible server."""
import dataclasses

import pandas as pd
import streamlit as st

from app import runs, sidebar, traffic_view, turns
from specdec_core import drafters
from specdec_core.bench import sweeps
from specdec_core.serving import checklist, engines, peer, remote

# our name for each metric where it differs from the engines' (vLLM's) vocabulary
OURS = {"mean acceptance length": "mean acceptance length (tokens committed per verification step)"}
st.title("Road to production")
s = sidebar.current()
st.markdown(f"Current settings: **{s.summary()}**. Change them in the sidebar; everything below follows.")

st.markdown("## 1 · The same settings in a serving engine")
st.caption("Each entry was checked against the engine's documentation (linked). Where an engine has nothing "
           "that matches one of our settings, it says so: no invented flags. Engines rename options between "
           "releases, so read the linked page for the version you run.")
try:
    table = engines.translate(s)
except ValueError as e:
    st.error(str(e))
    table = {}
tabs = st.tabs([e.title for e in table.values()]) if table else []
for tab, e in zip(tabs, table.values()):
    with tab:
        if not e.supported:
            st.warning(f"{e.title}: no equivalent for the **{s.drafter}** draft source.")
        elif not drafters.entry(s.drafter).drafts:
            st.info("Plain decoding: no speculative configuration, this is the baseline.")
        st.code(e.snippet, language="bash" if e.snippet.startswith(("llama-server", "python -m")) else "python",
                wrap_lines=True)
        st.markdown("**Our metrics, by this engine's name**")
        st.table(pd.DataFrame({"ours": [OURS.get(m, m) for m in e.metrics],
                               f"{e.title}": list(e.metrics.values())}).set_index("ours"))
        for g in e.gaps:
            st.markdown(f"- No equivalent / differs: {g}")
        st.markdown("Docs: " + " · ".join(f"[{x}]({u})" for x, u in zip(engines.link_labels(e.docs), e.docs)))

st.markdown("## 2 · The operator's checklist, run here")
st.markdown("Fix a set of prompts (the workloads' examples, or **your own traffic**: upload or paste it), decode "
            "**greedily** with the draft off and on, **diff the tokens**, then read "
            "acceptance, TTFT, TPOT and throughput against the baseline. Keep speculation only where the numbers "
            f"earn it: each prompt's two runs go back to back, {sweeps.REPEATS} times with the order alternating, "
            "and the verdict is per prompt (off where acceptance is low or the median pair is slower).")
pool = traffic_view.examples()
prompts = traffic_view.chosen()
n_tok = st.slider("New tokens per prompt", 4, 48, 24, step=4, key="ck_tokens",
                  help="Small on purpose: on a CPU each run takes seconds.")
if prompts:
    st.caption(traffic_view.estimate(runs.target(), prompts, int(n_tok)))
if not drafters.entry(s.drafter).drafts:
    st.info("Pick a drafter in the sidebar: with `none` there is nothing to compare against the baseline.")
if st.button("Run the checklist", key="run_checklist", type="primary",
             disabled=not drafters.entry(s.drafter).drafts or not prompts):
    bar = st.progress(0.0, text="Running the baseline and the speculative decoder on each prompt…")
    try:
        tgt = runs.target()
        runs.make_drafter(s, tgt)  # errors (an incompatible draft, a missing model) before any decoding
        with turns.hold(turns.shown(bar)):   # one turn at the shared model for the whole checklist
            res = checklist.run(tgt, lambda: runs.make_drafter(s, tgt), prompts, int(s.k), int(n_tok),
                                on_step=lambda i, n: bar.progress(i / n, text=f"{i} of {n} prompts"))
        # what was run: greedy, n_tok tokens (the sidebar's temperature and length do not apply here)
        st.session_state.checklist = (dataclasses.replace(s, temperature=0.0, max_new_tokens=int(n_tok)), res)
        st.session_state.checklist_for = (s, list(prompts), int(n_tok))   # what the result answers
    except Exception as e:  # every failure is a message, never a traceback
        st.error(runs.friendly(e))
    bar.empty()

done = st.session_state.get("checklist")
if done:
    ds, res = done
    then = st.session_state.get("checklist_for")
    if then and (then[0], then[1], then[2]) != (s, list(prompts), int(n_tok)):
        st.warning("This result was made for other settings or prompts than those chosen now "
                   f"({len(then[1])} prompts, {then[2]} tokens, {then[0].drafter}): press **Run the "
                   "checklist** again for these.", icon=":material/history:")
    st.markdown(f"**Result** ({ds.summary()}): {checklist.verdict(res)}")
    if len(res) <= 4:   # one column per prompt fits the page; a larger set reads better one row per prompt
        st.table(checklist.table(res, by_prompt=True))
    else:
        st.dataframe(checklist.table(res))
    st.plotly_chart(checklist.figure(res), key="ck_fig")
    if why_diff := checklist.difference_note(res):
        st.caption(why_diff)
    eng_md = engines.markdown(ds)
    c1, c2 = st.columns(2)
    c1.download_button("Download report (Markdown)", checklist.report_markdown(ds, res, eng_md),
                       file_name="specdec-checklist.md", mime="text/markdown", key="dl_md")
    # the HTML carries plotly.js (about 5 MB): built only when the button is pressed, not on every rerun
    c2.download_button("Download report (HTML with the plot)", lambda: checklist.report_html(ds, res, eng_md),
                       file_name="specdec-checklist.html", mime="text/html", key="dl_html")

st.markdown("## 3 · The same lesson on a production engine")
st.markdown("llama.cpp decodes the **same model file** from the **same prompt tokens**, greedily, plainly and with "
            "its own prompt lookup at the sidebar's k; our engine does the same beside it, with the same number "
            "of threads, the runs back to back and repeated (order alternating). Each engine's speculative text "
            "is compared with **its own** plain text: the lesson's check, on an engine people deploy.")
st.caption("Not like for like on weights: llama.cpp computes with the file's 4-bit (Q4_1) blocks, we run the same "
           "weights de-quantized to bf16, so the two engines' texts differ from each other and their speeds "
           "measure different arithmetic.")
why = peer.unavailable()
if why:
    st.info(f"llama.cpp is not installed here. Run `make peers` (installs `{peer.PEER_PACKAGE}`; it builds "
            "llama.cpp from source, about 9 minutes on 2 cores), then reload this page.")
else:
    p_tok = st.slider("New tokens per run", 16, 256, 96, step=16, key="peer_tokens",
                      help="Each engine decodes the sidebar's prompt plainly and with prompt lookup, "
                           f"{sweeps.REPEATS} times each.")
    if st.button("Compare with llama.cpp", key="run_peer", icon=":material/compare_arrows:"):
        bar = st.progress(0.0, text="Loading llama.cpp…")
        try:
            tgt = runs.target()
            total, done_n = 4 * sweeps.REPEATS, []

            def tick(what):
                done_n.append(what)
                bar.progress(len(done_n) / total, text=what)
            with turns.hold(turns.shown(bar)):   # the machine's cores, one session's measurement at a time
                k, threads, rows = peer.compare(tgt, s.prompt, s.k, p_tok, sweeps.REPEATS, tick)
            st.session_state.peer_result = (s.prompt, k, threads, rows)
        except Exception as e:  # every failure is a message, never a traceback
            st.error(runs.friendly(e))
        bar.empty()
    got = st.session_state.get("peer_result")
    if got:
        prompt, k, threads, summ = got
        st.markdown(f"Greedy, prompt lookup with k = {k} in both engines, {threads} thread(s) each, on "
                    f"*{prompt[:80]}{'…' if len(prompt) > 80 else ''}*")
        st.dataframe(pd.DataFrame([{
            "engine": x["engine"], "weights": x["weights"], "plain tokens/s": round(x["baseline_tokens_per_s"], 1),
            "prompt lookup tokens/s": round(x["tokens_per_s"], 1),
            "speedup": f"{x['speedup']:.2f}× ({x['speedup_min']:.2f}–{x['speedup_max']:.2f})"
                       + (" noisy: rerun" if x["noisy"] else ""),
            "speculative text = its plain text": "yes" if x["spec_equals_plain"] else
            "no: differs from token " + ", ".join(str(t + 1) for _, t, _ in x["first_diffs"])
            + " (character " + ", ".join(str(c + 1) for _, _, c in x["first_diffs"]) + ")"}
            for x in summ]).set_index("engine"))
        for x in summ:
            if not x["spec_equals_plain"]:
                st.warning(f"{x['engine']}: greedy decoding with speculation changed the output. The algorithm "
                           "is exact; the implementation scored a many-token verify pass differently from a "
                           "one-token pass, and a near-tie went the other way. This is what the checklist's token "
                           "diff is for.")

st.markdown("## 4 · The checklist against your server")
st.markdown("Point it at any OpenAI-compatible server (vLLM, SGLang, llama.cpp's servers): the prompts go out at "
            "temperature 0 with speculation off and on, the answers are diffed, TTFT and TPOT come from the "
            "streamed responses, and the server's own speculative-decoding counters from its Prometheus `/metrics` "
            "where it exposes them. Two servers run the pairs back to back; with one, run it, restart the server "
            "with speculation on, and run the second phase.")
e1, e2 = st.columns(2)
url_off = e1.text_input("Base URL, speculation off", "http://127.0.0.1:8000/v1", key="ep_off")
url_on = e2.text_input("Base URL, speculation on (empty: the same server, restarted)", "", key="ep_on")
e3, e4, e5 = st.columns(3)
ep_model = e3.text_input("Model name (empty: the server's first)", "", key="ep_model")
ep_tokens = e4.number_input("Max tokens", 1, 4096, 64, key="ep_tokens")
ep_timeout = e5.number_input("Timeout, seconds per wait", 1, 600, 30, key="ep_timeout")
ss = st.session_state
ss.setdefault("ep_prompts", remote.prompts_text([p for _, p in pool[:3]]))
if ss.get("ck_own"):   # your own traffic from §2, against your server
    st.button(f"Use §2's prompt set here ({len(ss.ck_own)} prompts)", key="ep_use_own",
              on_click=lambda: ss.update(ep_prompts=remote.prompts_text(ss.ck_own)))
ep_prompts = st.text_area("Prompts, one per line", key="ep_prompts",
                          height=110, help="One prompt per line; a line break inside a prompt is written `\\n` "
                                           "(a backslash `\\\\`), so a prompt with a blank line stays one prompt.")
lines = remote.parse_prompts(ep_prompts)


def _progress(bar):
    seen = []
    return lambda what: (seen.append(what), bar.progress(min(1.0, len(seen) / max(1, len(lines) * 3)), text=what))


if url_on.strip():
    if st.button("Run the checklist on both servers", key="ep_run", type="primary", disabled=not lines):
        bar = st.progress(0.0, text="Asking both servers…")
        ss.ep_report = remote.run_pair(url_off, url_on, lines, ep_model or None, None, int(ep_tokens),
                                       float(ep_timeout), None, _progress(bar))
        bar.empty()
else:
    b1, b2 = st.columns(2)
    if b1.button("1 · Run with speculation off", key="ep_run_off", disabled=not lines):
        bar = st.progress(0.0, text="Asking the server…")
        ph = remote.run_phase("speculation off", url_off, lines, ep_model or None, int(ep_tokens), float(ep_timeout),
                              1, _progress(bar))
        for key in ("ep_report", "ep_phase_off"):
            ss.pop(key, None)
        if remote.failed(ph):   # not done: press 1 again once the server answers
            ss.ep_failed = remote.failed(ph)
        else:
            ss.ep_phase_off, ss.ep_lines_off = ph, lines   # phase 2 asks exactly these, even if the box is edited
            ss.pop("ep_failed", None)
        bar.empty()
    if b2.button("2 · Restarted with speculation on: run again", key="ep_run_on",
                 disabled="ep_phase_off" not in ss or not lines):
        bar = st.progress(0.0, text="Asking the restarted server…")
        off, asked = ss.ep_phase_off, ss.ep_lines_off
        on = remote.run_phase("speculation on", url_off, asked, ep_model or None, int(ep_tokens), float(ep_timeout),
                              1, _progress(bar))
        ss.ep_report = remote.Report(asked, off, on, int(ep_tokens), float(ep_timeout), paired=False)
        bar.empty()
    if ss.get("ep_failed"):
        st.error(ss.ep_failed + " Start the server (or correct the address), then press **1** again.")
    elif "ep_phase_off" in ss and "ep_report" not in ss:
        st.info("Speculation off: done. Restart the server with speculation on, then press **2**.")

rep = ss.get("ep_report")
if rep:
    for e in rep.errors:
        st.error(e)
    st.markdown(f"**Result:** {remote.verdict(rep)}")
    st.dataframe(remote.table(rep))
    st.plotly_chart(remote.figure(rep), key="ep_fig")
    for ph in (rep.base, rep.spec):
        st.markdown(f"- **{ph.label}** counters: " + ("; ".join(ph.counters.lines()) if ph.counters else
                                                       "not read (the server failed)"))
    d1, d2, d3 = st.columns(3)
    d1.download_button("Download report (Markdown)", remote.report_markdown(rep), file_name="specdec-live-check.md",
                       mime="text/markdown", key="ep_dl_md")
    d2.download_button("Download report (HTML with the plot)", lambda: remote.report_html(rep),
                       file_name="specdec-live-check.html", mime="text/html", key="ep_dl_html")
    d3.download_button("Download table (CSV)", remote.report_csv(rep), file_name="specdec-live-check.csv",
                       mime="text/csv", key="ep_dl_csv")
