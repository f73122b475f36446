"""The measurement pages (workloads, temperature, batch size, draft length, output contract) under AppTest on the
real bundled model, with small sweeps: each measures what its controls ask, its table agrees with its own runs
and with the theory it quotes, a rerun shows the stored result without recomputing, a drafter that cannot run
is a warning and is skipped. The contract page's two-sample test is checked on known counts in test_lesson_checks.
"""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import measure
from specdec_core.bench import reference
from specdec_core.bench.contract import two_sample
from specdec_core.bench.theory import expected_speedup
from specdec_core.bench.workloads import TEMPERATURE_DEMO, WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
TIMEOUT = 300  # a cold model load plus a small sweep on a busy 2-core machine


@pytest.fixture(autouse=True)
def _one_thread(one_thread, monkeypatch):
    """On a shared 2-core machine a 2-thread pool spins against other processes; one thread is steadier.
    Two timed repeats per pair (the pages' default is sweeps.REPEATS) keep the sweeps short."""
    from specdec_core.bench import sweeps
    monkeypatch.setattr(sweeps, "REPEATS", 2)


def open_page(page: str, **controls) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, at.exception
    for key, val in controls.items():
        w = next(ws(key) for ws in (at.multiselect, at.slider, at.select_slider, at.number_input, at.selectbox,
                                    at.text_input) if any(e.key == key for e in ws))
        w.set_value(val)
        at.run()
        assert not at.exception, at.exception
    return at


def click(at: AppTest, key: str) -> AppTest:
    at.button(key=key).click().run()
    assert not at.exception, at.exception
    return at


def text(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [m.value for m in at.success] + [m.value for m in at.warning]
                     + [c.value for c in at.caption] + [e.value for e in at.error] + [i.value for i in at.info])


def test_each_measure_page_renders_and_waits_for_its_button():
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.run()
    for page, title, button in (("workloads", "Workloads", "wl_go"), ("temperature", "Temperature", "temp_go"),
                                ("batch", "Batch size", "bs_go"), ("draft_length", "Draft length", "k_go"),
                                ("contract", "Output contract", "ct_greedy_go"),
                                ("drafters", "All drafters", "all_go")):
        at.switch_page(f"../pages/{page}.py").run()
        assert not at.exception, (page, at.exception)
        assert at.title[0].value.startswith(title)
        assert not at.button(key=button).disabled
        if page == "workloads":                             # each workload with its own drafter by default
            assert at.toggle(key="wl_own").value and "extraction → `lookup`" in text(at)
        elif page == "temperature":                        # where speculation pays at T = 0, to fall from there
            assert (at.multiselect[0].value == [TEMPERATURE_DEMO[0]]
                    and at.selectbox(key="temp_workload").value == TEMPERATURE_DEMO[1] == "code")
        elif page == "draft_length":                       # a drafter whose cost gives a best k inside the range
            assert at.multiselect[0].value == ["draft"] and at.selectbox(key="k_workload").value == "code"
        elif page != "drafters":
            assert at.multiselect[0].value == ["lookup"]   # default drafter
        assert not at.get("plotly_chart")                   # nothing measured until asked
    at.switch_page("../pages/batch.py").run()
    offered = at.multiselect(key="bs_drafters").options
    assert any(o.startswith("medusa") for o in offered)   # trees are batched too (batch.py)


def test_workloads_page_measures_each_row_and_keeps_it_across_reruns():
    at = open_page("workloads", wl_which=["extraction", "batch"], wl_prompts=1, wl_max_new=8, wl_batch=4)
    assert [(w, WORKLOADS[w].drafter) for w in ("extraction", "batch")] == [("extraction", "lookup"),
                                                                          ("batch", "lookup")]
    click(at, "wl_go")
    res = at.session_state["measure_workloads"]
    assert res.status == "done", res.error
    assert [r["Workload"] for r in res.rows] == [WORKLOADS["extraction"].label, WORKLOADS["batch"].label]
    ext, bat = res.rows
    assert (ext["Requests"], ext["Decoded"]) == (1, "one at a time")
    assert (bat["Requests"], bat["Decoded"]) == (4, "as one batch")
    for r, w in zip(res.rows, ("extraction", "batch")):
        assert r["Expected benefit (lesson)"] == WORKLOADS[w].expected
        assert r["Temperature"] == WORKLOADS[w].temperature
        assert r["Speedup"] == pytest.approx(r["Throughput spec (tok/s)"] / r["Throughput plain (tok/s)"])
        assert 0.0 <= r["Acceptance rate"] <= 1.0 and r["Mean acceptance length"] >= 1.0
        assert r["TTFT plain (ms)"] > 0 and r["TPOT spec (ms)"] > 0
    # prompt lookup on a copy-the-text prompt drafts and gets some drafts accepted
    assert ext["Acceptance rate"] > 0
    assert len(at.get("plotly_chart")) == 1
    assert at.download_button(key="workloads_csv")
    # a rerun (any click) shows the stored result: same object, same timing, nothing recomputed
    seconds = res.seconds
    at.run()
    assert at.session_state["measure_workloads"] is res and res.seconds == seconds
    assert len(at.get("plotly_chart")) == 1
    # touching a control marks the result as out of date instead of dropping it
    at.slider(key="wl_prompts").set_value(2).run()
    assert "controls have changed" in text(at)


