"""EAGLE (Li et al. 2024) with EAGLE-2's dynamic tree: the tree is prefix-closed, ranked by the head, within
depth k; the output is the target's (greedy token for token on the bundled model, sampled by chi-square on a
tiny one); the shipped head matches its manifest and reproduces its held-out figure."""
from __future__ import annotations

import hashlib
import math
import json
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from specdec_core import SamplingParams, engine, load
from specdec_core.drafters import DraftContext, DrafterUnavailable, make
from specdec_core.drafters.eagle import MANIFEST, WEIGHTS, Eagle, Head
from specdec_core.forward import mask_bias
from specdec_core.models import LM, attach_forward
from specdec_core.training.eagle import crops, sequences, unrolled
from tests.eagle_ref import ModuleStep
from tests.gof import ALPHA, gof
from tests.reproduce import assert_reproduces
from tests.tiny import V, exact_joint, tiny_lm


def _random_head(tgt, seed=0, scale=0.3) -> Head:
    """An untrained head, perturbed so that its ranking depends on the input: exactness must not care."""
    torch.manual_seed(seed)
    head = Head.for_target(tgt.model)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * scale)
    return head.eval()


def _ctx(tokens, k):
    return DraftContext(tokens=tokens, prompt_len=len(tokens) - 1, k=k, sp=SamplingParams(), gen=None)


def test_tree_is_prefix_closed_ranked_and_within_k(one_thread):
    tgt = tiny_lm(1, layers=1)
    d = Eagle(tgt, _random_head(tgt), manifest={}, depth=4, topk=3, nodes=10)
    prompt = [1, 2, 3, 4]
    _, h = tgt.forward(torch.tensor(prompt[:-1]), tgt.new_cache(), last_only=True, hidden=True)
    n = len(prompt) - 1
    for k in (1, 2, 3, 4, 6):
        d.begin(prompt)
        d.observe(h, n)
        prop = d.propose(_ctx(prompt, k))
        tree = prop.tree                               # compile_tree raised already if not prefix-closed
        assert 1 <= tree.max_depth <= min(k, 4) and tree.size - 1 == len(prop.tokens) <= 10
        assert all(len(p) == 1 or p[:-1] in tree.paths for p in tree.paths)
        # depth 1 holds the root step's best tokens, in rank order: the root read after the prompt's rows
        _, logits = d.rows(h, torch.tensor(prompt[1:]), torch.arange(1, n + 1),
                           mask_bias(torch.ones(n, n, dtype=torch.bool).tril()), d.rows.scratch(n), last=1)
        best = torch.topk(logits[0], 3).indices.tolist()
        first = [int(prop.tokens[i]) for i, p in enumerate(tree.paths) if len(p) == 1]
        assert first == [best[p[0]] for p in tree.paths if len(p) == 1]
    d.begin(prompt)
    d.observe(h[:-1], n - 1)                           # a stale hidden state: nothing to propose
    assert len(d.propose(_ctx(prompt, 3)).tokens) == 0


def test_features_from_mid_sequence_start_the_heads_cache_there(one_thread):
    """Handed only the newest feature (nothing before it), the head reads the root alone: no row of the cache
    stands for a position it never saw."""
    tgt = tiny_lm(1, layers=1)
    d = Eagle(tgt, _random_head(tgt, 7), manifest={}, depth=2, topk=3, nodes=6)
    prompt = [1, 2, 3, 4, 5]
    n = len(prompt) - 1
    _, h = tgt.forward(torch.tensor(prompt[:-1]), tgt.new_cache(), hidden=True)
    d.begin(prompt)
    d.observe(h[-1], n)
    prop = d.propose(_ctx(prompt, 2))
    assert d.kv.n == 1                                 # the root's row only
    _, logits = d.rows(h[-1:], torch.tensor([prompt[-1]]), n, torch.zeros(1, 1), d.rows.scratch(1))
    best = torch.topk(logits[0], 3).indices.tolist()
    assert [int(prop.tokens[i]) for i, p in enumerate(prop.tree.paths) if len(p) == 1] == \
        [best[p[0]] for p in prop.tree.paths if len(p) == 1]


