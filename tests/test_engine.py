"""The decode loop: greedy speculation gives exactly plain greedy decoding (which is transformers'
generate), the KV caches hold exactly the committed text after every step, and bad inputs are refused.

Leviathan et al. 2023, Alg. 1: with temperature 0, p is the one-hot argmax, so every drafter must
reproduce the target's greedy output token for token. On the bundled model this is checked in float32
(chunking-independent argmax) strictly, and in the default dtype (bf16 on most CPUs), where a multi-token
verification forward can round a near-tie differently from the one-token forwards of plain decoding.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from specdec_core import InputError, SamplingParams, engine, load
from specdec_core.models import LM
from specdec_core.backend import dynamic_cache
from specdec_core.drafters import Drafter, DrafterUnavailable, make
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.sampling import probs
from specdec_core.forward import KVCache
from specdec_core.batch import decode_batch, run_batch
from tests.tiny import V, perturbed, tiny_lm

TINY_PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2]


# ---------------------------------------------------------------- helpers

def capture_caches(lm, monkeypatch) -> list:
    """Record every cache `lm` makes; the engine makes the target's first."""
    made, orig = [], lm.new_cache

    def new_cache():
        made.append(orig())
        return made[-1]
    monkeypatch.setattr(lm, "new_cache", new_cache)
    return made


def fresh_cache(lm, ids: list[int]):
    orig = type(lm).new_cache(lm)
    lm.forward(torch.tensor(ids), orig)
    return orig


def cache_entries(c) -> list[torch.Tensor]:
    """Every layer's committed keys and values, for either cache kind."""
    if isinstance(c, KVCache):
        n = c.get_seq_length()
        return [t[:, :, :n] for t in c.k + c.v]
    return [la.keys for la in c.layers] + [la.values for la in c.layers]


def assert_same_cache(a, b, atol=1e-5, rtol=1e-4):
    assert a.get_seq_length() == b.get_seq_length()
    ea, eb = cache_entries(a), cache_entries(b)
    assert len(ea) == len(eb)
    for x, y in zip(ea, eb):
        if isinstance(a, KVCache):   # ours is batch-invariant: rollbacks leave exactly a fresh prefill's entries
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, atol=atol, rtol=rtol)


def assert_cache_lens(recs, prompt_len: int):
    """The target cache holds prompt + committed - 1 entries: the newest token is the next input."""
    for r in recs:
        assert r.cache_len == prompt_len + r.n_generated - 1, \
            f"step {r.index}: cache_len {r.cache_len}, expected {prompt_len} + {r.n_generated} - 1"


class CheckedDraft(Drafter):
    """Wraps DraftModel and checks, after every proposal, that its cache holds exactly the committed
    context plus the drafts it ran (rejected ones rolled back), and that each q is the draft's law."""

    def __init__(self, inner: DraftModel):
        self.inner, self.name, self.default_k = inner, inner.name, inner.default_k
        self.steps = []   # (k, n_accepted)

    def begin(self, prompt):
        self.inner.begin(prompt)

    def propose(self, ctx):
        prop = self.inner.propose(ctx)
        dm, m = self.inner, prop.tokens.numel()
        ran = ctx.tokens + prop.tokens[:m - 1].tolist()      # the last draft is sampled, never run
        assert dm.seen == ran and dm.cache_len() == len(ran)
        ref = type(dm.lm).new_cache(dm.lm)
        logits = dm.lm.forward(torch.tensor(ran), ref)[len(ctx.tokens) - 1:]   # [m, V]
        assert_same_cache(dm.cache, ref)
        torch.testing.assert_close(prop.q, probs(logits, ctx.sp), atol=1e-5, rtol=1e-4)
        return prop

    def feedback(self, ctx, n_accepted):
        self.steps.append((ctx.k, n_accepted))
        self.inner.feedback(ctx, n_accepted)


def drafter_for(name, target, draft):
    return make("draft", target, draft) if name.startswith("draft") else make(name, target)


# ---------------------------------------------------------------- tiny models: caches, lengths, eos

