"""bench-forward: what our forward (forward.py) costs against transformers', on the same weights, in one process.

Two tables, every figure a median of interleaved repetitions (A, B, A, B, ...), so a busy machine slows both
sides alike:
  1. ms per forward of q = 1, 2, 4, 8, 16 new tokens after a context of ~200 (the cache rolled back each time;
     every q in each repetition): a decode step is q = 1, a verify step of k drafts is q = k + 1.
  2. greedy tokens/s over N new tokens: our plain decoding, transformers' `generate`, transformers' prompt
     lookup, and our engine with each drafter; speedups against our plain decoding and against `generate`.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from ..drafters import PLAIN, entry
from ..backend import loop_name
from ..models import LM, load


def forward_ms(lms: dict[str, LM], context: list[int], qs=(1, 2, 4, 8, 16), reps: int = 15, warm: int = 2,
               device: str = "cpu") -> list[dict]:
    """Per forward: name -> q -> ms, every (q, forward) pair once in each repetition (the cache rolled back each
    time), so ratios between q's are side by side; the first `warm` reps warm the shapes up; on CUDA each forward is
    timed between synchronizations."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    caches = {}
    for name, lm in lms.items():
        c = lm.new_cache()
        lm.forward(torch.tensor(context), c)
        caches[name] = c
    samples = {(q, name): [] for q in qs for name in lms}
    for _ in range(reps + warm):          # every q and forward in each repetition: a drifting host moves all alike
        for q in qs:
            ids = torch.tensor(context[:q])
            for name, lm in lms.items():
                c = caches[name]
                sync()
                t = time.perf_counter()
                lm.forward(ids, c)
                sync()
                samples[(q, name)].append(time.perf_counter() - t)
                c.crop(-q)
    return [{"q": q} | {f"{name}_ms": statistics.median(samples[(q, name)][warm:]) * 1e3 for name in lms}
            for q in qs]


def _hf_generate(lm: LM, ids: torch.Tensor, n: int, lookup: int = 0) -> list[int]:
    x = ids.view(1, -1).to(lm.device)
    kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                do_sample=False, pad_token_id=lm.tokenizer.eos_token_id, top_p=None, top_k=None,
                                temperature=None, **kw)
    return out[0, x.shape[1]:].tolist()


def decode_rates(ours: LM, drafters: dict, prompts: list[torch.Tensor], n: int, reps: int = 1) -> dict[str, dict]:
    """Greedy tokens/s per method, medians over prompts x reps, each prompt's methods run back to back."""
    from ..engine import run
    rates: dict[str, list[float]] = {}
    same: dict[str, list[bool]] = {}
    methods = {"ours plain": lambda ids: run(ours, drafters[PLAIN], ids, max_new_tokens=n, stop_at_eos=False,
                                            detail=False)[0],
               "hf generate": lambda ids: _hf_generate(ours, ids, n),
               "hf prompt lookup": lambda ids: _hf_generate(ours, ids, n, lookup=10)}
    for name, d in drafters.items():
        if entry(name).drafts:
            methods[f"ours {name}"] = (lambda d: lambda ids: run(ours, d, ids, max_new_tokens=n, stop_at_eos=False,
                                                                 detail=False)[0])(d)
    warm = prompts[0][:16]
    for f in methods.values():
        f(warm)
    from tqdm import tqdm
    for ids in tqdm(prompts * reps, desc="bench-forward decode", file=sys.stderr):
        out = {}
        for name, f in methods.items():
            t = time.perf_counter()
            toks = f(ids)
            rates.setdefault(name, []).append(len(toks) / (time.perf_counter() - t))
            out[name] = toks
        for name, toks in out.items():   # greedy output equal to its own engine's plain output?
            base = out["hf generate"] if name.startswith("hf") else out["ours plain"]
            same.setdefault(name, []).append(toks == base)
    return {name: {"tokens_per_s": statistics.median(r), "same_tokens": sum(same[name]) / len(same[name])}
            for name, r in rates.items()}


def bench_forward(args) -> dict:
    import pandas as pd
    from ..drafters import make
    from .workloads import load_jsonl
    if args.threads:
        torch.set_num_threads(args.threads)
    ours = load(args.model, dtype=args.dtype, device=args.device, forward="ours")
    if ours.forward_name != "ours":
        raise ValueError(f"our forward does not run this model: {ours.fallback}")
    hf = LM(ours.model, ours.tokenizer, ours.name, ours.dtype, ours.device)   # same weights, transformers' forward
    rows = load_jsonl(args.prompts)[:args.limit]
    prompts = [ours.encode(r["prompt"]) for r in rows]
    context = (torch.cat(prompts * (1 + args.context // sum(len(p) for p in prompts)))[:args.context]).tolist()
    per = forward_ms({"ours": ours, "hf": hf}, context, reps=args.reps)
    names = args.drafter or ["lookup", "medusa"]
    drafters = {PLAIN: make(PLAIN, ours)} | {d: make(d, ours) for d in names}
    rates = decode_rates(ours, drafters, prompts, args.new_tokens)
    base, gen = rates["ours plain"]["tokens_per_s"], rates["hf generate"]["tokens_per_s"]
    dest = sys.stderr if args.json else sys.stdout
    print(f"model {ours.name} ({str(ours.dtype).removeprefix('torch.')}, {ours.device}, "
          f"{torch.get_num_threads()} threads; ours: {loop_name(ours.fwd)}); context {len(context)} tokens; "
          f"medians of {args.reps}", file=dest)
    df = pd.DataFrame(per)
    df["ours_vs_hf"] = df.hf_ms / df.ours_ms
    df["ours_vs_q1"] = df.ours_ms / df.ours_ms.iloc[0]
    print(df.round(2).to_string(index=False), file=dest)
    tab = pd.DataFrame([{"method": k, **v, "vs_ours_plain": v["tokens_per_s"] / base,
                         "vs_hf_generate": v["tokens_per_s"] / gen} for k, v in rates.items()])
    print(f"\ngreedy, {args.new_tokens} new tokens, {len(prompts)} prompts of {args.prompts}", file=dest)
    print(tab.round(3).to_string(index=False), file=dest)
    return {"model": ours.name, "dtype": str(ours.dtype).removeprefix("torch."), "device": str(ours.device),
            "threads": torch.get_num_threads(), "loop": loop_name(ours.fwd), "context": len(context),
            "forward_ms": per, "decode": rates}
