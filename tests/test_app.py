"""The Streamlit app under streamlit.testing.v1.AppTest, on the real bundled model.

A newcomer lands on the guided walkthrough, which links to every other page; every page renders; a run completes and what the page shows is what the records say; stepping, scrubbing
and autoplay change what is shown without running the model again; every user error is a message on the
page, never a traceback; two sessions keep their own runs.
"""
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import frames
from app.captions import count
from app.classroom import REPEAT
from app.view import chip_body, show
from specdec_core import LM
from specdec_core.drafters import NAMES

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
TIMEOUT = 240  # a cold model load plus a short run on a busy 2-core machine


def new_app(**controls) -> AppTest:
    """The app on the Step by step page (the default page is the walkthrough), with the controls set."""
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    at.switch_page("../pages/step.py").run()
    assert not at.exception
    return set_controls(at, **controls)


def set_controls(at: AppTest, **controls) -> AppTest:
    if "drafter" in controls:  # first: it enables the draft model and k
        at.selectbox(key="drafter").set_value(controls.pop("drafter"))
        at.run()
    for key, val in controls.items():
        if key == "prompt":
            at.text_area(key="prompt").input(val)
        elif key == "draft_model":
            at.text_input(key=key).input(val)
        elif key in ("max_new_tokens", "seed"):
            at.number_input(key=key).set_value(val)
        else:
            at.slider(key=key).set_value(val)
    at.run()
    assert not at.exception
    return at


def html(at: AppTest) -> str:
    return "\n".join(h.proto.body for h in at.html) + "\n".join(m.value for m in at.markdown)


def generate(at: AppTest) -> AppTest:
    at.button(key="generate").click().run()
    assert not at.exception, at.exception
    return at


@pytest.fixture(scope="module")
def lookup_run():
    """Prompt lookup at temperature 1.5: copied drafts meet a flat p, so rejections come in most steps."""
    at = generate(new_app(drafter="lookup", k=4, temperature=1.5, seed=3, max_new_tokens=16, prompt=REPEAT))
    return at


def test_no_stale_prompt_remains_once_a_run_starts():
    """'Pick a prompt ... press Generate' is gone from the page as soon as Generate is pressed (it used to stay,
    faded, under the live run); the legend comes back with the replay."""
    at = new_app(drafter="lookup", max_new_tokens=4, prompt="Say hi.")
    assert any("press **Generate**" in i.value for i in at.info)
    generate(at)
    assert not any("press **Generate**" in i.value for i in at.info)
    assert "tok-accepted" in html(at) or "tok-target" in html(at)


def test_a_newcomer_lands_on_start_here_and_every_page_is_linked_from_it():
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    assert at.title[0].value.startswith("Start here")
    # every page in pages/ is in the navigation, and the walkthrough links to every other one
    nav = (ROOT / "app" / "nav.py").read_text()
    pages = sorted(p.name for p in (ROOT / "pages").glob("*.py"))
    assert all(f'"pages" / "{p}"' in nav for p in pages)
    paths = re.findall(r'url_path="([^"]+)"', nav)  # every page but the default one (served at the root)
    assert len(paths) == len(pages) - 1
    linked = {link.proto.page for link in at.get("page_link")}
    assert linked == set(paths), linked


def test_every_page_renders_before_a_run():
    at = new_app()
    assert at.title[0].value.startswith("Speculative decoding")
    assert at.button(key="generate").label == "Generate"
    assert [o.split(":")[0] for o in at.selectbox(key="drafter").options] == list(NAMES)
    assert "tok-accepted" in html(at)  # the legend is there before any run
    for page, title in (("race.py", "Race"), ("lesson.py", "How speculative decoding works")):
        at.switch_page(f"../pages/{page}").run()
        assert not at.exception
        assert at.title[0].value.startswith(title)


def test_a_run_completes_and_the_page_shows_its_records(lookup_run):
    at = lookup_run
    run = at.session_state.run
    assert run.status == "done" and not at.error
    assert run.records[-1].n_generated == 16 or run.records[-1].stop_reason == "eos"
    assert run.baseline is not None and run.baseline.tokens == run.records[-1].n_generated
    cur = at.session_state.cursor
    assert (cur.step, cur.frame, cur.playing) == (0, 0, True)  # the replay starts playing at once
    assert at.subheader[0].value.startswith(f"Step 1 of {len(run.records)}")


