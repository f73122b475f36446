"""make gpu-check: one prepared command for a bare GPU machine (no network, no gguf/streamlit/plotly), that also
runs on the CPU and says what it skipped there.

Our forward (forward.py) is batch-invariant on the CPU by construction: every product's row count is padded so that
one kernel serves every row (He et al., "Defeating Nondeterminism in LLM Inference", 2025). On a GPU the same
padding meets cuBLAS, which picks a kernel (tile shape, split-K) from each product's shape, so a position may score
differently alone, inside a verify step of k + 1 tokens, in a tree or as one row of a batch, and greedy speculative
decoding (Leviathan et al. 2023) may then part from plain decoding at a near-tie. This module measures that, and
the rest of the CUDA path, in sections; each result is (section, name, device, dtype, pass/fail/skipped, reason,
figures):

  forward_vs_hf   our logits vs transformers' on the same weights: small random Llama, Mistral, Qwen2 and a
                  random model of the bundled model's shape; fp32 within 2e-4 x the logit scale, bf16 no further
                  from the fp32 reference than twice transformers' own bf16 error (plus 1e-3 x scale).
  invariance      bitwise: a token alone vs inside a k+1 chain (k = 1..16), tree nodes vs their branch as a chain,
                  rows of a batch vs alone. On CUDA, when the default fails, again with every product padded to
                  32 and to 64 rows (candidate fixes, set at run time: forward.py is not changed).
  greedy          greedy speculative == plain, token for token: lookup and suffix on random weights (one sequence
                  and a batch of 4); the trained drafters where the bundled model loads (they need its weights).
  timing          ms per forward for q = 1..16 new tokens, ours vs transformers'; greedy tokens/s, our plain and
                  lookup decoding vs transformers' `generate`.
  decode_graph    the one-token step as static tensors (decode_graph.py) bitwise == Forward's step (any device);
                  CUDA only: the step captured as CUDA graphs, replay == eager, step ms and greedy tokens/s.
  batch_sweep     CUDA only: batch 1..64, plain vs lookup, aggregate tokens/s and rows equal to plain.

Random weights stand in for the bundled model (whose 93 MB GGUF does not reach a machine that takes 64 MiB of files
per run, and whose loader needs gguf): kernel choice, cost and invariance depend on shapes and dtype, not on the
values; acceptance, and so every speculative speedup, depends on the real weights (docs/gpu-check.md).

Writes OUT/gpu-check.json and OUT/gpu-check.md; exits 1 if any check that ran failed.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .. import forward as fw
from ..drafters import PLAIN, TRAINED
from .invariance import first_difference
from ..models import LM, attach_forward

SECTIONS = ("forward_vs_hf", "invariance", "greedy", "timing", "decode_graph", "batch_sweep")
CUDA_ONLY = ("graph capture", "batch sweep")   # result names that need CUDA (skipped with a reason elsewhere)
CONFIG = Path(__file__).resolve().parent.parent / "weights" / "draft.config.json"
TARGET_LAYERS = 30      # the bundled SmolLM2-135M: the shipped draft's config is its own with 2 layers
# candidate fixes tried on CUDA when the default fails: 32 = MAX_ROWS, every bf16 linear product exactly 32 rows;
# 64 also gives every attention product of a chain step (k <= 16, 3 query heads per kv head) exactly 64 query rows
PAD_VARIANTS = (32, 64)
REAL_WEIGHTS = "acceptance, and so this speedup, depends on the real weights: random-weight figures are not it"


@dataclass
class Result:
    section: str
    name: str
    device: str
    dtype: str
    status: str                      # "pass" | "fail" | "skipped"
    reason: str = ""
    figures: dict = field(default_factory=dict)


@dataclass
class Settings:
    """How much each section does: `full` for the GPU (and a full CPU run), `quick` for the test."""
    layers: int = TARGET_LAYERS      # of the bundled-shape random model
    new_tokens: int = 32             # greedy runs
    prompts: int = 2
    qs: tuple = tuple(range(1, 17))  # forward timing
    reps: int = 10
    sweep: tuple = (1, 2, 4, 8, 16, 32, 64)
    sweep_tokens: int = 32
    trained: bool = True             # try the trained drafters on the bundled model

    @classmethod
    def quick(cls) -> "Settings":
        return cls(layers=2, new_tokens=12, prompts=1, qs=(1, 2, 4, 8, 16), reps=2, sweep=(1, 2), sweep_tokens=6,
                   trained=False)

    @classmethod
    def cpu(cls) -> "Settings":
        """Cheap timings on the CPU (a few cores; the whole CPU run within a few minutes)."""
        return cls(qs=(1, 2, 4, 8, 16), reps=7, new_tokens=24)


# ---------------------------------------------------------------- models

class IdTok:
    """A tokenizer stand-in for random-weight models: ids are their own text; no end-of-sequence token, so every
    run produces exactly the tokens asked for."""
    chat_template = None
    eos_token_id = None
    bos_token = eos_token = pad_token = unk_token = None

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
        return " ".join(map(str, ids))


def _no_special(model) -> None:
    """No bos/eos/pad: generate() and the engine then never stop early, on either side."""
    for c in (model.config, model.generation_config):
        c.bos_token_id = c.eos_token_id = c.pad_token_id = None


def small_model(kind: str, seed: int = 0):
    """A small random model of each family our forward covers, fp32 (GQA: 4 query heads over 2 kv heads). Biases
    (Qwen2's q, k, v) get values, so that a dropped bias would show."""
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)
    cfg, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
                "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    if kind == "mistral":
        kw["sliding_window"] = None
    torch.manual_seed(seed)
    m = cls(cfg(**kw)).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                mod.bias.normal_(0, 0.5)
    _no_special(m)
    return m


