"""What the trainers share: the target and its answers, the draft vocabulary, the training loop, the
held-out measurements and the manifest.

Data: the target's own answers to `distill.training_prompts()` (hand-written plus template prompts), greedy
by default (`--temps 0,0.7` adds a sampled pass), with its top-64 log-probs at every answer position as soft
targets (distill.py; cached under runs/distill/). Greedy answers are the contexts of the greedy benchmark, and
the soft targets carry the whole distribution at each position; within the 30-minute budget on 2 cores, more
prompts bought more than a second, sampled pass over the same ones. Every trained drafter scores only a draft
vocabulary, the tokens the target puts the most probability on (drafters/vocab.py), which makes its forward
cheaper.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shlex
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..drafters.vocab import DraftVocab
from . import distill

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


# ---------------------------------------------------------------- flags

def chain_parser(kind: str, steps: int) -> argparse.ArgumentParser:
    """The flags shared by the chain drafters' trainers (draft, early-exit); each adds its own."""
    ap = argparse.ArgumentParser(prog=f"python -m specdec_core train {kind}",
                                 description=f"self-distil the `{kind}` drafter from the bundled target")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    add_temps(ap)
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (tokens scored by the draft)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--n-prompts", type=int, default=None, help="use only the first N training prompts")
    ap.add_argument("--eval-prompts", type=int, default=len(distill.HELDOUT), help="held-out prompts measured")
    ap.add_argument("--eval-tokens", type=int, default=96, help="new tokens per held-out prompt")
    ap.add_argument("--out", type=Path, default=WEIGHTS, help="folder for the weights and manifest")
    return ap


def add_temps(ap: argparse.ArgumentParser) -> None:
    """--temps, read by `prepare`: one answer pass per temperature (sampled passes add varied contexts for the
    same prompts)."""
    ap.add_argument("--temps", default="0", help="temperatures of the target-answer passes (0 = greedy), "
                    "comma-separated")


