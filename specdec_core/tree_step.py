"""One verification step over a candidate tree: score the whole tree in one target forward, verify, compact.

Miao et al., "SpecInfer" (2024), tree attention; Cai et al., "Medusa" (2024), sec. 2.1.2.

  score   - the pending token (the root) and every tree node go through the target in one forward. Node i
            sits at position cache_len + depth(i) and may attend to the whole committed context plus its own
            ancestors only (LM.tree_forward: our forward gathers each node's ancestors into position order;
            transformers' takes a 4D additive mask and explicit position_ids).
  verify  - verify_tree (pure) walks the tree with the exact multi-candidate rule.
  commit  - the cache now holds the root and all T-1 nodes; the accepted path's entries are moved into place
            right after the root, in every layer, and the rest dropped. The first rejected child is kept one
            slot further, so the engine rolls it back exactly as it rolls back a rejected chain draft.

To the engine the step looks like a chain: drafted = the accepted path + the first rejected child.
"""
from __future__ import annotations

import torch

from .models import LM, compact
from .sampling import SamplingParams, probs
from .tree import Tree
from .verify import ChainVerdict, one_hot
from .verify_tree import TreeVerdict, verify_tree


def tree_forward(target: LM, cache, ids: torch.Tensor, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T] (root first, tree order) after what `cache` holds -> (logits [T, V] float32, hidden [T, H]).

    hidden is the final-norm output, the LM head's input: what Medusa heads read."""
    return target.tree_forward(cache, ids, tree)


def chain_view(tree: Tree, v: TreeVerdict) -> list[int]:
    """The step seen as a chain: the accepted path plus the first rejected child of its last node (if one was
    tried). Its length is what the engine and the batch count as drafted, so acceptance rates compare."""
    last = v.path[-1] if v.path else 0
    tried = [t.node for t in v.trials if tree.parent[t.node] == last and not t.accepted]
    return v.path + tried[:1]


def tree_step(target: LM, drafter, prop, cache, pending: int, sp: SamplingParams, gen: torch.Generator | None):
    """Score, verify and commit one tree proposal. Returns the chain view (draft [m], p [m+1, V], q [m, V],
    ChainVerdict) for the engine's bookkeeping; fills prop.info with the tree and the accepted path, and
    hands the drafter the hidden state of the last accepted node."""
    tree: Tree = prop.tree
    dev = target.device
    nodes = torch.cat([torch.tensor([pending]), prop.tokens.cpu()]).to(torch.long)    # [T]
    L = cache.get_seq_length()
    logits, hidden = tree_forward(target, cache, nodes, tree)
    p = probs(logits, sp)                                                              # [T, V]
    v: TreeVerdict = verify_tree(p, nodes.to(dev), tree, gen)

    path = v.path
    last = path[-1] if path else 0
    shown = chain_view(tree, v)
    compact(cache, L, torch.tensor([0] + shown))
    drafter.observe(hidden[last], len(path))

    m = len(shown)
    draft = nodes[shown].to(dev)                                                       # [m]
    rows = [0] + shown                                     # p before each shown token, then after the last
    V = p.shape[-1]
    trial = {t.node: t for t in v.trials}
    f = lambda key: torch.tensor([getattr(trial[n], key) for n in shown], dtype=torch.float32)
    verdict = ChainVerdict(len(path), v.token, v.kind, f("p_x"), f("q_x"), f("accept_prob"), f("u"), v.final_dist)
    prop.info.update(tree=[list(x) for x in tree.paths], candidates=nodes.tolist(), accepted_path=path,
                     tried=[t.node for t in v.trials])
    return draft, p[rows], one_hot(draft, V), verdict
