"""Loading models and pairing them: local directories round-trip, bad specs give ModelError naming the
problem, and a draft whose vocabulary differs from the target's is refused with IncompatibleModels
saying what differs (speculative decoding compares p and q id by id: Leviathan et al. 2023)."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from specdec_core import IncompatibleModels, ModelError, check_compatible, load
from specdec_core.drafters import make
from specdec_core.drafters.draft_model import DraftModel
from specdec_core.models import pick_dtype
from tests.tiny import V, TinyTok, tiny_lm

WORDS = ["<unk>", "<eos>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "."]


def word_tokenizer(words=WORDS) -> PreTrainedTokenizerFast:
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def save_tiny(path, seed=1, words=WORDS, layers=2):
    lm = tiny_lm(seed, vocab=len(words), layers=layers, eos=1)
    lm.model.save_pretrained(path)            # safetensors
    word_tokenizer(words).save_pretrained(path)
    return lm


# ---------------------------------------------------------------- local directories

def test_local_directory_round_trip(tmp_path, one_thread):
    ref = save_tiny(tmp_path)
    lm = load(str(tmp_path), dtype="fp32", device="cpu")
    assert lm.name == str(tmp_path) and lm.dtype == torch.float32 and lm.device.type == "cpu"
    assert (lm.vocab_size, lm.num_layers) == (len(WORDS), 2)
    assert lm.eos_ids == {1}
    ids = lm.encode("the cat sat on the mat .")   # no chat template: plain tokenization
    assert ids.tolist() == [2, 3, 4, 5, 2, 6, 11]
    torch.testing.assert_close(lm.forward(ids, lm.new_cache()), ref.forward(ids, ref.new_cache()))
    check_compatible(lm, lm)


def test_local_directory_bf16(tmp_path, one_thread):
    save_tiny(tmp_path)
    lm = load(str(tmp_path), dtype="bf16", device="cpu")
    assert lm.dtype == torch.bfloat16 and next(lm.model.parameters()).dtype == torch.bfloat16
    assert lm.forward(torch.tensor([2, 3]), lm.new_cache()).dtype == torch.float32   # logits come back fp32


def test_a_loaded_model_is_out_of_the_collectors_reach_and_still_freed(tmp_path, one_thread):
    """load() freezes what is alive (a full collection walked ~400,000 objects, ~190 ms in a decode); a model
    dropped afterwards must still be freed, by reference counting, with no collection run."""
    save_tiny(tmp_path)
    gc.unfreeze()
    lm = load(str(tmp_path), dtype="fp32", device="cpu")
    assert gc.get_freeze_count() > 1000
    dead = weakref.ref(lm.model)
    gc.disable()
    try:
        del lm
        assert dead() is None
    finally:
        gc.enable()


def test_missing_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load(str(tmp_path / "no-such-model"), dtype="fp32")


def test_path_is_a_file(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(ModelError, match="is a file, not a model directory"):
        load(str(f), dtype="fp32")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        load(str(tmp_path), dtype="fp32")


def test_directory_without_safetensors(tmp_path):
    lm = tiny_lm(1)
    lm.model.config.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded: only safetensors are")
    with pytest.raises(ModelError, match=r"no \*\.safetensors"):
        load(str(tmp_path), dtype="fp32")


def test_corrupt_weights(tmp_path):
    save_tiny(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelError, match="could not load model"):
        load(str(tmp_path), dtype="fp32")


@pytest.mark.parametrize("spec", ["", "   "])
def test_no_model_named(spec):
    with pytest.raises(ModelError, match="no model named"):
        load(spec, dtype="fp32")


def test_bad_dtype():
    with pytest.raises(ModelError, match="unknown dtype 'int3'"):
        load("bundled", dtype="int3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu():
    with pytest.raises(ModelError, match="no CUDA GPU"):
        load("bundled", device="cuda")


def test_pick_dtype(monkeypatch):
    monkeypatch.delenv("SPECDEC_DTYPE", raising=False)
    cpu = torch.device("cpu")
    assert pick_dtype(cpu, "fp32") == torch.float32 and pick_dtype(cpu, "bf16") == torch.bfloat16
    assert pick_dtype(cpu, torch.float16) == torch.float16
    assert pick_dtype(torch.device("cuda"), None) == torch.bfloat16
    monkeypatch.setenv("SPECDEC_DTYPE", "fp32")
    assert pick_dtype(cpu) == torch.float32
    assert pick_dtype(cpu, "bf16") == torch.bfloat16   # an explicit choice beats the environment


# ---------------------------------------------------------------- pairing target and draft

def pair(target_tok: TinyTok, draft_tok: TinyTok):
    t = tiny_lm(1, vocab=len(target_tok), tok=target_tok, name="tiny-target")
    d = tiny_lm(2, vocab=len(draft_tok), tok=draft_tok, name="tiny-draft")
    return t, d


def expect_incompatible(t, d, *needles):
    for build in (lambda: check_compatible(t, d), lambda: DraftModel(d, t), lambda: make("draft", t, d)):
        with pytest.raises(IncompatibleModels) as e:
            build()
        msg = str(e.value)
        assert "'tiny-draft' cannot draft for target 'tiny-target'" in msg
        for n in needles:
            assert n in msg, msg


def test_compatible_pair_is_accepted():
    t, d = pair(TinyTok(), TinyTok())
    check_compatible(t, d)
    assert make("draft", t, d).lm is d


def test_different_token_strings():
    pieces = list("abcdefghijkl")
    pieces[3], pieces[7] = "X", "Y"
    t, d = pair(TinyTok(), TinyTok(pieces=pieces))
    expect_incompatible(t, d, "2 token ids map to different strings", "id 3: target 'd' vs draft 'X'",
                        "id 7: target 'h' vs draft 'Y'")


def test_different_vocabulary_size():
    t, d = pair(TinyTok(), TinyTok(vocab=V + 2))
    expect_incompatible(t, d, f"vocabulary sizes differ: target {V} tokens, draft {V + 2}")


def test_different_special_tokens():
    t, d = pair(TinyTok(eos=1), TinyTok(eos=2))
    expect_incompatible(t, d, "special token eos_token differs: target 'b', draft 'c'")
    t, d = pair(TinyTok(bos_token="a"), TinyTok())
    expect_incompatible(t, d, "special token bos_token differs: target 'a', draft None")


@pytest.mark.parametrize("t_rows,d_rows", [(16, 12), (12, 16), (16, 14)],
                         ids=["target-head-padded", "draft-head-padded", "both-padded-differently"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_padded_heads_pair(t_rows, d_rows, temperature, one_thread):
    """Qwen2.5-style pairs: one tokenizer (12 tokens), heads padded to different widths (as 151,936 vs 152,064
    rows over 151,665 tokens). They pair; no padding id is ever proposed or emitted; greedy output is plain
    decoding's. Before, this crashed with an IndexError (the target emitting or being fed a padding id)."""
    from specdec_core import SamplingParams, engine
    t = tiny_lm(1, vocab=t_rows, tok=TinyTok(), name="tiny-target")
    d = tiny_lm(2, vocab=d_rows, tok=TinyTok(), name="tiny-draft")
    check_compatible(t, d)
    assert (t.n_tokens, d.n_tokens) == (V, V)
    sp = SamplingParams(temperature=temperature, seed=3)
    prompt, kw = [1, 2, 3], dict(sp=sp, max_new_tokens=40, stop_at_eos=False)
    ids, recs, _ = engine.run(t, make("draft", t, d), prompt, k=3, **kw)
    assert len(ids) == 40 and max(ids) < V
    assert all(x < V for r in recs for x in r.drafted)
    if temperature == 0:
        plain, _, _ = engine.run(t, make("none", t), prompt, **kw)
        assert ids == plain


