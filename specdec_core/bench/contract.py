"""The output contract, measured: speculation never changes what the target would produce.

Greedy (`greedy_check`): speculative and plain tokens are diffed (invariance.py); where they part, `near_tie`
gives the target's probabilities of the two competing tokens, which says whether rounding could have flipped them.
The forwards (`forward_check`): the same diff on transformers' forward and ours, probing how far a position's
logits move between one-token and (k + 1)-token scoring. Sampled (`sampled_check`): the first tokens of many runs
with and without speculation (`sample_first`) are compared as histograms by total variation and a chi-square
two-sample test (`two_sample`), beside the target's own exact probability of each outcome (`exact`). The Output
contract page lays these out (greedy and sampled take a `tick` called after every run, for its progress bar; the
forwards yield after every run). The rule is exact (Leviathan et al. 2023, Thm 3.5; Chen et al. 2023): a
difference beyond chance is an implementation bug.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

import numpy as np
import torch
from scipy.stats import chi2_contingency

from .. import drafters
from ..engine import decode, run
from ..models import LM
from ..sampling import SamplingParams, probs
from . import invariance

NEAR_TIE = 0.1    # a probability gap that bf16 rounding of a many-token pass can plausibly flip
MIN_EXPECTED = 5  # chi-square's rule of thumb: every expected count at least this


@torch.inference_mode()
def near_tie(lm: LM, prompt: list[int], prefix: list[int], a: int, b: int) -> tuple[float, float]:
    """The target's probabilities (temperature 1) of tokens a and b right after prompt + prefix."""
    logits = lm.forward(torch.tensor(prompt + prefix), lm.new_cache(), last_only=True)   # [1, V]
    p = torch.softmax(logits[0].float(), -1)
    return float(p[a]), float(p[b])


def first_tokens(lm: LM, drafter, prompt: list[int], sp: SamplingParams, span: int, k: int) -> tuple[tuple, int, int]:
    """The first `span` tokens of one run, and how many drafts within them were checked and accepted (so a
    comparison can say whether the acceptance rule really decided the compared tokens)."""
    if span < 1:
        raise ValueError(f"span must be at least 1, got {span}")
    got, checked, accepted = [], 0, 0
    # room for a full draft after the span, so drafting inside it is never cut short by the length limit
    for rec in decode(lm, drafter, prompt, sp=sp, k=k, max_new_tokens=span + k, detail=False):
        for j in range(min(rec.k, rec.n_accepted + 1)):
            if len(got) + j < span:
                checked += 1
                accepted += j < rec.n_accepted
        got += [c.token for c in rec.committed]
        if len(got) >= span or rec.done:
            break
    return tuple(got[:span]), checked, accepted


def sample_first(lm: LM, drafter, prompt: list[int], sp: SamplingParams, runs: int, span: int, k: int,
                 tick: Callable[[int, dict], None] | None = None) -> tuple[dict[tuple, int], int, int]:
    """`runs` runs with seeds sp.seed, sp.seed + 1, ... -> (count of each first-`span` outcome, drafts checked,
    drafts accepted within the span); `tick(i, counts so far)` after run i."""
    counts, checked, accepted = {}, 0, 0
    for i in range(runs):
        t, ch, ac = first_tokens(lm, drafter, prompt, replace(sp, seed=sp.seed + i), span, k)
        counts[t] = counts.get(t, 0) + 1
        checked, accepted = checked + ch, accepted + ac
        if tick:
            tick(i, counts)
    return counts, checked, accepted


@torch.inference_mode()
def exact(lm: LM, prompt: list[int], outcomes: list[tuple], sp: SamplingParams) -> dict[tuple, float]:
    """The target's own probability of each outcome under `sp`, p(t1) p(t2 | t1) ..., one forward per prefix."""
    memo, out = {}, {}
    for t in outcomes:
        pr = 1.0
        for i in range(len(t)):
            pre = t[:i]
            if pre not in memo:
                memo[pre] = probs(lm.forward(torch.tensor(prompt + list(pre)), lm.new_cache(), last_only=True),
                                  sp)[0]                                            # [V]
            pr *= float(memo[pre][t[i]])
        out[t] = pr
    return out


