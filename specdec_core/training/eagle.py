"""`python -m specdec_core train eagle`: self-distil an EAGLE head from the bundled target.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (ICML 2024); the tree it
drafts is EAGLE-2's (Li et al., EMNLP 2024), see drafters/eagle.py.

Data: common.data() — the target's answers to distill.training_prompts() with its top-64 log-probs at every
position — plus one frozen target pass for the final hidden state f_t at every position
(medusa.hidden_states). A training example is a whole sequence (prompt and answer; a crop of --crop rows when
longer): row t reads (f_{t-1}, token x_t) at position t and must predict f_t and the target's distribution of
x_{t+1}, attending causally to every row before it, as the head's cache lets it when drafting. The answer's
rows are trained; the prompt's are context. Loss, as EAGLE: smooth L1 on the feature + cross-entropy to the
target's soft targets through the frozen LM head (over the draft vocabulary), shown as KL.

Drafting feeds the head its own predicted features below the root (only the root's is the target's), which
teacher forcing never shows it. So each step also runs the crop again (--unroll passes in all): pass p reads
pass p-1's predictions and sees, at row t, the true rows up to t - p and its own chain of passes 1..p
(`reach`), so its row t is exactly what drafting computes at depth p below the root x_{t-p}; the last pass's
outputs are trained too (HASS's and EAGLE-3's training-time test).

Then, on the held-out prompts: the engine's greedy mean acceptance length and wall time for a few tree
budgets (depth x top-k x nodes); the budget with the most tokens per second ships in the manifest. (The
held-out prompts are run by the engine directly: no held-out answers are generated beforehand, which on 2
shared cores cost minutes.)
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..drafters import target_record
from ..drafters.eagle import Eagle, Head, head_weight, load_head
from . import distill
from .common import (WEIGHTS, acceptance, add_temps, data, load_target, make_vocab, prepare, rewrite_manifest,
                     schedule, target_step_cost, time_forward, weights_record, write_manifest)
from .medusa import hidden_states

W_CE = 1.0                                   # weight of the distribution loss against the feature loss
TREES = "3x3x11,4x3x11,4x3x15"   # depth x topk x nodes (the most, when sized): budgets measured on held-out prompts


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m specdec_core train eagle",
                                 description="self-distil an EAGLE head from the bundled target")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8, help="sequences (crops) per step")
    ap.add_argument("--crop", type=int, default=160, help="rows per crop at most (a longer sequence is cropped)")
    ap.add_argument("--unroll", type=int, default=3, help="passes per crop: 1 = teacher forcing only; pass p "
                    "trains what drafting computes at depth p")
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
    ap.add_argument("--narrow", type=int, default=0, metavar="N", help="keep the head in --out; keep only the N "
                    "tokens of its draft vocabulary with the most target mass over the training answers (its "
                    "LM-head rows a subset of those it learned to rank: no retraining), then choose its tree again")
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
    if a.steps < 1 or a.batch < 1 or a.lr <= 0 or a.crop < 8 or not 1 <= a.unroll <= 8:
        ap.error("need --steps >= 1, --batch >= 1, --lr > 0, --crop >= 8, 1 <= --unroll <= 8")
    return a


def sequences(rows, hs):
    """Per training sequence: (features [n, H] bf16, tokens [n], soft-target row of each position [n] (-1: none),
    the first row trained). Row t of a sequence reads (f_{t-1}, x_t) and predicts f_t and x_{t+1}, whose soft
    target is the sequence's dists row t; rows from the answer's first prediction on are trained (the prompt's
    rows are context only), so a sequence needs n >= 3."""
    out, base = [], 0
    for (s, pl, ti, _), h in zip(rows, hs):
        n = len(s)
        d = torch.full((n,), -1, dtype=torch.long)
        d[:n - 1] = torch.arange(n - 1) + base            # row t of this sequence's targets: the token t+1
        base += ti.shape[0]
        if n >= 3:
            out.append((h, torch.tensor(s), d, max(pl - 1, 1)))
    return out


def crops(seqs, pick: torch.Tensor, L: int, gen: torch.Generator):
    """A batch of crops of at most L rows (rows t >= 1), one per picked sequence, right padded ->
    f0 [B, L, H] (f_{t-1}), target [B, L, H] (f_t), tokens [B, L] (x_t), pos [B, L] (t), drow [B, L] (-1: not
    trained: prompt rows, padding, the last position). A crop keeps everything before it out of reach; crops
    start where the answer's rows fit in L (a sequence longer than that is cropped at a random start)."""
    B, H = len(pick), seqs[0][0].shape[1]
    f0, tgt = torch.zeros(B, L, H, dtype=seqs[0][0].dtype), torch.zeros(B, L, H, dtype=seqs[0][0].dtype)
    tok, pos, drow = (torch.zeros(B, L, dtype=torch.long) for _ in range(3))
    drow -= 1
    for b, i in enumerate(pick.tolist()):
        h, s, d, a0 = seqs[i]
        n = len(s)
        lo = max(1, min(a0, n - L))                        # the crop [a, a + m): as much context as fits
        a = lo if n - lo <= L else int(torch.randint(lo, n - L + 1, (1,), generator=gen))
        m = min(L, n - a)
        f0[b, :m], tgt[b, :m], tok[b, :m] = h[a - 1:a + m - 1], h[a:a + m], s[a:a + m]
        pos[b, :m] = torch.arange(a, a + m)
        keep = torch.arange(a, a + m) >= a0
        drow[b, :m] = torch.where(keep, d[a:a + m], -1)
    return f0, tgt, tok, pos, drow


