"""Our forward's one-token decode step with static tensors, so that CUDA can capture it as a graph.

Why: a decode step of a 135M model on a GPU is a few hundred small kernels, and launching them from Python costs
more than running them. A CUDA graph (torch.cuda.CUDAGraph) records the launches once and replays them with one
call, but only if the step does no host work in between: no `.tolist()`, no tensor built from a Python list, no
allocation that moves the KV cache. Forward.__call__ plans its attention groups on the host (forward.py), so it
cannot be captured as it stands.

StaticStep is the same arithmetic for the one case that matters here (one row, one token, appended at slot ==
position): the token and its position live in device buffers, the key length S (a function of the position,
forward.BLOCK) picks one graph per block of positions, and every product has the shapes Forward gives it. Same
ops on the same shapes: the logits are bitwise those of Forward's one-token step, which `matches_forward` checks on
any device, the CPU included; only the capture itself needs CUDA.

The price: one graph per key-length bucket S (each holding its own memory pool), and a cache whose capacity is
fixed up front (a graph holds the cache's addresses).

It calls Forward's own pieces (its norm, RoPE and table, the padded attention), private to forward.py, rather than
copies of them: bitwise equality needs the same ops, and a copy could drift. Were this to ship, those pieces
belong in forward.py's public surface (or StaticStep in forward.py itself).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import forward as fw
from ..backend import kernel


class StaticStep:
    """Row 0 of `cache` gets one token: reads self.ids[0] and self.pos[0], writes the cache slot at that position
    in every layer, returns logits [1, V] float32. Does not touch cache.lens (the caller's, as in Forward)."""

    def __init__(self, f: fw.Forward, cache: fw.KVCache):
        self.f, self.cache = f, cache
        dev = f.device
        rows = fw.ROWS                                     # Forward pads one token to ROWS product rows
        self.ids = torch.zeros(rows, dtype=torch.long, device=dev)   # [R] the token, then padding ids (zeros)
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)   # [R] its position, repeated (as Forward pads)
        f._rope_table(cache.capacity)
        self.cos, self.sin = f._cos, f._sin                # held: a later, longer table must not free these
        Hq, Hkv, D = f.n_heads, f.n_kv, f.head_dim
        self.scale = torch.tensor([D ** -0.5] * Hq + [1.0] * Hkv, device=dev)[:, None]   # q pre-scaled, k not

    def set(self, token, pos: int) -> None:
        """The next step's input: `token` an int or a 0-d device tensor (no host sync), `pos` its position."""
        self.ids[0] = token
        self.pos.fill_(pos)

    @torch.inference_mode()
    def __call__(self, S: int) -> torch.Tensor:
        """S: the key length of the current position (forward.BLOCK * (pos // BLOCK + 1))."""
        f, c = self.f, self.cache
        Hq, Hkv, D = f.n_heads, f.n_kv, f.head_dim
        G, R = Hq // Hkv, self.ids.numel()
        cos, sin = self.cos[self.pos][:, None], self.sin[self.pos][:, None]               # [R, 1, D]
        see = torch.arange(S, device=f.device) <= self.pos[:1].view(1, 1, 1)             # [1, 1, S]
        bias = fw.mask_bias(fw._pad_see(see[:, None].expand(-1, G, -1, -1).reshape(1, 1, G, S)))  # [1, 1, G', S]
        slot = self.pos[:1]                                                               # [1]
        x = f.embed[self.ids]                                                             # [R, H]
        own = f.fast is not None and f.fast.packed and f.device.type == "cpu" and kernel("attend_chain") is not None
        for l, b in enumerate(f.blocks):
            qkv = b.qkv(f._rms(x, b.ln1))                                                 # [R, (Hq+2Hkv) D]
            qk = f._rope(qkv[:, :(Hq + Hkv) * D].float().view(R, Hq + Hkv, D), cos, sin) * self.scale
            q, k, v = qk[:, :Hq], qk[:1, Hq:], qkv[:1, (Hq + Hkv) * D:].view(1, Hkv, D)
            c.k[l][0].index_copy_(1, slot, k.transpose(0, 1).to(c.dtype))                # [Hkv, 1, D] at slot
            c.v[l][0].index_copy_(1, slot, v.transpose(0, 1).to(c.dtype))
            a = q.new_zeros(1, Hq * D)
            # on the CPU, a packed forward's attention is csrc/kernels.cpp's loop (Forward._attend): the same call here
            own = own and kernel("attend_chain")(q, c.k[l][0], c.v[l][0], bias[0, 0], S, [0], a, [0],
                                                      f.dtype == torch.bfloat16)
            if not own:
                kk, vv = c.k[l][0, :, :S].float(), c.v[l][0, :, :S].float()              # [Hkv, S, D]
                xq = q[0:1].view(1, Hkv, G, D).permute(1, 2, 0, 3).reshape(1, Hkv, G, D)
                o = fw._attention(xq, kk[None], vv[None], bias)                           # [1, Hkv, G, D]
                a = o.view(Hkv, G, 1, D).permute(2, 0, 1, 3).reshape(1, Hq * D)
            a = a.to(f.dtype)
            x = x + b.o(a)
            g, u = b.gu(f._rms(x, b.ln2)).chunk(2, -1)                                   # [R, I] each
            x = x + b.down(F.silu(g) * u)
        h = f._rms(x[:1], f.norm) if f.norm is not None else x[:1]
        logits = f.head(h).float()                                                        # [1, V]
        return f.vocab.scatter(logits) if f.vocab is not None else logits


