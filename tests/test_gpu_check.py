"""make gpu-check (specdec_core/bench/gpu_check.py): it runs on the CPU with only torch and transformers (gguf,
streamlit, plotly and pandas blocked, as on the bare GPU machine), nothing that ran fails, and every CUDA part says
it was skipped and why. The pieces the GPU run leans on (the graph-ready decode step, the padded-rows variant, the
batch sweep) run here on a small model.
"""
import json
import subprocess
import sys

import pytest
import torch

from specdec_core import forward as fw
from specdec_core.bench import gpu_check as gc
from specdec_core.bench.decode_graph import GraphDecoder, matches_forward

BLOCKED = ("gguf", "streamlit", "plotly", "pandas")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The --quick check in a fresh interpreter whose imports of BLOCKED fail (sys.modules[name] = None)."""
    out = tmp_path_factory.mktemp("gpu-check")
    code = (f"import sys, runpy\nfor n in {BLOCKED!r}: sys.modules[n] = None\n"
            f"sys.argv = ['gpu_check', '--quick', '--out', {str(out)!r}, '--threads', '1']\n"
            "runpy.run_module('specdec_core.bench.gpu_check', run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    return p, json.loads((out / "gpu-check.json").read_text()), (out / "gpu-check.md").read_text()


def test_the_quick_check_runs_without_gguf_streamlit_plotly_and_passes(report):
    p, rep, md = report
    assert p.returncode == 0, p.stderr[-3000:]
    assert rep["sections"] == list(gc.SECTIONS)
    statuses = {r["status"] for r in rep["results"]}
    assert statuses <= {"pass", "skipped"}, [r for r in rep["results"] if r["status"] == "fail"]
    ran = {r["section"] for r in rep["results"] if r["status"] == "pass" and r["device"] == "cpu"}
    assert ran == set(gc.SECTIONS) - {"batch_sweep"}          # every section but the CUDA-only sweep ran here
    for r in rep["results"]:
        if r["status"] == "skipped":
            assert r["reason"], r
    names = {r["name"] for r in rep["results"]}
    assert {"chain k=1..16 vs alone (default)", "tree nodes vs branch (default)",
            "batch rows vs alone (default)", "static step == forward step (eager)"} <= names
    assert rep["machine"]["torch"] == torch.__version__ and rep["machine"]["cpu"] and rep["date"]
    assert "summary" in rep and "0 failed" in rep["summary"]
    assert "| invariance |" in md and "--quick" in md


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only report")
def test_without_a_gpu_every_cuda_part_is_skipped_and_the_note_says_so(report):
    _, rep, md = report
    cuda = [r for r in rep["results"] if r["device"] == "cuda" or any(n in r["name"] for n in gc.CUDA_ONLY)]
    assert {r["section"] for r in cuda} >= {"forward_vs_hf", "invariance", "greedy", "timing", "decode_graph",
                                             "batch_sweep"}
    assert all(r["status"] == "skipped" and r["reason"] for r in cuda)
    assert "nothing in this report was measured on a GPU" in md
    assert rep["machine"]["cuda"] is False and rep["devices"] == ["cpu"]


def test_trained_drafters_are_skipped_with_the_reason_where_the_bundled_model_does_not_load(monkeypatch):
    import specdec_core
    from specdec_core.models import ModelError

    def no_bundled(*a, **k):
        raise ModelError("the bundled model is not installed")
    monkeypatch.setattr(specdec_core, "load", no_bundled)
    rs = gc.greedy_trained("cpu", 4, enabled=True)
    assert [r.name.split()[0] for r in rs] == list(gc.TRAINED)
    assert all(r.status == "skipped" and "not installed" in r.reason for r in rs)


@pytest.fixture(scope="module")
def small_bf16():
    ours, _ = gc.pair(gc.small_model("llama"), torch.bfloat16, "cpu", "small llama")
    return ours


def test_the_static_decode_step_is_bitwise_the_forward_step(small_bf16, one_thread):
    ids = gc.prompts(256, 1, 100, seed=5)[0]
    assert matches_forward(small_bf16.fwd, ids[:60], ids[60:]) == (True, 0.0)   # crosses the 64-slot block
    with pytest.raises(RuntimeError, match="CUDA"):
        GraphDecoder(small_bf16.fwd, 128)


@pytest.mark.parametrize("rows", gc.PAD_VARIANTS)
def test_the_padded_rows_variants_stay_invariant_and_restore_rows(small_bf16, one_thread, rows):
    """The candidate fixes the GPU run tries when the default fails: still exact here, and ROWS comes back."""
    with gc.padded_rows(rows):
        assert fw.ROWS == rows
        rs = gc.invariance(small_bf16, "cpu", f"rows={rows}")
        rs += gc.greedy_equal(small_bf16, "cpu", gc.prompts(256, 1), 8, variant=f"rows={rows}")
    assert fw.ROWS == 4
    assert [r.status for r in rs] == ["pass"] * len(rs), [r.reason for r in rs]


def test_the_batch_sweep_runs_and_rows_equal_plain(small_bf16, one_thread):
    r = gc.batch_sweep(small_bf16, "cpu", (1, 3), 5)
    assert r.status == "pass" and [row["batch"] for row in r.figures["rows"]] == [1, 3]
    assert all(row["rows_equal"] and row["plain_tokens_per_s"] > 0 for row in r.figures["rows"])


def test_a_failing_section_is_recorded_not_raised():
    def boom():
        raise RuntimeError("no kernel image for this device")
    (r,) = gc.guarded("timing", "cuda", boom)
    assert r.status == "fail" and "no kernel image" in r.reason