def two_sample(a: dict, b: dict, seed: int = 0, shuffles: int = 1000) -> dict:
    """Two samples of outcomes (outcome -> count): total variation distance, a chi-square two-sample test (rare
    outcomes pooled so every expected count is at least MIN_EXPECTED; p_value None when one bin is left), and
    the TV distance chance alone gives (the runs shuffled between the sides `shuffles` times)."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        raise ValueError("both samples need at least one outcome")
    keys = sorted(set(a) | set(b), key=lambda t: -(a.get(t, 0) + b.get(t, 0)))
    tv = 0.5 * sum(abs(a.get(t, 0) / na - b.get(t, 0) / nb) for t in keys)
    tot = {t: a.get(t, 0) + b.get(t, 0) for t in keys}
    share = min(na, nb) / (na + nb)     # expected count of an outcome on the smaller side, per pooled run
    cols = [[a.get(t, 0), b.get(t, 0)] for t in keys if tot[t] * share >= MIN_EXPECTED]
    rest = [t for t in keys if tot[t] * share < MIN_EXPECTED]
    if rest:   # rare outcomes pooled as "other"; a still-thin "other" joins the rarest frequent bin
        other = [sum(a.get(t, 0) for t in rest), sum(b.get(t, 0) for t in rest)]
        if sum(other) * share >= MIN_EXPECTED or not cols:
            cols.append(other)
        else:
            cols[-1] = [cols[-1][0] + other[0], cols[-1][1] + other[1]]
    chi = pval = None
    if len(cols) > 1:
        chi, pval, _, _ = chi2_contingency(np.array(cols).T)                        # [2, bins]
    rng = np.random.default_rng(seed)
    idx = np.repeat(np.arange(len(keys)), [tot[t] for t in keys])
    null = []
    for _ in range(shuffles):
        rng.shuffle(idx)
        ca, cb = np.bincount(idx[:na], minlength=len(keys)), np.bincount(idx[na:], minlength=len(keys))
        null.append(0.5 * np.abs(ca / na - cb / nb).sum())
    return {"tv": tv, "chi2": chi, "p_value": pval, "bins": len(cols), "tv_chance_median": float(np.median(null)),
            "tv_chance_95": float(np.quantile(null, 0.95))}


def greedy_summary(same: int, total: int, gaps: list[float], forward: str, dtype: str) -> str:
    """The greedy check in words: how many decodings matched, and what the competing tokens' probability gaps
    (`gaps`, one per differing decoding) say about why the others did not."""
    msg = f"**{same} of {total}** decodings are token-for-token identical to plain decoding."
    if not gaps:
        return msg
    if forward == "ours":
        return msg + (" This app's forward scores a position bit for bit the same in a one-token and a many-token "
                      "pass (section 2), so no rounding can explain a difference: it is a bug worth reporting.")
    if max(gaps) < NEAR_TIE:
        return msg + (f" Where they differ, the two competing tokens had target probabilities within "
                      f"**{max(gaps):.3f}** of each other (largest gap): near-ties. The model runs in {dtype}; a "
                      "pass over several tokens rounds differently from a pass over one, which can flip such a "
                      "tie, and from there the texts go their own ways. The acceptance rule itself is exact.")
    return msg + (f" Where they differ, the two competing tokens' target probabilities are up to "
                  f"**{max(gaps):.3f}** apart: more than rounding in {dtype} should flip. Look at the rows below; "
                  "this may be a bug between the rule and the text.")


def sampled_summary(r: dict) -> str:
    """One drafter's sampled comparison (a row of the contract page's table) in words."""
    n = r["Tokens compared"]
    span = f"the first {n} token{'s' if n != 1 else ''}"
    if r["Drafts checked in the span"] == 0:
        said = (f"**`{r['Drafter']}`**: the drafter proposed nothing within {span}, so both sides are plain "
                "decoding here and this comparison tests nothing; compare more tokens or pick another prompt. ")
    else:
        said = (f"**`{r['Drafter']}`**: within {span} the drafter's guesses were checked "
                f"{r['Drafts checked in the span']} times and accepted {r['Drafts accepted in the span']} times, so "
                "the acceptance rule really decided these tokens. ")
    said += (f"The histograms differ by a total variation of **{r['Total variation']:.3f}** (the share of runs you "
             f"would have to move to turn one into the other); shuffling the runs between the two sides gives "
             f"{r['TV by chance (median)']:.3f} typically and up to {r['TV by chance (95%)']:.3f} in 95% of "
             "shuffles, so that is what chance alone looks like. ")
    pv = r["p-value"]
    if pv is None:
        return said + "Every run began the same way, so there is nothing to test: raise the temperature."
    if pv >= 0.05:
        return said + (f"Chi-square test: p = **{pv:.2f}**. A difference at least this large would appear {pv:.0%} "
                       "of the time even if both came from the same distribution: **no evidence that speculation "
                       "changed the output distribution.**")
    return said + (f"Chi-square test: p = **{pv:.3f}**. A difference this large would appear by chance less than 5% "
                   "of the time if both came from the same distribution: either a real difference or a 1-in-20 "
                   "fluke. Rerun with another seed or more runs before concluding.")


def greedy_check(lm: LM, specs: list[tuple[str, object]], prompts: list[tuple[str, list[int]]], k: int,
                 max_new_tokens: int, seed: int, label: Callable[[str], str] = str,
                 tick: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Each prompt (name, ids) decoded greedily plain and with each drafter in `specs` ((name, draft LM or None)):
    one row per drafter and prompt, with the first difference and, where the texts part, the target's
    probabilities of the two competing tokens. `label(name)` is the drafter as the rows name it; `tick(what)`
    after every run."""
    sp = SamplingParams(0.0, 0, 1.0, seed)
    none = drafters.make(drafters.PLAIN, lm)
    for pname, prompt in prompts:
        plain, _, _ = run(lm, none, prompt, sp=sp, max_new_tokens=max_new_tokens, detail=False)
        if tick:
            tick(f"{pname}, plain")
        for n, dlm in specs:
            spec, _, _ = run(lm, drafters.make(n, lm, dlm), prompt, sp=sp, k=k, max_new_tokens=max_new_tokens,
                             detail=False)
            if tick:
                tick(f"{pname}, {n}")
            j = invariance.first_difference(plain, spec)
            row = {"Prompt": pname, "Drafter": label(n), "Tokens plain": len(plain), "Tokens spec": len(spec),
                   "Identical": j is None, "First difference at token": j, "p(plain token)": None,
                   "p(spec token)": None, "plain": plain, "spec": spec}
            if j is not None and j < min(len(plain), len(spec)):
                row["p(plain token)"], row["p(spec token)"] = near_tie(lm, prompt, plain[:j], plain[j], spec[j])
            yield row


