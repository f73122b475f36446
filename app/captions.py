"""Plain-words captions for each phase of a step, written for a classroom (no formulas needed to follow)."""
from __future__ import annotations

from specdec_core.drafters import DESCRIPTIONS, entry
from specdec_core.records import StepRecord

from .frames import DRAFT, VERIFY, Frame
from .view import show


def count(n: int, one: str, many: str | None = None) -> str:
    """'1 token', '2 tokens': the number with its noun in the right number."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def q_word(q: float) -> str:
    return "was certain of it (q = 1)" if q >= 0.9995 else f"gave it q = {q:.2f}"


# what each tree drafter's own probability under a node is (tree_view.py prints it under the node)
CONF = {"medusa": "each head's softmax probability of its candidate",
        "eagle": "the EAGLE head's probability of the token given its branch",
        "suffix": "the share of earlier occurrences of this branch that went on with the token"}
# what a drafter without a distribution of its own is, for the Draft phase
NO_Q = {"lookup": "This drafter copies text, so it has no probabilities of its own",
        "suffix": "This drafter proposes continuations it has seen, so it has no probabilities of its own"}


def row_cost(block: int) -> str:
    """What a verify pass's rows cost on this machine, for a forward whose products pad to `block` rows
    (backend.row_block): one sentence for a page's 'why the measurement differs' paragraph."""
    if block == 1:
        return ("On this machine our forward multiplies each row alone (no matrix units to fill, so nothing is "
                "padded): every drafted token adds its own share of arithmetic to the verify pass, and a draft of "
                "k tokens costs more the longer it is, even when every guess is kept")
    return (f"On this machine our forward multiplies rows in blocks of {block}: scoring the pending token and up to "
            f"{block - 1} drafts costs one plain pass, and the next draft starts a second block, which costs more "
            "than all the drafts in the first (the verify pass times above show the step)")


def no_q(rec: StepRecord) -> str:
    """The Draft phase's note for a chain drafter that has no distribution q of its own."""
    lead = NO_Q.get(rec.drafter, f"The {rec.drafter} drafter picks its tokens deterministically (its top choices)")
    return lead + ": it is treated as certain, q = 1 for the token it proposed and 0 for every other."


def phase_title(rec: StepRecord, f: Frame) -> str:
    if f.phase == DRAFT:
        if rec.tree is not None:
            return f"Draft a tree: position {f.shown} of {rec.tree.depth}"
        return "Draft" if rec.k else "No draft"
    if f.phase == VERIFY:
        if rec.tree is not None:
            return f"Verify: trial {f.checked} of {len(rec.tree.tried())}"
        return f"Verify draft #{f.checked} of {rec.k}"
    return {"resampled": "Rejected → resample", "bonus": "All accepted → bonus token"}.get(
        rec.final_kind, "The target picks one token")


def tree_caption(rec: StepRecord, f: Frame, greedy: bool) -> str:
    """The captions of a tree step: drafting the tree, each trial of the multi-candidate rule, the result."""
    view, src = rec.tree, DESCRIPTIONS.get(rec.drafter, rec.drafter)
    if f.phase == DRAFT:
        conf = CONF.get(rec.drafter)
        copied = sum(n.conf is None for n in view.nodes[1:]) if conf else 0
        if copied:
            conf += (f"; the {count(copied, 'node')} without one {'was' if copied == 1 else 'were'} copied from the "
                     "context (prompt lookup's continuation, grafted onto the tree where it pays)")
        return (f"<b>Draft a tree.</b> The drafter ({src}) proposes <b>{count(view.drafted, 'candidate')}</b> over "
                f"{count(view.depth, 'position')}: position {f.shown} of {view.depth} shown. Siblings are "
                "alternatives for "
                "the same position, ranked (the first choice on top, tried first); each path from the root is "
                "one possible continuation. " + (f"Grey numbers: {conf}. " if conf else "") +
                "The candidates are the drafter's top choices, picked, not sampled, so verification treats each "
                "as certain (q = 1). Next, one target forward scores every node at once: the attention mask below "
                "lets each node see only its own branch.")
    tried = view.tried()
    if f.phase == VERIFY:
        n = tried[f.checked - 1]
        t, parent = n.trial, view.nodes[n.parent]
        sibs = [m for m in tried if m.parent == n.parent and m.trial.order < t.order]
        against = (f"the target's distribution after “{show(parent.piece)}”" if not sibs else
                   f"what is left of it after removing the rejected sibling{'s' if len(sibs) > 1 else ''} "
                   "and renormalizing (the residual)")
        lead = (f"<b>Trial {t.order + 1}: “{show(n.piece)}”</b>, choice #{n.rank + 1} after “{show(parent.piece)}”. "
                f"It is tested against {against}: p = {t.p:.2f}. ")
        green = "<span style='color:#2e7d32'><b>accepted</b></span>"
        red = "<span style='color:#c62828'><b>rejected</b></span>"
        if greedy:
            rule = "At temperature 0 it is kept exactly when it is the target's top token: "
            verdict = f"it is, so it is {green}." if t.accepted else f"it is not, so it is {red}."
        else:
            rule = f"Keep it with probability min(1, p/q) = {t.accept_prob:.2f}; u = {t.u:.2f} is drawn: "
            verdict = (f"u < {t.accept_prob:.2f}, {green}." if t.accepted else f"u ≥ {t.accept_prob:.2f}, {red}.")
        left = [c for c in view.nodes if c.parent == n.parent and c.rank > n.rank]
        if t.accepted:
            after = (" The walk moves down into its children." if any(c.parent == n.index for c in view.nodes)
                     else " It is a leaf: no candidate follows it.")
        elif left:
            after = (" Its branch is cut. Its probability is taken out of the distribution and the next sibling "
                     "is tried against the rest." + ("" if greedy else " (the orange bars on the right)"))
        else:
            after = " It was the last sibling: the target will draw the next token from what is left."
        return lead + rule + verdict + after
    n = len(rec.committed)
    word = {"resampled": "resampled from what the rejections left (orange)",
            "bonus": "a bonus token from the target's distribution after the last accepted node (blue)"}
    return (f"<b>Result.</b> The walk kept a path of <b>{len(view.path)}</b> of the {view.drafted} candidates "
            f"after {count(len(tried), 'trial')}{_unused(view)}. Then “{show(rec.final_piece)}” was "
            f"{word.get(rec.final_kind, 'drawn by the target')}. This step committed <b>{n} token"
            f"{'s' if n != 1 else ''}</b> for one forward pass of the target over {view.drafted + 1} tree nodes.")


