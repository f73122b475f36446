"""Suffix decoding: a training-free draft tree from what this session has already seen.

Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications" (2024); vLLM's
`suffix` method. Every sequence the session decodes (prompt and output) stays in a token index; at each step the
longest suffix of the text so far that occurred before (up to `max_match` tokens) is looked up, the
continuations that followed its occurrences are merged into a trie, and the most frequent branches are proposed
as a candidate tree (nodes chosen greedily by their empirical probability, count / occurrences). The tree's size
adapts to the match: `factor` nodes per matched token, up to `max_nodes`, and no branch seen in under
`min_prob` of the occurrences. Proposals are deterministic (one-hot q) and verified with the exact
multi-candidate rule of verify_tree.py, so the output law is the target's.

Why it shines on repetitive, agent-like work: a second run of a similar request finds the first one's output in
the index, so long continuations are proposed and accepted; prompt lookup sees only the current text. Runs share
an index only where one is passed (the app passes the session's); without one, each run has its own.
"""
from __future__ import annotations

import heapq
import math

import torch

from ..tree import compile_tree
from . import DraftContext, Drafter, Proposal, entry

MAX_OCC = 256   # occurrences merged per step: a frequent short suffix would otherwise cost a long scan


class SuffixIndex:
    """Token sequences of a session (prompts and outputs) and where each n-gram (n <= max_match) ended.

    Lives as long as the session: pass one to several drafters (runs) and later runs draft from earlier ones.
    Bounded: past `max_tokens` the oldest sequences are dropped."""

    def __init__(self, max_match: int = 8, max_tokens: int = 200_000):
        self.max_match, self.max_tokens = max_match, max_tokens
        self.docs: dict[int, list[int]] = {}
        self.ends: dict[tuple[int, ...], list[tuple[int, int]]] = {}   # n-gram -> (doc, position after it)
        self.next_id, self.size = 0, 0

    def open(self) -> int:
        """A new, empty sequence; returns its id."""
        d = self.next_id
        self.next_id += 1
        self.docs[d] = []
        return d

    def extend(self, d: int, tokens: list[int]) -> None:
        doc = self.docs[d]
        for t in tokens:
            doc.append(int(t))
            end = len(doc)
            for n in range(1, min(self.max_match, end) + 1):
                self.ends.setdefault(tuple(doc[end - n:end]), []).append((d, end))
        self.size += len(tokens)
        while self.size > self.max_tokens and len(self.docs) > 1:
            self.drop(min(self.docs))

    def drop(self, d: int) -> None:
        doc = self.docs.pop(d)
        self.size -= len(doc)
        for end in range(1, len(doc) + 1):
            for n in range(1, min(self.max_match, end) + 1):
                key = tuple(doc[end - n:end])
                left = [x for x in self.ends.get(key, ()) if x[0] != d]
                if left:
                    self.ends[key] = left
                else:
                    self.ends.pop(key, None)

    def continuations(self, tail: list[int], skip: tuple[int, int], depth: int,
                      before: int | None = None) -> tuple[int, list[list[int]]]:
        """For the longest suffix of `tail` seen before (not counting the occurrence `skip`, the text itself):
        (its length, the up-to-`depth` tokens that followed each earlier occurrence). `before`: only sequences
        opened before that id, and the text's own (skip's)."""
        own = skip[0]
        for n in range(min(self.max_match, len(tail)), 0, -1):
            occ = [e for e in self.ends.get(tuple(tail[-n:]), ())
                   if e != skip and (before is None or e[0] < before or e[0] == own)][-MAX_OCC:]   # the most recent
            conts = [self.docs[d][p:p + depth] for d, p in occ]
            conts = [c for c in conts if c]
            if conts:
                return n, conts
        return 0, []


