"""Your own traffic: the prompt-set reader (serving.prompt_set) on each format and each bad file, the command
line taking the same files (a bad one is status 2 and one line, before any model loads), Road to production
running the checklist on a pasted set and keeping what was entered when an uploaded file is bad, and a server
that refuses the connection told as such, never as a finished phase."""
from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specdec_core import cli
from specdec_core.cli import main
from specdec_core.errors import InputError
from specdec_core.serving import checklist, prompt_set, remote
from specdec_core.serving.prompt_set import MAX_FILE_BYTES, MAX_PROMPT_CHARS, MAX_PROMPTS, parse

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "app" / "main.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(data, name="", **kw) -> str:
    with pytest.raises(InputError) as e:
        parse(data, name, **kw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- the three formats

def test_json_lines_keep_ids_categories_and_unicode_line_separators():
    got = parse(b'{"prompt": "a\\u2028b", "id": "x", "category": "code"}\n\n{"prompt": "two", "extra": 1}\n',
                "traffic.jsonl")
    assert got.format == "jsonl" and got.prompts == ["a\u2028b", "two"]
    assert got.rows[0] == {"prompt": "a\u2028b", "id": "x", "category": "code", "line": 1}
    assert got.rows[1]["line"] == 3 and got.rows[1]["id"] == "traffic-3" and "category" not in got.rows[1]
    raw = '{"prompt": "a\u2028b"}\n'.encode()   # the separator unescaped is still one line of JSON
    assert parse(raw, "t.jsonl").prompts == ["a\u2028b"]


def test_csv_with_a_prompt_column_quoted_commas_and_line_breaks():
    text = 'id,Prompt,category\n1,"Hello, world",chat\n\n2,"two\nlines",code\n'.encode("utf-8-sig")
    got = parse(text, "t.csv")
    assert got.format == "csv" and got.prompts == ["Hello, world", "two\nlines"]
    assert [r["line"] for r in got.rows] == [2, 4] and [r["id"] for r in got.rows] == ["1", "2"]
    assert [r["category"] for r in got.rows] == ["chat", "code"]
    assert parse(b"prompt\tid\nsay hi\t7\n", "t.tsv").rows[0] == {"prompt": "say hi", "id": "7", "line": 2}


def test_plain_text_one_prompt_per_line_with_the_prompt_boxs_escapes():
    got = parse(b"Say hi.\r\n\r\n  two\\nlines  \nback\\\\slash\n", "t.txt")
    assert got.format == "text" and got.prompts == ["Say hi.", "two\nlines", "back\\slash"]
    assert [r["line"] for r in got.rows] == [1, 3, 4]
    assert parse("hi".encode("utf-16"), "t.txt").prompts == ["hi"]       # UTF-16 with its byte-order mark


def test_pasted_text_is_told_by_its_content():
    assert parse('{"prompt": "a"}\n{"prompt": "b"}').format == "jsonl"
    assert parse("category,prompt\ncode,a\n").prompts == ["a"]
    assert parse("prompt\nonly one column\n").prompts == ["only one column"]
    assert parse("just a question?\nanother, with a comma").format == "text"


def test_limit_takes_the_first_prompts_of_a_larger_file():
    many = "\n".join(f"prompt {i}" for i in range(MAX_PROMPTS + 10)).encode()
    got = parse(many, "t.txt", limit=5)
    assert got.prompts == [f"prompt {i}" for i in range(5)] and got.cut == MAX_PROMPTS + 5


# ---------------------------------------------------------------- each bad file, one message naming the line

def test_not_json_names_the_line():
    assert refused(b'{"prompt": "a"}\n{"prompt": "b",}\n', "t.jsonl") == \
        "'t.jsonl': line 2 is not JSON (Expecting property name enclosed in double quotes at column 16)"
    assert "line 1 is one JSON array" in refused(b'[{"prompt": "a"}]', "t.json")
    assert "line 1 is JSON but not an object" in refused(b"42\n", "t.jsonl")


def test_no_prompt_field_or_column_names_the_line_and_what_is_there():
    assert refused(b'{"prompt": "a"}\n{"text": "b", "id": 2}\n', "t.jsonl") == \
        "'t.jsonl': line 2 has no \"prompt\" field (it has \"text\", \"id\")"
    assert refused(b'{"prompt": 7}\n', "t.jsonl") == "'t.jsonl': line 1: \"prompt\" is int, not text"
    assert refused(b"text,id\nhello,1\n", "t.csv") == \
        "'t.csv': line 1, the header, has no \"prompt\" column (it has \"text\", \"id\")"
    assert "line 3 has no prompt (it has 1 field; the header has 2)" in refused(b"id,prompt\n1,a\n2\n", "t.csv")


def test_empty_file_and_empty_prompt():
    for data, name in ((b"", "t.txt"), (b"  \n\n", "t.jsonl"), (b"\n", "t.csv"), ("", "")):
        assert refused(data, name).endswith(": is empty: no prompt in it")
    assert refused(b'{"prompt": "a"}\n{"prompt": "  "}\n', "t.jsonl") == "'t.jsonl': the prompt on line 2 is empty"
    assert refused(b'prompt,id\na,1\n"",2\n', "t.csv") == "'t.csv': the prompt on line 3 is empty"


def test_binary_data_is_refused_as_binary():
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
    msg = refused(png, "picture.txt")
    assert msg.startswith("'picture.txt': is binary, not text (byte 0x00 at offset 8, line 3)")
    assert "is binary" in refused(bytes(range(1, 32)) * 20, "t.jsonl")       # control bytes, no NUL


def test_too_large_too_many_and_too_long_are_refused_with_the_bound():
    assert refused(b"x" * (MAX_FILE_BYTES + 1), "big.txt") == \
        f"'big.txt': is too large: {MAX_FILE_BYTES + 1:,} bytes; at most {MAX_FILE_BYTES:,} (1 MiB) per file: take " \
        "a sample of it"
    many = "\n".join(f"p{i}" for i in range(MAX_PROMPTS + 1))
    assert f"holds {MAX_PROMPTS + 1} prompts; at most {MAX_PROMPTS} in one set" in refused(many)
    long = "short\n" + "y" * (MAX_PROMPT_CHARS + 1)
    assert refused(long, "t.txt") == \
        f"'t.txt': the prompt on line 2 has {MAX_PROMPT_CHARS + 1:,} characters; at most {MAX_PROMPT_CHARS:,} per prompt"


def test_mixed_and_foreign_encodings_name_the_line():
    mixed = "café\nnaïve\n".encode() + "résumé\n".encode("latin-1")
    assert refused(mixed, "t.txt").startswith("'t.txt': mixes encodings: line 1 is UTF-8 but line 3 is not "
                                             "(byte 0xe9 at column 2")
    latin = "plain ascii\n".encode() + "déjà vu\n".encode("cp1252")
    assert refused(latin, "t.txt").startswith("'t.txt': line 2 is not UTF-8 (byte 0xe9 at column 2")
    assert "save the file as UTF-8" in refused(latin, "t.txt")


def test_the_estimate_grows_with_the_work_and_reads_in_words():
    one = prompt_set.estimate_s(1, 8, 3, 0.05)
    assert prompt_set.estimate_s(2, 8, 3, 0.05) > one and prompt_set.estimate_s(1, 16, 3, 0.05) > one
    assert prompt_set.estimate_s(1, 8, 3, 0.05, 100, 0.01) == pytest.approx(one + 6 * 100 * 0.01)
    assert prompt_set.said(7.2) == "about 8 s" and prompt_set.said(300) == "about 5 min"
    assert prompt_set.bounds() == f"at most {MAX_PROMPTS} prompts, {MAX_PROMPT_CHARS:,} characters each, 1 MiB per file"


# ---------------------------------------------------------------- the command line

@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("loaded a model for bad input"))


