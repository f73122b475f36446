"""A fair queue in front of one shared model: many sessions (threads) take turns calling it, one at a time.

On a small CPU two decodes at once only share the cores and both slow down, so model work is serialised. A
run holds the gate while it calls the model and, at safe points between units of work (decode steps, runs of
a sweep), goes to the back of the line once it has held the gate for a turn (`turn_s`) and someone is waiting.
Turns therefore go round-robin over the waiting runs, first come first served: a long run cannot starve a
short one that arrived after it. Each waiter can read its place in line and an estimate of its wait: every
turn ahead of it is a turn while someone waits, which ends at the first safe point after `turn_s`, so the
estimate is `turn_s` plus the measured overrun of recent contested turns (how long a holder went on past its
due time before handing over). A turn nobody waited for is left out: a run alone at the model holds it to
its end, and that length says nothing about the wait in a line.

A turn is always given back: `Gated` releases when its items run out, fail or are closed (a Stop, a rerun),
and a holder whose thread has ended is dropped, so a run abandoned without a close cannot hold the line. A
thread that gives its turn back gives back its CPU worker threads too (threads.py): idle, they would slow the next
holder's. Plain threading; nothing here knows about Streamlit.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from ..backend import release_threads

OnWait = Callable[[int, float], None] | None   # (place in line, 1 = next; estimated seconds), while waiting
POLL_S = 0.5   # how often a waiter re-reads its place (and its holder's liveness)
UNIT_GUESS_S = 0.1   # the overrun taken before any is measured: about one decode step of a small model on a CPU


class Gate:
    """One model, one turn at a time. `turn_s` = 0 hands over after every unit of work."""

    def __init__(self, turn_s: float = 0.5, window: int = 32):
        if not turn_s >= 0:
            raise ValueError(f"the turn length must be a number of seconds >= 0, got {turn_s!r}")
        self.turn_s = float(turn_s)
        self.cv = threading.Condition()
        self.line: list[Ticket] = []       # waiting, next first
        self.holder: Ticket | None = None
        self.overruns: deque[float] = deque(maxlen=window)   # recent contested turns' seconds past their due time
        self.contested_at: float | None = None   # when someone first waited during the current turn
        self.served = 0                    # turns given, for tests and reports
        self.finished: deque[dict] = deque(maxlen=8 * window)   # one summary per closed Gated, for reports

    def ticket(self, who: str = "") -> Ticket:
        return Ticket(self, who)

    @contextmanager
    def hold(self, who: str = "", on_wait: OnWait = None) -> Iterator[Ticket]:
        """Hold the gate for a block (calling `spell()` inside it lets others in at safe points). A thread that
        already holds it runs the block in its turn: model work called from inside a held block (a model loaded,
        and warmed, at its first use there) would otherwise wait for the thread itself."""
        h = self.holder
        if h is not None and h.thread is threading.current_thread():
            yield h
            return
        t = self.ticket(who)
        t.acquire(on_wait)
        try:
            yield t
        finally:
            t.release()

    def waiting(self) -> int:
        with self.cv:
            return len(self.line)

    def busy(self) -> bool:
        with self.cv:
            return self.holder is not None

    def overrun(self) -> float:
        """Mean seconds a recent contested turn ran past its due time (its last unit of work); before any, a guess
        of one decode step."""
        return sum(self.overruns) / len(self.overruns) if self.overruns else UNIT_GUESS_S

    def turn(self) -> float:
        """Expected length of a turn while someone waits: turn_s, then the unit of work under way."""
        return self.turn_s + self.overrun()

    # -- under self.cv ------------------------------------------------------------------------------------------

    def _reclaim(self) -> None:
        h = self.holder
        if h is not None and h.thread is not None and not h.thread.is_alive():
            self._end(h)   # its thread is gone without giving the turn back

    def _end(self, t: Ticket) -> None:
        if self.contested_at is not None:   # someone waited: how long past its due time did it go on?
            self.overruns.append(max(0.0, time.monotonic() - self._due(t)))
        self.holder, self.contested_at = None, None
        self.cv.notify_all()

    def _due(self, h: Ticket) -> float:
        """When the holder's turn is due to end: turn_s after it began, or when someone first waited if later."""
        return max(h.since + self.turn_s, self.contested_at or h.since)

    def _eta(self, t: Ticket) -> float:
        """Seconds until t holds the gate: the holder's due time plus its overrun, then one turn per ticket ahead."""
        left = 0.0 if self.holder is None else max(0.0, self._due(self.holder) + self.overrun() - time.monotonic())
        return left + self.line.index(t) * self.turn()

    def _join(self, t: Ticket) -> None:
        self.line.append(t)
        if self.holder is not None and self.contested_at is None:
            self.contested_at = time.monotonic()

    def _leave(self, t: Ticket) -> None:
        self.line.remove(t)
        if not self.line:
            self.contested_at = None   # nobody waits any more: the turn is no longer due
        self.cv.notify_all()


