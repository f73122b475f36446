"""A small client for OpenAI-compatible servers (vLLM, SGLang, llama.cpp's servers, ...): the model list, one
streamed greedy chat completion timed from the client (TTFT, TPOT, tokens/s), and the server's Prometheus
`/metrics` with its speculative-decoding counters. Standard library only (urllib, json).

Every failure a person can cause (a wrong URL, a server that is down, hangs, answers HTTP 500, is not
OpenAI-compatible, or lacks the model) raises EndpointError with one line that names the URL and the cause.
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

TIMEOUT_S = 30.0


class EndpointError(RuntimeError):
    """The server could not be used; the message is one line naming the URL and the cause."""


def roots(base_url: str) -> tuple[str, str]:
    """A base URL as typed (`http://host:port`, with or without `/v1`) -> (API root ending in /v1, server root)."""
    url = (base_url or "").strip().rstrip("/")
    p = urllib.parse.urlparse(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise EndpointError(f"{base_url!r} is not an http(s) URL: give one like http://127.0.0.1:8000/v1")
    root = url[:-3] if url.endswith("/v1") else url
    return root + "/v1", root


def _message(body: bytes) -> str:
    """The error text an OpenAI-style body carries, else the body's first 200 characters."""
    text = body.decode("utf-8", "replace").strip()
    try:
        err = json.loads(text)
        err = err.get("error", err) if isinstance(err, dict) else err
        if isinstance(err, dict):
            err = err.get("message") or err.get("detail") or err
        text = err if isinstance(err, str) else json.dumps(err)
    except ValueError:
        pass
    return " ".join(text.split())[:200] or "(empty body)"


def _open(url: str, body: dict | None, timeout: float):
    """urlopen with every transport failure turned into one EndpointError line."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json", "Accept": "*/*"})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise EndpointError(f"{url} answered HTTP {e.code}: {_message(e.read())}") from None
    except urllib.error.URLError as e:
        r = e.reason
        if isinstance(r, (socket.timeout, TimeoutError)):
            raise EndpointError(f"{url} did not answer within the {timeout:g} s timeout") from None
        if isinstance(r, ConnectionRefusedError):
            raise EndpointError(f"cannot reach {url}: connection refused (is the server running on that port?)") \
                from None
        raise EndpointError(f"cannot reach {url}: {r}") from None
    except (socket.timeout, TimeoutError):
        raise EndpointError(f"{url} did not answer within the {timeout:g} s timeout") from None
    except (ConnectionError, OSError) as e:
        raise EndpointError(f"cannot reach {url}: {e}") from None


def _read(resp, url: str, timeout: float) -> bytes:
    try:
        return resp.read()
    except (socket.timeout, TimeoutError):
        raise EndpointError(f"{url} stopped sending within the {timeout:g} s timeout") from None
    except (ConnectionError, OSError) as e:
        raise EndpointError(f"{url} broke off its answer: {e}") from None


def list_models(base_url: str, timeout: float = TIMEOUT_S) -> list[str] | None:
    """The model ids the server lists at /v1/models; None when it has no such route (HTTP 404)."""
    api, _ = roots(base_url)
    url = api + "/models"
    try:
        resp = _open(url, None, timeout)
    except EndpointError as e:
        if "HTTP 404" in str(e):
            return None
        raise
    body = _read(resp, url, timeout)
    try:
        data = json.loads(body)["data"]
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        raise EndpointError(f"{url} did not answer like an OpenAI-compatible server (expected "
                            f"{{\"data\": [{{\"id\": ...}}]}}, got: {_message(body)[:80]})") from None


def pick_model(base_url: str, model: str | None, timeout: float = TIMEOUT_S) -> str:
    """The model to ask for: `model` if the server lists it (or lists nothing), else its first model."""
    ids = list_models(base_url, timeout)
    if model:
        if ids is not None and model not in ids:
            raise EndpointError(f"{roots(base_url)[0]} does not serve a model named {model!r}; it serves: "
                                + (", ".join(ids) if ids else "nothing"))
        return model
    if not ids:
        raise EndpointError(f"{roots(base_url)[0]}/models lists no model: give the model name")
    return ids[0]


@dataclass
class Streamed:
    """One streamed completion as the client saw it."""
    text: str
    tokens: list[str] | None      # the tokens themselves, where the server sent logprobs
    n_tokens: int
    counted: str                  # how n_tokens was read: "usage", "logprobs" or "chunks"
    ttft_s: float                 # request sent -> first generated text
    total_s: float
    finish_reason: str | None = None

    @property
    def tpot_s(self) -> float:
        return (self.total_s - self.ttft_s) / (self.n_tokens - 1) if self.n_tokens > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.n_tokens, "counted": self.counted, "ttft_ms": 1e3 * self.ttft_s,
                "tpot_ms": 1e3 * self.tpot_s, "tokens_per_s": self.tokens_per_s,
                "finish_reason": self.finish_reason}


def chat_request(model: str, prompt: str, max_tokens: int) -> dict:
    """Greedy and streamed; logprobs asked for so the diff can be made token by token where the server
    sends them; usage asked for in the stream (OpenAI's stream_options) for the token count."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0.0, "top_p": 1.0,
            "seed": 0, "max_tokens": int(max_tokens), "stream": True, "logprobs": True, "top_logprobs": 1,
            "stream_options": {"include_usage": True}}


