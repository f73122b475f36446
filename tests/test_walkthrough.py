"""Walkthrough, classroom mode and the road-to-production page.

Engine translations are checked against a table of the keys each engine's docs name; scenes round-trip
through URL query parameters exactly, in the pure codec and in the running app; every walkthrough section
renders and answers its question; live widgets run the real decoder; the checklist runs and its reports
carry what it measured.
"""
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import classroom, sidebar
from app.runs import Settings
from specdec_core.drafters import NAMES
from specdec_core.serving import checklist, engines

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
TIMEOUT = 240

# (engine, drafter) -> the draft-source keys the engine's docs name; None: no equivalent
EXPECTED = {
    ("vllm", "lookup"): {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"},
    ("vllm", "draft"): {"model", "num_speculative_tokens"},
    ("vllm", "medusa"): {"method", "model", "num_speculative_tokens"},
    ("vllm", "early-exit"): None,
    ("vllm", "suffix"): {"method", "num_speculative_tokens"},
    ("vllm", "eagle"): {"method", "model", "num_speculative_tokens"},
    ("sglang", "suffix"): None,
    ("sglang", "eagle"): {"--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                          "--speculative-eagle-topk", "--speculative-num-draft-tokens"},
    ("tensorrt-llm", "suffix"): None,
    ("tensorrt-llm", "eagle"): None,
    ("llama.cpp", "suffix"): None,
    ("llama.cpp", "eagle"): None,
    ("transformers", "suffix"): None,
    ("transformers", "eagle"): None,
    ("sglang", "lookup"): {"--speculative-algorithm", "--speculative-num-draft-tokens"},
    ("sglang", "draft"): {"--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                          "--speculative-eagle-topk", "--speculative-num-draft-tokens"},
    ("sglang", "medusa"): None,
    ("sglang", "early-exit"): None,
    ("tensorrt-llm", "lookup"): {"class", "max_draft_len", "max_matching_ngram_size"},
    ("tensorrt-llm", "draft"): {"class", "max_draft_len", "speculative_model"},
    ("tensorrt-llm", "medusa"): {"class", "max_draft_len", "num_medusa_heads", "medusa_choices"},
    ("tensorrt-llm", "early-exit"): None,
    ("llama.cpp", "lookup"): {"--spec-type", "--draft-max", "--spec-ngram-size-n", "--spec-ngram-size-m"},
    ("llama.cpp", "draft"): {"--model-draft", "--draft-max", "--draft-min"},
    ("llama.cpp", "medusa"): None,
    ("llama.cpp", "early-exit"): None,
    ("transformers", "lookup"): {"prompt_lookup_num_tokens"},
    ("transformers", "draft"): {"assistant_model", "num_assistant_tokens", "num_assistant_tokens_schedule"},
    ("transformers", "medusa"): None,
    ("transformers", "early-exit"): None,
}
K_KEY = {"vllm": "num_speculative_tokens", "tensorrt-llm": "max_draft_len", "llama.cpp": "--draft-max"}
DOMAIN = {"vllm": "docs.vllm.ai", "sglang": "docs.sglang.io", "tensorrt-llm": "nvidia.github.io/TensorRT-LLM",
          "llama.cpp": "github.com/ggml-org/llama.cpp", "transformers": "huggingface.co/docs/transformers"}


@pytest.mark.parametrize("drafter", [d for d in NAMES if d != "none"])
def test_engine_configs_match_the_expected_keys(drafter):
    s = Settings(drafter=drafter, draft_model="org/my-draft", k=7, temperature=0.6, top_p=0.9, seed=11,
                 max_new_tokens=33)
    t = engines.translate(s)
    assert list(t) == list(engines.ENGINES)
    for name, e in t.items():
        want = EXPECTED[(name, drafter)]
        if want is None:
            assert not e.supported and e.speculative == {}
            assert any("no equivalent" in g for g in e.gaps), (name, e.gaps)
        else:
            assert e.supported and set(e.speculative) == want, (name, set(e.speculative))
        if want and name in K_KEY:
            assert e.speculative[K_KEY[name]] == 7
        if want and drafter == "draft":  # the draft model the user named reaches the engine
            assert any("org/my-draft" in str(v) for v in e.speculative.values()), (name, e.speculative)
        assert set(e.metrics) == set(engines.METRICS)
        assert e.docs and all(u.startswith("https://") and DOMAIN[name] in u for u in e.docs)
        assert "33" in e.snippet  # max new tokens carried into every snippet
    assert t["sglang"].speculative.get("--speculative-num-draft-tokens") == (8 if drafter in ("draft", "eagle") else
                                                                               7 if drafter == "lookup" else None)
    assert t["transformers"].sampling == {"do_sample": True, "max_new_tokens": 33, "temperature": 0.6, "top_p": 0.9}
    assert t["vllm"].sampling == {"temperature": 0.6, "top_p": 0.9, "seed": 11, "max_tokens": 33}


def test_engine_translation_plain_and_bad_input():
    t = engines.translate(Settings(drafter="none", temperature=0.0))
    assert all(e.supported and e.speculative == {} for e in t.values())
    assert t["transformers"].sampling == {"do_sample": False, "max_new_tokens": 48}
    assert "speculative_config" not in t["vllm"].snippet
    with pytest.raises(ValueError, match="unknown drafter"):
        engines.translate(Settings(drafter="oracle"))
    with pytest.raises(ValueError, match="k must be at least 1"):
        engines.translate(Settings(drafter="lookup", k=0))
    md = engines.markdown(Settings(drafter="medusa"))
    assert md.count("### ") == 5 and "no equivalent" in md


def _state(**kw):
    st = dict(sidebar.DEFAULTS, temperature=0.0, prompt="", presenter=False)
    st.update(kw)
    return st


@pytest.mark.parametrize("name", list(classroom.SCENES))
def test_scenes_round_trip_through_query_params(name):
    vals = classroom.scene_values(name)
    state = _state(**vals)
    back, errors = classroom.from_query(classroom.to_query(state))
    assert not errors
    for key in ("drafter", "draft_model", "k", "temperature", "top_p", "seed", "max_new_tokens", "workload", "prompt"):
        assert back[key] == state[key], key


def test_free_text_and_bad_values_in_query_params():
    state = _state(workload=sidebar.CUSTOM, prompt="Ünïcode & spaces = ok?\nline two", temperature=1.35,
                   top_p=0.85, seed=123456, k=9, drafter="draft", draft_model="./my draft", presenter=True)
    q = classroom.to_query(state)
    assert q["presenter"] == "1" and q["workload"] == sidebar.CUSTOM
    back, errors = classroom.from_query(q)
    assert not errors and back["presenter"] is True
    assert {k: back[k] for k in q if k != "presenter"} == {k: state[k] for k in q if k != "presenter"}
    back, errors = classroom.from_query({"k": "99", "temperature": "hot", "drafter": "oracle", "seed": "5"})
    assert back == {"seed": 5}
    assert len(errors) == 3 and any("outside 1..12" in e for e in errors) and any("oracle" in e for e in errors)


def new_app(**query) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.query_params.update(query)
    at.run()
    assert not at.exception, at.exception
    return at


def test_a_shared_link_opens_the_same_scene_and_the_url_follows_the_controls():
    name = "Rejections at high temperature (lookup, T = 1.5)"
    q = classroom.to_query(_state(**classroom.scene_values(name), presenter=True))
    at = new_app(**q)
    ss = at.session_state
    for key, val in classroom.scene_values(name).items():
        assert ss[key] == val, key
    assert ss["presenter"] is True
    assert any("font-size: 22px" in h.proto.body for h in at.html)  # presenter CSS is on the page
    assert at.query_params["temperature"] == "1.5" and at.query_params["prompt"] == classroom.REPEAT
    at.slider(key="k").set_value(6).run()
    assert at.query_params["k"] == "6"
    # a second session opened from this URL gets the changed scene
    at2 = new_app(**{k: v for k, v in at.query_params.items()})
    assert at2.session_state["k"] == 6 and at2.session_state["prompt"] == classroom.REPEAT
    # loading a scene from the sidebar puts all of it in the controls and the URL
    at2.selectbox(key="scene").set_value("A small draft model on JSON").run()
    at2.button(key="load_scene").click().run()
    assert at2.session_state["drafter"] == "draft" and at2.session_state["workload"] == "json"
    assert at2.query_params["workload"] == "json" and "prompt" not in at2.query_params


def test_a_bad_link_still_opens_with_a_warning():
    at = new_app(k="40", drafter="lookup")
    assert at.session_state["k"] == sidebar.DEFAULTS["k"]
    assert any("outside 1..12" in w.value for w in at.warning)


@pytest.fixture(scope="module")
def walk():
    at = new_app()
    at.switch_page("../pages/walkthrough.py").run()
    assert not at.exception, at.exception
    return at


def test_every_walkthrough_section_renders_and_answers_its_question(walk):
    assert walk.title[0].value.startswith("Start here")
    for sec in walk.radio(key="wt_section").options:
        key = next(k for k, v in _sections().items() if v == sec)
        walk.radio(key="wt_section").set_value(key).run()
        assert not walk.exception, (key, walk.exception)
        assert walk.header[0].value == sec
        assert walk.button(key=f"wt_run_{key}")  # a live widget, not run until clicked
        quiz = walk.radio(key=f"wt_quiz_{key}")
        wrong = next(o for i, o in enumerate(quiz.options) if i != _right(key))
        quiz.set_value(wrong).run()
        assert walk.error and walk.error[0].value.startswith("Not quite")
        walk.radio(key=f"wt_quiz_{key}").set_value(walk.radio(key=f"wt_quiz_{key}").options[_right(key)]).run()
        assert walk.success and walk.success[0].value.startswith("Right")


def _sections():
    import ast
    src = (ROOT / "pages" / "walkthrough.py").read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.Assign) and n.targets[0].id == "SECTIONS")
    return ast.literal_eval(node.value)


def _right(key):  # every question's right answer, read from the page source
    import re
    src = (ROOT / "pages" / "walkthrough.py").read_text()
    m = re.search(r'quiz\("' + re.escape(key) + r'".*?\], (\d),', src, re.S)
    return int(m.group(1))


def test_live_widgets_run_the_real_decoder(walk):
    walk.radio(key="wt_section").set_value("exact").run()
    walk.button(key="wt_run_exact").click().run()
    assert not walk.exception and not walk.error, walk.error
    a, b, recs, m = walk.session_state["wt_result_exact"]
    assert 0 < len(a) <= 24 and 0 < len(b) <= 24
    assert m.steps == len(recs) < len(b)  # lookup copies the repeated text: fewer passes than tokens
    msg = (walk.success or walk.warning)[0].value
    assert ("Identical" in msg) == (a == b)
    walk.radio(key="wt_section").set_value("two").run()
    walk.button(key="wt_run_two").click().run()
    assert not walk.exception
    r = walk.session_state["wt_result_two"]
    assert "cannot draft for target" in r["refusal"] and "vocabulary sizes differ" in r["refusal"]
    t = r["time"]   # the shipped draft's pass timed against the target's: a fraction of it, shown as c
    assert 0 < t["small_ms"] < t["big_ms"] and t["pairs"] == 7
    assert any(m.label == "a drafted token's time, c" for m in walk.metric)
    assert any("cannot draft" in e.value for e in walk.error)


def test_production_page_translates_and_runs_the_checklist():
    at = new_app(drafter="lookup", k="3", temperature="0.7")
    at.switch_page("../pages/production.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Road to production"
    codes = [c.value for c in at.code]
    assert any('"method": "ngram"' in c and '"num_speculative_tokens": 3' in c for c in codes)
    assert any("--spec-type ngram-simple --draft-max 3" in c for c in codes)
    at.multiselect(key="ck_prompts").set_value(["extraction", "code"]).run()
    at.slider(key="ck_tokens").set_value(8).run()
    at.button(key="run_checklist").click().run()
    assert not at.exception and not at.error, at.error
    s, res = at.session_state["checklist"]
    assert s.drafter == "lookup" and len(res) == 2
    for r in res:
        assert len(r.base_ids) == len(r.spec_ids) == 8 and r.base.drafted == 0
        assert r.spec.steps <= 8
    assert len(at.get("download_button")) == 2
    md = checklist.report_markdown(s, res, engines.markdown(s))
    for r in res:
        assert f"| {r.spec.tokens} | " in md and f" {round(r.spec.acceptance_rate, 3)} |" in md
    assert "## The same settings in serving engines" in md and "prompt_lookup_max" in md
    # the header says what ran: greedy, 8 tokens (not the sidebar's temperature 0.7 and 48 tokens)
    assert s.max_new_tokens == 8 and s.temperature == 0.0 and "up to 8 tokens" in md and "48" not in md.split("\n")[4]
    assert all(r.timing["repeats"] == 3 for r in res)   # paired repeats, the measuring rule's default
    said = checklist.verdict(res)
    assert said in md and "median of 3 back-to-back pairs" in said
    for r in res:                                      # a prompt hard to draft is named as one to keep it off for
        if r.spec.acceptance_rate < checklist.LOW_ACCEPTANCE:
            assert r.prompt[:40] in said and "off for" in said
    page = checklist.report_html(s, res)
    assert "Throughput against the baseline" in page and "Plotly.newPlot" in page  # the plot is embedded
    # and works offline: the plotly.js library is inside the page, no script is fetched from anywhere
    assert "* plotly.js v" in page and len(page) > 1_000_000
    assert not re.search(r"<script[^>]*\bsrc=", page), re.findall(r"<script[^>]*\bsrc=[^>]*>", page)
    assert "cdn.plot.ly/plotly-" not in page


def test_production_page_with_no_drafter_disables_the_checklist():
    at = new_app(drafter="none")
    at.switch_page("../pages/production.py").run()
    assert not at.exception
    assert at.button(key="run_checklist").disabled
    codes = [c.value for c in at.code]
    assert len(codes) == len(engines.ENGINES)
    assert not any(w in c for c in codes for w in ("speculative_config={", "DecodingConfig(", "--spec", "assistant"))


def test_each_docs_link_reads_differently():
    """Road to production listed five links all named `docs.vllm.ai`: each now names its page (and version)."""
    for name, urls in engines.DOCS.items():
        labels = engines.link_labels(urls)
        assert len(set(labels)) == len(labels), (name, labels)
        assert all(" › " in x for x in labels)
    assert engines.link_label("https://docs.vllm.ai/en/v0.9.1/features/spec_decode.html") == \
        "docs.vllm.ai › spec_decode (v0.9.1)"
    assert engines.link_label("https://github.com/ggml-org/llama.cpp/pull/10455") == "github.com › pull 10455"


def _said(at) -> str:
    return "\n".join(x.value for xs in (at.markdown, at.caption, at.warning, at.success, at.info) for x in xs)


@pytest.mark.long
def test_live_timings_and_verdicts_follow_the_measuring_rule(walk):
    """Section 1 and 6 time passes through the app's forward in repeated pairs, saying how and marking noise;
    section 5 judges each workload with the Workloads page's function and says per row whether it lands; section 7's
    verdict is per prompt and keeps speculation off where acceptance is low."""
    from specdec_core.bench import passes
    from specdec_core.bench.workloads import WORKLOADS
    walk.radio(key="wt_section").set_value("idle").run()
    walk.button(key="wt_run_idle").click().run()
    assert not walk.exception and not walk.error, walk.error
    cost, plain, look, _ = walk.session_state["wt_result_idle"]
    assert cost["pairs"] == passes.REPS and cost["ratio_min"] <= cost["ratio"] <= cost["ratio_max"]
    assert f"median of {passes.REPS} back-to-back pairs" in _said(walk)
    assert ("Noisy: rerun" in _said(walk)) == cost["noisy"] and look.target_forwards < plain.target_forwards
    # "almost free" is the lesson's GPU: where 8 tokens cost clearly more than one, the section says so beside it
    from app.walk import FREE_UP_TO
    assert (f"Measured: 8 tokens cost {cost['ratio']:.2f}× one, not about the same" in _said(walk)) == (cost["ratio"] >= FREE_UP_TO)

    walk.radio(key="wt_section").set_value("workloads").run()
    walk.button(key="wt_run_workloads").click().run()
    assert not walk.exception and not walk.error, walk.error
    rows = walk.session_state["wt_result_workloads"]
    from specdec_core.bench.workloads import benefit
    assert [r["workload"] for r in rows] == [n for n, w in WORKLOADS.items() if w.batch_size == 1]
    assert [r["drafter"] for r in rows] == [WORKLOADS[r["workload"]].drafter for r in rows]
    table = walk.table[0].value
    for r in rows:                                          # judged as the Workloads page judges: its speedup's band
        shown = table.loc[WORKLOADS[r["workload"]].label]
        assert r["benefit"] == benefit(r["speedup"]) and r["lands"] == WORKLOADS[r["workload"]].agrees(r["benefit"])
        assert shown["Drafter (T)"] == f"{r['drafter']} ({r['temperature']:g})" and shown["Measured"] == r["benefit"]
        assert shown["Lands"] == ("yes" if r["lands"] else "no") and (r["lands"] or r["why"] == shown["Why"])
    assert f"{sum(r['lands'] for r in rows)} of {len(rows)} rows land" in _said(walk)

    walk.radio(key="wt_section").set_value("batching").run()
    walk.button(key="wt_run_batching").click().run()
    assert not walk.exception and not walk.error, walk.error
    rows = walk.session_state["wt_result_batching"]
    table = walk.dataframe[0].value
    assert list(table.index) == [1, 4, 8]
    for r, rng in zip(rows, table["pairs' range"]):
        assert ("noisy: rerun" in rng) == r["noisy"] and r["ratio_min"] <= r["ratio"] <= r["ratio_max"]

    walk.radio(key="wt_section").set_value("checklist").run()
    walk.button(key="wt_run_checklist").click().run()
    assert not walk.exception and not walk.error, walk.error
    res = walk.session_state["wt_result_checklist"]
    said = _said(walk)
    assert "median of 3 back-to-back pairs" in said
    for r in res:
        keep, why = r.decision()
        assert (keep is False) == (r.spec.acceptance_rate < checklist.LOW_ACCEPTANCE or why.endswith("save"))
        if r.spec.acceptance_rate < checklist.LOW_ACCEPTANCE:
            assert "off for" in said and r.prompt[:40] in said
    assert min(r.spec.acceptance_rate for r in res) < checklist.LOW_ACCEPTANCE   # the low one is shown off
