"""Tree drafting: the compiler by hand, exactness of tree verification by chi-square, medusa end to end."""
from __future__ import annotations

import bisect
import itertools
import random
import zlib

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_core import verify_tree as vt
from specdec_core.tree import TreeError, best_tree, chain_tree, compile_tree, graft
from specdec_core.verify_tree import verify_tree

SMALL = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


# ---------------------------------------------------------------- compiler

def test_compile_by_hand():
    t = compile_tree(list(reversed(SMALL)))        # declaration order must not matter
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert t.size == 7 and t.max_depth == 3
    assert t.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.parent.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert t.rank.tolist() == [-1, 0, 1, 0, 1, 0, 0]
    rows = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5}, 6: {0, 1, 3, 6}}
    want = torch.zeros(7, 7, dtype=torch.bool)
    for i, js in rows.items():
        want[i, list(js)] = True
    assert torch.equal(t.mask, want)
    leaves = [i for i in range(t.size) if not t.children[i]]
    assert [[0] + t.path_to(i) for i in leaves] == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]
    assert t.children == ((1, 2), (3, 4), (5,), (6,), (), (), ())
    assert t.width == [2, 2, 1]
    assert t.path_to(6) == [1, 3, 6] and t.path_to(0) == []
    ranked = torch.tensor([[10, 11], [20, 21], [30, 31]])
    assert t.tokens(99, ranked).tolist() == [99, 10, 11, 20, 21, 20, 30]
    assert t.pruned(2).paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert chain_tree(3).paths == ((0,), (0, 0), (0, 0, 0))


@pytest.mark.parametrize("paths, msg", [
    ([(0,), (0, 0), (1, 1)], "no parent"),
    ([(0,), (0,)], "declared twice"),
    ([(0,), (-1,)], "integers >= 0"),
    ([()], "non-empty"),
    ([(0,), (0.5,)], "integers >= 0"),
])
def test_compile_rejects_bad_trees(paths, msg):
    with pytest.raises(TreeError, match=msg):
        compile_tree(paths)


def test_an_ordered_tree_compiles_as_a_declared_one():
    """compile_tree(..., ordered=True), a drafter's sorted prefix-closed paths without the checks, gives the Tree the
    checked path gives: the same paths, depths, parents, ranks, mask and children, on random trees."""
    import random
    rng = random.Random(0)
    for _ in range(200):
        paths = set()
        for _ in range(rng.randint(1, 20)):
            p = ()
            for _ in range(rng.randint(1, 5)):
                p += (rng.randrange(3),)
                paths.add(p)
        declared = list(paths)
        rng.shuffle(declared)
        a = compile_tree(declared)
        b = compile_tree(sorted(paths, key=lambda p: (len(p), p)), ordered=True)
        assert a.paths == b.paths and a.children == b.children
        for x, y in ((a.mask, b.mask), (a.depth, b.depth), (a.parent, b.parent), (a.rank, b.rank)):
            assert torch.equal(x, y)


def test_tokens_needs_enough_candidates():
    with pytest.raises(TreeError, match="needs 3 positions x 2 candidates"):
        compile_tree(SMALL).tokens(0, torch.zeros(2, 2, dtype=torch.long))


def test_graft_follows_the_nodes_that_hold_a_chain_then_hangs_the_rest():
    """A copied continuation grafted onto a tree: it walks the nodes that already hold its tokens and adds the
    rest as a chain under the last of them, each the next free rank; the result compiles (prefix-closed)."""
    nodes = {(0,): 7, (1,): 9, (0, 0): 8, (0, 1): 4}
    added = graft(nodes, [7, 4, 5, 6])
    assert added == [(0, 1, 0), (0, 1, 0, 0)] and nodes[(0, 1, 0)] == 5 and nodes[(0, 1, 0, 0)] == 6
    assert graft(nodes, [3]) == [(2,)] and nodes[(2,)] == 3            # a new first token: the next root rank
    assert graft(nodes, [7, 8]) == []                                   # already there: nothing added
    tree = compile_tree(sorted(nodes, key=lambda p: (len(p), p)))
    assert tree.size == len(nodes) + 1
    del nodes[added[-1]]                                                # a prefix of the added keeps it closed
    compile_tree(list(nodes))


