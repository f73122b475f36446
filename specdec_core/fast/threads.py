"""The CPU's worker threads belong to the thread that called the model: give them back when it is done.

torch's intra-op parallelism (and csrc/kernels.cpp's loops through it) is OpenMP. Under GNU OpenMP (libgomp, what
torch's Linux wheels ship) every thread that opens a parallel region gets a team of its own workers, kept until
that thread exits. Between regions the workers spin for a while, so the next region starts at once; a decode step
opens over a hundred regions, so that spinning is much of its speed. But libgomp spins only while the process holds no
more of its threads than there are CPUs: past that it falls back to sleeping at every barrier. So one idle thread
that once ran the model and lives on (an app session waiting in line for its next turn) slows every
other thread's decoding, close to twice as slow (docs/measurements.md has the figures).

`release()` frees the calling thread's team (OpenMP 5.0's omp_pause_resource_all, soft, which libgomp applies to
the calling thread's own team only: the next region builds a new one, ~0.1 ms). The serving gate (serving/gate.py)
calls it when a thread gives back its turn at the model, before the next one can start. Under another runtime (LLVM's
or Intel's, whose pause is process-wide and whose idle workers sleep after a fixed time anyway) or none, it does
nothing.
"""
from __future__ import annotations

import ctypes
import functools

OMP_PAUSE_SOFT = 1
RUNTIME = "libgomp.so.1"   # GNU OpenMP's name: torch's own copy on Linux, already loaded, is the one found


@functools.lru_cache(maxsize=1)
def _pause():
    """GNU OpenMP's omp_pause_resource_all where torch runs on it, or None."""
    import torch   # loads torch's own runtime first, so the name below finds that one
    if not torch.backends.openmp.is_available():
        return None
    try:
        f = ctypes.CDLL(RUNTIME).omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = [ctypes.c_int], ctypes.c_int
    return f


def release() -> bool:
    """Free the calling thread's OpenMP workers (it must not be inside a parallel region) -> whether it did."""
    f = _pause()
    return f is not None and f(OMP_PAUSE_SOFT) == 0
