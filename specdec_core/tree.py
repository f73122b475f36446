"""A candidate tree declared as data and compiled once into the tensors one verification forward needs.

Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads" (2024), sec. 2.1.2;
Miao et al., "SpecInfer: Accelerating Generative LLM Serving with Tree-based Speculative Inference" (2024).

A tree is a list of paths, each a tuple of ranks: (0,) is the top candidate for the first drafted position,
(0, 1) the second-ranked candidate for the second position, placed after (0,). Every prefix of a path must be
in the list too. Node 0 is the root: the pending token (the newest committed one, not yet run by the target).
Nodes are ordered by (depth, path), so a parent precedes its children and siblings come in rank order, the
order verification tries them in.

Compiled once, the tree gives, for T = 1 + len(paths) nodes:
  mask      [T, T]   bool, mask[i, j] = j is i or an ancestor of i (each node sees only its own branch)
  depth     [T]      0 for the root; the node's position offset after the committed context
  parent    [T]      -1 for the root
  rank      [T]      which candidate of its position the node is (-1 for the root)
  children  per node, its children in rank order (verification tries them in that order)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

MAX_NODES = 512


class TreeError(ValueError):
    """A tree declared as paths is malformed; the message names the bad path."""


@dataclass(frozen=True)
class Tree:
    paths: tuple[tuple[int, ...], ...]   # node order, root excluded
    depth: torch.Tensor                  # [T] long
    parent: torch.Tensor                 # [T] long
    rank: torch.Tensor                   # [T] long
    mask: torch.Tensor                   # [T, T] bool
    children: tuple[tuple[int, ...], ...]  # per node, in rank order

    @property
    def size(self) -> int:
        return int(self.depth.numel())

    @cached_property
    def max_depth(self) -> int:
        return max(map(len, self.paths), default=0)   # no tensor op: a proposal reads it every step

    @cached_property
    def width(self) -> list[int]:
        """[D] how many ranked candidates each drafted position needs (its largest rank + 1)."""
        w = [0] * self.max_depth
        for p in self.paths:
            w[len(p) - 1] = max(w[len(p) - 1], p[-1] + 1)
        return w

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to `node` (empty for the root)."""
        out = []
        while node > 0:
            out.append(node)
            node = int(self.parent[node])
        return out[::-1]

    def pruned(self, depth: int) -> "Tree":
        """The same tree cut to paths of at most `depth` positions."""
        return compile_tree([p for p in self.paths if len(p) <= depth])

    def tokens(self, root: int, ranked: torch.Tensor) -> torch.Tensor:
        """ranked [D, W] candidate ids per position (best first) -> [T] id per node, root first."""
        D, W = ranked.shape
        if D < self.max_depth or W < max(self.width, default=0):
            raise TreeError(f"tree needs {self.max_depth} positions x {max(self.width, default=0)} candidates, "
                            f"got {D} x {W}")
        d, r = self.depth.clamp(min=1) - 1, self.rank.clamp(min=0)
        out = ranked.to(torch.long)[d, r]
        out[0] = root
        return out


def compile_tree(paths, ordered: bool = False) -> Tree:
    """List of rank paths -> Tree. Raises TreeError for a malformed declaration. ordered=True: paths a drafter
    built, already distinct tuples of ranks, prefix-closed and sorted by (length, path), so none of the checks
    (a proposal's tree is compiled anew on most steps, and they were half of that)."""
    if ordered:
        return _compiled(tuple(paths))
    seen: set[tuple[int, ...]] = set()
    clean = []
    for p in paths:
        if not isinstance(p, (tuple, list)) or not p:
            raise TreeError(f"each path must be a non-empty tuple of ranks, got {p!r}")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in p):
            raise TreeError(f"ranks must be integers >= 0, got path {p!r}")
        p = tuple(p)
        if p in seen:
            raise TreeError(f"path {p} is declared twice")
        seen.add(p)
        clean.append(p)
    for p in clean:
        if len(p) > 1 and p[:-1] not in seen:
            raise TreeError(f"path {p} has no parent: {p[:-1]} must be declared too")
    return _compiled(tuple(sorted(clean, key=lambda p: (len(p), p))))


def _compiled(order: tuple) -> Tree:
    """compile_tree's Tree from distinct, prefix-closed rank paths sorted by (length, path)."""
    if len(order) + 1 > MAX_NODES:
        raise TreeError(f"a tree may have at most {MAX_NODES - 1} paths, got {len(order)}")
    index = {(): 0} | {p: i + 1 for i, p in enumerate(order)}
    T = len(order) + 1
    par = [-1] + [index[p[:-1]] for p in order]
    # built in Python bytes and lists, one tensor each at the end: a drafter with trees shaped by its confidence
    # compiles most steps' trees anew, and a tensor op per node costs more than the list work (the mask's bytes
    # become a bool tensor without a pass over a nested list: 2 us against 16 for 13 nodes)
    see = bytearray(T * T)                # row i: the nodes node i sees (1) or not (0)
    see[0] = 1
    kids: list[list[int]] = [[] for _ in range(T)]
    for i in range(1, T):                 # parents come first, so a parent's row is complete
        p = par[i]
        see[i * T:(i + 1) * T] = see[p * T:(p + 1) * T]
        see[i * T + i] = 1
        kids[p].append(i)                 # ascending index = ascending rank among siblings
    meta = torch.tensor([[0] + [len(p) for p in order], par, [-1] + [p[-1] for p in order]], dtype=torch.long)
    return Tree(order, meta[0], meta[1], meta[2], torch.frombuffer(see, dtype=torch.bool).view(T, T),
                tuple(tuple(c) for c in kids))


def graft(nodes: dict[tuple[int, ...], int], chain: list[int]) -> list[tuple[int, ...]]:
    """Hang a chain of tokens (a continuation of the root) on a tree given as {rank path: token}, in place:
    follow the nodes that already hold the chain's tokens, then add the rest, each the next free rank among
    its siblings (SpecInfer's merged token trees). -> the added paths, in chain order: each the parent of the
    next, so any prefix of them keeps the tree prefix-closed."""
    kids: dict[tuple[int, ...], dict[int, tuple[int, ...]]] = {}
    for p, t in nodes.items():
        kids.setdefault(p[:-1], {})[t] = p
    at, added = (), []
    for t in chain:
        sib = kids.setdefault(at, {})
        if t not in sib:
            sib[t] = at + (max((q[-1] for q in sib.values()), default=-1) + 1,)
            nodes[sib[t]] = t
            added.append(sib[t])
        at = sib[t]
    return added


def chain_tree(k: int) -> Tree:
    """A plain chain of k top-1 candidates: (0,), (0, 0), ..."""
    return compile_tree([(0,) * d for d in range(1, k + 1)])


def best_tree(acc: list[list[float]], n_nodes: int) -> list[tuple[int, ...]]:
    """Pick the n_nodes paths with the largest estimated reach probability (Medusa's construction).

    acc[d][r] is the measured chance that the rank-r candidate of position d is the accepted one. A path's
    reach probability is the product along it; since every factor is <= 1, a prefix is never worse than its
    extension, so taking the best paths greedily from the frontier keeps the set prefix-closed."""
    chosen: list[tuple[int, ...]] = []
    frontier = {(r,): acc[0][r] for r in range(len(acc[0]))} if acc else {}
    while frontier and len(chosen) < n_nodes:
        p = max(frontier, key=lambda x: (frontier[x], [-r for r in x]))
        w = frontier.pop(p)
        chosen.append(p)
        if len(p) < len(acc):
            for r in range(len(acc[len(p)])):
                frontier[p + (r,)] = w * acc[len(p)][r]
    return chosen