def test_best_tree_is_prefix_closed_and_greedy():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.2], [0.4]]
    paths = best_tree(acc, 6)
    compile_tree(paths)                        # prefix-closed, or this raises
    # reach probabilities: (0,) .6, (1,) .2, (0,0) .3, (0,1) .12, (2,) .1, (0,0,0) .12, (1,0) .1
    assert paths[:3] == [(0,), (0, 0), (1,)]
    assert set(paths[3:5]) == {(0, 1), (0, 0, 0)}


# ---------------------------------------------------------------- exactness on synthetic distributions

V, L = 5, 3   # vocabulary, length of the committed prefix whose joint law is tested (V**L cells)


def _dist(key: tuple, salt: str, temp: float) -> torch.Tensor:
    """A fixed pseudo-random distribution over V tokens for each context `key`."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((salt, key)).encode()))
    return torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2.0 / temp, -1).float()


def _draw(cdf: list[float], u: float) -> int:
    return min(bisect.bisect_right(cdf, u * cdf[-1]), len(cdf) - 1)


class Synth:
    """Target p(.|ctx) and a draft q(.|ctx) that half agrees with it, on a tiny vocabulary, memoized."""

    def __init__(self, temp: float):
        self.temp, self.memo = temp, {}

    def p(self, ctx) -> torch.Tensor:
        if ("p", ctx) not in self.memo:
            self.memo["p", ctx] = _dist(ctx, "p", self.temp)
        return self.memo["p", ctx]

    def q(self, ctx) -> list[float]:
        if ("q", ctx) not in self.memo:
            self.memo["q", ctx] = (0.5 * self.p(ctx) + 0.5 * _dist(ctx, "q", 1.0)).tolist()
        return self.memo["q", ctx]

    def cdf(self, ctx) -> list[float]:
        if ("c", ctx) not in self.memo:
            self.memo["c", ctx] = list(itertools.accumulate(self.p(ctx).tolist()))
        return self.memo["c", ctx]

    def joint(self, ctx) -> np.ndarray:
        """Exact law of the next L tokens under ancestral sampling from p."""
        out = np.zeros([V] * L)
        for seq in itertools.product(range(V), repeat=L):
            pr = 1.0
            for i in range(L):
                pr *= float(self.p(ctx + seq[:i])[seq[i]])
            out[seq] = pr
        return out


def _ranked(s: Synth, tree, ctx):
    """Medusa-like heads: position d's candidates are ranked once, from the root, along q's greedy chain."""
    key = ("r", tree.paths, ctx)
    if key not in s.memo:
        rows, c = [], ctx
        for _ in range(tree.max_depth):
            q = s.q(c)
            rows.append(sorted(range(V), key=lambda x: -q[x]))
            c = c + (rows[-1][0],)
        toks = tree.tokens(ctx[-1], torch.tensor(rows))
        s.memo[key] = toks, _node_p(s, tree, ctx, toks.tolist())
    return s.memo[key]


def _node_p(s: Synth, tree, ctx, toks):
    prefix = [ctx]
    for j in range(1, tree.size):
        prefix.append(prefix[int(tree.parent[j])] + (toks[j],))
    return torch.stack([s.p(c) for c in prefix])


def _draft(s: Synth, tree, ctx, mode: str, rng: random.Random):
    """Node tokens, the q each was drawn from (None = deterministic), and p after each node."""
    if mode == "ranked":
        toks, p = _ranked(s, tree, ctx)
        return toks, None, p
    T = tree.size
    toks, prefix, q = [ctx[-1]] + [0] * (T - 1), [ctx] + [()] * (T - 1), [[0.0] * V for _ in range(T)]
    for j in range(T):
        base = s.q(prefix[j])
        left = list(base)
        for c in tree.children[j]:
            dist = base if mode == "iid" else [x / sum(left) for x in left]   # wor: siblings drawn without replacement
            toks[c] = _draw(list(itertools.accumulate(dist)), rng.random())
            prefix[c] = prefix[j] + (toks[c],)
            q[c] = dist
            left[toks[c]] = 0.0
    return torch.tensor(toks), torch.tensor(q), torch.stack([s.p(c) for c in prefix])


def _run_trials(paths, mode, temp, n, seed=0, synth=Synth):
    tree = compile_tree(paths)
    s = synth(temp)
    ctx = (0,)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    counts = np.zeros([V] * L)
    lengths = []
    for _ in range(n):
        toks, q, p = _draft(s, tree, ctx, mode, rng)
        v = verify_tree(p, toks, tree, gen, q)
        seq = [int(toks[c]) for c in v.path] + [v.token]
        lengths.append(len(seq))
        while len(seq) < L:                     # the following steps, drawn from the target directly
            seq.append(_draw(s.cdf(ctx + tuple(seq)), rng.random()))
        counts[tuple(seq[:L])] += 1
    return counts, s.joint(ctx), float(np.mean(lengths))


def _pvalue(counts, probs) -> float:
    n = counts.sum()
    exp = probs.ravel() / probs.sum() * n
    obs = counts.ravel()
    assert obs[exp == 0].sum() == 0, "a sequence the target gives no mass was committed"
    exp, obs = exp[exp > 0], obs[exp > 0]
    small = exp < 5                             # pool sparse cells so the chi-square approximation holds
    if small.any():
        exp = np.append(exp[~small], exp[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
    return float(chisquare(obs, exp).pvalue)


WIDE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0)]
DEEP = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)]
LONG = pytest.mark.long   # make test-long
CASES = [  # every tree shape, every way of drawing siblings, both temperatures (all three in the quick run)
    pytest.param(SMALL, "ranked", 0.7, marks=LONG), pytest.param(WIDE, "ranked", 1.2, marks=LONG),
    (DEEP, "ranked", 1.2),
    (WIDE, "iid", 0.7), pytest.param(DEEP, "iid", 1.2, marks=LONG), (SMALL, "wor", 1.2),
    pytest.param(DEEP, "wor", 0.7, marks=LONG),
]


@pytest.mark.parametrize("paths, mode, temp", CASES)
def test_tree_verification_is_exact(paths, mode, temp):
    counts, probs, mean_len = _run_trials(paths, mode, temp, n=100_000)
    pv = _pvalue(counts, probs)
    assert pv > 1e-3, f"committed tokens do not follow the target (chi-square p = {pv:.2e})"
    assert mean_len > 1.2, "the test tree should accept drafted tokens often"


class Truncated(Synth):
    """A target that gives no mass to its two least likely tokens (as top-k or top-p leave it): ranked
    candidates then include tokens p cannot produce, whose rejection removes nothing from the residual."""

    def p(self, ctx) -> torch.Tensor:
        if ("t", ctx) not in self.memo:
            d = super().p(ctx).clone()
            d[d.argsort()[:2]] = 0.0
            self.memo["t", ctx] = d / d.sum()
        return self.memo["t", ctx]


@LONG
def test_tree_verification_is_exact_when_candidates_have_no_mass():
    counts, probs, mean_len = _run_trials(WIDE, "ranked", 1.2, n=100_000, synth=Truncated)
    assert _pvalue(counts, probs) > 1e-3 and mean_len > 1.2


def test_broken_rule_is_caught(monkeypatch):
    """Forgetting to remove a rejected sibling's mass (no residual update) must fail the same test."""
    monkeypatch.setattr(vt, "residual", lambda r, q: r)
    counts, probs, _ = _run_trials(WIDE, "ranked", 1.2, n=100_000)
    assert _pvalue(counts, probs) < 1e-6