def test_a_head_trained_without_the_sequence_cache_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file
    from specdec_core.drafters.eagle import load_head
    with safe_open(str(WEIGHTS), "pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k != "context"}
        save_file({k: f.get_tensor(k) for k in f.keys()}, str(tmp_path / "eagle.safetensors"), metadata=meta)
    lm = tiny_lm(1, layers=1)
    with pytest.raises(DrafterUnavailable, match="trained without the sequence cache"):
        load_head(lm.model, tmp_path / "eagle.safetensors")


def test_packed_head_computes_the_module(one_thread):
    """The packed inference head is the trained module's network: the sequence's rows (causal, in one call, the
    last one the root), then three tree rows that see all of them and different branches among themselves, then
    the tree rows dropped and a second tree: fp32 features and logits agree with Head.forward to ~1e-5."""
    tgt = tiny_lm(1, layers=1)
    d = Eagle(tgt, _random_head(tgt, 4), manifest={}, depth=3, topk=3, nodes=8, int8=False)   # its products exact
    assert d.rows.dtype == torch.float32 and d.rows.qkv.w.shape[0] == d.head.q.out_features + 2 * d.head.k.out_features
    ref = ModuleStep(d)
    torch.manual_seed(0)
    f0, f1, f2 = torch.randn(4, 32), torch.randn(3, 32), torch.randn(2, 32)
    causal = mask_bias(torch.ones(4, 4, dtype=torch.bool).tril())
    branch = mask_bias(torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool))
    with torch.inference_mode():
        outs = []
        for step in (d.rows, ref):
            kv = step.scratch(2)                       # grows as rows come
            a = step(f0, torch.tensor([5, 1, 7, 2]), torch.arange(1, 5), causal, kv, last=1)
            b = step(f1, torch.tensor([1, 2, 3]), 5, branch, kv)
            kv.n = 4                                   # the tree's rows dropped, the sequence's kept
            c = step(f2, torch.tensor([4, 6]), 5, torch.zeros(2, 2), kv)
            outs.append((a, b, c))
    assert outs[0][0][0].shape[0] == outs[0][0][1].shape[0] == 1   # last=1: the root's features and logits only
    for (fa, la), (fb, lb) in zip(*outs):
        torch.testing.assert_close(fa, fb, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(la.float(), lb, atol=1e-5, rtol=1e-5)


def test_packed_drafting_proposes_the_module_trees(one_thread):
    """Same dynamic trees, same tokens, fp32: drafting through the packed head or through Head.forward, as the
    sequence grows step by step (the head's own cache carried from step to step)."""
    tgt = tiny_lm(2, layers=1)
    head = _random_head(tgt, 5)
    fast = Eagle(tgt, head, manifest={}, depth=4, topk=3, nodes=10, int8=False)
    slow = Eagle(tgt, head, manifest={}, depth=4, topk=3, nodes=10)
    slow.rows = ModuleStep(slow)
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0]
    _, hs = tgt.forward(torch.tensor(seq), tgt.new_cache(), hidden=True)
    shapes = set()
    for d in (fast, slow):
        d.begin(seq[:3])
        d.observe(hs[:2], 2)
    for t in range(2, len(seq)):                       # context seq[:t + 1], its pending token seq[t]
        props = []
        for d in (fast, slow):
            if t > 2:
                d.observe(hs[t - 1:t], t)              # one more position committed
            props.append(d.propose(_ctx(seq[:t + 1], 4)))
        a, b = props
        assert a.tree.paths == b.tree.paths and a.tokens.tolist() == b.tokens.tolist(), t
        shapes.add(a.tree.paths)
    assert fast.kv.n == slow.kv.n == len(seq) - 1      # every row of the sequence, no tree row
    assert len(shapes) > 1                             # the trees are data-dependent, not one fixed shape


