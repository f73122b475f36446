"""Command line: generate, bench, bench-forward, profile, sweep, check, reference, train (`--help`).

generate prints the text (or, with --json, one JSON object as the last stdout line); bench decodes every prompt
of a prompt file (JSON Lines, CSV or plain text: serving.prompt_set) with the baseline and each drafter side by
side in one process and reports speedups (with --peer llama.cpp, llama.cpp plain and with its prompt lookup
beside our engine, on the same model file); check runs the production checklist against live OpenAI-compatible servers;
bench-forward times our forward against transformers' (per forward, and greedy tokens/s); profile splits each
drafter's step time into its phases and sets Leviathan et al.'s predicted speedup beside the measured one; sweep
moves one of temperature, batch size or k; reference records the run the pages draw beside their live
measurements; train trains a draft source for the bundled target.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import pieces
from .bench.sweeps import REPEATS
from .drafters import NAMES, PLAIN, TRAINED, DrafterUnavailable, entry, make, resolve_draft
from .engine import run
from .errors import InputError
from .models import BUNDLED, LM, ModelError, load
from .sampling import SamplingParams
from .serving.prompt_set import FORMATS, bounds

PROMPT_FILE = f"a prompt file: {'; '.join(FORMATS.values())} (told by its suffix or content); {bounds()}"
PROMPT_FILES = "one or more prompt files, each " + PROMPT_FILE[2:]

class PeerMissing(RuntimeError):
    """The peer engine is not installed; the message says how to install it."""


USER_ERRORS = (InputError, ModelError, DrafterUnavailable, ValueError, FileNotFoundError, PeerMissing)


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=BUNDLED, help="target: 'bundled', a local directory or a hub id")
    ap.add_argument("--draft-model", default=None, help="draft for --drafter draft ('bundled', 'distilled', directory, hub id)")
    ap.add_argument("--k", type=int, default=None, help="draft length (default: the drafter's own)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k-policy", default="fixed", choices=["fixed", "schedule", "confidence", "batch"],
                    help="draft length per step: fixed k; schedule (+2 after a fully accepted draft, -1 otherwise, "
                         "from k); confidence (a model draft stops when its top probability < 0.4; k the bound); "
                         "batch (sweep batch: k by batch size, none past 16 rows)")
    ap.add_argument("--draft-sampling", default="sample", choices=["sample", "greedy"],
                    help="how a model draft picks its guesses at T > 0: sample from q (default), or take q's argmax "
                         "(a one-hot q, as serving engines do by default)")
    ap.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    ap.add_argument("--eagle-clock", action="store_true",
                    help="size EAGLE's trees by each step's own clock (adapts to the machine's speed as it runs; the "
                         "same prompt and seed may then draw other trees on a busier machine). Default: by costs "
                         "measured once when the drafter is made")
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
    b.add_argument("--prompts", required=True, nargs="+", help=PROMPT_FILES)
    b.add_argument("--drafter", action="append", default=None,
                   help="repeatable (required without --peer); with --peer, each drafter but lookup also runs on "
                        "our engine, at its own default k, beside llama.cpp's plain decoding")
    b.add_argument("--hf", action="store_true",
                   help="also time transformers' generate, plain and with its prompt lookup (k=10)")
    b.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    b.add_argument("--category", action="append", default=None,
                   help="repeatable: only the prompts of this category (the rows' \"category\" field)")
    b.add_argument("--peer", choices=["llama.cpp"], default=None,
                   help="also run llama.cpp (make peers) on the same GGUF: plain and with its prompt lookup at the "
                        "same k, interleaved with our plain and lookup runs, same threads")
    _repeats(b)
    _common(b)
    p = sub.add_parser("profile", help="per drafter: ms per step in each phase, the draft's cost c, the verify "
                                       "pass's cost, and predicted beside measured speedups")
    p.add_argument("--prompts", required=True, nargs="+", help=PROMPT_FILES)
    p.add_argument("--drafter", action="append", required=True,
                   help=f"repeatable, one of {', '.join(NAMES)}; plain decoding (none) is always measured as the "
                        f"reference")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--category", action="append", default=None,
                   help="repeatable: only the prompts of this category (the rows' \"category\" field)")
    _repeats(p)
    _common(p)
    s = sub.add_parser("sweep", help="acceptance and speedup against temperature, batch size or k")
    s.add_argument("axis", choices=["temperature", "batch", "k"])
    s.add_argument("--prompts", required=True, help=PROMPT_FILE)
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
    c = sub.add_parser("check", help="the production checklist against live OpenAI-compatible servers")
    c.add_argument("--base-url", required=True, help="the server with speculation off, e.g. http://127.0.0.1:8000/v1")
    c.add_argument("--base-url-spec", default=None,
                   help="the server with speculation on; without it, the checklist waits while you restart the "
                        "--base-url server with speculation on")
    c.add_argument("--prompts", required=True, help=PROMPT_FILE)
    c.add_argument("--model", default=None, help="the model name to ask for (default: the server's first)")
    c.add_argument("--model-spec", default=None, help="the speculative server's model name (default: --model)")
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for a connection and for each streamed event (default 30)")
    c.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    c.add_argument("--html", default=None, help="write the report as HTML (with the plot) here")
    c.add_argument("--md", default=None, help="write the report as Markdown here")
    c.add_argument("--csv", default=None, help="write one row per prompt and repeat as CSV here")
    c.add_argument("--json", action="store_true", help="one JSON object per prompt, then the verdict")
    _repeats(c)
    r = sub.add_parser("reference", help="record the reference run the pages draw beside their live measurements: "
                                         "every workload with its own drafter, and every drafter on one prompt")
    r.add_argument("--out", default=None, help="write it here (default: the reference shipped with the app)")
    r.add_argument("--workload", action="append", default=None, help="repeatable (default: all six)")
    r.add_argument("--per-workload", type=int, default=3, help="prompts per workload (default 3, the page's)")
    r.add_argument("--batch", type=int, default=32, help="rows of the batch-serving workload's batch (default 32)")
    r.add_argument("--prompt", default=None,
                   help="the every-drafter prompt (default: the app's default prompt, the first extraction one)")
    _repeats(r)
    _common(r)
    r.set_defaults(k=3, max_new_tokens=32)   # the Workloads page's defaults (the sidebar's)
    t = sub.add_parser("train", help="train a draft source for the bundled target", add_help=False)
    t.add_argument("kind", choices=TRAINED)
    return ap


def _models(args) -> tuple[LM, LM | None]:
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)  # on a shared machine one thread each beats oversubscribed spinning
    target = load(args.model, dtype=args.dtype, device=args.device, forward=args.forward)
    draft = None
    if args.draft_model:
        draft = resolve_draft(args.draft_model, target, target_spec=args.model,
                            load=lambda spec: load(spec, dtype=args.dtype, device=args.device, forward=args.forward))
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


def _prompt_rows(paths: list[str], limit: int | None, categories: list[str] | None = None) -> list[dict]:
    """The rows of every --prompts file (JSON Lines, CSV or plain text: serving.prompt_set), in order, only
    those of --category (when given), cut to --limit; a missing or bad file, a bad limit or a category no row
    has is one line."""
    from .serving import prompt_set
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    sets = [prompt_set.read(f, None if categories else limit) for f in paths]
    rows = [r for ps in sets for r in ps.rows]
    if categories:
        have = sorted({r.get("category", "") for r in rows} - {""})
        missing = [c for c in categories if c not in have]
        if missing:
            raise InputError(f"--category {', '.join(missing)}: no prompt has it; the files have "
                             f"{', '.join(have) or 'no categories'}")
        rows = [r for r in rows if r.get("category") in categories]
    return rows[:limit]


def _check_drafters(names: list[str]) -> None:
    for d in names:
        entry(d)   # DrafterUnavailable for a name the registry does not know


def _check_early(args) -> SamplingParams:
    """Everything that can be checked without a model, checked before the ~15 s load."""
    from .engine import check_run_args
    check_run_args(0 if args.k is None else args.k, args.max_new_tokens)
    if getattr(args, "repeats", None) is not None and not 1 <= args.repeats <= 50:
        raise InputError(f"--repeats must be an integer in [1, 50], got {args.repeats}")
    return _sp(args)


def _make(args, name: str, target, draft_lm=None):
    """A drafter by name, with the command line's drafter options."""
    return make(name, target, draft_lm, clock=args.eagle_clock)