@LONG   # the quick run's must-fail case is test_broken_rule_is_caught
def test_sibling_order_matters_for_iid_without_residual(monkeypatch):
    """A second broken rule: SpecInfer's i.i.d. siblings tested against p instead of the residual."""
    monkeypatch.setattr(vt, "residual", lambda r, q: r)
    counts, probs, _ = _run_trials(WIDE, "iid", 1.2, n=100_000, seed=1)
    assert _pvalue(counts, probs) < 1e-6


def test_greedy_tree_commits_the_argmax_chain():
    """One-hot p: the accepted path must be exactly the argmax chain, and the final token its argmax."""
    s = Synth(1.0)
    tree = compile_tree(DEEP)
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        ctx = (trial % V, trial // V)
        toks, _, p = _draft(s, tree, ctx, "ranked", None)
        greedy = torch.zeros_like(p).scatter_(1, p.argmax(1, keepdim=True), 1.0)
        v = verify_tree(greedy, toks, tree, gen)
        seq = [int(toks[c]) for c in v.path] + [v.token]
        want, c = [], ctx
        for _ in range(len(seq)):
            want.append(int(s.p(c).argmax()))
            c = c + (want[-1],)
        assert seq == want
        # and it went as deep as the tree allowed: a child equal to the argmax is never rejected
        node = v.path[-1] if v.path else 0
        assert all(int(toks[k]) != want[len(v.path)] for k in tree.children[node])


def test_the_record_shows_every_candidate_and_trial_as_the_rule_made_them():
    """The step record's TreeView: one node per drafted candidate (root first, with parent, depth and rank as
    compiled), each trial exactly as verify_tree made it (same generator), the accepted path lit, and after each
    rejection the residual the next sibling is tested against."""
    from specdec_core import tree_step
    from specdec_core.drafters import Proposal
    from specdec_core.engine import Recorder
    from specdec_core.sampling import SamplingParams as SP

    class Tok:
        def decode(self, ids, **kw):
            return "".join(f"<{i}>" for i in ids)

    s, tree, rejected = Synth(1.2), compile_tree(DEEP), 0
    for seed in range(40):
        ctx = (seed % V, 1)
        toks, _, p = _draft(s, tree, ctx, "ranked", None)
        prop = Proposal(toks[1:], tree=tree, conf=[0.5] * (tree.size - 1))
        c = tree_step.verify(p.log(), toks.tolist(), prop, SP(temperature=1.0), torch.Generator().manual_seed(seed))
        v = verify_tree(p, toks, tree, torch.Generator().manual_seed(seed))
        view = Recorder(Tok(), detail=True).tree(prop, c.walk)
        assert view.drafted == len(prop.tokens) == tree.size - 1 and view.path == v.path
        assert [(n.index, n.parent, n.depth, n.rank, n.token) for n in view.nodes] == \
            [(i, int(tree.parent[i]), int(tree.depth[i]), int(tree.rank[i]), int(toks[i])) for i in range(tree.size)]
        assert view.mask == tree.mask.tolist() and view.nodes[0].conf is None and view.nodes[1].conf == 0.5
        assert [(n.index, n.trial.order, n.trial.accepted) for n in view.tried()] == \
            [(t.node, j, t.accepted) for j, t in enumerate(v.trials)]
        got = [x for n in view.tried() for x in (n.trial.p, n.trial.q, n.trial.accept_prob, n.trial.u)]
        assert got == pytest.approx([x for t in v.trials for x in (t.p_x, t.q_x, t.accept_prob, t.u)], abs=1e-5)
        assert [n.index for n in view.nodes if n.on_path] == [0] + v.path
        assert all(n.trial is None for n in view.nodes if n.index not in {t.node for t in v.trials})
        for a, b in zip(view.tried(), view.tried()[1:]):
            if not a.trial.accepted:                  # the next trial is a sibling, tested against the residual
                rejected += 1
                assert b.parent == a.parent and a.trial.residual
                assert not any(x.id == a.token for x in a.trial.residual)
                r = {x.id: x.prob for x in a.trial.residual}
                assert r.get(b.token, 0.0) == pytest.approx(b.trial.p, abs=1e-6)
    assert rejected > 10


# ---------------------------------------------------------------- the real model: tree forward, compaction, medusa

import json  # noqa: E402

from specdec_core import SamplingParams  # noqa: E402
from specdec_core.drafters import DrafterUnavailable, make  # noqa: E402
from specdec_core.drafters.medusa import MANIFEST, WEIGHTS, Heads, Medusa  # noqa: E402
from specdec_core.engine import run  # noqa: E402
from tests.reproduce import assert_reproduces  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the factorial of n.",
    "Return a JSON object with keys name, age and city for Ada Lovelace.",
    "Write a JavaScript function that reverses a string.",
    "List three prime numbers as a JSON array.",
    "Write a Python function `is_even(n)`.",
    "Convert to JSON with keys title and year: Dune, 1965.",
    "Write a SQL query that selects all users older than 30.",
    "Write a Python class `Stack` with push and pop.",
    "Give a JSON object describing a book with title, author and pages.",
    "Write a bash command that counts the lines in file.txt.",
    "Write a Go function that adds two integers.",
]