def forward_check(reference: LM, ours: LM, prompts: list[tuple[str, list[int]]], k: int,
                  max_new_tokens: int) -> Iterator[tuple[str, invariance.Drift, int | None]]:
    """Prompt lookup greedy on and off, per prompt on the reference forward and then ours, one yield after each
    forward: (prompt name, the drift, the probed position). Ours is probed where the reference drifted."""
    for pname, prompt in prompts:
        probe = None
        for lm in (reference, ours):   # the reference first: ours is probed where it drifted
            d = invariance.compare(lm, lambda lm=lm: drafters.make("lookup", lm), prompt, k, max_new_tokens, probe)
            probe = d.position if probe is None else probe
            yield pname, d, probe


def sampled_check(lm: LM, specs: list[tuple[str, object]], prompt: list[int], sp: SamplingParams, runs: int,
                  span: int, k: int, shown: int, label: Callable[[str], str] = str,
                  tick: Callable[[str, int, dict], None] | None = None, out: dict | None = None) -> Iterator[dict]:
    """`runs` sampled runs per side (plain decoding, then each drafter in `specs`, on disjoint seeds from
    sp.seed), their first `span` tokens counted; one row per drafter compared with plain decoding (`two_sample`).
    `out` receives "counts" (side label -> outcome -> count) and "ref" (the target's exact probability of the
    `shown` most frequent outcomes); `tick(side label, run index, counts so far)` after every run."""
    counts, stats = {}, {}
    for side, (n, dlm) in enumerate([(drafters.PLAIN, None)] + specs):
        name = label(n)

        def on_run(i, so_far, name=name):
            counts[name] = so_far
            if tick:
                tick(name, i, counts)
        seeded = replace(sp, seed=sp.seed + side * runs)   # disjoint seeds: independent sides
        counts[name], checked, accepted = sample_first(lm, drafters.make(n, lm, dlm), prompt, seeded, runs, span,
                                                       drafters.entry(n).k(k), on_run)
        stats[name] = {"checked": checked, "accepted": accepted}
    top = sorted({t for c in counts.values() for t in c}, key=lambda t: -sum(c.get(t, 0) for c in counts.values()))
    ref = exact(lm, prompt, top[:shown], replace(sp, seed=0))
    if out is not None:
        out["counts"], out["ref"] = counts, ref
    plain = counts[label(drafters.PLAIN)]
    for name in list(counts)[1:]:
        cmp = two_sample(plain, counts[name], sp.seed)
        yield {"Drafter": name, "Runs per side": runs, "Temperature": sp.temperature, "Tokens compared": span,
               "Drafts checked in the span": stats[name]["checked"],
               "Drafts accepted in the span": stats[name]["accepted"],
               "Distinct outcomes": len(set(plain) | set(counts[name])),
               "Total variation": cmp["tv"], "TV by chance (median)": cmp["tv_chance_median"],
               "TV by chance (95%)": cmp["tv_chance_95"], "Chi-square": cmp["chi2"], "Bins": cmp["bins"],
               "p-value": cmp["p_value"]}
