"""llama.cpp as a peer engine, and the production checklist against live OpenAI-compatible servers.

The live tests start llama-cpp-python's own server on the bundled GGUF (plain, and with its prompt-lookup
drafting) on free loopback ports and check the real report; they skip, saying why, only when the peer is not
installed (`make peers`). The error paths (server down, HTTP 500, a hung server, a body that is not OpenAI's,
a model the server lacks, /metrics without speculative counters) run against a small stub server."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specdec_core.bench.invariance import first_difference
from specdec_core.cli import main
from specdec_core.serving import endpoint, peer, remote
from specdec_core.serving.endpoint import EndpointError

ROOT = Path(__file__).resolve().parent.parent
MISSING = peer.unavailable()
needs_peer = pytest.mark.skipif(MISSING is not None, reason=f"peer not installed: {MISSING}")

VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {pos0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {pos1}
vllm:num_requests_running{{engine="0",model_name="m"}} 0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stub(BaseHTTPRequestHandler):
    """An OpenAI-ish server whose behaviour the test sets: server.mode and server.text."""
    def log_message(self, *a):
        pass

    def _send(self, code: int, body: str, ctype: str = "application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        srv, mode = self.server, self.server.mode
        if mode == "hang":
            time.sleep(5)
            return
        if self.path == "/v1/models":
            if mode == "not-openai":
                return self._send(200, "<html><body>a blog</body></html>", "text/html")
            return self._send(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}))
        if self.path == "/metrics":
            if mode == "vllm":
                n = srv.requests
                return self._send(200, VLLM_METRICS.format(drafts=4 * n, draft_tokens=12 * n, accepted=9 * n,
                                                           pos0=4 * n, pos1=3 * n), "text/plain")
            if mode == "plain-metrics":
                return self._send(200, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",
                                  "text/plain")
            return self._send(404, json.dumps({"detail": "Not Found"}))
        self._send(404, json.dumps({"detail": "Not Found"}))

    def do_POST(self):
        srv, mode = self.server, self.server.mode
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv.seen.append(body)
        if mode == "http500":
            return self._send(500, json.dumps({"error": {"message": "CUDA out of memory", "code": 500}}))
        if body.get("model") != "m":
            return self._send(404, json.dumps({"error": {"message": f"model {body.get('model')} not found"}}))
        srv.requests += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = [srv.text[i:i + 3] for i in range(0, len(srv.text), 3)]
        for j, p in enumerate(pieces):
            ev = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p},
                  "logprobs": {"content": [{"token": p, "logprob": -0.1}]}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"data: [DONE]\n\n")


@contextmanager
def stub(mode: str = "vllm", text: str = "def add(a, b):\n    return a + b\n"):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    srv.mode, srv.text, srv.seen, srv.requests = mode, text, [], 0
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


# ---- the client and the report, against the stub ----

def test_prometheus_text_is_parsed_and_vllm_counters_give_acceptance():
    before = endpoint.parse_prometheus(VLLM_METRICS.format(drafts=4, draft_tokens=12, accepted=9, pos0=4, pos1=3))
    after = endpoint.parse_prometheus(VLLM_METRICS.format(drafts=14, draft_tokens=42, accepted=24, pos0=12, pos1=7))
    assert before[("vllm:spec_decode_num_drafts", (("engine", "0"), ("model_name", "m")))] == 4
    c = endpoint.spec_counters(before, after, "stub")
    assert (c.drafts, c.draft_tokens, c.accepted) == (10, 30, 15)
    assert c.acceptance_rate == pytest.approx(0.5)
    assert c.mean_acceptance_length == pytest.approx(2.5)            # 1 + accepted / drafts
    assert c.per_position_acceptance == pytest.approx([0.8, 0.4])     # (12-4)/10, (7-3)/10


def test_a_pair_of_servers_gives_the_report_with_diff_timings_and_counters(tmp_path, capsys):
    with stub("vllm", "def add(a, b):\n    return a + b\n") as (s1, off), \
            stub("vllm", "def add(a, b):\n    return a - b\n") as (s2, on):
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"prompt": "Write add."}\n{"prompt": "Write add again."}\n')
        rc = main(["check", "--base-url", off, "--base-url-spec", on, "--prompts", str(prompts), "--max-tokens", "16",
                   "--repeats", "2", "--html", str(tmp_path / "r.html"), "--csv", str(tmp_path / "r.csv"),
                   "--md", str(tmp_path / "r.md")])
    assert rc == 0
    out = capsys.readouterr().out
    body = s1.seen[0]
    assert body["temperature"] == 0 and body["stream"] is True and body["max_tokens"] == 16
    assert len(s1.seen) == len(s2.seen) == 4                          # 2 prompts x 2 repeats on each server
    first = "def add(a, b):\n    return a + b\n".index("+")
    assert f"differ from character {first + 1}" in out                # the text diff, 1-based
    assert "acceptance rate 0.750" in out                             # (9 per request) / (12 per request)
    md = (tmp_path / "r.md").read_text()
    assert "## Per prompt" in md and "per-position acceptance 1.00, 0.75" in md   # (4, 3 per request) / 4 drafts
    assert "<html" in (tmp_path / "r.html").read_text()[:200]
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 and rows[1].split(",")[12] == "False"


def test_a_server_that_is_down_is_one_line_and_the_rest_is_kept():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with stub() as (_, on):
        rep = remote.run_pair(dead, on, ["a prompt"], max_tokens=8, timeout=5, repeats=1)
    assert rep.errors == [f"speculation off: cannot reach {dead}/models: connection refused (is the server "
                          f"running on that port?)"]
    assert rep.spec.first(0) is not None and rep.spec.first(0).n_tokens > 0     # the other side still ran
    assert "not compared" in remote.report_markdown(rep)


def test_http_500_names_the_status_and_the_servers_message():
    with stub("http500") as (_, url):
        with pytest.raises(EndpointError, match=r"/v1/chat/completions answered HTTP 500: CUDA out of memory$"):
            endpoint.stream_chat(url, "m", "hi", 8, timeout=5)


def test_a_hung_server_times_out_with_the_timeout_stated():
    with stub("hang") as (_, url):
        t = time.perf_counter()
        rep = remote.run_pair(url, url, ["hi"], timeout=0.5, repeats=1)
        assert time.perf_counter() - t < 4
    assert rep.errors[0] == f"speculation off: {url}/models did not answer within the 0.5 s timeout"


def test_a_server_that_is_not_openai_compatible_is_named():
    with stub("not-openai") as (_, url):
        with pytest.raises(EndpointError, match="did not answer like an OpenAI-compatible server"):
            endpoint.pick_model(url, None)


def test_a_model_the_server_lacks_lists_what_it_serves(tmp_path, capsys):
    with stub() as (_, url):
        p = tmp_path / "p.jsonl"
        p.write_text('{"prompt": "hi"}\n')
        rc = main(["check", "--base-url", url, "--base-url-spec", url, "--model", "llama-70b", "--prompts", str(p),
                   "--repeats", "1"])
    assert rc == 1
    err = capsys.readouterr().err
    assert f"error: speculation off: {url} does not serve a model named 'llama-70b'; it serves: m" in err


def test_metrics_without_spec_counters_and_no_metrics_at_all_are_said():
    with stub("plain-metrics") as (_, a), stub("none") as (_, b):
        rep = remote.run_pair(a, b, ["hi"], max_tokens=8, timeout=5, repeats=1)
    assert not rep.errors
    assert rep.base.counters.lines() == [f"{a[:-3]}/metrics exposes no speculative-decoding counters"]
    assert rep.spec.counters.lines()[0].startswith(f"no Prometheus metrics: {b[:-3]}/metrics answered HTTP 404")
    d = rep.diff(0)
    assert d["identical"] and d["by_tokens"]


def test_bad_arguments_are_refused_before_any_request(tmp_path, capsys):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n')
    assert main(["check", "--base-url", "ftp://x", "--prompts", str(p)]) == 2
    assert "'ftp://x' is not an http(s) URL" in capsys.readouterr().err
    assert main(["check", "--base-url", "http://127.0.0.1:9", "--prompts", str(p), "--timeout", "0"]) == 2
    assert main(["bench", "--prompts", str(p)]) == 2
    assert "bench needs --drafter" in capsys.readouterr().err


def test_one_server_without_a_restart_keeps_the_plain_phase(tmp_path, capsys, monkeypatch):
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))     # nobody presses Enter
    with stub() as (_, url):
        p = tmp_path / "p.jsonl"
        p.write_text('{"prompt": "hi"}\n')
        assert main(["check", "--base-url", url, "--prompts", str(p), "--csv", str(tmp_path / "r.csv")]) == 1
    cap = capsys.readouterr()
    assert "speculation on: not run (no Enter on standard input" in cap.err
    assert "- speculation off: " + url in cap.out
    assert (tmp_path / "r.csv").read_text().count("\n") == 2


# ---- the real peer: llama.cpp in this process and llama-cpp-python's server ----

@needs_peer
def test_bench_peer_prints_both_engines_from_one_run(tmp_path, capsys):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "rep", "prompt": "Repeat exactly: the quick brown fox jumps over the lazy dog."}\n')
    import torch
    threads = torch.get_num_threads()
    try:
        rc = main(["bench", "--peer", "llama.cpp", "--prompts", str(p), "--max-new-tokens", "24", "--threads", "1",
                   "--repeats", "2", "--k", "5", "--json"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    rows = [x for x in lines if not x.get("summary")]
    summ = {x["engine"]: x for x in lines if x.get("summary")}
    assert {r["engine"] for r in rows} == {"ours", "llama.cpp"} == set(summ)
    for s in summ.values():
        assert s["threads"] == 1 and s["k"] == 5 and s["repeats"] == 2
        assert s["tokens_per_s"] > 0 and s["baseline_tokens_per_s"] > 0 and s["tokens_plain"] > 0
    assert summ["ours"]["spec_equals_plain"]          # our forward: greedy speculation keeps the plain tokens


@needs_peer
def test_llama_decode_is_greedy_llama_cpp_from_our_ids(bundled):
    """The in-process peer decodes our prompt ids: the same tokens as llama.cpp's own sampling API
    reading the same ids, and stopped at the same end-of-sequence ids."""
    llm = peer.open_llama(1)
    ids = bundled.encode("Name three colours.").tolist()
    out, sec, ttft = peer.llama_decode(llm, ids, 16, set(bundled.eos_ids))
    assert 0 < ttft <= sec and 0 < len(out) <= 16
    llm.reset()
    ref = []
    for t in llm.generate(ids, temp=0.0, repeat_penalty=1.0):
        ref.append(t)
        if len(ref) == len(out):
            break
    assert out == ref
    assert llm.tokenize(b"hello world", add_bos=False, special=False) == \
        bundled.tokenizer("hello world", add_special_tokens=False)["input_ids"]   # one vocabulary


@contextmanager
def llama_server(*extra: str):
    port = free_port()
    gguf = str(peer.bundled_gguf())
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
           "--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", "512", "--verbose", "False", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"llama_cpp.server did not start: {proc.stderr.read().decode()[-500:]}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def direct(messages: list, max_tokens: int, k: int = 0) -> str:
    """llama.cpp called directly with what the server would do with our request: its request defaults
    (llama-cpp-python's server applies a repeat penalty even at temperature 0), the same context and threads."""
    from llama_cpp.server.types import CreateChatCompletionRequest as Req
    f = Req.model_fields
    llm = peer.open_llama(1, k, 512)
    out = llm.create_chat_completion(messages, temperature=0.0, top_p=1.0, seed=0, max_tokens=max_tokens,
                                     top_k=f["top_k"].default, min_p=f["min_p"].default,
                                     repeat_penalty=f["repeat_penalty"].default)
    return out["choices"][0]["message"]["content"]


@needs_peer
def test_the_checklist_against_live_llama_cpp_servers(tmp_path):
    prompts = ["Write a Python function `is_prime(n)` that returns True if n is prime. Include a docstring.",
               "Repeat exactly: the quick brown fox jumps over the lazy dog."]
    n = 48
    with llama_server() as off, llama_server("--draft_model", "prompt-lookup-decoding",
                                             "--draft_model_num_pred_tokens", "10") as on:
        rep = remote.run_pair(off, on, prompts, max_tokens=n, timeout=60, repeats=1)
    assert not rep.errors, rep.errors
    assert rep.base.model == rep.spec.model and rep.base.model.endswith(".gguf")
    for i, p in enumerate(prompts):
        a, b = rep.base.first(i), rep.spec.first(i)
        assert 0 < a.n_tokens <= n and 0 < b.n_tokens <= n
        assert a.counted == b.counted == "logprobs"                 # tokens compared one by one
        assert a.ttft_s > 0 and b.ttft_s > 0 and a.tpot_s > 0 and b.tpot_s > 0 and a.total_s > a.ttft_s
        msgs = [{"role": "user", "content": p}]
        want_off, want_on = direct(msgs, n), direct(msgs, n, 10)
        assert a.text == want_off and b.text == want_on             # the server's answers are llama.cpp's own
        assert rep.diff(i)["first_diff_char"] == first_difference(want_off, want_on)
    assert rep.base.counters.lines()[0].startswith("no Prometheus metrics:")   # this server has no /metrics
    md = remote.report_markdown(rep)
    assert "## Per prompt" in md and on in md
    assert remote.report_csv(rep).count("\n") == 1 + len(prompts)


def test_the_prompt_box_keeps_a_prompt_with_a_blank_line_whole():
    """One prompt per line, a line break inside one written \\n: the extraction preset (two paragraphs) is one
    prompt, the box's text reads back to exactly the prompts written, and a typed list splits on lines."""
    from app.sidebar import PRESETS
    presets = [w.prompts[0] for w in PRESETS.values()]
    assert any("\n\n" in x for x in presets)    # the case that split 3 prompts into 4
    odd = ["two\n\nparagraphs", "a backslash \\ and a literal \\n", "ends in a break\n"]
    for ps in (presets, odd):
        text = remote.prompts_text(ps)
        assert len(text.split("\n")) == len(ps) and remote.parse_prompts(text) == ps
    assert remote.parse_prompts("Say hi.\n\n  Say bye.  \r\n") == ["Say hi.", "Say bye."]
    assert remote.parse_prompts("line one\\nline two\\\\n") == ["line one\nline two\\n"]
    assert remote.parse_prompts(" \n\n") == []


def test_the_production_page_runs_the_live_check_and_keeps_the_report_when_a_server_is_down():
    from streamlit.testing.v1 import AppTest
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with stub() as (_, on):
        at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=240)
        at.run()
        at.switch_page("../pages/production.py").run()
        assert not at.exception, at.exception
        if MISSING:   # the peer section says how to install it
            assert any("make peers" in i.value for i in at.info)
        from app.sidebar import PRESETS   # the box's default: the first three presets, one prompt each
        assert remote.parse_prompts(at.text_area(key="ep_prompts").value) == [
            w.prompts[0] for w in list(PRESETS.values())[:3]]
        at.text_input(key="ep_off").input(dead)
        at.text_input(key="ep_on").input(on)
        at.text_area(key="ep_prompts").input("Say hi.\nSay bye.")
        at.number_input(key="ep_tokens").set_value(8)
        at.run()
        at.button(key="ep_run").click().run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"speculation off: cannot reach {dead}/models: connection refused "
                                           f"(is the server running on that port?)"]
    rep = at.session_state["ep_report"]
    assert rep.spec.first(0).n_tokens > 0 and rep.spec.first(1).n_tokens > 0    # the other server's half kept
    assert len(at.get("download_button")) == 3