def parse_chain_args(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    a = ap.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.lr <= 0:
        ap.error("--steps and --batch must be >= 1 and --lr > 0")
    return a


# ---------------------------------------------------------------- data

def load_target(threads: int):
    from ..models import load
    if threads:
        torch.set_num_threads(threads)
    # bf16: the dtype the bundled target runs in on CPUs with native bf16, and the fast one for the data pass
    return load("bundled", dtype="bf16", device="cpu")


def prepare(a):
    """What every trainer starts from: seeded, the target loaded, its answers taken (one pass per temperature of
    --temps), the draft vocabulary picked -> (lm, rows, description, vocab)."""
    torch.manual_seed(a.seed)
    lm = load_target(a.threads)
    rows, desc = data(lm, a.n_prompts, [float(x) for x in a.temps.split(",")])
    return lm, rows, desc, make_vocab(lm, rows, a.vocab)


def data(lm, n_prompts=None, temps=(0.0,)) -> tuple[list[tuple], dict]:
    """[(seq, answer_start, idx, logp)] from one pass per temperature, and a description for the manifest."""
    rows, passes = [], []
    t0 = time.perf_counter()
    groups = distill.training_groups()        # each group's answers cached apart
    if n_prompts is not None:                 # the first n_prompts, in group order
        groups = [g[:max(0, n_prompts - sum(map(len, groups[:i])))] for i, g in enumerate(groups)]
    groups = [g for g in groups if g]
    for temp in temps:
        p = dict(temperature=temp, seed=0, prompts=0, answer_tokens=0, max_new_tokens=0, generate_seconds=0.0)
        for g in groups:
            info = distill.samples_info(lm, temperature=temp, seed=0, prompts=g, batch_size=32)
            dists = distill.target_dists(lm, info["seqs"])
            for s, pl, (i, lp) in zip(info["seqs"], info["prompt_lens"], dists):
                if len(s) > pl:
                    rows.append((s, pl, i, lp))
            p.update(prompts=p["prompts"] + info["n_prompts"], answer_tokens=p["answer_tokens"] + info["answer_tokens"],
                     max_new_tokens=info["max_new_tokens"], generate_seconds=round(p["generate_seconds"] + info["seconds"], 1))
        passes.append(p)
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
    """Greedy engine runs on held-out prompts: mean acceptance length (bonus counted) and acceptance rate, with the
    CPU that measured them (its bf16 kernels decide the target's greedy texts: reference.kernels)."""
    from ..bench.reference import machine
    from ..engine import run
    from ..sampling import SamplingParams
    per, steps, committed, drafted, accepted = [], 0, 0, 0, 0
    for p in tqdm(prompts, desc="held-out acceptance", unit="prompt"):
        _, recs, _ = run(lm, drafter, lm.encode(p), sp=SamplingParams(), k=k, max_new_tokens=max_new, detail=False)
        c = sum(len(r.committed) for r in recs)
        d = sum(len(r.drafted) for r in recs)
        a = sum(r.n_accepted for r in recs)
        per.append(dict(prompt=p, steps=len(recs), committed=c, drafted=d, accepted=a,
                        mean_acceptance_length=round(c / len(recs), 4)))
        steps, committed, drafted, accepted = steps + len(recs), committed + c, drafted + d, accepted + a
    cpu = machine()
    return dict(forward=lm.forward_name, k=k, max_new_tokens=max_new, temperature=0.0, prompts=len(prompts),
                cpu=cpu["cpu"], flags=cpu["flags"], attention=cpu["attention"], products=cpu["products"],
                mean_acceptance_length=round(committed / steps, 4),
                acceptance_rate=round(accepted / max(drafted, 1), 4), per_prompt=per)


def write_manifest(kind: str, a, argv, path: Path, manifest: dict) -> None:
    """Complete `manifest` with how the weights were made (command, seed, versions, sha256), write it beside
    them as <kind>.manifest.json and print the held-out acceptance."""
    import transformers
    manifest.update(
        kind=kind, command="python -m specdec_core train " + " ".join([kind] + [shlex.quote(x) for x in argv]),
        seed=a.seed, **weights_record(path),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version()),
        threads=torch.get_num_threads())
    out = path.with_name(f"{kind}.manifest.json")
    out.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {out}")
    m = manifest["acceptance"]
    print(f"held-out greedy, k={m['k']}: mean acceptance length {m['mean_acceptance_length']}, "
          f"acceptance rate {m['acceptance_rate']}")


def weights_record(path: Path) -> dict:
    """What a manifest says of its weights file: name, bytes, sha256 (tests check the shipped file against it)."""
    return dict(weights=path.name, weights_bytes=path.stat().st_size,
                sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def rewrite_manifest(kind: str, folder: Path, fields: dict, command: str) -> dict:
    """`train KIND --retree` (or `--narrow`): the manifest in `folder` with `fields` chosen again and the command
    that did it (`tree_command`), written back; `fields` carry weights_record where the weights changed. Returns
    it."""
    path = folder / f"{kind}.manifest.json"
    man = json.loads(path.read_text())
    man.update(fields, tree_command=command)
    path.write_text(json.dumps(man, indent=1) + "\n")
    print(f"tree {man['tree']}: held-out mean acceptance length {man['acceptance']['mean_acceptance_length']}")
    return man


# ---------------------------------------------------------------- the shared training loop

def make_vocab(lm, rows, n: int, within: DraftVocab | None = None) -> DraftVocab:
    """The n tokens the target says or considers most over the training answers, plus the end-of-sequence ids
    (`within`: among that vocabulary's tokens only)."""
    return DraftVocab.from_counts([r[0] for r in rows], [r[1] for r in rows], n, lm.vocab_size,
                                  always=sorted(lm.eos_ids), soft=[(r[2][r[1] - 1:], r[3][r[1] - 1:]) for r in rows],
                                  within=within)


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
