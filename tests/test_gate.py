"""The fair queue in front of the shared model (specdec_core/serving/gate.py), with threads and no model: one
holder at a time, turns round-robin so a short run is not starved by long ones, the right place in line
while waiting, and the gate given back however a run ends (done, closed mid-run, failed, thread gone)."""
import os
import threading
import time

import pytest
import torch

from specdec_core.fast import threads
from specdec_core.serving.gate import Gate, Gated

UNIT_S = 0.01   # one unit of work (a decode step)


def work(n: int, log: list, name: str, inside: list):
    """n units of work; each checks that nobody else holds the gate at the same time."""
    for i in range(n):
        inside.append(name)
        assert len(inside) == 1, f"{inside} hold the gate together"
        time.sleep(UNIT_S)
        inside.remove(name)
        log.append(name)
        yield i


def run_all(gate: Gate, jobs: dict[str, int], starts: dict[str, float]) -> tuple[dict, list]:
    done, log, inside, errors = {}, [], [], []

    def one(name, n):
        time.sleep(starts.get(name, 0.0))
        try:
            out = list(Gated(gate, work(n, log, name, inside), who=name, last=lambda i: i == n - 1))
            assert out == list(range(n))
            done[name] = time.monotonic()
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)
    ts = [threading.Thread(target=one, args=(n, k)) for n, k in jobs.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors, errors
    return done, log


def test_a_short_run_finishes_before_two_long_runs_that_came_first():
    gate = Gate(turn_s=0.0)
    done, log = run_all(gate, {"long1": 40, "long2": 40, "short": 3}, {"long2": 0.002, "short": 0.05})
    assert done["short"] < min(done["long1"], done["long2"])
    # round-robin: once all three are in, no one takes two units while another waits
    first_short = log.index("short")
    window = log[first_short - 2:first_short + 7]
    assert window.count("short") == 3 and sorted(set(window)) == ["long1", "long2", "short"]
    assert not gate.busy() and gate.waiting() == 0
    runs = {f["who"]: f for f in gate.finished}   # each run's summary: three turns for three units
    assert set(runs) == {"long1", "long2", "short"} and runs["short"]["turns"] == 3
    assert runs["long1"]["first_wait_s"] < 0.05 <= runs["short"]["span_s"]


def test_without_turns_the_first_long_run_holds_to_its_end():
    """The control: a turn as long as a run (FIFO per run) makes the short one wait for both long ones."""
    gate = Gate(turn_s=60.0)
    done, log = run_all(gate, {"long1": 20, "long2": 20, "short": 3}, {"long2": 0.002, "short": 0.05})
    assert done["short"] > max(done["long1"], done["long2"])
    assert log == ["long1"] * 20 + ["long2"] * 20 + ["short"] * 3


def test_places_in_line_and_estimates_are_reported_while_waiting():
    gate = Gate(turn_s=60.0)
    seen = {"b": [], "c": []}
    go = threading.Event()
    holder = gate.ticket("a")
    holder.acquire()

    def waiter(name):
        t = gate.ticket(name)
        t.acquire(on_wait=lambda place, eta: seen[name].append((place, eta)))
        go.wait(5)
        t.release()

    tb = threading.Thread(target=waiter, args=("b",))
    tb.start()
    while gate.waiting() < 1:
        time.sleep(0.001)
    tc = threading.Thread(target=waiter, args=("c",))
    tc.start()
    while gate.waiting() < 2:
        time.sleep(0.001)
    time.sleep(0.6)   # one more report each
    assert seen["b"][0][0] == 1 and seen["c"][0][0] == 2
    assert all(p == 1 for p, _ in seen["b"]) and all(p == 2 for p, _ in seen["c"])
    # no turn measured yet: a turn is taken to last turn_s, so c waits about one turn more than b
    assert seen["c"][-1][1] > seen["b"][-1][1] >= 0
    holder.release()
    tb.join(1)     # b holds now, c is first in line
    assert gate.waiting() == 1 and seen["c"] and gate.ticket("d").place() == 0
    go.set()
    tb.join(5)
    tc.join(5)
    assert not gate.busy() and gate.served == 3


def test_the_estimate_follows_contested_turns_not_a_long_run_alone():
    """A run alone holds the gate to its end (2 s here); a waiter arriving later waits one turn, turn_s plus the
    unit under way. The estimate it is shown must be about that wait, not the lone run's length (the old mean of
    recent turns said 2 s for a wait of ~0.2 s); after contested turns, their measured overrun is the unit."""
    gate = Gate(turn_s=0.1)

    def units(n, s):
        for i in range(n):
            time.sleep(s)
            yield i
    assert list(Gated(gate, units(10, 0.2), who="alone")) == list(range(10))   # uncontested: nothing measured
    assert gate.overrun() == pytest.approx(0.1) and gate.turn() == pytest.approx(0.2)

    long = threading.Thread(target=lambda: list(Gated(gate, units(20, 0.05), who="long")))
    long.start()
    while not gate.busy():
        time.sleep(0.001)
    time.sleep(0.03)
    seen, t0 = [], time.monotonic()
    with gate.hold("short", on_wait=lambda place, eta: seen.append(eta)) as t:
        waited = time.monotonic() - t0
        assert t.first_wait == pytest.approx(waited, abs=0.05)
    long.join(10)
    assert seen and seen[0] < 0.5, seen          # about turn_s + a unit, never the lone run's 2 s
    assert waited < 0.8 and abs(seen[0] - waited) < 0.4, (seen[0], waited)   # margins for a busy machine
    # the contested turns measured: the overrun is about one unit of 0.05 s
    assert gate.overruns and 0.0 <= gate.overrun() < 0.15


def test_a_generator_closed_mid_run_gives_the_gate_back():
    gate = Gate(turn_s=60.0)
    closed = []

    def steps():
        try:
            for i in range(100):
                yield i
        finally:
            closed.append(True)
    g = Gated(gate, steps(), who="a")
    assert next(g) == 0 and next(g) == 1 and gate.busy()
    g.close()
    assert not gate.busy() and closed == [True]
    with pytest.raises(StopIteration):
        next(g)
    # and the next visitor gets it at once
    with gate.hold("b") as t:
        assert t.held and t.first_wait < 0.5


def test_without_a_last_item_the_end_costs_one_more_turn():
    """The control for `last`: a run that cannot tell its final item waits in line once more to find out."""
    gate = Gate(turn_s=0.0)
    a, b = Gated(gate, iter([1]), who="a"), Gated(gate, iter([1]), who="b", last=lambda x: True)
    assert next(a) == 1 and a.ticket.held
    got = []
    tb = threading.Thread(target=lambda: got.extend(b))
    tb.start()
    while gate.waiting() < 1:
        time.sleep(0.001)
    with pytest.raises(StopIteration):
        next(a)          # a's turn is over (b waits): a goes to the back, b takes its only turn
    tb.join(5)
    assert got == [1] and a.ticket.turns == 2 and b.ticket.turns == 1 and not gate.busy()


def test_a_run_that_fails_or_ends_gives_the_gate_back():
    gate = Gate()

    def bad():
        yield 1
        raise RuntimeError("boom")
    g = Gated(gate, bad())
    assert next(g) == 1
    with pytest.raises(RuntimeError):
        next(g)
    assert not gate.busy()
    assert list(Gated(gate, range(3))) == [0, 1, 2] and not gate.busy()


def test_a_waiter_stopped_while_waiting_leaves_the_line():
    gate = Gate(turn_s=60.0)
    a = gate.ticket("a")
    a.acquire()

    class Stop(BaseException):
        pass

    def stop(place, eta):
        raise Stop
    with pytest.raises(Stop):
        gate.ticket("b").acquire(on_wait=stop)
    assert gate.waiting() == 0
    a.release()
    assert not gate.busy()


def test_a_holder_whose_thread_ended_without_closing_is_dropped():
    gate = Gate(turn_s=60.0)
    keep = []

    def abandon():   # takes one step and leaves the generator open, as a lost session would
        g = Gated(gate, iter(range(10)))
        next(g)
        keep.append(g)   # still referenced: no close, no garbage collection
    t = threading.Thread(target=abandon)
    t.start()
    t.join()
    assert gate.busy()
    with gate.hold("b") as tb:
        assert tb.held
    assert not gate.busy()


def test_time_queued_mid_run_is_taken_off_the_items_clock():
    gate = Gate(turn_s=0.0)
    a = Gated(gate, iter([10.0, 20.0, 30.0]), who="a", shift=lambda x, s: x - s)
    assert next(a) == 10.0           # no wait yet: unchanged
    other = threading.Thread(target=lambda: [time.sleep(0.2) for _ in Gated(gate, range(1), who="b")])
    other.start()
    while gate.waiting() < 1:
        time.sleep(0.001)
    x = next(a)                       # a goes to the back, b's 0.2 s turn runs first
    a.close()                         # b comes back for its end of items
    other.join(5)
    assert 20.0 - x >= 0.19 and a.ticket.waited - a.ticket.first_wait >= 0.19
    assert not gate.busy()


def test_time_the_reader_spends_between_items_is_taken_off_the_items_clock():
    """A page that draws each record before asking for the next: the records' clock counts the making of the
    items only, as if the run had been read at once (the control, read the same way without the correction,
    runs through the reader's 0.4 s)."""
    def clocked(n):
        t0 = time.perf_counter()
        for _ in range(n):
            time.sleep(UNIT_S)
            yield time.perf_counter() - t0

    def read(shift):
        got = []
        for x in Gated(Gate(turn_s=60.0), clocked(3), who="a", shift=shift):
            got.append(x)
            time.sleep(0.2)           # the reader's own work: drawing the item
        return got
    assert read(None)[-1] >= 0.4
    live = read(lambda x, s: x - s)
    assert 3 * UNIT_S <= live[-1] < 0.25 and live == sorted(live), live


def test_a_block_held_inside_a_held_block_runs_in_the_same_turn():
    """A model loaded (and warmed) at its first use inside a held block holds the gate again, in the same thread:
    it runs at once, and the outer block still holds the gate after it."""
    gate = Gate(turn_s=60.0)
    done = []

    def nested():
        with gate.hold("a") as outer:
            with gate.hold("a") as inner:
                done.append(inner is outer and outer.held)
            done.append(outer.held)
    t = threading.Thread(target=nested, daemon=True)   # a regression fails here rather than hangs the run
    t.start()
    t.join(5)
    assert not t.is_alive(), "the inner block waited for its own thread's turn"
    assert done == [True, True] and not gate.busy()


def test_a_bad_turn_length_is_refused():
    with pytest.raises(ValueError, match="turn length"):
        Gate(turn_s=-1)


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not (os.path.isdir("/proc/self/task") and threads._pause() is not None),
                    reason="needs Linux and GNU OpenMP with omp_pause_resource_all")