def stream_chat(base_url: str, model: str, prompt: str, max_tokens: int, timeout: float = TIMEOUT_S) -> Streamed:
    """POST /v1/chat/completions with stream=true and read the server-sent events as they arrive. `timeout`
    bounds the connection and every wait for the next event (a hung server fails after that long)."""
    api, _ = roots(base_url)
    url = api + "/chat/completions"
    t0 = time.perf_counter()
    resp = _open(url, chat_request(model, prompt, max_tokens), timeout)
    ctype = resp.headers.get("Content-Type", "")
    if "text/event-stream" not in ctype:
        # a server that ignores stream=true still answers a plain completion; anything else is not OpenAI's
        body = _read(resp, url, timeout)
        total = time.perf_counter() - t0
        try:
            msg = json.loads(body)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise EndpointError(f"{url} did not answer like an OpenAI-compatible server (expected a stream of "
                                f"chat.completion.chunk events, got {ctype or 'no content type'}: "
                                f"{_message(body)[:80]})") from None
        return Streamed(msg or "", None, len(msg or ""), "chunks", total, total)
    text, toks, chunks, usage, first, finish = [], [], 0, None, None, None
    saw_event = False
    while True:
        try:
            raw = resp.readline()
        except (socket.timeout, TimeoutError):
            raise EndpointError(f"{url} stopped streaming: no event within the {timeout:g} s timeout") from None
        except (ConnectionError, OSError) as e:
            raise EndpointError(f"{url} broke off its stream: {e}") from None
        if not raw:
            break
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue          # blank separators, comments (":"), event names
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            ev = json.loads(data)
        except ValueError:
            raise EndpointError(f"{url} sent an event that is not JSON: {data[:80]!r}") from None
        if not isinstance(ev, dict):
            raise EndpointError(f"{url} sent an event that is not an OpenAI chunk: {data[:80]!r}")
        if "error" in ev:
            raise EndpointError(f"{url} reported an error mid-stream: {_message(data.encode())}")
        if "choices" not in ev:
            raise EndpointError(f"{url} did not stream OpenAI chat chunks (no 'choices' in {data[:80]!r})")
        saw_event = True
        usage = ev.get("usage") or usage
        for ch in ev["choices"][:1]:
            piece = (ch.get("delta") or {}).get("content") or ""
            lp = ((ch.get("logprobs") or {}).get("content")) or []
            if piece or lp:
                if first is None:
                    first = time.perf_counter() - t0
                chunks += 1
                text.append(piece)
                toks += [str(x.get("token", "")) for x in lp]
            finish = ch.get("finish_reason") or finish
    total = time.perf_counter() - t0
    if not saw_event:
        raise EndpointError(f"{url} closed the stream without sending a chat chunk")
    if usage and usage.get("completion_tokens") is not None:
        n, how = int(usage["completion_tokens"]), "usage"
    elif toks:
        n, how = len(toks), "logprobs"
    else:
        n, how = chunks, "chunks"
    return Streamed("".join(text), toks or None, n, how, first if first is not None else total, total, finish)


# ---- Prometheus /metrics ----

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# the counters each engine documents for speculative decoding, read as deltas around a run
VLLM = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
        "accepted": "vllm:spec_decode_num_accepted_tokens",
        "per_position": "vllm:spec_decode_num_accepted_tokens_per_pos"}
