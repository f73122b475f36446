"""A room's answers to multiple-choice questions, held in memory: anonymous counts per option over every voter
(a browser session) that answered since the question was last reset, and whether the answer is revealed.

One voter counts once per question: answering again moves that voter's vote. Voters are opaque ids (the app
gives each session a random one); nothing says who a voter is, and only counts leave the room. Many sessions
answer at once from their own threads, so every read and write holds one lock. Plain threading; nothing here
knows about Streamlit, and nothing survives the process.
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class Room:
    """Votes per question: question -> voter -> option index; `revealed` questions; when counting began."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.lock = threading.Lock()
        self.votes: dict[str, dict[str, int]] = {}
        self.shown: set[str] = set()
        self.since = clock()                  # counting began (the process's first use, or a reset of all)
        self.reset_at: dict[str, float] = {}  # a question reset on its own since then
        self.epoch = 0                        # resets of all questions
        self.rounds: dict[str, int] = {}      # resets of one question

    def answer(self, question: str, voter: str, option: int, n_options: int) -> None:
        """Record `voter`'s choice of option `option` (0-based) of `n_options`, replacing any earlier one."""
        if not voter:
            raise ValueError("a vote needs a voter id")
        if not (isinstance(option, int) and 0 <= option < n_options):
            raise ValueError(f"option {option!r} is not one of the question's {n_options} options (0..{n_options - 1})")
        with self.lock:
            self.votes.setdefault(question, {})[voter] = option

    def withdraw(self, question: str, voter: str) -> None:
        """Take `voter`'s vote off `question` (no vote: nothing happens)."""
        with self.lock:
            self.votes.get(question, {}).pop(voter, None)

    def counts(self, question: str, n_options: int) -> list[int]:
        """How many voters chose each of the question's options, in option order."""
        out = [0] * n_options
        with self.lock:
            for option in self.votes.get(question, {}).values():
                if option < n_options:   # a vote for an option the question no longer has is not shown
                    out[option] += 1
        return out

    def reveal(self, question: str, shown: bool = True) -> None:
        """Show (or hide again) the question's answer on every page."""
        with self.lock:
            (self.shown.add if shown else self.shown.discard)(question)

    def revealed(self, question: str) -> bool:
        with self.lock:
            return question in self.shown

    def reset(self, question: str | None = None) -> None:
        """Forget the votes on `question` and hide its answer again; None: every question."""
        with self.lock:
            if question is None:
                self.votes.clear()
                self.shown.clear()
                self.reset_at.clear()
                self.since = self.clock()
                self.epoch += 1
            else:
                self.votes.pop(question, None)
                self.shown.discard(question)
                self.reset_at[question] = self.clock()
                self.rounds[question] = self.rounds.get(question, 0) + 1

    def round(self, question: str) -> int:
        """How many times the question's votes were reset: a page that showed an answer from an earlier round
        clears it, so everyone answers afresh."""
        with self.lock:
            return self.epoch + self.rounds.get(question, 0)

    def counting_since(self, question: str) -> float:
        """When the question's counts began: its own reset, else the room's start (or last reset of all)."""
        with self.lock:
            return self.reset_at.get(question, self.since)
