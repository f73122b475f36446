"""llama.cpp beside our engine: the lesson's advice ("measure on your own engine, check the output stays
identical") applied to a production engine.

Both engines read the same bundled GGUF and get the same prompt token ids (our chat template, applied once),
decode greedily up to the same number of new tokens and stop at the same end-of-sequence ids. Each decodes
plainly and with prompt lookup at the same k: ours is the `lookup` drafter (earliest match of the last 5..1
tokens), llama.cpp's is llama-cpp-python's `LlamaPromptLookupDecoding` (first match of the last 2..1 tokens).
For every repeat and prompt the four runs go back to back in this process, the order reversed every other
repeat, and each engine's speedup over its own plain decoding follows the project's one measuring rule
(bench.sweeps.ratios). Thread count: the same for both (torch.set_num_threads and llama.cpp's n_threads).

With extra drafters (`bench --peer llama.cpp --drafter eagle`), our engine also decodes with each of them, at its
own default k, in the same back-to-back rounds: its tokens/s beside llama.cpp's plain decoding (and ours), and
whether its text is our plain text.

What differs, and the report says so: llama.cpp computes with the file's 4-bit (Q4_1) blocks against 8-bit
activations, we with the same weights' bf16 (or fp32) values against bf16 activations (on a CPU with AVX-512 BF16
our layers read them from the file's 4-bit blocks too, unpacked in registers: q4.py), so the two engines' texts are
not expected to match each other; each engine's speculative text is compared with its own plain text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..bench.invariance import first_difference
from ..bench.sweeps import REPEATS, ratios
from ..drafters import PLAIN, Drafter, make
from ..engine import run
from ..backend import reads_q4
from ..models import LM, bundled_gguf
from ..sampling import SamplingParams

PEER = "llama.cpp"
PEER_PACKAGE = "llama-cpp-python==0.3.36"
INSTALL_HINT = "run `make peers` (installs llama-cpp-python==0.3.36; it builds llama.cpp from source, " \
               "about 9 minutes on 2 cores)"
ENGINES = ("ours", PEER)
LOOKUP = "lookup"        # the drafter both engines run: our prompt lookup, llama.cpp's ngram-simple
OURS = (PLAIN, LOOKUP)   # our side of the comparison itself; any other drafter joins on our engine only


class PeerUnavailable(RuntimeError):
    """llama.cpp's Python bindings are not installed; the message says how to install them."""


def unavailable() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama.cpp is not installed ({e.name or 'llama_cpp'} missing): {INSTALL_HINT}"
    return None


def version() -> str:
    import llama_cpp
    return getattr(llama_cpp, "__version__", "?")


