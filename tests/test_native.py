"""The forward's C++ layer loop (native.py, csrc/span.cpp) against the TorchScript one it replaces: the same logits
and the same cache, bit for bit, for every kind of one-row call; and the TorchScript loop where it cannot run."""
import pytest
import torch

import torch.utils.cpp_extension

import specdec_core.forward as fw
from specdec_core import native
from specdec_core.tree import compile_tree

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 0, 0, 0), (1, 0, 0, 0)]


@pytest.fixture(scope="module", params=["default", "fp32"])
def either(request, bundled, bundled_fp32):
    return bundled if request.param == "default" else bundled_fp32


@pytest.fixture(scope="module")
def ext():
    """The built extension (csrc/span.cpp), or the test skips with why it could not be built."""
    m = native.module()
    if m is None:
        pytest.skip(native.why())
    return m


def calls(lm, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A prefill past MAX_ROWS, a chunk crossing a key block, decode steps, a verify of 16, and trees whose nodes
    sit inside a key block and across one (slow nodes)."""
    c, out = lm.new_cache(), []
    out.append(lm.forward(torch.tensor(ids[:70]), c))
    out.append(lm.forward(torch.tensor(ids[70:100]), c))
    out += [lm.forward(torch.tensor([t]), c) for t in ids[100:103]]
    out.append(lm.forward(torch.tensor(ids[103:119]), c))
    c.crop(-16)
    tree = compile_tree(TREE)
    for L in (103, 215):                  # the tree's slots: 103..117, inside a key block; 215..229, across 224
        c.set_length(0, 103)
        if L > 103:
            lm.forward(torch.tensor(ids[103:L]), c)
        logits, hidden = lm.tree_forward(c, torch.tensor(ids[L:L + tree.size]), tree)
        out += [logits, hidden]
    return out, c.kv.clone()


@pytest.mark.parametrize("probe", [None, (False, True)])
def test_the_cpp_loop_is_the_scripted_loop_bit_for_bit(either, ext, monkeypatch, probe):
    """probe (False, True): a device whose slot-order scores are not a chain's, so every tree node gathers and is
    scored again as a chain (the tree path's rescore branch)."""
    lm = either
    if probe is not None:
        f = lm.fwd
        monkeypatch.setitem(fw._IN_PLACE, (str(f.device), f.n_kv, f.n_heads // f.n_kv, f.head_dim), probe)
    ids = lm.encode("def area(r):\n    return 3.14159 * r * r\n\n" * 16).tolist()
    runs = []
    for loop in (ext.span_layers, fw._span_layers):
        monkeypatch.setattr(fw, "span_layers", lambda loop=loop: loop)
        runs.append(calls(lm, ids))
    (a, ka), (b, kb) = runs
    assert len(a) == len(b) == 10
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"call {i}"
    assert torch.equal(ka, kb)


def test_an_int8_draft_network_runs_the_same_in_either_loop(bundled, ext, monkeypatch):
    """A draft model's int8 products (no row padding) through the C++ loop: the scripted loop's bits."""
    if not fw.int8_ok(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this build of torch has no CPU int8 weight product")
    full = fw.Forward.from_model(bundled.model, int8=True)
    f = full.derive(full.blocks[:3], full.norm, full.head)
    ids = bundled.encode("A list of primes: 2, 3, 5, 7, 11, 13, 17, 19, 23").tolist()
    outs = []
    for loop in (ext.span_layers, fw._span_layers):
        monkeypatch.setattr(fw, "span_layers", lambda loop=loop: loop)
        c = f.new_cache()
        outs.append([f.append(torch.tensor(ids[:-4]), c)] + [f.append(torch.tensor([t]), c) for t in ids[-4:]])
    assert all(torch.equal(x, y) for x, y in zip(*outs))


def test_without_a_build_the_scripted_loop_runs_and_says_why(monkeypatch):
    monkeypatch.setenv("SPECDEC_NATIVE", "0")
    assert native.op("span_layers") is None and native.op("eagle_rows") is None
    monkeypatch.delenv("SPECDEC_NATIVE")
    monkeypatch.setattr(native, "_state", {})

    def no_compiler(*a, **k):
        raise RuntimeError("Error building extension 'specdec_span': c++: command not found")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    assert native.op("span_layers") is None
    assert "could not be built" in native.why() and "command not found" in native.why()


def test_the_cpp_eagle_level_is_the_scripted_one(either, ext, monkeypatch):
    """The EAGLE head's layer (a proposal's root rows, then one call per tree level) through csrc/span.cpp's
    eagle_rows and through the scripted _rows: every call's features, draft log-probs and ids bit for bit, over a
    decode (int8 products in bf16, oneDNN-packed fp32 ones in fp32)."""
    import specdec_core.drafters.eagle_packed as ep
    from specdec_core import make_drafter, run
    prompt = either.encode("Write a Python function that merges two sorted lists into one sorted list.")
    seen = []
    for fn in (ext.eagle_rows, ep._rows):
        got = []

        def level(*a, fn=fn, got=got):
            out = fn(*a)
            got.append([t.clone() for t in out])
            return out
        monkeypatch.setattr(ep, "rows", lambda level=level: level)
        d = make_drafter("eagle", either)
        d.sized = False                    # trees sized by measured times would differ between the two runs
        ids, _, _ = run(either, d, prompt, max_new_tokens=32)
        seen.append((ids, got))
    (ia, a), (ib, b) = seen
    assert ia == ib and len(a) == len(b) > 10
    for i, (x, y) in enumerate(zip(a, b)):
        assert all(torch.equal(u, v) for u, v in zip(x, y)), f"call {i}"