def bucket(pos: int) -> int:
    """The key length a query at `pos` attends over (forward.py: a function of the position only)."""
    return fw.BLOCK * (pos // fw.BLOCK + 1)


@torch.inference_mode()
def matches_forward(f: fw.Forward, ctx: list[int], new: list[int]) -> tuple[bool, float]:
    """Decode `new` one token at a time after `ctx`, with Forward and with StaticStep (eager): are the logits
    bitwise equal? Returns (equal, max |difference|)."""
    cap = len(ctx) + len(new) + fw.BLOCK
    a, b = f.new_cache(capacity=cap), f.new_cache(capacity=cap)
    f.append(torch.tensor(ctx), a)
    f.append(torch.tensor(ctx), b)
    step = StaticStep(f, b)
    diff = 0.0
    for i, t in enumerate(new):
        ref = f.append(torch.tensor([t]), a)                                              # [1, V]
        step.set(t, len(ctx) + i)
        got = step(bucket(len(ctx) + i))
        b.lens[0] += 1
        diff = max(diff, float((ref - got).abs().max()))
    return diff == 0.0, diff


class GraphDecoder:
    """Greedy decoding with the one-token step replayed from CUDA graphs (one per key-length bucket).

    The prefill runs eagerly (Forward); each decode step is set() + replay(); the next token is the argmax on the
    device, fed back without a host round trip. Tokens are read back once, at the end."""

    def __init__(self, f: fw.Forward, capacity: int):
        if f.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        self.f = f
        self.cache = f.new_cache(capacity=capacity)         # fixed: graphs hold its addresses
        self.step = StaticStep(f, self.cache)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @torch.inference_mode()
    def _graph(self, S: int):
        if S not in self.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):                   # warm-up off the capture (allocator, cuBLAS handles)
                for _ in range(2):
                    self.step(S)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = self.step(S)
            self.graphs[S] = (g, out)
        return self.graphs[S]

    @torch.inference_mode()
    def logits(self, token, pos: int) -> torch.Tensor:
        """One decode step at `pos` (the cache holds positions < pos): logits [1, V], a buffer the next call
        overwrites. Advances the cache length."""
        self.step.set(token, pos)
        g, out = self._graph(bucket(pos))
        g.replay()
        self.cache.lens[0] = pos + 1
        return out

    @torch.inference_mode()
    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """n greedy tokens after `prompt` (the engine's order: the prompt's last token is the first step's input)."""
        if len(prompt) + n > self.cache.capacity:
            raise ValueError(f"prompt + {n} tokens exceed the fixed cache capacity {self.cache.capacity}")
        self.cache.lens[0] = 0
        if len(prompt) > 1:
            self.f.append(torch.tensor(prompt[:-1]), self.cache, last_only=True)
        tok = torch.tensor(prompt[-1], device=self.f.device)
        out = []
        for i in range(n):
            tok = self.logits(tok, len(prompt) - 1 + i)[0].argmax()
            out.append(tok)
        return torch.stack(out).tolist()