@needs_peer
def test_the_production_page_compares_with_llama_cpp_on_the_sidebar_prompt():
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=300)
    at.run()
    at.switch_page("../pages/production.py").run()
    at.slider(key="peer_tokens").set_value(16).run()
    at.button(key="run_peer").click().run()
    assert not at.exception and not at.error, (at.exception, at.error)
    prompt, k, threads, summ = at.session_state["peer_result"]
    assert prompt == at.session_state["prompt"] and k == at.session_state["k"]
    assert [x["engine"] for x in summ] == ["ours", "llama.cpp"]
    assert all(x["threads"] == threads and x["tokens_per_s"] > 0 for x in summ)
    assert summ[0]["spec_equals_plain"]
    assert any("4-bit" in c.value for c in at.caption)


# ---- bench --peer llama.cpp --drafter D: the plumbing, with llama.cpp stood in for ----

def test_bench_peer_with_an_extra_drafter_adds_our_engine_beside_llama_cpp_plain(tmp_path, capsys, monkeypatch):
    """`--drafter suffix` adds our engine with that drafter to the same rounds: its tokens/s over llama.cpp's
    plain decoding (paired by repeat) and whether its text is our plain text. llama.cpp is a stub that decodes
    n tokens in n x 10 ms (plain) or n x 5 ms (its lookup), and the tiny target stands in for the bundled one,
    so this runs without llama_cpp installed."""
    import torch
    from specdec_core import cli
    from specdec_core.drafters import make
    from tests.tiny import AnyTok, tiny_lm
    target = tiny_lm(0, forward="ours", tok=AnyTok())
    opened, decoded = [], []
    monkeypatch.setattr(cli, "load", lambda *a, **k: target)
    monkeypatch.setattr(peer, "unavailable", lambda: None)
    monkeypatch.setattr(peer, "version", lambda: "stub")
    monkeypatch.setattr(peer, "open_llama", lambda threads, k=0, n_ctx=512: opened.append((threads, k)) or k)

    def llama_decode(llm, ids, max_new, eos):   # llm is the k it was opened with
        decoded.append((llm, list(ids)))
        return list(range(max_new)), max_new * (0.005 if llm else 0.010), 0.001
    monkeypatch.setattr(peer, "llama_decode", llama_decode)
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "rep", "prompt": "abcabcabcdabcabc"}\n')
    threads = torch.get_num_threads()
    try:
        rc = main(["bench", "--peer", "llama.cpp", "--prompts", str(p), "--drafter", "suffix", "--drafter",
                   "lookup", "--max-new-tokens", "12", "--threads", "1", "--repeats", "2", "--k", "3", "--json"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    cap = capsys.readouterr()
    lines = [json.loads(x) for x in cap.out.splitlines() if x.startswith("{")]
    summ = {x["engine"]: x for x in lines if x.get("summary")}
    per_prompt = [x for x in lines if not x.get("summary")]
    assert list(summ) == ["ours", "llama.cpp", "ours + suffix"]          # lookup is the comparison itself
    assert [x["engine"] for x in per_prompt] == ["ours", "llama.cpp", "ours + suffix"]
    assert sorted(opened) == [(1, 0), (1, 3)]                             # llama.cpp plain and its lookup at k
    assert len(decoded) == 2 * (1 + 2)                                    # a warm-up, then 2 repeats, per llama
    ex = summ["ours + suffix"]
    assert ex["drafter"] == "suffix" and ex["k"] == make("suffix", target).default_k and ex["threads"] == 1
    assert ex["peer_plain_tokens_per_s"] == pytest.approx(100.0)          # 12 tokens in 120 ms
    # llama.cpp's plain runs take exactly 100 tokens/s, so each repeat's ratio over it is that repeat's tokens/s
    # / 100; the quoted tokens/s (the median pair over our plain decoding) is one of those repeats, which need not
    # be the median pair over llama.cpp's
    lo, hi = ex["speedup_vs_peer_plain_min"], ex["speedup_vs_peer_plain_max"]
    assert lo <= ex["speedup_vs_peer_plain"] <= hi
    assert lo * 100.0 - 1e-9 <= ex["tokens_per_s"] <= hi * 100.0 + 1e-9
    assert ex["baseline_tokens_per_s"] == pytest.approx(ex["tokens_per_s"] / ex["speedup"])   # over our plain
    assert ex["spec_equals_plain"] and ex["identical_prompts"] == 1 and ex["tokens_spec"] == 12
    assert summ["ours"]["spec_equals_plain"] and summ["llama.cpp"]["speedup"] == pytest.approx(2.0)
    assert "ours + suffix" in cap.err and "beside llama.cpp's plain decoding" in cap.err   # the table, on stderr


def test_bench_peer_refuses_an_unknown_extra_drafter_before_any_work(tmp_path, capsys):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "hi"}\n')
    assert main(["bench", "--peer", "llama.cpp", "--prompts", str(p), "--drafter", "eagel"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown drafter 'eagel'; choose from none, lookup")