def test_the_heads_cache_follows_the_committed_sequence(one_thread):
    """Decoding carries the head's cache from step to step (the rows of the accepted drafts run at the next
    step, from the features the target computed for them): every proposal is the one a fresh head proposes after
    reading the whole committed sequence's true features at once."""
    tgt = tiny_lm(3, layers=1)
    head = _random_head(tgt, 6)
    d = Eagle(tgt, head, manifest={}, depth=3, topk=2, nodes=6)
    seen = []
    propose = d.propose
    d.propose = lambda ctx: seen.append((list(ctx.tokens), ctx.k, propose(ctx))) or seen[-1][2]
    ids, recs, _ = engine.run(tgt, d, [1, 2, 3, 4], k=3, max_new_tokens=24, detail=False, stop_at_eos=False)
    assert max(r.n_accepted for r in recs) >= 1       # some steps accepted drafts: their rows came from the target
    fresh = Eagle(tgt, head, manifest={}, depth=3, topk=2, nodes=6)
    for tokens, k, prop in seen:
        _, hs = tgt.forward(torch.tensor(tokens[:-1]), tgt.new_cache(), hidden=True)
        fresh.begin(tokens)
        fresh.observe(hs, len(tokens) - 1)
        again = fresh.propose(_ctx(tokens, k))
        assert again.tree.paths == prop.tree.paths and torch.equal(again.tokens, prop.tokens), tokens


RUNS = 2500


def _first_two(tgt, d, prompt, k, first_step) -> tuple[np.ndarray, int]:
    """RUNS sampled runs of 3 tokens at T = 1 (the first step's tree decides the first two) -> counts [V, V] of the
    first two tokens, and how many first steps' records satisfy `first_step`."""
    counts, hits = np.zeros((V, V), dtype=np.int64), 0
    for seed in range(RUNS):
        ids, recs, _ = engine.run(tgt, d, prompt, sp=SamplingParams(seed=seed, temperature=1.0), k=k,
                                  max_new_tokens=3, detail=False, stop_at_eos=False)
        counts[ids[0], ids[1]] += 1
        hits += bool(first_step(recs[0]))
    return counts, hits


def test_sampled_eagle_trees_have_the_target_law(one_thread):
    """Dynamic trees from a random head, verified with the multi-candidate rule: the first two tokens follow the
    target's exact joint law (chi-square at 2,500 runs)."""
    tgt = tiny_lm(1, layers=1)
    d = Eagle(tgt, _random_head(tgt, 1), manifest={}, depth=3, topk=3, nodes=8)
    prompt = [1, 2, 3]
    counts, full = _first_two(tgt, d, prompt, 3, lambda r: r.tree.depth == 2 and r.tree.drafted == 8)
    assert full == RUNS                                 # every first step verified a full, two-level tree
    assert gof(counts, exact_joint(tgt, prompt, 2, temperature=1.0).numpy()) > ALPHA


@pytest.mark.long
def test_sampled_trees_with_copied_nodes_have_the_target_law(one_thread):
    """A copied continuation grafted onto the tree (deterministic candidates beside the head's) leaves the law
    alone: after a prompt that repeats a 2-gram, every first step holds copied nodes, and the first two tokens
    follow the target's exact joint law (chi-square at 2,500 runs)."""
    tgt = tiny_lm(1, layers=1)
    d = Eagle(tgt, _random_head(tgt, 1), manifest={}, depth=3, topk=2, nodes=4)
    prompt = [1, 2, 3, 1, 2]                            # lookup continues [1, 2] with what followed it: 3, 1
    counts, copied = _first_two(tgt, d, prompt, 2, lambda r: r.info.get("copied", 0) > 0)
    assert copied == RUNS
    assert gof(counts, exact_joint(tgt, prompt, 2, temperature=1.0).numpy()) > ALPHA


