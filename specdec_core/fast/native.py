"""The forward's layer loop and the EAGLE head's layer compiled as C++ (csrc/kernels.cpp) where this machine can build
them; TorchScript elsewhere.

fast/loop._one_row_layers runs a one-row call's decoder layers (a decode step, a chain verify, a tree, a prefill) as one
TorchScript function. Its ~90 small ops a layer each pass through TorchScript's interpreter, which boxes every
argument and result; csrc/kernels.cpp calls the same ATen ops, in the same order, straight from C++, so the logits
and the cache are bitwise the same with its own loops below off (tests/test_native.py) and a step is shorter by the
interpreter's share; the elementwise stretches (RoPE with the cache writes; RMSNorm's parts around ATen's sum, with the residual add before
it; SwiGLU through a table of ATen's bf16 silu) and attention's row moves (queries into each key/value head's rows,
the output back in row order, converted once) are plain loops that compute the same bits (docs/forward.md says why
they can; it also has their figures).
The EAGLE head's layer (fast/eagle_packed._rows), run once per
tree level, is ported the same way; which nodes a level expands, and when a tree stops, stays in Python
(drafters/eagle.py's _grow): a port computes, it does not decide.

Drafts also get loops of their own, which round differently from ATen's ops (a draft may: verification is exact
whatever it proposes): an int8-weight product with int16 activations on AVX-512 VNNI, or on AMX's int8 tiles at 2+
rows (`int8_product`, exact integer sums either way, so the same bits; every int8 draft product, in either loop or
through fast/packed.mm; `int8_amx(False)` keeps VNNI's), EAGLE's level attention and a one-pass top-k of
log-probs (`draft_top`). `draft_loops(False)` turns them off, so the bitwise tests compare ATen's ops op for op.
The target's attention, too, runs as one loop per query (`own_attention`; docs/forward.md says why a query gets the
same bits however it is batched, and forward.Forward._attend calls it for batches), which rounds differently from
ATen's ops: `own_attention(False)` turns it off for the same bitwise tests. A bf16 model's runs on AMX's bf16 tiles
where the CPU has them (`tile_attention`, over a bf16 cache: Forward.kv_dtype), the fp32 loop elsewhere.
The bundled target's layer products can read its file's 4-bit blocks (q4.py: unpacked in registers into the same bf16
weights, summed on AMX's tiles or AVX-512 BF16 dot products; `q4_products(False)` restores oneDNN's packed bf16
product). RMSNorm's and SwiGLU's bf16 loops run 16 elements at a time with c10's rounding (the same bits).
They are compiled for AVX-512 (F, BW, VNNI; BF16 for the 4-bit product) and chosen at run time: on a CPU without it
ATen's ops run. The build
passes -fopenmp so that ATen's parallel_for, inlined here, splits work over torch's own OpenMP threads.

It is built once per machine with torch's extension builder (a C++ compiler and ninja; ~30 s on 2 cores) into
`.build/` beside the package, at `make setup` or else at first use, and reused while the source is unchanged.
Where there is no compiler, the build fails or SPECDEC_NATIVE=0 is set, `op(name)` is None and the TorchScript
function runs: ATen's ops throughout (the C++ loop's bits with its own loops off), a little slower. Every path of
one process takes the same choice, so speculative and plain decoding always share their bits.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

SRC = Path(__file__).parent / "csrc" / "kernels.cpp"
BUILD = Path(__file__).resolve().parents[2] / ".build" / "native"
_lock = threading.Lock()
_state: dict = {}


def enabled() -> bool:
    """SPECDEC_NATIVE=0 turns the C++ loop off (the TorchScript one runs)."""
    return os.environ.get("SPECDEC_NATIVE", "1") != "0"


def module(verbose: bool = False):
    """The built extension, building it first if needed; None where it cannot be built (the reason: `why()`)."""
    with _lock:
        if "mod" not in _state:
            _state["mod"], _state["why"] = _build(verbose)
        return _state["mod"]


def why() -> str:
    """Why the C++ loop is not in use ('' when it is)."""
    module()
    return _state["why"]


def op(name: str):
    """One of csrc/kernels.cpp's functions, or None (off, or not buildable here): `one_row_layers` (fast/loop._one_row_layers'
    signature and bits), `eagle_rows` (fast/eagle_packed._rows'), and
    the kernels' entries and switches."""
    if not enabled():
        return None
    m = module()
    return None if m is None else getattr(m, name)


def _build(verbose: bool):
    try:
        import torch
        from torch.utils import cpp_extension
        if not torch.backends.mkldnn.is_available():
            return None, "this build of torch has no oneDNN (the packed products the loop calls)"
        BUILD.mkdir(parents=True, exist_ok=True)
        if verbose:
            print(f"loading the forward's C++ layer loop ({SRC.name}; built first where it is new: ~30 s)",
                  file=sys.stderr)
        # -ffp-contract=off: no product and sum fused into an FMA, so the loops round as ATen's ops do
        mod = cpp_extension.load("specdec_kernels", [str(SRC)], extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"],
                                 build_directory=str(BUILD), verbose=False)
        return mod, ""
    except Exception as e:   # no compiler, no ninja, a failed build: the TorchScript loop runs instead
        msg = " ".join(str(e).split())[:300]
        return None, f"the C++ layer loop could not be built ({type(e).__name__}: {msg})"


if __name__ == "__main__":   # `python -m specdec_core.fast.native`: build now (make setup), say whether it is in use
    m = module(verbose=True)
    print("the forward's C++ layer loop is built" if m is not None else why())
