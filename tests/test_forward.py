"""Our forward (forward.py): it computes transformers' function, and it is batch-invariant bit for bit.

Invariance is what makes greedy speculative decoding token-identical to plain decoding in every dtype: the
logits of a position must not depend on how it was scored (alone, in a chain verify of any k, in a tree, or as
one row of a batch of other sequences).
"""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, \
    Qwen2ForCausalLM

from specdec_core import InputError, make_drafter, run
from specdec_core.batch import run_batch
from specdec_core.fast.packed import native_op
from specdec_core.forward import BLOCK, Forward, Unsupported
from specdec_core.models import LM, attach_forward, pick_dtype
from specdec_core.tree import compile_tree
from specdec_core.bench.workloads import load_jsonl

TEXT = ("Extract the names from: Alice met Bob in Paris; Bob later wrote to Carol. Names: Alice, Bob, Carol. "
        "Now write a Python function that returns the sum of a list of numbers.")


def small(kind: str, **over):
    """A small random model of each covered family (GQA: 4 query heads over 2 key/value heads)."""
    base = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
    base.update(over)
    cfg, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
                "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    torch.manual_seed(0)
    m = cls(cfg(**base)).eval()
    with torch.no_grad():   # biases start at zero: give them values so that a dropped bias would show
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                mod.bias.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("kind,over", [
    ("llama", {}), ("llama", {"tie_word_embeddings": True}), ("mistral", {"sliding_window": None}),
    ("qwen2", {}), ("llama", {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64}}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
])
def test_matches_transformers_on_small_models(kind, over):
    """fp32, plain products: equal to transformers' eager forward within 1e-5 (Qwen2 with its qkv biases)."""
    m = small(kind, **over)
    m.set_attn_implementation("eager")
    ids = torch.randint(0, 96, (150,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = m(ids[None]).logits[0]
    f = Forward.from_model(m)
    got = f(ids, [0] * 150, torch.arange(150), f.new_cache())
    assert (got - ref).abs().max() <= 1e-5
    if kind == "qwen2":
        assert f.blocks[0].qkv.b is not None and f.blocks[0].qkv.b.abs().sum() > 0


def test_matches_transformers_on_the_bundled_model(bundled_fp32):
    """fp32: the reference forward (plain products, op by op) equals transformers' eager forward bit for bit, and is
    within 1e-4 of its default (sdpa) forward; with the fast path's packed products (the default), within 2e-4
    (another summation order)."""
    m = bundled_fp32.model
    ids = bundled_fp32.encode(TEXT)
    n = ids.numel()
    orig = m.config._attn_implementation
    with torch.inference_mode():
        sdpa = m(ids[None]).logits[0]
        m.set_attn_implementation("eager")
        eager = m(ids[None]).logits[0]
        m.set_attn_implementation(orig)
    plain = Forward.from_model(m)
    got = plain(ids, [0] * n, torch.arange(n), plain.new_cache())
    assert torch.equal(got, eager)
    assert (got - sdpa).abs().max() <= 1e-4
    packed = bundled_fp32.forward(ids, bundled_fp32.new_cache())
    assert (packed - eager).abs().max() <= 2e-4


def test_unsupported_architecture_falls_back_with_a_reason(capsys):
    m = small("llama", hidden_act="gelu")
    lm = attach_forward(LM(m, None, "tiny-gelu"), "ours")
    assert lm.fwd is None and lm.forward_name == "hf" and "activation 'gelu'" in lm.fallback
    assert "running transformers' forward" in capsys.readouterr().err
    with pytest.raises(Unsupported, match="sliding-window"):
        Forward.from_model(small("mistral", sliding_window=16))


def scored(lm: LM, ctx: list[int], new: list[int]) -> torch.Tensor:
    """Logits of `new` scored in one forward after ctx (the prefill itself in one forward)."""
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx), c)
    return lm.forward(torch.tensor(new), c)


