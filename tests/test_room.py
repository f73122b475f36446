"""A class that answers together: the room's counts (specdec_core/serving/room.py) and the walkthrough's questions
counted across sessions (app/answers.py).

The pure room is driven as many voters and threads; the app as several AppTest sessions of one process (as
sessions of one server share its st.cache_resource): students answer a question, the presenter's page counts
them, a changed answer moves its vote, no student's page shows anything of another's, reset and reveal reach the
students' pages. Nothing here runs the model: the questions are answered without pressing a section's button.
"""
import json
import re
import threading
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import answers
from specdec_core.serving.room import Room

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")
KEY = "exact"   # section 4's question
QUIZ = f"wt_quiz_{KEY}"
# its right answer, read from the page source: quiz("exact", question, [options], right, why)
RIGHT = int(re.search(r'quiz\("' + KEY + r'".*?\], (\d),', (ROOT / "pages" / "walkthrough.py").read_text(), re.S)[1])


# ---- the room alone ----

def test_each_voter_counts_once_and_a_new_answer_moves_the_vote():
    r = Room()
    for voter, option in [("a", 0), ("b", 2), ("c", 2), ("d", 1)]:
        r.answer("q", voter, option, 3)
    assert r.counts("q", 3) == [1, 1, 2]
    r.answer("q", "b", 0, 3)          # b changes its mind
    r.answer("q", "a", 0, 3)          # a answers the same again: still one vote
    assert r.counts("q", 3) == [2, 1, 1]
    r.withdraw("q", "d")
    assert r.counts("q", 3) == [2, 0, 1]
    assert r.counts("other", 3) == [0, 0, 0]   # questions are counted apart


def test_reset_one_question_or_all_and_reveal():
    t = [100.0]
    r = Room(clock=lambda: t[0])
    r.answer("q1", "a", 1, 3)
    r.answer("q2", "a", 2, 3)
    r.reveal("q1")
    assert r.revealed("q1") and not r.revealed("q2")
    assert r.round("q1") == r.round("q2") == 0
    t[0] = 160.0
    r.reset("q1")
    assert r.counts("q1", 3) == [0, 0, 0] and not r.revealed("q1")   # a reset asks afresh: the answer hides
    assert r.counts("q2", 3) == [0, 0, 1]
    assert (r.round("q1"), r.round("q2")) == (1, 0)
    assert (r.counting_since("q1"), r.counting_since("q2")) == (160.0, 100.0)
    r.reveal("q2")
    r.reveal("q2", False)
    assert not r.revealed("q2")
    t[0] = 200.0
    r.reset()
    assert r.counts("q2", 3) == [0, 0, 0] and (r.round("q1"), r.round("q2")) == (2, 1)
    assert r.counting_since("q1") == r.counting_since("q2") == 200.0


def test_bad_votes_are_refused_and_change_nothing():
    r = Room()
    r.answer("q", "a", 1, 3)
    for option in (3, -1, "1", None):
        with pytest.raises(ValueError, match="not one of the question's 3 options"):
            r.answer("q", "a", option, 3)
    with pytest.raises(ValueError, match="voter id"):
        r.answer("q", "", 0, 3)
    assert r.counts("q", 3) == [0, 1, 0]


def test_many_threads_answer_at_once_and_every_vote_counts_once():
    r = Room()
    voters, rounds = 40, 50

    def session(i):
        for j in range(rounds):   # every voter changes its answer many times; its last one stands
            r.answer("q", f"v{i}", (i + j) % 3, 3)
            r.counts("q", 3)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(voters)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    last = [(i + rounds - 1) % 3 for i in range(voters)]
    assert r.counts("q", 3) == [last.count(o) for o in range(3)]


def test_the_chart_gives_nothing_away_before_the_reveal():
    opts = ["a", "b", "c"]
    hidden = answers.chart([1, 2, 0], opts, None).data[0]
    assert list(hidden.x) == [1, 2, 0] and len(set(hidden.marker.color)) == 1
    shown = answers.chart([1, 2, 0], opts, 2).data[0]
    assert list(shown.marker.color) == [answers.OTHER, answers.OTHER, answers.RIGHT]


# ---- the app: sessions of one process share the room ----

def page(**query) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.query_params.update(query)
    at.run()
    at.switch_page("../pages/walkthrough.py").run()
    at.radio(key="wt_section").set_value(KEY).run()
    assert not at.exception, at.exception
    return at


