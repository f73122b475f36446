"""`python -m specdec_core train KIND`: self-distil a drafter from the bundled target (KL to its distributions).

  draft       a separate 2-layer LlamaForCausalLM started from slices of the target
              (DistillSpec, Zhou et al. 2024)
  early-exit  an exit (residual SwiGLU adapter + norm) after the target's first L layers, L chosen by
              measurement among --layers (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2024)

Data: the target's own answers to `distill.PROMPTS` (greedy by default; `--temps 0,0.7` adds a sampled
pass), with its top-64 log-probs at every answer position as soft targets (distill.py; cached under
runs/distill/). Greedy answers are the contexts of the greedy benchmark, and the soft targets already carry
the whole distribution at each position; on 2 shared cores a second, sampled pass cost more time than it bought.
Each run is seeded, shows progress and loss, and writes WEIGHTS/<kind>.safetensors plus <kind>.manifest.json
(data, steps, loss, measured acceptance on held-out prompts, draft cost, command, versions, sha256).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import distill
from .drafters import early_exit as ee
from .drafters import distilled

WEIGHTS = Path(__file__).resolve().parent / "weights"


def _args(kind: str, argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m specdec_core train {kind}",
                                 description=f"self-distil the `{kind}` drafter from the bundled target")
    ap.add_argument("--steps", type=int, default=150 if kind == "draft" else 100)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--temps", default="0", help="temperatures of the target-answer passes (0 = greedy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--n-prompts", type=int, default=None, help="use only the first N training prompts")
    ap.add_argument("--eval-prompts", type=int, default=len(distill.HELDOUT), help="held-out prompts measured")
    ap.add_argument("--eval-tokens", type=int, default=96, help="new tokens per held-out prompt")
    ap.add_argument("--out", type=Path, default=WEIGHTS, help="folder for the weights and manifest")
    if kind == "draft":
        ap.add_argument("--init-layers", default="0,29", help="target layers the draft's layers start from")
        ap.add_argument("--k", type=int, default=4, help="draft length for the acceptance measurement")
    else:
        ap.add_argument("--layers", default="10,16", help="candidate exit layers L, trained together")
        ap.add_argument("--hidden", type=int, default=1536, help="adapter width")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.lr <= 0:
        ap.error("--steps and --batch must be >= 1 and --lr > 0")
    return a


def main(kind: str, argv: list[str]) -> int:
    """Entry for `train KIND`; returns the exit status."""
    if kind == "draft":
        return train_draft(_args(kind, argv), argv)
    if kind == "early-exit":
        return train_early_exit(_args(kind, argv), argv)
    if kind == "medusa":
        from .train_medusa import main as train_medusa
        return train_medusa(argv)
    print(f"train: unknown kind {kind!r}; choose one of: draft, early-exit, medusa", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- data

def load_target(threads: int):
    from .models import load
    if threads:
        torch.set_num_threads(threads)
    # bf16: the dtype the bundled target runs in on CPUs with native bf16, and the fast one for the data pass
    return load("bundled", dtype="bf16", device="cpu")


def data(lm, n_prompts=None, temps=(0.0,)) -> tuple[list[tuple], dict]:
    """[(seq, answer_start, idx, logp)] from one pass per temperature, and a description for the manifest."""
    rows, passes = [], []
    t0 = time.perf_counter()
    for temp in temps:
        info = distill.samples_info(lm, n_prompts=n_prompts, temperature=temp, seed=0)
        dists = distill.target_dists(lm, info["seqs"])
        for s, pl, (i, lp) in zip(info["seqs"], info["prompt_lens"], dists):
            if len(s) > pl:
                rows.append((s, pl, i, lp))
        passes.append(dict(temperature=temp, seed=0, prompts=info["n_prompts"], answer_tokens=info["answer_tokens"],
                           max_new_tokens=info["max_new_tokens"], generate_seconds=round(info["seconds"], 1)))
    desc = dict(source="the bundled target's own answers to distill.PROMPTS (chat template), bf16",
                passes=passes, soft_targets="target top-64 log-probs + rest mass at every answer position",
                answer_tokens=sum(p["answer_tokens"] for p in passes),
                load_seconds=round(time.perf_counter() - t0, 1))
    return rows, desc


def batch(rows, pick: list[int]):
    """Right-padded ids [B, n], attention mask, answer-position selector [B, n] (bool), soft targets [N, K]."""
    seqs = [rows[i][0] for i in pick]
    n = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (n - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])
    sel = torch.zeros(len(seqs), n, dtype=torch.bool)
    idx, logp = [], []
    for b, i in enumerate(pick):
        s, pl, ti, tl = rows[i]
        sel[b, pl - 1:len(s) - 1] = True  # position t predicts token t+1: every answer token
        idx.append(ti[pl - 1:len(s) - 1])
        logp.append(tl[pl - 1:len(s) - 1])
    return ids, mask, sel, torch.cat(idx), torch.cat(logp).float()


def schedule(opt, step, steps, lr, warm=30):
    f = min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / steps)))
    for g in opt.param_groups:
        g["lr"] = lr * max(f, 0.05)


# ---------------------------------------------------------------- measurement

def heldout(lm, n: int):
    """Greedy target answers for the held-out prompts, with target soft targets (cached)."""
    info = distill.samples_info(lm, temperature=0.0, prompts=distill.HELDOUT[:n])
    return [(s, pl, *d) for s, pl, d in zip(info["seqs"], info["prompt_lens"], distill.target_dists(lm, info["seqs"]))
            if len(s) > pl]


def time_forward(fn, reps=9) -> float:
    """Best-of-reps seconds for one call: the machine is shared, the minimum is the least disturbed."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def target_step_cost(lm) -> float:
    ids = lm.encode(distill.HELDOUT[0])
    cache = lm.new_cache()
    lm.forward(ids, cache)
    one = torch.tensor([int(ids[-1])])

    def f():
        lm.forward(one, cache)
        cache.crop(-1)
    return time_forward(f)