def bundled_shape(layers: int = TARGET_LAYERS, seed: int = 0):
    """A random Llama of the bundled SmolLM2-135M's shape, fp32: the shipped draft's config (hidden 576, 9 heads
    over 3 kv heads of 64, MLP 1536, vocab 49152, tied head) with the target's 30 layers. Initialised on the CPU
    from `seed`, so every machine gets the same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM
    d = json.loads(CONFIG.read_text())
    d.update(num_hidden_layers=layers)
    for k in ("dtype", "torch_dtype", "transformers_version"):
        d.pop(k, None)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(LlamaConfig.from_dict(d)).eval()
    _no_special(m)
    return m


def pair(model, dtype: torch.dtype, device: str, name: str) -> tuple[LM, LM]:
    """(ours, transformers') LMs over one copy of `model` in `dtype` on `device` (the same weight tensors)."""
    m = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
    tok = IdTok(m.config.vocab_size)
    ours = attach_forward(LM(m, tok, name, dtype, torch.device(device)), "ours")
    if ours.forward_name != "ours":
        raise RuntimeError(ours.fallback)
    return ours, LM(m, tok, name, dtype, torch.device(device))


def prompts(vocab: int, n: int, length: int = 48, seed: int = 0) -> list[list[int]]:
    """Random prompts with a repeated stretch (so prompt lookup finds matches), crossing a 32-slot block."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        a = torch.randint(0, vocab, (length // 2,), generator=g).tolist()
        out.append(a + a[: length // 4] + torch.randint(0, vocab, (length // 4,), generator=g).tolist())
    return out


def dname(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str):
    """(fn(), seconds), synchronized on CUDA so the time covers the work, not its launch."""
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


@contextlib.contextmanager
def padded_rows(n: int):
    """Every product of our forward padded to a multiple of n rows (forward.ROWS, read at call time) while inside:
    with n = MAX_ROWS (32) every bf16 linear layer multiplies exactly 32 rows, one cuBLAS kernel for every call.
    A candidate fix, tried at run time; forward.py keeps its own value."""
    old = fw.ROWS
    fw.ROWS = n
    try:
        yield
    finally:
        fw.ROWS = old


# ---------------------------------------------------------------- forward vs transformers

@torch.inference_mode()
def _hf_logits(m, ids: torch.Tensor, eager: bool) -> torch.Tensor:
    impl = m.config._attn_implementation
    if eager:
        m.set_attn_implementation("eager")
    try:
        return m(ids[None].to(m.device)).logits[0].float()
    finally:
        m.set_attn_implementation(impl)


def forward_vs_hf(model, name: str, device: str, n: int = 64) -> list[Result]:
    """fp32: ours vs transformers' eager forward. bf16: ours and transformers' each against the fp32 reference."""
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    ours32, hf32 = pair(model, torch.float32, device, name)
    ref = _hf_logits(hf32.model, ids, eager=True)                                    # [n, V]
    got = ours32.fwd(ids, [0] * n, torch.arange(n), ours32.new_cache()).float()
    scale = float(ref.abs().max())
    err = float((got - ref).abs().max())
    tol = 2e-4 * max(1.0, scale)
    out = [Result("forward_vs_hf", name, device, "float32", "pass" if err <= tol else "fail",
                  "" if err <= tol else f"max |ours - transformers eager| {err:.3g} > {tol:.3g}",
                  {"max_abs_diff": err, "tolerance": tol, "logit_scale": scale, "tokens": n})]
    del ours32, hf32
    ours16, hf16 = pair(model, torch.bfloat16, device, name)
    got16 = ours16.fwd(ids, [0] * n, torch.arange(n), ours16.new_cache()).float()
    hf = _hf_logits(hf16.model, ids, eager=False)
    e_ours, e_hf = float((got16 - ref).abs().max()), float((hf - ref).abs().max())
    tol16 = 2 * e_hf + 1e-3 * max(1.0, scale)
    ok = e_ours <= tol16
    out.append(Result("forward_vs_hf", name, device, "bfloat16", "pass" if ok else "fail",
                      "" if ok else f"our bf16 error {e_ours:.3g} > {tol16:.3g} (2 x transformers' bf16 error + slack)",
                      {"ours_vs_fp32": e_ours, "hf_vs_fp32": e_hf, "ours_vs_hf": float((got16 - hf).abs().max()),
                       "tolerance": tol16, "logit_scale": scale, "tokens": n}))
    return out


# ---------------------------------------------------------------- bitwise invariance

def _scored(lm: LM, ctx: list[int], new: list[int]) -> torch.Tensor:
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx), c)
    return lm.forward(torch.tensor(new), c)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def chain_invariance(lm: LM, ids: list[int], kmax: int = 16) -> tuple[list[int], float]:
    """A position scored alone (one-token steps) vs inside a (k+1)-token verify step, k = 1..kmax, and after a
    prefill of another length (a chunk crossing blocks). Returns (failing k's, max |difference|)."""
    ctx, new = ids[:-(kmax + 1)], ids[-(kmax + 1):]
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx), c)
    alone = torch.cat([lm.forward(torch.tensor([t]), c) for t in new])               # [kmax+1, V]
    bad, worst = [], 0.0
    for k in range(1, kmax + 1):
        d = _diff(_scored(lm, ctx, new[:k + 1]), alone[:k + 1])
        worst = max(worst, d)
        if d:
            bad.append(k)
    d = _diff(_scored(lm, ctx[:-5], ctx[-5:] + new[:6])[5:], alone[:6])
    if d:
        bad.append(-1)                                                                # -1: the cross-block chunk
    return bad, max(worst, d)


