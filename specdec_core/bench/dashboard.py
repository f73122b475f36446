"""The lesson's dashboard, replayed: the same traffic served in windows of requests over time, first with one prompt
template and then after a change that makes the answers less predictable for the drafter, with acceptance rate and
mean acceptance length measured beside TTFT, TPOT and speedup, so the acceptance drop can be read next to the speedup
drop (the lesson: acceptance "explains speedup changes that would otherwise look like infrastructure noise, such as
a prompt-template change quietly making your traffic less predictable").

Each window is measured live by the measuring rule (sweeps.side_by_side and sweeps.point: plain decoding and the
drafter back to back per request, repeated in alternating order, the median pair's ratio quoted), at temperature 0,
so every speculative output is compared with plain decoding's token by token (`diff_tokens`). A window here is a
dashboard's time bucket: its requests decode one at a time, as one engine serves one stream.

The default scene uses prompt lookup (Saxena 2023) on the extraction requests that ask for a text verbatim: the model
copies spans of the request, which lookup drafts for free. The change appends one line to the user turn, asking
for the answer in French: a translation shares no spans with the request, so there is nothing left to copy. (The
bundled 135M-parameter model ignores gentler changes: a system prompt asking it to use its own, varied words, or to
explain before answering, leaves it copying, and acceptance does not fall.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..drafters import PLAIN, entry, make
from ..engine import run
from ..models import LM
from ..sampling import InputError, SamplingParams
from .sweeps import Tick, point, side_by_side, wilson
from .workloads import WORKLOADS

DRAFTER = "lookup"


@dataclass(frozen=True)
class Template:
    """How a request becomes a prompt: an optional system message (None: the chat template's own) and the user
    turn, `{request}` standing for the request's text."""
    name: str
    user: str = "{request}"
    system: str | None = None

    def text(self, request: str) -> str:
        return self.user.replace("{request}", request)


BEFORE = Template("as shipped: the request as it is")
AFTER = Template("new: a line asking for French", user="{request}\n\nAnswer in French.")
# the traffic: the extraction workload's requests that ask for the text verbatim (copy, repeat, extract), in the
# order the windows take them
VERBATIM = (0, 8, 5, 2, 6, 9)
REQUESTS = tuple(WORKLOADS["extraction"].prompts[i] for i in VERBATIM)


@dataclass(frozen=True)
class Scene:
    """The scene's size. Windows hold `per_window` requests each, taken in turn from the traffic, so each phase
    serves the same requests in the same order."""
    windows: int = 3          # per phase
    per_window: int = 1
    tokens: int = 32
    k: int | None = 4
    repeats: int = 2          # timed pairs per request (the measuring rule; median quoted)
    drafter: str = DRAFTER

    def check(self) -> None:
        for name, v, lo in (("windows", self.windows, 1), ("per_window", self.per_window, 1),
                            ("tokens", self.tokens, 2), ("repeats", self.repeats, 1)):
            if v < lo:
                raise InputError(f"{name} must be at least {lo}, got {v}")
        if self.k is not None and self.k < 1:
            raise InputError(f"k must be at least 1, got {self.k}")

    def runs(self) -> int:
        """Decodes the scene runs (two phases, each request plain and speculative, `repeats` times), for a
        progress bar."""
        return 2 * self.windows * self.per_window * 2 * self.repeats


def render(lm: LM, tpl: Template, request: str) -> list[int]:
    """The prompt ids for `request` under `tpl`: through the model's chat template, the system message in front
    where `tpl` has one; without a chat template, the system text and the user text on lines of their own."""
    if not request or not request.strip():
        raise InputError("a request in the traffic is empty")
    tok = lm.tokenizer
    user = tpl.text(request)
    if getattr(tok, "chat_template", None):
        msgs = ([{"role": "system", "content": tpl.system}] if tpl.system else []) + [
            {"role": "user", "content": user}]
        enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
        return (enc["input_ids"] if hasattr(enc, "keys") else enc).view(-1).tolist()
    return lm.encode((tpl.system + "\n\n" if tpl.system else "") + user, raw=True).tolist()


def diff_tokens(a: list[int], b: list[int]) -> int:
    """Positions where two outputs differ, a length difference counted in full: 0 iff they are equal."""
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def serve(lm: LM, scene: Scene = Scene(), requests: tuple[str, ...] = REQUESTS, before: Template = BEFORE,
          after: Template = AFTER, tick: Tick = None) -> Iterator[dict]:
    """Both phases, window by window -> one row per window as soon as it is measured: the window's number
    (`window`, counting on across the change), its phase and template, the measuring rule's point for the drafter
    (acceptance and its interval, mean acceptance length, TTFT and TPOT with plain decoding's beside them, the
    median speedup and its spread) and `diff_tokens`, summed over every request and repeat of the window."""
    scene.check()
    if not requests:
        raise InputError("the traffic has no requests")
    sp = SamplingParams(0.0)
    first = render(lm, before, requests[0])
    for name in (PLAIN, scene.drafter):   # a first decode pays one-off costs that would tilt window 1's timing
        run(lm, make(name, lm), first, sp=sp, k=entry(name).k(scene.k), max_new_tokens=2, detail=False)
    n = 0
    for phase, tpl in (("before", before), ("after", after)):
        for w in range(scene.windows):
            texts = [requests[(w * scene.per_window + j) % len(requests)] for j in range(scene.per_window)]
            ids = [render(lm, tpl, t) for t in texts]
            n += 1
            where = (lambda what, n=n: tick(f"window {n} ({phase} the change), {what}")) if tick else None
            pair = side_by_side(lm, ids, sp, scene.k, scene.tokens, [(scene.drafter, None)], where, scene.repeats)
            pt = point(pair, scene.drafter)
            diffs = sum(diff_tokens(b[0], s[0]) for rb, rs in zip(pair.base, pair.spec[scene.drafter])
                        for b, s in zip(rb, rs))
            yield {"window": n, "phase": phase, "template": tpl.name, "requests": len(ids), **pt,
                   "diff_tokens": diffs, "compared": sum(len(s[0]) for rs in pair.spec[scene.drafter] for s in rs)}


def phase(rows: list[dict], name: str) -> dict:
    """One phase's windows pooled: acceptance over all their drafted tokens (with its Wilson interval), mean
    acceptance length over all their steps, the median of the windows' speedups, and mean TTFT and TPOT (both
    sides)."""
    rs = [r for r in rows if r["phase"] == name]
    if not rs:
        return {}
    acc, dr = sum(r["accepted"] for r in rs), sum(r["drafted"] for r in rs)
    sp = sorted(r["speedup"] for r in rs)
    mean = lambda c: sum(r[c] for r in rs) / len(rs)
    lo, hi = wilson(acc, dr)
    return {"acceptance": acc / dr if dr else 0.0, "acceptance_lo": lo, "acceptance_hi": hi,
            "mal": sum(r["tokens"] for r in rs) / max(1, sum(r["steps"] for r in rs)),
            "speedup": sp[(len(sp) - 1) // 2], "speedup_lo": sp[0], "speedup_hi": sp[-1],
            "tpot": mean("tpot_ms"), "plain_tpot": mean("baseline_tpot_ms"),
            "ttft": mean("ttft_ms"), "plain_ttft": mean("baseline_ttft_ms")}


FELL = 0.10     # a speedup that drops by more than this share of its level before the change has fallen
STEADY = 0.15   # plain decoding's TPOT moving by less than this share: the machine served as fast as before


def reading(rows: list[dict]) -> str:
    """One sentence reading the dashboard as the lesson does, from the measured figures alone: what speedup and
    acceptance did at the template change, and what that says about the traffic and the machine."""
    if any(r["diff_tokens"] for r in rows):
        bad = sum(r["diff_tokens"] for r in rows)
        return (f"Speculative output differed from plain decoding in {bad} tokens: the output contract is broken, "
                "so no speedup here can be read.")
    a, b = phase(rows, "before"), phase(rows, "after")
    if not a or not b:
        return "The dashboard needs windows on both sides of the template change to say what the change did."
    sp = f"speedup went from {a['speedup']:.2f}× to {b['speedup']:.2f}×"
    acc = f"acceptance from {a['acceptance']:.0%} to {b['acceptance']:.0%}"
    tpot = f"plain decoding's TPOT stayed at {a['plain_tpot']:.0f}–{b['plain_tpot']:.0f} ms"
    fell = b["speedup"] < a["speedup"] * (1 - FELL)
    dropped = b["acceptance_hi"] < a["acceptance_lo"]   # the 95% intervals do not overlap
    rose = b["acceptance_lo"] > a["acceptance_hi"]
    steady = abs(b["plain_tpot"] - a["plain_tpot"]) <= STEADY * a["plain_tpot"]
    if fell and dropped and steady:
        return (f"At the template change {sp}, and {acc} with it, while {tpot}: the traffic became less "
                "predictable, not the infrastructure slower.")
    if fell and dropped:   # the machine's speed swung too: speedup, timed in back-to-back pairs, rides it out
        return (f"At the template change {sp}, and {acc} with it. Plain decoding's own TPOT swung too "
                f"({a['plain_tpot']:.0f} → {b['plain_tpot']:.0f} ms: other work on the machine), which a dashboard "
                "of TTFT and TPOT alone would blame; but each speedup compares back-to-back pairs that the swing "
                "slows alike, and the acceptance drop accounts for its fall: the traffic became less predictable.")
    if fell:
        return (f"At the template change {sp}, yet {acc} did not fall beyond its uncertainty: acceptance does not "
                f"explain this drop, so look at the machine (plain TPOT {a['plain_tpot']:.0f} → "
                f"{b['plain_tpot']:.0f} ms).")
    if dropped:
        return (f"At the template change {acc}, yet {sp}, not a clear fall: the drafts lost were cheap here, or "
                "the timing is too noisy to show it; more windows or tokens would tell.")
    if rose:
        return f"At the template change {acc} and {sp}: this change made the traffic more predictable, not less."
    return (f"At the template change {sp} and {acc}: neither moved clearly, so this change left the traffic as "
            "predictable as before.")


def exact(rows: list[dict]) -> tuple[int, int]:
    """(differing tokens, tokens compared) over every speculative output of the scene."""
    return sum(r["diff_tokens"] for r in rows), sum(r["compared"] for r in rows)