def cmd_generate(args) -> int:
    prompt = _read_prompt(args)
    sp = _check_early(args)
    target, draft_lm = _models(args)
    drafter = _make(args, args.drafter, target, draft_lm)
    ids = target.encode(prompt, raw=args.raw)
    out, recs, m = run(target, drafter, ids, sp=sp, k=args.k, max_new_tokens=args.max_new_tokens,
                       k_policy=args.k_policy)
    text = target.tokenizer.decode(out, skip_special_tokens=True)
    if args.steps:
        for r in recs:
            marks = " ".join(f"{pieces.readable(p.piece)!r}:{p.verdict[0]}" for p in r.positions)
            print(f"step {r.index:3d}  drafted {r.k:2d}  accepted {r.n_accepted:2d}  {r.final_kind:9s} "
                  f"{pieces.readable(r.final_piece)!r}  [{marks}]", file=sys.stderr)
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
    if args.peer:
        return cmd_bench_peer(args)
    if not args.drafter:
        raise InputError("bench needs --drafter (repeatable), or --peer llama.cpp")
    import pandas as pd
    from tqdm import tqdm
    from .bench.sweeps import per_prompt
    rows_in = _prompt_rows(args.prompts, args.limit, args.category)
    sp = _check_early(args)
    _check_drafters(args.drafter)
    target, draft_lm = _models(args)
    drafters = {PLAIN: make(PLAIN, target)} | {d: _make(args, d, target, draft_lm)
                                               for d in args.drafter if entry(d).drafts}
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
    agg["speedup_vs_none"] = agg.tok_s / agg.loc[PLAIN, "tok_s"]
    dest = sys.stderr if args.json else sys.stdout
    print(f"\nmodel {target.name} ({str(target.dtype).removeprefix('torch.')}, {target.device}, "
          f"{target.forward_name} forward){_loop(target)}; "
          f"temperature {sp.temperature}; max new tokens {args.max_new_tokens}; prompts {' '.join(args.prompts)}",
          file=dest)
    print(agg.round(3).to_string(), file=dest)
    if df["category"].nunique() > 1 and "mean_acceptance_length" in df:  # the same figures per category
        cat = df.groupby(["category", "drafter"], sort=False).agg(
            prompts=("id", "count"), mean_acc_len=("mean_acceptance_length", "mean"),
            acceptance_rate=("acceptance_rate", "mean"), mean_speedup=("speedup", "mean"))
        print("\nper category\n" + cat.round(3).to_string(), file=dest)
    return 0