def acceptance(lm, drafter, prompts: list[str], k: int, max_new: int) -> dict:
    """Greedy engine runs on held-out prompts: mean acceptance length (bonus counted) and acceptance rate."""
    from .engine import run
    from .sampling import SamplingParams
    per, steps, committed, drafted, accepted = [], 0, 0, 0, 0
    for p in tqdm(prompts, desc="held-out acceptance", unit="prompt"):
        _, recs, _ = run(lm, drafter, lm.encode(p), sp=SamplingParams(), k=k, max_new_tokens=max_new, detail=False)
        c = sum(len(r.committed) for r in recs)
        d = sum(len(r.drafted) for r in recs)
        a = sum(r.n_accepted for r in recs)
        per.append(dict(prompt=p, steps=len(recs), committed=c, drafted=d, accepted=a,
                        mean_acceptance_length=round(c / len(recs), 4)))
        steps, committed, drafted, accepted = steps + len(recs), committed + c, drafted + d, accepted + a
    return dict(k=k, max_new_tokens=max_new, temperature=0.0, prompts=len(prompts),
                mean_acceptance_length=round(committed / steps, 4),
                acceptance_rate=round(accepted / max(drafted, 1), 4), per_prompt=per)


def _finish(kind: str, a, argv, path: Path, manifest: dict) -> None:
    import transformers
    manifest.update(
        kind=kind, command="python -m specdec_core train " + " ".join([kind] + [shlex.quote(x) for x in argv]),
        seed=a.seed, weights=path.name, weights_bytes=path.stat().st_size,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version()),
        threads=torch.get_num_threads())
    out = path.with_name(f"{kind}.manifest.json")
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {out}")
    m = manifest["acceptance"]
    print(f"held-out greedy, k={m['k']}: mean acceptance length {m['mean_acceptance_length']}, "
          f"acceptance rate {m['acceptance_rate']}")


# ---------------------------------------------------------------- draft

def train_draft(a, argv) -> int:
    t_start = time.perf_counter()
    torch.manual_seed(a.seed)
    lm = load_target(a.threads)
    rows, desc = data(lm, a.n_prompts, [float(x) for x in a.temps.split(",")])
    layers = [int(x) for x in a.init_layers.split(",")]
    m = distilled.from_target(lm.model, layers).train()
    m.model.embed_tokens.weight.requires_grad_(False)  # shared with the target at load time: must not move
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    t0 = time.perf_counter()
    bar = tqdm(range(a.steps), desc="train draft", unit="step")
    ema = None
    for step in bar:
        pick = torch.randint(len(rows), (a.batch,), generator=gen).tolist()
        ids, mask, sel, ti, tl = batch(rows, pick)
        schedule(opt, step, a.steps, a.lr)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = m.model(input_ids=ids, attention_mask=mask).last_hidden_state[sel]   # [N, d]
            logits = m.lm_head(h)                                                    # [N, V]
        loss = distill.kl_top(torch.log_softmax(logits.float(), -1), ti, tl)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(kl=f"{ema:.3f}")
    train_s = time.perf_counter() - t0

    a.out.mkdir(parents=True, exist_ok=True)
    path = distilled.save(m, a.out, {"init_layers": a.init_layers, "seed": a.seed})
    draft = distilled.load_draft(lm, a.out)  # measure exactly what ships
    from .drafters.draft_model import DraftModel
    acc = acceptance(lm, DraftModel(draft, lm), distill.HELDOUT[:a.eval_prompts], a.k, a.eval_tokens)
    t_t = target_step_cost(lm)
    t_d = target_step_cost(draft)
    _finish("draft", a, argv, path, dict(
        model=dict(architecture="LlamaForCausalLM", config="draft.config.json", layers=len(layers),
                   init_from_target_layers=layers, hidden=m.config.hidden_size,
                   intermediate=m.config.intermediate_size,
                   shipped="decoder layers + final norm only (bf16); the embedding and tied LM head are the "
                           "target's, filled in at load time (frozen during training)"),
        data=desc, steps=a.steps, batch=a.batch, lr=a.lr, loss="KL(p || q) over top-64 + rest",
        final_loss=round(ema, 4), train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        cost=dict(draft_forward_ms=round(t_d * 1e3, 2), target_forward_ms=round(t_t * 1e3, 2),
                  ratio=round(t_d / t_t, 3), how="best of 9 one-token forwards with a warm cache, bf16"),
        acceptance=acc))
    return 0