def test_greedy_equals_plain_decoding(bundled, one_thread):
    """Bit for bit on the bundled model, default dtype, our forward."""
    d = make("eagle", bundled)
    assert d.reads_hidden and bundled.forward_name == "ours"
    total = 0
    for p in ("Write a Python function that reverses a linked list.",
              "Return a JSON object with keys name, age and city for a made-up person.",
              "Explain in two sentences why the sky is blue."):
        ids = bundled.encode(p)
        base, _, _ = engine.run(bundled, make("none", bundled), ids, max_new_tokens=28, detail=False)
        got, recs, m = engine.run(bundled, d, ids, max_new_tokens=28, detail=True)
        assert got == base, p
        for r in recs:
            assert [c.token for c in r.committed][:r.n_accepted] == r.drafted[:r.n_accepted]
        total += m.mean_acceptance_length
    assert total / 3 > 1.5                             # trained: well above one token per target forward


def _scene(lm, ids, **kw):
    """One Step by step scene (EAGLE, T = 0): the committed tokens and every step's tree as (parent, token) pairs."""
    out, recs, _ = engine.run(lm, make("eagle", lm, **kw), ids, max_new_tokens=40, detail=True)
    return out, [tuple((n.parent, n.token) for n in r.tree.nodes) if r.tree else tuple(r.drafted) for r in recs]


@contextmanager
def _busy(n: int):
    """n processes spinning on the CPU, as other students' sessions (or a browser) would."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_a_scene_draws_the_same_trees_quiet_and_beside_a_busy_cpu(bundled):
    """A scene (settings + seed) reproduces whatever the load: a sized tree weighs the draft's cost measured once
    when the drafter is made (Eagle.fixed_draft_ms) and the score passes' measured once per forward, never the
    clock of the step being drawn, so a busy machine draws the tree a quiet one did."""
    ids = bundled.encode("Write a Python function that returns the n-th Fibonacci number, with a docstring.")
    d = make("eagle", bundled)
    assert d.sized and d.draft_ms is not None and d.draft_ms > 0
    assert make("eagle", bundled, clock=True).draft_ms is None      # the CLI's option: each step's own clock
    quiet = _scene(bundled, ids)
    with _busy(2):
        busy = _scene(bundled, ids)
    assert busy[0] == quiet[0] and busy[1] == quiet[1]


def test_a_copied_continuation_is_grafted_onto_the_tree_and_stays_exact(one_thread):
    """Prompt lookup's continuation (a repeated 2-gram's earlier follow-up) hangs on the head's tree where its
    guesses leave it: the chain's tokens are a branch from the root, the copied nodes carry no draft probability;
    copy=False leaves the head's tree alone; decoding stays plain decoding's and the copies' rate is counted."""
    tgt = tiny_lm(1, layers=1)
    prompt = [5, 6, 7, 8, 9, 5, 6]
    _, h = tgt.forward(torch.tensor(prompt[:-1]), tgt.new_cache(), last_only=True, hidden=True)
    props = {}
    for copy in (True, False):
        d = Eagle(tgt, _random_head(tgt), manifest={}, depth=2, topk=2, nodes=4, copy=copy)
        d.begin(prompt)
        d.observe(h, len(prompt) - 1)
        props[copy] = d.propose(_ctx(prompt, 4))
    on, off = props[True], props[False]
    tok = dict(zip(on.tree.paths, on.tokens.tolist()))
    at = ()
    for t in (7, 8, 9, 5):                                  # the copy, k = 4 tokens, is a branch from the root
        at = next(p for p in on.tree.paths if p[:-1] == at and tok[p] == t)
    assert on.info["copied"] >= 2 and sum(c is None for c in on.conf) == on.info["copied"]
    assert off.info["copied"] == 0 and None not in off.conf and off.tree.size <= 5
    d = Eagle(tgt, _random_head(tgt), manifest={}, depth=3, topk=2, nodes=6)
    for ids in ([5, 6, 7, 8, 9, 5, 6], [3, 4, 3, 4, 3]):
        base, _, _ = engine.run(tgt, make("none", tgt), ids, max_new_tokens=24, detail=False)
        got, recs, _ = engine.run(tgt, d, ids, k=4, max_new_tokens=24, detail=True, stop_at_eos=False)
        assert got[:len(base)] == base
    assert d.tries > 2                                      # feedback counted the copies the target checked


