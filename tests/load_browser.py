"""Load test in real browsers: one app server (`streamlit run app/main.py`, as `make run` starts it) and N headless
Chromium pages open at once, each in its own browser context (its own session), each on Step by step with its own
prompt and drafter set through the page address. All press Generate together.

Every page must finish, and the text every page shows must be exactly its own single-session decode: each chip
of "The text so far" (the token id and text its hover carries, and its visible text) against a plain greedy
decode of the same prompt by the engine in this process, in the weight format the pages' sidebar names (at
temperature 0 speculative output equals plain decoding token for token). Reports the time from the click to the
finished page (p50, p95), the server's peak memory (the RSS of its process and its children, sampled), and, while
the others decode, how long a fresh page takes to load the app and show its navigation (it must, at least once
before the last page finishes).

Everything runs on 127.0.0.1 under one time limit; the server and the browser are shut down however it ends.
Exits non-zero on any failure.

    .venv/bin/python tests/load_browser.py [--pages 10] [--max-new-tokens 12] [--json]   (make load-test-browser)
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import html
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TQDM_DISABLE", "1")   # the loader's per-tensor bars (read at import): this script says what it does
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HOST = "127.0.0.1"
# a mix of draft sources (the distilled draft model loads on its page's first run, inside the test)
DRAFTERS = ("lookup", "none", "suffix", "early-exit", "medusa", "eagle", "draft")
SUBJECTS = ["cats", "rivers", "bread", "trains", "the moon", "bees", "chess", "rain", "glass", "maps",
            "owls", "salt", "bridges", "clocks", "snow", "ink", "ferns", "kites", "copper", "tides",
            "wolves", "paper", "lamps", "sand", "violins", "apples", "caves", "wind", "coral", "stone"]
NAV = '[data-testid="stSidebarNav"] a'
DONE = ".st-key-play button"   # the replay's Play/Pause: drawn once the run (and its plain baseline) has ended
ERROR = '[data-testid="stAlertContentError"], [data-testid="stException"]'
CHIPS = ".text-so-far .tok"
TITLE = re.compile(r" · id (\d+) · (.*)\Z", re.S)   # view.chip's hover: "<origin …> · id <token> · <repr(piece)>"


def page_settings(i: int, max_new_tokens: int) -> dict:
    """Page i's own prompt and drafter, greedy, as the page address carries them (app/classroom.py)."""
    return dict(drafter=DRAFTERS[i % len(DRAFTERS)], workload="custom", temperature="0",
                max_new_tokens=str(max_new_tokens),
                prompt=f"Write two short sentences about {SUBJECTS[i % len(SUBJECTS)]}.")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def visible(piece: str) -> str:
    """A chip's text as the page draws it (app/view.chip), whitespace runs made one space."""
    from app import view
    body = f"template: {piece.strip().strip('<>|/') or 'special'}" if view.is_template(piece) \
        else html.unescape(view.chip_body(piece))
    return " ".join(body.split())


@dataclass
class Expected:
    tokens: list[int]
    pieces: list[str]
    shown: list[str]
    text: str


def references(cfgs: list[dict], fmt: str) -> list[Expected]:
    """Each page's single-session result: a plain greedy decode of its prompt by the engine, nothing shared, in
    the weight format the server's pages run (`fmt`, as their sidebar says: formats differ in their rounding)."""
    import torch
    from specdec_core import SamplingParams, drafters, engine
    from specdec_core.bench import regime
    tgt = regime.load_format(fmt)
    out = []
    for cfg in cfgs:
        ids = tgt.encode(cfg["prompt"]).tolist()
        toks, recs, _ = engine.run(tgt, drafters.make(drafters.PLAIN, tgt), ids,
                                   sp=SamplingParams(temperature=0.0, top_p=1.0, seed=0), k=0,
                                   max_new_tokens=int(cfg["max_new_tokens"]))
        pieces = [c.piece for r in recs for c in r.committed]
        out.append(Expected(toks, pieces, [visible(p) for p in pieces], tgt.tokenizer.decode(toks)))
    del tgt
    gc.collect()
    torch.set_num_threads(1)   # what is left for this process is the browser's driver, not arithmetic
    return out


