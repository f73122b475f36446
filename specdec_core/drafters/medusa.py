"""Medusa heads: extra decoding heads on the target's last hidden state propose a tree of candidates.

Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads" (2024).

The target's own LM head turns the hidden state h_t of the newest position into the next token (the pending
token, the tree's root). Head i (i = 0..D-1) is one residual block, h + SiLU(W_i h + b_i), followed by the
target's shared (frozen) LM head, and predicts the token i + 2 positions ahead. The block starts at zero, so
an untrained head copies the LM head. Heads are trained by self-distillation: KL to the target's own
distributions on the target's own answers (training: `python -m specdec_core train medusa`).

Candidates are deterministic: position d of the tree gets head d-1's top-ranked tokens, arranged by the tree
declared as data (tree.py). Verification is exact whatever the heads say (verify_tree.py); this module only
decides how often the target agrees. The hidden state comes from the target forward that
ran last (the prefill, or the previous step's verification; the engine hands it over through `observe`), so
drafting costs no extra target forward: only D small blocks and D rows of LM-head logits, over the draft
vocabulary (vocab.py) when the weights carry one: ranking 49152 tokens per head would cost a tenth of a
target forward here.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import backend
from ..tree import Tree, compile_tree
from . import (DraftContext, Drafter, DrafterUnavailable, Proposal, entry, load_weights, trained_for, untrained,
               weights_for)
from .vocab import DraftVocab

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "medusa.safetensors"
MANIFEST = WEIGHTS.with_name("medusa.manifest.json")

# Used only when no manifest tree is given (e.g. untrained heads in tests); training writes a measured one.
DEFAULT_TREE = [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (0, 0, 0), (0, 0, 1),
                (0, 1, 0), (1, 0, 0), (0, 0, 0, 0)]


class Heads(nn.Module):
    """D residual blocks on the hidden state, stacked into one batched matmul."""

    def __init__(self, hidden: int, n_heads: int, vocab: DraftVocab | None = None):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n_heads, hidden, hidden))   # zero: each head starts as the LM head
        self.b = nn.Parameter(torch.zeros(n_heads, hidden))
        self.vocab = vocab   # rank only these tokens (vocab.py); None = the whole vocabulary

    @property
    def n_heads(self) -> int:
        return self.w.shape[0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, H] -> [D, N, H], the LM head's input for each head."""
        h = h.to(self.w.dtype)
        return h + F.silu(torch.einsum("dij,nj->dni", self.w, h) + self.b[:, None])


def head_weight(heads: Heads, lm_head: nn.Module) -> torch.Tensor:
    """The rows of the target's shared LM head the heads score: [v, H] (all V rows without a vocabulary)."""
    w = lm_head.weight
    return heads.vocab.head(w) if heads.vocab is not None else w