def test_a_position_scores_the_same_alone_in_a_chain_of_any_k(either):
    lm = either
    ids = lm.encode(TEXT).tolist()
    ctx, new = ids[:-17], ids[-17:]
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx), c)
    alone = torch.cat([lm.forward(torch.tensor([t]), c) for t in new])                   # 17 one-token steps
    for k in range(1, 17):                                                                # verify steps of k+1
        got = scored(lm, ctx, new[:k + 1])
        assert torch.equal(got, alone[:k + 1]), f"k={k}"
    ctx2 = ctx[:-5]   # and the same positions after a prefill of another length, chunks crossing blocks
    got = scored(lm, ctx2, ctx[-5:] + new[:6])[5:]
    assert torch.equal(got, alone[:6])


def test_a_position_scores_the_same_inside_a_tree(either):
    lm = either
    ids = lm.encode(TEXT).tolist()
    ctx, root = ids[:-4], ids[-4]
    tree = compile_tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])
    nodes = torch.tensor([root, 11, 12, 13, 21, 22, 23, 31, 32])                          # tree order
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx), c)
    logits, hidden = lm.tree_forward(c, nodes, tree)
    for i in range(tree.size):
        branch = [root] + [int(nodes[j]) for j in tree.path_to(i)]
        assert torch.equal(logits[i], scored(lm, ctx, branch)[-1]), f"node {i}"


# trees of depth 1..5 and up to 16 nodes (node 0, the root, excluded from the paths)
TREES = [[(0,), (1,), (2,), (3,)],
         [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)],
         [(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0), (1, 0, 0), (0, 1, 0)],
         [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
          (0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 0, 0, 0), (1, 0, 0, 0)]]


@pytest.mark.parametrize("ctx", [5, 30, 200, 220, 380, 570])
def test_tree_nodes_score_as_their_branch_across_contexts(either, ctx):
    """Every node of every tree == its root-to-node branch scored as a chain, bit for bit, after contexts whose
    trees sit inside one key block (200), straddle a block boundary (30, 220: 224, 380: 384, 570: 576, where
    the CPU's product also splits its sum over keys), are short (5) or long (> 256, > 512 keys)."""
    lm = either
    ids = torch.randint(100, 20000, (ctx + 16,), generator=torch.Generator().manual_seed(ctx)).tolist()
    c = lm.new_cache()
    lm.forward(torch.tensor(ids[:ctx]), c)
    for paths in TREES:
        tree = compile_tree(paths)
        nodes = torch.tensor(ids[ctx:ctx + tree.size])
        c.set_length(0, ctx)
        logits, _ = lm.tree_forward(c, nodes, tree)
        for leaf in (i for i in range(tree.size) if not tree.children[i]):
            branch = [0] + tree.path_to(leaf)
            c.set_length(0, ctx)
            chain = lm.forward(nodes[branch], c)                                           # the branch alone
            for k, i in enumerate(branch):
                assert torch.equal(logits[i], chain[k]), f"ctx={ctx} tree of {tree.size}, node {i}"


