"""EAGLE: a one-layer head that drafts at the feature level and proposes a tree shaped by its own confidence.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024);
Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (EMNLP 2024).

The feature f_t is the target's final hidden state at position t (the LM head's input; the engine hands the
newest one over through `observe`). Knowing f_{t-1} alone leaves the next token uncertain; knowing the token
x_t that was actually sampled from it removes that uncertainty (EAGLE's point), so the head reads both:

    x = fc([f_{t-1} ; embed(x_t)])  ->  one Llama decoder layer  ->  RMSNorm  ->  f^_t  ->  target LM head

and f^_t gives the draft distribution of x_{t+1}. The head runs autoregressively on its own predicted features:
f^_t and the drafted x_{t+1} give f^_{t+1}, and so on. Like the target, the head keeps a cache over the whole
sequence: row t (its input (f_{t-1}, x_t), at position t) is run once, with the target's true feature, when x_t
is committed (the pending token's row, the tree's root, each step; the accepted drafts' rows at the next
step, from the features the target computed for them), so a drafted node attends to every committed row and to
its own branch of the tree, and can copy a name or a key from anywhere before it. The layer starts as a copy of
the target's last layer; the embedding and LM head are the target's, frozen and not shipped.

The tree (EAGLE-2's dynamic tree): from the root, each depth expands the `topk` nodes with the highest
cumulative draft probability (the product of draft probabilities along the path, an estimate of the chance
the path is accepted) into their `topk` most likely children; after `depth` levels (at most ctx.k) the
`nodes` best nodes of everything drafted are kept, which is prefix-closed since a child's cumulative
probability never exceeds its parent's. Candidates are each parent's top-ranked tokens, so they are
deterministic and verify_tree.py's exact rule applies unchanged: the output law is the target's. Training:
`python -m specdec_core train eagle`.

`Head` is the module training unrolls; drafting calls it through `HeadRows` (one call for the rows committed since
the last step and the root, then one call per tree level over all of its rows), or, with the fast path, a packed copy
of its weights that computes the same rows (backend.eagle_rows). How the tree grows (which nodes to expand, when
to stop) is decided here only, in `_grow`, in Python: a fast path may compute a level's rows, never the choice.
`_grow` ranks a level's few candidates (topk per row) in Python lists, not tensors: each tensor op costs a few
microseconds whatever its size, more than Python's arithmetic on four numbers.
"""
from __future__ import annotations

import math
import statistics
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import backend, clock
from ..forward import grown, mask_bias
from ..policy import copy_budget, deeper_pays, tree_budget
from ..tree import compile_tree, graft
from . import (DraftContext, Drafter, DrafterUnavailable, Proposal, entry, load_weights, trained_for, untrained,
               weights_for)
from .lookup import PromptLookup
from .vocab import DraftVocab

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "eagle.safetensors"
MANIFEST = WEIGHTS.with_name("eagle.manifest.json")