def reach(L: int, p: int) -> torch.Tensor:
    """Who row t of unrolled pass p sees, over the keys of passes 0..p side by side: [L, (p + 1) L] bool.
    Pass p's row t is what drafting computes at depth p below the root at row t - p: the root sees the true
    context (pass 0's rows <= t - p) and depth j's row t - p + j comes from pass j. (Rows t < p have no such
    root: they see what exists and are not trained.)"""
    t, u = torch.arange(L)[:, None], torch.arange(L)[None]
    return torch.cat([u <= t - p] + [u == t - p + j for j in range(1, p + 1)], 1)


def unrolled(head: Head, f0, e, pos, passes: int) -> list[torch.Tensor]:
    """Pass 0 is teacher-forced and causal over the crop; pass p feeds back pass p-1's features (row t reads the
    prediction for position t - 1) and attends as `reach` says."""
    B, L = pos.shape
    out, (K, V) = head(f0, e, pos, reach(L, 0).expand(B, L, L))
    outs = [out]
    for p in range(1, passes):
        f = torch.cat([f0[:, :1], outs[-1][:, :-1].to(f0.dtype)], 1)
        out, (k, v) = head(f, e, pos, reach(L, p).expand(B, L, (p + 1) * L), past=(K, V))
        K, V = torch.cat([K, k], 1), torch.cat([V, v], 1)
        outs.append(out)
    return outs