# ---------------------------------------------------------------- early exit

def train_early_exit(a, argv) -> int:
    t_start = time.perf_counter()
    torch.manual_seed(a.seed)
    lm = load_target(a.threads)
    rows, desc = data(lm, a.n_prompts, [float(x) for x in a.temps.split(",")])
    cands = sorted({int(x) for x in a.layers.split(",")})
    model = lm.model
    exits = {L: ee.Exit.for_target(model, L, a.hidden).train() for L in cands}
    tr = ee.trunk(model, max(cands))
    grab = {}
    hooks = [tr.layers[L - 1].register_forward_hook(
        lambda mod, inp, out, L=L: grab.__setitem__(L, out[0] if isinstance(out, tuple) else out)) for L in cands]
    head = model.get_output_embeddings()
    opts = {L: torch.optim.AdamW(e.parameters(), lr=a.lr, weight_decay=0.0) for L, e in exits.items()}
    gen = torch.Generator().manual_seed(a.seed)
    ema = {L: None for L in cands}
    t0 = time.perf_counter()
    bar = tqdm(range(a.steps), desc=f"train early exits L={cands}", unit="step")
    for step in bar:
        pick = torch.randint(len(rows), (a.batch,), generator=gen).tolist()
        ids, mask, sel, ti, tl = batch(rows, pick)
        with torch.no_grad():
            tr(input_ids=ids, attention_mask=mask)  # the frozen trunk, bf16; hooks keep each candidate's h
        for L, e in exits.items():
            schedule(opts[L], step, a.steps, a.lr)
            h = grab[L][sel].float()                                        # [N, d]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = e(h, head)                                         # [N, V]
            loss = distill.kl_top(torch.log_softmax(logits.float(), -1), ti, tl)
            opts[L].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(e.parameters(), 1.0)
            opts[L].step()
            ema[L] = loss.item() if ema[L] is None else 0.95 * ema[L] + 0.05 * loss.item()
        bar.set_postfix({f"kl@{L}": f"{v:.3f}" for L, v in ema.items()})
    for hk in hooks:
        hk.remove()
    train_s = time.perf_counter() - t0

    # choose L: held-out greedy agreement alpha and measured cost c = draft forward / target forward give the
    # expected speedup E/(k c + 1) with E = 1 + alpha + ... + alpha^k (independent positions, Leviathan sec. 3)
    held = heldout(lm, a.eval_prompts)
    t_t = target_step_cost(lm)
    sweep = {}
    for L, e in exits.items():
        e.eval()
        agree, n = 0, 0
        with torch.no_grad():
            for s, pl, ti, _ in held:
                h = ee.trunk(model, L)(input_ids=torch.tensor([s])).last_hidden_state[0, pl - 1:len(s) - 1]
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    g = e(h.float(), head).argmax(-1)
                agree += int((g == ti[pl - 1:len(s) - 1, 0].long()).sum())
                n += len(s) - pl
        alpha = agree / max(n, 1)
        d = ee.EarlyExit(lm, e)
        d.begin([])
        d._sync(lm.encode(distill.HELDOUT[0]).tolist())
        c = time_forward(lambda: (d._forward([5]), d.cache.crop(-1))) / t_t
        best = max(((sum(alpha ** i for i in range(k + 1)) / (k * c + 1), k) for k in range(1, 7)))
        sweep[L] = dict(greedy_agreement=round(alpha, 4), final_kl=round(ema[L], 4), cost_ratio=round(c, 3),
                        predicted_speedup=round(best[0], 3), best_k=best[1])
        print(f"L={L}: agreement {alpha:.3f}, cost {c:.3f} of a target forward, "
              f"predicted speedup {best[0]:.2f}x at k={best[1]}")
    L = max(sweep, key=lambda x: sweep[x]["predicted_speedup"])
    k = sweep[L]["best_k"]
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "early-exit.safetensors"
    ee.save(exits[L], path, {"default_k": k, "seed": a.seed})
    shipped = ee.load_exit(path)  # measure exactly what ships
    acc = acceptance(lm, ee.EarlyExit(lm, shipped, default_k=k), distill.HELDOUT[:a.eval_prompts], k, a.eval_tokens)
    _finish("early-exit", a, argv, path, dict(
        model=dict(exit_layer=L, default_k=k, adapter="x + SwiGLU(x) with x = rms(h), then rmsnorm, hidden "
                   f"{a.hidden}; the target's first {L} layers and tied LM head are shared, not shipped"),
        choice=dict(candidates=sweep, chosen=L,
                    why="largest predicted speedup from measured held-out agreement and measured draft cost"),
        data=desc, steps=a.steps, batch=a.batch, lr=a.lr, loss="KL(p || q) over top-64 + rest",
        final_loss=round(ema[L], 4), train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        cost=dict(target_forward_ms=round(t_t * 1e3, 2), ratio=sweep[L]["cost_ratio"],
                  how="best of 9 one-token forwards with a warm cache, bf16"),
        acceptance=acc))
    return 0
