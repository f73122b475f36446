"""`python -m specdec_core train eagle`: self-distil an EAGLE head from the bundled target.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024); the tree it
drafts is EAGLE-2's (Li et al., EMNLP 2024), see drafters/eagle.py.

Data: common.data() — the target's greedy answers to distill.training_prompts() with its top-64 log-probs at
every answer position — plus one frozen target pass for the final hidden state f_t at every position
(medusa.hidden_states). A training example is a window of W consecutive answer positions t0..t0+W-1: the
head's input at window position j is (f_{t0+j-1}, token x_{t0+j}) and it must predict f_{t0+j} and the
target's distribution of x_{t0+j+1}, attending causally within the window (the chain from the root, as when
drafting). Loss, as EAGLE: smooth L1 on the feature + cross-entropy to the target's soft targets through the
frozen LM head (over the draft vocabulary), shown as KL.

Drafting feeds the head its own predicted features (only the root's is the target's), which teacher forcing
never shows it. So each step also runs the window again (--unroll passes in all), replacing inputs 1.. with
the previous pass's predictions (after pass p, positions 0..p hold exactly what drafting computes; --unroll W
makes every position exact), and the last pass's outputs are trained too (as HASS / EAGLE-3's training-time
test do). On 2 shared cores each pass costs, so the default is 2.

Then, on the held-out prompts: the engine's greedy mean acceptance length and wall time for a few tree
budgets (depth x top-k x nodes); the budget with the most tokens per second ships in the manifest. (The
held-out prompts are run by the engine directly: no held-out answers are generated beforehand, which on 2
shared cores cost minutes.)
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..drafters import target_record
from ..drafters.eagle import Eagle, Head, head_weight, load_head
from . import distill
from .common import (WEIGHTS, acceptance, add_temps, load_target, prepare, rewrite_manifest, schedule,
                     target_step_cost, time_forward, write_manifest)
from .medusa import hidden_states

W_CE = 1.0                                   # weight of the distribution loss against the feature loss
TREES = "3x3x11,4x3x11,4x3x15"   # depth x topk x nodes (the most, when sized): budgets measured on held-out prompts


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m specdec_core train eagle",
                                 description="self-distil an EAGLE head from the bundled target")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=48, help="windows per step")
    ap.add_argument("--window", type=int, default=5, help="positions per window (the deepest chain trained)")
    ap.add_argument("--unroll", type=int, default=2, help="passes per window: 1 = teacher forcing only; "
                    "--window = every position sees exactly what drafting computes")
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (tokens the head ranks)")
    ap.add_argument("--lr", type=float, default=5e-4)
    add_temps(ap)
    ap.add_argument("--minutes", type=float, default=0, help="cap on training time (0 = none): the schedule "
                    "runs on max(step / steps, time / cap), so a slow, shared machine ends early, annealed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--n-prompts", type=int, default=None, help="use only the first N training prompts")
    ap.add_argument("--trees", default=TREES, help="tree budgets measured, DEPTHxTOPKxNODES,...; the fastest ships")
    ap.add_argument("--init", type=Path, default=None, help="start from this trained head (eagle.safetensors) "
                    "instead of the target's last layer")
    ap.add_argument("--retree", action="store_true", help="keep the head in --out; choose its tree budget again "
                    "on this machine and re-measure the held-out acceptance")
    ap.add_argument("--fixed", action="store_true", help="verify NODES nodes every step; by default each tree is "
                    "sized by the target's measured cost of its rows (policy.tree_budget), NODES the most")
    ap.add_argument("--eval-prompts", type=int, default=3, help="held-out prompts measured")
    ap.add_argument("--eval-tokens", type=int, default=64, help="new tokens per held-out prompt")
    ap.add_argument("--out", type=Path, default=WEIGHTS, help="folder for the weights and manifest")
    a = ap.parse_args(argv)
    try:
        a.trees = [tuple(int(x) for x in t.split("x")) for t in a.trees.split(",")]
        assert all(len(t) == 3 and min(t) >= 1 for t in a.trees)
    except (ValueError, AssertionError):
        ap.error(f"--trees wants DEPTHxTOPKxNODES,..., got {a.trees!r}")
    if a.steps < 1 or a.batch < 1 or a.lr <= 0 or not 1 <= a.window <= 16 or not 1 <= a.unroll <= a.window:
        ap.error("need --steps >= 1, --batch >= 1, --lr > 0, 1 <= --window <= 16, 1 <= --unroll <= --window")
    return a


def examples(rows, hs, W: int):
    """Flatten: features Hc [P, H] bf16, tokens [P], soft-target row of each position [P] (-1: none), and the
    global index of every window start t0 (answer positions with t0 >= 1 and a soft target at t0 + W - 1)."""
    H, tok, drow, starts = [], [], [], []
    base_h = base_d = 0
    for (s, pl, ti, _), h in zip(rows, hs):
        n = len(s)
        H.append(h)
        tok.append(torch.tensor(s))
        r = torch.full((n,), -1, dtype=torch.long)
        r[:n - 1] = torch.arange(n - 1) + base_d          # row t of this sequence's targets: the token t+1
        drow.append(r)
        starts += [base_h + t for t in range(max(pl - 1, 1), n - W)]   # t0 + W - 1 <= n - 2
        base_h += n
        base_d += ti.shape[0]
    return torch.cat(H), torch.cat(tok), torch.cat(drow), torch.tensor(starts)


def unrolled(head: Head, f0, e, pos, see, passes: int) -> list[torch.Tensor]:
    """Pass 0 is teacher-forced; pass p feeds back pass p-1's features (the root keeps the true one)."""
    outs = [head(f0, e, pos, see)[0]]
    for _ in range(passes - 1):
        f = torch.cat([f0[:, :1], outs[-1][:, :-1].to(f0.dtype)], 1)
        outs.append(head(f, e, pos, see)[0])
    return outs