def cmd_bench_peer(args) -> int:
    """Our engine and llama.cpp on the same GGUF, same prompt ids, greedy, plain and prompt lookup at one k; each
    other --drafter joins on our engine only, beside llama.cpp's plain decoding."""
    from tqdm import tqdm
    from .drafters.lookup import PromptLookup
    from .serving import peer
    rows = _prompt_rows(args.prompts, args.limit, args.category)
    _check_early(args)
    if args.temperature != 0:
        raise InputError("--peer compares greedy decoding (is each engine's speculative text its own plain "
                         "text?): leave --temperature at 0")
    _check_drafters(args.drafter or [])
    if args.model != BUNDLED or args.forward != "ours" or args.hf or args.raw:
        raise InputError("--peer runs the bundled GGUF through our forward and the chat template; leave out "
                         "--model, --forward hf, --hf and --raw")
    k = PromptLookup.default_k if args.k is None else args.k
    if k < 1:
        raise InputError(f"--peer needs k >= 1 (both engines draft k tokens), got {k}")
    why = peer.unavailable()
    if why:
        raise PeerMissing(why)
    import torch
    args.threads = args.threads or torch.get_num_threads()
    target, draft_lm = _models(args)
    # our plain and lookup runs are the comparison itself; any other drafter joins it, on our engine only
    extra = {d: _make(args, d, target, draft_lm) for d in dict.fromkeys(args.drafter or []) if d not in peer.OURS}
    prompts = [target.encode(r["prompt"]).tolist() for r in rows]
    meta = [{"id": r["id"], "category": r.get("category", "")} for r in rows]
    repeats = args.repeats or REPEATS
    bar = tqdm(total=(4 + len(extra)) * repeats * len(prompts), desc="bench --peer llama.cpp", file=sys.stderr)
    pr = peer.measure(target, prompts, k, args.max_new_tokens, args.threads, repeats, lambda _: bar.update(), extra)
    bar.close()
    if args.json:
        for r in peer.rows(pr, meta):
            print(json.dumps(r), flush=True)
    summ, summ_extra = peer.summary(pr), peer.extra_summary(pr)
    dest = sys.stderr if args.json else sys.stdout
    print(f"\nsame model file (SmolLM2-135M-Instruct Q4_1 GGUF), same prompt ids (chat template), greedy, "
          f"k = {k} for both prompt lookups, {args.threads} thread(s) each, up to {args.max_new_tokens} new tokens, "
          f"{len(prompts)} prompt(s) from {' '.join(args.prompts)}, {repeats} back-to-back repeats (order "
          f"alternating); llama.cpp = llama-cpp-python {pr.peer_version}", file=dest)
    print(peer.table_text(summ), file=dest)
    if summ_extra:
        print(f"\nour engine with other drafters (each at its own default k), in the same rounds, beside "
              f"llama.cpp's plain decoding:\n{peer.extra_table_text(summ_extra)}", file=dest)
    print("caveat: llama.cpp multiplies the file's 4-bit blocks with 8-bit activations, we the same weights' "
          f"{pr.dtype} values with {pr.dtype} activations: the engines' texts differ from each other; each "
          "speculative text is compared with its own engine's plain text", file=dest)
    if args.json:
        for s_ in summ + summ_extra:
            print(json.dumps({"summary": True, **s_}), flush=True)
    return 0