def test_tree_forward_matches_plain_forwards(bundled_fp32):
    """Every node's logits equal a plain forward over its own branch: the mask and positions are right.
    fp32, because bf16 rounding differs between forward shapes (a numeric, not an algorithmic, difference)."""
    lm = bundled_fp32
    ids = lm.encode("Write a haiku about the sea.")
    tree = compile_tree(SMALL)
    nodes = torch.tensor([int(ids[-1]), 11, 12, 13, 14, 15, 16])
    cache = lm.new_cache()
    lm.forward(ids[:-1], cache)
    logits, hidden = lm.tree_forward(cache, nodes, tree)
    assert cache.get_seq_length() == len(ids) - 1 + tree.size and hidden.shape == (tree.size, 576)
    for j in range(tree.size):
        branch = [int(ids[-1])] + [int(nodes[n]) for n in tree.path_to(j)]
        c = lm.new_cache()
        lm.forward(ids[:-1], c)
        want = lm.forward(torch.tensor(branch), c)[-1]
        assert (logits[j] - want).abs().max() < 0.02, (j, (logits[j] - want).abs().max())
        assert int(logits[j].argmax()) == int(want.argmax())
    # the mask matters: node 5, (1, 0), seen through a plain causal mask would also see nodes 1, 3 and 4
    c = lm.new_cache()
    lm.forward(ids[:-1], c)
    causal = lm.forward(nodes[:6], c)[-1]
    assert (causal - logits[5]).abs().max() > 2.0