def test_unavailable_for_other_targets():
    tgt = tiny_lm(1, layers=1, name="tiny")
    with pytest.raises(DrafterUnavailable, match="drafter 'eagle' has no trained weights for 'tiny'"):
        make("eagle", tgt)


def test_training_crops_and_unrolling_match_drafting(one_thread):
    """Row t of a crop reads (f_{t-1}, x_t) at position t and targets f_t; unrolled pass p computes, at row t, what
    drafting computes at depth p below the root x_{t-p}, which saw the true rows before it."""
    tgt = tiny_lm(2, layers=1)
    head = _random_head(tgt, 2)
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    _, hs = tgt.forward(torch.tensor(seq), tgt.new_cache(), hidden=True)            # [n, H]
    row = (seq, 4, torch.zeros(len(seq) - 1, 1, dtype=torch.int32), torch.zeros(len(seq) - 1, 1))
    (s,) = sequences([row], [hs])
    f0, target, tok, pos, drow = crops([s], torch.tensor([0]), 16, torch.Generator())
    assert pos[0, :9].tolist() == list(range(1, 10)) and tok[0, :9].tolist() == seq[1:]
    assert torch.equal(f0[0, :9], hs[:9]) and torch.equal(target[0, :9], hs[1:])
    assert drow[0].tolist() == [-1, -1] + list(range(3, 9)) + [-1] * 8    # the answer's rows (t >= 3) but the last
    P = 3
    with torch.no_grad():
        outs = unrolled(head, f0.float(), tgt.model.get_input_embeddings().weight[tok].float(), pos, P)
    d = Eagle(tgt, head, manifest={}, depth=P, topk=1, nodes=P, int8=False)
    for p in range(P):
        for t in range(p, 9):                           # crop row t = position t + 1; its root at row t - p
            r = t - p
            kv = d.rows.scratch(4)
            with torch.inference_mode():
                f, _ = d.rows(hs[:r + 1], torch.tensor(seq[1:r + 2]), torch.arange(1, r + 2),
                              mask_bias(torch.ones(r + 1, r + 1, dtype=torch.bool).tril()), kv)
                f = f[-1:]
                for j in range(1, p + 1):               # down the chain of the true tokens
                    f, _ = d.rows(f, torch.tensor([seq[r + 1 + j]]), r + 1 + j, torch.zeros(1, j), kv)
            torch.testing.assert_close(outs[p][0, t], f[0], atol=1e-5, rtol=1e-5)


def test_shipped_weights_match_manifest():
    man = json.loads(MANIFEST.read_text())
    blob = WEIGHTS.read_bytes()
    assert len(blob) <= 12_000_000 and hashlib.sha256(blob).hexdigest() == man["sha256"]
    for key in ("command", "seed", "data", "steps", "final_loss", "acceptance", "tree", "draft_cost", "versions"):
        assert key in man, key
    assert man["command"].startswith("python -m specdec_core train eagle")
    data_s = sum(p["generate_seconds"] for p in man["data"]["passes"]) + man["data"]["load_seconds"]
    # from scratch (the target's answers generated once, not read from the cache, then every run that made the
    # head: a run that went on from another records it in continued_from) within 160 minutes on 2 cores (four runs
    # and three prompt groups' answers, some of them generated beside other work)
    runs = [man] + man.get("continued_from", [])
    assert all(r["command"].startswith("python -m specdec_core train eagle") for r in runs)
    assert sum(r["total_seconds"] for r in runs) + data_s < 160 * 60