def tree_invariance(lm: LM, ids: list[int]) -> tuple[list[int], float]:
    """Each node of a 9-node tree vs its branch scored as a chain. Returns (failing nodes, max |difference|)."""
    from ..tree import compile_tree
    ctx, root = ids[:-4], ids[-4]
    tree = compile_tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])
    nodes = [root] + [int(t) for t in ids[-12:-4]]                                    # tree order
    c = lm.new_cache()
    lm.forward(torch.tensor(ctx), c)
    logits, _ = lm.tree_forward(c, torch.tensor(nodes), tree)
    bad, worst = [], 0.0
    for i in range(tree.size):
        branch = [root] + [nodes[j] for j in tree.path_to(i)]
        d = _diff(logits[i], _scored(lm, ctx, branch)[-1])
        worst = max(worst, d)
        if d:
            bad.append(i)
    return bad, worst


def batch_invariance(lm: LM, seqs: list[list[int]], tail: int = 3) -> tuple[list[int], float]:
    """Prefill and a verify step of `tail` tokens for sequences of different lengths in one call each, vs each
    sequence alone. Returns (failing rows, max |difference|)."""
    f = lm.fwd
    c = f.new_cache(batch=len(seqs))
    rows = [i for i, s in enumerate(seqs) for _ in s[:-tail]]
    pos = [j for s in seqs for j in range(len(s) - tail)]
    f(torch.tensor([t for s in seqs for t in s[:-tail]]), rows, torch.tensor(pos), c)
    for i, s in enumerate(seqs):
        c.set_length(i, len(s) - tail)
    rows = [i for i, s in enumerate(seqs) for _ in s[-tail:]]
    pos = [j for s in seqs for j in range(len(s) - tail, len(s))]
    got = f(torch.tensor([t for s in seqs for t in s[-tail:]]), rows, torch.tensor(pos), c)
    bad, worst = [], 0.0
    for i, s in enumerate(seqs):
        d = _diff(got[tail * i:tail * i + tail], _scored(lm, s[:-tail], s[-tail:]))
        worst = max(worst, d)
        if d:
            bad.append(i)
    return bad, worst