def page_format(line: str) -> str:
    """The weight format a page's sidebar line names ("Weights: dense fp32 — …")."""
    from specdec_core.bench import regime
    for f, words in regime.FORMATS.items():
        if line.startswith(f"Weights: {words}"):
            return f
    raise RuntimeError(f"the sidebar does not say which weights run: {line!r}")


def read_chips(titles: list[str], texts: list[str]) -> tuple[list[int], list[str], list[str]]:
    """(token ids, pieces, visible texts) of the page's chips, from each chip's hover and its drawn text."""
    import ast
    ids, pieces = [], []
    for t in titles:
        m = TITLE.search(t or "")
        if not m:
            raise ValueError(f"a chip's hover does not name its token: {t!r}")
        ids.append(int(m.group(1)))
        pieces.append(ast.literal_eval(m.group(2)))
    return ids, pieces, [" ".join(x.split()) for x in texts]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """`streamlit run app/main.py` on a free local port, in its own process group; its memory sampled."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}/"
        self.log = log
        st = Path(sys.executable).with_name("streamlit")
        cmd = [str(st)] if st.exists() else [sys.executable, "-m", "streamlit"]
        self.out = open(log, "w")
        self.proc = subprocess.Popen(
            cmd + ["run", "app/main.py", "--server.port", str(self.port), "--server.address", HOST,
                   "--server.headless", "true", "--browser.gatherUsageStats", "false",
                   "--server.fileWatcherType", "none"],
            cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        self.peak_mb = 0.0       # since the start (a model load, a first build of the C++ loop included)
        self.run_peak_mb = 0.0   # since mark(): the run itself
        self.samples = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def rss_mb(self) -> float:
        import psutil
        try:
            p = psutil.Process(self.proc.pid)
            procs = [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            return 0.0
        total = 0
        for q in procs:
            try:
                total += q.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total / 2**20

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            mb = self.rss_mb()
            self.peak_mb, self.run_peak_mb = max(self.peak_mb, mb), max(self.run_peak_mb, mb)
            self.samples += 1

    def mark(self) -> float:
        """Start the run's peak from now; the RSS now."""
        self.run_peak_mb = mb = self.rss_mb()
        return mb

    def wait_healthy(self, limit: float) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if urllib.request.urlopen(self.url + "_stcore/health", timeout=2).read() == b"ok":
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the server did not answer its health check within {limit:.0f} s")

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self.out.close()


@dataclass
class Page:
    i: int
    cfg: dict
    want: Expected | None = None
    fmt: str = ""
    page: object = None
    clicked: float = 0.0
    total_s: float | None = None
    error: str = ""
    got: str = ""
    shown_tokens: int = 0
    phase: str = "opening"

    @property
    def url_query(self) -> str:
        return urllib.parse.urlencode(self.cfg)


@dataclass
class Probe:
    load_s: float
    pending_before: int
    pending_after: int


@dataclass
class Run:
    pages: list[Page]
    probes: list[Probe] = field(default_factory=list)
    probe_errors: list[str] = field(default_factory=list)
    rss_before_mb: float = 0.0
    open_s: float = 0.0
    run_s: float = 0.0
    reference_s: float = 0.0
    fmt: str = ""

    def pending(self) -> int:
        return sum(p.total_s is None and not p.error for p in self.pages)


def say(msg: str) -> None:
    print(msg, flush=True)


async def settle(page, limit_ms: int) -> None:
    """Wait until Streamlit's running indicator is gone."""
    await page.wait_for_timeout(300)
    await page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=limit_ms)


