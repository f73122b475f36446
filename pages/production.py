"""Road to production: the sidebar's settings in the serving engines' own terms, and the lesson's checklist
(fixed prompts, greedy with speculation off and on, token diff, acceptance/TTFT/TPOT/throughput against the
baseline) run here on the real model, with a report to download."""
import pandas as pd
import streamlit as st

from app import runs, sidebar, turns
from specdec_core.serving import checklist, engines

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
        elif s.drafter == "none":
            st.info("Plain decoding: no speculative configuration, this is the baseline.")
        st.code(e.snippet, language="bash" if e.snippet.startswith(("llama-server", "python -m")) else "python",
                wrap_lines=True)
        st.markdown("**Our metrics, by this engine's name**")
        st.table(pd.DataFrame({"ours": list(e.metrics), f"{e.title}": list(e.metrics.values())}).set_index("ours"))
        for g in e.gaps:
            st.markdown(f"- No equivalent / differs: {g}")
        st.markdown("Docs: " + " · ".join(f"[{x}]({u})" for x, u in zip(engines.link_labels(e.docs), e.docs)))

st.markdown("## 2 · The operator's checklist, run here")
st.markdown("Fix a set of prompts, decode **greedily** with the draft off and on, **diff the tokens**, then read "
            "acceptance, TTFT, TPOT and throughput against the baseline. Keep speculation only where the numbers "
            "earn it.")
pool = [(name, w.prompts[0]) for name, w in sidebar.PRESETS.items()]
c1, c2 = st.columns(2)
chosen = c1.multiselect("Fixed prompts (first example of each workload)", [n for n, _ in pool],
                        default=[n for n, _ in pool][:3], key="ck_prompts")
n_tok = c2.slider("New tokens per prompt", 4, 48, 24, step=4, key="ck_tokens",
                  help="Small on purpose: on a CPU each run takes seconds.")
if s.drafter == "none":
    st.info("Pick a drafter in the sidebar: with `none` there is nothing to compare against the baseline.")
if st.button("Run the checklist", key="run_checklist", type="primary", disabled=s.drafter == "none" or not chosen):
    bar = st.progress(0.0, text="Running the baseline and the speculative decoder on each prompt…")
    try:
        tgt = runs.target()
        runs.make_drafter(s, tgt)  # errors (an incompatible draft, a missing model) before any decoding
        prompts = [p for n, p in pool if n in chosen]
        with turns.hold(turns.shown(bar)):   # one turn at the shared model for the whole checklist
            res = checklist.run(tgt, lambda: runs.make_drafter(s, tgt), prompts, int(s.k), int(n_tok),
                                on_step=lambda i, n: bar.progress(i / n, text=f"{i} of {n} prompts"))
        st.session_state.checklist = (s, res)
    except Exception as e:  # every failure is a message, never a traceback
        st.error(runs.friendly(e))
    bar.empty()

done = st.session_state.get("checklist")
if done:
    ds, res = done
    st.markdown(f"**Result** ({ds.summary()}, greedy): {checklist.verdict(res)}")
    st.dataframe(checklist.table(res))
    st.plotly_chart(checklist.figure(res), key="ck_fig")
    st.caption("A difference in greedy tokens means the implementation, not the algorithm: here it comes from "
               "bf16 rounding when two tokens tie, which batched and one-token forwards break differently.")
    eng_md = engines.markdown(ds)
    c1, c2 = st.columns(2)
    c1.download_button("Download report (Markdown)", checklist.report_markdown(ds, res, eng_md),
                       file_name="specdec-checklist.md", mime="text/markdown", key="dl_md")
    # the HTML carries plotly.js (about 5 MB): built only when the button is pressed, not on every rerun
    c2.download_button("Download report (HTML with the plot)", lambda: checklist.report_html(ds, res, eng_md),
                       file_name="specdec-checklist.html", mime="text/html", key="dl_html")
