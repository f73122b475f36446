"""Command line: generate, bench, bench-forward, sweep, train. `python -m specdec_core --help`.

generate prints the text (or, with --json, one JSON object as the last stdout line); bench decodes every prompt
of a JSONL file with the baseline and each drafter side by side in one process and reports speedups;
bench-forward times our forward against transformers' (per forward, and greedy tokens/s); sweep moves one of
temperature, batch size or k; train trains a draft source for the bundled target.
"""
from __future__ import annotations

import argparse
import json
import sys

from .bench.sweeps import REPEATS
from .drafters import NAMES, DrafterUnavailable, make
from .engine import run
from .models import BUNDLED, LM, ModelError, load
from .sampling import InputError, SamplingParams

USER_ERRORS = (InputError, ModelError, DrafterUnavailable, ValueError, FileNotFoundError)


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=BUNDLED, help="target: 'bundled', a local directory or a hub id")
    ap.add_argument("--draft-model", default=None, help="draft for --drafter draft ('bundled', directory, hub id)")
    ap.add_argument("--k", type=int, default=None, help="draft length (default: the drafter's own)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k-policy", default="fixed", choices=["fixed", "schedule", "confidence"],
                    help="draft length per step: fixed k; schedule (+2 after a fully accepted draft, -1 otherwise, "
                         "from k); confidence (a model draft stops when its top probability < 0.4; k the bound)")
    ap.add_argument("--draft-sampling", default="sample", choices=["sample", "greedy"],
                    help="how a model draft picks its guesses at T > 0: sample from q (default), or take q's argmax "
                         "(a one-hot q, as serving engines do by default)")
    ap.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    ap.add_argument("--dtype", default=None, choices=["auto", "bf16", "fp32", "fp16"],
                    help="auto (default): bf16 on CUDA and on CPUs with native bf16, else fp32")
    ap.add_argument("--forward", default="ours", choices=["ours", "hf"],
                    help="ours (default): batch-invariant, static KV cache; hf: transformers' forward (reference)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")


def _repeats(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=int, default=None,
                    help=f"time each plain/speculative pair this many times back to back, order alternating; the "
                         f"speedup is the median paired ratio, with its spread (default {REPEATS})")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specdec_core", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="decode one prompt")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file")
    g.add_argument("--drafter", default="lookup", help=f"one of {', '.join(NAMES)}")
    g.add_argument("--steps", action="store_true", help="print every verification step")
    _common(g)
    b = sub.add_parser("bench", help="baseline vs drafters on a prompt file, side by side")
    b.add_argument("--prompts", required=True, nargs="+", help="JSONL files, one {\"prompt\": ...} per line")
    b.add_argument("--drafter", action="append", required=True, help="repeatable")
    b.add_argument("--hf", action="store_true",
                   help="also time transformers' generate, plain and with its prompt lookup (k=10)")
    _repeats(b)
    _common(b)
    s = sub.add_parser("sweep", help="acceptance and speedup against temperature, batch size or k")
    s.add_argument("axis", choices=["temperature", "batch", "k"])
    s.add_argument("--prompts", required=True, help="JSONL, one {\"prompt\": ...} per line")
    s.add_argument("--drafter", required=True)
    s.add_argument("--temperatures", default="0,0.6,1.2")
    s.add_argument("--batch-sizes", default="1,8,32")
    s.add_argument("--ks", default="1,2,4,8")
    s.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    _repeats(s)
    _common(s)
    f = sub.add_parser("bench-forward", help="ms per forward and greedy tok/s: our forward vs transformers'")
    f.add_argument("--context", type=int, default=200, help="tokens already in the cache (default 200)")
    f.add_argument("--reps", type=int, default=15, help="timed repetitions per figure (medians)")
    f.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per decode run")
    f.add_argument("--prompts", default="specdec_core/prompts/code.jsonl",
                   help="JSONL prompts for the tokens/s figures (default: the code prompts)")
    f.add_argument("--limit", type=int, default=3, help="prompts used for the tokens/s figures")
    f.add_argument("--drafter", action="append", default=None,
                   help="drafters timed with our forward (repeatable; default: lookup and medusa)")
    _common(f)
    t = sub.add_parser("train", help="train a draft source for the bundled target", add_help=False)
    t.add_argument("kind", choices=["draft", "early-exit", "medusa", "eagle"])
    return ap


def _models(args) -> tuple[LM, LM | None]:
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)  # on a shared machine one thread each beats oversubscribed spinning
    target = load(args.model, dtype=args.dtype, device=args.device, forward=args.forward)
    draft = None
    if args.draft_model:
        draft = target if args.draft_model == args.model else load(args.draft_model, dtype=args.dtype,
                                                                     device=args.device, forward=args.forward)
    return target, draft


def _model_info(target: LM) -> dict:
    return {"name": target.name, "dtype": str(target.dtype).removeprefix("torch."), "device": str(target.device),
            "forward": target.forward_name, **({"fallback": target.fallback} if target.fallback else {})}


