"""The bundled target's 4-bit products (q4.py, csrc/kernels.cpp): the tiles hold the very bf16 weights the model runs,
the kernel multiplies them as a product does (up to its own summation order), each row alone on either kernel,
and the packed bf16 product comes back when they are off."""
import os

import numpy as np
import pytest
import torch

from specdec_core.fast import native, q4
from specdec_core.models import bundled_gguf


@pytest.fixture(scope="module")
def ext():
    m = native.module()
    if m is None:
        pytest.skip(native.why())
    try:
        m.q4_lines(torch.zeros(1, 1, 320, dtype=torch.uint8))
    except RuntimeError:
        pytest.skip("this CPU has no AVX-512 BF16: the 4-bit products do not run here")
    return m


def blocks(N: int, K: int, seed: int = 0):
    """Random Q4_1-like blocks: q in 0..15, d > 0 and m of a real layer's sizes, fp16."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    d = (torch.rand(N, K // 32, generator=g) * 0.02 + 1e-3).half()
    m = (-torch.rand(N, K // 32, generator=g) * 0.15).half()
    return q, d, m


@pytest.mark.parametrize("N,K", [(16, 32), (960, 576), (576, 1536)])
def test_the_tiles_unpack_into_the_bf16_weights_bit_for_bit(ext, N, K):
    q, d, m = blocks(N, K)
    w = q4.dequantize(q, d, m)
    assert torch.equal(q4.unpacked(ext.q4_lines(q4.pack(q, d, m))), w)
    p = torch.randperm(N, generator=torch.Generator().manual_seed(1))   # the loader's row order, found back
    assert torch.equal(q4._row_order(w[p], w), p)
    w2 = w.clone()
    w2[3, 5] = -w2[3, 5] if w2[3, 5] != 0 else 1.0
    assert q4._row_order(w2, w) is None                                # a weight that differs: no tiles


@pytest.mark.parametrize("tiles", [True, False])
def test_the_product_is_x_times_the_weights_each_row_alone(ext, tiles):
    """Either kernel (AMX's tiles where this CPU has them; the dot products always): within bf16's rounding of the
    fp32 product, and a row's bits the same alone, padded or among 20."""
    was = ext.q4_amx(None)
    if tiles and not was:
        pytest.skip("no AMX here")
    ext.q4_amx(tiles)
    try:
        q, d, m = blocks(576, 1536, seed=2)
        t, w = q4.pack(q, d, m), q4.dequantize(q, d, m)
        x = torch.randn(20, 1536, generator=torch.Generator().manual_seed(3)).bfloat16()
        y = ext.dense(x, w, t, None, 32, 4)
        ref = x.float() @ w.float().t()
        assert y.dtype == torch.bfloat16 and y.shape == (20, 576)
        assert ((y.float() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-3).all()
        for i in (0, 7, 19):
            assert torch.equal(ext.dense(x[i:i + 1].clone(), w, t, None, 32, 4)[0], y[i])
        assert torch.equal(ext.dense(x[:5].clone(), w, t, None, 32, 4), y[:5])
    finally:
        ext.q4_amx(True)


def test_the_dot_products_give_each_row_its_own_bits_at_every_row_count(ext):
    """The dot-product kernel runs 1-16 rows as one block (a compiled row count each) against 4, 2 or 1 row groups at
    once, and more rows in blocks of up to 8 against lines unpacked once: every count, and group counts that leave a
    tail, give a row the bits it gets alone (37 rows, then their last 1 .. 36)."""
    ext.q4_amx(False)
    try:
        for N, K in [(48, 576), (80, 1536), (112, 64)]:
            q, d, m = blocks(N, K, seed=N)
            t, w = q4.pack(q, d, m), q4.dequantize(q, d, m)
            x = torch.randn(37, K, generator=torch.Generator().manual_seed(K)).bfloat16()
            y = ext.dense(x, w, t, None, 32, 4)
            ref = x.float() @ w.float().t()
            assert ((y.float() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-3).all()
            for n in range(1, 37):
                assert torch.equal(ext.dense(x[-n:].clone(), w, t, None, 32, 4), y[-n:]), (N, K, n)
    finally:
        ext.q4_amx(True)


def test_off_the_packed_bf16_product_runs(ext):
    q, d, m = blocks(64, 576, seed=4)
    t, w = q4.pack(q, d, m), q4.dequantize(q, d, m)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
    x = torch.randn(3, 576).bfloat16()
    was = ext.q4_products(False)
    try:
        off = ext.dense(x, packed, t, None, 32, 4)
    finally:
        ext.q4_products(was)
    plain = torch.ops.mkldnn._linear_pointwise(torch.cat([x, x.new_zeros(1, 576)]), packed, None, "none", [], "")[:3]
    assert torch.equal(off, plain)
    assert ext.q4_products() is was


def test_the_bundled_targets_layers_all_read_their_blocks(bundled, ext):
    if bundled.fwd is None or bundled.fwd.dtype != torch.bfloat16:
        pytest.skip("the bundled model runs in fp32 here (no native bf16)")
    f = bundled.fwd
    if os.environ.get("SPECDEC_Q4") == "0":
        pytest.skip("SPECDEC_Q4=0 turns them off")
    assert f.q4_note.startswith("4-bit products: 120 of 120")
    assert ("AMX tiles" in f.q4_note) == ext.q4_amx()
    assert f.pad == (1 if not ext.q4_amx() else 4)   # the dot products take each row alone: no padded rows
    for b in f.blocks:
        for dn in (b.qkv, b.o, b.gu, b.down):
            assert dn.q4 is not None and torch.equal(q4.unpacked(ext.q4_lines(dn.q4)), dn.w)
    # without AMX the LM head takes the same dot products, from its bf16 weights as lines; with AMX oneDNN's
    assert (f.head.q4 is not None) == (not ext.q4_amx()) == f.q4_note.endswith("the LM head on the same dot products")
    if f.head.q4 is not None:
        assert torch.equal(f.head.q4, q4.lines_of(f.head.w))


def test_the_heads_lines_give_each_row_its_own_bits_and_off_onednns_product_runs(ext):
    """An LM head's bf16 weights as the dot products' lines (q4.lines_of; csrc/kernels.cpp's lines_product): every row
    count from 1 to 21 gives a row the bits it gets alone, within bf16's rounding of the fp32 product, with a tail of
    groups past the threads' chunks of 6; with the 4-bit products off, oneDNN's packed product (rows padded to 4)."""
    g = torch.Generator().manual_seed(5)
    N, K = 4096 + 16 * 5, 576
    w = (torch.randn(N, K, generator=g) * 0.05).bfloat16()
    lines = q4.lines_of(w)
    assert lines.shape == (N // 16, K // 2, 32)
    assert torch.equal(lines[5, 7].view(16, 2), w[80:96, 14:16])      # line p of group g: rows 16 g.., k = 2 p, 2 p + 1
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
    x = torch.randn(21, K, generator=g).bfloat16()
    y = ext.dense(x, packed, lines, None, 32, 4)
    ref = x.float() @ w.float().t()
    assert y.dtype == torch.bfloat16 and y.shape == (21, N)
    assert ((y.float() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-3).all()
    for n in range(1, 21):
        assert torch.equal(ext.dense(x[-n:].clone(), packed, lines, None, 32, 4), y[-n:]), n
    was = ext.q4_products(False)
    try:
        off = ext.dense(x[:3].clone(), packed, lines, None, 32, 4)
    finally:
        ext.q4_products(was)
    plain = torch.ops.mkldnn._linear_pointwise(torch.cat([x[:3], x.new_zeros(1, K)]), packed, None, "none", [], "")
    assert torch.equal(off, plain[:3])


def test_a_file_that_is_not_gguf_is_said_plainly(tmp_path, bundled):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF"):
        q4.read_tensors(bad)
    t = q4.read_tensors(bundled_gguf())
    kind, dims, raw = t["blk.0.ffn_down.weight"]
    assert kind == q4.Q4_1 and dims == (1536, 576) and raw.shape == (576, 1536 // 32 * 20)
    assert isinstance(raw, np.ndarray)


def test_on_amx_the_tiles_sum_as_onednns_packed_product_does(ext):
    """On AMX both kernels add each output's k pairs in order on the tiles: the 4-bit product is oneDNN's bf16
    product bit for bit (reproduce.same_kernels counts them as one family; this holds it), with its row groups two
    at a time or alone, and rows past one tile's 16."""
    if not ext.q4_amx():
        pytest.skip("no AMX here")
    for N, K in [(960, 576), (576, 1536), (3072, 576), (48, 576), (80, 1536)]:   # odd row-group counts: one alone
        q, d, m = blocks(N, K, seed=N)
        t, w = q4.pack(q, d, m), q4.dequantize(q, d, m)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 4)
        for rows in (1, 4, 16, 20):
            x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows)).bfloat16()
            ours = ext.dense(x, packed, t, None, 32, 4)
            was = ext.q4_products(False)
            try:
                theirs = ext.dense(x, packed, t, None, 32, 4)
            finally:
                ext.q4_products(was)
            assert torch.equal(ours, theirs), (N, K, rows)


def test_where_the_kernel_cannot_run_the_forward_keeps_its_products(bundled, monkeypatch):
    """A CPU without AVX-512 BF16 (the unpacking raises), or SPECDEC_Q4=0: no tiles, rows padded, a note saying why."""
    import specdec_core.fast.packed as pk
    import specdec_core.forward as fw
    from specdec_core.fast.loop import attach
    if bundled.fwd is None or pk.native_op("q4_lines") is None:
        pytest.skip("no C++ build here")

    def no_bf16(q):
        raise RuntimeError("q4_lines: a packed 4-bit weight on a CPU with AVX-512 BF16")
    fake, real = {"q4_lines": no_bf16, "q4_amx": lambda tiles=None: False}, pk.native_op
    monkeypatch.setattr(pk, "native_op", lambda name: fake.get(name) or real(name))
    f = attach(fw.Forward(bundled.fwd.embed, [fw.Block(b.ln1, pk.Dense(b.qkv.w), pk.Dense(b.o.w), b.ln2,
                                                       pk.Dense(b.gu.w), pk.Dense(b.down.w))
                                              for b in bundled.fwd.blocks[:2]],
                          bundled.fwd.norm, bundled.fwd.head, None, bundled.fwd.n_heads, bundled.fwd.n_kv,
                          bundled.fwd.head_dim, bundled.fwd.eps, bundled.fwd.inv_freq))
    note = q4.attach(f, bundled_gguf())
    # a CPU without native bf16 runs the target in fp32, which the 4-bit products never serve: said before asking
    why = "no AVX-512 BF16" if bundled.dtype == torch.bfloat16 else "a bf16 CPU forward"
    assert why in note and all(b.qkv.q4 is None for b in f.blocks)
    if bundled.dtype != torch.bfloat16:
        return                     # (SPECDEC_Q4 is asked only of a forward the products could serve)
    fake["q4_lines"] = lambda q: torch.zeros(1)
    monkeypatch.setenv("SPECDEC_Q4", "0")
    note = q4.attach(f, bundled_gguf())
    assert "off (SPECDEC_Q4=0)" in note and all(b.qkv.q4 is None for b in f.blocks) and f.pad == 4