def invariance(lm: LM, device: str, variant: str = "default") -> list[Result]:
    vocab = lm.model.config.vocab_size
    ids = prompts(vocab, 1, 64, seed=3)[0]
    seqs = [prompts(vocab, 1, n, seed=4 + n)[0] for n in (61, 23, 40)]
    out = []
    for name, (fn, arg, what) in {"chain k=1..16 vs alone": (chain_invariance, ids, "failing k (-1: cross-block)"),
                                  "tree nodes vs branch": (tree_invariance, ids, "failing nodes"),
                                  "batch rows vs alone": (batch_invariance, seqs, "failing rows")}.items():
        bad, worst = fn(lm, arg)
        out.append(Result("invariance", f"{name} ({variant})", device, dname(lm.dtype), "fail" if bad else "pass",
                          f"{what}: {bad}, max |diff| {worst:.3g}" if bad else "bitwise equal",
                          {"failing": bad, "max_abs_diff": worst, "variant": variant}))
    return out


# ---------------------------------------------------------------- greedy speculative == plain

def _plain(lm: LM, p: list[int], n: int) -> list[int]:
    from ..drafters import make
    from ..engine import run
    return run(lm, make("none", lm), p, max_new_tokens=n, stop_at_eos=False, detail=False)[0]


def greedy_equal(lm: LM, device: str, ps: list[list[int]], n: int, names=("lookup", "suffix"),
                 variant: str = "default") -> list[Result]:
    """Each drafter's greedy output vs plain decoding, per prompt and as a batch of 4 (lookup)."""
    from ..batch import run_batch
    from ..drafters import make
    from ..engine import run
    plain = [_plain(lm, p, n) for p in ps]
    out = []
    for name in names:
        diffs, acc = [], []
        for p, ref in zip(ps, plain):
            toks, _, met = run(lm, make(name, lm), p, max_new_tokens=n, stop_at_eos=False, detail=False)
            diffs.append(first_difference(toks, ref))
            acc.append(getattr(met, "mean_accepted", None))
        bad = [d for d in diffs if d is not None]
        out.append(Result("greedy", f"{name} == plain ({variant})", device, dname(lm.dtype),
                          "fail" if bad else "pass",
                          f"first differing positions per prompt: {diffs}" if bad else
                          f"{len(ps)} prompts x {n} tokens identical",
                          {"prompts": len(ps), "new_tokens": n, "first_diff": diffs, "variant": variant}))
    batch_ps = (ps * 4)[:4]
    res = run_batch(lm, lambda: make("lookup", lm), batch_ps, max_new_tokens=n, stop_at_eos=False)
    alone = [plain[ps.index(p)] for p in batch_ps]
    ok = res.tokens == alone
    out.append(Result("greedy", f"lookup batch of 4 == plain alone ({variant})", device, dname(lm.dtype),
                      "pass" if ok else "fail", "rows identical" if ok else
                      f"rows differing: {[i for i, (a, b) in enumerate(zip(res.tokens, alone)) if a != b]}",
                      {"batch": 4, "new_tokens": n, "variant": variant}))
    return out



