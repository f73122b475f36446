"""Retake the screenshots of the app (README.md, docs/app.md): `python docs/screenshots.py http://127.0.0.1:8501/`
against a running `make run`. Drives Debian's Chromium headless (never a downloaded browser) and writes docs/*.png."""
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUT = Path(__file__).resolve().parent
SLOW_MS = 400_000


def button(page, key):
    return page.locator(f".st-key-{key} button").first


def settle(page, ms=1500):
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=SLOW_MS)
    page.wait_for_timeout(ms)


def chart(page):
    """Plotly draws after the page settles: wait for its SVG, then a moment for the bars."""
    page.locator(".stPlotlyChart .main-svg").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)


def nudge(page, key, presses):
    """Move a slider by keyboard: one press is one step."""
    page.locator(f".st-key-{key} input[type=range]").first.focus()
    for _ in range(presses):
        page.keyboard.press("ArrowRight")
    page.keyboard.press("Tab")
    settle(page, 500)


def main(url: str) -> None:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS, headless=True)
        page = b.new_page(viewport={"width": 1500, "height": 1350})
        page.goto(url + "step")  # the root address is the guided walkthrough
        button(page, "generate").wait_for(timeout=SLOW_MS)
        nudge(page, "temperature", 24)  # 1.2: p is a real distribution, so u and min(1, p/q) matter
        button(page, "generate").click()
        button(page, "play").wait_for(timeout=SLOW_MS)
        settle(page, 300)
        button(page, "play").click()
        settle(page)
        for _ in range(4):  # skip rejections in the very first step, where lookup copies the chat template
            button(page, "next_rejection").click()
            settle(page)
            if not page.locator("h3").filter(has_text="Step ").first.inner_text().startswith("Step 1 of"):
                break
        chart(page)
        page.screenshot(path=str(OUT / "step-result.png"))
        button(page, "phase_back").click()
        settle(page)
        chart(page)
        page.screenshot(path=str(OUT / "step-verify.png"))
        page.goto(url + "race")
        button(page, "race").wait_for(timeout=SLOW_MS)
        button(page, "race").click()
        button(page, "race_finish").wait_for(timeout=SLOW_MS)
        settle(page, 300)
        button(page, "race_finish").click()
        settle(page)
        page.get_by_text("a speedup of", exact=False).wait_for(timeout=60_000)
        settle(page)
        page.screenshot(path=str(OUT / "race.png"))
        b.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8501/")