def test_stepping_and_scrubbing_change_what_is_shown(lookup_run):
    at = lookup_run
    recs = at.session_state.run.records
    assert len(recs) >= 3
    at.button(key="next").click().run()
    assert at.subheader[0].value.startswith(f"Step 2 of {len(recs)}")
    assert not at.session_state.cursor.playing
    shown = html(at)
    # the whole step is shown: its committed tokens are in the text, each with its origin's colour
    for c in recs[1].committed:
        cls = {"draft": "tok-accepted", "resampled": "tok-resampled", "bonus": "tok-bonus",
               "target": "tok-target"}[c.origin]
        assert f'class="tok {cls}" title="' in shown and f'>{chip_body(c.piece)}</span>' in shown
    before = shown
    at.button(key="phase_back").click().run()
    assert html(at) != before
    assert at.session_state.cursor.frame == len(frames.frames(recs[1])) - 2
    at.button(key="back").click().run()
    assert at.subheader[0].value.startswith(f"Step 1 of {len(recs)}")
    at.slider(key="scrub").set_value(3).run()
    assert at.session_state.cursor.step == 2
    assert at.subheader[0].value.startswith(f"Step 3 of {len(recs)}")
    at.button(key="last").click().run()
    assert at.subheader[0].value.startswith(f"Step {len(recs)} of {len(recs)}")
    # the generated text at the last step is the run's text, token by token
    pieces = [c.piece for r in recs for c in r.committed]
    text = html(at).split('class="strip text-so-far">', 1)[1]
    pos = 0
    for p in pieces:
        i = text.find(chip_body(p), pos)
        assert i >= 0, p
        pos = i


def test_a_rejection_is_drawn_red_with_the_resampled_token_orange(lookup_run):
    at = lookup_run
    recs = at.session_state.run.records
    rejected = [r for r in recs if r.n_accepted < r.k]
    assert rejected, "prompt lookup at temperature 1.5 should meet at least one rejection"
    at.button(key="first").click().run()
    at.button(key="next_rejection").click().run()
    rec = recs[at.session_state.cursor.step]
    assert rec.n_accepted < rec.k
    shown = html(at)
    bad = rec.positions[rec.n_accepted]
    assert f'tok-rejected" title="draft #{rec.n_accepted + 1}' in shown and chip_body(bad.piece) in shown
    assert f'class="tok tok-resampled"' in shown and chip_body(rec.final_piece) in shown
    assert "Rejected" in at.subheader[0].value
    assert at.get("plotly_chart"), "the residual distribution is charted"
    # one phase back is the verify frame of the rejected draft: its p and q are in the caption
    at.button(key="phase_back").click().run()
    cap = html(at)
    assert f"p = {bad.p:.2f}" in cap and f"u = {bad.u:.2f}" in cap and "rejected" in cap


def test_autoplay_advances_and_pauses(lookup_run):
    at = lookup_run
    at.button(key="first").click().run()
    at.button(key="play").click().run()
    assert at.session_state.cursor.playing
    f0 = (at.session_state.cursor.step, at.session_state.cursor.frame)
    time.sleep(1.0)  # one frame at 1x is 0.9 s; the rerun plays the fragment's tick
    at.run()
    f1 = (at.session_state.cursor.step, at.session_state.cursor.frame)
    assert f1 > f0
    at.button(key="play").click().run()
    assert not at.session_state.cursor.playing


def test_metrics_say_what_they_count_and_hold_across_a_steps_phases(lookup_run):
    """Draft, verify and result frames of one step show the same figures, labelled 'through step n', and a
    second row for the whole run (they used to jump between phases with nothing saying which steps counted)."""
    at = lookup_run
    recs = at.session_state.run.records
    at.button(key="first").click().run()
    at.button(key="next").click().run()          # step 2, shown whole; then back to its first frame
    at.button(key="next").click().run()
    at.button(key="back").click().run()
    step = at.session_state.cursor.step
    at.session_state.cursor.frame = 0
    at.run()
    seen = []
    while at.session_state.cursor.step == step:
        vals = [x.value for x in at.metric]
        assert len(vals) == 10
        seen.append(vals)
        heads = " ".join(m.value for m in at.markdown)
        assert f"Metrics through step {step + 1} of {len(recs)}" in heads
        assert f"Whole run: {count(len(recs), 'step')}, {count(recs[-1].n_generated, 'token')}" in heads
        if at.session_state.cursor.at_end(recs):
            break
        at.button(key="phase_next").click().run()
    assert len(seen) == len(frames.frames(recs[step])) and all(v == seen[0] for v in seen)
    upto, whole = frames.running(recs, step), frames.running(recs, len(recs) - 1)
    assert seen[0][3] == str(upto.target_forwards) and seen[0][8] == str(whole.target_forwards)
    # one speedup, for the whole run: a part of the run (its prompt processing in it) is never set against it
    assert seen[0][4] == "—" and seen[0][9].endswith("×")
    labels = [x.label for x in at.metric]
    assert labels.count("Speedup") == 2 and not any("plain" in x for x in labels)
    assert seen[0][1] == f"{upto.mean_acceptance_length:.2f}" and seen[0][6] == f"{whole.mean_acceptance_length:.2f}"