@pytest.mark.long
def test_manifest_acceptance_reproduces(one_thread):
    """Two of the held-out prompts the manifest measured, greedy, same k, in the dtype and forward it names
    (prompt by prompt on the CPU kernels it names: reproduce.py)."""
    man = json.loads(MANIFEST.read_text())
    acc = man["acceptance"]
    lm = load("bundled", dtype="bf16", device="cpu")
    if acc["forward"] != lm.forward_name:
        lm = attach_forward(LM(lm.model, lm.tokenizer, lm.name, lm.dtype, lm.device), acc["forward"])
    d = make("eagle", lm)
    if d.sized:   # sized trees weigh measured costs: pin the manifest's, so the trees do not depend on this machine
        d.costs, d.draft_ms = acc["block_ms"], man["draft_cost"]["propose_ms"]
        d.block = acc.get("row_block", 4)   # the rows a cost's block held there (4 before manifests said)
    rows = acc["per_prompt"][:2]
    got = [engine.run(lm, d, lm.encode(r["prompt"]), k=acc["k"], max_new_tokens=acc["max_new_tokens"],
                      detail=False)[2].mean_acceptance_length for r in rows]
    assert_reproduces(acc, rows, got)


@pytest.mark.parametrize("k", [2, 5])
def test_batched_greedy_equals_alone_tiny(k, one_thread):
    """Rows with different data-dependent trees in one batch: each row's output is its output alone."""
    from specdec_core.batch import run_batch
    tgt = tiny_lm(0)
    head = _random_head(tgt, 3)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 1]]
    mk = lambda: Eagle(tgt, head, manifest={}, depth=5, topk=3, nodes=8)   # noqa: E731
    res = run_batch(tgt, mk, prompts, k=k, max_new_tokens=16)
    assert res.tokens == [engine.run(tgt, mk(), p, k=k, max_new_tokens=16, detail=False)[0] for p in prompts]


def test_sized_budget_weighs_expected_tokens_against_measured_block_costs(one_thread):
    """The sized tree verifies the node count with the most expected tokens (1 + the kept nodes' cumulative
    draft probabilities) per ms of draft + score pass, counts that fill a block of rows."""
    tgt = tiny_lm(1, layers=1)
    d = Eagle(tgt, _random_head(tgt), manifest={}, depth=4, topk=3, nodes=15, sized=False)
    d.block, d.sized = 4, True      # made unsized (no costs measured), then weighing the costs set below
    score = [math.log(p) for p in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.04, 0.03)]
    order = list(range(len(score)))
    assert d._budget(score, order, 2.0) == 12        # no cost table: the most allowed (all 12 drafted)
    d.costs = [10.0, 10.5, 30.0, 40.0]                 # a second block almost free, a third dear
    assert d._budget(score, order, 2.0) == 7
    d.costs = [10.0, 20.0, 30.0, 40.0]                 # every block as dear as a step: 3 nodes pay best
    assert d._budget(score, order, 2.0) == 3
    d.costs = [10.0, 10.0, 10.0, 10.0]                 # blocks free: everything drafted
    assert d._budget(score, order, 2.0) == 12
    d.nodes = 5
    assert d._budget(score, order, 2.0) == 5         # never past `nodes`
    d.block, d.nodes = 1, 12                         # rows that cost one by one (a forward that pads none)
    d.costs = [10.0, 10.0, 30.0]                     # the root alone, + 1 node free, + 2 dear: never an empty tree
    assert d._budget(score, order, 2.0) == 1
    d.costs = [10.0 + j for j in range(13)]          # 1 ms a row: a node pays while its p beats tokens per ms
    assert d._budget(score, order, 2.0) == 7         # (5.2 tokens in 19 ms; the 0.2 node would make 5.4 in 20)