def test_padded_head_scores_only_tokens(one_thread):
    """A padded head's extra rows never reach p: both forwards return logits over the tokenizer's ids."""
    from specdec_core.models import attach_forward
    t = tiny_lm(1, vocab=16, tok=TinyTok())
    for fwd in ("ours", "hf"):
        attach_forward(t, fwd)
        assert t.forward(torch.tensor([1, 2, 3]), t.new_cache()).shape == (3, V)


def test_draft_that_cannot_read_the_targets_tokens():
    """A draft whose embedding is narrower than the tokens the target emits is refused, with the sizes."""
    t = tiny_lm(1, vocab=V, tok=TinyTok(), name="tiny-target")
    d = tiny_lm(2, vocab=V, tok=TinyTok(), name="tiny-draft")
    d.model.resize_token_embeddings(V - 2)
    d = type(d)(d.model, d.tokenizer, d.name, d.dtype, d.device)
    expect_incompatible(t, d, f"the draft's embedding has {V - 2} rows but the other model emits ids up to "
                              f"{V - 1}")


def test_incompatible_directories(tmp_path):
    """The same check on real tokenizers loaded from disk."""
    save_tiny(tmp_path / "t", words=WORDS)
    save_tiny(tmp_path / "d", seed=2, words=WORDS[:8] + ["cow", "walked", "near", "!"])
    t, d = load(str(tmp_path / "t"), dtype="fp32"), load(str(tmp_path / "d"), dtype="fp32")
    with pytest.raises(IncompatibleModels, match="4 token ids map to different strings; first: id 8"):
        make("draft", t, d)


