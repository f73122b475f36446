"""Tiny random Llama models and a tokenizer stand-in, for tests that need exact distributions fast.

With a vocabulary of a dozen tokens every distribution the engine samples from can be enumerated, so
speculative sampling can be checked against the model's exact joint law (Leviathan et al. 2023, Thm. 1).
"""
from __future__ import annotations

import itertools

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_core.models import LM, attach_forward

V = 12
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class TinyTok:
    """Just what the engine and the vocabulary check read from a tokenizer: one letter per id."""
    chat_template = None

    def __init__(self, vocab: int = V, eos: int | None = None, pieces: list[str] | None = None,
                 bos_token: str | None = None):
        self.pieces = list(pieces or LETTERS[:vocab])
        assert len(self.pieces) == vocab
        self.eos_token_id = eos
        self.eos_token = None if eos is None else self.pieces[eos]
        self.bos_token, self.pad_token, self.unk_token = bos_token, None, None

    def get_vocab(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.pieces)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
        return "".join(self.pieces[i] for i in ids
                       if not (skip_special_tokens and i == self.eos_token_id))

    def __call__(self, text: str) -> dict:
        ids = self.get_vocab()
        return {"input_ids": [ids[c] for c in text]}

    def __len__(self) -> int:
        return len(self.pieces)


class AnyTok(TinyTok):
    """A TinyTok that reads any text: every character is some token (ord mod vocab), so code that encodes its
    own text (a CLI's prompts, a warm-up "Hello") runs on a tiny model."""
    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) % len(self.pieces) for c in text]}


def tiny_lm(seed: int, vocab: int = V, layers: int = 2, eos: int | None = None, head_std: float = 0.3,
            tok: TinyTok | None = None, device: str = "cpu", name: str | None = None, forward: str = "hf") -> LM:
    """A randomly initialised fp32 Llama, with weights large enough that p depends on the context
    and is far from uniform (the default init gives nearly uniform, context-free distributions).
    `forward="ours"` runs our batch-invariant forward (forward.py) instead of transformers'."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      initializer_range=0.3, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=eos, pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, head_std)
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = model.generation_config.pad_token_id = None
    model = model.to(device).eval()
    lm = LM(model, tok or TinyTok(vocab, eos), name or f"tiny-{seed}", torch.float32, torch.device(device))
    return attach_forward(lm, forward)


@torch.inference_mode()
def exact_joint(lm: LM, prompt: list[int], n: int, temperature: float = 1.0) -> torch.Tensor:
    """The model's exact law of its next n tokens at `temperature`, by enumeration: a [V]*n tensor."""
    vocab = lm.vocab_size
    heads = torch.tensor(list(itertools.product(range(vocab), repeat=n - 1)), dtype=torch.long)
    heads = heads.view(-1, n - 1)                                                   # [V^(n-1), n-1]
    ctx = torch.cat([torch.tensor(prompt).expand(heads.shape[0], -1), heads], 1).to(lm.device)
    logits = lm.model(ctx).logits.float()[:, len(prompt) - 1:].cpu()              # [B, n, V]
    lp = torch.log_softmax(logits / temperature, -1)
    # log p(x_1..x_n) = sum_i log p(x_i | prompt, x_<i); row b fixes x_1..x_{n-1} = heads[b]
    head_lp = lp[:, :n - 1].gather(2, heads.unsqueeze(-1)).squeeze(-1).sum(1)     # [B]
    return (head_lp[:, None] + lp[:, n - 1]).exp().view(*([vocab] * n))


def perturbed(lm: LM, noise: float, seed: int, name: str | None = None) -> LM:
    """A draft that mostly agrees with `lm`: its weights plus Gaussian noise of `noise` times their scale."""
    import copy
    model = copy.deepcopy(lm.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in model.parameters():
            w.add_(noise * w.float().std() * torch.randn(w.shape, generator=g).to(w))
    return LM(model, lm.tokenizer, name or f"{lm.name}-perturbed", lm.dtype, lm.device)


def tiny_exit(target: LM, seed: int, layers: int = 1, vocab_ids: list[int] | None = None, std: float = 0.3):
    """An early-exit drafter on `target` (drafters/early_exit.py): its first `layers` layers, shared, plus an exit
    layer with random weights of scale `std` (so q differs from p), optionally over a draft vocabulary."""
    from specdec_core.drafters.early_exit import EarlyExit, Exit
    from specdec_core.drafters.vocab import DraftVocab
    vocab = None if vocab_ids is None else DraftVocab(torch.tensor(vocab_ids), target.vocab_size)
    ex = Exit(target.model, layers, vocab).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, w in ex.layer.named_parameters():
            if w.dim() == 2:
                w.copy_(std * torch.randn(w.shape, generator=g))
    return lambda: EarlyExit(target, ex.eval())


def tiny_heads(hidden: int, n_heads: int, seed: int, std: float = 0.3, vocab_ids: list[int] | None = None):
    """Random Medusa heads (drafters/medusa.py): they rank varied candidates, some of which the target accepts."""
    from specdec_core.drafters.medusa import Heads
    from specdec_core.drafters.vocab import DraftVocab
    vocab = None if vocab_ids is None else DraftVocab(torch.tensor(vocab_ids), V)
    heads = Heads(hidden, n_heads, vocab)
    with torch.no_grad():
        heads.w.copy_(std * torch.randn(heads.w.shape, generator=torch.Generator().manual_seed(seed)))
    return heads.eval()


def subset_lm(lm: LM, ids: list[int], forward: str | None = None) -> LM:
    """`lm` scoring only the draft vocabulary `ids` (drafters/vocab.py), as the shipped draft does
    (draft_model.load_draft): its head keeps those rows, every other token gets logit -inf, so q is 0 there."""
    import copy
    from specdec_core.drafters.distilled import SubsetHead
    from specdec_core.drafters.vocab import DraftVocab
    model = copy.deepcopy(lm.model)
    model.lm_head = SubsetHead(model.lm_head.weight, DraftVocab(torch.tensor(ids), lm.vocab_size))
    out = LM(model, lm.tokenizer, f"{lm.name}-subset{len(ids)}", lm.dtype, lm.device)
    sub = model.lm_head
    return attach_forward(out, forward or lm.forward_name, head=sub.weight.detach(), vocab=sub.vocab)
