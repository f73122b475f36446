"""The target's weight format, chosen by what a verify pass costs here: the lesson's regime by measurement.

Speculative decoding pays when scoring k + 1 tokens in one target pass costs about one token's pass (Leviathan et
al. 2023, §3; Chen et al. 2023): a one-token step is bound by reading the weights, and the drafted tokens' rows
ride on arithmetic that step leaves idle. How much is idle depends on the weights' format as much as on the CPU.
Cheaper weights (bf16 instead of fp32, or the bundled file's own 4-bit blocks, q4.py) make a one-token step
quicker to read, so plain decoding gets faster, but the extra rows of a verify pass now pay for their arithmetic:
the format has claimed the headroom speculation lives on, as a full batch does in the lesson's batching row.

So the app decides the format from a measurement at load, never from a CPU's name: each format this machine
can run (`formats`) is loaded and timed on a one-token pass and an eight-token pass (`measure`, through the
measuring rule of bench.passes), and `choose` keeps the formats whose eight-token pass costs at most LIMIT times
one token's, taking the quickest one-token step among them (else the lowest ratio); timings too noisy to tell the
formats apart keep the format models.load picks by itself. Every format keeps the
output contract on its own: greedy speculation gives plain decoding's tokens in the same format (formats differ
from each other in their rounding, so their outputs may differ between formats).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from ..backend import q4_kernel, reads_q4
from ..models import BUNDLED, LM, load, pick_device, pick_dtype
from .passes import token_cost

# name -> how the sidebar and the pages say it
FORMATS = {"fp32": "dense fp32", "bf16": "dense bf16", "q4": "4-bit blocks"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "q4": torch.bfloat16}
AUTO = "auto"
LIMIT = 1.35     # an 8-token pass at most this many times one token's still leaves speculation its headroom
BIG = 8          # tokens of the verify pass measured: 7 drafts and the pending token
REPS = 3         # pairs per format at load (bench.passes.REPS is 7): a second or so on a 2-core CPU
# the context the passes are measured after (a prompt's worth of tokens, as a verify step sees)
CONTEXT = ("Extract every date from this text and list them one a line: the meeting moved from 3 March to "
           "10 March, and the report is due on 1 April.")


class FormatError(ValueError):
    """A weight format that does not exist, or that this machine cannot run for this model."""


@dataclass(frozen=True)
class Cost:
    """What one target pass cost in a format: one new token against BIG new tokens, by the measuring rule."""
    one_ms: float
    big_ms: float
    ratio: float            # big / one, the median pair's
    noisy: bool = False     # the pairs spread over the rule's limit

    @classmethod
    def of(cls, figures: dict) -> "Cost":
        """From bench.passes.token_cost's figures."""
        return cls(figures["small_ms"], figures["big_ms"], figures["ratio"], bool(figures["noisy"]))


def formats(spec: str = BUNDLED, device: str | torch.device | None = None) -> list[str]:
    """The weight formats this machine can run `spec` in, fastest-to-read last: dense fp32 and dense bf16
    everywhere (a CPU without native bf16 runs it through oneDNN's conversions), and the bundled file's 4-bit
    blocks where the 4-bit kernel runs here (it tries the kernel: AVX-512 BF16 or AMX, and the C++ build)."""
    dev = pick_device(str(device) if device is not None else None)
    out = ["fp32", "bf16"]
    if spec == BUNDLED and dev.type == "cpu" and q4_kernel()[0] is not None:
        out.append("q4")
    return out


def default_format(spec: str = BUNDLED, device: str | None = None) -> str | None:
    """The format models.load(spec) picks by itself (its dtype rule, and the 4-bit blocks where they attach);
    None for a model other than the bundled one, or a dtype that is no format here (fp16)."""
    if spec != BUNDLED:
        return None
    dev = pick_device(device)
    dt = pick_dtype(dev)
    if dt == torch.float32:
        return "fp32"
    if dt != torch.bfloat16:
        return None
    return "q4" if "q4" in formats(spec, dev) else "bf16"


def pinned(spec: str = BUNDLED) -> str | None:
    """The format an operator's SPECDEC_DTYPE (other than auto) sets for the bundled model, which the app then
    runs instead of measuring; None when it is unset."""
    env = os.environ.get("SPECDEC_DTYPE", "").strip().lower()
    return default_format(spec) if env and env != AUTO else None


