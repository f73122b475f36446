"""The shipped draft model for the bundled target: a 2-layer Llama distilled from it
(DistillSpec, Zhou et al. 2024; draft/target pairing as in Leviathan et al. 2023).

It is an ordinary transformers `LlamaForCausalLM` with its own config (`weights/draft.config.json`) and its
own decoder weights (`weights/draft.safetensors`), started from slices of the target and trained by KL to
the target's distributions (`python -m specdec_core train draft`). Only the non-embedding weights ship: the
49152 x 576 embedding alone is 56 MB in bf16, so at load time the embedding (tied to the LM head) is filled
from the target's, which the draft was trained with and never changed. The draft scores only its draft
vocabulary (vocab.py, shipped with the weights): at load time its LM head is swapped for those rows of the
tied head, which makes a draft forward about half as costly here; q is zero for every other token.
"""
from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
from torch import nn

from ..models import LM, ModelError, attach_forward
from .registry import DrafterUnavailable, load_weights
from .vocab import DraftVocab

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
EMBED = "model.embed_tokens.weight"


def draft_config(target_model, n_layers: int):
    """The target's config with fewer layers and no quantization or name baggage."""
    from transformers import LlamaConfig
    d = target_model.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures", "transformers_version"):
        d.pop(k, None)
    d.update(num_hidden_layers=n_layers, tie_word_embeddings=True, architectures=["LlamaForCausalLM"])
    return LlamaConfig(**d)


def from_target(target_model, layers: list[int]):
    """A fresh LlamaForCausalLM whose decoder layers are copies of the target's `layers`, fp32."""
    from transformers import LlamaForCausalLM
    n = target_model.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ModelError(f"draft init layers must be in [0, {n}), got {layers}")
    m = LlamaForCausalLM(draft_config(target_model, len(layers))).float()
    src = target_model.model
    with torch.no_grad():
        m.model.embed_tokens.weight.copy_(src.embed_tokens.weight.float())
        for j, i in enumerate(layers):
            m.model.layers[j].load_state_dict({k: v.float() for k, v in src.layers[i].state_dict().items()})
        m.model.norm.weight.copy_(src.norm.weight.float())
    m.tie_weights()
    return m


def shipped_state(m) -> dict:
    """The weights that ship: everything but the embedding / tied head."""
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in m.state_dict().items()
            if k != EMBED and not k.startswith("lm_head")}


class SubsetHead(nn.Module):
    """The LM head restricted to a draft vocabulary: logits [.., V], -inf outside it."""

    def __init__(self, weight: torch.Tensor, vocab: DraftVocab):
        super().__init__()
        self.vocab = vocab
        self.weight = nn.Parameter(vocab.head(weight).detach().clone(), requires_grad=False)   # [v, d]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.vocab.scatter(nn.functional.linear(h, self.weight))


def save(m, folder: Path, vocab: DraftVocab | None, meta: dict) -> Path:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "draft.safetensors"
    sd = shipped_state(m)
    if vocab is not None:
        sd.update(vocab.state())
    save_file(sd, str(path), metadata={k: str(v) for k, v in meta.items()})
    (folder / "draft.config.json").write_text(m.config.to_json_string())
    return path


_LOADED: dict[tuple[int, str], tuple] = {}


def shipped_draft(target: LM) -> LM:
    """The shipped draft for `target`, loaded once per target and forward (a batch builds one drafter per
    row; the LM holds weights only, each DraftModel its own cache)."""
    key = (id(target.model), target.forward_name)
    hit = _LOADED.get(key)
    if hit is None or hit[0]() is not target.model:
        hit = _LOADED[key] = (weakref.ref(target.model), load_draft(target))
    return hit[1]


def load_draft(target: LM, folder: Path | None = None) -> LM:
    """The shipped draft as an LM on the target's device and dtype, embedding filled from the target's."""
    from transformers import LlamaConfig, LlamaForCausalLM
    folder = Path(folder or WEIGHTS)
    path, cfg_path = folder / "draft.safetensors", folder / "draft.config.json"
    if not cfg_path.exists():
        raise DrafterUnavailable(f"no trained draft config at {cfg_path.name}: run "
                                 "`python -m specdec_core train draft` to produce it")
    sd, _, _ = load_weights(path, "draft")
    cfg = LlamaConfig.from_dict(json.loads(cfg_path.read_text()))
    emb = target.model.get_input_embeddings().weight
    if tuple(emb.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ModelError(f"the shipped draft expects a target embedding of {(cfg.vocab_size, cfg.hidden_size)}, "
                         f"{target.name} has {tuple(emb.shape)}")
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    ids = sd.pop("draft_vocab", None)
    sd = {k: v.to(target.dtype) for k, v in sd.items()}
    sd[EMBED] = emb.detach().to(target.dtype)
    missing, unexpected = m.load_state_dict(sd, strict=False, assign=True)
    missing = [k for k in missing if not k.startswith("lm_head") and "rotary" not in k]
    if missing or unexpected:
        raise ModelError(f"{path.name} does not match {cfg_path.name}: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}")
    m.tie_weights()
    # buffers created on meta (rotary inv_freq) are rebuilt for real
    m.model.rotary_emb = type(m.model.rotary_emb)(config=cfg)
    m = m.to(target.device, target.dtype).eval()
    if ids is not None:
        m.lm_head = SubsetHead(m.lm_head.weight, DraftVocab(ids, cfg.vocab_size))
    lm = LM(m, target.tokenizer, f"distilled draft ({cfg.num_hidden_layers} layers)", target.dtype, target.device)
    sub = m.lm_head if ids is not None else None
    # int8 weights where the CPU has the kernel: a draft's few rows are bound by the bytes they read (the fast path's Dense)
    return attach_forward(lm, target.forward_name, int8=True,
                          **({"head": sub.weight.detach(), "vocab": sub.vocab} if sub else {}))


def manifest(folder: Path | None = None) -> dict:
    return json.loads((Path(folder or WEIGHTS) / "draft.manifest.json").read_text())
