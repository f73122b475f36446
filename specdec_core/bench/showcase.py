"""The lesson's claims measured on their defaults: each workload with the drafter that shows it best
(bench.workloads), and every drafter on one prompt.

Both follow the measuring rule (sweeps.ratios: plain and speculative back to back, repeated, order alternating,
the median pair quoted with its spread) and say where a step's time went (profile.split: the draft's ms, the
verify pass's ms, the bookkeeping, against a plain step's ms), so a row whose acceptance is good but whose
speedup is not explains itself in its own numbers.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from ..drafters import BUNDLED, NAMES, PLAIN, DrafterUnavailable, entry, make
from ..engine import run
from ..models import LM
from ..sampling import SamplingParams
from . import profile, sweeps
from .sweeps import Tick
from .workloads import WORKLOADS, Workload, benefit

ORDER = ("Negative", "Low", "Moderate", "High")   # benefit() from worst to best
PREFILL_SHARE = 0.2   # a row whose runs spend this share or more before their first token says so


def own_drafter(target: LM, w: Workload) -> tuple[str, object]:
    """(drafter, draft model) that shows workload `w` best: None as the draft model of `draft` picks the
    distilled draft shipped for the bundled target (drafters.make); `bundled` lets the target draft for itself."""
    if not entry(w.drafter).draft_model:
        return w.drafter, None
    return w.drafter, target if w.draft_model == BUNDLED else None


def why(w: Workload, r: dict) -> str:
    """Beside a row that disagrees with the lesson: how, in the row's own measured numbers; "" when it agrees."""
    got = r["benefit"]
    if w.agrees(got):
        return ""
    want = (w.lands or (w.expected,))[0]
    side = "better" if ORDER.index(got) > ORDER.index(want) else "worse"
    tps, step, plain = r["mean_acceptance_length"], r.get("step_ms", 0.0), r.get("plain_step_ms", 0.0)
    txt = f"{side} than the lesson's {w.expected}: acceptance {r['acceptance_rate']:.0%}, {tps:.2f} tokens a step"
    if step and plain:
        where = f" (draft {r['draft_ms']:.1f} ms, verify {r['score_ms']:.1f} ms)" if "draft_ms" in r else ""
        txt += (f"; a step took {step:.1f} ms{where} against a plain step's {plain:.1f} ms, {step / plain:.2f}× as "
                f"much, so {tps:.2f} / {step / plain:.2f} ≈ {tps * plain / step:.2f}× expected")
    score, one = r.get("score_ms") or 0.0, r.get("plain_score_ms") or 0.0
    if side == "worse" and score and one and score / one >= 1.05:
        # the lesson's claim assumes a memory-bound step, where the drafted tokens' rows ride along nearly free
        txt += (f". Scoring the drafted tokens cost {score / one:.2f}× scoring one here: this machine pays for every "
                f"verified row in arithmetic (no matrix units, or a step already quick to read its weights), so "
                f"speculation has less spare compute to spend than the lesson assumes")
    txt += prefill_said(r) if side == "worse" else ""
    return txt + (". Its pairs spread widely: noisy, rerun" if r.get("noisy") else "")


def prefill_said(r: dict) -> str:
    """Where a row's runs spent a large share before their first token (the prompt read through the target, which
    speculation does not shorten): that share, and the speedup of what came after it; "" where it is small."""
    ttft, tpot, base = r.get("ttft_ms") or 0.0, r.get("tpot_ms") or 0.0, r.get("baseline_tpot_ms") or 0.0
    n = r.get("tokens", 0) / max(1, r.get("prompts", 1))      # tokens a run
    if not (ttft and tpot and base and n > 1):
        return ""
    share = ttft / (ttft + (n - 1) * tpot)                    # of a speculative run
    if share < PREFILL_SHARE:
        return ""
    return (f". Each run also spent {ttft:.0f} ms before its first token, reading the prompt, {share:.0%} of a "
            f"speculative run: speculation does not shorten that part (the decoding after it ran {base / tpot:.2f}× "
            f"plain's), so short answers after long prompts pull the whole run's ratio toward 1")


