"""EAGLE: a one-layer head that drafts at the feature level and proposes a tree shaped by its own confidence.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024);
Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (EMNLP 2024).

The feature f_t is the target's final hidden state at position t (the LM head's input; the engine hands the
newest one over through `observe`). Knowing f_{t-1} alone leaves the next token uncertain; knowing the token
x_t that was actually sampled from it removes that uncertainty (EAGLE's point), so the head reads both:

    x = fc([f_{t-1} ; embed(x_t)])  ->  one Llama decoder layer  ->  RMSNorm  ->  f^_t  ->  target LM head

and f^_t gives the draft distribution of x_{t+1}. The head runs autoregressively on its own predicted features:
f^_t and the drafted x_{t+1} give f^_{t+1}, and so on. Its attention sees the chain from the root (the pending
token, whose input is the target's true feature) down to the node, so every node of the tree attends to its
own branch only. The layer starts as a copy of the target's last layer; the embedding and LM head are the
target's, frozen and not shipped.

The tree (EAGLE-2's dynamic tree): from the root, each depth expands the `topk` nodes with the highest
cumulative draft probability (the product of draft probabilities along the path, an estimate of the chance
the path is accepted) into their `topk` most likely children; after `depth` levels (at most ctx.k) the
`nodes` best nodes of everything drafted are kept, which is prefix-closed since a child's cumulative
probability never exceeds its parent's. Candidates are each parent's top-ranked tokens, so they are
deterministic and verify_tree.py's exact rule applies unchanged: the output law is the target's. Training:
`python -m specdec_core train eagle`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..tree import compile_tree
from . import DraftContext, Drafter, DrafterUnavailable, Proposal
from .vocab import DraftVocab

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "eagle.safetensors"
MANIFEST = WEIGHTS.with_name("eagle.manifest.json")


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, L, h, d] rotated by positions pos [B, L] (Llama's half-split rotary embedding)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)   # [d/2]
    ang = pos.to(torch.float32)[..., None] * inv                                         # [B, L, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, :, None], torch.cat([ang.sin()] * 2, -1)[:, :, None]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return x * cos.to(x.dtype) + torch.cat([-b, a], -1) * sin.to(x.dtype)


class Head(nn.Module):
    """fc + one pre-norm Llama decoder layer + RMSNorm: (feature, next token's embedding) -> next feature."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, inter: int, theta: float = 10000.0,
                 eps: float = 1e-5, vocab: DraftVocab | None = None):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = heads, kv_heads, hidden // heads
        self.theta, self.eps = float(theta), float(eps)
        self.fc = nn.Linear(2 * hidden, hidden)
        self.ln1 = nn.Parameter(torch.ones(hidden))
        self.q = nn.Linear(hidden, heads * self.hd, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, hidden, bias=False)
        self.ln2 = nn.Parameter(torch.ones(hidden))
        self.gate = nn.Linear(hidden, inter, bias=False)
        self.up = nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.norm = nn.Parameter(torch.ones(hidden))
        self.vocab = vocab   # rank only these tokens (vocab.py); None = the whole vocabulary

    @classmethod
    def for_target(cls, model, vocab: DraftVocab | None = None) -> "Head":
        """A head shaped like the target's layers, its layer and norm copied from the target's last ones."""
        c = model.config
        theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta")
        head = cls(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                   theta or 10000.0, c.rms_norm_eps, vocab)
        last = model.model.layers[-1]
        with torch.no_grad():
            for mine, theirs in ((head.q, last.self_attn.q_proj), (head.k, last.self_attn.k_proj),
                                 (head.v, last.self_attn.v_proj), (head.o, last.self_attn.o_proj),
                                 (head.gate, last.mlp.gate_proj), (head.up, last.mlp.up_proj),
                                 (head.down, last.mlp.down_proj)):
                mine.weight.copy_(theirs.weight.float())
            head.ln1.copy_(last.input_layernorm.weight.float())
            head.ln2.copy_(last.post_attention_layernorm.weight.float())
            head.norm.copy_(model.model.norm.weight.float())
        return head

    def forward(self, f: torch.Tensor, e: torch.Tensor, pos: torch.Tensor, see: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """f, e [B, L, H] features and token embeddings; pos [B, L]; see [B, L, P + L] bool (which of the past
        P and these L entries each query attends to); past (k, v) [B, P, kv, d].
        -> predicted features [B, L, H], and this call's (k, v) [B, L, kv, d] to extend `past` with."""
        B, L, _ = f.shape
        x = self.fc(torch.cat([f, e], -1))                                                   # [B, L, H]
        y = _rms(x, self.ln1, self.eps)
        q = _rope(self.q(y).view(B, L, self.n_heads, self.hd), pos, self.theta)
        k = _rope(self.k(y).view(B, L, self.n_kv, self.hd), pos, self.theta)
        v = self.v(y).view(B, L, self.n_kv, self.hd)
        ks, vs = (k, v) if past is None else (torch.cat([past[0], k], 1), torch.cat([past[1], v], 1))
        rep = self.n_heads // self.n_kv
        a = F.scaled_dot_product_attention(q.transpose(1, 2), ks.repeat_interleave(rep, 2).transpose(1, 2),
                                           vs.repeat_interleave(rep, 2).transpose(1, 2), attn_mask=see[:, None])
        x = x + self.o(a.transpose(1, 2).reshape(B, L, -1))
        y = _rms(x, self.ln2, self.eps)
        x = x + self.down(F.silu(self.gate(y)) * self.up(y))
        return _rms(x, self.norm, self.eps), (k, v)


def head_weight(head: Head, lm_head: nn.Module) -> torch.Tensor:
    """The rows of the target's LM head the draft scores: [v, H] (all V rows without a vocabulary)."""
    w = lm_head.weight
    return head.vocab.head(w) if head.vocab is not None else w


def load_head(model, path: Path = WEIGHTS) -> tuple[Head, dict]:
    """The shipped head (for `model`'s shapes) and its manifest."""
    from safetensors import safe_open
    if not path.exists():
        raise DrafterUnavailable(f"no EAGLE head at {path.name}: train it with `python -m specdec_core train eagle`")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        sd = {k: f.get_tensor(k) for k in f.keys()}
    man = path.with_name(path.stem + ".manifest.json")
    manifest = json.loads(man.read_text()) if man.exists() else {}
    ids = sd.pop("draft_vocab", None)
    head = Head.for_target(model, DraftVocab(ids, int(meta["vocab_size"])) if ids is not None else None)
    head.load_state_dict({k: v.float() for k, v in sd.items()})
    return head.eval(), manifest


class Eagle(Drafter):
    name = "eagle"
    reads_hidden = True   # the engine hands over the target's hidden state (observe)

    def __init__(self, target, head: Head | None = None, manifest: dict | None = None, depth: int | None = None,
                 topk: int | None = None, nodes: int | None = None):
        from ..models import BUNDLED_NAME
        if head is None:
            if target.name != BUNDLED_NAME:
                raise DrafterUnavailable(f"drafter 'eagle' has a trained head only for the bundled target, not "
                                         f"{target.name!r}: train one with `python -m specdec_core train eagle`")
            head, manifest = load_head(target.model)
        manifest = manifest or {}
        if head.fc.out_features != int(target.model.config.hidden_size):
            raise DrafterUnavailable(f"the EAGLE head was trained for hidden size {head.fc.out_features}, "
                                     f"this target has {target.model.config.hidden_size}")
        want = manifest.get("target")
        if want and want != target.name:
            raise DrafterUnavailable(f"the EAGLE head was trained for {want!r}, not {target.name!r}")
        tree = manifest.get("tree", {})
        self.depth = int(depth or tree.get("depth", 5))
        self.topk = int(topk or tree.get("topk", 4))
        self.nodes = int(nodes or tree.get("nodes", 12))
        self.default_k = self.depth
        self.target, self.manifest = target, manifest
        self.head = head.to(target.device)
        self.embed = target.model.get_input_embeddings()
        self.head_w = head_weight(head, target.model.get_output_embeddings()).float()   # [v, H]
        self.ids = head.vocab.ids.to(target.device) if head.vocab is not None else None
        self.h, self.h_len = None, -1

    def begin(self, prompt: list[int]) -> None:
        self.h, self.h_len = None, -1

    def observe(self, h: torch.Tensor, n: int) -> None:
        self.h, self.h_len = h, n

    def _step(self, f, tok, pos, see, past):
        """One level: features f [m, H] and tokens tok [m] -> (features [m, H], log-probs [m, v], (k, v))."""
        e = self.embed(tok.to(self.embed.weight.device)).float()
        out, kv = self.head(f[None], e[None], pos[None], see[None], past)
        logp = torch.log_softmax(F.linear(out[0], self.head_w), -1)
        return out[0], logp, kv

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Proposal:
        # the root (the pending token) must be the one drawn from self.h: exactly one token after it
        if self.h is None or len(ctx.tokens) != self.h_len + 1 or ctx.k < 1:
            return Proposal.empty()
        depth, K = min(ctx.k, self.depth), self.topk
        dev = self.head_w.device
        # every node drafted: parent index (-1 = root), rank among its parent's candidates, token, cum. log-prob
        parent, rank, tok, score = [], [], [], []
        run_of: dict[int, int] = {-1: 0}      # drafted node -> its row among the nodes the head has run
        anc = [[0]]                           # per run row: the run rows of its branch, itself last
        f, logp, past_kv = self._step(self.h.float()[None].to(dev), torch.tensor([ctx.tokens[-1]]),
                                   torch.zeros(1, dtype=torch.long, device=dev),
                                   torch.ones(1, 1, dtype=torch.bool, device=dev), None)
        feats = f                                                        # [R, H] features of run rows
        lp, ix = torch.topk(logp, K, -1)                                 # [m, K]
        frontier = [-1]                                                  # parents of the rows just run
        for d in range(1, depth + 1):
            new = []
            for r, par in enumerate(frontier):
                base = 0.0 if par < 0 else score[par]
                for j in range(K):
                    parent.append(par)
                    rank.append(j)
                    tok.append(int(self._tok(ix[r, j])))
                    score.append(base + float(lp[r, j]))
                    new.append(len(tok) - 1)
            if d == depth:
                break
            frontier = sorted(new, key=lambda i: -score[i])[:K]          # expand the likeliest K of this level
            R = feats.shape[0]
            rows = []
            for i in frontier:
                run_of[i] = R + len(rows)
                rows.append(anc[run_of[parent[i]]] + [run_of[i]])
            anc += rows
            see = torch.zeros(len(rows), R + len(rows), dtype=torch.bool, device=dev)
            for a, branch in enumerate(rows):
                see[a, branch] = True
            f, logp, kv = self._step(feats[[run_of[parent[i]] for i in frontier]],
                                     torch.tensor([tok[i] for i in frontier]),
                                     torch.full((len(rows),), d, dtype=torch.long, device=dev), see, past_kv)
            feats = torch.cat([feats, f])
            past_kv = (torch.cat([past_kv[0], kv[0]], 1), torch.cat([past_kv[1], kv[1]], 1))
            lp, ix = torch.topk(logp, K, -1)
        return self._tree(parent, rank, tok, score)

    def _tok(self, i: torch.Tensor) -> int:
        return int(self.ids[i]) if self.ids is not None else int(i)

    def _tree(self, parent, rank, tok, score) -> Proposal:
        """Keep the `nodes` likeliest drafted nodes (prefix-closed), as rank paths and tokens in tree order."""
        keep, path = set(), {}
        for i in sorted(range(len(tok)), key=lambda i: (-score[i], i)):
            if len(keep) == self.nodes:
                break
            p = parent[i]
            if p >= 0 and p not in keep:      # a tie at probability 1 could list a child first: skip it
                continue
            keep.add(i)
            path[i] = (path[p] if p >= 0 else ()) + (rank[i],)
        tree = compile_tree(list(path.values()))
        by_path = {path[i]: tok[i] for i in keep}
        nodes = torch.tensor([by_path[p] for p in tree.paths], dtype=torch.long)
        return Proposal(nodes, tree=tree, info={"nodes": len(keep), "depth": tree.max_depth,
                                                "draft_p": round(math.exp(max(score[i] for i in keep)), 4)})
