"""The decoder's clock: wall time, or, inside `cpu_work()`, the CPU time of the one thread that decodes.

A speedup is a ratio of two decoders' work. Wall time counts that work plus every moment the decoder waited for a
core: on a 2-core machine with a browser (or anything else) awake beside it, the waiting varies from run to run
by more than the effect being measured. Inside `cpu_work()` the model runs on one intra-op thread (leaving the
other cores to the browser and the server) and the clock reads that thread's own CPU time (time.thread_time):
time the thread was not on a core is not counted, so a busy neighbour no longer lands in one side of a pair. One
thread matters as much as the clock: with two, an OpenMP worker that spins at a barrier while its partner was
descheduled would charge the neighbour's time to the decoder anyway. What the clock cannot remove is a
neighbour's pull on the shared caches and memory bandwidth, which slows the work itself (docs/measurements.md,
"Timing the decoder's own work").

Everything that times a step (engine, step, batch, bench.passes) reads `now()`; outside `cpu_work()` it is the
wall clock, as a live run that is shown as it happens needs.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import torch

THREADS = 1   # intra-op threads while timing: the rest of the machine is left to the browser and the server

_here = threading.local()


def measuring() -> bool:
    """Whether this thread is inside cpu_work()."""
    return getattr(_here, "depth", 0) > 0


def now() -> float:
    """Seconds: this thread's CPU time inside cpu_work(), else the wall clock (time.perf_counter)."""
    return time.thread_time() if measuring() else time.perf_counter()


@contextmanager
def cpu_work(threads: int = THREADS) -> Iterator[None]:
    """Time the block by the decoding thread's own CPU time, the model on `threads` intra-op threads (restored
    after). Nests: an inner block keeps the outer one's setting."""
    if measuring():
        _here.depth += 1
        try:
            yield
        finally:
            _here.depth -= 1
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    _here.depth = 1
    try:
        yield
    finally:
        _here.depth = 0
        torch.set_num_threads(before)


def unit() -> str:
    """How the clock's seconds are meant, in words, for a caption."""
    return "CPU time of the decoding thread" if measuring() else "wall time"


RULE = ("the decoding thread's own CPU time, the model on one thread (so a busy browser or neighbour neither "
        "lands in one side of a pair nor takes the decoder's core)")