def test_sized_trees_stay_exact(one_thread):
    """Sizing trees by measured cost changes which nodes are verified, never the output: greedy equals plain
    decoding, and the tree sizes vary with the head's confidence. transformers' forward has no blocks or cost
    table: its trees keep the fixed size."""
    fixed = Eagle(tiny_lm(1, layers=1), _random_head(tiny_lm(1, layers=1), 2), manifest={}, nodes=15, sized=True)
    assert fixed.costs == [] and fixed.block == 1
    tgt = tiny_lm(1, layers=1, forward="ours")
    d = Eagle(tgt, _random_head(tgt, 2), manifest={}, depth=4, topk=3, nodes=15, sized=True,
              copy=False)                                   # the sizing alone (copies: the test above)
    assert len(d.costs) == 4 and all(ms > 0 for ms in d.costs) and d.block == tgt.backend.row_block == 4
    d.costs, d.draft_ms = [10.0, 11.0, 30.0, 40.0], 1.0     # pinned: the sizes must not depend on this machine
    sizes = set()
    for prompt in ([1, 2, 3], [4, 5, 6, 7], [9, 1]):
        base, _, _ = engine.run(tgt, make("none", tgt), prompt, max_new_tokens=20, detail=False)
        got, recs, _ = engine.run(tgt, d, prompt, k=4, max_new_tokens=20, detail=True, stop_at_eos=False)
        assert got[:len(base)] == base
        sizes |= {r.tree.drafted for r in recs if r.tree is not None}
    assert sizes == {3, 7}


def test_a_sized_tree_stops_drafting_when_no_deeper_level_can_pay(one_thread):
    """deeper_pays weighs a level's ms at the steps' rate against the expected tokens its nodes could add; once
    the rate says a level buys more than the frontier's nodes can carry, the head runs fewer levels (counted on
    its calls), drafts no node past the stop, and the output stays plain decoding's."""
    from specdec_core.policy import deeper_pays
    assert deeper_pays(0.5, 1.0, None)                            # no rate measured yet: draft on
    assert deeper_pays(0.1, 0.5, 0.2) and not deeper_pays(0.09, 0.5, 0.2)   # the frontier's mass 0.1 >= 0.1 > 0.09
    tgt = tiny_lm(1, layers=1, forward="ours")
    base, _, _ = engine.run(tgt, make("none", tgt), [1, 2, 3], max_new_tokens=16, detail=False)
    calls = {}
    for rate in (None, 1e6):                                      # never stop / every level too dear
        d = Eagle(tgt, _random_head(tgt, 2), manifest={}, depth=4, topk=3, nodes=15, sized=True)
        d.costs, d.draft_ms = [10.0, 11.0, 30.0, 40.0], 1.0
        d._measure = lambda n, d=d, rate=rate: setattr(d, "rate", rate)   # pin the rate the steps measure
        n = [0]

        class Counted:                                            # the packed head, its calls counted
            levels = None                                         # (each level through Python's loop, counted)

            def __getattr__(self, a, _f=d.rows):
                return getattr(_f, a)

            def __call__(self, *a, _f=d.rows, **k):
                n[0] += 1
                return _f(*a, **k)
        d.rows, per = Counted(), []
        d.propose = lambda ctx, _p=d.propose: (n.__setitem__(0, 0), _p(ctx), per.append(n[0]))[1]
        got, recs, _ = engine.run(tgt, d, [1, 2, 3], k=4, max_new_tokens=16, detail=True, stop_at_eos=False)
        assert got[:len(base)] == base
        calls[rate] = (max(per), max(r.tree.depth for r in recs if r.tree is not None))
    # the head's calls per proposal: the root's, then one per level but the last (4 deep: 3); stopped: level 1's
    assert calls[None][0] == 4 and calls[1e6] == (2, 2)
    for rate in (None, 1e6):                                      # the C++ levels, where built: the same rule
        d = Eagle(tgt, _random_head(tgt, 2), manifest={}, depth=4, topk=3, nodes=15, sized=True)
        d.costs, d.draft_ms = [10.0, 11.0, 30.0, 40.0], 1.0
        d._measure = lambda n, d=d, rate=rate: setattr(d, "rate", rate)
        got, recs, _ = engine.run(tgt, d, [1, 2, 3], k=4, max_new_tokens=16, detail=True, stop_at_eos=False)
        assert got[:len(base)] == base
        assert max(r.tree.depth for r in recs if r.tree is not None) == calls[rate][1]