def rows_said(block: int) -> str:
    """How a score pass's row count follows from its tokens, for a forward whose products pad to `block` rows."""
    if block == 1:
        return "the tokens themselves (this forward pads no rows: every row costs its own share)"
    return f"tokens rounded up to a block of {block} rows (a size that fits a block pays; one past it costs a block)"


def cmd_profile(args) -> int:
    """Where each drafter's step time goes (bench/profile.py), plain decoding beside it as the reference."""
    from tqdm import tqdm
    from .bench import profile as prof
    rows = _prompt_rows(args.prompts, args.limit, args.category)
    sp = _check_early(args)
    _check_drafters(args.drafter)
    target, draft_lm = _models(args)
    drafters = {d: _make(args, d, target, draft_lm) for d in dict.fromkeys([PLAIN] + args.drafter)}
    prompts = [target.encode(r["prompt"], raw=args.raw) for r in rows]
    repeats = args.repeats or REPEATS
    bar = tqdm(total=repeats * len(prompts) * len(drafters), desc="profile", file=sys.stderr)
    out = prof.profile(target, drafters, prompts, sp, args.k, args.max_new_tokens, repeats, args.k_policy,
                       lambda _: bar.update())
    bar.close()
    if args.json:
        info = {"model": _model_info(target), "sampling": sp.to_dict(), "max_new_tokens": args.max_new_tokens,
                "prompts": len(prompts), "threads": _threads()}
        for r in out:
            print(json.dumps({**r, **info}), flush=True)
        return 0
    import pandas as pd
    print(f"\nmodel {target.name} ({str(target.dtype).removeprefix('torch.')}, {target.device}, "
          f"{target.forward_name} forward, {_threads()} thread(s)){_loop(target)}; temperature {sp.temperature}; "
          f"max new tokens "
          f"{args.max_new_tokens}; {len(prompts)} prompt(s) from {' '.join(args.prompts)}; {repeats} repeat(s)")
    cost, speed = prof.tables(out)
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print("\nwhere a step's time goes: ms per step (every step but each run's first) in each phase; c = draft "
              "ms per drafted position / a one-token target step (plain decoding's median score ms); score_x = the "
              "median score pass over that step, which scored a chain of `tokens` (k + 1) or a tree of that many "
              f"nodes; rows = what its products multiplied: {rows_said(target.backend.row_block)}")
        print(cost.round(3).to_string())
        print("\nspeedups: Leviathan et al. (2023) (1 - alpha^(k+1)) / ((1 - alpha)(c k + 1)) with alpha = "
              "accepted / judged guesses; cost model = tokens/step x plain step ms / step ms; measured = tokens/s "
              "over plain decoding's, the median of paired repeats (min-max)")
        print(speed.round(3).to_string())
    return 0