LLAMACPP = {"draft_tokens": "llamacpp:spec_tokens_drafted", "accepted": "llamacpp:spec_tokens_accepted"}
SPEC_WORDS = ("spec", "draft")   # any other sample whose name says speculation is shown as it is


def parse_prometheus(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text exposition -> {(name without a `_total` suffix, sorted labels): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        try:
            val = float(m.group(3))
        except ValueError:
            continue
        name = m.group(1).removesuffix("_total")
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out[(name, labels)] = out.get((name, labels), 0.0) + val
    return out


def scrape(base_url: str, timeout: float = TIMEOUT_S) -> tuple[dict | None, str]:
    """The server's /metrics -> (samples, note); samples None with the reason when there are none."""
    _, root = roots(base_url)
    url = root + "/metrics"
    try:
        resp = _open(url, None, timeout)
        body = _read(resp, url, timeout).decode("utf-8", "replace")
    except EndpointError as e:
        return None, f"no Prometheus metrics: {e}"
    samples = parse_prometheus(body)
    if not samples:
        return None, f"no Prometheus metrics: {url} answered, but not in Prometheus' text format"
    return samples, url


@dataclass
class SpecCounters:
    """What /metrics said about speculation during a run (deltas of the counters around it)."""
    source: str                                   # where they came from, or why there are none
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_position: list[float] = field(default_factory=list)
    other: dict[str, float] = field(default_factory=dict)   # any other spec/draft sample, as read after

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens and self.accepted is not None else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's definition: 1 + accepted / drafts (the bonus token counted)."""
        return 1 + self.accepted / self.drafts if self.drafts and self.accepted is not None else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.drafts for a in self.per_position] if self.drafts else []

    @property
    def found(self) -> bool:
        return self.draft_tokens is not None or bool(self.other)

    def lines(self) -> list[str]:
        if not self.found:
            return [self.source]
        out = [f"source: {self.source}"]
        if self.draft_tokens is not None:
            out.append(f"drafted tokens {self.draft_tokens:g}, accepted {self.accepted or 0:g}"
                       + (f", drafts {self.drafts:g}" if self.drafts is not None else ""))
        if self.acceptance_rate is not None:
            out.append(f"acceptance rate {self.acceptance_rate:.3f}")
        if self.mean_acceptance_length is not None:
            out.append(f"mean acceptance length {self.mean_acceptance_length:.2f}")
        if self.per_position:
            out.append("per-position acceptance " + ", ".join(f"{x:.2f}" for x in self.per_position_acceptance))
        out += [f"{k}: {v:g}" for k, v in sorted(self.other.items())]
        return out


def _sum(samples: dict, name: str) -> float | None:
    vals = [v for (n, _), v in samples.items() if n == name]
    return sum(vals) if vals else None


def spec_counters(before: dict | None, after: dict | None, source: str) -> SpecCounters:
    """The speculative-decoding counters' change between two scrapes (vLLM's and llama.cpp's named ones;
    any other sample with spec/draft in its name, e.g. SGLang's accept-length gauge, as read after)."""
    if after is None:
        return SpecCounters(source)
    before = before or {}
    delta = lambda name: None if _sum(after, name) is None else _sum(after, name) - (_sum(before, name) or 0.0)
    c = SpecCounters(source)
    for names in (VLLM, LLAMACPP):
        if _sum(after, names["draft_tokens"]) is not None:
            c.draft_tokens, c.accepted = delta(names["draft_tokens"]), delta(names["accepted"])
            c.drafts = delta(names["drafts"]) if "drafts" in names else None
            if "per_position" in names:
                pos = {}
                for (n, labels), v in after.items():
                    if n == names["per_position"]:
                        p = int(dict(labels).get("position", -1))
                        pos[p] = pos.get(p, 0.0) + v - sum(bv for (bn, bl), bv in before.items()
                                                           if bn == n and bl == labels)
                c.per_position = [pos[p] for p in sorted(pos) if p >= 0]
            break
    known = {n for names in (VLLM, LLAMACPP) for n in names.values()}
    for (n, labels), v in after.items():
        if n not in known and any(w in n.lower() for w in SPEC_WORDS):
            key = n + ("{" + ",".join(f"{a}={b}" for a, b in labels) + "}" if labels else "")
            c.other[key] = v
    if not c.found:
        c.source = f"{source} exposes no speculative-decoding counters"
    return c