@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("name", ["none", "lookup", "draft", "draft-self"])
def test_target_cache_is_the_committed_text(name, temperature, device, monkeypatch, one_thread):
    target, other = tiny_lm(1, device=device), tiny_lm(2, device=device)
    made = capture_caches(target, monkeypatch)
    drafter = drafter_for(name, target, target if name == "draft-self" else other)
    ids, recs, _ = engine.run(target, drafter, TINY_PROMPT, sp=SamplingParams(temperature=temperature, seed=3),
                              k=3, max_new_tokens=24, detail=True, stop_at_eos=False)
    assert len(ids) == 24 and recs[-1].stop_reason == "length"
    assert_cache_lens(recs, len(TINY_PROMPT))
    assert_same_cache(made[0], fresh_cache(target, TINY_PROMPT + ids[:-1]))
    if name != "none":
        assert sum(r.k for r in recs) > 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("self_draft", [True, False], ids=["self", "other"])
def test_draft_cache_rolls_back(self_draft, temperature, device, one_thread):
    target = tiny_lm(1, device=device)
    draft = target if self_draft else perturbed(target, 0.1, seed=0)   # agrees often, not always
    checked = CheckedDraft(DraftModel(draft, target))
    ids, recs, _ = engine.run(target, checked, TINY_PROMPT, sp=SamplingParams(temperature=temperature, seed=5),
                              k=4, max_new_tokens=40, detail=False, stop_at_eos=False)
    assert len(ids) == 40
    assert_cache_lens(recs, len(TINY_PROMPT))
    full = sum(n == k for k, n in checked.steps)
    if self_draft:   # q == p: every draft is accepted, so the bonus path is what gets exercised
        assert full == len(checked.steps) > 0
    else:
        assert full > 0 and any(n < k for k, n in checked.steps), checked.steps


def test_tiny_greedy_matches_transformers(device, one_thread):
    """On a float32 model every drafter reproduces transformers' greedy generate exactly."""
    target, other = tiny_lm(1, device=device), tiny_lm(2, device=device)
    prompt = torch.tensor([TINY_PROMPT], device=device)
    ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=30)[0, len(TINY_PROMPT):].tolist()
    for name in ("none", "lookup", "draft", "draft-self"):
        drafter = drafter_for(name, target, target if name == "draft-self" else other)
        ids, recs, _ = engine.run(target, drafter, TINY_PROMPT, k=4, max_new_tokens=30, detail=False,
                                  stop_at_eos=False)
        assert ids == ref, name


def test_length_is_exact_with_long_drafts(one_thread):
    """k is clipped so a step never commits past max_new_tokens."""
    target = tiny_lm(1)
    for n in (1, 2, 5, 11):
        recs = list(engine.decode(target, make("draft", target, target), TINY_PROMPT, k=8, max_new_tokens=n,
                                  detail=False, stop_at_eos=False))
        assert recs[-1].n_generated == n and recs[-1].done and recs[-1].stop_reason == "length"
        assert all(r.k <= n - rr.n_generated - 1 for r, rr in zip(recs[1:], recs))
        assert recs[0].k == min(8, n - 1)


@pytest.mark.parametrize("name", ["none", "lookup", "draft-self"])
def test_stops_at_eos_with_the_cache_committed(name, one_thread):
    """EOS ends the run even when it is an accepted draft in the middle of a step; nothing after it is
    committed and the cache holds the committed text only."""
    plain = tiny_lm(1)
    ref, _, _ = engine.run(plain, make("none", plain), TINY_PROMPT, max_new_tokens=12, detail=False,
                           stop_at_eos=False)
    j = next(i for i in range(1, len(ref)) if ref[i] not in ref[:i])   # first fresh token after the first
    target = tiny_lm(1, eos=ref[j])
    assert target.eos_ids == {ref[j]}
    ids, recs, _ = engine.run(target, drafter_for(name, target, target), TINY_PROMPT, k=6, max_new_tokens=12,
                              detail=True)
    assert ids == ref[:j + 1]
    assert recs[-1].stop_reason == "eos" and recs[-1].done and recs[-1].committed[-1].token == ref[j]
    if name == "draft-self":   # the scenario this test is for: eos accepted mid-draft, drafts after it
        assert recs[-1].n_accepted + 1 > len(recs[-1].committed), [r.drafted for r in recs]
    assert_cache_lens(recs, len(TINY_PROMPT))


# ---------------------------------------------------------------- bad inputs