def cmd_reference(args) -> int:
    """Measure and save the reference run (bench/reference.py): the workloads, then every drafter on one prompt."""
    import shlex
    from tqdm import tqdm
    from .bench import reference, showcase
    from .bench.workloads import WORKLOADS
    names = args.workload or list(WORKLOADS)
    bad = [n for n in names if n not in WORKLOADS]
    if bad:
        raise InputError(f"--workload {', '.join(bad)}: choose from {', '.join(WORKLOADS)}")
    if args.per_workload < 1 or args.batch < 1:
        raise InputError("--per-workload and --batch must be at least 1")
    prompt = args.prompt or WORKLOADS["extraction"].prompts[0]
    sp = _check_early(args)
    target, draft_lm = _models(args)
    bar = tqdm(desc="reference", file=sys.stderr)
    tick = lambda _: bar.update()
    rows = []
    for r in showcase.workload_rows(target, names, args.per_workload, args.max_new_tokens, args.k, args.top_p,
                                    args.seed, args.batch, tick=tick, repeats=args.repeats):
        rows.append(r)
        print(f"{r['workload']:>10} {r['drafter']:>10}  {r['speedup']:.2f}x ({r['speedup_min']:.2f}-"
              f"{r['speedup_max']:.2f})  {r['benefit']:<8} lesson {r['expected']:<22} "
              f"{'lands' if r['lands'] else 'differs: ' + r['why']}", file=sys.stderr)
    specs, notes = showcase.buildable(target, [n for n in NAMES if n != PLAIN], draft_lm)
    every = showcase.every(target, specs, target.encode(prompt, raw=args.raw).tolist(), sp, args.max_new_tokens,
                           None, tick, args.repeats)
    bar.close()
    settings = {"k": args.k, "max_new_tokens": args.max_new_tokens, "per_workload": args.per_workload,
                "batch": args.batch, "repeats": args.repeats or REPEATS, "seed": args.seed, "top_p": args.top_p,
                "temperature (every drafter)": sp.temperature}
    ref = reference.record(rows, every, prompt, settings, "python -m specdec_core " + shlex.join(args.argv),
                           _model_info(target), notes)
    path = reference.save(ref, args.out or reference.PATH)
    print(f"{sum(r['lands'] for r in rows)} of {len(rows)} workloads land in the lesson's category; "
          f"{reference.label(ref)}, load average {ref['machine']['load_average']}; written to {path}")
    return 0


def _threads() -> int:
    import torch
    return torch.get_num_threads()


def _loop(target) -> str:
    """'; C++ layer loop' (TorchScript's, or op by op) for our forward, for a figure's header; '' for transformers'."""
    from .backend import loop_name
    name = loop_name(target.fwd)
    return f"; {name}" if name else ""


def _check_prompts(path: str, limit: int | None) -> list[str]:
    return [r["prompt"] for r in _prompt_rows([path], limit)]