def test_tree_values_are_read_in_place_unless_a_block_boundary_intervenes(bundled):
    """The tree plan: nodes inside one key block multiply the cache's values where they sit (no gathered
    copy); a node with a key whose slot and position fall in different blocks gathers its values."""
    f = bundled.fwd
    tree = compile_tree(TREES[3])
    plan = lambda L: f._tree_plan(BLOCK * (L // BLOCK + 1), L,
                                  [[L + j for j in [0] + tree.path_to(i)] for i in range(tree.size)],
                                  (L + tree.depth).tolist())
    assert plan(200).slow is None                                                        # slots 200..215 < 224
    slow = plan(215).slow.tolist()                                    # slots 215..230: nodes 9.. sit past 224
    assert slow == list(range(9, tree.size))
    assert plan(5).slow.tolist() == list(range(tree.size))            # a short prefix: all gathered, as before
    with pytest.raises(ValueError, match="increase"):
        f._tree_plan(224, 200, [[200, 202, 201]], [202])


@pytest.mark.parametrize("probe", [(True, False), (False, True)])
def test_a_device_that_fails_the_probe_gathers_and_stays_exact(bundled, monkeypatch, probe):
    """Reading keys or values in place rests on how a device's GEMM blocks its sums (forward.in_place_ok, probed
    once): where the probe fails, every node gathers (and, for scores, takes them again as a chain) and each
    node still equals its branch scored as a chain, bit for bit."""
    import specdec_core.forward as fw
    f, ctx = bundled.fwd, 200
    assert fw.in_place_ok(f.device, f.n_kv, f.n_heads // f.n_kv, f.head_dim) == (True, True)   # this CPU
    monkeypatch.setitem(fw._IN_PLACE, (str(f.device), f.n_kv, f.n_heads // f.n_kv, f.head_dim), probe)
    tree = compile_tree(TREES[3])
    assert f._tree_plan(224, ctx, [[ctx + j for j in [0] + tree.path_to(i)] for i in range(tree.size)],
                        (ctx + tree.depth).tolist()).slow.numel() == tree.size
    ids = torch.randint(100, 20000, (ctx + 16,), generator=torch.Generator().manual_seed(7)).tolist()
    c = bundled.new_cache()
    bundled.forward(torch.tensor(ids[:ctx]), c)
    nodes = torch.tensor(ids[ctx:ctx + tree.size])
    logits, _ = bundled.tree_forward(c, nodes, tree)
    for leaf in (i for i in range(tree.size) if not tree.children[i]):
        branch = [0] + tree.path_to(leaf)
        c.set_length(0, ctx)
        chain = bundled.forward(nodes[branch], c)
        for k, i in enumerate(branch):
            assert torch.equal(logits[i], chain[k]), f"node {i}"


def test_a_sequence_scores_the_same_as_a_row_of_a_batch(either):
    """Prefill and a verify step for three sequences of different lengths in one call == each alone."""
    lm = either
    f = lm.fwd
    seqs = [lm.encode(t).tolist() for t in (TEXT, "Hello there, how are you?", "List three colours.")]
    c = f.new_cache(batch=3)
    rows = [i for i, s in enumerate(seqs) for _ in s[:-3]]
    pos = [j for s in seqs for j in range(len(s) - 3)]
    f(torch.tensor([t for s in seqs for t in s[:-3]]), rows, torch.tensor(pos), c)
    for i, s in enumerate(seqs):
        c.set_length(i, len(s) - 3)
    rows = [i for i, s in enumerate(seqs) for _ in s[-3:]]
    pos = [j for s in seqs for j in range(len(s) - 3, len(s))]
    got = f(torch.tensor([t for s in seqs for t in s[-3:]]), rows, torch.tensor(pos), c)
    for i, s in enumerate(seqs):
        assert torch.equal(got[3 * i:3 * i + 3], scored(lm, s[:-3], s[-3:])), f"row {i}"


def test_a_prompt_read_from_the_stored_opening_is_the_whole_prefill(either):
    """A prompt opening with the chat template's fixed start reads that start from the forward's stored rows: its
    logits, hidden states and cache are bitwise those of reading it whole, alone or as a row of a batch; a prompt
    that does not open with it is read whole; and after a kernel is switched the opening is run again with it."""
    lm = either
    f = lm.fwd
    opening = f.opening
    assert len(opening) >= 8, "the bundled template opens every prompt with a system message"
    prompts = [lm.encode(t).tolist()[:-1] for t in (TEXT, "List three colours.")] + [lm.encode(TEXT, raw=True).tolist()]
    assert all(tuple(p[:len(opening)]) == opening for p in prompts[:2]) and tuple(prompts[2][:len(opening)]) != opening

    def read(p, on):
        f.opening = opening if on else ()
        c = lm.new_cache()
        logits, h = lm.forward(torch.tensor(p), c, last_only=True, hidden=True)
        return logits, h, c.kv[:, :, :, :len(p)].clone(), c.lens

    def batch(on):
        f.opening = opening if on else ()
        rows = lm.backend.rows(len(prompts), hidden=True)
        h = rows.prefill(prompts)
        return h, [rows.cache.kv[:, i, :, :len(p)].clone() for i, p in enumerate(prompts)], list(rows.cache.lens)

    try:
        for p in prompts:
            with_, whole = read(p, True), read(p, False)
            assert with_[3] == whole[3] == [len(p)]
            for a, b in zip(with_[:3], whole[:3]):
                assert torch.equal(a, b)
        (h1, kv1, n1), (h0, kv0, n0) = batch(True), batch(False)
        assert n1 == n0 == [len(p) for p in prompts]
        for a, b in zip(h1 + kv1, h0 + kv0):
            assert torch.equal(a, b)
        assert f._opened is not None and f._opened[2].shape[0] == len(opening)
        att = native_op("own_attention")
        if att is not None:             # another attention kernel: the stored opening is run again with it
            was = att(False)
            try:
                on, whole = read(prompts[0], True), read(prompts[0], False)
                assert all(torch.equal(a, b) for a, b in zip(on[:3], whole[:3]))
            finally:
                att(was)
    finally:
        f.opening = opening


def test_rollback_and_compaction_leave_a_fresh_prefill(bundled):
    """The static cache after rejected drafts (rolled back) and a compacted tree branch holds exactly the
    entries a fresh prefill of the committed tokens would."""
    lm = bundled
    ids = lm.encode(TEXT).tolist()
    c = lm.new_cache()
    lm.forward(torch.tensor(ids[:20]), c)
    lm.forward(torch.tensor(ids[20:28]), c)
    c.crop(-5)                                                         # 3 of 8 kept
    tree = compile_tree([(0,), (1,), (0, 0), (1, 0)])
    lm.tree_forward(c, torch.tensor(ids[23:24] + [7, ids[24], 9, ids[25]]), tree)
    lm.backend.compact(c, 23, torch.tensor([0, 2, 4]))                            # root -> (1,) -> (1, 0)
    fresh = lm.new_cache()
    lm.forward(torch.tensor(ids[:26]), fresh)
    assert c.get_seq_length() == fresh.get_seq_length() == 26
    for a, b in zip(c.k + c.v, fresh.k + fresh.v):
        assert torch.equal(a[:, :, :26], b[:, :, :26])


def test_dtype_comes_from_the_hardware(monkeypatch):
    monkeypatch.delenv("SPECDEC_DTYPE", raising=False)
    import specdec_core.models as models
    monkeypatch.setattr(models, "cpu_has_bf16", lambda: True)
    assert pick_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(models, "cpu_has_bf16", lambda: False)
    assert pick_dtype(torch.device("cpu")) == torch.float32 == pick_dtype(torch.device("cpu"), "auto")
    assert pick_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    assert pick_dtype(torch.device("cuda")) == torch.bfloat16


def test_context_longer_than_the_model_is_refused_before_work(bundled):
    with pytest.raises(InputError, match="context of 8192"):
        run(bundled, make_drafter("none", bundled), [1] * 8000, max_new_tokens=300)


# ---------------------------------------------------------------- the contract, end to end, default dtype

def varied_prompts(n_per: int = 6) -> list[str]:
    files = ["code", "json", "extraction", "chat", "creative"]
    return [r["prompt"] for f in files for r in load_jsonl(f"specdec_core/prompts/{f}.jsonl")[:n_per]]


@pytest.mark.parametrize("n_per,tokens", [(1, 20), pytest.param(6, 32, marks=pytest.mark.long)])
def test_greedy_speculative_equals_plain_for_every_drafter(bundled, n_per, tokens):
    """5 varied prompts, one per workload, 20 tokens (30 prompts and 32 tokens in the long run), every drafter,
    the default dtype: token for token (no near-tie allowance)."""
    prompts = varied_prompts(n_per)
    assert len(prompts) >= 5 * n_per
    drafters = {n: make_drafter(n, bundled) for n in ("none", "lookup", "draft", "early-exit", "medusa")}
    for text in prompts:
        ids = bundled.encode(text)
        plain = run(bundled, drafters["none"], ids, max_new_tokens=tokens, detail=False)[0]
        for name, d in drafters.items():
            got = run(bundled, d, ids, k=5 if name in ("lookup", "draft") else None, max_new_tokens=tokens,
                      detail=False)[0]
            assert got == plain, f"{name} on {text[:40]!r}"


@pytest.mark.parametrize("batch", [1, 4, pytest.param(8, marks=pytest.mark.long)])
@pytest.mark.parametrize("name", ["none", "lookup", "draft", "medusa"])
def test_batched_greedy_equals_plain_for_every_drafter(bundled, batch, name):
    prompts = [bundled.encode(t) for t in varied_prompts(2)[:batch]]
    res = run_batch(bundled, lambda: make_drafter(name, bundled), prompts, max_new_tokens=24)
    alone = [run(bundled, make_drafter("none", bundled), p, max_new_tokens=24, detail=False)[0] for p in prompts]
    assert res.tokens == alone


def test_an_int8_draft_network_is_batch_invariant_without_padding(bundled):
    """A draft model's int8 products (Dense(int8=True), bf16 activations) compute each row alone: its forward pads
    no rows, and still scores a position the same alone, in a chain, or as a row of a batch; the scripted loop
    and the op-by-op one agree bit for bit; int8 is never taken with fp32 activations (much slower there)."""
    from specdec_core import backend
    from specdec_core.fast.loop import attach
    from specdec_core.fast.packed import Dense, int8_ok
    if not int8_ok(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this build of torch has no CPU int8 weight product")
    assert not int8_ok(torch.device("cpu"), torch.float32) and Dense(torch.randn(8, 32), int8=True).s is None
    if bundled.dtype != torch.bfloat16:
        pytest.skip("the target runs in fp32 on this CPU, where int8 products are never taken (asserted above)")
    full = backend.forward_of(bundled.model, int8=True)
    f = attach(full.derive(full.blocks[:2], full.norm, full.head))         # two layers: a draft-sized network
    assert f.pad == 1 and f.fast.w is not None and all(b.qkv.packed.dtype == torch.int8 for b in f.blocks)
    ids = bundled.encode(TEXT).tolist()
    ctx, new = ids[:-9], ids[-9:]
    score = lambda c, toks: f.append(torch.tensor(toks), c)               # noqa: E731
    c = f.new_cache()
    score(c, ctx)
    alone = torch.cat([score(c, [t]) for t in new])                                    # one-token steps
    for k in (1, 4, 8):
        c = f.new_cache()
        score(c, ctx)
        assert torch.equal(score(c, new[:k + 1]), alone[:k + 1]), f"k={k}"
    scripted, c = f.fast.w, f.new_cache()
    try:
        f.fast.w = None
        score(c, ctx)
        assert torch.equal(torch.cat([score(c, [t]) for t in new[:3]]), alone[:3])     # the op-by-op loop
    finally:
        f.fast.w = scripted
    seqs = [ctx, ids[:20]]                                                             # rows of a batch
    c = f.new_cache(batch=2)
    f(torch.tensor(seqs[0] + seqs[1]), [0] * len(seqs[0]) + [1] * 20,
      torch.tensor(list(range(len(seqs[0]))) + list(range(20))), c)
    c.set_length(0, len(ctx))
    c.set_length(1, 20)
    got = f(torch.tensor(new[:2] + ids[20:22]), [0, 0, 1, 1], torch.tensor([len(ctx), len(ctx) + 1, 20, 21]), c)
    assert torch.equal(got[:2], alone[:2])


def test_the_scripted_one_row_loop_is_the_op_by_op_loop(either):
    """A one-row chain (prefill past MAX_ROWS, a chunk crossing a key block, decode steps) runs in the scripted
    loop (_one_row_layers); the same calls through the op-by-op loop give the same logits and cache, bit for bit."""
    lm = either
    f, scripted = lm.fwd, lm.fwd.fast.w
    assert scripted is not None   # packed products on the CPU: the scripted loop is the one that runs
    ids = lm.encode(TEXT * 3).tolist()
    runs = []
    try:
        for w in (scripted, None):
            f.fast.w, c = w, lm.new_cache()
            out = [lm.forward(torch.tensor(ids[:70]), c), lm.forward(torch.tensor(ids[70:100]), c)]
            out += [lm.forward(torch.tensor([t]), c) for t in ids[100:104]]
            runs.append((out, [t[:, :, :104].clone() for t in c.k + c.v]))
    finally:
        f.fast.w = scripted
    (a, ca), (b, cb) = runs
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(x, y) for x, y in zip(ca, cb))