def test_the_bundled_model_drafting_for_itself_is_accepted_with_bonus_tokens():
    at = generate(new_app(drafter="draft", draft_model="bundled", k=4, temperature=0.0, max_new_tokens=10,
                          prompt="Write a Python function that adds two numbers."))
    run = at.session_state.run
    m = run.metrics
    assert not at.error and run.status == "done"
    assert m.acceptance_rate >= 0.9  # same model, same greedy choice (up to rare bf16 ties)
    at.button(key="last").click().run()
    metrics = {x.label: x.value for x in at.metric}
    assert metrics["Acceptance rate"] == f"{m.acceptance_rate:.0%}"
    assert metrics["Target forward passes"] == str(m.target_forwards)
    assert m.target_forwards < m.tokens
    assert any(r.final_kind == "bonus" for r in run.records) and "tok-bonus" in html(at)


@pytest.mark.parametrize("drafter", NAMES)
def test_every_drafter_either_runs_or_says_why(drafter):
    at = generate(new_app(drafter=drafter, max_new_tokens=4, prompt="Say hello."))
    run = at.session_state["run"] if "run" in at.session_state else None
    if at.error:
        assert run is None
        assert drafter in at.error[0].value or "draft" in at.error[0].value
    else:
        assert run.status == "done" and run.records[-1].n_generated >= 1


@pytest.mark.parametrize("controls, words", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(drafter="draft", draft_model=" "), "draft model is empty"),
    (dict(drafter="draft", draft_model="./no/such/model"), "does not exist"),
])
def test_user_errors_are_messages_not_tracebacks(controls, words):
    at = new_app(**controls)
    at.secrets["allowed_models"] = ["*"]   # the operator allows any model: the load itself fails
    generate(at)
    assert len(at.error) == 1 and words in at.error[0].value
    assert "Traceback" not in at.error[0].value
    assert "run" not in at.session_state