def main(argv: list[str]) -> int:
    a = _args(argv)
    if a.retree:
        return retree(a)
    t_start = time.perf_counter()
    lm, rows, desc, vocab = prepare(a)
    hs = hidden_states(lm, [r[0] for r in rows])
    Hc, TOK, DROW, starts = examples(rows, hs, a.window)
    IDX = torch.cat([r[2] for r in rows]).long()
    LOGP = torch.cat([r[3] for r in rows]).float()
    print(f"{len(starts)} training windows of {a.window} positions")
    head = Head.for_target(lm.model, vocab).train()
    if a.init:   # go on from a trained head (its draft vocabulary must be the one picked here)
        start, _ = load_head(lm.model, a.init)
        if start.vocab is None or not torch.equal(start.vocab.ids, vocab.ids):
            raise SystemExit(f"--init {a.init}: its draft vocabulary differs from this data's; train from scratch")
        head.load_state_dict(start.state_dict())
    emb = lm.model.get_input_embeddings().weight.detach()                           # [V, H] frozen
    head_w = head_weight(head, lm.model.get_output_embeddings()).detach()          # [v, H] frozen
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    W = a.window
    pos = torch.arange(W).expand(a.batch, W)
    see = torch.ones(W, W, dtype=torch.bool).tril().expand(a.batch, W, W)
    ema: dict[str, float] = {}
    t0 = time.perf_counter()
    bar = tqdm(range(a.steps), desc="train eagle", unit="step")
    done = 0
    for step in bar:
        el = (time.perf_counter() - t0) / 60
        eff = max(step, int(a.steps * el / a.minutes)) if a.minutes else step
        if eff >= a.steps:
            break
        done = step + 1
        g = starts[torch.randint(len(starts), (a.batch,), generator=gen)][:, None] + torch.arange(W)   # [B, W]
        f0, target = Hc[g - 1].float(), Hc[g].float()                                   # [B, W, H]
        e = emb[TOK[g]].float()
        d, lp = vocab.targets(IDX[DROW[g].flatten()], LOGP[DROW[g].flatten()])
        ent = distill.entropy_top(LOGP[DROW[g].flatten()])
        schedule(opt, eff, a.steps, a.lr)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = unrolled(head, f0, e, pos, see, a.unroll)
            parts = {}
            for name, out in (("tf", outs[0]), ("unroll", outs[-1])):
                reg = F.smooth_l1_loss(out.float(), target)
                logq = torch.log_softmax(F.linear(out, head_w).float().flatten(0, 1), -1)    # [B W, v]
                parts[name] = (reg, distill.soft_ce(logq, d, lp))
        loss = sum(r + W_CE * c for r, c in parts.values()) / len(parts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        shown = {"reg": parts["unroll"][0].item(), "kl tf": parts["tf"][1].item() - ent,
                 "kl unroll": parts["unroll"][1].item() - ent}
        ema = {k: v if k not in ema else 0.95 * ema[k] + 0.05 * v for k, v in shown.items()}
        bar.set_postfix({k: f"{v:.3f}" for k, v in ema.items()})
    train_s = time.perf_counter() - t0
    head.eval()

    from safetensors.torch import save_file
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "eagle.safetensors"
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}   # bf16: half the MB
    save_file({**sd, **vocab.state()}, str(path),
              metadata={"window": str(W), "seed": str(a.seed), "vocab_size": str(lm.vocab_size)})
    shipped, _ = load_head(lm.model, path)   # measure exactly what ships

    picked = pick_tree(lm, shipped, a)
    write_manifest("eagle", a, argv, path, dict(
        **target_record(lm),
        model=dict(hidden=int(Hc.shape[1]), block="fc([f ; embed(x)]) -> one Llama decoder layer (started as "
                   "the target's last layer) -> RMSNorm -> the target's LM head (frozen, not shipped) over the "
                   "draft vocabulary", feature="the target's final-norm hidden state (the LM head's input)",
                   params=sum(p.numel() for p in head.parameters()),
                   dtype="bfloat16 (stored); drafting runs packed products in the target's dtype"),
        vocab=dict(size=len(vocab.ids), train_coverage=round(vocab.coverage([r[0] for r in rows],
                   [r[1] for r in rows]), 4), how="as the other trained drafters (training/common.py make_vocab)"),
        data=dict(desc, windows=len(starts), window=W), unroll=a.unroll, steps=done, steps_planned=a.steps,
        minutes_cap=a.minutes, batch=a.batch, lr=a.lr,
        loss=f"mean over (teacher-forced pass, last unrolled pass) of smooth_L1(f^, f) + {W_CE} * "
             "CE(p || q) over the target's top-64 + rest; final_loss shows CE as KL",
        final_loss={k: round(v, 4) for k, v in ema.items()}, train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        **picked))
    return 0


