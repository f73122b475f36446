"""A prompt set, read from a file or pasted text: the traffic the production checklist runs on.

Three formats, told apart by the file's name or, without one, by its content:

- JSON Lines (`.jsonl`, `.ndjson`, `.json`): one object per line with a text field `prompt` (optionally `id`,
  `category`, anything else is ignored);
- CSV (`.csv`, `.tsv` with tabs): a header row with a `prompt` column (optionally `id`, `category`);
- plain text (`.txt` or anything else): one prompt per non-blank line; a line break inside a prompt is written
  as the two characters `\\n` and a backslash as `\\\\` (the page's prompt box writes prompts the same way).

The bounds below are said up front by the page and the command line. A file that breaks one, or cannot be
read, raises InputError with one line that names the file, the line and what is wrong.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

MAX_PROMPTS = 64            # prompts in one set: the checklist times each one 2 x REPEATS times
MAX_PROMPT_CHARS = 4000     # characters in one prompt: about a thousand tokens, the app's "long prompt" line
MAX_FILE_BYTES = 1 << 20    # bytes in one file (1 MiB): room for extra fields beside the prompts

FORMATS = {"jsonl": "JSON Lines, one {\"prompt\": ...} object per line",
           "csv": "CSV with a \"prompt\" column",
           "text": "plain text, one prompt per line"}
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "csv",
            ".txt": "text", ".text": "text", ".md": "text"}


def prompts_text(prompts: list[str]) -> str:
    """Prompts -> the prompt box's text: one prompt per line, a line break inside a prompt written as the two
    characters `\\n` (a backslash as `\\\\`), so a prompt with a blank line stays one prompt."""
    return "\n".join(p.replace("\\", "\\\\").replace("\n", "\\n") for p in prompts)


def parse_prompts(text: str) -> list[str]:
    """The prompt box's text -> prompts (prompts_text's inverse): one per non-blank line, `\\n` a line break
    inside it, `\\\\` a backslash; any other backslash is kept as typed."""
    out = []
    for line in text.split("\n"):
        line = line.strip()   # the box's own edges (and a pasted "\r"); an escaped break is kept
        if not line:
            continue
        chars, i = [], 0
        while i < len(line):
            two = line[i:i + 2]
            if two in ("\\n", "\\\\"):
                chars.append("\n" if two == "\\n" else "\\")
                i += 2
            else:
                chars.append(line[i])
                i += 1
        out.append("".join(chars))
    return out


def bounds() -> str:
    """The bounds in words, for the page's caption and the command line's help."""
    return (f"at most {MAX_PROMPTS} prompts, {MAX_PROMPT_CHARS:,} characters each, "
            f"{_size(MAX_FILE_BYTES)} per file")


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


@dataclass
class PromptSet:
    """The prompts in file order, each row with its `prompt`, `id`, the `line` it starts on and, where the file
    gives one, its `category`."""
    rows: list[dict]
    format: str
    name: str = ""
    cut: int = 0                # prompts left out past `limit`

    @property
    def prompts(self) -> list[str]:
        return [r["prompt"] for r in self.rows]


def estimate_s(n_prompts: int, new_tokens: int, repeats: int, s_per_token: float,
               prompt_tokens: int = 0, s_per_prompt_token: float = 0.0) -> float:
    """Roughly how long the checklist takes: every prompt decoded 2 x `repeats` times (plain and speculative,
    each read and then `new_tokens` written at plain decoding's pace), plus one short warm-up of each side.
    Speculation usually finishes sooner than plain decoding, so this leans long."""
    runs = 2 * repeats
    return runs * (n_prompts * new_tokens * s_per_token + prompt_tokens * s_per_prompt_token) + 8 * s_per_token


def said(seconds: float) -> str:
    """A duration in words: "about 40 s", "about 3 min"."""
    if seconds < 90:
        return f"about {max(1, math.ceil(seconds / 5) * 5 if seconds > 10 else math.ceil(seconds))} s"
    return f"about {math.ceil(seconds / 60)} min"


def _fail(label: str, what: str) -> InputError:
    return InputError(f"{label}: {what}")


def _too_large(label: str, size: int) -> InputError:
    return _fail(label, f"is too large: {size:,} bytes; at most {MAX_FILE_BYTES:,} ({_size(MAX_FILE_BYTES)}) per "
                        "file: take a sample of it")


def _line_of(data: bytes, at: int) -> int:
    return data.count(b"\n", 0, at) + 1


def _is_binary(data: bytes) -> int | None:
    """The offset of the byte that makes `data` binary (a NUL, or the first of many control bytes), else None."""
    if (i := data.find(b"\0")) >= 0:
        return i
    head = data[:8192]
    ctrl = [i for i, b in enumerate(head) if (b < 32 and b not in b"\t\n\r\f\v\x1b") or b == 127]
    return ctrl[0] if head and len(ctrl) > max(2, len(head) // 50) else None


def decode(data: bytes, label: str) -> str:
    """Bytes -> text: UTF-8 (a byte-order mark allowed), or UTF-16 with its mark; binary data, a file mixing
    encodings or one in another encoding is refused, naming the first line that is not UTF-8."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as e:
            raise _fail(label, f"starts as UTF-16 but breaks at byte {e.start}: save it as UTF-8") from None
    if (at := _is_binary(data)) is not None:
        raise _fail(label, f"is binary, not text (byte {data[at]:#04x} at offset {at}, line {_line_of(data, at)}): "
                           "give a text file (JSON Lines, CSV or one prompt per line)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        n = _line_of(data, e.start)
        lines = data.split(b"\n")
        utf8 = next((i + 1 for i, ln in enumerate(lines) if max(ln, default=0) > 127 and _utf8(ln)), None)
        what = (f"mixes encodings: line {utf8} is UTF-8 but line {n} is not" if utf8 else f"line {n} is not UTF-8")
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(label, f"{what} (byte {data[e.start]:#04x} at column {col}; it looks like Latin-1 or "
                           "Windows-1252): save the file as UTF-8") from None


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def sniff(text: str, name: str = "") -> str:
    """The format: by the file name's suffix, else by the content (a first line that opens a JSON object is
    JSON Lines, a header row with a `prompt` column is CSV, anything else is plain text)."""
    fmt = SUFFIXES.get(Path(name).suffix.lower()) if name else None
    if fmt:
        return fmt
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first.startswith("{"):
        return "jsonl"
    try:
        head = next(csv.reader([first]))
    except (csv.Error, StopIteration):
        return "text"
    return "csv" if "prompt" in [h.strip().lower() for h in head] else "text"


def _check(label: str, rows: list[dict], limit: int | None) -> tuple[list[dict], int]:
    for r in rows:
        if len(r["prompt"]) > MAX_PROMPT_CHARS:
            raise _fail(label, f"the prompt on line {r['line']} has {len(r['prompt']):,} characters; at most "
                               f"{MAX_PROMPT_CHARS:,} per prompt")
    cap = min(limit, MAX_PROMPTS) if limit else MAX_PROMPTS
    if len(rows) > MAX_PROMPTS and not (limit and limit <= MAX_PROMPTS):
        raise _fail(label, f"holds {len(rows)} prompts; at most {MAX_PROMPTS} in one set: take a sample (on "
                           "the command line, --limit takes the first ones)")
    return rows[:cap], max(0, len(rows) - cap)


def _jsonl(text: str, label: str, stem: str) -> list[dict]:
    rows = []
    for n, line in enumerate(text.split("\n"), 1):   # not splitlines: JSON text may hold U+2028 as it is
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            hint = " (a JSON array: give one object per line instead)" if n == 1 and line.lstrip()[:1] == "[" else ""
            at = "" if e.msg.endswith(" at") else " at"   # "Unterminated string starting at", column ...
            raise _fail(label, f"line {n} is not JSON ({e.msg}{at} column {e.colno}){hint}") from None
        if not isinstance(obj, dict):
            what = "one JSON array: give one object per line" if isinstance(obj, list) else "JSON but not an object"
            raise _fail(label, f"line {n} is {what}; each line needs {{\"prompt\": \"...\"}}")
        if "prompt" not in obj:
            has = ", ".join(f'"{k}"' for k in list(obj)[:6]) or "no fields"
            raise _fail(label, f"line {n} has no \"prompt\" field (it has {has})")
        p = obj["prompt"]
        if not isinstance(p, str):
            raise _fail(label, f"line {n}: \"prompt\" is {type(p).__name__ if p is not None else 'null'}, not text")
        if not p.strip():
            raise _fail(label, f"the prompt on line {n} is empty")
        row = {"prompt": p, "id": str(obj.get("id", f"{stem}-{n}")), "line": n}
        if isinstance(obj.get("category"), str) and obj["category"]:
            row["category"] = obj["category"]
        rows.append(row)
    return rows


def _csv(text: str, label: str, stem: str, tab: bool) -> list[dict]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if tab else ",", strict=True)
    try:
        header = next(reader)
        while not any(h.strip() for h in header):
            header = next(reader)
    except StopIteration:
        raise _fail(label, "is empty: no header row") from None
    except csv.Error as e:
        raise _fail(label, f"line {reader.line_num} is not valid CSV ({e})") from None
    names = [h.strip().lower() for h in header]
    if "prompt" not in names:
        raise _fail(label, f"line {reader.line_num}, the header, has no \"prompt\" column (it has "
                           + ", ".join(f'"{h.strip()}"' for h in header[:6]) + ")")
    col = names.index("prompt")
    rows = []
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise _fail(label, f"line {start} is not valid CSV ({e})") from None
        if not any(c.strip() for c in cells):
            continue
        if col >= len(cells):
            raise _fail(label, f"line {start} has no prompt (it has {len(cells)} field"
                               f"{'s' if len(cells) != 1 else ''}; the header has {len(header)})")
        p = cells[col]
        if not p.strip():
            raise _fail(label, f"the prompt on line {start} is empty")
        get = lambda k: cells[names.index(k)].strip() if k in names and names.index(k) < len(cells) else ""
        row = {"prompt": p, "id": get("id") or f"{stem}-{start}", "line": start}
        if get("category"):
            row["category"] = get("category")
        rows.append(row)
    return rows


def _text(text: str, stem: str) -> list[dict]:
    rows = []
    for n, line in enumerate(text.split("\n"), 1):
        got = parse_prompts(line)
        if got:
            rows.append({"prompt": got[0], "id": f"{stem}-{n}", "line": n})
    return rows


def parse(data: bytes | str, name: str = "", label: str | None = None, limit: int | None = None) -> PromptSet:
    """A file's bytes (or pasted text) -> its PromptSet; InputError, naming the line, for anything wrong.
    `name` is the file's name (its suffix picks the format; empty: told by the content), `label` what the
    messages call it, `limit` takes only the first prompts (a larger file is then allowed)."""
    label = label or (repr(name) if name else "the pasted text")
    size = len(data.encode("utf-8") if isinstance(data, str) else data)
    if size > MAX_FILE_BYTES:
        raise _too_large(label, size)
    text = decode(data, label) if isinstance(data, bytes) else data
    if not text.strip():
        raise _fail(label, "is empty: no prompt in it")
    fmt = sniff(text, name)
    stem = Path(name).stem if name else "pasted"
    if fmt == "jsonl":
        rows = _jsonl(text, label, stem)
    elif fmt == "csv":
        rows = _csv(text, label, stem, Path(name).suffix.lower() == ".tsv")
    else:
        rows = _text(text, stem)
    if not rows:
        raise _fail(label, "is empty: no prompt in it")
    rows, cut = _check(label, rows, limit)
    return PromptSet(rows, fmt, name, cut)


def read(path: str | Path, limit: int | None = None, flag: str = "--prompts") -> PromptSet:
    """A prompt file on disk (the command line's `--prompts`): a missing file, a directory or one over the size
    bound is refused before it is read."""
    p = Path(path)
    label = f"{flag} {str(path)!r}"
    if p.is_dir():
        raise InputError(f"{label} is a directory, not a prompt file")
    if not p.exists():
        raise InputError(f"{label} does not exist")
    if (size := p.stat().st_size) > MAX_FILE_BYTES:
        raise _too_large(label, size)
    return parse(p.read_bytes(), p.name, label, limit)
