"""The speculative decode loop (Leviathan et al. 2023, Alg. 1), batch size 1. Yields one StepRecord per step.

The prefill runs the prompt but its last token, which is pending: committed, not yet run through the target.
Each step then has the phases the app animates, written once in step.py for this loop and batch.py's:
  1. propose  - the drafter proposes up to k tokens after the committed context (with q, or one-hot), or a tree
  2. score    - one target forward over the pending token and the drafts gives p before every drafted token,
                plus one beyond (chain_step.py; tree_step.py for a tree)
  3. verify   - the exact rejection rule (verify.py, verify_tree.py) keeps a prefix and draws one more token
  4. commit   - accepted tokens and the drawn one are committed; the target cache keeps exactly the committed
                tokens but the newest, which is pending for the next step, never a rejected one
  5. feedback - the drafter hears how many of its tokens survived (and, if it reads them, the hidden states)
Plain decoding is the same loop with a drafter that proposes nothing. `decode` checks its input when called,
before any work, and returns the stream of steps.
"""
from __future__ import annotations

import itertools
from typing import Iterator

import torch

from . import clock, pieces
from .backend import Single
from .chain_step import Checked
from .drafters import PLAIN, Drafter, Proposal, make
from .metrics import RunMetrics, summarize
from .models import LM
from .policy import KPolicy
from .records import Candidate, Committed, Position, StepRecord, TreeNode, TreeView, Trial
from .sampling import InputError, SamplingParams
from .step import MAX_K, Row, prefill, step

MAX_NEW_TOKENS = 4096
TOP = 8  # entries kept of each distribution for the bar charts


def check_run_args(k: int, max_new_tokens: int) -> None:
    if not isinstance(k, int) or not 0 <= k <= MAX_K:
        raise InputError(f"k (draft length) must be an integer in [0, {MAX_K}], got {k!r}")
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS}], got {max_new_tokens!r}")


def check_prompt(target: LM, prompt: list[int], max_new_tokens: int, k: int) -> None:
    """Refuse before any work: an empty prompt, an id that is no token of the target, or a prompt that with
    the new tokens and one step's drafts passes the model's context."""
    if not prompt:
        raise InputError("the prompt is empty: it must hold at least one token")
    bad = next(((j, t) for j, t in enumerate(prompt) if not 0 <= t < target.n_tokens), None)
    if bad is not None:
        raise InputError(f"prompt token id {bad[1]} (position {bad[0]}) is not a token of {target.name}: "
                         f"its ids are 0..{target.n_tokens - 1}")
    check_context(target, len(prompt), max_new_tokens, k)


def check_context(target: LM, prompt_len: int, max_new_tokens: int, k: int) -> None:
    """Refuse before any work when the prompt, the new tokens and one step's drafts pass the model's context."""
    need = prompt_len + max_new_tokens + k
    if need > target.max_len:
        raise InputError(f"the prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens and k = {k} drafts "
                         f"need {need} positions; {target.name} has a context of {target.max_len}: shorten the "
                         "prompt or ask for fewer new tokens")


def decode(target: LM, drafter: Drafter, prompt: torch.Tensor | list[int], sp: SamplingParams | None = None,
           k: int | None = None, max_new_tokens: int = 64, stop_at_eos: bool = True,
           detail: bool = True, k_policy: str = "fixed") -> Iterator[StepRecord]:
    """Decode after `prompt` (ids). `detail` adds top-k lists and text pieces for the animation; `k_policy`
    (policy.py) moves k from step to step, k being its start or bound. Bad input raises here, at the call;
    the steps are made as the returned stream is read."""
    sp = sp or SamplingParams()
    k = drafter.default_k if k is None else k
    check_run_args(k, max_new_tokens)
    pol = KPolicy(k_policy, k)
    prompt = [int(t) for t in (prompt.tolist() if torch.is_tensor(prompt) else prompt)]
    check_prompt(target, prompt, max_new_tokens, k)
    row = Row(0, drafter, torch.Generator(device=target.device).manual_seed(sp.seed), pol, prompt, len(prompt))
    return stream(target, row, sp, max_new_tokens, target.eos_ids if stop_at_eos else set(),
                  Recorder(target.tokenizer, detail))


def stream(target: LM, row: Row, sp: SamplingParams, max_new_tokens: int, eos: set[int],
           show: "Recorder") -> Iterator[StepRecord]:
    """The checked run of `decode`, step by step: step.py's phases on a batch of one, in the target's cache."""
    t0 = clock.now()
    kv = Single(target, row.drafter.reads_hidden)
    prefill([row], kv)
    fwd_t = fwd_d = 0
    for index in itertools.count():
        t = step([row], kv, sp, max_new_tokens, eos)   # 1. propose 2. score 3. verify 4. commit 5. feedback
        fwd_t, fwd_d = fwd_t + 1, fwd_d + row.prop.forwards
        yield show.record(index, row.drafter.name, row.prop, row.c, row.new, row.tokens[row.prompt_len:],
                          kv.slots()[1][0], fwd_t, fwd_d, t, t0, row.stop)
        if row.stop:
            return


