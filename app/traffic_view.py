"""Road to production's prompt set: the workloads' examples, or a visitor's own traffic uploaded as a file or
pasted (read by specdec_core/serving/prompt_set.py), with the bounds and the time the checklist will take said
before anything runs. A bad file is one message; what was typed or pasted stays where it was."""
from __future__ import annotations

import streamlit as st

from specdec_core import SamplingParams, drafters, engine
from specdec_core.bench import sweeps
from specdec_core.errors import InputError
from specdec_core.serving import prompt_set

from . import sidebar, turns

OWN, EXAMPLES = "Your own prompt set", "The workloads' examples"
SUFFIXES = [s.lstrip(".") for s in prompt_set.SUFFIXES]
_PACE: dict = {}   # (model, forward) -> (s per prompt token, s per new token) of plain decoding, per server


def examples() -> list[tuple[str, str]]:
    """(workload, its first example) for every preset workload."""
    return [(name, w.prompts[0]) for name, w in sidebar.PRESETS.items()]


def chosen() -> list[str]:
    """The prompts the checklist will run: the picked examples, or the visitor's own set (kept in
    `st.session_state.ck_own` for the live-server section); [] when there are none or the set is bad."""
    ss = st.session_state
    if "ck_paste" in ss:   # kept while the box is hidden (a hidden widget's value would be dropped)
        ss.ck_paste = ss.ck_paste
    src = st.radio("Prompts", [EXAMPLES, OWN], horizontal=True, key="ck_source")
    if src == EXAMPLES:
        pool = examples()
        picked = st.multiselect("Fixed prompts (first example of each workload)", [n for n, _ in pool],
                                default=[n for n, _ in pool][:3], key="ck_prompts")
        return [p for n, p in pool if n in picked]
    st.caption(f"JSON Lines with a `prompt` field, CSV with a `prompt` column, or plain text with one prompt per "
               f"line (a line break inside a prompt written `\\n`): {prompt_set.bounds()}. A file takes the place "
               "of the pasted text while it is uploaded.")
    up = st.file_uploader("Upload a prompt file", type=SUFFIXES, key="ck_file",
                          max_upload_size=max(1, prompt_set.MAX_FILE_BYTES >> 20))   # the widget says the bound
    pasted = st.text_area("…or paste the prompts", key="ck_paste", height=120,
                          placeholder="One prompt per line, or JSON Lines, or CSV with a header row")
    ss.ck_own = []
    try:
        if up is not None:
            got = prompt_set.parse(up.getvalue(), up.name, label=f"The file {up.name!r}")
        elif pasted.strip():
            got = prompt_set.parse(pasted, label="The pasted text")
        else:
            return []
    except InputError as e:   # the file's one message; the pasted text, the settings and any results stay
        st.error(str(e), icon=":material/error:")
        return []
    names = {"jsonl": "JSON Lines", "csv": "CSV", "text": "plain text"}
    st.caption(f"Read {len(got.rows)} prompt{'s' if len(got.rows) != 1 else ''} ({names[got.format]}).")
    ss.ck_own = got.prompts
    return got.prompts


def pace(tgt) -> tuple[float, float]:
    """(seconds per prompt token, seconds per new token) of plain decoding on this machine, from the engine's own
    metrics of a short plain run of the first example (its second run: the first pays one-off costs), taken once
    per server through the queue."""
    key = (id(tgt.model), tgt.forward_name)
    if key not in _PACE:
        ids = tgt.encode(examples()[0][1]).tolist()
        plain = drafters.make(drafters.PLAIN, tgt)
        with turns.hold():
            for _ in range(2):
                *_, m = engine.run(tgt, plain, ids, sp=SamplingParams(temperature=0.0), k=0, max_new_tokens=8,
                                   detail=False)
        _PACE[key] = (m.ttft_s / len(ids), m.tpot_s)
    return _PACE[key]


def estimate(tgt, prompts: list[str], new_tokens: int) -> str:
    """How long the checklist will take on this machine, at plain decoding's measured pace."""
    per_tok, per_new = pace(tgt)
    n_prompt = sum(len(tgt.encode(p)) for p in prompts)
    s = prompt_set.estimate_s(len(prompts), new_tokens, sweeps.REPEATS, per_new, n_prompt, per_tok)
    return (f"{len(prompts)} prompt{'s' if len(prompts) != 1 else ''}, each decoded {2 * sweeps.REPEATS} times "
            f"({sweeps.REPEATS} pairs, plain and speculative): {prompt_set.said(s)} at plain decoding's pace on "
            "this machine, usually less (speculation finishes sooner where it pays), more while others use it.")