@pytest.fixture(scope="module")
def tiny():
    return tiny_lm(1)


@pytest.mark.parametrize("prompt", [[], torch.tensor([], dtype=torch.long)], ids=["list", "tensor"])
def test_empty_prompt(tiny, prompt):
    with pytest.raises(InputError, match="empty"):
        engine.run(tiny, make("none", tiny), prompt)


@pytest.mark.parametrize("prompt", [[1, 2, V], [-1, 2], [1, 10 ** 6]], ids=["V", "negative", "huge"])
def test_prompt_id_outside_the_vocabulary(tiny, prompt):
    """Refused before any work with the id, where it is and the valid range (it crashed in the embedding)."""
    bad = next(t for t in prompt if not 0 <= t < V)
    for name in ("none", "lookup"):
        with pytest.raises(InputError, match=rf"prompt token id {bad} \(position \d\) is not a token of tiny-1: "
                                             rf"its ids are 0..{V - 1}"):
            engine.run(tiny, make(name, tiny), prompt)
    with pytest.raises(InputError, match=f"prompt token id {bad}"):
        run_batch(tiny, lambda: make("lookup", tiny), [[1, 2, 3], prompt])


def test_empty_text_prompt(tiny):
    for text in ("", "   \n"):
        with pytest.raises(InputError, match="empty"):
            tiny.encode(text)


@pytest.mark.parametrize("k", [-1, 65, 2.5, "4"])
def test_k_out_of_range(tiny, k):
    with pytest.raises(InputError, match=r"k \(draft length\)"):
        engine.run(tiny, make("lookup", tiny), TINY_PROMPT, k=k)


@pytest.mark.parametrize("n", [0, -3, 4097, 8.0])
def test_max_new_tokens_out_of_range(tiny, n):
    with pytest.raises(InputError, match="max new tokens"):
        engine.run(tiny, make("none", tiny), TINY_PROMPT, max_new_tokens=n)


class Untouched(Drafter):
    """Fails the test if a run ever starts with it: input checks must come before any work."""
    name = "untouched"

    def begin(self, prompt):
        raise AssertionError("the run started before its input was checked")

    def propose(self, ctx):
        raise AssertionError("the run started before its input was checked")


BAD = {"k": dict(k=-1), "k-big": dict(k=65), "length": dict(max_new_tokens=0), "policy": dict(k_policy="bogus"),
       "empty": dict(prompt=[]), "id": dict(prompt=[1, V]), "context": dict(max_new_tokens=120, k=10)}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_raises_at_the_call(tiny, case, monkeypatch):
    """decode and decode_batch refuse at the call itself: the stream is never read, no cache is made, the
    drafter never begins (tiny's context is 128 positions: 12 + 120 + 10 passes it)."""
    made = capture_caches(tiny, monkeypatch)
    kw = dict(BAD[case])
    prompt = kw.pop("prompt", TINY_PROMPT)
    with pytest.raises(InputError):
        engine.decode(tiny, Untouched(), prompt, **kw)       # not iterated
    with pytest.raises(InputError):
        decode_batch(tiny, Untouched, [TINY_PROMPT, prompt], **kw)
    assert made == []


def test_good_input_works_only_when_read(tiny, monkeypatch):
    """The other side: a valid call does no work until the stream is read."""
    made = capture_caches(tiny, monkeypatch)
    steps = engine.decode(tiny, make("lookup", tiny), TINY_PROMPT, k=3, max_new_tokens=4)
    assert made == []
    assert next(steps).index == 0 and len(made) == 1


def test_k_edges_accepted(tiny):
    for k in (0, 64):
        ids, _, _ = engine.run(tiny, make("lookup", tiny), TINY_PROMPT, k=k, max_new_tokens=3, stop_at_eos=False)
        assert len(ids) == 3


def test_unknown_drafter(tiny):
    with pytest.raises(DrafterUnavailable, match="unknown drafter 'bogus'.*none, lookup, suffix, draft"):
        make("bogus", tiny)


def test_draft_without_a_draft_model(tiny):
    with pytest.raises(DrafterUnavailable, match="needs a draft model"):
        make("draft", tiny)


# ---------------------------------------------------------------- the bundled model: greedy exactness

