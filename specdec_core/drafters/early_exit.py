"""Early exit: self-speculation from the target's own first L layers plus a small trained exit.

LayerSkip (Elhoushi et al. 2024) and Draft & Verify (Zhang et al. 2024) draft with a prefix of the target's
layers. Without training, the hidden state after L layers is a poor input for the final norm and LM head
(greedy agreement under 35% below layer 24 of 30 here), so an exit is trained by self-distillation. As in
Kangaroo (Liu et al. 2024) the exit is one decoder layer (attention + MLP, started from the target's last
layer) and its own norm before the target's tied LM head: attention lets the shallow state look back at the
context, which a per-token adapter cannot. No second model is deployed: the first L layers and the head are
the target's modules, shared, and the exit is the only new weight (`weights/early-exit.*`). The head scores
only the draft vocabulary (vocab.py), its rows taken from the target's head.

The trunk and the exit keep one KV cache of L + 1 layers, synced to the committed text by longest common
prefix (like `draft_model.py`): after a rejection the rejected suffix is cropped, after a full acceptance the
last drafted token and the bonus are run on the next proposal.
"""
from __future__ import annotations

import copy
import json
import weakref
from pathlib import Path

import torch
from torch import nn

from ..models import LM, ModelError
from . import entry, load_weights, untrained, weights_for
from .draft_model import CachedDraft
from .vocab import DraftVocab

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


class Exit(nn.Module):
    """One decoder layer and a norm that continue the residual stream after the target's layer L."""

    def __init__(self, target_model: nn.Module, layers: int, vocab: DraftVocab | None = None):
        super().__init__()
        inner = target_model.model
        cfg = copy.copy(target_model.config)
        self.layers = layers
        self.layer = type(inner.layers[0])(cfg, layer_idx=layers)  # sits right after the trunk in one cache
        self.norm = copy.deepcopy(inner.norm).float()
        self.vocab = vocab

    @classmethod
    def for_target(cls, target_model: nn.Module, layers: int, vocab: DraftVocab | None = None,
                   init_from: int = -1) -> "Exit":
        """Started from the target's layer `init_from` (the last by default) and its final norm, fp32."""
        ex = cls(target_model, layers, vocab)
        src = target_model.model.layers[init_from]
        ex.layer.load_state_dict({k: v.float() for k, v in src.state_dict().items()})
        return ex.float()


def stack(target_model: nn.Module, layers: list[nn.Module], norm: nn.Module) -> nn.Module:
    """A shallow copy of the target's decoder that runs `layers` then `norm`, sharing every other module.

    Called through the model's own public forward, so masks and rotary embeddings are built the way the
    installed transformers builds them; the target itself is left whole."""
    inner = target_model.model
    t = copy.copy(inner)
    t._modules = dict(inner._modules)  # own module table: swapping layers/norm below leaves the target alone
    t.config = copy.copy(inner.config)
    t.config.num_hidden_layers = len(layers)
    t.layers = nn.ModuleList(layers)
    t.norm = norm
    return t


def trunk(target_model: nn.Module, layers: int) -> nn.Module:
    """The target's first `layers` layers, no final norm (shared weights)."""
    n = len(target_model.model.layers)
    if not 1 <= layers < n:
        raise ModelError(f"early exit needs 1 <= L < {n} (the target's layer count), got L={layers}")
    return stack(target_model, list(target_model.model.layers[:layers]), nn.Identity())


def save(ex: Exit, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in ex.state_dict().items()}
    if ex.vocab is not None:
        sd.update(ex.vocab.state())
    save_file(sd, str(path), metadata={"layers": str(ex.layers), **{k: str(v) for k, v in meta.items()}})


def load_exit(target_model: nn.Module, path: Path | None = None) -> Exit:
    path = Path(path or WEIGHTS / "early-exit.safetensors")
    sd, meta, _ = load_weights(path, "early-exit")
    ids = sd.pop("draft_vocab", None)
    vocab = DraftVocab(ids, target_model.config.vocab_size) if ids is not None else None
    ex = Exit(target_model, int(meta["layers"]), vocab)
    try:
        ex.load_state_dict({k: v.float() for k, v in sd.items()})
    except RuntimeError as e:
        raise ModelError(f"{path.name} does not fit this target: {str(e).splitlines()[0]}") from None
    ex.default_k = int(meta.get("default_k", EarlyExit.default_k))
    return ex.eval()


def manifest(path: Path | None = None) -> dict:
    return json.loads(Path(path or WEIGHTS / "early-exit.manifest.json").read_text())


# A batch makes one drafter per row, and each would read the weights file and have the backend prepare the same
# network (on the fast path, int8 copies of the trunk's products): both are made once, per target and per exit.
_SHIPPED: "weakref.WeakKeyDictionary[nn.Module, Exit]" = weakref.WeakKeyDictionary()   # target model -> its exit
_BUILT: "weakref.WeakKeyDictionary[Exit, tuple]" = weakref.WeakKeyDictionary()   # exit -> (target, versions, parts)


def network(target: LM, ex: Exit) -> tuple:
    """(trunk, net, head rows, backend) of the exit `ex` on `target`; remade when its weights changed in place
    (a training loop's exit: tensors count their in-place updates)."""
    versions = tuple(p._version for p in ex.parameters())
    got = _BUILT.get(ex)
    if got is not None and got[0] == _which(target) and got[1] == versions:
        return got[2]
    ex.to(target.device, target.dtype).eval()
    tr = trunk(target.model, ex.layers)
    net = stack(target.model, list(tr.layers) + [ex.layer], ex.norm)
    w = target.model.get_output_embeddings().weight
    head_w = ex.vocab.head(w) if ex.vocab is not None else w   # [v, d]: the target's rows
    # the target's backend runs the same trunk blocks (shared with the target's) and the exit
    be = target.backend.derive(net, ex.layers, ex.layer, ex.norm.weight, head_w, ex.vocab)
    _BUILT[ex] = (_which(target), tuple(p._version for p in ex.parameters()), (tr, net, head_w, be))
    return tr, net, head_w, be


def _which(target: LM) -> tuple:
    """The target's model and forward, by weak reference: a cached network must not keep an unloaded model alive
    (_SHIPPED holds the exit only as long as the model lives)."""
    return tuple(_weak(x) for x in (target.model, target.fwd))


def _weak(x):
    try:
        return weakref.ref(x)
    except TypeError:   # None: no forward of ours attached
        return x


class EarlyExit(CachedDraft):
    name = "early-exit"
    default_k = entry(name).default_k

    def __init__(self, target: LM, ex: Exit | None = None, default_k: int | None = None):
        if ex is None:
            if not weights_for(self.name, target):
                raise untrained(self.name, target)
            ex = _SHIPPED.get(target.model) or _SHIPPED.setdefault(target.model, load_exit(target.model))
        if ex.norm.weight.shape[0] != target.model.config.hidden_size:
            raise ModelError(f"early-exit weights are for hidden size {ex.norm.weight.shape[0]}, "
                             f"but {target.name} has {target.model.config.hidden_size}")
        self.target, self.ex, self.vocab = target, ex, ex.vocab
        self.trunk, self.net, self.head_w, self.be = network(target, ex)
        self.default_k = default_k or getattr(ex, "default_k", None) or self.default_k
        super().__init__()

    def new_cache(self):
        return self.be.new_cache()

    @torch.inference_mode()
    def run(self, ids: list[int]) -> torch.Tensor:
        return self.be.forward(torch.tensor(ids), self.cache, last_only=True)[-1]

    def details(self) -> dict:
        return {"exit_layer": self.ex.layers}
