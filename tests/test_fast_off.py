"""The lesson's code runs alone: with SPECDEC_FAST=0 the backend hands out no fast path, our forward runs op by op
with plain products, EAGLE and Medusa draft through their trained modules, and every drafter still gives plain
decoding's tokens at temperature 0 (the contract holds on the reference as on the fast path)."""
import pytest
import torch

from specdec_core import backend, load, make_drafter, run
from specdec_core.drafters.eagle import HeadRows as EagleRows
from specdec_core.drafters.medusa import HeadRows as MedusaRows
from specdec_core.forward import Linear

PROMPTS = ["Write a Python function that merges two sorted lists into one sorted list.",
           'Return JSON with the keys "name" and "age" for: Ada Lovelace, 36.']


@pytest.fixture(scope="module")
def reference(bundled, monkeypatch_module):
    """The bundled model without the fast path (`bundled`, the session's, is loaded first, with it). The switch
    stays off for this module's tests: the backend reads it again when a drafter is made."""
    monkeypatch_module.setenv("SPECDEC_FAST", "0")
    return load("bundled", device="cpu")


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_the_reference_forward_has_no_fast_path(reference):
    f = reference.fwd
    assert f.fast is None and backend.loop_name(f) == "op-by-op layer loop" and not backend.reads_q4(f)
    assert all(type(d) is Linear for b in f.blocks for d in b.products()) and type(f.head) is Linear
    assert f.kv_dtype() == torch.float32 and backend.kernel("one_row_layers") is None


def test_the_reference_is_the_fast_path_up_to_the_products_rounding(reference, bundled):
    """The same weights through both: the fast path's packed products sum in another order, nothing else."""
    if reference.dtype != bundled.dtype or bundled.fwd is None or bundled.fwd.fast is None:
        pytest.skip("the two loads differ in dtype here")
    ids = bundled.encode(PROMPTS[0])
    a = reference.forward(ids, reference.new_cache())
    b = bundled.forward(ids, bundled.new_cache())
    tol = 2e-4 if bundled.dtype == torch.float32 else 0.5
    assert (a - b).abs().max() <= tol
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("n", [1, pytest.param(len(PROMPTS), marks=pytest.mark.long)])
@pytest.mark.parametrize("name", ["lookup", "suffix", "draft", "early-exit", "medusa", "eagle"])
def test_every_drafter_keeps_the_contract_without_the_fast_path(reference, name, n):
    d = make_drafter(name, reference)
    if name == "eagle":
        assert type(d.rows) is EagleRows
    if name == "medusa":
        assert type(d.rows) is MedusaRows
    for text in PROMPTS[:n]:
        p = reference.encode(text)
        plain = run(reference, make_drafter("none", reference), p, max_new_tokens=16, detail=False)[0]
        assert run(reference, d, p, max_new_tokens=16, detail=False)[0] == plain, (name, text)