def test_workloads_defaults_use_each_workloads_own_drafter_beside_the_reference():
    at = open_page("workloads")
    assert at.session_state["draft_model"] == "distilled"             # the sidebar's default draft model
    assert at.multiselect(key="wl_which").value == list(WORKLOADS)     # all six on their defaults
    assert "code → `eagle`" in text(at) and "json → `eagle`" in text(at) and "creative → `draft (distilled)`" in text(at)
    for key, val in dict(wl_which=["code", "extraction"], wl_prompts=1, wl_max_new=8).items():
        next(w for ws in (at.multiselect, at.slider, at.number_input) for w in ws if w.key == key).set_value(val)
    at.run()
    click(at, "wl_go")
    res = at.session_state["measure_workloads"]
    assert res.status == "done", res.error
    assert [(r["name"], r["Drafter"]) for r in res.rows] == [("code", "eagle"), ("extraction", "lookup")]
    for r in res.rows:                                                 # where the time went, per row
        assert r["Step ms"] > 0 and r["Plain step ms"] > 0 and r["Verify ms/step"] > 0 and r["Draft ms/step"] >= 0
        assert (r["Lands"] == "yes") == WORKLOADS[r["name"]].agrees(r["Measured benefit"])
        assert (r["Why it differs (measured)"] == "") == (r["Lands"] == "yes")
        assert r["Why it differs (measured)"] in text(at)
    assert res.rows[0]["Draft ms/step"] > res.rows[1]["Draft ms/step"]   # a model draft costs more than copying
    assert f"{sum(r['Lands'] == 'yes' for r in res.rows)} of 2 rows land" in text(at)
    ref = reference.load()
    label = reference.label(ref)                                       # drawn faintly and labelled
    spec = at.get("plotly_chart")[0].proto.spec
    assert label in spec and f"Faint bars: {label}" in text(at) and ref["command"] in text(at)
    main = next(d.value for d in at.dataframe if "Reference speedup" in d.value.columns)
    assert main["Reference speedup"].notna().all()
    times = at.dataframe[0].value                                      # the time split, one line per row
    assert {"Draft ms/step", "Verify ms/step", "Step ms", "Plain step ms"} <= set(times.columns) and len(times) == 2


def test_all_drafters_page_one_row_per_drafter_same_tokens_at_t0():
    at = open_page("drafters")
    at.session_state["max_new_tokens"] = 8
    at.run()
    click(at, "all_go")
    res = at.session_state["measure_drafters"]
    assert res.status == "done", res.error
    assert [r["drafter"] for r in res.rows] == ["none", *measure.SPEC]   # every drafter runs on the bundled model
    for r in res.rows:
        assert r["same_tokens_as_baseline"] is True and r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        assert r["other_ms"] == pytest.approx(r["verify_ms"] + r["commit_ms"] + r["bookkeeping_ms"])
    table = at.dataframe[0].value
    assert list(table["Same tokens as plain"]) == ["yes"] * len(res.rows)
    assert {"Draft ms/step", "Verify pass ms/step", "Plain step ms", "Reference speedup"} <= set(table.columns)
    assert reference.label(reference.load()) in text(at) and len(at.get("plotly_chart")) == 1