def test_compact_keeps_the_accepted_branch(bundled_fp32):
    """After compaction the cache is the cache of the committed branch: the next forward agrees."""
    lm = bundled_fp32
    ids = lm.encode("Name a color.")
    tree = compile_tree(SMALL)
    nodes = torch.tensor([int(ids[-1]), 21, 22, 23, 24, 25, 26])
    cache = lm.new_cache()
    lm.forward(ids[:-1], cache)
    L = cache.get_seq_length()
    lm.tree_forward(cache, nodes, tree)
    lm.backend.compact(cache, L, torch.tensor([0, 2, 5]))                     # root -> (1,) -> (1, 0)
    assert cache.get_seq_length() == L + 3
    got = lm.forward(torch.tensor([7]), cache)[-1]
    c = lm.new_cache()
    want = lm.forward(torch.cat([ids, torch.tensor([22, 25, 7])]), c)[-1]
    assert (got - want).abs().max() < 0.02 and int(got.argmax()) == int(want.argmax())


def test_untrained_heads_run_and_stay_greedy_exact(bundled_fp32):
    """Zero-initialised heads (each a copy of the LM head) still decode exactly the plain greedy tokens."""
    lm = bundled_fp32
    ids = lm.encode(PROMPTS[0])
    base, _, _ = run(lm, make("none", lm), ids, max_new_tokens=24, detail=False)
    out, recs, _ = run(lm, Medusa(lm, heads=Heads(576, 4), manifest={}), ids, max_new_tokens=24)
    assert out == base
    assert any(r.tree for r in recs)


