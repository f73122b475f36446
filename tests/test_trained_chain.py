"""Trained chain drafters (distilled draft model, early exit): exactness, shipped weights, manifests, data."""
import gc
import hashlib
import json
import math
import weakref

import pytest
import torch

from specdec_core import SamplingParams, load, run
from specdec_core.training import distill
from specdec_core.drafters import DrafterUnavailable, distilled, early_exit as ee, make
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.models import LM, attach_forward
from specdec_core.bench.workloads import WORKLOADS
from tests.reproduce import assert_reproduces

WEIGHTS = ee.WEIGHTS
KINDS = ["draft", "early-exit"]


def _prompts(n):
    """n prompts, one workload after another (code, JSON, extraction, chat, creative, then their seconds)."""
    ws = ("code", "json", "extraction", "chat", "creative")
    return [WORKLOADS[w].prompts[i] for i in range(2) for w in ws][:n]


@pytest.fixture(scope="module")
def bf16():
    """The dtype the manifests were measured in."""
    return load("bundled", dtype="bf16", device="cpu")


@pytest.mark.parametrize("n", [3, pytest.param(10, marks=pytest.mark.long)])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_plain_decoding(bundled_fp32, kind, n, one_thread):
    lm = bundled_fp32
    drafter = make(kind, lm)
    prompts = _prompts(n)
    assert len(prompts) == n
    for p in prompts:
        ids = lm.encode(p)
        base, _, _ = run(lm, make("none", lm), ids, max_new_tokens=24, detail=False)
        got, recs, m = run(lm, drafter, ids, max_new_tokens=24, detail=True)
        assert got == base, p
        assert m.drafted > 0
        for r in recs:  # the same per-step records as any drafter
            assert r.drafter == kind and len(r.positions) == len(r.drafted)
            assert [c.token for c in r.committed][:r.n_accepted] == r.drafted[:r.n_accepted]


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_runs_are_seeded_and_valid(bundled, kind, one_thread):
    d = make(kind, bundled)
    ids = bundled.encode("Give a JSON object with keys a and b.")
    sp = SamplingParams(temperature=0.7, seed=3)
    a, recs, _ = run(bundled, d, ids, sp=sp, max_new_tokens=16, detail=False)
    b, _, _ = run(bundled, d, ids, sp=sp, max_new_tokens=16, detail=False)
    assert a == b and len(a) == 16
    assert all(0 <= t < bundled.vocab_size for t in a)


@pytest.mark.parametrize("kind", KINDS)
def test_shipped_weights_match_manifest(kind):
    man = json.loads((WEIGHTS / f"{kind}.manifest.json").read_text())
    path = WEIGHTS / man["weights"]
    blob = path.read_bytes()
    assert len(blob) <= 20_000_000
    assert hashlib.sha256(blob).hexdigest() == man["sha256"]
    for key in ("command", "seed", "data", "steps", "final_loss", "acceptance", "versions", "train_seconds"):
        assert key in man, key
    assert man["command"].startswith(f"python -m specdec_core train {kind}")
    data_s = sum(p["generate_seconds"] for p in man["data"]["passes"]) + man["data"]["load_seconds"]
    assert man["total_seconds"] < 30 * 60 and man["train_seconds"] + data_s < 30 * 60


@pytest.mark.long
@pytest.mark.parametrize("kind", KINDS)
def test_manifest_acceptance_reproduces(bf16, kind, one_thread):
    """A short check: re-run three of the held-out prompts the manifest measured, greedy, same k, on the
    forward the manifest names (its texts, and so its acceptance, are that forward's: bf16 rounds differently)."""
    man = json.loads((WEIGHTS / f"{kind}.manifest.json").read_text())
    acc = man["acceptance"]
    lm = bf16 if acc.get("forward", "hf") == bf16.forward_name else attach_forward(
        LM(bf16.model, bf16.tokenizer, bf16.name, bf16.dtype, bf16.device), acc.get("forward", "hf"))
    d = make(kind, lm)
    rows = acc["per_prompt"][:3]
    got = [run(lm, d, lm.encode(r["prompt"]), k=acc["k"], max_new_tokens=acc["max_new_tokens"],
               detail=False)[2].mean_acceptance_length for r in rows]
    assert_reproduces(acc, rows, got)