def _unused(view) -> str:
    """What the result says of the candidates the walk never tested: faded only where there are some."""
    untested = sum(n.trial is None for n in view.nodes[1:])
    if untested:
        return f"; the {count(untested, 'faded candidate')} {'was' if untested == 1 else 'were'} never needed"
    if all(sum(c.parent == n.index for c in view.nodes) <= 1 for n in view.nodes):
        return "; this tree is a single chain (one candidate at each position), so there was no other branch to try"
    return "; every candidate was tested"


def caption(rec: StepRecord, f: Frame, greedy: bool) -> str:
    if rec.tree is not None:
        return tree_caption(rec, f, greedy)
    m = rec.k
    if f.phase == DRAFT:
        if m == 0:
            if not entry(rec.drafter).drafts:
                return ("Plain decoding: there is no drafter, so the big target model produces exactly one "
                        "token for each forward pass. This is the baseline speculation tries to beat.")
            why = {"lookup": " (nothing in the context to copy)",
                   "suffix": " (nothing seen before continues the text)"}.get(rec.drafter, "")
            return (f"The drafter had nothing to propose this time{why}, so this step is plain decoding: the "
                    "target model makes one token with one forward pass.")
        src = DESCRIPTIONS.get(rec.drafter, rec.drafter)
        how = ""
        if "ngram" in rec.info:
            n = rec.info["ngram"]
            how = (f" The last {n} token{'s' if n > 1 else ''} of the text also appeared earlier, so it "
                   "proposes what followed them there.")
        return (f"<b>Draft.</b> The drafter ({src}) quickly guesses the next {count(m, 'token')}: {f.shown} of "
                f"{m} so far (purple, dashed).{how} Guessing is cheap. Nothing is decided yet: next, the big target "
                f"model checks {'all ' if m > 1 else ''}{count(m, 'guess', 'guesses')} in a single forward pass.")
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
    kept = f"{rec.n_accepted} of {count(m, 'guess', 'guesses')} kept" if m else "no guesses"
    n = len(rec.committed)
    tail = (f" This step committed <b>{n} token{'s' if n != 1 else ''}</b> for one forward pass of the target "
            f"({kept}).")
    if rec.final_kind == "resampled":
        return ("<b>Resample.</b> In place of the rejected guess the target draws a replacement from what is "
                "left of its distribution once the drafter's share is taken away: norm(max(0, p − q)), the "
                f"chart on the right. It drew “{show(rec.final_piece)}” (orange). This correction is what makes "
                "the output exactly as likely as if the target had written it alone." + tail)
    if rec.final_kind == "bonus":
        return (f"<b>Bonus.</b> {'All ' if m > 1 else ''}{count(m, 'guess', 'guesses')} passed. The same forward "
                f"pass already computed the target's "
                f"distribution for the position after them, so one more token comes for free: "
                f"“{show(rec.final_piece)}” (blue)." + tail)
    return f"The target draws “{show(rec.final_piece)}” from its own distribution p." + tail