PROMPTS = {
    "code": "Write a Python function that checks whether a number is prime.",
    "json": 'Return a JSON object with keys "name", "age" and "city" for a 34-year-old named Ana who lives '
            'in Lisbon.',
    "extraction": "Extract every date from this text, one per line: The contract was signed on 3 March 2021, "
                  "amended on 14 July 2022 and ends on 31 December 2025.",
    "chat": "Hi! How are you today?",
    "creative": "Write a haiku about the sea at night.",
    "summary": "Summarize in one sentence: The city council voted on Tuesday to expand the bike lane network "
               "by 40 kilometres over the next three years, citing rising ridership and fewer accidents on "
               "streets that already have protected lanes.",
    "math": "What is 17 multiplied by 23? Show your steps.",
    "repeat": "Repeat exactly: the quick brown fox jumps over the lazy dog.",
    "edit": "Rename the variable x to count in this code:\nx = 0\nfor item in items:\n    x += 1\nprint(x)",
    "translate": "Translate to French: Good morning, where is the train station?",
}
GREEDY_TOKENS = 32
TRUNC_LAYERS = 24
SPEC = ("lookup", "draft-self", "draft-truncated")


@pytest.fixture(scope="module")
def truncated_dir(bundled, tmp_path_factory):
    """A different draft with the target's vocabulary: its first TRUNC_LAYERS layers (plus the final norm
    and the tied head), saved as safetensors with the tokenizer so it loads through a local directory."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = bundled.model.config.to_dict()
    cfg.pop("quantization_config", None)       # the GGUF origin: the copy is plain safetensors
    cfg.pop("layer_types", None)
    cfg["num_hidden_layers"] = TRUNC_LAYERS
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    keep = {k: v for k, v in bundled.model.state_dict().items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < TRUNC_LAYERS}
    model.load_state_dict(keep, strict=True, assign=True)
    model.tie_weights()
    model.generation_config = bundled.model.generation_config
    path = tmp_path_factory.mktemp("truncated")
    model.save_pretrained(path)
    bundled.tokenizer.save_pretrained(path)
    assert list(path.glob("*.safetensors"))
    return path


def hf_greedy(lm, ids: torch.Tensor, n: int) -> list[int]:
    """transformers' generate, greedy, continuing a cache of the prompt but its last token: the same forwards
    the engine runs (engine.prefill), so in bf16 too they round alike."""
    ids = ids.view(1, -1).to(lm.device)
    cache = dynamic_cache(lm.model.config)
    lm.model(ids[:, :-1], use_cache=True, **{lm.cache_arg: cache})
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                            top_p=None, top_k=None, temperature=None, **{lm.cache_arg: cache})
    return out[0, ids.shape[1]:].tolist()


def spec_drafters(target, truncated):
    """name -> (drafter factory, k); the truncated draft agrees less often, so shorter drafts pay."""
    return {"lookup": (lambda: make("lookup", target), 4),
            "draft-self": (lambda: make("draft", target, target), 4),
            "draft-truncated": (lambda: make("draft", target, truncated), 2)}


def ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp(min=1e-6))) - 7)


QUICK = ("code",)   # the other prompts run in make test-long
BY_PROMPT = [p if p in QUICK else pytest.param(p, marks=pytest.mark.long) for p in PROMPTS]


@pytest.mark.parametrize("prompt", BY_PROMPT)
def test_greedy_fp32_exact(prompt, bundled_fp32, truncated_dir, monkeypatch, one_thread):
    """float32: plain decoding is transformers' generate, and every drafter gives exactly its tokens."""
    target = bundled_fp32
    truncated = load(str(truncated_dir), dtype="fp32", device="cpu")
    assert truncated.num_layers == TRUNC_LAYERS and truncated.dtype == torch.float32
    ids = target.encode(PROMPTS[prompt])
    ref = hf_greedy(target, ids, GREEDY_TOKENS)
    plain, recs, _ = engine.run(target, make("none", target), ids, max_new_tokens=GREEDY_TOKENS, detail=False)
    assert plain == ref, "plain greedy decoding differs from transformers' generate"
    assert_cache_lens(recs, ids.numel())
    for name, (build, k) in spec_drafters(target, truncated).items():
        made = capture_caches(target, monkeypatch)
        got, recs, met = engine.run(target, build(), ids, k=k, max_new_tokens=GREEDY_TOKENS, detail=False)
        assert got == ref, f"{name}: first difference at {next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)}"
        assert_cache_lens(recs, ids.numel())
        if name == "draft-truncated":   # target cache after rejections and rollbacks == a fresh prefill
            assert met.drafted > met.accepted
            assert_same_cache(made[0], fresh_cache(target, ids.tolist() + got[:-1]), atol=1e-4, rtol=1e-3)
        monkeypatch.undo()