def test_medusa_errors(bundled):
    with pytest.raises(DrafterUnavailable, match="hidden size 64"):
        Medusa(bundled, heads=Heads(64, 2), manifest={})
    with pytest.raises(DrafterUnavailable, match="needs 4 heads"):
        Medusa(bundled, heads=Heads(576, 2), tree=chain_tree(4), manifest={})
    with pytest.raises(DrafterUnavailable, match="trained for 'other'"):
        Medusa(bundled, heads=Heads(576, 2), tree=chain_tree(2), manifest={"target": "other"})


def test_heads_rank_only_their_draft_vocabulary():
    """With a draft vocabulary, each head ranks only its tokens, and hands back target ids (not subset rows)."""
    from specdec_core.drafters.medusa import head_weight, ranked
    from specdec_core.drafters.vocab import DraftVocab
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(8, 20, bias=False)
    vocab = DraftVocab(torch.tensor([3, 7, 11, 19]), 20)
    heads = Heads(8, 2, vocab)
    with torch.no_grad():
        heads.w.normal_()
    h = torch.randn(5, 8)
    w = head_weight(heads, lm_head)
    assert torch.equal(w, lm_head.weight[[3, 7, 11, 19]])
    top = ranked(heads, w, h, 3)                                                     # [D, N, 3]
    assert top.shape == (2, 5, 3) and set(top.unique().tolist()) <= {3, 7, 11, 19}
    # the same order as ranking the full head's logits restricted to those ids
    full = torch.nn.functional.linear(heads(h), lm_head.weight)                     # [D, N, 20]
    masked = torch.full_like(full, float("-inf"))
    masked[..., vocab.ids] = full[..., vocab.ids]
    assert torch.equal(top, torch.topk(masked, 3, -1).indices)


def test_packed_heads_rank_as_the_module():
    """Drafting's heads, the trained module's (HeadRows, the reference) and the fast path's packed ones (one stacked
    product for all heads, the LM head packed), rank what `ranked` ranks on the training module (fp32: the same
    tokens in the same order), with the same probabilities."""
    from specdec_core.drafters.medusa import HeadRows, head_weight, ranked
    from specdec_core.fast.packed import PackedHeads
    from specdec_core.drafters.vocab import DraftVocab
    torch.manual_seed(1)
    lm_head = torch.nn.Linear(64, 300, bias=False)
    heads = Heads(64, 3, DraftVocab(torch.arange(0, 300, 3), 300))
    with torch.no_grad():
        heads.w.normal_(0, 0.2)
        heads.b.normal_()
    w = head_weight(heads, lm_head).detach()
    for h in torch.randn(6, 64):
        want = ranked(heads, w, h[None], 4)[:, 0]                                     # [3, 4]
        assert torch.equal(PackedHeads(heads, w, 3, torch.float32)(h, 4), want)
        assert torch.equal(PackedHeads(heads, w, 2, torch.float32)(h, 4), want[:2])   # the first n heads only
        ref, ref_p = HeadRows(heads, w, 3)(h, 4, probs=True)
        fast, fast_p = PackedHeads(heads, w, 3, torch.float32)(h, 4, probs=True)
        assert torch.equal(ref, want) and torch.equal(fast, want)
        assert torch.allclose(ref_p, fast_p, atol=1e-5) and bool((ref_p[:, :-1] >= ref_p[:, 1:]).all())


