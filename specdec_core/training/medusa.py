"""`python -m specdec_core train medusa`: self-distil Medusa heads from the bundled target.

Cai et al., "Medusa" (2024): Medusa-1 training (frozen backbone) with Medusa-2's self-distillation, i.e. the
heads learn the target's own distributions on the target's own answers, by KL.

Data: common.data() — the target's greedy answers to distill.training_prompts() with its top-64
log-probs at every answer position; the heads score the draft vocabulary only (drafters/vocab.py). One frozen
target pass stores the final hidden state h_t at every answer position; head i at t is trained towards the
target's distribution at t+1+i (the token t+2+i), weight 0.8^i.
Then, on the held-out prompts: each head's top-k accuracy, a tree picked from it (Medusa's greedy
construction, tree.best_tree) at the size with the best predicted tokens per second given the measured cost of
a tree forward, and the mean acceptance length of the shipped heads measured with the real engine.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..drafters import target_record
from ..drafters.medusa import Heads, Medusa, head_weight, load_heads, ranked
from ..tree import best_tree, compile_tree
from . import distill
from .common import (WEIGHTS, acceptance, add_temps, heldout, load_target, prepare, rewrite_manifest, schedule,
                     time_forward, vocab_desc, write_manifest)

SIZES = (3, 7, 11, 15, 23, 31, 47)   # tree sizes (nodes after the root) considered: with the root they fill
                                     # our forward's row blocks of 4 (backend.row_block), which a node past
                                     # a block's end would make the target multiply in full
TOPK = 8                             # ranks per head measured


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m specdec_core train medusa",
                                 description="self-distil Medusa heads from the bundled target")
    ap.add_argument("--heads", type=int, default=4, help="number of heads (tree depth at most this)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=512, help="positions per step")
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (tokens the heads rank)")
    ap.add_argument("--lr", type=float, default=3e-3)
    add_temps(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--n-prompts", type=int, default=None, help="use only the first N training prompts")
    ap.add_argument("--eval-prompts", type=int, default=6, help="held-out prompts measured")
    ap.add_argument("--eval-tokens", type=int, default=96, help="new tokens per held-out prompt")
    ap.add_argument("--out", type=Path, default=WEIGHTS, help="folder for the weights and manifest")
    ap.add_argument("--retree", action="store_true", help="keep the heads in --out; choose their tree again "
                    "(from the manifest's head accuracies and this machine's measured tree costs) and re-measure "
                    "the held-out acceptance")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.lr <= 0 or not 1 <= a.heads <= 8:
        ap.error("need --steps >= 1, --batch >= 1, --lr > 0 and 1 <= --heads <= 8")
    return a


@torch.inference_mode()
def hidden_states(lm, seqs: list[list[int]], batch_size: int = 8) -> list[torch.Tensor]:
    """Final hidden state (the LM head's input) at every position of each sequence, [n, H] bf16."""
    dec = lm.model.get_decoder()
    out = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for b in tqdm(range(0, len(order), batch_size), desc="target hidden states", unit="batch"):
        idx = order[b:b + batch_size]
        n = max(len(seqs[i]) for i in idx)
        ids = torch.tensor([seqs[i] + [0] * (n - len(seqs[i])) for i in idx])  # right pad: causal, never seen
        h = dec(input_ids=ids.to(lm.device)).last_hidden_state
        for r, i in enumerate(idx):
            out[i] = h[r, :len(seqs[i])].to(torch.bfloat16).cpu()
    return out


def examples(rows, hs, n_heads: int):
    """Flatten to positions: H [P, d], and per head the global soft-target row (or -1 past the end)."""
    H, target, IDX, LOGP = [], [], [], []
    base = 0
    for (s, pl, ti, tl), h in zip(rows, hs):
        n = len(s)
        t = torch.arange(pl - 1, n - 1)                                      # positions predicting answer tokens
        H.append(h[t])
        rows_i = torch.stack([t + 1 + i for i in range(n_heads)], 1)         # [P_s, D] row t+1+i: token t+2+i
        target.append(torch.where(rows_i <= n - 2, rows_i + base, torch.full_like(rows_i, -1)))
        IDX.append(ti)
        LOGP.append(tl)
        base += ti.shape[0]
    return torch.cat(H), torch.cat(target), torch.cat(IDX).long(), torch.cat(LOGP).float()


def head_accuracy(lm, heads, held, topk: int = TOPK) -> list[list[float]]:
    """acc[d][r]: on held-out greedy answers, how often head d's rank-r token is the target's token t+2+d."""
    w = head_weight(heads, lm.model.get_output_embeddings())
    hits = torch.zeros(heads.n_heads, topk)
    n = torch.zeros(heads.n_heads)
    hs = hidden_states(lm, [s for s, *_ in held])
    with torch.inference_mode():
        for (s, pl, ti, _), h in zip(held, hs):
            t = torch.arange(pl - 1, len(s) - 1)
            top = ranked(heads, w, h[t], topk)                                            # [D, P, k]
            for d in range(heads.n_heads):
                ok = t + 1 + d <= len(s) - 2
                want = ti[(t + 1 + d)[ok], 0].long()                                       # greedy token t+2+d
                hits[d] += (top[d][ok] == want[:, None]).float().sum(0)
                n[d] += int(ok.sum())
    return (hits / n.clamp(min=1)[:, None]).tolist()


def tree_cost(lm, sizes, reps: int = 5) -> dict[int, float]:
    """Seconds per verification forward for a tree of each size (best of reps, warm cache)."""
    ids = lm.encode(distill.HELDOUT[0])
    cache = lm.new_cache()
    lm.forward(ids, cache)
    out = {}
    for T in (0,) + tuple(sizes):
        tree = compile_tree([(r,) for r in range(T)])   # cost depends on the node count, not the shape
        nodes = torch.randint(100, 1000, (T + 1,))
        out[T] = time_forward(lambda: (lm.tree_forward(cache, nodes, tree), cache.crop(-(T + 1))), reps)
    return out


def choose_tree(acc, cost: dict[int, float]):
    """The size with the most predicted committed tokens per second; E = 1 + sum of path reach probabilities."""
    table = {}
    for T in cost:
        if T == 0:
            continue
        paths = best_tree(acc, T)
        reach = {(): 1.0}
        for p in paths:
            reach[p] = reach[p[:-1]] * acc[len(p) - 1][p[-1]]
        e = sum(reach.values())
        table[T] = dict(expected_length=round(e, 4), forward_ms=round(cost[T] * 1e3, 2),
                        tokens_per_forward_second=round(e / cost[T], 2), paths=paths)
    best = max(table, key=lambda T: table[T]["tokens_per_forward_second"])
    return best, table


def pick_tree(lm, heads, acc, eval_prompts: int, eval_tokens: int) -> dict:
    """The tree for these heads on this machine: the size with the most predicted tokens per second of measured
    tree-forward time, and its held-out acceptance measured with the engine -> the manifest's fields."""
    cost = tree_cost(lm, SIZES)
    size, table = choose_tree(acc, cost)
    paths = table[size]["paths"]
    print(f"tree: {size} nodes, predicted mean acceptance length {table[size]['expected_length']}")
    drafter = Medusa(lm, heads, manifest=dict(target=lm.name, tree=[list(p) for p in paths]))
    res = acceptance(lm, drafter, distill.HELDOUT[:eval_prompts], drafter.default_k, eval_tokens)
    return dict(tree=[list(p) for p in paths], tree_choice=dict(
        chosen=size, how="Medusa's greedy tree from the head accuracies at each size; the size with the most "
        "predicted tokens per second of measured tree-forward time",
        sizes={T: {k: v for k, v in row.items() if k != "paths"} for T, row in table.items()},
        one_token_forward_ms=round(cost[0] * 1e3, 2)), acceptance=res)


def retree(a) -> int:
    """--retree: the shipped heads kept, their tree chosen again and its acceptance re-measured."""
    lm = load_target(a.threads)
    heads, man = load_heads(a.out / "medusa.safetensors")
    rewrite_manifest("medusa", a.out, pick_tree(lm, heads, man["head_accuracy"]["acc"], a.eval_prompts,
                                                a.eval_tokens), "python -m specdec_core train medusa --retree")
    return 0


def main(argv: list[str]) -> int:
    a = _args(argv)
    if a.retree:
        return retree(a)
    t_start = time.perf_counter()
    lm, rows, desc, vocab = prepare(a)
    hs = hidden_states(lm, [r[0] for r in rows])
    H, tgt, IDX, LOGP = examples(rows, hs, a.heads)
    print(f"{H.shape[0]} training positions, {a.heads} heads")
    heads = Heads(H.shape[1], a.heads, vocab).train()
    head_w = head_weight(heads, lm.model.get_output_embeddings()).detach()           # [v, H] frozen, no grad
    opt = torch.optim.AdamW(heads.parameters(), lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    wts = [0.8 ** i for i in range(a.heads)]
    ema = [None] * a.heads
    t0 = time.perf_counter()
    bar = tqdm(range(a.steps), desc=f"train medusa ({a.heads} heads)", unit="step")
    for step in bar:
        pick = torch.randint(H.shape[0], (a.batch,), generator=gen)
        schedule(opt, step, a.steps, a.lr)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = F.linear(heads(H[pick].float()), head_w)                # [D, B, v]
        logq = torch.log_softmax(logits.float(), -1)
        loss, parts = 0.0, []
        for i in range(a.heads):
            r = tgt[pick, i]
            ok = r >= 0
            ce = distill.soft_ce(logq[i][ok], *vocab.targets(IDX[r[ok]], LOGP[r[ok]]))
            loss = loss + wts[i] * ce
            parts.append(ce.item() - distill.entropy_top(LOGP[r[ok]]))   # shown as KL(p || q)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
        opt.step()
        ema = [x if e is None else 0.95 * e + 0.05 * x for e, x in zip(ema, parts)]
        bar.set_postfix({f"kl{i}": f"{e:.2f}" for i, e in enumerate(ema)})
    train_s = time.perf_counter() - t0
    heads.eval()

    from safetensors.torch import save_file
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "medusa.safetensors"
    save_file({"w": heads.w.detach().contiguous(), "b": heads.b.detach().contiguous(), **vocab.state()}, str(path),
              metadata={"heads": str(a.heads), "seed": str(a.seed), "vocab_size": str(lm.vocab_size)})
    shipped, _ = load_heads(path)   # measure exactly what ships

    held = heldout(lm, a.eval_prompts)
    acc = head_accuracy(lm, shipped, held)
    for d, row in enumerate(acc):
        print(f"head {d} (token t+{d + 2}): top-1 {row[0]:.3f}, top-{TOPK} {sum(row):.3f}")
    picked = pick_tree(lm, shipped, acc, a.eval_prompts, a.eval_tokens)
    write_manifest("medusa", a, argv, path, dict(
        **target_record(lm), tree=picked["tree"],
        model=dict(heads=a.heads, hidden=H.shape[1], block="h + SiLU(W h + b), zero-initialised, then the "
                   "target's shared LM head (frozen, not shipped) over the draft vocabulary",
                   head_i_predicts="token t+2+i", dtype="float32"),
        vocab=vocab_desc(vocab, rows, held),
        data=dict(desc, positions=int(H.shape[0])), steps=a.steps, batch=a.batch, lr=a.lr,
        loss="sum_i 0.8^i KL(p_{t+1+i} || q_i) over the target's top-64 + rest",
        final_loss=[round(e, 4) for e in ema], train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        head_accuracy=dict(how=f"held-out greedy answers: P(rank-r token of head d = the target's token), "
                               f"r < {TOPK}", acc=[[round(x, 4) for x in row] for row in acc]),
        tree_choice=picked["tree_choice"], acceptance=picked["acceptance"]))
    return 0