def test_warming_a_model_pays_the_first_decodes_costs_and_changes_no_output(bundled, one_thread):
    """engine.warm, what the app runs once it has loaded a model: afterwards the chat template's opening is stored
    (so the first run a page times reads it as every later run does), and a run decodes what it did before."""
    lm, ids = bundled, bundled.encode("Name three colours.")
    saved = lm.fwd._opened
    try:
        before = engine.run(lm, make("none", lm), ids, max_new_tokens=8, detail=False)[0]
        lm.fwd._opened = None
        engine.warm(lm)
        assert lm.fwd._opened is not None
        assert engine.run(lm, make("none", lm), ids, max_new_tokens=8, detail=False)[0] == before
    finally:
        lm.fwd._opened = saved


@pytest.mark.parametrize("prompt", BY_PROMPT)
def test_greedy_default_dtype_reference_forward(prompt, bundled_any, truncated_dir, one_thread):
    """transformers' forward (the reference) in the app's dtype. Plain decoding must equal generate() exactly:
    both run the prompt but its last token, then one token per forward. Speculation verifies several tokens per forward, and
    that forward rounds them differently in bf16, so a near-tie can flip; where the outputs part, both tokens
    must be within a few bf16 steps of the top logit, and every speculative token must be the target's argmax
    on its own prefix within that margin. Each flip is reported as a warning with its prompt and position.
    (Our forward allows no flip at all: tests/test_forward.py.)"""
    target = LM(bundled_any.model, bundled_any.tokenizer, bundled_any.name, bundled_any.dtype, bundled_any.device)
    truncated = load(str(truncated_dir), dtype=target.dtype, device=target.device.type, forward="hf")
    ids = target.encode(PROMPTS[prompt])
    ref = hf_greedy(target, ids, GREEDY_TOKENS)
    plain, recs, _ = engine.run(target, make("none", target), ids, max_new_tokens=GREEDY_TOKENS, detail=False)
    assert plain == ref, "plain greedy decoding differs from transformers' generate"
    assert_cache_lens(recs, ids.numel())
    for name, (build, k) in spec_drafters(target, truncated).items():
        got, recs, _ = engine.run(target, build(), ids, k=k, max_new_tokens=GREEDY_TOKENS, detail=False)
        assert_cache_lens(recs, ids.numel())
        if got == plain:
            continue
        ctx = ids.tolist() + got[:-1]
        logits = target.forward(torch.tensor(ctx), target.new_cache())[ids.numel() - 1:]   # [n, V]
        top = logits.max(-1).values
        gap = top - logits.gather(1, torch.tensor(got, device=logits.device).view(-1, 1)).squeeze(1)
        tol = 4 * ulp_bf16(top)
        assert (gap <= tol).all(), f"{name}: tokens that are not the target's argmax: " \
            f"{[(i, got[i], float(gap[i])) for i in range(len(got)) if gap[i] > tol[i]]}"
        j = next(i for i, (a, b) in enumerate(zip(got + [-1], plain + [-1])) if a != b)
        assert j < min(len(got), len(plain)), f"{name}: one output is a prefix of the other"
        a, b = float(logits[j, plain[j]]), float(logits[j, got[j]])
        assert abs(a - b) <= tol[j], f"{name} at {j}: plain {plain[j]} ({a}) vs speculative {got[j]} ({b})"
        warnings.warn(f"bf16 near-tie flip: prompt {prompt!r}, drafter {name}, generated position {j}: "
                      f"plain {plain[j]} {target.tokenizer.decode([plain[j]])!r} vs speculative {got[j]} "
                      f"{target.tokenizer.decode([got[j]])!r}, logits {a:.3f} vs {b:.3f} (top {float(top[j]):.3f})")
