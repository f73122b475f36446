"""The speculative decode loop (Leviathan et al. 2023, Alg. 1), batch size 1. Yields one StepRecord per step.

Each step has the phases the app animates:
  1. propose  - the drafter proposes up to k tokens after the committed context (with q, or one-hot)
  2. score    - one target forward over [pending token] + draft gives p at every drafted position, plus one
  3. verify   - the exact rejection rule (verify.py) keeps a prefix and draws one more token
  4. commit   - accepted tokens and the drawn one are committed; the target cache is cropped so it holds
                exactly the committed tokens (the newest is the next step's input), never a rejected one
  5. feedback - the drafter hears how many of its tokens survived
Plain decoding is the same loop with a drafter that proposes nothing.
"""
from __future__ import annotations

import time
from typing import Iterator

import torch

from .drafters import DraftContext, Drafter
from .metrics import RunMetrics, summarize
from .models import LM
from .records import Candidate, Committed, Position, StepRecord
from .sampling import InputError, SamplingParams, probs
from .tree_step import tree_step
from .verify import one_hot, verify_chain

MAX_K = 64
MAX_NEW_TOKENS = 4096
TOP = 8  # entries kept of each distribution for the bar charts


def check_run_args(k: int, max_new_tokens: int) -> None:
    if not isinstance(k, int) or not 0 <= k <= MAX_K:
        raise InputError(f"k (draft length) must be an integer in [0, {MAX_K}], got {k!r}")
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS}], got {max_new_tokens!r}")


def check_context(target: LM, prompt_len: int, max_new_tokens: int, k: int) -> None:
    """Refuse before any work when the prompt, the new tokens and one step's drafts pass the model's context."""
    need = prompt_len + max_new_tokens + k
    if need > target.max_len:
        raise InputError(f"the prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens and k = {k} drafts "
                         f"need {need} positions; {target.name} has a context of {target.max_len}: shorten the "
                         "prompt or ask for fewer new tokens")


def _pad(x: torch.Tensor, v: int) -> torch.Tensor:
    """Zero-pad the vocab dim: a model whose head is padded beyond the tokenizer puts mass nowhere else."""
    return x if x.shape[-1] == v else torch.nn.functional.pad(x, (0, v - x.shape[-1]))