async def open_page(browser, url: str, p: Page, limit_ms: int) -> None:
    ctx = await browser.new_context(viewport={"width": 1280, "height": 1000})
    ctx.set_default_timeout(limit_ms)   # ten pages loading at once on a busy machine outlast playwright's 30 s
    p.page = await ctx.new_page()
    await p.page.goto(f"{url}step?{p.url_query}")
    await p.page.locator(".st-key-generate button").wait_for(timeout=limit_ms)
    await settle(p.page, limit_ms)   # the first page loads the model; the rest wait for it
    # the address set this page's own prompt and drafter
    prompt = await p.page.locator(".st-key-prompt textarea").input_value()
    caption = p.page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]').filter(has_text="up to")
    summary = await caption.first.inner_text()
    if prompt != p.cfg["prompt"] or not summary.startswith(p.cfg["drafter"]) or \
            f"up to {p.cfg['max_new_tokens']} tokens" not in summary or "temperature 0 " not in summary:
        raise RuntimeError(f"page {p.i}: the address did not set its settings (prompt {prompt!r}, {summary!r})")
    from specdec_core.bench.regime import FORMATS
    weights = p.page.locator('[data-testid="stSidebar"] [data-testid="stCaptionContainer"]').filter(
        has_text=re.compile("Weights: (" + "|".join(map(re.escape, FORMATS.values())) + ")"))
    await weights.first.wait_for(timeout=limit_ms)
    p.fmt = page_format((await weights.first.inner_text()).strip())


