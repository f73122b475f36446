"""Early exit: self-speculation from the target's own first L layers plus a small trained exit.

LayerSkip (Elhoushi et al. 2024) and Draft & Verify (Zhang et al. 2024) draft with a prefix of the target's
layers. Without training, the hidden state after L layers is a poor input for the final norm and LM head
(greedy agreement 0.19 at L=20 here), so a small exit is trained by self-distillation: a residual SwiGLU
adapter and its own RMSNorm, then the target's tied LM head. No second model is deployed: the trunk and
the head are the target's modules, shared, and the exit is the only new weight (`weights/early-exit.*`).

The trunk keeps its own KV cache of L layers, synced to the committed text by longest common prefix
(like `draft_model.py`): after a rejection the rejected suffix is cropped, after a full acceptance the
last drafted token and the bonus are run on the next proposal.
"""
from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import torch
from torch import nn

from ..models import LM, ModelError
from .draft_model import CachedDraft

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


class Exit(nn.Module):
    """h [.., d] after L target layers -> logits through the target's head: x + SwiGLU(x) with x = rms(h), then norm."""

    def __init__(self, d: int, hidden: int, layers: int, eps: float = 1e-5):
        super().__init__()
        self.layers, self.eps = layers, eps
        self.norm_in = nn.Parameter(torch.ones(d))
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.norm_out = nn.Parameter(torch.ones(d))
        nn.init.zeros_(self.down.weight)  # starts as the untrained early exit (plus the target's final norm)

    def _rms(self, x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w.to(x.dtype)

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        # the residual stream mid-network has a large, uneven scale; adding the adapter to its unit-RMS
        # version lets a small update matter from the first steps (RMS norm is scale-free, so with `down`
        # at zero this is still exactly the untrained early exit)
        x = self._rms(h, torch.ones_like(self.norm_in))
        n = x * self.norm_in.to(x.dtype)
        x = x + self.down(nn.functional.silu(self.gate(n)) * self.up(n))
        return self._rms(x, self.norm_out)

    def forward(self, h: torch.Tensor, head: nn.Module) -> torch.Tensor:
        return head(self.hidden(h))

    @classmethod
    def for_target(cls, target_model: nn.Module, layers: int, hidden: int = 1536) -> "Exit":
        cfg = target_model.config
        ex = cls(cfg.hidden_size, hidden, layers, float(getattr(cfg, "rms_norm_eps", 1e-5)))
        with torch.no_grad():
            ex.norm_out.copy_(target_model.model.norm.weight.float())
        return ex


def trunk(target_model: nn.Module, layers: int) -> nn.Module:
    """A shallow copy of the target's decoder stack that runs only its first `layers` layers, no final norm.

    It shares every parameter with the target (no copy of weights) and is called through the model's own
    public forward, so masks and rotary embeddings are built the way the installed transformers builds them."""
    inner = target_model.model
    n = len(inner.layers)
    if not 1 <= layers < n:
        raise ModelError(f"early exit needs 1 <= L < {n} (the target's layer count), got L={layers}")
    t = copy.copy(inner)
    t._modules = dict(inner._modules)  # own module table: swapping layers/norm below leaves the target alone
    t.config = copy.copy(inner.config)
    t.config.num_hidden_layers = layers
    t.layers = nn.ModuleList(list(inner.layers[:layers]))
    t.norm = nn.Identity()
    return t


def cache_kw(module: nn.Module) -> str:
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def new_cache(tr: nn.Module):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=tr.config)
    except TypeError:
        return DynamicCache()


def save(ex: Exit, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in ex.state_dict().items()}
    save_file(sd, str(path), metadata={"layers": str(ex.layers), "hidden": str(ex.gate.out_features),
                                       "eps": str(ex.eps), **{k: str(v) for k, v in meta.items()}})


def load_exit(path: Path | None = None) -> Exit:
    from safetensors import safe_open
    path = Path(path or WEIGHTS / "early-exit.safetensors")
    if not path.exists():
        raise FileNotFoundError(f"early-exit weights {path.name} are missing: run "
                                "`python -m specdec_core train early-exit` to produce them")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        sd = {k: f.get_tensor(k) for k in f.keys()}
    d, hidden = sd["gate.weight"].shape[1], sd["gate.weight"].shape[0]
    ex = Exit(d, hidden, int(meta["layers"]), float(meta["eps"]))
    ex.load_state_dict({k: v.float() for k, v in sd.items()})
    ex.default_k = int(meta.get("default_k", EarlyExit.default_k))
    return ex.eval()


def manifest(path: Path | None = None) -> dict:
    path = Path(path or WEIGHTS / "early-exit.manifest.json")
    return json.loads(path.read_text())


class EarlyExit(CachedDraft):
    name = "early-exit"
    default_k = 3

    def __init__(self, target: LM, ex: Exit | None = None, default_k: int | None = None):
        ex = ex if ex is not None else load_exit()
        if ex.norm_out.shape[0] != target.model.config.hidden_size:
            raise ModelError(f"early-exit weights are for hidden size {ex.norm_out.shape[0]}, "
                             f"but {target.name} has {target.model.config.hidden_size}")
        self.target, self.ex = target, ex.to(target.device, target.dtype).eval()
        self.trunk = trunk(target.model, ex.layers)
        self.head = target.model.get_output_embeddings()
        self._kw = cache_kw(self.trunk)
        self.default_k = default_k or getattr(ex, "default_k", None) or self.default_k
        super().__init__()

    def _new_cache(self):
        return new_cache(self.trunk)

    @torch.inference_mode()
    def _forward(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], device=self.target.device)
        h = self.trunk(input_ids=x, **{self._kw: self.cache}, use_cache=True).last_hidden_state  # [1, n, d]
        return self.ex(h[0, -1:], self.head)[-1].float()                                          # [V]

    def _info(self) -> dict:
        return {"exit_layer": self.ex.layers}
