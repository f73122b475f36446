"""Plain-words captions for each phase of a step, written for a classroom (no formulas needed to follow)."""
from __future__ import annotations

from specdec_core.drafters import DESCRIPTIONS, entry
from specdec_core.records import StepRecord

from .frames import DRAFT, VERIFY, Frame
from .view import show


def q_word(q: float) -> str:
    return "was certain of it (q = 1)" if q >= 0.9995 else f"gave it q = {q:.2f}"


def phase_title(rec: StepRecord, f: Frame) -> str:
    if f.phase == DRAFT:
        return "Draft" if rec.k else "No draft"
    if f.phase == VERIFY:
        return f"Verify draft #{f.checked} of {rec.k}"
    return {"resampled": "Rejected → resample", "bonus": "All accepted → bonus token"}.get(
        rec.final_kind, "The target picks one token")


def caption(rec: StepRecord, f: Frame, greedy: bool) -> str:
    m = rec.k
    if f.phase == DRAFT:
        if m == 0:
            if not entry(rec.drafter).drafts:
                return ("Plain decoding: there is no drafter, so the big target model produces exactly one "
                        "token for each forward pass. This is the baseline speculation tries to beat.")
            return ("The drafter had nothing to propose this time (nothing in the context to copy), so this "
                    "step is plain decoding: the target model makes one token with one forward pass.")
        src = DESCRIPTIONS.get(rec.drafter, rec.drafter)
        how = ""
        if "ngram" in rec.info:
            n = rec.info["ngram"]
            how = (f" The last {n} token{'s' if n > 1 else ''} of the text also appeared earlier, so it "
                   "proposes what followed them there.")
        return (f"<b>Draft.</b> The drafter ({src}) quickly guesses the next {m} tokens: {f.shown} of {m} so "
                f"far (purple, dashed).{how} Guessing is cheap. Nothing is decided yet: next, the big target "
                f"model checks all {m} guesses together in a single forward pass.")
    if f.phase == VERIFY:
        j = f.checked - 1
        pos = rec.positions[j]
        lead = (f"<b>Verify draft #{j + 1} “{show(pos.piece)}”.</b> The target gives it p = {pos.p:.2f}; the drafter "
                f"{q_word(pos.q)}. ")
        ok = pos.verdict == "accepted"
        green = "<span style='color:#2e7d32'><b>accepted</b></span> (green)"
        red = "<span style='color:#c62828'><b>rejected</b></span> (red)"
        if greedy:
            rule = ("At temperature 0 the target always takes its top token, so a guess is kept exactly when it "
                    "is that token. ")
            verdict = (f"It is, so the guess is {green}." if ok else
                       f"It is not, so the guess is {red}.")
        else:
            rule = (f"We keep it with probability min(1, p/q) = {pos.accept_prob:.2f}: a random number "
                    f"u = {pos.u:.2f} is drawn and compared with it. ")
            verdict = (f"u < {pos.accept_prob:.2f}, so the guess is {green}." if ok else
                       f"u ≥ {pos.accept_prob:.2f}, so the guess is {red}.")
        after = (" The next guess gets its turn." if ok and j + 1 < m else "") if ok else \
            " Every guess after it is thrown away too, because it was built on a wrong token."
        return lead + rule + verdict + after
    kept = f"{rec.n_accepted} of {m} guesses kept" if m else "no guesses"
    n = len(rec.committed)
    tail = (f" This step committed <b>{n} token{'s' if n != 1 else ''}</b> for one forward pass of the target "
            f"({kept}).")
    if rec.final_kind == "resampled":
        return ("<b>Resample.</b> In place of the rejected guess the target draws a replacement from what is "
                "left of its distribution once the drafter's share is taken away: norm(max(0, p − q)), the "
                f"chart on the right. It drew “{show(rec.final_piece)}” (orange). This correction is what makes "
                "the output exactly as likely as if the target had written it alone." + tail)
    if rec.final_kind == "bonus":
        return (f"<b>Bonus.</b> All {m} guesses passed. The same forward pass already computed the target's "
                f"distribution for the position after them, so one more token comes for free: "
                f"“{show(rec.final_piece)}” (blue)." + tail)
    return f"The target draws “{show(rec.final_piece)}” from its own distribution p." + tail