# a sized tree's draft cost, measured once per target model and tree shape (Eagle.fixed_draft_ms)
_DRAFT_MS: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, L, h, d] rotated by positions pos [B, L] (Llama's half-split rotary embedding)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)   # [d/2]
    ang = pos.to(torch.float32)[..., None] * inv                                         # [B, L, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, :, None], torch.cat([ang.sin()] * 2, -1)[:, :, None]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return x * cos.to(x.dtype) + torch.cat([-b, a], -1) * sin.to(x.dtype)


class Head(nn.Module):
    """fc + one pre-norm Llama decoder layer + RMSNorm: (feature, next token's embedding) -> next feature."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, inter: int, theta: float = 10000.0,
                 eps: float = 1e-5, vocab: DraftVocab | None = None):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = heads, kv_heads, hidden // heads
        self.theta, self.eps = float(theta), float(eps)
        self.fc = nn.Linear(2 * hidden, hidden)
        self.ln1 = nn.Parameter(torch.ones(hidden))
        self.q = nn.Linear(hidden, heads * self.hd, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, hidden, bias=False)
        self.ln2 = nn.Parameter(torch.ones(hidden))
        self.gate = nn.Linear(hidden, inter, bias=False)
        self.up = nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.norm = nn.Parameter(torch.ones(hidden))
        self.vocab = vocab   # rank only these tokens (vocab.py); None = the whole vocabulary

    @classmethod
    def for_target(cls, model, vocab: DraftVocab | None = None) -> "Head":
        """A head shaped like the target's layers, its layer and norm copied from the target's last ones."""
        c = model.config
        theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta")
        head = cls(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                   theta or 10000.0, c.rms_norm_eps, vocab)
        last = model.model.layers[-1]
        with torch.no_grad():
            for mine, theirs in ((head.q, last.self_attn.q_proj), (head.k, last.self_attn.k_proj),
                                 (head.v, last.self_attn.v_proj), (head.o, last.self_attn.o_proj),
                                 (head.gate, last.mlp.gate_proj), (head.up, last.mlp.up_proj),
                                 (head.down, last.mlp.down_proj)):
                mine.weight.copy_(theirs.weight.float())
            head.ln1.copy_(last.input_layernorm.weight.float())
            head.ln2.copy_(last.post_attention_layernorm.weight.float())
            head.norm.copy_(model.model.norm.weight.float())
        return head

    def forward(self, f: torch.Tensor, e: torch.Tensor, pos: torch.Tensor, see: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """f, e [B, L, H] features and token embeddings; pos [B, L]; see [B, L, P + L] bool (which of the past
        P and these L entries each query attends to); past (k, v) [B, P, kv, d].
        -> predicted features [B, L, H], and this call's (k, v) [B, L, kv, d] to extend `past` with."""
        B, L, _ = f.shape
        x = self.fc(torch.cat([f, e], -1))                                                   # [B, L, H]
        y = _rms(x, self.ln1, self.eps)
        q = _rope(self.q(y).view(B, L, self.n_heads, self.hd), pos, self.theta)
        k = _rope(self.k(y).view(B, L, self.n_kv, self.hd), pos, self.theta)
        v = self.v(y).view(B, L, self.n_kv, self.hd)
        ks, vs = (k, v) if past is None else (torch.cat([past[0], k], 1), torch.cat([past[1], v], 1))
        rep = self.n_heads // self.n_kv
        a = F.scaled_dot_product_attention(q.transpose(1, 2), ks.repeat_interleave(rep, 2).transpose(1, 2),
                                           vs.repeat_interleave(rep, 2).transpose(1, 2), attn_mask=see[:, None])
        x = x + self.o(a.transpose(1, 2).reshape(B, L, -1))
        y = _rms(x, self.ln2, self.eps)
        x = x + self.down(F.silu(self.gate(y)) * self.up(y))
        return _rms(x, self.norm, self.eps), (k, v)


class HeadScratch:
    """The head's keys and values over the rows run so far (Head.forward's `past`); setting n back drops the rows
    after it."""

    def __init__(self):
        self.past, self._n = None, 0

    @property
    def n(self) -> int:
        return self._n

    @n.setter
    def n(self, rows: int) -> None:
        if self.past is not None:
            self.past = (self.past[0][:, :rows], self.past[1][:, :rows])
        self._n = rows

    def reserve(self, rows: int) -> None:
        pass

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append a call's keys and values [1, m, kv, d]."""
        self.past = (k, v) if self.past is None else (torch.cat([self.past[0], k], 1), torch.cat([self.past[1], v], 1))
        self._n = self.past[0].shape[1]


class HeadRows:
    """A tree level's rows through the trained Head, in fp32, as drafting calls them:
    (f [m, H] features, tok [m] tokens, positions, bias [m, c] over the last c rows, scratch, last, k) ->
    (features, draft logits) of the last `last` rows (all with 0), or with k > 0 (features, top-k log q, target ids).
    The fast path's packed head computes the same from prepared weights (tests/test_eagle.py holds the two close)."""

    def __init__(self, head: Head, embed: torch.Tensor, lm_w: torch.Tensor, ids: torch.Tensor | None):
        self.head, self.embed, self.ids = head, embed, ids
        self.device, self.w = embed.device, lm_w.float()                                 # [v, H]

    def scratch(self, rows: int) -> HeadScratch:
        return HeadScratch()

    def __call__(self, f, tok, pos, bias, kv: HeadScratch, last: int = 0, k: int = 0):
        m, R = f.shape[0], kv.n + f.shape[0]
        e = self.embed[tok].float()
        see = torch.cat([torch.ones(m, R - bias.shape[1], dtype=torch.bool, device=f.device), bias == 0], 1)  # [m, R]
        if isinstance(pos, slice):
            pos = torch.arange(pos.start, pos.stop)
        pos = torch.full((1, m), pos) if isinstance(pos, int) else pos[None]
        out, (ks, vs) = self.head(f.float()[None], e[None], pos, see[None], kv.past)
        kv.extend(ks, vs)
        h = out[0, m - last if last else 0:]                                              # [n, H]
        y = F.linear(h, self.w)                                                           # [n, v]
        if not k:
            return h, y
        lp, ix = torch.topk(torch.log_softmax(y, -1, dtype=torch.float32), k, -1)
        return h, lp, ix if self.ids is None else self.ids[ix]


def head_weight(head: Head, lm_head: nn.Module) -> torch.Tensor:
    """The rows of the target's LM head the draft scores: [v, H] (all V rows without a vocabulary)."""
    w = lm_head.weight
    return head.vocab.head(w) if head.vocab is not None else w


def load_head(model, path: Path = WEIGHTS) -> tuple[Head, dict]:
    """The shipped head (for `model`'s shapes) and its manifest."""
    sd, meta, manifest = load_weights(path, "eagle")
    if meta.get("context") != "1":   # written by train eagle since the head keeps a cache over the sequence
        raise DrafterUnavailable(f"{path.name} is a head trained without the sequence cache this drafter runs: "
                                 "retrain it with `python -m specdec_core train eagle`")
    ids = sd.pop("draft_vocab", None)
    head = Head.for_target(model, DraftVocab(ids, int(meta["vocab_size"])) if ids is not None else None)
    head.load_state_dict({k: v.float() for k, v in sd.items()})
    return head.eval(), manifest


class Eagle(Drafter):
    name = "eagle"
    reads_hidden = entry(name).reads_hidden   # the engine hands over the target's hidden state (observe)

    def __init__(self, target, head: Head | None = None, manifest: dict | None = None, depth: int | None = None,
                 topk: int | None = None, nodes: int | None = None, sized: bool | None = None, int8: bool = True,
                 copy: bool = True, clock: bool = False):
        if head is None:
            if not weights_for(self.name, target):
                raise untrained(self.name, target)
            head, manifest = load_head(target.model)
        manifest = manifest or {}
        if head.fc.out_features != int(target.model.config.hidden_size):
            raise DrafterUnavailable(f"the EAGLE head was trained for hidden size {head.fc.out_features}, "
                                     f"this target has {target.model.config.hidden_size}")
        want = manifest.get("target")
        if want and not trained_for(manifest, target):
            raise DrafterUnavailable(f"the EAGLE head was trained for {want!r}, not {target.name!r}")
        tree = manifest.get("tree", {})
        self.depth = int(depth or tree.get("depth", 5))
        self.topk = int(topk or tree.get("topk", 4))
        self.nodes = int(nodes or tree.get("nodes", 12))
        # size each tree by the target's measured cost (`_budget`), `nodes` the most; else always `nodes`
        self.sized = bool(tree.get("sized", False) if sized is None else sized)
        self.default_k = self.depth
        self.target, self.manifest = target, manifest
        self.head = head.to(target.device)          # the trained module; drafting runs its packed copy
        lm_w = head_weight(head, target.model.get_output_embeddings())                  # [v, H]
        ids = head.vocab.ids.to(target.device) if head.vocab is not None else None   # draft row -> target id
        # drafting: the fast path's packed head (on the CPU its products read int8 weights: half the bytes), else
        # the trained module
        embed = target.model.get_input_embeddings().weight
        self.rows = backend.eagle_rows(self.head, embed, lm_w, target.dtype, int8, ids) \
            or HeadRows(self.head, embed, lm_w, ids)
        self._trees: dict[tuple, object] = {}    # compiled tree per shape (rank paths)
        self._causals: dict[int, torch.Tensor] = {}
        self._levels: dict[tuple, tuple] = {}     # a tree level's parent rows and bias, per tree shape (`_level`)
        # a copied continuation (prompt lookup, a match of 2+ tokens) grafted onto each tree where it pays
        self.copy = PromptLookup(min_ngram=2) if copy else None
        self.begin([])
        self.block = target.backend.row_block
        # measured once per target forward, up to the largest tree's rows (the root's and `nodes`)
        self.costs = target.backend.block_ms(-(-(self.nodes + 1) // self.block)) if self.sized else []
        # the draft's ms a sized tree weighs: measured once when the drafter is made, so the same scene draws the
        # same trees on a quiet or a busy machine; `clock` weighs each step's own clock instead (None)
        self.rate: float | None = None           # sized: committed tokens per ms of a step (draft + score), smoothed
        self.draft_ms: float | None = None
        if self.sized and self.costs and not clock:
            self.draft_ms = self.fixed_draft_ms()

    def begin(self, prompt: list[int]) -> None:
        # the head's own cache over the sequence: row t read (f_{t-1}, x_t) at position t, for t = f_from + 1 ..
        # done, stored at t - 1 - f_from (the features before f_from were never handed over)
        self.kv = self.rows.scratch(max(64, 2 * len(prompt)))
        self.feat = None                         # features by position [cap, H]: feat[t] = f_t
        self.f_from = self.f_len = 0             # feat holds positions f_from .. f_len - 1
        self.done = 0                            # the sequence's rows up to position done are in kv
        self._last = None                        # (n, estimated step ms) of the last proposal (sized trees)
        self.hits, self.tries = 1.0, 2.0         # copied tokens the target agreed with / checked (prior: 1 in 2)
        self._copied = None                      # (len(tokens), the continuation) of the last proposal

    def observe(self, h: torch.Tensor, n: int) -> None:
        """h [j, H] (or [H]): the target's features at positions n - j .. n - 1."""
        h = h.reshape(-1, h.shape[-1])
        a = n - h.shape[0]
        if self.feat is None or a > self.f_len or a < self.f_from:   # not contiguous: start again from here
            self.feat, self.f_from = h.new_empty(max(64, 2 * n), h.shape[1]), a
            self.done, self.kv.n = a, 0
        self.feat = grown(self.feat, 0, n, self.f_len)
        self.feat[a:n] = h
        self.f_len = n

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Proposal:
        # the root is the pending token x_n, read with f_{n-1}: the features must reach position n - 1
        n = len(ctx.tokens) - 1
        if self.feat is None or self.f_len != n or ctx.k < 1 or n < 1:
            return Proposal.empty()
        t0 = clock.now()
        self._measure(n)
        depth, K = min(ctx.k, self.depth), self.topk
        kv = self.kv
        # 0. the sequence's rows not yet run (the tokens committed since, then the root), causal, in one call
        lo = min(self.done, n - 1)               # (a second proposal at the same n runs its root again)
        kv.n = lo - self.f_from
        m = n - lo
        f, lp, ix = self.rows(self.feat[lo:n], torch.tensor(ctx.tokens[lo + 1:n + 1]), slice(lo + 1, n + 1),
                              self._causal(m), kv, last=1, k=K)
        self.done = n                            # the root is committed whatever is accepted: its row stays
        parent, tok, score = self._grow(f, lp, ix, n, depth)
        kv.n = self.done - self.f_from            # the tree's rows are dropped; the sequence's stay
        rank = list(range(K)) * (len(tok) // K)
        order = sorted(range(len(score)), key=score.__getitem__, reverse=True)     # stable, as drafted
        if self.draft_ms is None:                # this step's own clock
            draft_ms = 1e3 * (clock.now() - t0)
        else:                                    # the fixed cost of the levels drafted (K nodes, then K * K a level)
            draft_ms = self.draft_ms * (1 + (len(tok) - K) // (K * K)) / self.depth
        prop = self._tree(parent, rank, tok, score, order, self._budget(score, order, draft_ms), ctx)
        if self.sizing_costs:   # this step's ms: the draft and the score pass of its rows (the tree's)
            self._last = (n, draft_ms + self.costs[min(len(self.costs), -(-prop.tree.size // self.block)) - 1])
        return prop

    def _grow(self, f: torch.Tensor, lp: torch.Tensor, ix: torch.Tensor, n: int, depth: int):
        """The tree's levels after the root (whose features f [1, H], top-K log-probs lp and target ids ix [1, K]
        the root call gave): every node drafted, in drafting order, as three lists: its parent's index (-1 = the
        root), token and cumulative log-prob (a Python float: float64, so ties break as in drafting order).
        A level's few nodes live in Python lists (each tensor op costs a few microseconds whatever its size)."""
        K, kv, dev = self.topk, self.kv, self.rows.device
        parent, tok, score = [], [], []
        front, base = [-1], [0.0]                # the rows just run: their node indices and scores
        shape = ()                               # the tree so far: each level's rows of f (the parents expanded)
        t1 = clock.now()                 # when the level being timed began
        for d in range(1, depth + 1):
            first = len(tok)                     # node (row r, rank j) of this level: first + r K + j
            for r, (lps, ixs) in enumerate(zip(lp.tolist(), ix.tolist())):    # [m, K] each: top-K log q, ids
                parent += [front[r]] * K
                tok += ixs
                score += [base[r] + x for x in lps]
            if d == depth:
                break
            lvl = score[first:]
            pick = sorted(range(len(lvl)), key=lvl.__getitem__, reverse=True)[:K]   # expand the likeliest K
            if self.sized and d > 1:                      # the level just run, timed (or pinned with draft_ms)
                level_ms = 1e3 * (clock.now() - t1) if self.draft_ms is None else self.draft_ms / self.depth
                if not deeper_pays(sum(math.exp(lvl[i]) for i in pick), level_ms, self.rate):
                    break                                 # the next level cannot pay for its time: stop here
            t1 = clock.now()
            shape += (tuple(i // K for i in pick),)                                     # rows of f (parents)
            rows, bias = self._level(shape)
            front, base = [first + i for i in pick], [lvl[i] for i in pick]
            f, lp, ix = self.rows(f.index_select(0, rows), torch.tensor([tok[first + i] for i in pick], device=dev),
                                  n + d, bias, kv, k=K)
        return parent, tok, score

    def _level(self, shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """A level's parent rows (index into the last level's f) and attention bias [m, tn + m] over the tree rows
        drafted so far, for a tree whose levels expanded the parents `shape` (a tuple of row tuples, one a level):
        a tree row sees its ancestors' rows and itself. Built once per shape: a few shapes recur on most steps."""
        got = self._levels.get(shape)
        if got is None:
            tn, last = 0, [[]]                 # tree rows so far; the last level's rows' branches (the root's: none)
            for rows in shape:                 # a row's branch: its parent's, then itself
                last = [last[r] + [tn + j] for j, r in enumerate(rows)]
                tn += len(rows)
            m = len(last)
            see = bytearray(m * tn)                # row j: the tree rows level row j sees
            for j, branch in enumerate(last):
                for c in branch:
                    see[j * tn + c] = 1
            see = torch.frombuffer(see, dtype=torch.bool).view(m, tn)
            if len(self._levels) >= 4096:
                self._levels.clear()
            dev = self.rows.device
            got = self._levels[shape] = (torch.tensor(shape[-1], device=dev), mask_bias(see.to(dev)))
        return got

    def _causal(self, m: int) -> torch.Tensor:
        """The attention bias of m consecutive sequence rows (causal): a step's few rows built once per m, a
        prompt's (m in the hundreds, once a sequence) not kept."""
        b = self._causals.get(m)
        if b is None:
            b = mask_bias(torch.ones(m, m, dtype=torch.bool, device=self.rows.device).tril())
            if m <= 2 * self.depth:
                self._causals[m] = b
        return b

    def _measure(self, n: int) -> None:
        """Sized: the tokens the last step committed (n moved by them) over its estimated ms, smoothed."""
        if self._last is not None and n > self._last[0]:
            r = (n - self._last[0]) / self._last[1]
            self.rate = r if self.rate is None else 0.8 * self.rate + 0.2 * r
        self._last = None

    @torch.inference_mode()
    def fixed_draft_ms(self, context: int = 48, reps: int = 5) -> float:
        """What a whole draft (every level drafted) costs on this machine: the median of `reps` timed drafts after
        `context` positions of stand-in features, measured once per target model and tree shape and kept (as
        backend.block_ms keeps the score passes' costs). The drafter's own state is reset afterwards."""
        key = (self.depth, self.topk, self.nodes, self.block)
        got = _DRAFT_MS.setdefault(self.target.model, {})
        if key not in got:
            self.draft_ms = None
            hidden = self.rows.embed.shape[1]
            n_ids = self.rows.embed.shape[0]
            tokens = [(7 * t + 3) % n_ids for t in range(context + 1)]   # no repeats: no copied continuation
            feats = torch.randn(context, hidden, generator=torch.Generator().manual_seed(0)).to(
                device=self.rows.device, dtype=self.rows.embed.dtype)
            ctx = DraftContext(tokens=tokens, prompt_len=context, k=self.depth, sp=None, gen=None)
            ms = []
            for r in range(reps + 1):
                self.begin([])
                self.observe(feats, context)
                t = clock.now()
                self.propose(ctx)
                if r:                                  # the first draft warms the shapes up
                    ms.append(1e3 * (clock.now() - t))
            self.begin([])
            self.rate = None
            got[key] = statistics.median(ms)
        return got[key]

    @property
    def sizing_costs(self) -> list[float]:
        """The target's costs a tree and its copies weigh: the measured ones where sized, none else (a drafter made
        sized and then set unsized keeps its fixed trees)."""
        return self.costs if self.sized else []

    def _budget(self, score, order, draft_ms: float) -> int:
        """How many drafted nodes to verify: `nodes`, or, sized, policy.tree_budget's count (the nodes'
        cumulative draft probabilities against the target's measured cost of the rows they add)."""
        p = [math.exp(score[i]) for i in order[:self.nodes]]
        return tree_budget(p, self.nodes, self.block, self.sizing_costs, draft_ms)

    def _tree(self, parent, rank, tok, score, order, budget, ctx: DraftContext) -> Proposal:
        """Keep the `budget` likeliest drafted nodes (prefix-closed), plus what pays of a copied continuation, as
        rank paths and tokens in tree order."""
        keep, path = set(), {}
        for i in order:
            if len(keep) == budget:
                break
            p = parent[i]
            if p >= 0 and p not in keep:      # a tie at probability 1 could list a child first: skip it
                continue
            keep.add(i)
            path[i] = (path[p] if p >= 0 else ()) + (rank[i],)
        nodes = {path[i]: tok[i] for i in keep}
        # the head's probability of each node's token given its parent: its cumulative one over the parent's
        conf = {path[i]: math.exp(score[i] - (score[parent[i]] if parent[i] >= 0 else 0.0)) for i in keep}
        copied = self._graft(nodes, ctx)
        key = tuple(sorted(nodes, key=lambda p: (len(p), p)))
        tree = self._trees.get(key)
        if tree is None:                      # a step's tree shape recurs often: compile each shape once
            if len(self._trees) >= 4096:
                self._trees.clear()
            tree = self._trees[key] = compile_tree(key, ordered=True)   # sorted and prefix-closed here
        return Proposal(torch.tensor([nodes[p] for p in tree.paths], dtype=torch.long), tree=tree,
                        conf=[conf.get(p) for p in tree.paths],
                        info={"nodes": len(nodes), "depth": tree.max_depth, "copied": copied,
                              "draft_p": round(math.exp(max(score[i] for i in keep)), 4)})

    def _graft(self, nodes: dict, ctx: DraftContext) -> int:
        """Prompt lookup's continuation of the context (at most ctx.k tokens), grafted onto the drafted tree where
        the head's guesses leave it: a copy of what the prompt or the answer said before, which a small head
        often misses (a name repeated, a key copied). As many of its new nodes as pay (policy.copy_budget, at
        the copies' measured rate); they verify like any deterministic candidate, so the law is unchanged.
        -> the nodes added."""
        self._copied = None
        if self.copy is None:
            return 0
        chain = self.copy.continuation(ctx)[0]
        if not chain:
            return 0
        self._copied = (len(ctx.tokens), chain)
        rows = len(nodes) + 1
        added = graft(nodes, chain)
        j = copy_budget(self.hits / self.tries, len(chain) - len(added), len(added), rows, self.block,
                        self.sizing_costs, self.rate)
        for p in added[j:]:
            del nodes[p]
        return j

    def feedback(self, ctx: DraftContext, n_accepted: int) -> None:
        """The copies' rate: how many of the copied tokens the target agreed with, up to the first it did not."""
        if self._copied is None:
            return
        n, chain = self._copied
        new = ctx.tokens[n:]
        hit = next((i for i, (a, b) in enumerate(zip(chain, new)) if a != b), min(len(chain), len(new)))
        self.hits += hit
        self.tries += hit + (hit < min(len(chain), len(new)))
        self._copied = None