def main(argv: list[str]) -> int:
    a = _args(argv)
    if a.retree:
        return retree(a)
    if a.narrow:
        return narrow(a)
    t_start = time.perf_counter()
    lm, rows, desc, vocab = prepare(a)
    hs = hidden_states(lm, [r[0] for r in rows])
    seqs = sequences(rows, hs)
    IDX = torch.cat([r[2] for r in rows]).long()
    LOGP = torch.cat([r[3] for r in rows]).float()
    trained = sum(int((d[a0:] >= 0).sum()) for _, _, d, a0 in seqs)
    print(f"{len(seqs)} training sequences, {trained} trained rows, crops of at most {a.crop} rows")
    start = None
    if a.init:   # go on from a trained head: its draft vocabulary too (its LM-head rows are what it learned to rank)
        start, _ = load_head(lm.model, a.init)
        if start.vocab is None:
            raise SystemExit(f"--init {a.init}: a head without a draft vocabulary; train from scratch")
        if not torch.equal(start.vocab.ids, vocab.ids):
            print(f"--init: keeping {a.init.name}'s draft vocabulary ({len(start.vocab.ids)} tokens) instead of "
                  "the one this data would pick")
        vocab = start.vocab
    head = Head.for_target(lm.model, vocab).train()
    if start is not None:
        head.load_state_dict(start.state_dict())
    emb = lm.model.get_input_embeddings().weight.detach()                           # [V, H] frozen
    head_w = head_weight(head, lm.model.get_output_embeddings()).detach()          # [v, H] frozen
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
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
        f0, target, tok, pos, drow = crops(seqs, torch.randint(len(seqs), (a.batch,), generator=gen), a.crop, gen)
        f0, target, e = f0.float(), target.float(), emb[tok].float()
        schedule(opt, eff, a.steps, a.lr)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = unrolled(head, f0, e, pos, a.unroll)
            parts = {}
            for name, p, out in (("tf", 0, outs[0]), ("unroll", a.unroll - 1, outs[-1])):
                sel = drow >= 0
                sel[:, :p] = False                                   # rows with no root p rows up: not drafted
                r = drow[sel]
                d, lp = vocab.targets(IDX[r], LOGP[r])
                reg = F.smooth_l1_loss(out[sel].float(), target[sel])
                logq = torch.log_softmax(F.linear(out[sel], head_w).float(), -1)              # [N, v]
                parts[name] = (reg, distill.soft_ce(logq, d, lp), distill.entropy_top(LOGP[r]))
        loss = sum(r + W_CE * c for r, c, _ in parts.values()) / len(parts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        shown = {"reg": parts["unroll"][0].item(), "kl tf": parts["tf"][1].item() - parts["tf"][2],
                 "kl unroll": parts["unroll"][1].item() - parts["unroll"][2]}
        ema = {k: v if k not in ema else 0.95 * ema[k] + 0.05 * v for k, v in shown.items()}
        bar.set_postfix({k: f"{v:.3f}" for k, v in ema.items()})
    train_s = time.perf_counter() - t0
    head.eval()

    from safetensors.torch import save_file
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "eagle.safetensors"
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}   # bf16: half the MB
    save_file({**sd, **vocab.state()}, str(path),
              metadata={"context": "1", "crop": str(a.crop), "seed": str(a.seed), "vocab_size": str(lm.vocab_size)})
    shipped, _ = load_head(lm.model, path)   # measure exactly what ships

    picked = pick_tree(lm, shipped, a)
    write_manifest("eagle", a, argv, path, dict(
        **target_record(lm),
        model=dict(hidden=int(seqs[0][0].shape[1]), block="fc([f ; embed(x)]) -> one Llama decoder layer (started as "
                   "the target's last layer) -> RMSNorm -> the target's LM head (frozen, not shipped) over the "
                   "draft vocabulary", feature="the target's final-norm hidden state (the LM head's input)",
                   params=sum(p.numel() for p in head.parameters()),
                   dtype="bfloat16 (stored); drafting runs packed products in the target's dtype"),
        vocab=dict(size=len(vocab.ids), train_coverage=round(vocab.coverage([r[0] for r in rows],
                   [r[1] for r in rows]), 4), how="kept from the head this run went on from (--init)" if start is not None else
                   "as the other trained drafters (training/common.py make_vocab)"),
        data=dict(desc, sequences=len(seqs), trained_rows=trained, crop=a.crop), unroll=a.unroll, steps=done, steps_planned=a.steps,
        minutes_cap=a.minutes, batch=a.batch, lr=a.lr,
        loss=f"mean over (teacher-forced pass, last unrolled pass) of smooth_L1(f^, f) + {W_CE} * "
             "CE(p || q) over the target's top-64 + rest; final_loss shows CE as KL",
        final_loss={k: round(v, 4) for k, v in ema.items()}, train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1), **lineage(a.init),
        **picked))
    return 0