def test_int8_head_products_round_within_half_a_step_per_weight():
    """Dense's int8 (bf16 activations): each weight rounds to the nearest of 255 steps of its row's scale, so a
    product is off by at most sum_k |x_k| * scale / 2 (plus bf16's rounding of the output); the EAGLE head drafts
    with it on the CPU, and never with fp32 activations (a many times slower product there)."""
    from specdec_core.fast.packed import int8_ok, mm, product
    if not int8_ok(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this build of torch has no CPU int8 weight product")
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 64, generator=g).bfloat16(), torch.randn(5, 64, generator=g).bfloat16()
    q = product(w, int8=True)
    assert q.packed.dtype == torch.int8 and q.packed.abs().max() == 127
    ref = x.float() @ w.float().T                                             # [5, 96]
    bound = x.float().abs().sum(-1, keepdim=True) * q.s.float()[None] / 2 + ref.abs() * 2 ** -8
    err = (mm(q, x).float() - ref).abs()
    assert (err <= bound + 1e-3).all() and err.max() > 0
    tgt = tiny_lm(0)                                                          # fp32: oneDNN-packed, not int8
    assert tgt.dtype == torch.float32 and not Eagle(tgt, _random_head(tgt), manifest={}).rows.int8
    assert not Eagle(tgt, _random_head(tgt), manifest={}, int8=False).rows.int8


def test_narrowing_the_vocabulary_refuses_a_size_it_cannot_narrow_to(tmp_path, capsys):
    """`train eagle --narrow N` keeps fewer tokens than the head has, and says so before touching the weights."""
    import shutil
    from specdec_core.training import eagle as train
    for p in (WEIGHTS, MANIFEST):
        shutil.copy(p, tmp_path / p.name)
    before = (tmp_path / WEIGHTS.name).read_bytes()
    n = json.loads(MANIFEST.read_text())["vocab"]["size"]
    with pytest.raises(SystemExit, match=f"--narrow {n}: want fewer tokens than the head's draft vocabulary \\({n}\\)"):
        train.main(["--narrow", str(n), "--out", str(tmp_path), "--threads", "1"])
    assert (tmp_path / WEIGHTS.name).read_bytes() == before


def test_a_tree_levels_rows_see_their_ancestors_and_themselves_only(one_thread):
    """Eagle._level (cached per tree shape) against the mask written out from parent pointers: for random trees
    of up to five levels, each level's parent rows and its attention bias over the tree rows drafted so far are
    0 exactly at a row's ancestors (in earlier levels) and itself, -inf elsewhere."""
    import random
    d = Eagle.__new__(Eagle)
    d._levels, d.rows = {}, type("F", (), {"device": torch.device("cpu")})()
    rng = random.Random(0)
    for _ in range(300):
        shape, parent, width = (), [], 1                 # parent[t]: tree row t's parent row (-1: the root)
        for _ in range(rng.randint(1, 5)):
            rows = tuple(rng.randrange(width) for _ in range(rng.randint(1, 4)))
            start = len(parent) - width                  # the last level's first tree row (-1 for the root)
            level0 = len(parent)
            parent += [start + r if start >= 0 else -1 for r in rows]
            shape += (rows,)
            got_rows, bias = d._level(shape)
            want = torch.full((len(rows), len(parent)), float("-inf"))
            for j in range(len(rows)):
                t = level0 + j
                while t >= 0:
                    want[j, t] = 0.0
                    t = parent[t]
            assert got_rows.tolist() == list(rows) and torch.equal(bias, want), shape
            width = len(rows)