def cmd_check(args) -> int:
    """The checklist against live servers: a report (terminal, and --html/--md/--csv files); status 1 when a
    server failed (the report keeps everything else), 2 for bad arguments."""
    from .serving import endpoint, remote
    prompts = _check_prompts(args.prompts, args.limit)
    if not 1 <= args.max_tokens <= 4096:
        raise InputError(f"--max-tokens must be in [1, 4096], got {args.max_tokens}")
    if not 0 < args.timeout <= 3600:
        raise InputError(f"--timeout must be in (0, 3600] seconds, got {args.timeout}")
    if args.repeats is not None and not 1 <= args.repeats <= 50:
        raise InputError(f"--repeats must be an integer in [1, 50], got {args.repeats}")
    for u in filter(None, (args.base_url, args.base_url_spec)):
        try:
            endpoint.roots(u)
        except endpoint.EndpointError as e:
            raise InputError(str(e)) from None
    say = lambda msg: print(msg, file=sys.stderr, flush=True)
    if args.base_url_spec:
        rep = remote.run_pair(args.base_url, args.base_url_spec, prompts, args.model, args.model_spec,
                              args.max_tokens, args.timeout, args.repeats, say)
    else:
        n = args.repeats or 1
        base = remote.run_phase("speculation off", args.base_url, prompts, args.model, args.max_tokens,
                                args.timeout, n, say)
        if remote.failed(base):   # not done (the server unreachable or stopped): nothing to restart for
            spec = remote.Phase("speculation on", args.base_url,
                                error="speculation on: not run (speculation off is not done)")
        else:
            say(f"speculation off: done. Restart the server at {args.base_url} with speculation on, then press "
                "Enter.")
            try:
                input()
                spec = remote.run_phase("speculation on", args.base_url, prompts, args.model_spec or args.model,
                                        args.max_tokens, args.timeout, n, say)
            except EOFError:
                spec = remote.Phase("speculation on", args.base_url,
                                    error="speculation on: not run (no Enter on standard input after the restart; "
                                          "give --base-url-spec to check two servers without waiting)")
        rep = remote.Report(prompts, base, spec, args.max_tokens, args.timeout, paired=False)
    for e in rep.errors:
        print(f"error: {e}", file=sys.stderr)
    if args.json:
        for i in range(len(prompts)):
            a, b = rep.base.first(i), rep.spec.first(i)
            print(json.dumps({"prompt": i + 1, **rep.diff(i), "timing": rep.timing(i),
                              "off": a.to_dict() if a else None, "on": b.to_dict() if b else None}))
        print(json.dumps({"verdict": remote.verdict(rep), "errors": rep.errors,
                          "counters": {ph.label: ph.counters.lines() if ph.counters else None
                                       for ph in (rep.base, rep.spec)}}))
    else:
        print(remote.report_markdown(rep))
    for path, make_text in ((args.html, remote.report_html), (args.md, remote.report_markdown),
                            (args.csv, remote.report_csv)):
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write(make_text(rep))
            say(f"wrote {path}")
    return 1 if rep.errors else 0


def _floats(s: str, what: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--{what} takes comma-separated numbers, got {s!r}") from None


def cmd_sweep(args) -> int:
    from tqdm import tqdm
    from .bench import sweeps, theory
    rows = _prompt_rows([args.prompts], args.limit)
    _check_early(args)
    entry(args.drafter)   # DrafterUnavailable for a name the registry does not know
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
                                       draft_mode=args.draft_sampling)
    elif args.axis == "k":
        vals = [int(x) for x in _floats(args.ks, "ks")]
        bar = tqdm(total=2 * (args.repeats or REPEATS) * len(vals) * len(prompts), desc="sweep k", file=sys.stderr)
        pts = sweeps.sweep_k(target, args.drafter, prompts, vals, temperature=args.temperature,
                             max_new_tokens=args.max_new_tokens, seed=args.seed, draft_lm=draft_lm,
                             tick=lambda _: bar.update(), repeats=args.repeats, draft_mode=args.draft_sampling)
    else:
        vals = [int(x) for x in _floats(args.batch_sizes, "batch-sizes")]
        if any(b < 1 for b in vals):
            raise InputError(f"batch sizes must be >= 1, got {vals}")
        bar = tqdm(total=2 * (args.repeats or REPEATS) * len(vals), desc="sweep batch", file=sys.stderr)
        pts = sweeps.sweep_batch(target, args.drafter, prompts, vals, k=args.k, temperature=args.temperature,
                                 max_new_tokens=args.max_new_tokens, seed=args.seed, draft_lm=draft_lm,
                                 tick=lambda _: bar.update(), repeats=args.repeats, draft_mode=args.draft_sampling,
                                 k_policy=args.k_policy)
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
    args.argv = list(argv)   # the exact command, for what records it (reference)
    try:
        return {"generate": cmd_generate, "bench": cmd_bench, "sweep": cmd_sweep, "check": cmd_check,
                "bench-forward": cmd_bench_forward, "profile": cmd_profile,
                "reference": cmd_reference}[args.cmd](args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