@pytest.fixture(scope="module")
def foreign_model(tmp_path_factory):
    """A tiny randomly initialised model with its own five-word vocabulary: it cannot draft for SmolLM2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    d = tmp_path_factory.mktemp("foreign")
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(d)
    cfg = LlamaConfig(vocab_size=5, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_an_incompatible_pair_is_a_readable_message(foreign_model):
    at = new_app(drafter="draft", draft_model=str(foreign_model))
    at.secrets["allowed_models"] = [str(foreign_model)]
    generate(at)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert "cannot be paired" in msg and "vocabular" in msg


def test_sessions_keep_their_own_runs_and_never_hold_a_model():
    a = generate(new_app(drafter="lookup", max_new_tokens=6, prompt=REPEAT))
    b = new_app(drafter="none", max_new_tokens=5, prompt="Name three colours.")
    assert "run" not in b.session_state
    generate(b)
    ra, rb = a.session_state.run, b.session_state.run
    assert ra is not rb and ra.settings.prompt == REPEAT and rb.settings.drafter == "none"
    assert rb.records[-1].n_generated == 5 and ra.records[-1].n_generated <= 6
    a.button(key="next").click().run()  # a's replay still works on a's own records
    assert a.subheader[0].value.startswith(f"Step 2 of {len(ra.records)}")
    for at in (a, b):
        for v in at.session_state.to_dict().values():
            assert not isinstance(v, LM)
            assert not any(isinstance(x, LM) for x in getattr(v, "__dict__", {}).values())


def test_race_counts_time_and_target_passes():
    at = new_app(drafter="draft", draft_model="bundled", k=4, temperature=0.0, max_new_tokens=10,
                 prompt="Write a Python function that adds two numbers.")
    at.switch_page("../pages/race.py").run()
    at.button(key="race").click().run()
    assert not at.exception and not at.error
    plain, spec = at.session_state.race_plain, at.session_state.race_spec
    at.button(key="race_finish").click().run()
    metrics = [(x.label, x.value) for x in at.metric]
    passes = [v for k, v in metrics if k == "Target forward passes"]
    assert passes == [str(plain.records[-1].target_forwards), str(spec.records[-1].target_forwards)]
    assert plain.records[-1].target_forwards == plain.records[-1].n_generated  # one pass per token
    assert spec.records[-1].target_forwards < plain.records[-1].target_forwards
    # exactness end to end: at temperature 0 both lanes write the same tokens
    assert [c.token for r in plain.records for c in r.committed] == \
        [c.token for r in spec.records for c in r.committed]
    assert "speedup" in at.success[0].value and "identical" in at.success[0].value
    # the quoted speedup follows the measuring rule: the median of back-to-back pairs, with their spread
    tm = at.session_state.race_timing
    assert tm["repeats"] == 3 and tm["speedup_min"] <= tm["speedup"] <= tm["speedup_max"]
    assert f"{tm['speedup']:.2f}×** (median of 3 back-to-back pairs" in at.success[0].value
    # the lanes replay that median pair, and say so
    assert spec.metrics.tokens_per_s / plain.metrics.tokens_per_s == tm["speedup"]
    i, n = at.session_state.race_pair
    assert n == 3 and f"pair {i + 1} of the 3" in " ".join(c.value for c in at.caption)
    # where the time went, and TTFT/TPOT with speculation on and off
    assert any(f["layout"]["title"]["text"].startswith("This pair") for f in _figures(at))
    ttft = at.dataframe[0].value
    assert list(ttft.index) == ["speculation on", "speculation off"]
    assert ttft.loc["speculation off", "TTFT ms"] == pytest.approx(1e3 * plain.metrics.ttft_s)


def test_a_suffix_race_times_its_repeats_from_the_index_the_live_run_saw(bundled):
    """Suffix decoding drafts from the session's index, which the live lane has just added its answer to: the
    timed repeats must not copy it (every pair drafts as the live one did, here from an empty index), and the
    session keeps that answer once."""
    from specdec_core import drafters, engine
    at = new_app(drafter="suffix", temperature=0.0, max_new_tokens=12, prompt=REPEAT)
    at.switch_page("../pages/race.py").run()
    at.button(key="race").click().run()
    assert not at.exception and not at.error
    ix, spec = at.session_state.suffix_index, at.session_state.race_spec
    steps = [r.drafted for r in spec.records]                # the median pair's
    fresh = engine.run(bundled, drafters.make("suffix", bundled), spec.prompt_ids, max_new_tokens=12, k=spec.settings.k)
    assert steps == [r.drafted for r in fresh[1]]
    assert len(ix.docs) == 1 and spec.index_from in ix.docs
    at.button(key="race").click().run()                     # a second race drafts from the first one's answer
    assert len(at.session_state.suffix_index.docs) == 2
    again = [r.drafted for r in at.session_state.race_spec.records]
    assert len(again) < len(steps), (i, steps, again)


def test_lesson_page_loads_a_workload_preset_into_the_sidebar():
    from app.sidebar import PRESETS, WORKLOADS
    at = new_app()
    at.switch_page("../pages/lesson.py").run()
    assert len(at.table[0].value) == len(WORKLOADS)
    name = list(PRESETS)[-1]
    at.button(key=f"try_{name}").click().run()
    assert at.text_area(key="prompt").value == PRESETS[name].prompts[0]
    assert at.slider(key="temperature").value == pytest.approx(PRESETS[name].temperature)


def test_suffix_decoding_drafts_from_the_sessions_earlier_run():
    """The session keeps one suffix index: the same request a second time is drafted from the first run's text
    (longer accepted drafts, same tokens at temperature 0)."""
    at = new_app(drafter="suffix", max_new_tokens=16, prompt="Name three primary colours.")
    generate(at)
    first = at.session_state.run
    generate(at)
    second = at.session_state.run
    toks = lambda r: [c.token for rec in r.records for c in rec.committed]
    assert toks(first) == toks(second)
    assert second.metrics.mean_acceptance_length > first.metrics.mean_acceptance_length
    # drawn above the button, before the second run lands: one run so far, in the singular
    assert re.search(r"\b(1 run|2 runs) \(\d+ tokens\) so far", " ".join(i.value for i in at.info))


def test_sidebar_k_policy_and_greedy_drafting_reach_the_engine():
    at = new_app(drafter="draft", draft_model="bundled", temperature=0.8, max_new_tokens=12, prompt="Say hi.")
    at.selectbox(key="k_policy").set_value("schedule").run()
    at.radio(key="draft_sampling").set_value("greedy").run()
    generate(at)
    run = at.session_state.run
    assert (run.settings.k_policy, run.settings.draft_sampling) == ("schedule", "greedy")
    assert all(p.q == 1.0 for r in run.records for p in r.positions)          # greedy guesses: one-hot q
    ks = [r.k for r in run.records if r.k]
    assert len(ks) > 1 and (max(ks) > 4 or min(ks) < 4)                       # the schedule moved k


def _figures(at: AppTest) -> list[dict]:
    import json
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


@pytest.mark.parametrize("drafter", ["medusa", "eagle", "suffix"])
def test_a_tree_drafter_shows_its_tree_walked_trial_by_trial(drafter):
    """Every tree drafter: the draft phase draws the tree (one marker per drafted candidate) beside its
    attention mask; each verify frame adds one trial row, in the order the rule tested; no chain wording; the
    info box says what the drafter is; and the time breakdown renders."""
    at = generate(new_app(drafter=drafter, temperature=0.0, max_new_tokens=24, prompt=REPEAT))
    run = at.session_state.run
    assert not at.error and run.status == "done"
    i = next(j for j, r in enumerate(run.records) if r.tree is not None and r.tree.drafted > 1)
    rec = run.records[i]
    at.button(key="first").click().run()
    for _ in range(i):
        at.button(key="next").click().run()
    at.session_state.cursor.frame = rec.tree.depth - 1        # the whole tree drafted
    at.run()
    figs = {f["layout"]["title"]["text"].split(":")[0]: f for f in _figures(at)}
    tree = next(f for t, f in figs.items() if t.startswith("The candidate tree"))
    cand = next(d for d in tree["data"] if d.get("name") == "candidates")
    assert len(cand["x"]) == rec.tree.drafted and any(t.startswith("Tree attention") for t in figs)
    page = html(at)
    assert "copies text" not in page and "guesses the next" not in page
    assert f"{rec.tree.drafted} candidates" in page
    for n in range(1, len(rec.tree.tried()) + 1):
        at.button(key="phase_next").click().run()
        assert at.session_state.cursor.frame == rec.tree.depth - 1 + n
        page = html(at)
        assert page.count('class="vrow vrow-') == n and "thrown away too" not in page
        assert f"trial {n} of {len(rec.tree.tried())}" in at.subheader[0].value
    assert any(f["layout"]["title"]["text"].startswith("The whole run") for f in _figures(at))   # the costs
    assert "one run against one plain run, unpaired" in " ".join(c.value for c in at.caption).lower()


def test_nothing_stale_remains_after_an_error():
    """A failed Generate clears the replay of the run before it: no steps, no metrics, only the error."""
    at = generate(new_app(drafter="lookup", max_new_tokens=6, prompt=REPEAT))
    assert at.session_state.run.records and at.metric
    set_controls(at, prompt="   ")
    generate(at)
    assert len(at.error) == 1 and "prompt is empty" in at.error[0].value
    assert "run" not in at.session_state and not at.metric and not at.get("plotly_chart")
    assert not any(s.value.startswith("Step ") for s in at.subheader)


def test_one_of_a_thing_is_singular():
    """A one-token run: 'up to 1 token', 'Whole run: 1 step, 1 token', never '1 tokens' or '1 steps'."""
    at = generate(new_app(drafter="lookup", max_new_tokens=1, prompt=REPEAT))
    recs = at.session_state.run.records
    assert len(recs) == 1 and recs[-1].n_generated == 1
    text = html(at) + " ".join(c.value for c in at.caption) + " ".join(m.help or "" for m in at.metric)
    assert "Whole run: 1 step, 1 token" in text and "up to 1 token" in text
    # a count of one, not a measured figure that ends in .1 ("14.1 tokens/s")
    assert not re.search(r"(?<![\d.])1 (tokens|steps|runs|candidates|positions|times)\b", text), \
        re.findall(r".{40}(?<![\d.])1 (?:tokens|steps|runs|candidates|positions|times)\b", text)
