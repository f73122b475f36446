"""The EAGLE head's trained module (eagle.Head) behind the packed head's call signature: what drafting ran
before it had a packed inference path, kept as the reference the packed path is tested against."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class ModuleScratch:
    def __init__(self):
        self.n, self.past = 0, None


class ModuleStep:
    """(f, tok, pos, bias, kv) -> (features, logits) as PackedHead, through Head.forward in fp32."""

    def __init__(self, drafter):
        self.head, self.device = drafter.head, drafter.fast.device
        self.emb = drafter.target.model.get_input_embeddings().weight
        w = drafter.target.model.get_output_embeddings().weight
        self.w = (drafter.head.vocab.head(w) if drafter.head.vocab is not None else w).float()

    def scratch(self, rows: int) -> ModuleScratch:
        return ModuleScratch()

    def __call__(self, f, tok, pos, bias, kv):
        m = f.shape[0]
        e = self.emb[tok].float()
        out, (k, v) = self.head(f.float()[None], e[None], torch.full((1, m), pos), (bias == 0)[None], kv.past)
        kv.past = (k, v) if kv.past is None else (torch.cat([kv.past[0], k], 1), torch.cat([kv.past[1], v], 1))
        kv.n += m
        return out[0], F.linear(out[0], self.w)