def decode(target: LM, drafter: Drafter, prompt: torch.Tensor | list[int], sp: SamplingParams | None = None,
           k: int | None = None, max_new_tokens: int = 64, stop_at_eos: bool = True,
           detail: bool = True) -> Iterator[StepRecord]:
    """Decode after `prompt` (ids). `detail` adds top-k lists and text pieces for the animation."""
    sp = sp or SamplingParams()
    k = drafter.default_k if k is None else k
    check_run_args(k, max_new_tokens)
    prompt = [int(t) for t in (prompt.tolist() if torch.is_tensor(prompt) else prompt)]
    if not prompt:
        raise InputError("the prompt is empty: it must hold at least one token")
    check_context(target, len(prompt), max_new_tokens, k)
    tok, dev = target.tokenizer, target.device
    eos = target.eos_ids if stop_at_eos else set()
    gen = torch.Generator(device=dev).manual_seed(sp.seed)

    def piece(i: int) -> str:
        return tok.decode([i]) if detail else ""

    def top(dist: torch.Tensor) -> list[Candidate]:
        if not detail:
            return []
        v, i = torch.topk(dist, min(TOP, dist.shape[-1]))
        return [Candidate(int(a), piece(int(a)), float(b)) for a, b in zip(i.tolist(), v.tolist()) if b > 0]

    t0 = time.perf_counter()
    cache = target.new_cache()
    prefill = getattr(drafter, "prefill", None)  # drafters that read the target's hidden state run it (medusa)
    head = prefill(target, prompt, cache) if prefill else target.forward(torch.tensor(prompt), cache, last_only=True)
    pending: int | None = None          # committed token not yet run through the target
    tokens, generated = list(prompt), []
    fwd_t, fwd_d, step = 1, 0, 0
    drafter.begin(list(prompt))
    while True:
        room = max_new_tokens - len(generated)
        ctx = DraftContext(tokens, len(prompt), min(k, room - 1), sp, gen)

        # 1. propose
        t1 = time.perf_counter()
        prop = drafter.propose(ctx) if ctx.k > 0 else None
        draft = prop.tokens[:ctx.k] if prop is not None else torch.empty(0, dtype=torch.long)
        m = draft.numel()
        fwd_d += prop.forwards if prop is not None else 0

        # 2. score: p for each drafted position and one beyond
        t2 = time.perf_counter()
        if m and prop.tree is not None and pending is not None:   # a candidate tree: tree_step.py
            draft, p, q, v = tree_step(target, drafter, prop, cache, pending, sp, gen)  # score+verify+compact
            m = draft.numel()
            fwd_t += 1
            t3 = time.perf_counter()
        else:
            if pending is None:   # first step: the prefill already gave the first position's logits
                logits = torch.cat([head, target.forward(draft, cache)]) if m else head
            else:
                logits = target.forward(torch.tensor([pending] + draft.tolist()), cache)
            fwd_t += int(pending is not None or m > 0)
            V = logits.shape[-1] if prop is None or prop.q is None else max(logits.shape[-1], prop.q.shape[-1])
            p = _pad(probs(logits, sp), V)                                               # [m+1, V]

            # 3. verify
            t3 = time.perf_counter()
            draft = draft.to(dev)
            q = _pad(prop.q[:m].to(dev), V) if m and prop.q is not None else one_hot(draft, V)  # [m, V]
            v = verify_chain(p, q, draft, gen)

        # 4. commit / rollback
        t4 = time.perf_counter()
        new = draft[:v.n_accepted].tolist() + [v.token]
        kinds = ["draft"] * v.n_accepted + ["target" if m == 0 else v.kind]
        p_new = v.p_x[:v.n_accepted].tolist() + [float(v.final_dist[v.token])]
        stop = ""
        for j, t in enumerate(new):
            if t in eos:
                new, kinds, p_new, stop = new[:j + 1], kinds[:j + 1], p_new[:j + 1], "eos"
                break
        tokens += new
        generated += new
        if m > v.n_accepted:              # drop rejected drafts; the new token stays pending
            cache.crop(-(m - v.n_accepted))
        if cache.get_seq_length() > len(tokens) - 1:   # eos among the accepted drafts: drop those after it
            cache.crop(-(cache.get_seq_length() - (len(tokens) - 1)))
        pending = new[-1]
        if not stop and len(generated) >= max_new_tokens:
            stop = "length"

        # 5. feedback
        drafter.feedback(ctx, v.n_accepted) if m else None
        t5 = time.perf_counter()

        positions = []
        for i in range(m):
            verdict = "accepted" if i < v.n_accepted else "rejected" if i == v.n_accepted else "unchecked"
            positions.append(Position(int(draft[i]), piece(int(draft[i])), float(v.p_x[i]), float(v.q_x[i]),
                                      float(v.accept_prob[i]), float(v.u[i]), verdict,
                                      top(p[i]), top(q[i]) if prop.q is not None else []))
        yield StepRecord(
            index=step, drafter=drafter.name, drafted=draft.tolist(), positions=positions,
            n_accepted=v.n_accepted, final_token=v.token, final_piece=piece(v.token),
            final_kind="target" if m == 0 else v.kind, final_top=top(v.final_dist),
            committed=[Committed(t, piece(t), o, pp) for t, o, pp in zip(new, kinds, p_new)],
            n_generated=len(generated), text=tok.decode(generated, skip_special_tokens=True) if detail else "",
            cache_len=cache.get_seq_length(), target_forwards=fwd_t, draft_forwards=fwd_d,
            t_draft=t2 - t1, t_score=t3 - t2, t_verify=t4 - t3, t_commit=t5 - t4,
            elapsed=time.perf_counter() - t0, info=dict(prop.info) if prop is not None else {},
            done=bool(stop), stop_reason=stop)
        if stop:
            return
        step += 1


def run(target: LM, drafter: Drafter, prompt, **kw) -> tuple[list[int], list[StepRecord], RunMetrics]:
    """Decode to the end; returns (generated ids, records, metrics)."""
    recs = list(decode(target, drafter, prompt, **kw))
    ids = [c.token for r in recs for c in r.committed]
    return ids, recs, summarize(recs)