def context_size(longest: int) -> int:
    """llama.cpp's context for sequences up to `longest` tokens, in steps of 256. Kept small on purpose: with a
    draft model llama-cpp-python keeps logits for every slot of the context (n_ctx x 49,152 floats, 400 MB at
    2048)."""
    return 256 * ((longest + 8) // 256 + 1)


def open_llama(threads: int, k: int = 0, n_ctx: int = 512):
    """The bundled GGUF in llama.cpp; with k > 0, with its prompt-lookup drafting of k tokens."""
    why = unavailable()
    if why:
        raise PeerUnavailable(why)
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    draft = LlamaPromptLookupDecoding(num_pred_tokens=k) if k > 0 else None
    return Llama(model_path=str(bundled_gguf()), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                 draft_model=draft, verbose=False)


def llama_decode(llm, ids: list[int], max_new: int, eos: set[int]) -> tuple[list[int], float, float]:
    """Greedy decoding in llama.cpp from our prompt ids -> (new ids, seconds, seconds to the first token).
    reset() first, so every run pays its own prefill: llama-cpp-python would otherwise reuse the KV cache of
    the previous run's matching prefix, which our engine does not do. The end-of-sequence id is kept in the
    output, as our engine keeps it."""
    llm.reset()
    out: list[int] = []
    t0 = time.perf_counter()
    first = 0.0
    gen = llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
    for tok in gen:
        if not out:
            first = time.perf_counter() - t0
        out.append(int(tok))
        if tok in eos or len(out) >= max_new:
            break
    gen.close()
    return out, time.perf_counter() - t0, first


@dataclass
class Timed:
    ids: list[int]
    seconds: float
    ttft: float

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PeerRun:
    """Every timed run: runs[(engine, mode)][repeat][prompt], mode 'plain' or 'spec'."""
    k: int
    threads: int
    max_new: int
    dtype: str
    peer_version: str
    texts: Callable[[list[int]], str]
    runs: dict = field(default_factory=dict)
    prompt_ids: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # our extra drafters: name -> its k; runs[("ours", name)]
    q4: bool = False                            # our layers read the file's 4-bit blocks (q4.py)


def measure(target: LM, prompts: list[list[int]], k: int, max_new: int, threads: int,
            repeats: int | None = None, tick: Callable[[str], None] | None = None,
            drafters: dict[str, Drafter] | None = None) -> PeerRun:
    """Both engines, plain and with prompt lookup, back to back per prompt and repeat (order alternating);
    `drafters` (name -> drafter) adds our engine with each, at its own default k, to the same rounds."""
    import torch
    why = unavailable()
    if why:
        raise PeerUnavailable(why)
    torch.set_num_threads(threads)
    repeats = repeats or REPEATS
    sp = SamplingParams(temperature=0.0)
    eos = set(target.eos_ids)
    plain, lookup = make(PLAIN, target), make(LOOKUP, target)
    n_ctx = context_size(max(len(p) for p in prompts) + max_new)
    ll_plain, ll_spec = open_llama(threads, 0, n_ctx), open_llama(threads, k, n_ctx)

    extra = {n: d for n, d in (drafters or {}).items() if n not in OURS}   # those two run anyway

    def one(engine: str, mode: str, ids: list[int], n: int) -> Timed:
        if engine == "ours":
            dr, kk = {"plain": (plain, 0), "spec": (lookup, k)}.get(mode) or (extra[mode], None)
            out, _, m = run(target, dr, ids, sp=sp, k=kk, max_new_tokens=n, detail=False)
            return Timed(out, m.total_s, m.ttft_s)
        return Timed(*llama_decode(ll_plain if mode == "plain" else ll_spec, ids, n, eos))

    variants = [(e, m) for e in ENGINES for m in ("plain", "spec")] + [("ours", n) for n in extra]
    warm = target.encode("Hello").tolist()
    for e, m in variants:   # one-off costs (allocator, kernels, thread pools) before anything is timed
        one(e, m, warm, 8)
    pr = PeerRun(k, threads, max_new, str(target.dtype).removeprefix("torch."), version(),
                 lambda ids: target.tokenizer.decode(ids, skip_special_tokens=True),
                 {v: [] for v in variants}, [list(p) for p in prompts], {n: d.default_k for n, d in extra.items()},
                 reads_q4(target.fwd))
    for r in range(repeats):
        for v in variants:
            pr.runs[v].append([None] * len(prompts))
        for i, ids in enumerate(pr.prompt_ids):
            for e, m in (variants if r % 2 == 0 else variants[::-1]):
                pr.runs[(e, m)][r][i] = one(e, m, ids, max_new)
                if tick:
                    tick(f"prompt {i + 1}, {e} {m}, repeat {r + 1}")
    return pr


def _diff(pr: PeerRun, a: list[int], b: list[int]) -> dict:
    d = first_difference(a, b)
    ta, tb = pr.texts(a), pr.texts(b)
    return {"identical": d is None, "first_diff_token": d, "first_diff_char": first_difference(ta, tb)}


def rows(pr: PeerRun, meta: list[dict] | None = None) -> list[dict]:
    """One row per (prompt, engine): tokens/s plain and speculative, the speedup by the measuring rule, and
    whether the speculative text equals the engine's own plain text (first differing token and character)."""
    out = []
    for i in range(len(pr.prompt_ids)):
        for e in ENGINES:
            pl = [rep[i] for rep in pr.runs[(e, "plain")]]
            sp = [rep[i] for rep in pr.runs[(e, "spec")]]
            steady = all(x.ids == pl[0].ids for x in pl) and all(x.ids == sp[0].ids for x in sp)
            out.append({**(meta[i] if meta else {"prompt": i + 1}), "engine": e, "k": pr.k,
                        "threads": pr.threads, "tokens_plain": len(pl[0].ids), "tokens_spec": len(sp[0].ids),
                        **ratios([x.tokens_per_s for x in sp], [x.tokens_per_s for x in pl]),
                        "ttft_ms_plain": 1e3 * pl[0].ttft, "ttft_ms_spec": 1e3 * sp[0].ttft,
                        **_diff(pr, pl[0].ids, sp[0].ids), "same_output_every_repeat": steady})
        for name in pr.extra:
            pl = [rep[i] for rep in pr.runs[("ours", "plain")]]
            peer_pl = [rep[i] for rep in pr.runs[(PEER, "plain")]]
            ex = [rep[i] for rep in pr.runs[("ours", name)]]
            out.append({**(meta[i] if meta else {"prompt": i + 1}), **_extra(pr, name, pl, peer_pl, ex,
                                                                             lambda x: x.tokens_per_s),
                        **_diff(pr, pl[0].ids, ex[0].ids),
                        "same_output_every_repeat": all(x.ids == ex[0].ids for x in ex)})
    return out


def extra_engine(name: str) -> str:
    """The engine label of our engine with an extra drafter."""
    return f"ours + {name}"


def _extra(pr: PeerRun, name: str, ours_plain: list, peer_plain: list, spec: list, tps: Callable) -> dict:
    """Our engine with drafter `name` (one entry per repeat): tokens/s by the measuring rule over our plain
    decoding, and its paired ratio over llama.cpp's plain decoding in the same repeats."""
    over_peer = ratios([tps(x) for x in spec], [tps(x) for x in peer_plain])
    return {"engine": extra_engine(name), "drafter": name, "k": pr.extra[name], "threads": pr.threads,
            **ratios([tps(x) for x in spec], [tps(x) for x in ours_plain]),
            "peer_plain_tokens_per_s": over_peer["baseline_tokens_per_s"],
            "speedup_vs_peer_plain": over_peer["speedup"], "speedup_vs_peer_plain_min": over_peer["speedup_min"],
            "speedup_vs_peer_plain_max": over_peer["speedup_max"]}


def compare(target: LM, text: str, k: int, max_new: int, repeats: int | None = None,
            tick: Callable[[str], None] | None = None) -> tuple[int, int, list[dict]]:
    """Road to production's comparison: one prompt (`text`, through the chat template) decoded by both engines,
    plain and with prompt lookup, on as many threads as ours runs -> (k used, threads, summary rows)."""
    import torch
    threads = torch.get_num_threads()
    pr = measure(target, [target.encode(text).tolist()], max(1, int(k)), int(max_new), threads, repeats, tick)
    return pr.k, threads, summary(pr)


def summary(pr: PeerRun) -> list[dict]:
    """One row per engine over all prompts: each repeat's total tokens over total seconds, plain and
    speculative, paired by repeat (the measuring rule); how many prompts kept the plain text exactly."""
    out = []
    for e in ENGINES:
        pl, sp = pr.runs[(e, "plain")], pr.runs[(e, "spec")]
        tps = lambda rep: sum(len(x.ids) for x in rep) / sum(x.seconds for x in rep)
        diffs = [_diff(pr, a.ids, b.ids) for a, b in zip(pl[0], sp[0])]
        ident = sum(d["identical"] for d in diffs)
        out.append({"engine": e, "weights": "Q4_1 (4-bit blocks, as in the file)" if e == PEER
                    else f"{pr.dtype} values of the file's weights" + (", read as its 4-bit blocks" if pr.q4 else ""),
                    "version": pr.peer_version if e == PEER else "this project",
                    "threads": pr.threads, "k": pr.k, "prompts": len(pl[0]),
                    "tokens_plain": sum(len(x.ids) for x in pl[0]), "tokens_spec": sum(len(x.ids) for x in sp[0]),
                    **ratios([tps(rep) for rep in sp], [tps(rep) for rep in pl]),
                    "identical_prompts": ident, "spec_equals_plain": ident == len(diffs),
                    "first_diffs": [(i + 1, d["first_diff_token"], d["first_diff_char"])
                                    for i, d in enumerate(diffs) if not d["identical"]]})
    return out


def extra_summary(pr: PeerRun) -> list[dict]:
    """One row per extra drafter over all prompts: our engine's tokens/s with it, paired by repeat with our
    plain decoding and with llama.cpp's plain decoding (the measuring rule), and whether its text is our plain
    text on every prompt."""
    tps = lambda rep: sum(len(x.ids) for x in rep) / sum(x.seconds for x in rep)
    out = []
    for name in pr.extra:
        pl, ex = pr.runs[("ours", "plain")], pr.runs[("ours", name)]
        diffs = [_diff(pr, a.ids, b.ids) for a, b in zip(pl[0], ex[0])]
        ident = sum(d["identical"] for d in diffs)
        out.append({**_extra(pr, name, pl, pr.runs[(PEER, "plain")], ex, tps), "prompts": len(pl[0]),
                    "tokens_plain": sum(len(x.ids) for x in pl[0]), "tokens_spec": sum(len(x.ids) for x in ex[0]),
                    "identical_prompts": ident, "spec_equals_plain": ident == len(diffs),
                    "first_diffs": [(i + 1, d["first_diff_token"], d["first_diff_char"])
                                    for i, d in enumerate(diffs) if not d["identical"]]})
    return out


def _same_text(s: dict) -> str:
    return (f"yes, {s['identical_prompts']}/{s['prompts']} prompts" if s["spec_equals_plain"] else
            f"no, {s['identical_prompts']}/{s['prompts']} identical; first differences (prompt, token, "
            f"character; from 1): " + ", ".join(f"({p}, {t + 1}, {c + 1})" for p, t, c in s["first_diffs"]))


def _columns(head: list[str], lines: list[list[str]]) -> str:
    """Left-aligned columns; the last one (free text) unpadded."""
    w = [max(len(str(r[j])) for r in [head] + lines) for j in range(len(head) - 1)]
    fmt = lambda r: "  ".join(str(c).ljust(w[j]) for j, c in enumerate(r[:-1])) + "  " + r[-1]
    return "\n".join([fmt(head)] + [fmt(r) for r in lines])


def extra_table_text(extra: list[dict]) -> str:
    """The extra drafters' summary as a plain-text table: our engine with each drafter beside llama.cpp's plain
    decoding and ours."""
    head = ["engine", "k", "tok/s", "llama.cpp plain tok/s", "vs llama.cpp plain (min-max)",
            "vs our plain (min-max)", "text = our plain text"]
    lines = [[s["engine"], str(s["k"]), f"{s['tokens_per_s']:.1f}", f"{s['peer_plain_tokens_per_s']:.1f}",
              f"{s['speedup_vs_peer_plain']:.2f}x ({s['speedup_vs_peer_plain_min']:.2f}-"
              f"{s['speedup_vs_peer_plain_max']:.2f})",
              f"{s['speedup']:.2f}x ({s['speedup_min']:.2f}-{s['speedup_max']:.2f})"
              + (" noisy: rerun" if s["noisy"] else ""), _same_text(s)] for s in extra]
    return _columns(head, lines)


def table_text(summ: list[dict]) -> str:
    """The summary as a plain-text table for the command line."""
    head = ["engine", "weights", "plain tok/s", "lookup tok/s", "speedup (min-max)", "spec text = plain text"]
    lines = [[s["engine"], s["weights"], f"{s['baseline_tokens_per_s']:.1f}", f"{s['tokens_per_s']:.1f}",
              f"{s['speedup']:.2f}x ({s['speedup_min']:.2f}-{s['speedup_max']:.2f})"
              + (" noisy: rerun" if s["noisy"] else ""), _same_text(s)] for s in summ]
    return _columns(head, lines)