def greedy_trained(device: str, n: int, enabled: bool) -> list[Result]:
    """The trained drafters need the bundled target's weights: run them where `load("bundled")` works."""
    def skipped(why: str) -> list[Result]:
        return [Result("greedy", f"{d} == plain (bundled model)", device, "-", "skipped", why) for d in TRAINED]
    if not enabled:
        return skipped("not run in --quick (loading the bundled model takes ~15 s)")
    from .. import load
    from ..drafters import make
    from ..engine import run
    try:
        lm = load("bundled", device=device)
    except Exception as e:   # no gguf package, no bundled file: the GPU machine's case
        return skipped(f"needs the bundled model's weights, which do not load here ({str(e).splitlines()[0]})")
    texts = ["Write a Python function that returns the sum of a list of numbers.",
             "Extract the names from: Alice met Bob in Paris; Bob later wrote to Carol."]
    ids = [lm.encode(t).tolist() for t in texts]
    plain = [_plain(lm, p, n) for p in ids]
    out = []
    for name in TRAINED:
        try:
            d = make(name, lm)
        except Exception as e:
            out.append(Result("greedy", f"{name} == plain (bundled model)", device, dname(lm.dtype), "skipped",
                              f"drafter unavailable: {e}"))
            continue
        diffs, acc = [], []
        for p, ref in zip(ids, plain):
            toks, _, met = run(lm, d, p, max_new_tokens=n, stop_at_eos=False, detail=False)
            diffs.append(first_difference(toks, ref))
        bad = [x for x in diffs if x is not None]
        out.append(Result("greedy", f"{name} == plain (bundled model)", device, dname(lm.dtype),
                          "fail" if bad else "pass",
                          f"first differing positions: {diffs}" if bad else f"{len(ids)} prompts x {n} tokens identical",
                          {"prompts": len(ids), "new_tokens": n, "first_diff": diffs}))
    return out


# ---------------------------------------------------------------- timing

def hf_greedy(lm: LM, p: list[int], n: int) -> list[int]:
    """transformers' own greedy `generate` (no eos on these models: exactly n tokens)."""
    x = torch.tensor([p], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                pad_token_id=0, top_p=None, top_k=None, temperature=None)
    return out[0, x.shape[1]:].tolist()


def timing(ours: LM, hf: LM, device: str, s: Settings) -> list[Result]:
    from ..drafters import make
    from ..engine import run
    ps = prompts(ours.model.config.vocab_size, s.prompts, seed=7)
    dt = dname(ours.dtype)
    from .forward import forward_ms
    per = forward_ms({"ours": ours, "hf": hf}, ps[0] * 4, s.qs, s.reps, warm=1, device=device)
    out = [Result("timing", "ms per forward, q = new tokens after 192", device, dt, "pass",
                  "measured (no threshold)", {"rows": per})]
    methods = {"ours plain": lambda p: run(ours, make("none", ours), p, max_new_tokens=s.new_tokens,
                                           stop_at_eos=False, detail=False)[0],
               "ours lookup": lambda p: run(ours, make("lookup", ours), p, max_new_tokens=s.new_tokens,
                                            stop_at_eos=False, detail=False)[0],
               "hf generate": lambda p: hf_greedy(hf, p, s.new_tokens)}
    for f in methods.values():
        f(ps[0][:16])                                                    # warm-up
    rates, toks = {k: [] for k in methods}, {k: [] for k in methods}
    for p in ps:
        for name, f in methods.items():
            t_out, t = timed(lambda: f(p), device)
            rates[name].append(len(t_out) / t)
            toks[name].append(t_out)
    same = toks["ours lookup"] == toks["ours plain"]
    figs = {k: statistics.median(v) for k, v in rates.items()}
    out.append(Result("timing", f"greedy tokens/s ({s.new_tokens} tokens, {len(ps)} prompts)", device, dt,
                      "pass" if same else "fail",
                      ("ours lookup == ours plain; " if same else "ours lookup != ours plain; ")
                      + f"lookup's rate on random weights: {REAL_WEIGHTS}",
                      {"tokens_per_s": figs, "ours_plain_vs_generate": figs["ours plain"] / figs["hf generate"],
                       "hf_generate_same_tokens_as_ours": toks["hf generate"] == toks["ours plain"]}))
    return out


