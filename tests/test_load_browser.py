"""The real-browser load test (tests/load_browser.py): one app server, ten headless Chromium pages press Generate
on Step by step at once, each with its own prompt and drafter; every page finishes, every page shows exactly its
own single-session decode, and a fresh page loads the app while the others decode. Slow (minutes on 2 cores):
`pytest -m slow tests/test_load_browser.py`. Skips where Debian's chromium is not installed; never downloads a
browser. The hover parser it relies on is checked against the app's own chip markup in the fast run."""
import html
import re

import pytest

import load_browser
from app import view


def test_the_chip_reader_recovers_ids_and_text_from_the_apps_own_chips():
    pieces = [(" The", 504), ("\n", 198), (" cats'", 9012), ("<|im_end|>", 2), ("  ", 256), ("é·", 77)]
    chips = [view.chip(p, "tok-accepted", "accepted (step 1): p(x) = 0.912 · q(x) = 1.000", token=t)
             for p, t in pieces]
    titles = [html.unescape(re.search(r'title="([^"]*)"', c).group(1)) for c in chips]
    texts = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in chips]
    ids, got, shown = load_browser.read_chips(titles, texts)
    assert ids == [t for _, t in pieces]
    assert got == [p for p, _ in pieces]
    assert shown == [load_browser.visible(p) for p, _ in pieces]
    with pytest.raises(ValueError, match="does not name its token"):
        load_browser.read_chips(["accepted (step 1)"], ["x"])


@pytest.mark.slow
def test_ten_browser_pages_at_once_each_show_their_own_decode(tmp_path):
    if not load_browser.CHROMIUM.exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.async_api")
    r = load_browser.main(pages=10, max_new_tokens=12, screenshot=str(tmp_path / "page0.png"))
    assert r["completed"] == 10 and r["failed"] == 0, (r["errors"], r["failures"])
    assert r["correct"] == 10 and not r["failures"], r["failures"]
    assert len(set(r["drafters"].values())) >= 7   # every drafter, each page its own prompt
    assert r["fresh_during_run"] >= 1 and r["fresh_load_max_s"] < 120
    assert 0 < r["click_to_done_p50_s"] <= r["click_to_done_p95_s"] <= r["click_to_done_max_s"]
    assert r["peak_rss_mb"] >= r["rss_before_clicks_mb"] > 0 and r["rss_samples"] > 10
    assert r["ok"]
    assert (tmp_path / "page0.png").stat().st_size > 10_000
