"""The measuring rule's clock (specdec_core/clock.py): inside cpu_work() a step is timed by the decoding thread's
own CPU time on one intra-op thread, so time spent off the CPU (a busy neighbour, a sleep) is not counted; outside,
the wall clock; the thread count comes back after the block. And the pages that judge the workloads judge them
with one function."""
import threading
import time

import torch

from specdec_core import clock


def test_cpu_work_does_not_count_time_off_the_cpu():
    with clock.cpu_work():
        assert clock.measuring() and torch.get_num_threads() == clock.THREADS
        a, w = clock.now(), time.perf_counter()
        time.sleep(0.3)                        # off the CPU: a descheduled decoder looks like this
        spent, wall = clock.now() - a, time.perf_counter() - w
    assert wall >= 0.3 and spent < 0.05, (wall, spent)
    a = clock.now()
    time.sleep(0.1)
    assert clock.now() - a >= 0.1              # outside the block: the wall clock, as a live run shows it


def test_cpu_work_counts_the_threads_own_work_and_restores_the_threads():
    before = torch.get_num_threads()
    with clock.cpu_work(threads=1):
        with clock.cpu_work(threads=3):         # nested: the outer block's setting holds
            assert torch.get_num_threads() == 1
        a, c = clock.now(), time.thread_time()
        sum(i * i for i in range(2_000_000))   # this thread's own work
        spent, cpu = clock.now() - a, time.thread_time() - c
        assert spent > 0 and abs(spent - cpu) <= 0.1 * cpu
    assert not clock.measuring() and torch.get_num_threads() == before


def test_cpu_work_is_per_thread():
    seen = {}
    with clock.cpu_work():
        t = threading.Thread(target=lambda: seen.setdefault("other", clock.measuring()))
        t.start()
        t.join()
    assert seen == {"other": False}


def test_walkthrough_section_5_judges_with_the_workloads_pages_function(monkeypatch):
    """Section 5's rows are bench.showcase.workload_rows', the function the Workloads page measures with, on
    every workload but the batch (section 6's); neither page judges a row any other way."""
    from pathlib import Path

    from app import walk
    from specdec_core.bench import showcase
    from specdec_core.bench.workloads import WORKLOADS
    calls = []
    monkeypatch.setattr(showcase, "workload_rows", lambda tgt, names, *a, **kw: calls.append(list(names)) or
                        iter([{"workload": n} for n in names]))
    rows = walk.workload_rows(object())
    assert calls == [[n for n, w in WORKLOADS.items() if w.batch_size == 1]] and len(rows) == len(calls[0])
    root = Path(__file__).resolve().parents[1]
    for page in ("pages/workloads.py", "app/walk.py"):
        src = (root / page).read_text()
        assert "showcase.workload_rows(" in src and "lesson.check(" not in src and "benefit(" not in src


def test_the_temperature_page_opens_on_the_measured_demo():
    """The page's default drafter and prompts are bench.workloads.TEMPERATURE_DEMO's (a drafter that can run, a
    workload of single requests), not a literal of the page's own."""
    import ast
    from pathlib import Path

    from specdec_core import drafters
    from specdec_core.bench.workloads import TEMPERATURE_DEMO, WORKLOADS
    name, wl = TEMPERATURE_DEMO
    assert name in drafters.SPECULATIVE and WORKLOADS[wl].batch_size == 1
    src = (Path(__file__).resolve().parents[1] / "pages" / "temperature.py").read_text()
    tree = ast.parse(src)
    assert "DEMO_DRAFTER, DEMO_WORKLOAD = TEMPERATURE_DEMO" in src
    calls = {ast.unparse(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert ast.unparse(calls["measure.pick_drafters"].args[1]) == "(DEMO_DRAFTER,)"
    settle = {k.arg: ast.unparse(k.value) for k in calls["measure.settle"].keywords}
    assert settle["temp_workload"] == "measure.workload_or_first(DEMO_WORKLOAD)"