class Ticket:
    """One run's place at the gate: held, waiting, or neither. Re-usable across turns."""

    def __init__(self, gate: Gate, who: str = ""):
        self.gate, self.who = gate, who
        self.thread: threading.Thread | None = None
        self.since = 0.0          # when the current turn began (monotonic)
        self.asked = 0.0          # when it joined the line
        self.turns = 0            # turns taken
        self.first_wait = 0.0     # seconds queued before the first turn
        self.started = 0.0        # when the first turn began (monotonic)
        self.waited = 0.0         # seconds queued in all

    @property
    def held(self) -> bool:
        return self.gate.holder is self

    def place(self) -> int:
        """1 = next in line, 0 = holding the gate or not in line."""
        with self.gate.cv:
            return self.gate.line.index(self) + 1 if self in self.gate.line else 0

    def acquire(self, on_wait: OnWait = None) -> None:
        """Join the back of the line and block until this ticket holds the gate. `on_wait(place, eta)` is
        called at once and then every POLL_S while waiting, outside the lock; whatever it raises (a Stop)
        takes the ticket out of the line and goes on up."""
        g = self.gate
        with g.cv:
            if self.held:
                return
            self.asked = time.monotonic()
            g._join(self)
        try:
            while True:
                with g.cv:
                    if self._take():
                        return
                    place, eta = g.line.index(self) + 1, g._eta(self)
                if on_wait is not None:
                    on_wait(place, eta)
                with g.cv:
                    g.cv.wait_for(self._free, timeout=POLL_S)
        except BaseException:
            with g.cv:
                if self in g.line:
                    g._leave(self)   # the next one may be first now
            raise

    def release(self) -> None:
        if self.held and self.thread is threading.current_thread():
            release_threads()   # its CPU workers, idle till its next turn, would slow the next holder's (threads.py)
        with self.gate.cv:
            if self in self.gate.line:
                self.gate._leave(self)
            if self.held:
                self.gate._end(self)

    def due(self) -> bool:
        """Whether this turn is over: held for turn_s while someone waits."""
        g = self.gate
        with g.cv:
            return self.held and bool(g.line) and time.monotonic() - self.since >= g.turn_s

    def spell(self, on_wait: OnWait = None) -> None:
        """A safe point between units of work: once the turn is over, go to the back of the line."""
        if self.due():
            self.release()
            self.acquire(on_wait)
        elif not self.held:
            self.acquire(on_wait)

    # -- under gate.cv ------------------------------------------------------------------------------------------

    def _free(self) -> bool:
        g = self.gate
        g._reclaim()
        return g.holder is None and bool(g.line) and g.line[0] is self

    def _take(self) -> bool:
        g = self.gate
        if not self._free():
            return False
        g.line.pop(0)
        g.holder, g.served = self, g.served + 1
        g.contested_at = time.monotonic() if g.line else None
        self.thread, self.since = threading.current_thread(), time.monotonic()
        wait = self.since - self.asked
        if self.turns == 0:
            self.first_wait, self.started = wait, self.since
        self.waited += wait
        self.turns += 1
        return True


class Gated:
    """Iterate `items` (e.g. an engine.decode generator) holding a turn at `gate` while each item is made,
    handing the turn on at the safe points between items.

    `on_wait(place, eta)` may be set after construction (a page sets it once it has drawn its progress bar);
    `shift(item, seconds)` corrects an item for the time that was not the items' making: queued since the first
    turn, and spent by the reader between items (a page drawing the last one while the next waits to be made).
    A record's clock runs through both, and a run read live would otherwise time slower than the same run read
    at once; `last(item)` says an item is the final one, so the turn is given back with it
    rather than after another wait in line just to learn that the items are over. close() -- or the end of
    the items, or an error -- gives the turn back and closes the items."""

    def __init__(self, gate: Gate, items: Iterable, who: str = "", on_wait: OnWait = None,
                 shift: Callable[[Any, float], Any] | None = None, last: Callable[[Any], bool] | None = None):
        self.ticket = gate.ticket(who)
        self.items: Iterator | None = iter(items)
        self.on_wait, self.shift, self.last = on_wait, shift, last
        self.reading = 0.0                 # seconds the reader spent between items
        self._given: float | None = None   # when the last item was handed over

    def __iter__(self) -> Gated:
        return self

    def __next__(self):
        if self.items is None:
            raise StopIteration
        if self._given is not None:
            self.reading += time.perf_counter() - self._given
        try:
            self.ticket.spell(self.on_wait)
            item = next(self.items)
        except BaseException:
            self.close()
            raise
        paused = self.ticket.waited - self.ticket.first_wait + self.reading
        if self.last is not None and self.last(item):
            self.close()
        self._given = time.perf_counter()
        return self.shift(item, paused) if self.shift is not None and paused else item

    def close(self) -> None:
        items, self.items = self.items, None
        try:
            if items is not None and hasattr(items, "close"):
                items.close()
        finally:
            self.ticket.release()
            t = self.ticket
            if items is not None and t.turns:
                t.gate.finished.append({"who": t.who, "first_wait_s": t.first_wait, "waited_s": t.waited,
                                        "turns": t.turns, "span_s": time.monotonic() - t.started})

    def __del__(self):
        self.close()
