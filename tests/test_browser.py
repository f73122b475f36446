"""The app in a real browser: start `streamlit run` on a free port, drive headless Chromium through the
first three walkthrough sections (their live widgets and a check-yourself question), then through a
generation, watch it animate, step to a rejection and back, stop a long run, check a second tab keeps
its own state, and see what only a browser draws: a candidate tree node for node, the time breakdown's bars,
presenter mode's navigation, and a page with nothing stale after an error. Skips when Debian's chromium is
not installed; never downloads a browser."""
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.classroom import REPEAT

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[1]
SLOW_MS = 400_000  # a cold model load and a run, on a busy 2-core machine

if not CHROMIUM.exists():
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "streamlit.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}; see {log.name}")
            try:
                if urllib.request.urlopen(url + "_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("streamlit did not answer its health check within 2 minutes")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        b.close()


def button(page, key):
    return page.locator(f".st-key-{key} button").first


def set_number(page, key, value):
    box = page.locator(f".st-key-{key} input").first
    box.fill(str(value))
    box.press("Enter")


def settle(page, s=1.0):
    """Let a rerun land: wait until Streamlit's running indicator is gone, then a little more."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=SLOW_MS)
    page.wait_for_timeout(int(s * 1000))


def heading(page) -> str:
    return page.locator("h3").filter(has_text="Step ").first.inner_text()


def open_section(page, title):
    """Pick a walkthrough section by its radio label and wait for its heading."""
    page.locator(".st-key-wt_section label").filter(has_text=title).click()
    settle(page)
    page.locator("h2").filter(has_text=title).wait_for(timeout=60_000)


def metric(page, label) -> tuple[str, str]:
    """The value and the delta ("" when none) of the st.metric with this label, once it is shown."""
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label).first
    box.wait_for(timeout=SLOW_MS)
    delta = box.locator('[data-testid="stMetricDelta"]')
    return box.locator('[data-testid="stMetricValue"]').inner_text(), delta.inner_text() if delta.count() else ""


@pytest.mark.long
def test_a_newcomer_walks_the_first_three_sections_and_answers_a_question(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1600})
    page.goto(server)  # the root address: what a newcomer sees first
    page.locator("h1").filter(has_text="Start here").wait_for(timeout=SLOW_MS)
    settle(page)

    # 1: the section open on arrival; its button runs the real decoder both ways on a repeating prompt
    page.locator("h2").filter(has_text="1 · Why decoding leaves arithmetic idle").wait_for(timeout=60_000)
    button(page, "wt_run_idle").click()
    look, plain = metric(page, "target passes for 16 tokens")
    settle(page)
    n_look, n_plain = int(look.split()[0]), int(re.search(r"(\d+) plain", plain).group(1))
    assert 0 < n_look < n_plain, (look, plain)  # lookup copies the repeated text: fewer target passes
    assert page.locator(".text-so-far .tok").count() > 0  # the decoded tokens, coloured by origin
    # the check-yourself question: a wrong answer, then the right one, each with its feedback on the page
    quiz = page.locator(".st-key-wt_quiz_idle")
    quiz.locator("label").filter(has_text="The draft model does the checking").click()
    settle(page)
    wrong = page.locator('[data-testid="stAlertContentError"]').filter(has_text="Not quite")
    wrong.wait_for(timeout=60_000)
    assert "One pass reads the weights once" in wrong.inner_text()  # it names the right answer
    quiz.locator("label").filter(has_text="One pass reads the weights once").click()
    settle(page)
    right = page.locator('[data-testid="stAlertContentSuccess"]').filter(has_text="Right.")
    right.wait_for(timeout=60_000)
    assert "bound by reading the weights" in right.inner_text()
    assert page.locator('[data-testid="stAlertContentError"]').filter(has_text="Not quite").count() == 0

    # 2: a draft model's cost, and a real pair with another vocabulary refused, with the reason
    open_section(page, "2 · Two models, and what they cost")
    button(page, "wt_run_two").click()
    target, _ = metric(page, "target parameters")
    assert target.endswith(" M") and float(target.split()[0]) > 100  # the 135 M-parameter SmolLM2
    refusal = page.locator('[data-testid="stAlertContentError"]').filter(has_text="cannot draft for target")
    refusal.wait_for(timeout=SLOW_MS)
    assert "vocabulary sizes differ" in refusal.inner_text()

    # 3: a variant on a prompt where it shines (prompt lookup, the default choice), decoded live
    open_section(page, "3 · Variants: where drafts come from")
    button(page, "wt_run_variants").click()
    name, _ = metric(page, "drafter")
    assert name == "lookup"
    rate, _ = metric(page, "acceptance rate")
    assert rate.endswith("%") and 0 <= int(rate[:-1]) <= 100
    settle(page)
    assert page.locator(".text-so-far .tok").count() > 0
    page.screenshot(path=str(tmp_path / "walkthrough.png"), full_page=True)

    # onward: the walkthrough links to the other pages
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Where to go next").click()
    page.locator('[data-testid="stPageLink-NavLink"]').filter(has_text="Step by step").click()
    button(page, "generate").wait_for(timeout=SLOW_MS)
    assert page.url.split("?")[0].endswith("/step")
    page.close()


def test_generate_animate_step_to_a_rejection_and_back(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1800})
    page.goto(server + "step")
    button(page, "generate").wait_for(timeout=SLOW_MS)
    # a hot creative temperature and a prompt lookup that copies: drafts meet rejections
    page.locator(".st-key-workload").click()
    page.get_by_role("option", name="creative").first.click()
    settle(page)
    page.locator(".st-key-prompt textarea").fill(REPEAT)
    page.locator(".st-key-prompt textarea").press("Control+Enter")
    settle(page)
    set_number(page, "max_new_tokens", 20)
    settle(page)

    button(page, "generate").click()
    button(page, "play").wait_for(timeout=SLOW_MS)
    settle(page, 0.2)
    first = page.locator(".phase-on").inner_text() + heading(page) + page.locator(".context-strip").inner_text()
    page.wait_for_timeout(2500)  # autoplay: about three frames at 1x
    later = page.locator(".phase-on").inner_text() + heading(page) + page.locator(".context-strip").inner_text()
    assert later != first, "the replay should animate by itself after a run"

    button(page, "play").click()  # pause
    settle(page)
    assert not button(page, "next_rejection").is_disabled(), "this run should contain a rejection"
    button(page, "next_rejection").click()
    settle(page)
    rejected = page.locator(".context-strip .tok-rejected").first
    rejected.wait_for(timeout=10_000)
    assert "rejected" in rejected.get_attribute("title") and "p(x) =" in rejected.get_attribute("title")
    assert "tok-resampled" in page.locator(".context-strip .tok").last.get_attribute("class")  # drawn in its place
    assert page.locator(".text-so-far .tok-accepted, .text-so-far .tok-resampled").count() > 0
    # every token has visible text: a space is ␣, a newline ↵ (a resampled space was an empty orange box)
    chips = page.locator(".text-so-far .tok, .context-strip .tok").all_inner_texts()
    assert chips and all(t.strip() for t in chips), chips
    assert "Rejected" in heading(page)
    page.screenshot(path=str(tmp_path / "step-rejection.png"), full_page=True)
    assert (tmp_path / "step-rejection.png").stat().st_size > 10_000

    at = heading(page)
    n = int(at.split("Step ")[1].split(" of")[0])
    total = int(at.split(" of ")[1].split(" ")[0])
    button(page, "next" if n < total else "back").click()
    settle(page)
    moved = n + 1 if n < total else n - 1
    assert heading(page).startswith(f"Step {moved} of {total}")
    button(page, "back" if n < total else "next").click()
    settle(page)
    assert heading(page).startswith(f"Step {n} of {total}")
    button(page, "phase_back").click()  # the verify frame of the rejected draft
    settle(page)
    assert "Verify draft" in heading(page)
    assert page.locator(".vtable .verdict-rejected").count() == 1

    # a second tab is a second session: no run there, and this tab's run is untouched
    other = browser.new_page(viewport={"width": 1200, "height": 900})
    other.goto(server + "step")
    button(other, "generate").wait_for(timeout=SLOW_MS)
    settle(other)
    assert other.locator(".st-key-play").count() == 0
    assert other.get_by_text("press Generate", exact=False).count() >= 1
    other.close()
    assert heading(page).startswith(f"Step {n} of {total}")
    page.close()


def test_a_long_run_streams_and_can_be_stopped(server, browser, tmp_path):
    """A hot creative-writing run (the default extraction preset answers in a sentence and can end, with its
    end-of-sequence token, before Stop is pressed: on a fast machine it did)."""
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    page.goto(server + "step?workload=creative&example=0&max_new_tokens=512")
    button(page, "generate").wait_for(timeout=SLOW_MS)
    set_number(page, "max_new_tokens", 512)
    settle(page)
    button(page, "generate").click()
    # steps stream in while it decodes: the live text grows before the run ends
    page.locator(".text-so-far .tok").first.wait_for(timeout=SLOW_MS)
    # nothing stale under the live run: the "pick a prompt ... press Generate" hint is gone once the run starts
    assert page.get_by_text("Pick a prompt and a drafter", exact=False).count() == 0
    button(page, "stop").click()
    page.get_by_text("Stopped after", exact=False).wait_for(timeout=60_000)
    settle(page)
    assert page.locator(".st-key-play").count() == 1  # the steps made so far can be replayed
    page.screenshot(path=str(tmp_path / "stopped.png"), full_page=True)
    page.close()


def test_a_tree_is_drawn_node_for_node_with_its_costs_and_an_error_leaves_nothing_stale(server, browser, tmp_path):
    """What only a browser shows: in presenter mode every navigation label is whole; Medusa's candidate tree is
    drawn with one circle per drafted candidate (the number the page prints); the "where the time went" bars
    render; then a failed Generate leaves no replay, tree, chart or "Replaying the run of" caption behind."""
    page = browser.new_page(viewport={"width": 1500, "height": 1800})
    page.goto(server + "step?presenter=1&drafter=medusa&max_new_tokens=12&workload=code&example=0")
    button(page, "generate").wait_for(timeout=SLOW_MS)
    settle(page)
    links = page.locator('[data-testid="stSidebarNavLink"] p')
    assert links.count() >= 10
    cut = [t for t, (w, cw) in zip(links.all_inner_texts(), links.evaluate_all("ps => ps.map(p => "
                                                                                 "[p.scrollWidth, p.clientWidth])"))
           if w > cw + 1]
    assert not cut, f"navigation labels cut in presenter mode: {cut}"

    button(page, "generate").click()
    button(page, "play").wait_for(timeout=SLOW_MS)
    settle(page, 0.2)
    button(page, "play").click()   # pause, then the last step shown whole: every candidate drawn
    settle(page)
    button(page, "last").click()
    settle(page)
    tree = page.locator(".st-key-tree").first
    tree.locator(".main-svg").first.wait_for(timeout=60_000)
    said = page.locator('[data-testid="stCaptionContainer"]').filter(has_text=re.compile(r"a tree of \d"))
    said = said.first.inner_text()
    n = int(re.search(r"a tree of (\d+) candidates?", said).group(1))
    title = tree.locator(".gtitle").first.text_content()
    assert title.startswith(f"The candidate tree: {n} candidate"), title
    # candidates are circles (an arc in the marker's path); the root is a square, the drawn token a diamond
    marks = tree.locator(".scatterlayer path.point").evaluate_all("ps => ps.map(p => p.getAttribute('d'))")
    assert sum("A" in d for d in marks) == n >= 1, (n, marks)
    assert sum("A" not in d for d in marks) in (1, 2)   # the root, and the bonus/resampled token when drawn
    tree.screenshot(path=str(tmp_path / "tree.png"))

    costs = page.locator(".st-key-costs").first
    costs.scroll_into_view_if_needed()
    costs.locator(".main-svg").first.wait_for(timeout=60_000)
    assert costs.locator(".gtitle").first.text_content().startswith("The whole run")
    pieces = costs.locator(".barlayer .trace")
    assert pieces.count() == 4   # draft, verify pass, bookkeeping, loop
    assert all(pieces.nth(i).locator(".point path").count() == 4 for i in range(4))   # plain/spec, step/token
    widths = costs.locator(".barlayer .point path").evaluate_all(
        "ps => ps.map(p => p.getBBox().width)")
    assert sum(w > 0 for w in widths) >= 4, widths   # real bars: at least the verify pass on every row
    costs.screenshot(path=str(tmp_path / "costs.png"))

    page.locator(".st-key-prompt textarea").fill("   ")   # an empty prompt: Generate fails with a message
    page.locator(".st-key-prompt textarea").press("Control+Enter")
    settle(page)
    button(page, "generate").click()
    page.locator('[data-testid="stAlertContentError"]').filter(has_text="prompt is empty").wait_for(timeout=60_000)
    settle(page)
    assert page.locator(".st-key-tree, .st-key-costs, .st-key-play, .st-key-chart").count() == 0
    assert page.get_by_text("Replaying the run of", exact=False).count() == 0
    assert page.locator(".text-so-far .tok").count() == 0 and page.locator("h3").filter(has_text="Step ").count() == 0
    page.screenshot(path=str(tmp_path / "after-error.png"))
    page.close()