class Suffix(Drafter):
    name = "suffix"
    default_k = entry(name).default_k   # the deepest branch; the tree's size adapts to the match

    def __init__(self, index: SuffixIndex | None = None, factor: float = 2.0, max_nodes: int = 24,
                 min_prob: float = 0.1, before: int | None = None):
        """index: the session's, shared by its runs (None: each run its own); before: draft only from the
        index's sequences opened before that id (and the run's own text), as a run that started then saw it:
        a timed repeat of a run drafts from what that run drafted from, not from the run itself."""
        if factor <= 0 or max_nodes < 1 or not 0 <= min_prob <= 1:
            raise ValueError(f"need factor > 0, max_nodes >= 1 and 0 <= min_prob <= 1, got {factor}, "
                             f"{max_nodes}, {min_prob}")
        self.shared = index                       # the session's index, if one was given
        self.index = index if index is not None else SuffixIndex()   # a run's own one (begin) where not
        self.factor, self.max_nodes, self.min_prob, self.before = factor, max_nodes, min_prob, before
        self.doc, self.seen = -1, 0

    def begin(self, prompt: list[int]) -> None:
        # without a session index each run starts from an empty one: a drafter reused for the timed repeats of
        # one prompt (bench, profile) would otherwise find that prompt's own earlier answer and draft all of it
        if self.shared is None:
            self.index = SuffixIndex()
        self.doc, self.seen = self.index.open(), 0

    def sync(self, tokens: list[int]) -> None:
        """Index the committed tokens not indexed yet (committed text never changes, it only grows)."""
        self.index.extend(self.doc, tokens[self.seen:])
        self.seen = len(tokens)

    def propose(self, ctx: DraftContext) -> Proposal:
        self.sync(ctx.tokens)
        n, conts = self.index.continuations(ctx.tokens, (self.doc, len(ctx.tokens)), ctx.k, self.before)
        if not n:
            return Proposal.empty(match=0)
        budget = min(self.max_nodes, max(1, math.ceil(self.factor * n)))
        share: dict = {}
        paths, toks = grow(conts, budget, self.min_prob, share)
        if not paths:
            return Proposal.empty(match=n)
        tree = compile_tree(paths)
        nodes = torch.tensor([toks[p] for p in tree.paths], dtype=torch.long)
        # how often the token followed its branch: a node's share over its parent's
        conf = [share[p] / (share[p[:-1]] if len(p) > 1 else 1.0) for p in tree.paths]
        return Proposal(nodes, tree=tree, conf=conf,
                        info={"match": n, "occurrences": len(conts), "nodes": len(paths)})


def grow(conts: list[list[int]], budget: int, min_prob: float,
         share: dict | None = None) -> tuple[list[tuple[int, ...]], dict]:
    """Merge continuations into a trie and keep the `budget` most likely nodes (count / len(conts)), each at
    least `min_prob`. A child is never likelier than its parent, so taking the best of the frontier keeps the
    chosen set prefix-closed. -> (rank paths, token of each path); ranks order siblings by count. `share`,
    if given, receives each chosen path's count / len(conts)."""
    trie: dict[tuple[int, ...], int] = {}
    for c in conts:
        for j in range(1, len(c) + 1):
            trie[tuple(c[:j])] = trie.get(tuple(c[:j]), 0) + 1
    kids: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for key in trie:
        kids.setdefault(key[:-1], []).append(key)
    for v in kids.values():
        v.sort(key=lambda key: (-trie[key], key[-1]))
    rank = {key: r for v in kids.values() for r, key in enumerate(v)}
    total = len(conts)
    frontier = [(-trie[key] / total, key) for key in kids.get((), [])]
    heapq.heapify(frontier)
    paths, toks = [], {}
    while frontier and len(paths) < budget:
        negp, key = heapq.heappop(frontier)
        if -negp < min_prob:
            break
        path = tuple(rank[key[:j]] for j in range(1, len(key) + 1))
        paths.append(path)
        toks[path] = key[-1]
        if share is not None:
            share[path] = -negp
        for child in kids.get(key, []):
            heapq.heappush(frontier, (-trie[child] / total, child))
    return paths, toks