# ---------------------------------------------------------------- the bundled model

def test_bundled(bundled):
    assert (bundled.vocab_size, bundled.num_layers) == (49152, 30)
    assert bundled.eos_ids == {bundled.tokenizer.convert_tokens_to_ids("<|im_end|>")}
    chat = bundled.encode("Name a colour.")
    raw = bundled.encode("Name a colour.", raw=True)
    assert bundled.tokenizer.decode(chat).startswith("<|im_start|>system")
    assert bundled.tokenizer.decode(chat).endswith("<|im_start|>assistant\n")
    assert bundled.tokenizer.decode(raw) == "Name a colour."
    with pytest.raises(Exception, match="empty"):
        bundled.encode("  ")


def test_a_draft_vocabulary_head_still_scores_every_token(bundled):
    """The shipped draft's head holds only its draft vocabulary's rows but scatters back to all 49152 ids:
    n_tokens follows the config, not the head's rows (else its logits would be cut to the first 8192 ids)."""
    from specdec_core.drafters.distilled import shipped_draft
    d = shipped_draft(bundled)
    assert d.vocab_size < d.n_tokens == bundled.n_tokens == 49152
    logits = d.forward(bundled.encode("Hi"), d.new_cache())
    assert logits.shape[-1] == 49152 and torch.isfinite(logits).sum(-1).min() == 8192


@pytest.mark.long   # it reads the GGUF itself: ~20 s
def test_the_bundled_model_converted_once_reads_back_bit_for_bit(tmp_path, monkeypatch, one_thread):
    """The first load on a machine reads the GGUF and writes what it read as a model directory; the next reads
    that directory instead: the same tensors bit for bit, the same config, tokenizer and chat template."""
    from specdec_core import models
    monkeypatch.setattr(models, "CONVERTED", tmp_path)
    tok, first = models._bundled_dense(torch.bfloat16)                  # from the GGUF, and written
    (d,) = [p for p in tmp_path.iterdir()]
    assert "bfloat16" in d.name and list(d.glob("*.safetensors")) and not d.name.startswith(".")
    tok2, again = models._bundled_dense(torch.bfloat16)                 # read back
    a, b = first.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    ca, cb = first.config.to_dict(), again.config.to_dict()
    ca.pop("_name_or_path"), cb.pop("_name_or_path")
    assert ca == cb
    assert tok.get_vocab() == tok2.get_vocab() and tok.chat_template == tok2.chat_template
    text = "def f(x):\n    return {'a': 1} 🎉 café"
    assert tok(text).input_ids == tok2(text).input_ids
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == (tok2.eos_token, tok2.bos_token, tok2.pad_token)
    for f in d.glob("*.safetensors"):                                    # damaged: read from the GGUF again
        f.unlink()
    _, third = models._bundled_dense(torch.bfloat16)
    c = third.state_dict()
    assert list(d.glob("*.safetensors")) and all(torch.equal(a[k], c[k]) for k in a)
