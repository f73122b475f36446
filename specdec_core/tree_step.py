"""One verification step over a candidate tree: what the target scores, the verdict, what the cache keeps.

Miao et al., "SpecInfer" (2024), tree attention; Cai et al., "Medusa" (2024), sec. 2.1.2. The chain
counterpart is chain_step.py; this module gives the engine and the batch the same three things:

  slots   - the pending token (the root) and every tree node, in tree order. Node i sits at position
            context + depth(i) and sees the committed context plus its own ancestors only (LM.tree_forward:
            our forward gathers each node's ancestors into position order; transformers' takes a 4D additive
            mask and explicit position ids)
  verify  - verify_tree (pure) walks the tree with the exact multi-candidate rule
  kept    - the root and the accepted path's nodes become committed entries: the engine moves them into
            place right after the context, in every layer, and drops the rest. The step is shown as a chain:
            drafted = the accepted path + the first rejected child of its last node (if one was tried), so
            acceptance rates compare with chain drafters; the whole walk (every candidate, every trial) rides
            along as a Walk, which the engine turns into the record's TreeView
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .chain_step import Checked
from .drafters import Proposal
from .sampling import SamplingParams, probs
from .tree import Tree
from .verify import ChainVerdict, one_hot
from .verify_tree import TreeVerdict, verify_tree, without


@dataclass
class Walk:
    """A tree step as verified: the tree, its node ids [T] (root first), the target's p after each node [T, V]
    and the verdict (every trial in order)."""
    tree: Tree
    ids: list[int]
    p: torch.Tensor
    verdict: TreeVerdict

    def residuals(self) -> dict[int, torch.Tensor]:
        """node -> the residual [V] left after its rejection: replays verify_tree's rule over the recorded trials
        (deterministic candidates, so q is one-hot: the rejected token's mass removed, renormalized)."""
        out, r, at = {}, None, None
        for t in self.verdict.trials:
            par = int(self.tree.parent[t.node])
            if par != at:                         # the rule moved to a new parent: it starts from p(. | parent)
                r, at = self.p[par], par
            if not t.accepted:
                r = out[t.node] = without(r, self.ids[t.node])
        return out


def slots(pending: int, prop: Proposal, k: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """-> (ids [T], position offsets [T] = depths, who sees whom [T, T] = ancestors). The drafter has
    already pruned its tree to depth k."""
    tree: Tree = prop.tree
    return [pending] + prop.tokens.tolist(), tree.depth, tree.mask


def chain_view(tree: Tree, v: TreeVerdict) -> list[int]:
    """The accepted path plus the first rejected child of its last node (if one was tried)."""
    last = v.path[-1] if v.path else 0
    tried = [t.node for t in v.trials if tree.parent[t.node] == last and not t.accepted]
    return v.path + tried[:1]


def verify(logits: torch.Tensor, ids: list[int], prop: Proposal, sp: SamplingParams,
           gen: torch.Generator | None) -> Checked:
    """The target's logits over the tree [T, V] -> the verdict, seen as a chain, with the whole walk."""
    tree: Tree = prop.tree
    nodes = torch.tensor(ids, dtype=torch.long, device=logits.device)                  # [T]
    p = probs(logits, sp)                                                              # [T, V]
    v = verify_tree(p, nodes, tree, gen)
    shown = chain_view(tree, v)
    draft = nodes[shown]                                                               # [m]
    trial = {t.node: t for t in v.trials}
    f = lambda key: torch.tensor([getattr(trial[n], key) for n in shown], dtype=torch.float32)
    verdict = ChainVerdict(len(v.path), v.token, v.kind, f("p_x"), f("q_x"), f("accept_prob"), f("u"), v.final_dist)
    # p before each shown token, then after the last; the drafts are deterministic (one-hot q)
    return Checked(draft, p[[0] + shown], one_hot(draft, p.shape[-1]), verdict, [0] + v.path, Walk(tree, ids, p, v))