@pytest.mark.parametrize("cmd", [["bench", "--drafter", "lookup"], ["check", "--base-url", "http://127.0.0.1:9/v1"],
                                 ["profile", "--drafter", "lookup"]])
def test_a_bad_prompt_file_is_status_2_and_one_line(tmp_path, capsys, no_model, cmd):
    f = tmp_path / "traffic.jsonl"
    f.write_bytes(b'{"prompt": "ok"}\n{"prompt": "broken\n')
    assert main([*cmd, "--prompts", str(f)]) == 2
    assert capsys.readouterr().err == f"error: --prompts {str(f)!r}: line 2 is not JSON (Unterminated string " \
                                      "starting at column 12)\n"
    g = tmp_path / "traffic.csv"
    g.write_bytes(b"question\nhi\n")
    assert main([*cmd, "--prompts", str(g)]) == 2
    assert "has no \"prompt\" column" in capsys.readouterr().err


def test_the_command_line_reads_all_three_formats(tmp_path, no_model):
    files = {"a.jsonl": '{"prompt": "one", "category": "chat"}\n{"prompt": "two"}\n',
             "b.csv": 'prompt,category\none,chat\ntwo,\n', "c.txt": "one\ntwo\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        assert cli._check_prompts(str(tmp_path / name), None) == ["one", "two"]
        rows = cli._prompt_rows([str(tmp_path / name)], None, ["chat"]) if name != "c.txt" else None
        assert rows is None or [r["prompt"] for r in rows] == ["one"]
    assert [r["prompt"] for r in cli._prompt_rows([str(tmp_path / n) for n in files], 3)] == ["one", "two", "one"]


# ---------------------------------------------------------------- a refused connection is not a finished phase

def test_a_refused_connection_says_the_server_could_not_be_reached():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    ph = remote.run_phase("speculation off", dead, ["hi"], None, 4, 5.0)
    assert remote.failed(ph) == (f"Speculation off: not done. The server could not be reached at {dead}: "
                                 "connection refused (is the server running on that port?). Nothing was asked.")
    assert remote.failed(remote.Phase("speculation on", dead)) == ""


def test_the_page_tells_a_refused_connection_and_does_not_count_it_done():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    at = AppTest.from_file(MAIN, default_timeout=600)
    at.run()
    at.switch_page("../pages/production.py").run()
    at.text_input(key="ep_off").input(dead).run()
    at.button(key="ep_run_off").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert any(f"could not be reached at {dead}: connection refused" in e and "press **1** again" in e
               for e in errors), errors
    assert not any("done" in i.value and "not done" not in i.value for i in at.info), [i.value for i in at.info]
    assert "ep_phase_off" not in at.session_state and at.button(key="ep_run_on").disabled


# ---------------------------------------------------------------- Road to production on your own traffic

def test_the_page_runs_the_checklist_on_a_pasted_set_and_a_bad_file_loses_nothing():
    at = AppTest.from_file(MAIN, default_timeout=600)
    at.query_params.update(drafter="lookup", k="3")
    at.run()
    at.switch_page("../pages/production.py").run()
    assert not at.exception, at.exception
    at.radio(key="ck_source").set_value("Your own prompt set").run()
    pasted = "Repeat exactly: one two three one two three\nList the colours: red, green, blue, red, green"
    at.text_area(key="ck_paste").input(pasted).run()
    at.slider(key="ck_tokens").set_value(4).run()
    assert any("Read 2 prompts (plain text)" in c.value for c in at.caption)
    assert any("2 prompts, each decoded 6 times" in c.value and "about" in c.value for c in at.caption)
    at.button(key="run_checklist").click().run()
    assert not at.exception and not at.error, at.error
    s, res = at.session_state["checklist"]
    assert [r.prompt for r in res] == pasted.split("\n")
    for r in res:   # greedy on and off, token by token, with the paired repeats and the per-prompt verdict
        assert len(r.base_ids) == len(r.spec_ids) == 4 and r.first_diff is None
        assert r.timing["repeats"] == 3 and len(r.pairs) == 3 and r.decision()[1]
        assert r.base.ttft_s > 0 and r.spec.tpot_s > 0
    table = next(t.value for t in at.table if "prompt 1" in t.value.columns)   # §1 has tables too
    assert list(table.columns) == ["prompt 1", "prompt 2"] and "speculation" in table.index
    assert table.loc["text", "prompt 1"].startswith("Repeat exactly")
    said = checklist.verdict(res)
    assert "Over the whole set: acceptance" in said and any(said.split("\n")[0][:60] in m.value for m in at.markdown)
    assert len(at.get("download_button")) == 2
    # §4 can take the same set to a live server
    at.button(key="ep_use_own").click().run()
    assert remote.parse_prompts(at.text_area(key="ep_prompts").value) == pasted.split("\n")
    # a bad file: its one message; the pasted text, the settings and the results stay
    at.file_uploader(key="ck_file").set_value(("traffic.jsonl", b'{"prompt": "a"}\n{"text": "b"}\n',
                                               "application/json")).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The file 'traffic.jsonl': line 2 has no \"prompt\" field (it has \"text\")"]
    assert at.text_area(key="ck_paste").value == pasted and at.slider(key="ck_tokens").value == 4
    assert at.session_state["checklist"][1] is res and at.button(key="run_checklist").disabled