shipped = pytest.mark.skipif(not WEIGHTS.exists(), reason="no shipped Medusa weights")


def _check_records(lm, ids, recs):
    tokens = ids.tolist()
    for r in recs:
        if r.tree:
            cand, path = [n.token for n in r.tree.nodes], r.tree.path
            assert cand[0] == tokens[-1]                                 # the root is the pending token
            assert [cand[n] for n in path] == [c.token for c in r.committed][:len(path)]
            assert all(r.tree.nodes[b].parent == a for a, b in zip([0] + path, path))
            assert r.drafted[:r.n_accepted] == [cand[n] for n in path]
            assert [n.index for n in r.tree.nodes if n.on_path] == [0] + path
        tokens += [c.token for c in r.committed]
        if not r.done:   # the target cache invariant: everything committed except the newest token
            assert r.cache_len == len(tokens) - 1


@shipped
@pytest.mark.parametrize("n", [3, pytest.param(len(PROMPTS), marks=pytest.mark.long)])
def test_medusa_greedy_equals_plain_on_prompts(bundled_fp32, n):
    """Token-for-token equality with plain greedy decoding (fp32: see test_tree_forward_matches_plain_forwards)."""
    lm = bundled_fp32
    d = make("medusa", lm)
    steps = tokens = 0
    for text in PROMPTS[:n]:
        ids = lm.encode(text)
        base, _, _ = run(lm, make("none", lm), ids, max_new_tokens=32, detail=False)
        out, recs, m = run(lm, d, ids, max_new_tokens=32, detail=True)
        assert out == base, text
        _check_records(lm, ids, recs)
        steps, tokens = steps + m.steps, tokens + m.tokens
    assert tokens / steps > 1.2, "trained heads should get drafted tokens accepted"


@shipped
@pytest.mark.parametrize("temp", [0.7, 1.2])
def test_medusa_sampling_keeps_invariants(bundled, temp):
    lm = bundled
    ids = lm.encode(PROMPTS[1])
    out, recs, _ = run(lm, make("medusa", lm), ids, sp=SamplingParams(temperature=temp, seed=3), max_new_tokens=32)
    _check_records(lm, ids, recs)
    again, _, _ = run(lm, make("medusa", lm), ids, sp=SamplingParams(temperature=temp, seed=3), max_new_tokens=32)
    assert again == out                                                 # seeded


@shipped
def test_shipped_weights_reproduce_manifest_acceptance(bundled):
    lm = bundled
    man = json.loads(MANIFEST.read_text())
    assert WEIGHTS.stat().st_size <= 20e6 and man["kind"] == "medusa"
    import hashlib
    assert hashlib.sha256(WEIGHTS.read_bytes()).hexdigest() == man["sha256"]
    acc = man["acceptance"]
    d = make("medusa", lm)
    assert [list(p) for p in d.tree.paths] == sorted(man["tree"], key=lambda p: (len(p), p))
    rows = acc["per_prompt"][:2]
    got = [run(lm, d, lm.encode(r["prompt"]), k=acc["k"], max_new_tokens=acc["max_new_tokens"],
               detail=False)[2].mean_acceptance_length for r in rows]
    assert_reproduces(acc, rows, got, tol=0.1)


def test_medusa_prunes_its_tree_once_per_k(monkeypatch):
    from specdec_core.drafters import DraftContext
    from specdec_core.sampling import SamplingParams
    from specdec_core.tree import Tree
    from tiny import tiny_lm
    calls = []
    orig = Tree.pruned
    monkeypatch.setattr(Tree, "pruned", lambda self, d: calls.append(d) or orig(self, d))
    target = tiny_lm(0)
    m = Medusa(target, heads=Heads(32, 4), manifest={})
    m.observe(torch.zeros(32), 3)
    for _ in range(3):
        m.h_len = 3
        m.propose(DraftContext([1, 2, 3, 4], 3, 2, SamplingParams(), None))
    assert calls == [2]
