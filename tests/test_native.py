"""The forward's C++ layer loop (native.py, csrc/kernels.cpp) against the TorchScript one it replaces: the same logits
and the same cache, bit for bit, for every kind of one-row call; and the TorchScript loop where it cannot run."""
import pytest
import torch

import torch.utils.cpp_extension

import specdec_core.fast.loop as fl
import specdec_core.forward as fw
from specdec_core import backend
from specdec_core.fast.packed import int8_ok
from specdec_core.fast import native
from specdec_core.tree import compile_tree

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 0, 0, 0), (1, 0, 0, 0)]


@pytest.fixture(scope="module")
def ext():
    """The built extension (csrc/kernels.cpp), or the test skips with why it could not be built."""
    m = native.module()
    if m is None:
        pytest.skip(native.why())
    return m


@pytest.fixture
def faithful(ext):
    """The draft's loops, the attention loop and the 4-bit products off (csrc/kernels.cpp's draft_loops, own_attention,
    q4_products): the C++ functions run ATen's ops, op for op, as the TorchScript ones do."""
    was, att, q4 = ext.draft_loops(False), ext.own_attention(False), ext.q4_products(False)
    yield ext
    ext.draft_loops(was)
    ext.own_attention(att)
    ext.q4_products(q4)


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
def test_the_cpp_loop_is_the_scripted_loop_bit_for_bit(either, faithful, monkeypatch, probe):
    """With ATen's attention (own_attention off): probe (False, True) is a device whose slot-order scores are not
    a chain's, so every tree node gathers and is scored again as a chain (the tree path's rescore branch)."""
    lm, ext = either, faithful
    if probe is not None:
        f = lm.fwd
        monkeypatch.setitem(fw._IN_PLACE, (str(f.device), f.n_kv, f.n_heads // f.n_kv, f.head_dim), probe)
    ids = lm.encode("def area(r):\n    return 3.14159 * r * r\n\n" * 16).tolist()
    runs = []
    for loop in (ext.one_row_layers, fl._one_row_layers):
        monkeypatch.setattr(fl, "one_row_layers", lambda loop=loop: loop)
        runs.append(calls(lm, ids))
    (a, ka), (b, kb) = runs
    assert len(a) == len(b) == 10
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"call {i}"
    assert torch.equal(ka, kb)


def test_an_int8_draft_network_runs_the_same_in_either_loop(bundled, faithful, monkeypatch):
    """A draft model's int8 products (no row padding) through the C++ loop, its own int8 kernel off: the scripted
    loop's bits."""
    ext = faithful
    if not int8_ok(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this build of torch has no CPU int8 weight product")
    full = backend.forward_of(bundled.model, int8=True)
    f = fl.attach(full.derive(full.blocks[:3], full.norm, full.head))
    ids = bundled.encode("A list of primes: 2, 3, 5, 7, 11, 13, 17, 19, 23").tolist()
    outs = []
    for loop in (ext.one_row_layers, fl._one_row_layers):
        monkeypatch.setattr(fl, "one_row_layers", lambda loop=loop: loop)
        c = f.new_cache()
        outs.append([f.append(torch.tensor(ids[:-4]), c)] + [f.append(torch.tensor([t]), c) for t in ids[-4:]])
    assert all(torch.equal(x, y) for x, y in zip(*outs))


def test_without_a_build_the_scripted_loop_runs_and_says_why(monkeypatch):
    monkeypatch.setenv("SPECDEC_NATIVE", "0")
    assert native.op("one_row_layers") is None and native.op("eagle_rows") is None
    monkeypatch.delenv("SPECDEC_NATIVE")
    monkeypatch.setattr(native, "_state", {})

    def no_compiler(*a, **k):
        raise RuntimeError("Error building extension 'specdec_kernels': c++: command not found")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    assert native.op("one_row_layers") is None
    assert "could not be built" in native.why() and "command not found" in native.why()


def test_the_cpp_eagle_level_is_the_scripted_one(either, faithful, monkeypatch):
    """The EAGLE head's layer (a proposal's root rows, then one call per tree level) through csrc/kernels.cpp's
    eagle_rows, its own loops off, and through the scripted _rows: every call's features, draft log-probs and ids
    bit for bit, over a decode (int8 products in bf16, oneDNN-packed fp32 ones in fp32)."""
    ext = faithful
    import specdec_core.fast.eagle_packed as ep
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
        # unsized: trees sized by measured times would differ between the two runs (and sizing times drafts at once)
        d = make_drafter("eagle", either, sized=False)
        ids, _, _ = run(either, d, prompt, max_new_tokens=32)
        seen.append((ids, got))
    (ia, a), (ib, b) = seen
    assert ia == ib and len(a) == len(b) > 10
    for i, (x, y) in enumerate(zip(a, b)):
        assert all(torch.equal(u, v) for u, v in zip(x, y)), f"call {i}"


def _int8_weight(N: int, K: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    return w, (torch.rand(N, generator=g) * 0.01 + 1e-3).to(torch.bfloat16)


@pytest.mark.parametrize("N,K", [(64, 576), (36, 1536), (8, 8224)])
def test_the_int8_kernel_is_the_product_up_to_bf16_rounding_row_by_row(ext, N, K):
    """csrc/kernels.cpp's int8 product (int16 activations, exact int32 sums; K = 8224 crosses the 8192 a lane can
    sum without overflow): within bf16's rounding (half a unit: 2^-8 of the value) of the exact product plus what
    rounding x to int16 can move it by, and each row
    of a batch is that row alone, bit for bit (a draft stays batch-invariant)."""
    w, s = _int8_weight(N, K, K)
    g = torch.Generator().manual_seed(N)
    for m in (1, 2, 3, 4, 5, 9):
        x = torch.randn(m, K, generator=g)
        x[:, 7] *= 60                                   # an outlier channel, as hidden states have
        x = x.to(torch.bfloat16)
        y = ext.int8_product(x, w, s)
        ref = x.double() @ w.double().T * s.double()                                  # [m, N]
        # rounding x to 1/32767 of its row's largest |x| moves the sum by at most half a step a weight
        q = x.double().abs().amax(1, keepdim=True) / 32767 / 2 * (w.double().abs().sum(1) * s.double())
        assert y.dtype == torch.bfloat16 and y.shape == (m, N)
        assert ((y.double() - ref).abs() <= 2 ** -8 * (ref.abs() + q) + q * 1.001).all()
        assert torch.equal(torch.cat([ext.int8_product(x[i:i + 1], w, s) for i in range(m)]), y)


def _int8_exact(x, w, s):
    """The int8 kernels' product computed in int64: x's rows to int16 as they quantize them, the exact integer sums,
    one rounding to fp32, the two scales, bf16."""
    x32 = x.float()
    mx = x32.abs().amax(1)
    sx = torch.where(mx > 0, mx / 32767, torch.ones_like(mx))                         # fp32, as the kernel's
    xq = torch.round(x32 * (1 / sx)[:, None]).to(torch.int64)                           # to nearest even
    return ((xq @ w.to(torch.int64).T).float() * sx[:, None] * s.float()).to(torch.bfloat16)


@pytest.mark.parametrize("N,K", [(64, 576), (48, 1536), (32, 8256)])
def test_both_int8_kernels_give_the_exact_integer_sum_rounded_once(ext, N, K):
    """AVX-512 VNNI's kernel and AMX's tile one (2+ rows, where the CPU has it) both sum exactly and round once:
    the same bits as an int64 reference, so a row's output does not depend on which kernel its batch took."""
    w, s = _int8_weight(N, K, K + 1)
    g = torch.Generator().manual_seed(K)
    was = ext.int8_amx()
    try:
        for m in (1, 2, 3, 5, 17):
            x = torch.randn(m, K, generator=g)
            x[:, 3] *= 80
            x = x.to(torch.bfloat16)
            ref = _int8_exact(x, w, s)
            for tiles in (True, False):
                ext.int8_amx(tiles)
                assert torch.equal(ext.int8_product(x, w, s), ref), (m, tiles)
    finally:
        ext.int8_amx(was)


def test_the_int8_kernel_does_not_overflow_and_falls_back_where_it_does_not_fit(ext):
    K = 8192                                            # a lane's most: 512 products of 32767 * 127 in int32
    w = torch.full((4, K), 127, dtype=torch.int8)
    w[1] = -127
    s = torch.ones(4, dtype=torch.bfloat16)
    x = torch.full((1, K), 3.0, dtype=torch.bfloat16)
    y = ext.int8_product(x, w, s)
    exact = torch.tensor([3.0 * 127 * K, -3.0 * 127 * K], dtype=torch.float64).to(torch.bfloat16)
    assert torch.equal(y[0, :2], exact)
    w, s = _int8_weight(8, 48, 1)                       # K not a multiple of 32: ATen's product, its bits
    x = torch.randn(3, 48).to(torch.bfloat16)
    assert torch.equal(ext.int8_product(x, w, s), torch.ops.aten._weight_int8pack_mm(x, w, s))
    was = ext.draft_loops(False)                        # off: ATen's product whatever the shape
    try:
        w, s = _int8_weight(8, 64, 2)
        x = torch.randn(2, 64).to(torch.bfloat16)
        assert torch.equal(ext.int8_product(x, w, s), torch.ops.aten._weight_int8pack_mm(x, w, s))
    finally:
        ext.draft_loops(was)


def test_the_draft_loops_compute_the_eagle_head_in_fp32(bundled_fp32, ext):
    """The EAGLE level's own attention (its exp) and top-k loops, on the bundled target's shapes (head dim 64): the
    packed head in fp32 against the trained module's forward (tests/eagle_ref.py), features and top-k draft
    log-probs to ~1e-5, the same ids; over the sequence's causal rows, then tree rows that see different branches."""
    from specdec_core.drafters.eagle import Eagle, Head
    from tests.eagle_ref import ModuleStep
    from specdec_core.forward import mask_bias
    assert ext.draft_loops(True)
    torch.manual_seed(0)
    head = Head.for_target(bundled_fp32.model)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    d = Eagle(bundled_fp32, head.eval(), manifest={}, depth=3, topk=3, nodes=8, int8=False)
    ref = ModuleStep(d)
    f0, f1 = torch.randn(40, 576), torch.randn(3, 576)
    causal = mask_bias(torch.ones(40, 40, dtype=torch.bool).tril())
    branch = mask_bias(torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool))
    outs = []
    with torch.inference_mode():
        for step in (d.rows, ref):
            kv = step.scratch(8)
            a = step(f0, torch.arange(100, 140), torch.arange(1, 41), causal, kv, k=4)
            b = step(f1, torch.tensor([5, 6, 7]), 41, branch, kv, k=4)
            outs.append((a, b))
    for (fa, la, ia), (fb, lb, ib) in zip(*outs):
        torch.testing.assert_close(fa, fb, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(la, lb, atol=1e-4, rtol=1e-5)
        assert torch.equal(ia, ib)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_draft_top_k_is_the_log_softmax_top_k(ext, dtype):
    """csrc/kernels.cpp's one-pass top-k log-probs (its own exp): torch's log_softmax values to ~1e-6, the same
    indices, largest first; rows of 4096 and of a length that leaves a tail of a vector."""
    g = torch.Generator().manual_seed(3)
    for V, k, tol in ((4096, 2, 2e-6), (4096, 8, 2e-6), (1000, 3, 2e-6), (49152, 4, 2e-5)):   # fp32 sums' error
        y = (torch.randn(3, V, generator=g) * 4).to(dtype)
        lp, ix = ext.draft_top(y, k)
        ref = torch.log_softmax(y.double(), -1)
        want = torch.topk(ref, k, -1)
        torch.testing.assert_close(lp.double(), want.values, atol=tol, rtol=0)
        assert torch.equal(ref.gather(1, ix), want.values)      # the k largest (in bf16 a tie may pick another)
    if ext.draft_loops_fit():                                   # the loop's own rule (torch.topk has none)
        y = torch.zeros(1, 64)
        y[0, 9] = y[0, 40] = 1.0
        assert ext.draft_top(y, 3)[1].tolist() == [[9, 40, 0]]  # ties: the lower index first


@pytest.fixture
def tiles(ext):
    """The target's attention on AMX's bf16 tiles (csrc/kernels.cpp's attend_tiles), or the test skips: a CPU without AMX
    runs the fp32 loop, which the tests above and tests/test_forward.py cover."""
    if not ext.tile_attention():
        pytest.skip("this CPU runs no AMX tiles (the fp32 attention loop serves it)")
    return ext


def test_a_bf16_model_keeps_a_bf16_cache_only_where_the_tiles_read_it(bundled, bundled_fp32, tiles):
    assert bundled.fwd.kv_dtype() == torch.bfloat16 and bundled.new_cache().kv.dtype == torch.bfloat16
    assert bundled_fp32.fwd.kv_dtype() == torch.float32          # an fp32 model: the fp32 loop, an fp32 cache
    tiles.tile_attention(False)
    try:
        assert bundled.fwd.kv_dtype() == torch.float32
    finally:
        tiles.tile_attention(True)


def test_the_tiles_give_the_same_bits_from_a_bf16_or_an_fp32_cache(bundled, tiles, monkeypatch):
    """Keys rounded to bf16 as the bf16 cache stores them, values bf16 numbers either way: a prefill, a chunk,
    decode steps, a verify of 16 and trees (inside a key block and across one) give the same logits and hidden
    states from either cache."""
    ids = bundled.encode("def area(r):\n    return 3.14159 * r * r\n\n" * 16).tolist()
    runs = []
    for dt in (torch.bfloat16, torch.float32):
        monkeypatch.setattr(bundled.fwd, "kv_dtype", lambda dt=dt: dt)
        out, kv = calls(bundled, ids)
        assert kv.dtype == dt
        runs.append((out, kv))
    (a, ka), (b, kb) = runs
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"call {i}"
    assert torch.equal(ka.float(), kb.to(torch.bfloat16).float())


def test_the_tiles_round_as_bf16_attention_does_and_no_further(bundled, tiles):
    """Against the fp32 loop (tiles off, an fp32 cache): logits within what rounding q, k and p to bf16 moves them
    by, and the same greedy token at nearly every position of a long prefill."""
    ids = torch.tensor(bundled.encode("The committee met on Tuesday to review the budget. " * 12).tolist()[:160])
    out = {}
    for on in (True, False):
        tiles.tile_attention(on)
        try:
            out[on] = bundled.forward(ids, bundled.new_cache())
        finally:
            tiles.tile_attention(True)
    a, b = out[True], out[False]
    assert not torch.equal(a, b)                     # the tiles really ran (bf16 rounding moves the last bits)
    assert (a - b).abs().mean() < 0.05 * b.abs().mean()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.95


def test_a_last_key_block_past_the_cache_end_is_read_as_zeros(tiles):
    """S not a multiple of 16 and a cache that ends at S: the tiles read the last block from a padded copy, not past
    the tensor; the output equals the same keys in a longer cache (whose extra slots hold other numbers)."""
    g = torch.Generator().manual_seed(3)
    Hq, Hkv, D, S, n = 9, 3, 64, 37, 4
    q = torch.randn(n, Hq, D, generator=g) * 0.125
    kv = torch.randn(2, Hkv, S, D, generator=g).to(torch.bfloat16)
    big = torch.randn(2, Hkv, S + 40, D, generator=g).to(torch.bfloat16)
    big[:, :, :S] = kv
    bias = torch.zeros(n, S)
    for j in range(n):                                 # node j at position S - n + j sees the slots up to itself
        bias[j, S - n + j + 1:] = float("-inf")
    outs = []
    for k, v in ((kv[0], kv[1]), (big[0], big[1])):
        out = torch.zeros(n, Hq * D)
        assert tiles.attend_chain(q, k, v, bias, S, list(range(n)), out, list(range(n)), True)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0