def test_temperature_page_one_point_per_temperature():
    at = open_page("temperature", temp_drafters=["lookup"], temp_values=[0.0, 1.5], temp_prompts=1, temp_max_new=8)
    click(at, "temp_go")
    res = at.session_state["measure_temperature"]
    assert res.status == "done", res.error
    assert [(r["drafter"], r["temperature"]) for r in res.rows] == [("lookup", 0.0), ("lookup", 1.5)]
    for r in res.rows:
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / r["baseline_tokens_per_s"])
        assert r["repeats"] == 2 and r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        assert r["acceptance_lo"] <= r["acceptance_rate"] <= r["acceptance_hi"]
        assert f"{int(r['drafted'])} drafted" in text(at)          # the count behind each acceptance point
    assert "median of 2 back-to-back pairs" in text(at) and at.get("plotly_chart")
    table = at.dataframe[0].value
    assert {"Speedup min", "Speedup max", "Noisy", "Acceptance 95% low"} <= set(table.columns)
    assert not any("_" in c for c in table.columns)               # headers in words
    from app import captions, runs
    block = runs.target().backend.row_block                       # what a verify pass's rows cost, as measured
    assert res.extra["row_block"] == block and captions.row_cost(block) in text(at)
    assert ("every rejected guess costs time of its own" in text(at)) == (block == 1)


def test_temperature_page_sampled_and_greedy_drafting_side_by_side():
    at = open_page("temperature", temp_drafters=["lookup", "draft"], temp_values=[1.0], temp_prompts=1,
                   temp_max_new=8)
    at.session_state["draft_model"] = "bundled"   # the target drafting for itself (the default is distilled)
    at.radio(key="temp_drafting").set_value("both").run()
    click(at, "temp_go")
    res = at.session_state["measure_temperature"]
    assert res.status == "done", res.error
    by = {r["drafter"]: r for r in res.rows}
    assert list(by) == ["lookup", "draft (bundled)", "draft (bundled) · greedy drafting"]   # lookup is greedy anyway
    # `bundled`: the target drafts for itself. Sampled from q = p, every guess is kept (min(1, p/q) = 1, our forward
    # scores a guess bit for bit as it drafted it); greedy, a guess x is kept with probability p(x) only
    sampled, greedy = by["draft (bundled)"], by["draft (bundled) · greedy drafting"]
    assert sampled["drafted"] > 0 and sampled["accepted"] == sampled["tested"]
    assert greedy["drafted"] > 0 and greedy["accepted"] <= greedy["tested"]


def test_batch_page_speedup_per_batch_size():
    at = open_page("batch", bs_sizes=[1, 2], bs_max_new=8)
    click(at, "bs_go")
    res = at.session_state["measure_batch"]
    assert res.status == "done", res.error
    assert [r["batch_size"] for r in res.rows] == [1, 2]
    for r in res.rows:
        assert r["tokens"] <= 8 * r["batch_size"]
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / r["baseline_tokens_per_s"])
    # the verdict follows the measured speedups: the first batch size below 1x, else the largest one's
    losing = [r for r in res.rows if r["speedup"] < 1.0]
    assert (f"it stops paying at batch size **{losing[0]['batch_size']}** ({losing[0]['speedup']:.2f}×)" if losing
            else f"it still pays at the largest batch measured ({res.rows[-1]['speedup']:.2f}× at") in text(at)
    at.toggle(key="bs_by_size").set_value(True).run()
    click(at, "bs_go")
    res = at.session_state["measure_batch"]
    assert res.status == "done" and all(r["k_policy"] == "batch" for r in res.rows)