def warm(target: LM, specs: list[tuple[str, object]], ids: list[int], sp: SamplingParams) -> None:
    """A few untimed tokens with plain decoding and each drafter first: one-off costs (a draft model's load,
    the allocator, kernels) would otherwise land in the first timed pair."""
    for n, lm in [(PLAIN, None)] + list(specs):
        run(target, make(n, target, lm), ids, sp=sp, max_new_tokens=profile.WARMUP_TOKENS, detail=False)


def workload_rows(target: LM, names: Iterable[str], prompts: int, max_new: int, k: int | None,
                  top_p: float = 1.0, seed: int = 0, batch: int = 32,
                  specs: list[tuple[str, object]] | None = None, tick: Tick = None,
                  repeats: int | None = None) -> Iterator[dict]:
    """One row per workload and drafter, as soon as it is measured: each workload's own drafter (own_drafter)
    unless `specs` ((name, draft model) pairs) are given, at the workload's own temperature; its first
    `prompts` prompts one at a time, or for a batch workload one batch of `batch` rows through batch.py. Each
    row: sweeps' point, where the time went (profile.split; a batch step's wall time for a batch row), the
    benefit in the lesson's words, whether it lands in the lesson's category and, when not, why."""
    for name in names:
        w = WORKLOADS[name]
        ss = specs if specs is not None else [own_drafter(target, w)]
        sp = SamplingParams(w.temperature, 0, top_p, seed, w.draft_sampling)
        at = sweeps.at(tick, name)
        warm(target, ss, target.encode(w.prompts[0]).tolist(), sp)
        if w.batch_size > 1:
            ids = [target.encode(t).tolist() for t in w.prompts]
            rows = [ids[i % len(ids)] for i in range(batch)]
            out = sweeps.batch_point(target, rows, sp, k, max_new, ss, at, repeats)
            got = [(n, out[n], {}, batch, "as one batch") for n, _ in ss]
        else:
            ids = [target.encode(t).tolist() for t in w.prompts[:prompts]]
            pair = sweeps.side_by_side(target, ids, sp, k, max_new, ss, at, repeats)
            base = [rr for rep in pair.base for _, rr, _ in rep]
            got = [(n, sweeps.point(pair, n), profile.split([rr for rep in pair.spec[n] for _, rr, _ in rep], base),
                    len(ids), "one at a time") for n, _ in ss]
        for n, p, split, count, how in got:
            r = {**p, **split, "workload": name, "drafter": n,
                 "draft_model": w.draft_model if entry(n).draft_model and specs is None else "",
                 "temperature": w.temperature, "requests": count, "decoded": how, "expected": w.expected,
                 "benefit": benefit(p["speedup"])}
            r["lands"] = w.agrees(r["benefit"])
            r["why"] = why(w, r)
            yield r


def buildable(target: LM, names: Iterable[str] = NAMES, draft_lm=None) -> tuple[list[tuple[str, object]], list[str]]:
    """(name, draft model) for each drafter that can run on `target`; a line for each that cannot."""
    ok, notes = [], []
    for n in names:
        try:
            make(n, target, draft_lm if entry(n).draft_model else None)
        except DrafterUnavailable as e:
            notes.append(f"{n}: {e}")
            continue
        ok.append((n, draft_lm if entry(n).draft_model else None))
    return ok, notes


def every(target: LM, specs: list[tuple[str, object]], ids: list[int], sp: SamplingParams, max_new: int,
          k: int | None = None, tick: Tick = None, repeats: int | None = None) -> list[dict]:
    """Every drafter in `specs` ((name, draft model) pairs) on one prompt, plain decoding first: one
    profile.profile row each (acceptance, tokens per step, ms per step in each phase against a plain step,
    the speedup by the measuring rule, same tokens as plain at T = 0). `k` None: each drafter's own."""
    drafters = {PLAIN: make(PLAIN, target)} | {n: make(n, target, lm) for n, lm in specs if n != PLAIN}
    return profile.profile(target, drafters, [ids], sp, k, max_new, repeats, tick=tick)
