"""The bundled target's products from its own 4-bit weights (GGUF Q4_1), read as 0.625 bytes a weight, not 2.

The bundled file stores every layer's weights as Q4_1: blocks of 32 along a row, each w = d q + m with d and m fp16
and q in 0..15 (ggml's format; llama.cpp reads it as is). Loading unpacks them into bf16, rounding d q + m once;
those bf16 values are the model we run. A one-token step is bound by reading those weights (270 MB a token in bf16):
csrc/kernels.cpp's 4-bit product reads the blocks instead and unpacks each one into
the very same bf16 values in registers (d q is exact in fp32, so its fused d q + m rounds as the file's mul then
add does), then multiplies them with fp32 sums on AMX's tiles (or, asked for, AVX-512 BF16 dot products). Each output
element is one sum in one order whatever rows come with it, so the forward stays batch-invariant; on AMX that order
is oneDNN's own, so the logits are its packed product's bit for bit (tests/test_q4.py).

`attach(fwd, path)` packs each layer's Q4_1 blocks into the kernel's tiles (packed.Dense.q4) and keeps them only
where the kernel's own unpacking gives back every bf16 weight bit for bit; the oneDNN-packed bf16 weights stay
beside them (q4_products(False) switches back, as the bitwise tests do). Without AMX they run on AVX-512 BF16 dot
products, each row alone, so the forward pads no rows for them (its own order: the bits differ from oneDNN's in a
few outputs). There the head (the tied embedding, Q8_0 in the file, run as its bf16 values) takes the same dot
products from its bf16 weights laid out as lines (`attach_head`): nothing to unpack, no rows padded, so it reads
its 57 MB faster than oneDNN's product; with AMX it keeps oneDNN's. See docs/forward.md for the figures.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import torch

# our fused products and the file's tensors they hold, in row order
_PARTS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gu": ("ffn_gate", "ffn_up"),
          "down": ("ffn_down",)}


Q4_1 = 3   # ggml's type id for Q4_1 tensors
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}   # GGUF value types' sizes


def read_tensors(path) -> dict[str, tuple[int, tuple[int, ...], np.ndarray]]:
    """A GGUF file's tensors (v2/v3): name -> (ggml type, dims as stored (ne0 first), the raw bytes, mapped).
    Walks the metadata only to skip it (the tokenizer's 49k strings among it)."""
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    mv = memoryview(buf)
    at = 0

    def take(fmt: str):
        nonlocal at
        v = struct.unpack_from(fmt, mv, at)
        at += struct.calcsize(fmt)
        return v[0]

    def text() -> str:
        nonlocal at
        n = take("<Q")
        at += n
        return bytes(mv[at - n:at]).decode("utf-8", "replace")

    def skip(t: int) -> None:
        nonlocal at
        if t == 8:
            n = take("<Q")   # (taken first: `at += take()` would add to the old offset)
            at += n
        elif t == 9:
            et, n = take("<I"), take("<Q")
            if et in _SCALAR:
                at += n * _SCALAR[et]
            else:
                for _ in range(n):
                    skip(et)
        else:
            at += _SCALAR[t]

    if bytes(mv[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    at = 4
    take("<I")                                         # version
    n_tensors, n_kv = take("<Q"), take("<Q")
    align = 32
    for _ in range(n_kv):
        key, t = text(), take("<I")
        if key == "general.alignment" and t == 4:
            align = take("<I")
        else:
            skip(t)
    infos = []
    for _ in range(n_tensors):
        name, nd = text(), take("<I")
        dims = tuple(take("<Q") for _ in range(nd))
        infos.append((name, dims, take("<I"), take("<Q")))
    base = at + (-at % align)
    out = {}
    for name, dims, t, off in infos:
        if t != Q4_1:
            out[name] = (t, dims, None)
            continue
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        out[name] = (t, dims, buf[base + off: base + off + rows * dims[0] // 32 * 20].reshape(rows, -1))
    return out


def _blocks(raw: np.ndarray, K: int):
    """A Q4_1 tensor's bytes [N, K / 32 * 20] -> q [N, K] u8, d [N, K / 32] fp16, m [N, K / 32] fp16."""
    b = torch.from_numpy(np.array(raw, copy=True)).view(raw.shape[0], K // 32, 20)
    d = b[..., 0:2].contiguous().view(torch.float16)[..., 0]
    m = b[..., 2:4].contiguous().view(torch.float16)[..., 0]
    qs = b[..., 4:]                                                     # k = j: low nibble of byte j; j + 16: high
    q = torch.cat([qs & 15, qs >> 4], -1).reshape(raw.shape[0], K)
    return q, d, m


def dequantize(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The bf16 weights the file's blocks stand for: d q, then + m, in fp32 (as the loader computes them)."""
    N, K = q.shape
    w = q.view(N, K // 32, 32).float() * d.float()[..., None] + m.float()[..., None]
    return w.view(N, K).to(torch.bfloat16)


def pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """q [N, K] u8, d, m [N, K / 32] fp16 -> the kernel's tiles [N / 16, K / 32, 320] u8 (csrc/kernels.cpp)."""
    N, K = q.shape
    G, B = N // 16, K // 32
    e = q.view(G, 16, B, 16, 2).permute(0, 2, 3, 1, 4).reshape(G, B, 16, 32)   # line kk, element 2 n + parity
    nib = (e[..., :16] | (e[..., 16:] << 4)).reshape(G, B, 256)
    sc = lambda t: t.view(G, 16, B).permute(0, 2, 1).contiguous().view(torch.uint8)   # noqa: E731  [G, B, 32]
    return torch.cat([nib, sc(d), sc(m)], -1).contiguous()


def unpacked(lines: torch.Tensor) -> torch.Tensor:
    """The kernel's unpacked lines [G, B, 16, 32] (csrc/kernels.cpp's q4_lines) -> the weights [16 G, 32 B] in row
    order: line kk's element 2 n + parity is weight (16 g + n, 32 b + 2 kk + parity)."""
    G, B = lines.shape[:2]
    return lines.view(G, B, 16, 16, 2).permute(0, 3, 1, 2, 4).reshape(G * 16, B * 32)


def _row_order(w: torch.Tensor, ref: torch.Tensor) -> torch.Tensor | None:
    """The permutation p with ref[p] == w bitwise (the loader reorders q and k rows for RoPE), or None."""
    c = min(64, w.shape[1])   # a row's first 64 weights tell it apart (the full check below is what counts)
    key = torch.randint(1, 1 << 20, (c,), generator=torch.Generator().manual_seed(0))
    h = lambda t: (t[:, :c].view(torch.int16).long() * key).sum(1)   # noqa: E731
    hw, hr = h(w), h(ref)
    where = {int(v): i for i, v in enumerate(hr.tolist())}
    if len(where) != len(hr):
        return None
    p = torch.tensor([where.get(int(v), -1) for v in hw.tolist()])
    if (p < 0).any() or not torch.equal(ref[p], w):
        return None
    return p


def kernel() -> tuple[str | None, str]:
    """Which 4-bit kernel the bundled target's layers take here: ("amx", "") where the OS grants AMX, else ("dots",
    "") where the CPU has AVX-512 BF16, else (None, why not). SPECDEC_Q4=0 turns them off."""
    from .packed import native_op
    if os.environ.get("SPECDEC_Q4", "1") == "0":
        return None, "off (SPECDEC_Q4=0)"
    lines = native_op("q4_lines")
    if lines is None:
        return None, "not here (they need the C++ build, AVX-512 BF16 and a bf16 CPU forward)"
    try:
        lines(torch.zeros(1, 1, 320, dtype=torch.uint8))
    except RuntimeError:   # the build is there, AVX-512 BF16 is not
        return None, "not here (this CPU has no AVX-512 BF16)"
    if native_op("q4_amx")():
        return "amx", ""
    # without AMX, AVX-512 BF16 dot products: each row alone, no padding to oneDNN's row blocks (docs/forward.md)
    return "dots", ""


def attach(fwd, path) -> str:
    """Give fwd's layer products their 4-bit tiles from the GGUF at path, where `kernel()` runs here and every
    weight comes back bit for bit. -> what it did, one line (also why not)."""
    from .packed import native_op
    if fwd.device.type != "cpu" or fwd.dtype != torch.bfloat16 or fwd.fast is None or fwd.fast.w is None:
        return "4-bit products: not here (they need the C++ build, AVX-512 BF16 and a bf16 CPU forward)"
    kind, why = kernel()
    if kind is None:
        return f"4-bit products: {why}"
    lines = native_op("q4_lines")
    try:
        raw = read_tensors(path)
    except (OSError, ValueError, struct.error) as e:   # pragma: no cover - the bundled file always reads
        return f"4-bit products: the file does not read ({type(e).__name__}: {e})"
    done = 0
    for l, blk in enumerate(fwd.blocks):
        for name, parts in _PARTS.items():
            dense = getattr(blk, name)
            ts = [raw.get(f"blk.{l}.{p}.weight") for p in parts]
            K = dense.w.shape[1]
            if any(t is None or t[0] != Q4_1 or t[1][0] != K for t in ts) or K % 32 or dense.w.shape[0] % 16 \
                    or dense.s is not None or dense.packed is None:
                continue
            qs, ds, ms, a = [], [], [], 0
            for t in ts:
                q, d, m = _blocks(t[2], K)
                n = q.shape[0]
                p = _row_order(dense.w[a:a + n], dequantize(q, d, m))
                if p is None:
                    break
                qs.append(q[p]), ds.append(d[p]), ms.append(m[p])
                a += n
            if a != dense.w.shape[0]:
                continue
            tiles = pack(torch.cat(qs), torch.cat(ds), torch.cat(ms))
            if torch.equal(unpacked(lines(tiles)), dense.w):
                dense.q4 = tiles
                done += 1
    head = ""
    if kind == "dots" and done == 4 * len(fwd.blocks):
        fwd.pad = 1   # the dot products compute each row alone: no rows to pad (attention pads its own)
        if attach_head(fwd.head):
            head = "; the LM head on the same dot products"
    fwd.fast.refresh()
    on = "AMX tiles" if kind == "amx" else "AVX-512 BF16"
    return (f"4-bit products: {done} of {4 * len(fwd.blocks)} layer products read the file's Q4_1 blocks ({on})"
            + head)


def lines_of(w: torch.Tensor) -> torch.Tensor:
    """bf16 weights [N, K] -> the dot products' lines [N / 16, K / 2, 32]: line p of group g holds rows 16 g ..
    16 g + 15 at k = 2 p and 2 p + 1, pair-interleaved (element 2 n + parity), as a tile's lines unpack."""
    N, K = w.shape
    return w.reshape(N // 16, 16, K // 2, 2).transpose(1, 2).reshape(N // 16, K // 2, 32).contiguous()


def attach_head(dense) -> bool:
    """Where the layers take the dot products (no AMX), the LM head takes them too, from its bf16 weights laid out
    as lines (Dense.q4 holds them; csrc/kernels.cpp's lines_product): each row alone, nothing padded. oneDNN's
    packed product stays beside it (q4_products(False) switches back). -> whether it did."""
    w = dense.w
    if w.dtype != torch.bfloat16 or w.dim() != 2 or w.shape[0] % 16 or w.shape[1] % 32 or dense.s is not None \
            or dense.b is not None or dense.packed is None:
        return False
    dense.q4 = lines_of(w)
    return True
