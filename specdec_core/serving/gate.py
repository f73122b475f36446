"""A fair queue in front of one shared model: many sessions (threads) take turns calling it, one at a time.

On a small CPU two decodes at once only share the cores and both slow down, so model work is serialised. A
run holds the gate while it calls the model and, at safe points between units of work (decode steps, runs of
a sweep), goes to the back of the line once it has held the gate for a turn (`turn_s`) and someone is waiting.
Turns therefore go round-robin over the waiting runs, first come first served: a long run cannot starve a
short one that arrived after it. Each waiter can read its place in line and an estimate of its wait, from the
length of recent turns.

A turn is always given back: `Gated` releases when its items run out, fail or are closed (a Stop, a rerun),
and a holder whose thread has ended is dropped, so a run abandoned without a close cannot hold the line.
Plain threading; nothing here knows about Streamlit.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

OnWait = Callable[[int, float], None] | None   # (place in line, 1 = next; estimated seconds), while waiting
POLL_S = 0.5   # how often a waiter re-reads its place (and its holder's liveness)


class Gate:
    """One model, one turn at a time. `turn_s` = 0 hands over after every unit of work."""

    def __init__(self, turn_s: float = 0.5, window: int = 32):
        if not turn_s >= 0:
            raise ValueError(f"the turn length must be a number of seconds >= 0, got {turn_s!r}")
        self.turn_s = float(turn_s)
        self.cv = threading.Condition()
        self.line: list[Ticket] = []       # waiting, next first
        self.holder: Ticket | None = None
        self.turns: deque[float] = deque(maxlen=window)   # lengths of recent turns, seconds
        self.served = 0                    # turns given, for tests and reports
        self.finished: deque[dict] = deque(maxlen=8 * window)   # one summary per closed Gated, for reports

    def ticket(self, who: str = "") -> Ticket:
        return Ticket(self, who)

    @contextmanager
    def hold(self, who: str = "", on_wait: OnWait = None) -> Iterator[Ticket]:
        """Hold the gate for a block (calling `spell()` inside it lets others in at safe points)."""
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

    def mean_turn(self) -> float:
        """Mean length of recent turns; before any, the turn length (or a guess of one decode step)."""
        return sum(self.turns) / len(self.turns) if self.turns else max(self.turn_s, 0.05)

    # -- under self.cv ------------------------------------------------------------------------------------------

    def _reclaim(self) -> None:
        h = self.holder
        if h is not None and h.thread is not None and not h.thread.is_alive():
            self._end(h)   # its thread is gone without giving the turn back

    def _end(self, t: Ticket) -> None:
        self.turns.append(time.monotonic() - t.since)
        self.holder = None
        self.cv.notify_all()

    def _eta(self, t: Ticket) -> float:
        mean = self.mean_turn()
        now = 0.0 if self.holder is None else max(0.0, mean - (time.monotonic() - self.holder.since))
        return now + self.line.index(t) * mean


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
            g.line.append(self)
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
                    g.line.remove(self)
                    g.cv.notify_all()   # the next one may be first now
            raise

    def release(self) -> None:
        with self.gate.cv:
            if self in self.gate.line:
                self.gate.line.remove(self)
                self.gate.cv.notify_all()
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
    `shift(item, seconds)` corrects an item for the time queued since the first turn (a record's clock runs
    through the waits); `last(item)` says an item is the final one, so the turn is given back with it
    rather than after another wait in line just to learn that the items are over. close() -- or the end of
    the items, or an error -- gives the turn back and closes the items."""

    def __init__(self, gate: Gate, items: Iterable, who: str = "", on_wait: OnWait = None,
                 shift: Callable[[Any, float], Any] | None = None, last: Callable[[Any], bool] | None = None):
        self.ticket = gate.ticket(who)
        self.items: Iterator | None = iter(items)
        self.on_wait, self.shift, self.last = on_wait, shift, last

    def __iter__(self) -> Gated:
        return self

    def __next__(self):
        if self.items is None:
            raise StopIteration
        try:
            self.ticket.spell(self.on_wait)
            item = next(self.items)
        except BaseException:
            self.close()
            raise
        paused = self.ticket.waited - self.ticket.first_wait
        if self.last is not None and self.last(item):
            self.close()
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