# ---------------------------------------------------------------- the set's verdict (no model: known counts)

def test_the_set_verdict_sums_each_repeat_over_the_prompts():
    from types import SimpleNamespace as NS
    timing = {"speedup": 1.5, "speedup_min": 1.4, "speedup_max": 1.6, "noisy": False, "repeats": 3}
    easy = checklist.PromptResult("easy", [1], [1], NS(), NS(acceptance_rate=0.8, drafted=10, accepted=8), timing,
                                  [(10, 1.0, 10, 0.5)] * 3)
    hard = checklist.PromptResult("hard", [1], [1], NS(), NS(acceptance_rate=0.1, drafted=10, accepted=1),
                                  timing | {"speedup": 0.8}, [(10, 1.0, 10, 1.25)] * 3)
    o = checklist.overall([easy, hard])
    assert o["speedup"] == pytest.approx((20 / 1.75) / (20 / 2.0)) and o["repeats"] == 3
    assert o["acceptance_rate"] == pytest.approx(9 / 20)
    said = checklist.set_verdict([easy, hard])
    assert said.startswith("Over the whole set: acceptance 45%, the set's speedup 1.14x") and "1 of 2 prompts" in said
    assert "on pays for the set as a whole" in said
    assert "keep it off for this traffic" in checklist.set_verdict([hard])
    unsure = dataclasses.replace(easy, spec=NS(acceptance_rate=0.3, drafted=10, accepted=3),
                                 timing=timing | {"noisy": True})   # undecided alone; the set's acceptance 20%
    assert "hard to draft, keep it off" in checklist.set_verdict([unsure, hard])
    slow = [(10, 1.0, 10, 2.0)] * 3
    assert "runs slower with it" in checklist.set_verdict([easy, dataclasses.replace(hard, pairs=slow)])