def head_logits(heads: Heads, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """h [N, H] -> [D, N, v] fp32: each head's logits over the LM-head rows w [v, H]."""
    return F.linear(heads(h).to(w.dtype), w).float()


def target_ids(heads: Heads, top: torch.Tensor) -> torch.Tensor:
    """Indices into the rows the heads score -> target token ids."""
    return heads.vocab.ids.to(top.device)[top] if heads.vocab is not None else top


def ranked(heads: Heads, w: torch.Tensor, h: torch.Tensor, k: int) -> torch.Tensor:
    """h [N, H] -> [D, N, k] target ids: each head's k best tokens, best first."""
    return target_ids(heads, torch.topk(head_logits(heads, w, h), k, dim=-1).indices)


class HeadRows:
    """The first n heads as drafting calls them, through the trained module: what the fast path's PackedHeads
    computes from prepared weights (backend.medusa_rows), up to the products' rounding."""

    def __init__(self, heads: Heads, w: torch.Tensor, n: int):
        self.heads, self.w, self.n = heads, w, n

    def __call__(self, h: torch.Tensor, k: int, probs: bool = False):
        """h [H] -> [n, k] target ids: each head's k best tokens, best first; with `probs` also [n, k] each
        head's probability of them (softmax over the tokens it ranks)."""
        logits = head_logits(self.heads, self.w, h[None])[:self.n, 0]                             # [n, v]
        lp, top = torch.topk(torch.log_softmax(logits, -1), k, -1)                                 # [n, k]
        ids = target_ids(self.heads, top)
        return (ids, lp.exp()) if probs else ids


def load_heads(path: Path = WEIGHTS) -> tuple[Heads, dict]:
    """The shipped heads and their manifest."""
    sd, meta, manifest = load_weights(path, "medusa")
    ids = sd.pop("draft_vocab", None)
    w = sd["w"]
    heads = Heads(w.shape[-1], w.shape[0], DraftVocab(ids, int(meta["vocab_size"])) if ids is not None else None)
    heads.load_state_dict({k: v.float() for k, v in sd.items()})
    return heads.eval(), manifest


class Medusa(Drafter):
    name = "medusa"
    reads_hidden = entry(name).reads_hidden   # the engine hands over the target's hidden state (observe)

    def __init__(self, target, heads: Heads | None = None, tree=None, manifest: dict | None = None):
        if heads is None:
            if not weights_for(self.name, target):
                raise untrained(self.name, target)
            heads, manifest = load_heads()
        manifest = manifest or {}
        hidden = int(target.model.config.hidden_size)
        if heads.w.shape[-1] != hidden:
            raise DrafterUnavailable(f"the Medusa heads were trained for hidden size {heads.w.shape[-1]}, "
                                     f"this target has {hidden}: train heads for it")
        want = manifest.get("target")
        if want and not trained_for(manifest, target):
            raise DrafterUnavailable(f"the Medusa heads were trained for {want!r}, not {target.name!r}")
        paths = tree if tree is not None else [tuple(p) for p in manifest.get("tree", DEFAULT_TREE)]
        self.tree: Tree = paths if isinstance(paths, Tree) else compile_tree(paths)
        if self.tree.max_depth > heads.n_heads:
            raise DrafterUnavailable(f"tree depth {self.tree.max_depth} needs {self.tree.max_depth} heads, "
                                     f"the weights have {heads.n_heads}")
        self.target, self.manifest = target, manifest
        self.heads = heads.to(target.device)
        self.lm_head = target.model.get_output_embeddings()
        self.head_w = head_weight(heads, self.lm_head)
        # drafting: the fast path's packed heads (int8 weights on the CPU), else the module
        self.rows = backend.medusa_rows(self.heads, self.head_w, self.tree.max_depth, target.dtype, int8=True) \
            or HeadRows(self.heads, self.head_w, self.tree.max_depth)
        self.default_k = self.tree.max_depth
        self._cut: dict[int, Tree] = {}
        self.h, self.h_len = None, -1

    # state: the final hidden state of the newest token the target has run, and how many tokens that makes

    def begin(self, prompt: list[int]) -> None:
        self.h, self.h_len = None, -1

    def observe(self, h: torch.Tensor, n: int) -> None:
        self.h, self.h_len = h.reshape(-1, h.shape[-1])[-1], n       # the heads read the newest position only

    def propose(self, ctx: DraftContext) -> Proposal:
        # the root (the pending token) must be the one drawn from self.h: exactly one token after it
        if self.h is None or len(ctx.tokens) != self.h_len + 1 or ctx.k < 1:
            return Proposal.empty()
        if ctx.k < self.tree.max_depth and ctx.k not in self._cut:   # prune once per k, not every step
            self._cut[ctx.k] = self.tree.pruned(ctx.k)
        tree = self._cut[ctx.k] if ctx.k < self.tree.max_depth else self.tree
        with torch.inference_mode():
            top, pr = self.rows(self.h, max(tree.width), probs=True)                                   # [n, W]
        top, pr = top[:tree.max_depth].cpu(), pr[:tree.max_depth].cpu()                                 # [D, W]
        nodes = tree.tokens(ctx.tokens[-1], top)
        d, r = tree.depth[1:] - 1, tree.rank[1:]
        # head d-1's probability of each node's token (heads read only h: the same whatever the parent)
        return Proposal(nodes[1:], tree=tree, conf=pr[d, r].tolist(), info={"heads": tree.max_depth})
