"""The EAGLE head's trained module (eagle.Head) behind the packed head's call signature: what drafting ran
before it had a packed inference path, kept as the reference the packed path is tested against."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class ModuleScratch:
    """The rows run so far as Head.forward's `past`; setting n back drops the rows after it."""

    def __init__(self):
        self.past, self._n = None, 0

    @property
    def n(self) -> int:
        return self._n

    @n.setter
    def n(self, rows: int) -> None:
        if self.past is not None:
            self.past = (self.past[0][:, :rows], self.past[1][:, :rows])
        self._n = rows

    def reserve(self, rows: int) -> None:
        pass


class ModuleStep:
    """(f, tok, pos, bias, kv, last, k) -> (features, logits) or (features, top-k log q, ids) as PackedHead,
    through Head.forward in fp32."""

    def __init__(self, drafter):
        self.head, self.device = drafter.head, drafter.fast.device
        self.emb = drafter.target.model.get_input_embeddings().weight
        w = drafter.target.model.get_output_embeddings().weight
        self.w = (drafter.head.vocab.head(w) if drafter.head.vocab is not None else w).float()
        self.ids = drafter.head.vocab.ids if drafter.head.vocab is not None else None

    def scratch(self, rows: int) -> ModuleScratch:
        return ModuleScratch()

    def __call__(self, f, tok, pos, bias, kv, last: int = 0, k: int = 0):
        top = k
        m, R = f.shape[0], kv.n + f.shape[0]
        e = self.emb[tok].float()
        see = torch.cat([torch.ones(m, R - bias.shape[1], dtype=torch.bool), bias == 0], 1)   # [m, R]
        if isinstance(pos, slice):                   # consecutive positions (PackedHead takes them as a view)
            pos = torch.arange(pos.start, pos.stop)
        pos = torch.full((1, m), pos) if isinstance(pos, int) else pos[None]
        out, (k, v) = self.head(f.float()[None], e[None], pos, see[None], kv.past)
        past = (k, v) if kv.past is None else (torch.cat([kv.past[0], k], 1), torch.cat([kv.past[1], v], 1))
        kv.past, kv._n = past, R
        out = out[:, m - last if last else 0:]
        y = F.linear(out[0], self.w)
        if not top:
            return out[0], y
        lp, ix = torch.topk(torch.log_softmax(y, -1, dtype=torch.float32), top, -1)
        return out[0], lp, ix if self.ids is None else self.ids[ix]