def pick_tree(lm, head: Head, a) -> dict:
    """The tree budget for this head on this machine (held-out greedy engine runs for each of --trees; the most
    committed tokens per second of wall time ships), its acceptance there, and the draft's cost -> the
    manifest's tree, tree_choice, draft_cost and acceptance (with the block costs a sized tree weighed)."""
    prompts = distill.HELDOUT[:a.eval_prompts]
    table = {}
    for depth, topk, nodes in a.trees:
        dr = Eagle(lm, head, manifest={"target": lm.name}, depth=depth, topk=topk, nodes=nodes, sized=not a.fixed)
        t = time.perf_counter()
        res = acceptance(lm, dr, prompts, depth, a.eval_tokens)
        secs = time.perf_counter() - t
        committed = sum(r["committed"] for r in res["per_prompt"])
        table[f"{depth}x{topk}x{nodes}"] = dict(depth=depth, topk=topk, nodes=nodes, result=res,
                                                 tokens_per_second=round(committed / secs, 2))
        print(f"tree depth {depth}, top-{topk}, {nodes} nodes: mean acceptance length "
              f"{res['mean_acceptance_length']}, {committed / secs:.1f} tokens/s")
    best = max(table.values(), key=lambda r: r["tokens_per_second"])
    tree = dict(depth=best["depth"], topk=best["topk"], nodes=best["nodes"], sized=not a.fixed)
    dr = Eagle(lm, head, manifest={"target": lm.name, "tree": tree})
    ids = lm.encode(prompts[0])
    cache = lm.new_cache()
    _, h = lm.forward(ids, cache, last_only=True, hidden=True)
    dr.observe(h[-1], len(ids))
    from ..drafters import DraftContext
    from ..sampling import SamplingParams
    ctx = DraftContext(tokens=ids.tolist() + [int(ids[-1])], prompt_len=len(ids), k=tree["depth"],
                       sp=SamplingParams(), gen=None)
    draft_s = time_forward(lambda: dr.propose(ctx), reps=5)
    return dict(
        tree=tree,
        tree_choice=dict(how="held-out greedy engine runs for each budget; the most committed tokens per "
                         "second of wall time ships", budgets={k: dict(mean_acceptance_length=v["result"]
                         ["mean_acceptance_length"], tokens_per_second=v["tokens_per_second"])
                         for k, v in table.items()}),
        draft_cost=dict(propose_ms=round(draft_s * 1e3, 2),
                        one_token_forward_ms=round(target_step_cost(lm) * 1e3, 2)),
        acceptance=dict(best["result"], block_ms=[round(x, 3) for x in dr.costs]))


def retree(a) -> int:
    """--retree: the head in --out kept, its tree budget chosen again on this machine and its acceptance
    re-measured (after a change to how trees are sized or verified, or on another machine)."""
    lm = load_target(a.threads)
    head, _ = load_head(lm.model, a.out / "eagle.safetensors")
    rewrite_manifest("eagle", a.out, pick_tree(lm, head, a), "python -m specdec_core train eagle --retree --trees "
                     + ",".join("x".join(map(str, t)) for t in a.trees) + (" --fixed" if a.fixed else ""))
    return 0
