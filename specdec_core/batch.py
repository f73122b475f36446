"""Batched speculative decoding with ragged acceptance (batch sizes 1..64+).

Every sequence drafts, is verified and accepts its own number of tokens each step: step.py's phases over the
live rows, around one forward over the ragged batch (the rule of verify.py, or of verify_tree.py for a
candidate tree, applied row by row). The batch shares one KV cache, kept by the target's backend (backend.py):

With our forward (backend.Rows) each row of the static cache keeps its own length: a row's new tokens go to the
slots after its committed ones, at their own positions, and what it keeps is its new length (a tree's accepted
path is compacted into place). No padding enters any row's attention, and the forward is batch-invariant, so
every row's logits are bitwise those it would get decoded alone.

With transformers' forward (backend.MaskedRows) ragged acceptance is handled with *holes* instead of re-packing:
each step appends the same number of slots L to every row (as many as the longest row's pending token + draft),
and a per-row validity mask marks the slots that hold committed tokens. Rejected drafts and padding stay in the
cache but are masked out of every later query, and each row carries its own position ids, so every sequence
sees exactly its own tokens at their own positions: at temperature 0 its output is what it would be decoded
alone. Slots that are invalid in every row at the tail are cropped after each step.

Candidate trees (medusa) fit that scheme too. A row's tree takes T slots, the pending token (the root) first and
the nodes in tree order. Among the new slots a node sees only itself and its ancestors (tree.mask; a chain slot
sees the slots before it), at position (row position + depth). After verify_tree picks a path, the root and the
path's nodes become valid and every other node is a hole. Each path node was computed at the position it would
have alone, seeing exactly the committed context and its ancestors, so it is the entry decoding alone would keep,
wherever it sits: no compaction (the single-sequence cache's) is needed, and the next step continues from the
row's committed length. The price is cache width: a tree step leaves up to T - 1 holes per row. A drafter that
reads the target's hidden states (`reads_hidden`, as medusa and eagle do) gets, per row, the final-norm hidden
states of the positions the target has run and kept for that row, after the batched prefill and after every
step, as engine.py hands them over alone.

This is the padding-and-masking approach of batched assisted decoding (cf. Qian et al., "BASS: Batched
Attention-optimized Speculative Sampling", 2024), kept simple for teaching.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from . import clock
from .drafters import Drafter
from .engine import check_prompt, check_run_args
from .models import LM
from .policy import KPolicy
from .sampling import InputError, SamplingParams
from .step import Row, prefill, step


@dataclass
class BatchStep:
    index: int
    drafted: list[int]          # [B] tokens drafted per row this step (0 for finished rows)
    accepted: list[int]         # [B] tokens accepted per row
    committed: list[list[int]]  # [B] ids committed per row this step
    active: int                 # rows still decoding before this step
    elapsed: float              # seconds since the start, prefill included
    target_forwards: int
    slots: int                  # cache slots per row after the step (holes included)
    cached: list[int] = field(default_factory=list)  # [B] valid (committed) cache entries per row
    done: bool = False


@dataclass
class BatchResult:
    tokens: list[list[int]] = field(default_factory=list)   # [B] generated ids
    steps: list[BatchStep] = field(default_factory=list)


def decode_batch(target: LM, make_drafter: Callable[[], Drafter], prompts: list[list[int]] | list[torch.Tensor],
                 sp: SamplingParams | None = None, k: int | None = None, max_new_tokens: int = 64,
                 stop_at_eos: bool = True, seeds: list[int] | None = None,
                 k_policy: str = "fixed") -> Iterator[BatchStep]:
    """Decode every prompt; one drafter per row (drafters may keep per-sequence state). Yields BatchStep.

    The steps are step.py's, as engine.py takes them, over the rows still decoding, around one forward over
    the ragged batch. Bad input raises here, at the call; the steps are made as the stream is read. Each row
    draws from its own generator, seeded `seeds[i]` (default sp.seed + i), in the order engine.decode draws
    (the drafter's samples, then verification's uniforms and its final draw): with a batch-invariant forward,
    row i's tokens are exactly those engine.decode gives alone with that seed, whatever else runs in the
    batch. `k_policy` (policy.py) runs per row; "batch" sets every row's k from how many rows are still
    decoding."""
    sp = sp or SamplingParams()
    if not len(prompts):
        raise InputError("the batch is empty: give at least one prompt")
    drafters = [make_drafter() for _ in prompts]
    k = drafters[0].default_k if k is None else k
    check_run_args(k, max_new_tokens)
    prompts = [[int(t) for t in (p.tolist() if torch.is_tensor(p) else p)] for p in prompts]
    for p in prompts:
        check_prompt(target, p, max_new_tokens, k)
    B = len(prompts)
    seeds = [sp.seed + i for i in range(B)] if seeds is None else list(seeds)
    if len(seeds) != B or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise InputError(f"seeds must be one integer per prompt ({B}), got {seeds!r}")
    rows = [Row(i, d, torch.Generator(device=target.device).manual_seed(x), KPolicy(k_policy, k), list(p), len(p))
            for i, (d, p, x) in enumerate(zip(drafters, prompts, seeds))]
    return stream(target, rows, sp, max_new_tokens, target.eos_ids if stop_at_eos else set())


def stream(target: LM, rows: list[Row], sp: SamplingParams, max_new_tokens: int,
           eos: set[int]) -> Iterator[BatchStep]:
    """The checked run of `decode_batch`, step by step: step.py's phases over the rows still decoding."""
    B = len(rows)
    kv = target.backend.rows(B, rows[0].drafter.reads_hidden)
    t0 = clock.now()
    prefill(rows, kv)
    for index in itertools.count():
        live = [r for r in rows if not r.stop]
        step(live, kv, sp, max_new_tokens, eos)      # 1. propose 2. score 3. verify 4. commit 5. feedback
        drafted, accepted, committed = [0] * B, [0] * B, [[] for _ in range(B)]
        for r in live:
            drafted[r.i], accepted[r.i], committed[r.i] = r.c.draft.numel(), r.c.v.n_accepted, r.new
        width, cached = kv.slots()
        done = all(r.stop for r in rows)
        yield BatchStep(index, drafted, accepted, committed, len(live), clock.now() - t0, index + 1,
                        width, cached, done=done)
        if done:
            return


def run_batch(target: LM, make_drafter, prompts, **kw) -> BatchResult:
    res = BatchResult([[] for _ in prompts])
    for s in decode_batch(target, make_drafter, prompts, **kw):
        res.steps.append(s)
        for i, c in enumerate(s.committed):
            res.tokens[i] += c
    return res