# ---------------------------------------------------------------- decode graph

def decode_graph(ours: LM, hf: LM, device: str, s: Settings) -> list[Result]:
    from . import decode_graph as dg
    dt = dname(ours.dtype)
    ids = prompts(ours.model.config.vocab_size, 1, 80, seed=9)[0]
    ok, diff = dg.matches_forward(ours.fwd, ids[:50], ids[50:])                # crosses the 64-slot block
    out = [Result("decode_graph", "static step == forward step (eager)", device, dt, "pass" if ok else "fail",
                  "bitwise equal over 30 steps" if ok else f"max |diff| {diff:.3g}", {"max_abs_diff": diff})]
    if not device.startswith("cuda"):
        return out + [Result("decode_graph", "graph capture", device, dt, "skipped", "CUDA graphs need a GPU")]
    p = prompts(ours.model.config.vocab_size, 1, seed=7)[0]
    n = s.new_tokens
    try:
        gd = dg.GraphDecoder(ours.fwd, capacity=len(p) + n + fw.BLOCK)
        g_toks = gd.greedy(p, n)
    except Exception as e:
        return out + [Result("decode_graph", "graph capture", device, dt, "skipped",
                             f"capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                             {"traceback": traceback.format_exc(limit=3)})]
    plain = _plain(ours, p, n)
    same = g_toks == plain
    # one-step cost at the prompt's end: eager Forward vs graph replay (the cache rolled back each time)
    L = len(p) - 1
    eager_c = ours.new_cache()
    ours.forward(torch.tensor(p[:-1]), eager_c)
    e_t, g_t = [], []
    for _ in range(s.reps + 1):
        _, t = timed(lambda: ours.forward(torch.tensor(p[-1:]), eager_c), device)
        eager_c.crop(-1)
        e_t.append(t)
        _, t = timed(lambda: gd.logits(p[-1], L), device)
        g_t.append(t)
    rates = {}
    for name, f in {"graph plain": lambda: gd.greedy(p, n), "ours plain (eager)": lambda: _plain(ours, p, n),
                    "hf generate": lambda: hf_greedy(hf, p, n)}.items():
        f()
        _, t = timed(f, device)
        rates[name] = n / t
    out.append(Result("decode_graph", "graph capture", device, dt, "pass" if same else "fail",
                      "graph greedy tokens == engine plain tokens" if same else "graph greedy tokens differ from plain",
                      {"step_ms": {"eager": statistics.median(e_t[1:]) * 1e3, "graph": statistics.median(g_t[1:]) * 1e3},
                       "tokens_per_s": rates, "graphs": len(gd.graphs), "new_tokens": n}))
    return out


# ---------------------------------------------------------------- batch sweep

def batch_sweep(lm: LM, device: str, sizes, n: int) -> Result:
    """Aggregate greedy tokens/s at each batch size, plain vs lookup (batch.py, our forward), rows == plain."""
    from ..batch import run_batch
    from ..drafters import make
    vocab = lm.model.config.vocab_size
    rows, ok = [], True
    run_batch(lm, lambda: make("none", lm), prompts(vocab, 1), max_new_tokens=2, stop_at_eos=False)   # warm-up
    for B in sizes:
        ps = prompts(vocab, B, seed=100 + B)
        row = {"batch": B}
        toks = {}
        for label, name in (("plain", PLAIN), ("lookup", "lookup")):
            res, t = timed(lambda: run_batch(lm, lambda: make(name, lm), ps, max_new_tokens=n, stop_at_eos=False),
                           device)
            toks[label] = res.tokens
            row[f"{label}_tokens_per_s"] = B * n / t
            row[f"{label}_steps"] = len(res.steps)
        row["lookup_vs_plain"] = row["lookup_tokens_per_s"] / row["plain_tokens_per_s"]
        row["rows_equal"] = toks["lookup"] == toks["plain"]
        ok &= row["rows_equal"]
        rows.append(row)
    return Result("batch_sweep", "batch sweep plain vs lookup", device, dname(lm.dtype), "pass" if ok else "fail",
                  ("lookup rows == plain rows at every batch size; " if ok else "lookup rows differ from plain; ")
                  + f"random weights: {REAL_WEIGHTS}", {"rows": rows, "new_tokens": n})


# ---------------------------------------------------------------- the run

def guarded(section: str, device: str, fn) -> list[Result]:
    """A section that raises is a failure with its error, not a crash of the whole check."""
    try:
        return fn()
    except Exception as e:
        return [Result(section, "error", device, "-", "fail", f"{type(e).__name__}: {e}",
                       {"traceback": traceback.format_exc(limit=6)})]


def check_device(device: str, s: Settings, log) -> list[Result]:
    out: list[Result] = []

    def add(rs):
        for r in rs:
            log(f"  [{r.status:7}] {r.section} / {r.name} ({r.device}, {r.dtype}) {r.reason}")
        out.extend(rs)

    cuda = device.startswith("cuda")
    log(f"{device}: forward vs transformers")
    for kind in ("llama", "mistral", "qwen2"):
        add(guarded("forward_vs_hf", device, lambda: forward_vs_hf(small_model(kind), f"small {kind}", device)))
    big = bundled_shape(s.layers)
    shape = f"bundled shape, {s.layers} layers, random"
    add(guarded("forward_vs_hf", device, lambda: forward_vs_hf(big, shape, device)))

    ours, hf = pair(big, torch.bfloat16, device, shape)
    ps = prompts(big.config.vocab_size, s.prompts)
    log(f"{device}: bitwise invariance, greedy equality ({shape}, bf16)")
    inv = guarded("invariance", device, lambda: invariance(ours, device))
    add(inv)
    greedy = guarded("greedy", device, lambda: greedy_equal(ours, device, ps, s.new_tokens))
    add(greedy)
    if cuda and any(r.status == "fail" for r in inv + greedy):
        for rows in PAD_VARIANTS:
            log(f"{device}: the default failed: again with every product padded to a multiple of {rows} rows")
            with padded_rows(rows):
                add(guarded("invariance", device, lambda: invariance(ours, device, f"rows={rows}")))
                add(guarded("greedy", device, lambda: greedy_equal(ours, device, ps, s.new_tokens,
                                                                   variant=f"rows={rows}")))
    add(greedy_trained(device, s.new_tokens, s.trained))

    log(f"{device}: timing")
    t_lm = (ours, hf) if cuda else pair(small_model("llama"), torch.float32, device, "small llama")
    add(guarded("timing", device, lambda: timing(*t_lm, device, s)))
    log(f"{device}: decode step as a graph")
    add(guarded("decode_graph", device, lambda: decode_graph(ours, hf, device, s)))
    if cuda:
        log(f"{device}: batch sweep {list(s.sweep)}")
        add(guarded("batch_sweep", device, lambda: [batch_sweep(ours, device, s.sweep, s.sweep_tokens)]))
        add([Result("batch_sweep", "batch sweep plain vs distilled draft", device, "bfloat16", "skipped",
                    "needs the bundled target's weights (the draft's embedding and head are the target's)")])
    else:
        add([Result("batch_sweep", "batch sweep plain vs lookup", device, "bfloat16", "skipped",
                    "CUDA only: the batch-size sweep is a GPU reference result")])
    return out


def machine() -> dict:
    import transformers
    cpu = platform.processor()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "cpu": cpu, "cpu_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info |= {"gpu": torch.cuda.get_device_name(0), "cuda_version": torch.version.cuda,
                 "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                 "bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}
    return info


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["# gpu-check", "", f"- date: {report['date']}", f"- command: `{report['command']}`",
             f"- machine: {m.get('gpu', 'no GPU')}; CPU {m['cpu']}; torch {m['torch']}, transformers "
             f"{m['transformers']}", f"- settings: {report['settings']}",
             f"- summary: {report['summary']}", ""]
    if not m["cuda"]:
        lines += ["**No GPU here: nothing in this report was measured on a GPU.** The CUDA-only results are "
                  "marked skipped.", ""]
    lines += ["| section | check | device | dtype | status | reason |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| {r['section']} | {r['name']} | {r['device']} | {r['dtype']} | {r['status']} | "
                     f"{r['reason'].replace('|', '/')} |")
    for r in report["results"]:
        rows = r["figures"].get("rows")
        if rows:
            keys = list(rows[0])
            lines += ["", f"### {r['name']} ({r['device']}, {r['dtype']})", "", "| " + " | ".join(keys) + " |",
                      "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()) + " |"
                      for row in rows]
        elif "tokens_per_s" in r["figures"]:
            rates = ", ".join(f"{k} {v:.1f}" for k, v in r["figures"]["tokens_per_s"].items())
            lines += ["", f"### {r['name']} ({r['device']}, {r['dtype']})", "", f"tokens/s: {rates}"]
    lines += ["", "Random weights stand in for the bundled model: forward agreement, invariance, greedy equality and "
              "costs depend on shapes and dtype; acceptance and every speculative speedup need the real weights "
              "(docs/gpu-check.md)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_core.bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu-check", help="folder for gpu-check.json and gpu-check.md")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the test suite's run)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: the CPU, and CUDA where present")
    ap.add_argument("--layers", type=int, help=f"layers of the bundled-shape random model (default {TARGET_LAYERS})")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default 1: these small models run faster on one thread than on a "
                         "pool that spins against other processes; 0 keeps torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda asked for, but no CUDA GPU is available", file=sys.stderr)
        return 2
    devices = {"auto": ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), "cpu": ["cpu"],
               "cuda": ["cuda"]}[args.device]
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)
    os.environ.setdefault("TQDM_DISABLE", "1")   # the GGUF loader's progress bars would bury the log
    results: list[Result] = []
    for dev in devices:
        s = Settings.quick() if args.quick else Settings() if dev == "cuda" else Settings.cpu()
        if args.layers:
            s.layers = args.layers
        results += check_device(dev, s, log)
    if "cuda" not in devices:
        for sec, name in (("invariance", "bitwise invariance on CUDA"), ("greedy", "greedy equality on CUDA"),
                          ("forward_vs_hf", "forward vs transformers on CUDA"), ("timing", "timing on CUDA")):
            results.append(Result(sec, name, "cuda", "-", "skipped", "no CUDA GPU on this machine"))
    counts = {k: sum(r.status == k for r in results) for k in ("pass", "fail", "skipped")}
    report = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, "-m", "specdec_core.bench.gpu_check"]
                                  + list(argv if argv is not None else sys.argv[1:])),
              "machine": machine(), "settings": "quick" if args.quick else "full", "devices": devices,
              "seconds": round(time.perf_counter() - t0, 1),
              "summary": f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped",
              "sections": list(SECTIONS), "results": [asdict(r) for r in results]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu-check.md").write_text(markdown(report))
    log(f"{report['summary']} in {report['seconds']} s; wrote {out / 'gpu-check.json'} and {out / 'gpu-check.md'}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