def test_draft_length_page_draws_leviathan_from_measured_alpha_and_c():
    at = open_page("draft_length", k_values=[1, 3], k_prompts=1, k_max_new=8)
    click(at, "k_go")
    res = at.session_state["measure_k"]
    assert res.status == "done", res.error
    adaptive = [r for r in res.rows if "k_policy" in r]
    assert [(r["k_policy"], r["k"]) for r in adaptive] == [("schedule", 3), ("confidence", 3)]
    assert all(f"Adaptive **{r['k_policy']}** (k up to 3): **{r['speedup']:.2f}×**" in text(at) for r in adaptive)
    res.rows = [r for r in res.rows if "k_policy" not in r]
    assert [r["k"] for r in res.rows] == [1, 3]
    for r in res.rows:
        assert len(r["per_position_acceptance"]) <= r["k"]
        assert r["target_forward_ms"] > 0 and r["cost_ratio_c"] >= 0
        assert r["cost_ratio_c"] == pytest.approx(r["draft_ms_per_token"] / r["target_forward_ms"])
    # the shown prediction uses alpha pooled over the sweep (kept / judged guesses) and the measured c
    drafted = sum(r["drafted"] for r in res.rows)
    assert all(r["accepted"] <= r["tested"] <= r["drafted"] for r in res.rows)
    alpha = sum(r["accepted"] for r in res.rows) / sum(r["tested"] for r in res.rows)
    assert f"α = **{alpha:.2f}**" in text(at)
    # why the measurement differs: the row cost of the forward that measured it, not another machine's
    from app import captions, runs
    block = runs.target().backend.row_block
    assert res.extra["row_block"] == block                             # kept with the result it explains
    assert captions.row_cost(block) in text(at)
    assert ("blocks of 4" in text(at)) == (block == 4)
    res.extra["row_block"] = 4 if block == 1 else 1                    # measured elsewhere: the page says that one's
    at.run()
    assert captions.row_cost(res.extra["row_block"]) in text(at) and captions.row_cost(block) not in text(at)
    res.extra["row_block"] = block
    table = at.dataframe[0].value
    # c pooled over the sweep: draft time per drafted token over the mean plain forward
    draft_ms = sum(r["draft_ms_per_token"] * r["drafted"] for r in res.rows) / drafted
    c = draft_ms / (sum(r["target_forward_ms"] for r in res.rows) / len(res.rows))
    assert float(text(at).split("c = ")[1].split("**")[0]) == pytest.approx(c, abs=5e-4)  # shown rounded
    for _, row in table.iterrows():
        assert row["Predicted speedup"] == pytest.approx(expected_speedup(alpha, int(row["k"]), c), abs=2e-3)


def test_contract_page_greedy_diff_and_sampled_comparison():
    at = open_page("contract", ct_prompts=1, ct_max_new=8, ct_samples=50, ct_span=2, ct_temp=1.5)
    click(at, "ct_greedy_go")
    g = at.session_state["measure_contract_greedy"]
    assert g.status == "done", g.error
    (row,) = g.rows
    # the contract itself: under our forward, greedy speculation gives plain decoding's tokens exactly
    assert row["plain"] == row["spec"] and row["Identical"] and row["First difference at token"] is None
    assert row["Tokens plain"] == len(row["plain"]) == row["Tokens spec"] and 0 < len(row["plain"]) <= 8
    click(at, "ct_sample_go")
    res = at.session_state["measure_contract_sampled"]
    assert res.status == "done", res.error
    counts = res.extra["counts"]
    assert set(counts) == {"none", "lookup"}
    assert all(sum(c.values()) == 50 for c in counts.values())
    assert all(len(t) <= 2 for c in counts.values() for t in c)
    (r,) = res.rows
    assert r["Drafts checked in the span"] >= r["Drafts accepted in the span"] >= 0
    assert r["Drafts checked in the span"] > 0     # the rule really decided some of the compared tokens
    # at T = 1.5 the 100 outcomes spread over more than one bin, so there is a test, and it is the one measure's
    # two-sample function gives on these counts (same seed: same shuffles)
    assert r["Distinct outcomes"] > 1 and r["Bins"] >= 2
    assert r["p-value"] is not None and 0.0 <= r["p-value"] <= 1.0
    assert r["p-value"] == two_sample(counts["none"], counts["lookup"], 0)["p_value"]
    ref = res.extra["ref"]
    assert ref and all(0.0 <= v <= 1.0 for v in ref.values()) and sum(ref.values()) <= 1.0 + 1e-6
    # the greedy result is still there after the second measurement
    assert at.session_state["measure_contract_greedy"] is g


def test_a_drafter_that_cannot_run_is_a_warning_and_skipped():
    at = open_page("temperature", temp_drafters=["lookup", "draft"], temp_values=[0.0], temp_prompts=1,
                   temp_max_new=4, drafter="draft", draft_model="./no-such-model")  # the sidebar's draft model
    click(at, "temp_go")
    res = at.session_state["measure_temperature"]
    assert res.status == "done"
    assert [r["drafter"] for r in res.rows] == ["lookup"]
    # not on the operator's list of models a visitor may load: refused before any loading
    assert any("Skipped `draft`" in w.value and "SPECDEC_ALLOWED_MODELS" in w.value for w in at.warning)
    # nothing that can run: an error on the page, no traceback
    at.multiselect(key="temp_drafters").set_value(["draft"]).run()
    click(at, "temp_go")
    assert at.session_state["measure_temperature"].status == "failed"
    assert any("None of the chosen drafters" in e.value for e in at.error)
