"""The replay timeline: every verification step cut into the frames the step view animates.

A step with m drafted tokens plays as: m draft frames (the guesses appear one by one), one verify frame per
position the rule actually tested (it stops at the first rejection, Leviathan et al. 2023, Alg. 1), and one
result frame (the resampled, bonus or plain target token is committed). A tree step (rec.tree) plays its
tree level by level (draft frames: `shown` levels), then one verify frame per child the multi-candidate rule
tested, in the order it tested them (`checked` trials; verify_tree.py), then its result. Pure functions of the
records, so scrubbing and stepping never touch a model.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec_core.metrics import RunMetrics, summarize
from specdec_core.records import StepRecord

DRAFT, VERIFY, RESULT = "draft", "verify", "result"


@dataclass(frozen=True)
class Frame:
    phase: str      # DRAFT | VERIFY | RESULT
    shown: int      # drafted tokens visible (a tree: levels)
    checked: int    # positions whose verdict is visible (a tree: trials)


def n_checked(rec: StepRecord) -> int:
    """Positions the rule tested: up to and including the first rejection."""
    return min(rec.n_accepted + 1, rec.k)


def frames(rec: StepRecord) -> list[Frame]:
    if rec.tree is not None:
        m, c = rec.tree.depth, len(rec.tree.tried())
        return ([Frame(DRAFT, d, 0) for d in range(1, m + 1)] + [Frame(VERIFY, m, i) for i in range(1, c + 1)]
                + [Frame(RESULT, m, c)])
    m, c = rec.k, n_checked(rec)
    out = [Frame(DRAFT, d, 0) for d in range(1, m + 1)] or [Frame(DRAFT, 0, 0)]
    out += [Frame(VERIFY, m, i) for i in range(1, c + 1)]
    return out + [Frame(RESULT, m, c)]


@dataclass
class Cursor:
    """Where the replay stands: step index, frame index within the step, and whether it autoplays."""
    step: int = 0
    frame: int = 0
    playing: bool = False

    def clamp(self, records: list[StepRecord]) -> "Cursor":
        self.step = max(0, min(self.step, len(records) - 1))
        self.frame = max(0, min(self.frame, len(frames(records[self.step])) - 1))
        return self

    def at_end(self, records: list[StepRecord]) -> bool:
        return self.step == len(records) - 1 and self.frame == len(frames(records[-1])) - 1

    def advance(self, records: list[StepRecord]) -> None:
        """One frame forward, into the next step after a result frame; stays put at the very end."""
        if self.frame < len(frames(records[self.step])) - 1:
            self.frame += 1
        elif self.step < len(records) - 1:
            self.step, self.frame = self.step + 1, 0

    def retreat(self, records: list[StepRecord]) -> None:
        if self.frame > 0:
            self.frame -= 1
        elif self.step > 0:
            self.step -= 1
            self.frame = len(frames(records[self.step])) - 1

    def goto(self, records: list[StepRecord], step: int, whole: bool = True) -> None:
        """Jump to a step, showing it complete (its result frame) or from its first frame."""
        self.step = max(0, min(step, len(records) - 1))
        self.frame = len(frames(records[self.step])) - 1 if whole else 0


def next_rejection(records: list[StepRecord], after: int) -> int | None:
    """Index of the first step after `after` whose draft had a rejected token (wrapping around)."""
    n = len(records)
    for j in range(1, n + 1):
        i = (after + j) % n
        if records[i].n_accepted < records[i].k:
            return i
    return None


def running(records: list[StepRecord], step: int) -> RunMetrics:
    """Metrics of the run up to and including `step`."""
    return summarize(records[:step + 1])