def _sp(args) -> SamplingParams:
    return SamplingParams(args.temperature, args.top_k, args.top_p, args.seed, args.draft_sampling)


def _read_prompt(args) -> str:
    """--prompt or --prompt-file as text, refused with a clear line when it cannot be a prompt."""
    if args.prompt is not None:
        text = args.prompt
    else:
        from pathlib import Path
        path = Path(args.prompt_file)
        if path.is_dir():
            raise InputError(f"--prompt-file {args.prompt_file!r} is a directory, not a text file")
        if not path.exists():
            raise InputError(f"--prompt-file {args.prompt_file!r} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"--prompt-file {args.prompt_file!r} is not UTF-8 text (byte {e.start})") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:   # bytes that were not UTF-8 in the command line arrive as lone surrogates
        raise InputError("the prompt is not valid UTF-8: check the terminal's encoding") from None
    if not text.strip():
        raise InputError("the prompt is empty: give some text with --prompt or --prompt-file")
    return text


def _check_early(args) -> SamplingParams:
    """Everything that can be checked without a model, checked before the ~15 s load."""
    from .engine import check_run_args
    check_run_args(0 if args.k is None else args.k, args.max_new_tokens)
    if getattr(args, "repeats", None) is not None and not 1 <= args.repeats <= 50:
        raise InputError(f"--repeats must be an integer in [1, 50], got {args.repeats}")
    return _sp(args)


def cmd_generate(args) -> int:
    prompt = _read_prompt(args)
    sp = _check_early(args)
    target, draft_lm = _models(args)
    drafter = make(args.drafter, target, draft_lm)
    ids = target.encode(prompt, raw=args.raw)
    out, recs, m = run(target, drafter, ids, sp=sp, k=args.k, max_new_tokens=args.max_new_tokens,
                       k_policy=args.k_policy)
    text = target.tokenizer.decode(out, skip_special_tokens=True)
    if args.steps:
        for r in recs:
            marks = " ".join(f"{p.piece!r}:{p.verdict[0]}" for p in r.positions)
            print(f"step {r.index:3d}  drafted {r.k:2d}  accepted {r.n_accepted:2d}  {r.final_kind:9s} "
                  f"{r.final_piece!r}  [{marks}]", file=sys.stderr)
    if args.json:
        print(json.dumps({"token_ids": out, "text": text, "drafter": drafter.name,
                          "k": drafter.default_k if args.k is None else args.k,
                          "model": _model_info(target),
                          "sampling": sp.to_dict(), "metrics": m.to_dict()}))
    else:
        print(text)
        print(f"\n[{drafter.name}] {m.tokens} tokens in {m.total_s:.2f} s: {m.tokens_per_s:.1f} tok/s, "
              f"TTFT {m.ttft_s * 1000:.0f} ms, TPOT {m.tpot_s * 1000:.1f} ms, steps {m.steps}, "
              f"acceptance {m.acceptance_rate:.1%}, mean acceptance length {m.mean_acceptance_length:.2f}",
              file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    import pandas as pd
    from tqdm import tqdm
    from .bench.sweeps import per_prompt
    from .bench.workloads import load_jsonl
    rows_in = [r for f in args.prompts for r in load_jsonl(f)]
    sp = _check_early(args)
    for d in args.drafter:
        if d not in NAMES:
            raise DrafterUnavailable(f"unknown drafter {d!r}; choose from {', '.join(NAMES)}")
    target, draft_lm = _models(args)
    drafters = {"none": make("none", target)} | {d: make(d, target, draft_lm) for d in args.drafter if d != "none"}
    rows = rows_in
    prompts = [target.encode(row["prompt"], raw=args.raw) for row in rows]
    meta = [{"id": row["id"], "category": row.get("category", "")} for row in rows]
    out = []
    for r in per_prompt(target, drafters, prompts, sp, args.k, args.max_new_tokens, args.hf, meta,
                        lambda it: tqdm(it, desc="bench", file=sys.stderr), args.repeats, args.k_policy):
        out.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
    df = pd.DataFrame(out)
    df["seconds"] = df.tokens / df.tokens_per_s       # each prompt at its median repeat's speed
    agg = df.groupby("drafter", sort=False).agg(
        prompts=("id", "count"), tokens=("tokens", "sum"), seconds=("seconds", "sum"),
        mean_tok_s=("tokens_per_s", "mean"), mean_speedup=("speedup", "mean"), noisy=("noisy", "sum"))
    if "acceptance_rate" in df:
        agg = agg.join(df.groupby("drafter", sort=False).agg(
            acceptance_rate=("acceptance_rate", "mean"), mean_acc_len=("mean_acceptance_length", "mean"),
            same_tokens=("same_tokens_as_baseline", "mean")))
    agg["tok_s"] = agg.tokens / agg.seconds
    agg["speedup_vs_none"] = agg.tok_s / agg.loc["none", "tok_s"]
    dest = sys.stderr if args.json else sys.stdout
    print(f"\nmodel {target.name} ({str(target.dtype).removeprefix('torch.')}, {target.device}, "
          f"{target.forward_name} forward); "
          f"temperature {sp.temperature}; max new tokens {args.max_new_tokens}; prompts {' '.join(args.prompts)}",
          file=dest)
    print(agg.round(3).to_string(), file=dest)
    if df["category"].nunique() > 1 and "mean_acceptance_length" in df:  # the same figures per category
        cat = df.groupby(["category", "drafter"], sort=False).agg(
            prompts=("id", "count"), mean_acc_len=("mean_acceptance_length", "mean"),
            acceptance_rate=("acceptance_rate", "mean"), mean_speedup=("speedup", "mean"))
        print("\nper category\n" + cat.round(3).to_string(), file=dest)
    return 0


def _floats(s: str, what: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--{what} takes comma-separated numbers, got {s!r}") from None


def cmd_sweep(args) -> int:
    from tqdm import tqdm
    from .bench import sweeps, theory
    from .bench.workloads import load_jsonl
    rows = load_jsonl(args.prompts)[:args.limit]
    _check_early(args)
    if args.drafter not in NAMES:
        raise DrafterUnavailable(f"unknown drafter {args.drafter!r}; choose from {', '.join(NAMES)}")
    target, draft_lm = _models(args)
    make(args.drafter, target, draft_lm)  # fail early if it cannot run
    prompts = [target.encode(r["prompt"], raw=args.raw) for r in rows]
    if args.axis == "temperature":
        vals = _floats(args.temperatures, "temperatures")
        for t in vals:
            SamplingParams(t)  # validate before any work
        bar = tqdm(total=2 * (args.repeats or REPEATS) * len(vals) * len(prompts), desc="sweep temperature",
                   file=sys.stderr)
        pts = sweeps.sweep_temperature(target, args.drafter, prompts, vals, k=args.k,
                                       max_new_tokens=args.max_new_tokens, seed=args.seed, top_p=args.top_p,
                                       draft_lm=draft_lm, tick=lambda _: bar.update(), repeats=args.repeats,
                                       draft=args.draft_sampling)
    elif args.axis == "k":
        vals = [int(x) for x in _floats(args.ks, "ks")]
        bar = tqdm(total=2 * (args.repeats or REPEATS) * len(vals) * len(prompts), desc="sweep k", file=sys.stderr)
        pts = sweeps.sweep_k(target, args.drafter, prompts, vals, temperature=args.temperature,
                             max_new_tokens=args.max_new_tokens, seed=args.seed, draft_lm=draft_lm,
                             tick=lambda _: bar.update(), repeats=args.repeats, draft=args.draft_sampling)
    else:
        vals = [int(x) for x in _floats(args.batch_sizes, "batch-sizes")]
        if any(b < 1 for b in vals):
            raise InputError(f"batch sizes must be >= 1, got {vals}")
        bar = tqdm(total=2 * (args.repeats or REPEATS) * len(vals), desc="sweep batch", file=sys.stderr)
        pts = sweeps.sweep_batch(target, args.drafter, prompts, vals, k=args.k, temperature=args.temperature,
                                 max_new_tokens=args.max_new_tokens, seed=args.seed, draft_lm=draft_lm,
                                 tick=lambda _: bar.update(), repeats=args.repeats, draft=args.draft_sampling)
    table = []
    for p in pts:
        table.append(p)
        if args.json:
            print(json.dumps(p), flush=True)
    bar.close()
    if not args.json:
        import pandas as pd
        key = {"temperature": "temperature", "k": "k", "batch": "batch_size"}[args.axis]
        cols = [key, "drafted", "acceptance_rate", "acceptance_lo", "acceptance_hi", "mean_acceptance_length",
                "tokens_per_s", "baseline_tokens_per_s", "speedup", "speedup_min", "speedup_max", "noisy"]
        if args.axis == "k":  # Leviathan et al.'s prediction from alpha and c pooled over every k measured
            th = theory.theory(table)[args.drafter]
            for p in table:
                p["predicted_speedup"] = theory.expected_speedup(th["alpha"], p["k"], th["c"])
            cols.append("predicted_speedup")
            print(f"alpha = {th['alpha']:.3f} (accepted / tested), c = {th['c']:.3f} (draft ms per token "
                  f"{th['draft_ms']:.2f} / target forward ms {th['forward_ms']:.2f})")
        print(pd.DataFrame(table)[cols].round(3).to_string(index=False))
    return 0


def cmd_bench_forward(args) -> int:
    from .bench.forward import bench_forward
    report = bench_forward(args)
    if args.json:
        print(json.dumps(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        args, rest = parser().parse_known_args(argv)
        from .training import main as train_main
        return train_main(args.kind, rest)
    args = parser().parse_args(argv)
    try:
        return {"generate": cmd_generate, "bench": cmd_bench, "sweep": cmd_sweep,
                "bench-forward": cmd_bench_forward}[args.cmd](args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
