"""The forward's layer loop compiled as C++ (csrc/span.cpp), where this machine can build it; TorchScript elsewhere.

forward._span_layers runs a one-row call's decoder layers (a decode step, a chain verify, a tree, a prefill) as one
TorchScript function. Its ~90 small ops a layer each pass through TorchScript's interpreter, which boxes every
argument and result; csrc/span.cpp calls the same ATen ops, in the same order, straight from C++, so the logits
and the cache are bitwise the same (tests/test_native.py) and a step is shorter by the interpreter's share
(docs/measurements.md: about 1 ms of a 22 ms step on a 2-core Xeon).

It is built once per machine with torch's extension builder (a C++ compiler and ninja; ~30 s on 2 cores) into
`.build/` beside the package, at `make setup` or else at first use, and reused while the source is unchanged.
Where there is no compiler, the build fails or SPECDEC_NATIVE=0 is set, `span_layers()` is None and the forward
runs its TorchScript loop: the same bits, a little slower.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

SRC = Path(__file__).parent / "csrc" / "span.cpp"
BUILD = Path(__file__).resolve().parent.parent / ".build" / "native"
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


def span_layers():
    """csrc/span.cpp's span_layers (forward._span_layers' signature), or None: off, or not buildable here."""
    if not enabled():
        return None
    m = module()
    return None if m is None else m.span_layers


def _build(verbose: bool):
    try:
        import torch
        from torch.utils import cpp_extension
        if not torch.backends.mkldnn.is_available():
            return None, "this build of torch has no oneDNN (the packed products the loop calls)"
        BUILD.mkdir(parents=True, exist_ok=True)
        if verbose:
            print(f"loading the forward's C++ layer loop ({SRC.name}; built first where it is new: ~30 s)", file=sys.stderr)
        mod = cpp_extension.load("specdec_span", [str(SRC)], extra_cflags=["-O3", "-ffp-contract=off"], build_directory=str(BUILD),
                                 verbose=False)
        return mod, ""
    except Exception as e:   # no compiler, no ninja, a failed build: the TorchScript loop runs instead
        msg = " ".join(str(e).split())[:300]
        return None, f"the C++ layer loop could not be built ({type(e).__name__}: {msg})"


if __name__ == "__main__":   # `python -m specdec_core.native`: build now (make setup), say whether it is in use
    m = module(verbose=True)
    print("the forward's C++ layer loop is built" if m is not None else why())