def check(fmt: str, spec: str = BUNDLED, device: str | None = None) -> str:
    """`fmt` if this machine can run `spec` in it, else FormatError saying which it can."""
    if fmt not in FORMATS:
        raise FormatError(f"unknown weight format {fmt!r}; use one of {', '.join([AUTO, *FORMATS])}")
    here = formats(spec, device)
    if fmt not in here:
        why = q4_kernel()[1] if fmt == "q4" and spec == BUNDLED else "only the bundled model ships 4-bit blocks"
        raise FormatError(f"this machine cannot run the {FORMATS[fmt]} ({why}); it runs "
                          f"{', '.join(FORMATS[f] for f in here)}")
    return fmt


def load_format(fmt: str, spec: str = BUNDLED, device: str | None = None, forward: str = "ours") -> LM:
    """`spec` loaded in weight format `fmt`: fp32 or bf16 dense products, or (q4) bf16 with the layers' products
    reading the file's 4-bit blocks."""
    check(fmt, spec, device)
    lm = load(spec, dtype=DTYPES[fmt], device=device, forward=forward, q4_blocks=fmt == "q4")
    if fmt == "q4" and not reads_q4(lm.fwd):
        raise FormatError(f"the 4-bit blocks did not attach: {getattr(lm.fwd, 'q4_note', '') or lm.fallback}")
    return lm


def measure(lm: LM, reps: int = REPS, big: int = BIG) -> Cost:
    """One pass of `lm` on 1 new token against `big`, after CONTEXT, `reps` pairs by the measuring rule."""
    ids = lm.encode(CONTEXT, raw=True).tolist()
    return Cost.of(token_cost(lm, ids, 1, big, reps))


def choose(costs: dict[str, Cost], limit: float = LIMIT, default: str | None = None) -> str:
    """The format to run: among those whose BIG-token pass costs at most `limit` times one token's, the one with
    the quickest one-token step; when none is, the one with the lowest ratio (the most headroom there is).

    A noisy measurement (a busy machine: the pairs spread wider than the measuring rule allows) cannot tell the
    formats apart, so then the `default` (the format models.load picks by itself) runs, where it was measured."""
    if not costs:
        raise FormatError("no weight format was measured")
    if default in costs and any(c.noisy for c in costs.values()):
        return default
    cheap = [f for f, c in costs.items() if c.ratio <= limit]
    if cheap:
        return min(cheap, key=lambda f: (costs[f].one_ms, costs[f].ratio))
    return min(costs, key=lambda f: (costs[f].ratio, costs[f].one_ms))


def reason(costs: dict[str, Cost], chosen: str, limit: float = LIMIT, big: int = BIG,
           default: str | None = None) -> str:
    """Why `chosen`, in one line with the measured ratios: "dense fp32 — a pass on 8 tokens costs 1.17× one
    token's here (dense bf16: 1.48×)"."""
    c = costs[chosen]
    others = ", ".join(f"{FORMATS[f]}: {costs[f].ratio:.2f}×" for f in costs if f != chosen)
    line = f"{FORMATS[chosen]} — a pass on {big} tokens costs {c.ratio:.2f}× one token's here"
    line += f" ({others})" if others else ""
    noisy = any(x.noisy for x in costs.values())
    if noisy and chosen == default:
        return line + ("; measured on a busy machine (noisy pairs), too unsteady to choose by, so this machine's "
                       "default format runs")
    if c.ratio > limit:
        line += f"; no format stays under {limit:.2f}×, so the lowest"
    if noisy:
        line += "; measured on a busy machine (noisy pairs): the choice may differ on a quiet one"
    return line


def decide(load_fn: Callable[[str], LM], fmts: list[str], measure_fn: Callable[[LM], Cost] = measure,
           default: str | None = None) -> tuple[str, dict[str, Cost]]:
    """Load each format with `load_fn` (a cached loader in the app), measure it, and choose: (format, costs).
    A format measured noisy is measured once more (a passing burst of other work); a format that fails to load is
    left out, said on stderr."""
    costs = {}
    for f in fmts:
        try:
            lm = load_fn(f)
            costs[f] = measure_fn(lm)
            if costs[f].noisy:
                costs[f] = measure_fn(lm)
        except (FormatError, RuntimeError) as e:
            print(f"note: weight format {f} left out: {e}", file=sys.stderr)
    return choose(costs, default=default), costs