async def finish(p: Page, run: Run, t0: float, limit_ms: int) -> None:
    """Wait for the page's run to end, then show its last step whole and read the text it shows."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout
    page = p.page
    try:
        hit = page.locator(DONE).or_(page.locator(ERROR)).first
        await hit.wait_for(timeout=limit_ms)
        if await page.locator(ERROR).count():
            raise RuntimeError("the page shows an error: " + (await page.locator(ERROR).first.inner_text())[:300])
        p.total_s = time.monotonic() - p.clicked
        p.phase = "finished"
        say(f"  page {p.i:2d} ({p.cfg['drafter']}) done {p.total_s:6.1f} s after its click "
            f"({len(run.pages) - run.pending()} of {len(run.pages)}, {time.monotonic() - t0:.0f} s in)")
        # Last pauses the replay at its last step, shown whole. The page is not waited on to be idle first: its
        # replay reruns every 0.9 s, and on a busy machine each rerun can outlast that. A click that lands while
        # the replay redraws its bar can meet the button beside Last, or none, so each try is short and the page
        # is read again: until its heading names the last step ("Step n of n") with a chip for every token, it
        # gets Last again, as a student would press it again.
        want, last = p.want, page.locator(".st-key-last button").first
        end = time.monotonic() + limit_ms / 1000
        tries = 0
        while True:
            p.phase = f"pressing Last (try {tries + 1})"
            try:
                await last.click(timeout=10_000)
            except PlaywrightTimeout:
                pass
            tries += 1
            await page.wait_for_timeout(2000)
            p.phase = f"reading the last step (after {tries} presses of Last)"
            head = page.locator("h3").filter(has_text=re.compile(r"Step (\d+) of \1\b"))
            titles = [await c.get_attribute("title") for c in await page.locator(CHIPS).all()]
            if await head.count() and len(titles) == len(want.tokens):
                break
            if time.monotonic() > end:
                shown = await page.locator("h3").filter(has_text="Step ").all_inner_texts()
                raise RuntimeError(f"the last step was not shown after {tries} presses of Last (the page shows "
                                   f"{shown}, {len(titles)} chips)")
        if await page.get_by_text("Stopped after", exact=False).count():
            raise RuntimeError("the run was stopped before its end")
        texts = await page.locator(CHIPS).all_inner_texts()
        ids, pieces, shown = read_chips(titles, texts)
        p.got, p.shown_tokens = "".join(pieces), len(ids)
        if ids != want.tokens:
            raise RuntimeError(f"tokens differ from the single-session decode: page {ids}, alone {want.tokens}")
        if pieces != want.pieces or shown != want.shown:
            raise RuntimeError(f"the text shown differs: page {shown}, alone {want.shown}")
        p.phase = "compared"
    except Exception as e:   # noqa: BLE001 -- every page is reported, one failure does not stop the others
        p.error = p.error or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        say(f"  page {p.i:2d} ({p.cfg['drafter']}) FAILED: {p.error}")


async def probe(browser, url: str, run: Run, limit_ms: int) -> None:
    """While pages are still decoding, open fresh pages one after another: each must load the app and show its
    navigation; how long each took, and how many pages were still decoding when it appeared."""
    while run.pending():
        before = run.pending()
        ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
        ctx.set_default_timeout(limit_ms)
        try:
            page = await ctx.new_page()
            t = time.monotonic()
            await page.goto(url)
            await page.locator(NAV).first.wait_for(timeout=limit_ms)
            await page.locator("h1").first.wait_for(timeout=limit_ms)
            dt = time.monotonic() - t
            run.probes.append(Probe(dt, before, run.pending()))
            say(f"  fresh page: navigation shown in {dt:.1f} s ({run.pending()} pages still decoding)")
        except Exception as e:   # noqa: BLE001
            run.probe_errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            say(f"  fresh page FAILED: {run.probe_errors[-1]}")
        finally:
            await ctx.close()
        await asyncio.sleep(1.0)


async def watch(run: Run, every_s: float = 60.0) -> None:
    """Every minute, what each page not yet compared is doing: a stall is seen where it happens."""
    while True:
        await asyncio.sleep(every_s)
        left = [p for p in run.pages if p.phase != "compared" and not p.error]
        if not left:
            return
        say("  still going: " + "; ".join(f"page {p.i} {p.phase}" for p in left))


async def drive(server: Server, run: Run, page_limit_s: float, fresh_limit_s: float, shot: Path | None) -> None:
    from playwright.async_api import async_playwright
    limit_ms = int(page_limit_s * 1000)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            t = time.monotonic()
            say(f"opening {len(run.pages)} pages on Step by step…")
            await asyncio.gather(*(open_page(browser, server.url, p, limit_ms) for p in run.pages))
            run.open_s = time.monotonic() - t
            fmts = {p.fmt for p in run.pages}
            if len(fmts) != 1:
                raise RuntimeError(f"the pages run different weight formats: {sorted(fmts)}")
            run.fmt = fmts.pop()
            say(f"the pages run the {run.fmt} weights; single-session references: {len(run.pages)} plain greedy "
                f"decodes in this process…")
            t = time.monotonic()
            for p, w in zip(run.pages, await asyncio.to_thread(references, [p.cfg for p in run.pages], run.fmt)):
                p.want = w
            run.reference_s = time.monotonic() - t
            run.rss_before_mb = server.mark()
            say(f"all {len(run.pages)} pages ready in {run.open_s:.0f} s (server RSS {run.rss_before_mb:.0f} MB); "
                "pressing Generate on every page")

            async def click(p: Page) -> None:
                p.clicked = time.monotonic()
                await p.page.locator(".st-key-generate button").click()
                p.phase = "decoding"
            t0 = time.monotonic()
            await asyncio.gather(*(click(p) for p in run.pages))
            await asyncio.gather(probe(browser, server.url, run, int(fresh_limit_s * 1000)), watch(run),
                                 *(finish(p, run, t0, limit_ms) for p in run.pages))
            run.run_s = time.monotonic() - t0
            if shot is not None:
                shot.parent.mkdir(parents=True, exist_ok=True)
                await run.pages[0].page.screenshot(path=str(shot), full_page=True)
                say(f"the first page, finished: {shot}")
        finally:
            await browser.close()


def main(pages: int = 10, max_new_tokens: int = 12, limit_s: float = 1800, fresh_limit_s: float = 120,
         screenshot: str | None = None) -> dict:
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is not installed (apt-get install chromium)")
    t_start = time.monotonic()

    def stopped(signum, frame):   # a SIGTERM (a timeout around this script) still shuts the server down
        raise SystemExit(f"stopped by signal {signum}")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stopped)
    run = Run([Page(i, page_settings(i, max_new_tokens)) for i in range(pages)])
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="load-browser-") as tmp:
        server = Server(Path(tmp) / "streamlit.log")
        try:
            say(f"server: {server.url}")
            server.wait_healthy(120)
            left = limit_s - (time.monotonic() - t_start)
            asyncio.run(asyncio.wait_for(drive(server, run, left, fresh_limit_s,
                                               Path(screenshot) if screenshot else None), timeout=left))
        except (asyncio.TimeoutError, TimeoutError):
            failures.append(f"the run passed its time limit of {limit_s:.0f} s")
        except Exception as e:   # noqa: BLE001 -- reported below, with the server's log
            failures.append(f"{type(e).__name__}: {e}")
        finally:
            alive = server.proc.poll() is None
            server.stop()
            if not alive:
                failures.append(f"the server died during the run (exit {server.proc.returncode})")
            if failures:
                failures.append("server log, last lines:\n" + server.tail())
    done = [p for p in run.pages if p.total_s is not None and not p.error]
    totals = [p.total_s for p in done]
    during = [pr for pr in run.probes if pr.pending_after > 0]
    if not failures and not during:
        failures.append("no fresh page showed the navigation while pages were still decoding")
    if run.probe_errors:
        failures.append(f"{len(run.probe_errors)} fresh page(s) did not load: {run.probe_errors[0]}")
    return {"pages": pages, "max_new_tokens": max_new_tokens, "completed": len(done),
            "failed": pages - len(done), "correct": len(done),
            "errors": {p.i: p.error or "did not finish" for p in run.pages if p not in done},
            "drafters": {p.i: p.cfg["drafter"] for p in run.pages},
            "click_to_done_p50_s": pct(totals, 0.5), "click_to_done_p95_s": pct(totals, 0.95),
            "click_to_done_max_s": max(totals, default=float("nan")),
            "peak_rss_mb": server.run_peak_mb, "peak_rss_all_mb": server.peak_mb,
            "rss_before_clicks_mb": run.rss_before_mb, "rss_samples": server.samples,
            "fresh_pages": len(run.probes), "fresh_during_run": len(during),
            "fresh_load_p50_s": statistics.median([pr.load_s for pr in during]) if during else float("nan"),
            "fresh_load_max_s": max((pr.load_s for pr in during), default=float("nan")),
            "open_s": run.open_s, "run_s": run.run_s, "reference_s": run.reference_s, "weights": run.fmt,
            "wall_s": time.monotonic() - t_start, "failures": failures,
            "ok": not failures and len(done) == pages}


def report(r: dict) -> None:
    say(f"{r['completed']} of {r['pages']} browser pages finished with exactly their own single-session text, "
        f"{r['failed']} failed ({r['max_new_tokens']} new tokens each, greedy, {r['weights']} weights; drafters "
        f"{', '.join(sorted(set(r['drafters'].values())))})")
    say(f"click to done: p50 {r['click_to_done_p50_s']:.1f} s, p95 {r['click_to_done_p95_s']:.1f} s "
        f"(max {r['click_to_done_max_s']:.1f} s); all {r['pages']} runs {r['run_s']:.0f} s")
    say(f"server peak RSS during the run {r['peak_rss_mb']:.0f} MB (process and children, sampled every 0.2 s; "
        f"{r['rss_before_clicks_mb']:.0f} MB with the pages open before the clicks; {r['peak_rss_all_mb']:.0f} MB "
        "since the server started)")
    say(f"fresh pages during the run: {r['fresh_during_run']} of {r['fresh_pages']} showed the navigation while "
        f"others decoded, p50 {r['fresh_load_p50_s']:.1f} s, max {r['fresh_load_max_s']:.1f} s")
    say(f"pages opened in {r['open_s']:.0f} s; references {r['reference_s']:.0f} s; wall {r['wall_s']:.0f} s")
    for i, e in r["errors"].items():
        say(f"page {i}: {e}")
    for f in r["failures"]:
        say(f"FAILED: {f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--limit", type=float, default=1800, help="seconds for the whole test (default 1800)")
    ap.add_argument("--fresh-limit", type=float, default=120, help="seconds a fresh page may take (default 120)")
    ap.add_argument("--screenshot", default=str(ROOT / "runs" / "load-browser" / "page0.png"),
                    help="where to save the first page, finished, as a PNG (default runs/load-browser/page0.png)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.pages < 1:
        ap.error("--pages must be at least 1")
    if not 1 <= a.max_new_tokens <= 512:
        ap.error("--max-new-tokens must be 1..512")
    r = main(a.pages, a.max_new_tokens, a.limit, a.fresh_limit, a.screenshot)
    print(json.dumps(r)) if a.json else report(r)
    sys.exit(0 if r["ok"] else 1)
