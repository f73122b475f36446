"""Load test: a classroom opens the app at once. N simulated sessions (Streamlit AppTest instances, each in its
own thread, sharing this process's st.cache_resource as browser tabs share a server) set up the Step by step
page with their own prompt, drafter, temperature and seed, then all press Generate together.

Reports completed and failed sessions, the wait (time queued at the model before the first step: p50, p95),
the total time from the click to the page being done (p50, p95), the peak RSS, and how often the model was
loaded (once). Every session's tokens are then checked against a plain single-session decode of its prompt
with its settings (engine.run, nothing shared): each got its own, correct result.

    .venv/bin/python tests/load.py [--sessions 20] [--json]      (make load-test)
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import app.runs  # noqa: E402
import app.turns  # noqa: E402
from specdec_core import SamplingParams, drafters, engine  # noqa: E402

MAIN = str(ROOT / "app" / "main.py")
# AppTest swaps process-wide state (its mock runtime, the page registry) on every run; set-up runs switch pages
# and collide when many start together, so sessions set up one at a time and only the clicks run at once
SETUP = threading.Lock()
TIMEOUT = 900
SUBJECTS = ["cats", "rivers", "bread", "trains", "the moon", "bees", "chess", "rain", "glass", "maps",
            "owls", "salt", "bridges", "clocks", "snow", "ink", "ferns", "kites", "copper", "tides",
            "wolves", "paper", "lamps", "sand", "violins", "apples", "caves", "wind", "coral", "stone"]


def session_settings(i: int) -> dict:
    """Different prompts, drafters, temperatures, seeds and lengths; half greedy, half seeded sampling."""
    return dict(prompt=f"Write two short sentences about {SUBJECTS[i % len(SUBJECTS)]}.",
                drafter=("lookup", "none")[i % 2], temperature=0.0 if i % 4 < 2 else 0.8,
                seed=100 + i, max_new_tokens=16 + 8 * (i % 2))   # 16 or 24 new tokens


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


class Session:
    def __init__(self, i: int, barrier: threading.Barrier):
        self.i, self.cfg, self.barrier = i, session_settings(i), barrier
        self.at: AppTest | None = None
        self.error, self.clicked, self.total_s = "", 0.0, 0.0

    def setup(self) -> None:
        at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
        at.run()
        at.switch_page("../pages/step.py").run()
        at.selectbox(key="drafter").set_value(self.cfg["drafter"]).run()
        at.text_area(key="prompt").input(self.cfg["prompt"])
        at.slider(key="temperature").set_value(self.cfg["temperature"])
        at.number_input(key="seed").set_value(self.cfg["seed"])
        at.number_input(key="max_new_tokens").set_value(self.cfg["max_new_tokens"])
        at.run()
        if at.exception:
            raise RuntimeError(at.exception[0].value)
        self.at = at

    def __call__(self) -> None:
        try:
            with SETUP:
                self.setup()
        except BaseException as e:   # noqa: BLE001 -- reported, never raised from a thread
            self.error = f"setup: {type(e).__name__}: {e}"
        self.barrier.wait()
        if self.error:
            return
        try:
            self.clicked = time.monotonic()
            self.at.button(key="generate").click().run()
            self.total_s = time.monotonic() - self.clicked
            if self.at.exception or self.at.error:
                self.error = (self.at.exception or self.at.error)[0].value
            elif "run" not in self.at.session_state or self.at.session_state.run.status != "done":
                self.error = "no finished run"
        except BaseException as e:   # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"

    def tokens(self) -> list[int]:
        return [c.token for r in self.at.session_state.run.records for c in r.committed]


def reference(tgt, cfg: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, tokens) of one plain single-session decode with the session's settings."""
    ids = tgt.encode(cfg["prompt"]).tolist()
    k = 0 if cfg["drafter"] == "none" else app.runs.Settings().k
    sp = SamplingParams(temperature=cfg["temperature"], top_p=1.0, seed=cfg["seed"])
    toks, _, _ = engine.run(tgt, drafters.make(cfg["drafter"], tgt), ids, sp=sp, k=k,
                            max_new_tokens=cfg["max_new_tokens"])
    return ids, toks


def main(sessions: int = 20) -> dict:
    loads = []
    real_load = app.runs.load

    def counting_load(spec, *a, **kw):
        loads.append(spec)
        return real_load(spec, *a, **kw)
    app.runs.load = counting_load
    # the queue's label for a run is its session id, the same for every AppTest: label runs by prompt instead
    app.turns.who = lambda: st.session_state.get("prompt", "")
    gate = app.turns.gate()
    gate.finished.clear()

    t0 = time.monotonic()
    barrier = threading.Barrier(sessions)
    ss = [Session(i, barrier) for i in range(sessions)]
    threads = [threading.Thread(target=s, name=f"session-{s.i}") for s in ss]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    rss_after_run = rss_mb()

    firsts: dict[str, dict] = {}
    for f in gate.finished:   # a run's first entry is its own decode (a speculative run's baseline comes after)
        firsts.setdefault(f["who"], f)
    ok = [s for s in ss if not s.error]
    tgt = app.runs.model("bundled")
    wrong = []
    for s in ok:
        ids, want = reference(tgt, s.cfg)
        run = s.at.session_state.run
        if run.prompt_ids != ids or s.tokens() != want:
            wrong.append(s.i)
    waits = [firsts[s.cfg["prompt"]]["first_wait_s"] for s in ok if s.cfg["prompt"] in firsts]
    totals = [s.total_s for s in ok]
    return {"sessions": sessions, "completed": len(ok), "failed": len(ss) - len(ok),
            "errors": {s.i: s.error for s in ss if s.error},
            "correct": len(ok) - len(wrong), "wrong": wrong,
            "wait_p50_s": pct(waits, 0.5), "wait_p95_s": pct(waits, 0.95), "wait_max_s": max(waits, default=0.0),
            "total_p50_s": pct(totals, 0.5), "total_p95_s": pct(totals, 0.95),
            "turns_per_run_p50": statistics.median([f["turns"] for f in firsts.values()]) if firsts else 0,
            "wall_s": wall, "peak_rss_mb": rss_after_run, "model_loads": loads.count("bundled"),
            "gate_free_after": not gate.busy() and gate.waiting() == 0, "turn_s": gate.turn_s}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.sessions < 1:
        ap.error("--sessions must be at least 1")
    r = main(a.sessions)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['completed']} of {r['sessions']} sessions completed, {r['failed']} failed; "
              f"{r['correct']} of {r['completed']} with exactly their own single-session tokens")
        print(f"wait before the first step: p50 {r['wait_p50_s']:.1f} s, p95 {r['wait_p95_s']:.1f} s "
              f"(max {r['wait_max_s']:.1f} s)")
        print(f"click to done: p50 {r['total_p50_s']:.1f} s, p95 {r['total_p95_s']:.1f} s; wall {r['wall_s']:.0f} s")
        print(f"peak RSS {r['peak_rss_mb']:.0f} MB; the model loaded {r['model_loads']} time(s); turn "
              f"{r['turn_s']:g} s; gate free afterwards: {r['gate_free_after']}")
        for i, e in r["errors"].items():
            print(f"session {i}: {e}")
    sys.exit(0 if r["failed"] == 0 and not r["wrong"] and r["gate_free_after"] else 1)