class Recorder:
    """Turns a verified step into the StepRecord the app animates (pieces of text and top lists on `detail`)."""

    def __init__(self, tokenizer, detail: bool):
        self.tok, self.detail = tokenizer, detail

    def piece(self, i: int) -> str:
        return pieces.piece(self.tok, i) if self.detail else ""

    def top(self, dist: torch.Tensor) -> list[Candidate]:
        if not self.detail:
            return []
        v, i = torch.topk(dist, min(TOP, dist.shape[-1]))
        return [Candidate(int(a), self.piece(int(a)), float(b)) for a, b in zip(i.tolist(), v.tolist()) if b > 0]

    def record(self, index: int, name: str, prop: Proposal, c: Checked, new: list[int], generated: list[int],
               cache_len: int, fwd_t: int, fwd_d: int, t: list[float], t0: float, stop: str) -> StepRecord:
        v, m = c.v, c.draft.numel()
        draft = c.draft.tolist()
        kind = "target" if m == 0 else v.kind
        kinds = (["draft"] * v.n_accepted + [kind])[:len(new)]
        p_new = (v.p_x[:v.n_accepted].tolist() + [float(v.final_dist[v.token])])[:len(new)]
        verdict = lambda i: "accepted" if i < v.n_accepted else "rejected" if i == v.n_accepted else "unchecked"
        positions = [Position(x, self.piece(x), float(v.p_x[i]), float(v.q_x[i]), float(v.accept_prob[i]),
                              float(v.u[i]), verdict(i), self.top(c.p[i]), self.top(c.q[i]) if prop.q is not None
                              else []) for i, x in enumerate(draft)]
        return StepRecord(
            index=index, drafter=name, drafted=draft, positions=positions,
            n_accepted=v.n_accepted, final_token=v.token, final_piece=self.piece(v.token),
            final_kind=kind, final_top=self.top(v.final_dist),
            committed=[Committed(x, self.piece(x), o, pp) for x, o, pp in zip(new, kinds, p_new)],
            n_generated=len(generated),
            text=self.tok.decode(generated, skip_special_tokens=True) if self.detail else "",
            cache_len=cache_len, target_forwards=fwd_t, draft_forwards=fwd_d,
            t_draft=t[1] - t[0], t_score=t[2] - t[1], t_verify=t[3] - t[2], t_commit=t[4] - t[3],
            elapsed=clock.now() - t0, info=dict(prop.info), done=bool(stop), stop_reason=stop,
            tree=self.tree(prop, c.walk) if c.walk is not None else None)

    def tree(self, prop: Proposal, w) -> TreeView:
        """Every candidate of a tree step (tree_step.Walk) with its trial, in the order the rule tested them;
        on `detail`, the top of the residual after each rejection."""
        tree, v = w.tree, w.verdict
        res = {n: self.top(r) for n, r in w.residuals().items()} if self.detail else {}
        trials = {t.node: Trial(j, t.p_x, t.q_x, t.accept_prob, t.u, t.accepted, res.get(t.node, []))
                  for j, t in enumerate(v.trials)}
        conf = [None] + (list(prop.conf) if prop.conf is not None else [None] * (tree.size - 1))
        on = {0, *v.path}
        nodes = [TreeNode(i, int(tree.parent[i]), int(tree.depth[i]), int(tree.rank[i]), x, self.piece(x),
                          conf[i], trials.get(i), i in on) for i, x in enumerate(w.ids)]
        return TreeView(nodes, tree.mask.tolist(), list(v.path))


def run(target: LM, drafter: Drafter, prompt, **kw) -> tuple[list[int], list[StepRecord], RunMetrics]:
    """Decode to the end; returns (generated ids, records, metrics)."""
    recs = list(decode(target, drafter, prompt, **kw))
    ids = [c.token for r in recs for c in r.committed]
    return ids, recs, summarize(recs)


def warm(target: LM) -> None:
    """Decode two tokens plainly after a short chat prompt, and drop them. A process's first decode pays one-time
    costs (the chat template's opening read and kept, the CPU's worker threads started, first allocations: ~0.1 s
    of a 48-token run on a 2-core CPU) that a server should pay when it loads the model, not inside the first run
    a page times, where they would tilt that run's speedup."""
    run(target, make(PLAIN, target), target.encode("Hi"), max_new_tokens=2, detail=False)