def test_a_thread_that_gives_its_turn_back_gives_back_its_cpu_workers():
    """A thread that ran the model keeps its OpenMP workers while it lives; idle, they make every other thread's
    parallel loops sleep at their barriers (threads.py). Giving the turn back frees them; a thread that used no
    gate keeps them (the control)."""
    gate, workers, left, done = Gate(), {}, {}, threading.Event()

    def one(name, gated):
        n = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            ticket = gate.ticket(name)
            if gated:
                ticket.acquire()
            before = _tasks()
            (torch.ones(1 << 22) * 2).sum()   # a parallel loop: this thread's team of workers is made
            workers[name] = _tasks() - before
            ticket.release()
            for _ in range(100 if gated else 0):   # freed workers exit on their own, soon after
                if not workers[name] & _tasks():
                    break
                time.sleep(0.02)
            left[name] = workers[name] & _tasks()
        finally:
            torch.set_num_threads(n)
        done.wait(10)                         # alive and idle, as a session waiting in line

    for name, gated in (("gated", True), ("plain", False)):
        done.clear()
        t = threading.Thread(target=one, args=(name, gated))
        t.start()
        while name not in left and t.is_alive():
            time.sleep(0.01)
        done.set()
        t.join(10)
    assert workers["gated"] and not left["gated"]
    assert workers["plain"] and left["plain"] == workers["plain"]