def counts_on(at: AppTest) -> list[int]:
    """The counts the presenter's chart draws (read from the chart the page sent)."""
    charts = at.get("plotly_chart")
    assert len(charts) == 1
    return json.loads(charts[0].proto.spec)["data"][0]["x"]


def colours_on(at: AppTest) -> list[str]:
    return json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["marker"]["color"]


def texts(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption", "info", "success", "error")
                     for e in getattr(at, kind))


@pytest.fixture(scope="module")
def room_pages():
    answers.room().reset()
    students = [page() for _ in range(3)]
    presenter = page(presenter="1")
    yield students, presenter
    answers.room().reset()


def test_the_presenter_sees_the_rooms_counts_and_students_see_only_their_own(room_pages):
    students, presenter = room_pages
    opts = students[0].radio(key=QUIZ).options
    right, wrong = RIGHT, next(i for i in range(len(opts)) if i != RIGHT)
    want = [0] * len(opts)
    assert counts_on(presenter) == [0, 0, 0]
    for at in students:
        assert not at.get("plotly_chart") and "room's answers" not in texts(at)   # no counts on a student's page
    students[0].radio(key=QUIZ).set_value(opts[right]).run()
    students[1].radio(key=QUIZ).set_value(opts[wrong]).run()
    students[2].radio(key=QUIZ).set_value(opts[wrong]).run()
    presenter.run()
    want[right], want[wrong] = 1, 2
    assert counts_on(presenter) == want
    assert "3 sessions answered" in texts(presenter)
    assert "a server restart loses them" in texts(presenter)
    # the presenter's own choice is not counted
    presenter.radio(key=QUIZ).set_value(opts[right]).run()
    assert counts_on(presenter) == want
    # a changed answer moves its vote, it does not add one
    students[1].radio(key=QUIZ).set_value(opts[right]).run()
    presenter.run()
    want[right], want[wrong] = 2, 1
    assert counts_on(presenter) == want
    # each student's page holds its own choice and feedback, nothing of the others'
    for at, mine in zip(students, [opts[right], opts[right], opts[wrong]]):
        at.run()
        assert at.radio(key=QUIZ).value == mine
        assert not at.get("plotly_chart") and "answered" not in texts(at)
    assert students[2].error[0].value.startswith("Not quite") and not students[2].success
    assert students[0].success[0].value.startswith("Right") and not students[0].error
    assert len({at.session_state[answers.VOTER] for at in students}) == 3   # three voters, one per session


def test_reveal_shows_the_answer_on_a_students_page(room_pages):
    students, presenter = room_pages
    late = page()   # a student who has not answered
    assert not late.info and not late.success and not late.error
    assert len(set(colours_on(presenter))) == 1   # no colour marks the right option before the reveal
    presenter.button(key=f"room_reveal_{KEY}").click().run()
    assert answers.room().revealed(KEY)
    assert colours_on(presenter)[RIGHT] == answers.RIGHT
    late.run()   # what the page's own timer does every few seconds
    right = late.radio(key=QUIZ).options[RIGHT]
    assert late.info and "revealed to the room" in late.info[0].value and f"“{right}”" in late.info[0].value
    assert late.radio(key=QUIZ).value is None   # revealing answers nobody's question for them
    presenter.button(key=f"room_reveal_{KEY}").click().run()   # hide it again
    late.run()
    assert not late.info


def test_reset_clears_the_counts_and_the_students_choices(room_pages):
    students, presenter = room_pages
    presenter.run()
    assert sum(counts_on(presenter)) == 3
    presenter.button(key=f"room_reset_{KEY}").click().run()
    assert counts_on(presenter) == [0, 0, 0]
    opts = students[0].radio(key=QUIZ).options
    students[0].run()
    assert students[0].radio(key=QUIZ).value is None and not students[0].success   # asked afresh
    students[0].radio(key=QUIZ).set_value(opts[RIGHT]).run()   # and answered again, counted in the new round
    assert students[0].radio(key=QUIZ).value == opts[RIGHT]
    presenter.run()
    assert counts_on(presenter) == [int(i == RIGHT) for i in range(len(opts))]
    presenter.button(key="room_reset_all").click().run()
    assert counts_on(presenter) == [0, 0, 0]