def lineage(init: Path | None) -> dict:
    """For a run that went on from a trained head (--init): that head's own runs, newest first, from the manifest
    beside it (command, steps, seconds, final loss), so the shipped manifest says everything that made it."""
    if init is None:
        return {}
    man = json.loads(init.with_name("eagle.manifest.json").read_text())
    keep = ("command", "steps", "batch", "lr", "train_seconds", "total_seconds", "final_loss")
    return dict(continued_from=[{k: man[k] for k in keep if k in man}] + man.get("continued_from", []))


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
    dr.observe(h, len(ids))
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
        acceptance=dict(best["result"], block_ms=[round(x, 3) for x in dr.costs], row_block=dr.block))


def retree(a) -> int:
    """--retree: the head in --out kept, its tree budget chosen again on this machine and its acceptance
    re-measured (after a change to how trees are sized or verified, or on another machine)."""
    lm = load_target(a.threads)
    head, _ = load_head(lm.model, a.out / "eagle.safetensors")
    rewrite_manifest("eagle", a.out, pick_tree(lm, head, a), "python -m specdec_core train eagle --retree"
                     + _tree_args(a))
    return 0


def _tree_args(a) -> str:
    """The tree options of a --retree or --narrow run, as its command line gives them."""
    return " --trees " + ",".join("x".join(map(str, t)) for t in a.trees) + (" --fixed" if a.fixed else "")


def narrow(a) -> int:
    """--narrow N: the head in --out drafting over only the N tokens of its draft vocabulary that the target says
    or considers most over the training answers (make_vocab, within the head's own). Its weights are the same;
    its LM head is a subset of the rows it learned to rank, so a level's products and top-k read fewer bytes
    (FR-Spec's point: the rare tokens seldom make an accepted draft). The vocabulary in the weights file is
    rewritten, then the tree is chosen again and the manifest says what changed."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    lm = load_target(a.threads)
    path = a.out / "eagle.safetensors"
    head, _ = load_head(lm.model, path)
    if head.vocab is None or not 1 <= a.narrow < len(head.vocab.ids):
        raise SystemExit(f"--narrow {a.narrow}: want fewer tokens than the head's draft vocabulary "
                         f"({'none' if head.vocab is None else len(head.vocab.ids)})")
    rows, _ = data(lm, a.n_prompts, [float(x) for x in a.temps.split(",")])
    vocab = make_vocab(lm, rows, a.narrow, within=head.vocab)
    cover = lambda v: round(v.coverage([r[0] for r in rows], [r[1] for r in rows]), 4)   # noqa: E731
    before = dict(size=len(head.vocab.ids), train_coverage=cover(head.vocab))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    save_file({**load_file(str(path)), **vocab.state()}, str(path), metadata=meta)
    shipped, _ = load_head(lm.model, path)
    command = f"python -m specdec_core train eagle --narrow {a.narrow} --temps {a.temps}" + _tree_args(a)
    trained_over = json.loads((a.out / "eagle.manifest.json").read_text()).get("vocab", {})
    man = rewrite_manifest("eagle", a.out, dict(
        pick_tree(lm, shipped, a), **weights_record(path),
        vocab=dict(size=len(vocab.ids), train_coverage=cover(vocab),
                   how=f"narrowed ({command}) from the {before['size']} tokens the head was trained over (train "
                       f"coverage {before['train_coverage']}): the {a.narrow} of them with the most target mass over "
                       "the training answers (training/common.py make_vocab); the head's weights unchanged",
                   trained_over=trained_over)), command)
    print(f"draft vocabulary {before['size']} -> {len(vocab.ids)} tokens (train coverage {before['train_coverage']} "
          f"-> {man['vocab']['train_coverage']})")
    return 0