def test_draft_is_an_ordinary_small_llama(bundled):
    from transformers import LlamaForCausalLM
    d = distilled.load_draft(bundled)
    assert isinstance(d.model, LlamaForCausalLM)
    cfg = json.loads((WEIGHTS / "draft.config.json").read_text())
    assert d.model.config.num_hidden_layers == cfg["num_hidden_layers"] <= 4
    assert d.model.config.vocab_size == bundled.vocab_size
    # the embedding is the target's (not shipped); the head is its rows for the draft vocabulary
    emb = bundled.model.model.embed_tokens.weight
    assert torch.equal(d.model.model.embed_tokens.weight, emb)
    ids = d.model.lm_head.vocab.ids
    assert torch.equal(d.model.lm_head.weight, emb[ids])
    assert isinstance(make("draft", bundled), DraftModel)
    # q is zero outside the draft vocabulary, and a proper distribution inside it
    cache = d.new_cache()
    logits = d.forward(bundled.encode("Write a Python function that adds two numbers."), cache, last_only=True)[-1]
    outside = torch.ones(bundled.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(logits[outside]).all() and torch.isfinite(logits[ids]).all()
    man = json.loads((WEIGHTS / "draft.manifest.json").read_text())
    assert man["vocab"]["size"] == len(ids) and man["vocab"]["heldout_coverage"] > 0.95


def test_draft_vocab_maps_and_buckets():
    from specdec_core.drafters.vocab import DraftVocab
    v = DraftVocab.from_counts([[9, 9, 1, 2, 2, 2, 3]], [2], 2, 10, always=[0])   # answer 1 2 2 2 3: top is 2
    assert v.ids.tolist() == [0, 2] and v.t2d[2] == 1 and v.t2d[1] == -1
    # probability mass the target put on a token counts too: 5 gets 4 x 0.9 > 1's single use
    soft = [(torch.tensor([[5], [5], [5], [5]]), torch.log(torch.full((4, 1), 0.9)))]
    assert DraftVocab.from_counts([[9, 9, 1, 2, 2, 2, 3]], [2], 3, 10, always=[0], soft=soft).ids.tolist() == [0, 2, 5]
    assert v.coverage([[9, 1, 2, 3, 4]], [1]) == pytest.approx(0.25)
    # narrowed within a vocabulary (a trained head's): its most-said tokens only, never one outside it
    wide = DraftVocab(torch.tensor([0, 1, 3, 9]), 10)
    narrow = DraftVocab.from_counts([[9, 9, 1, 2, 2, 2, 3, 3]], [2], 2, 10, always=[0], within=wide)
    assert narrow.ids.tolist() == [0, 3]           # 2 is said most but outside; 3 (twice) beats 1 (once)
    full = v.scatter(torch.tensor([[1.0, 2.0]]))
    assert full[0, 0] == 1.0 and full[0, 2] == 2.0 and torch.isneginf(full[0, [1, 3, 4, 5, 6, 7, 8, 9]]).all()
    # soft targets outside the vocabulary join the rest bucket: p = 0 for them and they own no q
    d, lp = v.targets(torch.tensor([[2, 7]]), torch.log(torch.tensor([[0.6, 0.3]])))
    assert d.tolist() == [[1, 0]] and torch.isneginf(lp[0, 1])
    q = torch.log(torch.tensor([[0.25, 0.75]]))          # q(0) = 0.25, q(2) = 0.75
    # -(0.6 log q(2) + 0.4 log q_rest) with q_rest = 1 - q(2)
    want = -(0.6 * math.log(0.75) + 0.4 * math.log(0.25))
    assert float(distill.soft_ce(q, d, lp)) == pytest.approx(want, rel=1e-5)


def test_draft_needs_a_model_for_other_targets(bundled):
    other = LM(bundled.model, bundled.tokenizer, "some other target", bundled.dtype, bundled.device)
    with pytest.raises(DrafterUnavailable, match="needs a draft model"):
        make("draft", other)
    with pytest.raises(DrafterUnavailable, match="drafter 'early-exit' has no trained weights for 'some other target'"):
        make("early-exit", other)


def test_early_exit_shares_the_targets_weights(bundled):
    n = len(bundled.model.model.layers)
    norm = bundled.model.model.norm
    d = make("early-exit", bundled)
    assert 1 <= d.ex.layers < n
    assert len(d.trunk.layers) == d.ex.layers
    assert d.trunk.layers[0].self_attn.q_proj.weight.data_ptr() == \
        bundled.model.model.layers[0].self_attn.q_proj.weight.data_ptr()
    # the drafting stack is the shared trunk plus the exit's one layer, which has its own cache slot
    assert list(d.net.layers)[:-1] == list(d.trunk.layers) and d.net.layers[-1] is d.ex.layer
    assert d.ex.layer.self_attn.layer_idx == d.ex.layers
    # its head rows are the target's
    head = bundled.model.get_output_embeddings().weight
    assert torch.equal(d.head_w, head[d.vocab.ids])
    # building the trunk must leave the target whole
    assert len(bundled.model.model.layers) == n and bundled.model.model.norm is norm
    assert bundled.model.config.num_hidden_layers == n
    with pytest.raises(Exception, match="1 <= L <"):
        ee.trunk(bundled.model, n)


def test_early_exit_cache_follows_committed_text(bundled, one_thread):
    d = make("early-exit", bundled)
    ids = bundled.encode("Write a Python function that adds two numbers.").tolist()
    d.begin(ids)
    from specdec_core.drafters import DraftContext
    ctx = DraftContext(list(ids), len(ids), 3, SamplingParams(), None)
    prop = d.propose(ctx)
    assert d.cache_len() == len(ids) + 2  # the last drafted token was sampled, never run
    # the target rejects the second draft: the cache is rolled back to the committed prefix on the next call
    committed = ids + [int(prop.tokens[0]), (int(prop.tokens[1]) + 1) % bundled.vocab_size]
    d.propose(DraftContext(committed, len(ids), 2, SamplingParams(), None))
    assert d.cache_len() == len(committed) + 1
    assert d.seen[:len(committed)] == committed


def test_soft_targets_loss():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    logp_full = torch.log_softmax(logits, -1)
    v, i = torch.topk(logp_full, 8, -1)
    # KL is zero when q = p, positive otherwise, and soft_ce - kl is p's (bucketed) entropy
    assert distill.kl_top(logp_full, i, v).abs() < 1e-5
    q = torch.log_softmax(torch.randn(5, 50), -1)
    assert distill.kl_top(q, i, v) > 0.1
    # with the whole vocabulary kept, kl_top is the exact KL
    va, ia = torch.topk(logp_full, 50, -1)
    exact = (logp_full.exp() * (logp_full - q)).sum(-1).mean()
    assert distill.kl_top(q, ia, va) == pytest.approx(float(exact), abs=1e-4)


def test_prompt_set_is_varied_and_disjoint_from_benchmarks():
    assert len(distill.PROMPTS) >= 150 and len(set(distill.PROMPTS)) == len(distill.PROMPTS)
    bench = {p for w in WORKLOADS.values() for p in w.prompts}
    assert not bench & set(distill.PROMPTS) and not bench & set(distill.HELDOUT)
    assert not set(distill.HELDOUT) & set(distill.PROMPTS)
    train = distill.training_prompts()
    assert len(train) >= 600 and len(set(train)) == len(train)
    assert not bench & set(train) and not set(distill.HELDOUT) & set(train)
    assert bench <= distill.bench_prompts()
    # the fresh evaluation prompts (docs/fresh-prompts.jsonl) are never trained on either
    fresh = {json.loads(line)["prompt"] for line in distill.FRESH.read_text().splitlines() if line.strip()}
    assert fresh and fresh <= distill.bench_prompts() and not fresh & set(train)
    # groups are trained in order, each cached apart: a later one adds prompts, never repeats one
    groups = distill.training_groups()
    assert len(groups) == 3 and all(groups) and train == [p for g in groups for p in g]
    assert len(set(train)) == sum(map(len, groups))
    low = [p.lower() for p in distill.PROMPTS]
    for word in ("python", "json", "extract", "write a short", "describe", "what"):
        assert sum(word in p for p in low) >= 5, word


def test_the_shipped_draft_loads_once_per_target(bundled):
    """A batch builds one drafter per row: they share one draft LM (weights only) and keep their own caches."""
    a, b = make("draft", bundled), make("draft", bundled)
    assert a.lm is b.lm and a is not b
    a.begin([1, 2]), b.begin([1, 2])
    assert a.cache is not b.cache


def test_early_exit_drafters_share_one_network_until_the_exit_changes(one_thread):
    """A batch makes a drafter per row: they share the network the backend prepared, and an exit whose weights
    change in place (a training step) gets a new one, so no row drafts from stale weights."""
    from tests.tiny import tiny_lm
    t = tiny_lm(1, forward="ours")
    ex = ee.Exit(t.model, 1).float().eval()
    a, b = ee.EarlyExit(t, ex), ee.EarlyExit(t, ex)
    assert a.be is b.be
    ids = torch.tensor([4, 7, 1, 9])
    before = a.be.forward(ids, a.be.new_cache(), last_only=True)
    with torch.no_grad():
        ex.layer.mlp.down_proj.weight.mul_(2.0)
    c = ee.EarlyExit(t, ex)
    assert c.be is not a.be
    assert not torch.equal(c.be.forward(ids, c.be.new_cache(), last_only=True), before)
    model = weakref.ref(t.model)     # and the cache does not keep an unloaded target alive
    del a, b, c, t
    gc.collect()
    assert model() is None
