"""`python -m specdec_core train KIND`: self-distil a drafter from the bundled target (KL to its distributions).

  draft       a separate 2-layer LlamaForCausalLM started from slices of the target
              (DistillSpec, Zhou et al. 2024)
  early-exit  an exit (one decoder layer + norm) after the target's first L layers, L chosen by measurement
              among --layers (LayerSkip, Elhoushi et al. 2024; Kangaroo, Liu et al. 2024)

Data: the target's own answers to `distill.training_prompts()` (hand-written plus template prompts), greedy
by default (`--temps 0,0.7` adds a sampled pass), with its top-64 log-probs at every answer position as soft
targets (distill.py; cached under runs/distill/). Greedy answers are the contexts of the greedy benchmark, and
the soft targets carry the whole distribution at each position; within the 30-minute budget on 2 cores, more
prompts bought more than a second, sampled pass over the same ones. Both chain drafters score only a draft
vocabulary, the tokens the target puts the most probability on (drafters/vocab.py), which makes their forward
cheaper.
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
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import distill
from .drafters import early_exit as ee
from .drafters import distilled
from .drafters.vocab import DraftVocab

WEIGHTS = Path(__file__).resolve().parent / "weights"
STEPS = {"draft": 1800, "early-exit": 700}  # sized to finish within 30 minutes on 2 quiet cores


def _args(kind: str, argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m specdec_core train {kind}",
                                 description=f"self-distil the `{kind}` drafter from the bundled target")
    ap.add_argument("--steps", type=int, default=STEPS[kind])
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--temps", default="0", help="temperatures of the target-answer passes (0 = greedy)")
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (tokens scored by the draft)")
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
        ap.add_argument("--layers", default="1,2,3", help="candidate exit layers L, trained together")
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
    prompts = distill.training_prompts()
    for temp in temps:
        info = distill.samples_info(lm, n_prompts=n_prompts, temperature=temp, seed=0, prompts=prompts,
                                    batch_size=32)
        dists = distill.target_dists(lm, info["seqs"])
        for s, pl, (i, lp) in zip(info["seqs"], info["prompt_lens"], dists):
            if len(s) > pl:
                rows.append((s, pl, i, lp))
        passes.append(dict(temperature=temp, seed=0, prompts=info["n_prompts"], answer_tokens=info["answer_tokens"],
                           max_new_tokens=info["max_new_tokens"], generate_seconds=round(info["seconds"], 1)))
    desc = dict(source="the bundled target's own answers to distill.training_prompts() (chat template), bf16",
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
    return dict(forward=lm.forward_name, k=k, max_new_tokens=max_new, temperature=0.0, prompts=len(prompts),
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


# ---------------------------------------------------------------- the shared training loop

def make_vocab(lm, rows, n: int) -> DraftVocab:
    """The n tokens the target says or considers most over the training answers, plus the end-of-sequence ids."""
    return DraftVocab.from_counts([r[0] for r in rows], [r[1] for r in rows], n, lm.vocab_size,
                                  always=sorted(lm.eos_ids), soft=[(r[2][r[1] - 1:], r[3][r[1] - 1:]) for r in rows])


def vocab_desc(vocab: DraftVocab, rows, held) -> dict:
    return dict(size=len(vocab.ids),
                how="tokens with the most target probability mass over the training answers (answer tokens "
                    "counted once each, plus the target's top-64 probabilities at every position), plus eos",
                train_coverage=round(vocab.coverage([r[0] for r in rows], [r[1] for r in rows]), 4),
                heldout_coverage=round(vocab.coverage([r[0] for r in held], [r[1] for r in held]), 4))


def fit(students: dict, prep, head_w: torch.Tensor, vocab: DraftVocab, rows, a, desc: str) -> tuple[dict, float]:
    """Train each student by KL to the target's soft targets at every answer position.

    students: name -> (params, fn) with fn(prepped, sel) -> hidden states [N, d] before the head;
    prep(ids, mask) runs once per step for all of them (e.g. the frozen trunk). Returns final losses, seconds."""
    opts = {n: torch.optim.AdamW(p, lr=a.lr, weight_decay=0.0) for n, (p, _) in students.items()}
    gen = torch.Generator().manual_seed(a.seed)
    ema = {n: None for n in students}
    t0 = time.perf_counter()
    bar = tqdm(range(a.steps), desc=desc, unit="step")
    for step in bar:
        pick = torch.randint(len(rows), (a.batch,), generator=gen).tolist()
        ids, mask, sel, ti, tl = batch(rows, pick)
        d, lp = vocab.targets(ti, tl)
        ent = distill.entropy_top(tl)  # so the shown loss is KL(p || q), 0 when q = p
        with torch.no_grad():
            pre = prep(ids, mask)
        for n, (params, fn) in students.items():
            schedule(opts[n], step, a.steps, a.lr)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = F.linear(fn(pre, sel), head_w)                     # [N, v]
            loss = distill.soft_ce(torch.log_softmax(logits.float(), -1), d, lp)
            opts[n].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opts[n].step()
            kl = loss.item() + ent
            ema[n] = kl if ema[n] is None else 0.95 * ema[n] + 0.05 * kl
        bar.set_postfix({f"kl {n}": f"{v:.3f}" for n, v in ema.items()})
    return {n: round(v, 4) for n, v in ema.items()}, time.perf_counter() - t0


# ---------------------------------------------------------------- draft

def train_draft(a, argv) -> int:
    t_start = time.perf_counter()
    torch.manual_seed(a.seed)
    lm = load_target(a.threads)
    rows, desc = data(lm, a.n_prompts, [float(x) for x in a.temps.split(",")])
    vocab = make_vocab(lm, rows, a.vocab)
    layers = [int(x) for x in a.init_layers.split(",")]
    m = distilled.from_target(lm.model, layers).train()
    m.model.embed_tokens.weight.requires_grad_(False)  # shared with the target at load time: must not move
    params = [p for p in m.parameters() if p.requires_grad]
    head_w = vocab.head(m.model.embed_tokens.weight.detach())

    def hidden(pre, sel):
        return m.model(input_ids=pre[0], attention_mask=pre[1], use_cache=False).last_hidden_state[sel]  # [N, d]
    losses, train_s = fit({"draft": (params, hidden)}, lambda ids, mask: (ids, mask), head_w, vocab, rows, a,
                          "train draft")

    a.out.mkdir(parents=True, exist_ok=True)
    path = distilled.save(m, a.out, vocab, {"init_layers": a.init_layers, "seed": a.seed})
    draft = distilled.load_draft(lm, a.out)  # measure exactly what ships
    from .drafters.draft_model import DraftModel
    acc = acceptance(lm, DraftModel(draft, lm), distill.HELDOUT[:a.eval_prompts], a.k, a.eval_tokens)
    t_t = target_step_cost(lm)
    t_d = target_step_cost(draft)
    _finish("draft", a, argv, path, dict(
        model=dict(architecture="LlamaForCausalLM", config="draft.config.json", layers=len(layers),
                   init_from_target_layers=layers, hidden=m.config.hidden_size,
                   intermediate=m.config.intermediate_size,
                   shipped="decoder layers + final norm (bf16) and the draft vocabulary; the embedding and tied "
                           "LM head are the target's, filled in at load time (frozen during training)"),
        vocab=vocab_desc(vocab, rows, heldout(lm, a.eval_prompts)),
        data=desc, steps=a.steps, batch=a.batch, lr=a.lr, loss="KL(p || q) over top-64 + rest",
        final_loss=losses["draft"], train_seconds=round(train_s, 1),
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
    vocab = make_vocab(lm, rows, a.vocab)
    cands = sorted({int(x) for x in a.layers.split(",")})
    model = lm.model
    exits = {L: ee.Exit.for_target(model, L, vocab).train() for L in cands}
    tr = ee.trunk(model, max(cands))
    grab = {}
    hooks = [tr.layers[L - 1].register_forward_hook(
        lambda mod, inp, out, L=L: grab.__setitem__(L, out[0] if isinstance(out, tuple) else out)) for L in cands]
    head_w = vocab.head(model.get_output_embeddings().weight.detach())

    def prep(ids, mask):
        tr(input_ids=ids, attention_mask=mask, use_cache=False)  # frozen trunk, bf16; hooks keep each candidate's h
        return mask, dict(grab)

    def student(L):
        net = ee.stack(model, [exits[L].layer], exits[L].norm)  # the exit alone, fed the trunk's state
        return lambda pre, sel: net(inputs_embeds=pre[1][L].float(), attention_mask=pre[0],
                                    use_cache=False).last_hidden_state[sel]
    losses, train_s = fit({L: (list(exits[L].parameters()), student(L)) for L in cands}, prep, head_w, vocab,
                          rows, a, f"train early exits L={cands}")
    for hk in hooks:
        hk.remove()

    # choose L: held-out greedy agreement alpha and measured cost c = draft forward / target forward give the
    # expected speedup E/(k c + 1) with E = 1 + alpha + ... + alpha^k (independent positions, Leviathan sec. 3)
    held = heldout(lm, a.eval_prompts)
    t_t = target_step_cost(lm)
    sweep = {}
    for L, e in exits.items():
        d = ee.EarlyExit(lm, e.eval())
        agree, n = 0, 0
        with torch.inference_mode():
            for s, pl, ti, _ in held:
                h = d.net(input_ids=torch.tensor([s])).last_hidden_state[0, pl - 1:len(s) - 1]
                g = d.vocab.ids[F.linear(h, d.head_w).argmax(-1)]
                agree += int((g == ti[pl - 1:len(s) - 1, 0].long()).sum())
                n += len(s) - pl
        alpha = agree / max(n, 1)
        d.begin([])
        d._sync(lm.encode(distill.HELDOUT[0]).tolist())
        c = time_forward(lambda: (d._forward([5]), d.cache.crop(-1))) / t_t
        best = max(((sum(alpha ** i for i in range(k + 1)) / (k * c + 1), k) for k in range(1, 7)))
        sweep[L] = dict(greedy_agreement=round(alpha, 4), final_kl=losses[L], cost_ratio=round(c, 3),
                        predicted_speedup=round(best[0], 3), best_k=best[1])
        print(f"L={L}: agreement {alpha:.3f}, cost {c:.3f} of a target forward, "
              f"predicted speedup {best[0]:.2f}x at k={best[1]}")
    L = max(sweep, key=lambda x: sweep[x]["predicted_speedup"])
    k = sweep[L]["best_k"]
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "early-exit.safetensors"
    ee.save(exits[L].float(), path, {"default_k": k, "seed": a.seed})
    shipped = ee.load_exit(model, path)  # measure exactly what ships
    acc = acceptance(lm, ee.EarlyExit(lm, shipped, default_k=k), distill.HELDOUT[:a.eval_prompts], k, a.eval_tokens)
    _finish("early-exit", a, argv, path, dict(
        model=dict(exit_layer=L, default_k=k,
                   exit="one decoder layer (attention + MLP, started from the target's last layer) and an RMSNorm "
                        f"after the target's first {L} layers; those layers and the tied LM head are shared, not "
                        "shipped; the head scores the draft vocabulary only"),
        vocab=vocab_desc(vocab, rows, held),
        choice=dict(candidates=sweep, chosen=L,
                    why="largest predicted speedup from measured held-out agreement and measured draft cost"),
        data=desc, steps=a.steps, batch=a.batch, lr=a.lr, loss="KL(p || q) over top-64 + rest",
        final_loss=losses[L], train_seconds=round(train_s, 1),
        total_seconds=round(time.perf_counter() - t_start, 1),
        cost=dict(target_forward_ms=round(t_t * 1e3, 2), ratio=sweep[L]["cost_ratio"],
                  how="best of 9 one-token forwards with a warm cache, bf16"),
        acceptance=acc))
    return 0
