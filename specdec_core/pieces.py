"""Token pieces as text a person can read, for byte-level BPE tokenizers (GPT-2's scheme: SmolLM2, Qwen, Llama 3).

One token can be a fragment of a UTF-8 character: an emoji is often two or three tokens, and decoding one of them
alone gives U+FFFD, "�". `piece` keeps such a fragment's undecodable bytes inside the text as private-use
characters (U+F700 + byte, the bytes 0x80-0xFF only), so the records stay plain strings, consecutive fragments
join back into the character they spell (`join`, `groups`), and a fragment left alone shows as its bytes
(`readable`: "⟨F0 9F⟩"), never as "�".
"""
from __future__ import annotations

from functools import lru_cache

FRAGMENT = 0xF700          # byte b (0x80-0xFF) of an incomplete character -> chr(FRAGMENT + b)
_LO, _HI = chr(FRAGMENT + 0x80), chr(FRAGMENT + 0xFF)


def is_fragment(ch: str) -> bool:
    return _LO <= ch <= _HI


def from_bytes(raw: bytes) -> str:
    """UTF-8 text, with each byte that is not part of a complete character as a fragment character."""
    s = raw.decode("utf-8", "surrogateescape")   # an undecodable byte b becomes U+DC00 + b
    return "".join(chr(FRAGMENT + ord(c) - 0xDC00) if "\udc80" <= c <= "\udcff" else c for c in s)


def to_bytes(text: str) -> bytes:
    """The inverse of from_bytes: fragment characters back to their bytes, the rest as UTF-8."""
    return b"".join(bytes([ord(c) - FRAGMENT]) if is_fragment(c) else c.encode("utf-8") for c in text)


def join(pieces) -> str:
    """Pieces side by side as text: fragments that together spell a character become that character."""
    return from_bytes(to_bytes("".join(pieces)))


def has_fragment(text: str) -> bool:
    return any(is_fragment(c) for c in text)


def readable(text: str) -> str:
    """A piece for display: complete characters as they are, a run of leftover fragment bytes as ⟨F0 9F⟩."""
    text = join([text]) if has_fragment(text) else text
    out, run = [], []
    for c in text + " ":
        if is_fragment(c):
            run.append(f"{ord(c) - FRAGMENT:02X}")
            continue
        if run:
            out.append("⟨" + " ".join(run) + "⟩")
            run = []
        out.append(c)
    return "".join(out)[:-1]


def groups(pieces: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, text) runs of consecutive pieces: a piece that ends inside a character is joined with the
    next ones until the character is complete (at most four pieces: a UTF-8 character has at most four bytes);
    every other piece stands alone. The texts concatenated are join(pieces)."""
    out, i, n = [], 0, len(pieces)
    while i < n:
        j = i + 1
        while (j < n and j - i < 4 and _ends_open(join(pieces[i:j]))
               and pieces[j][:1] and is_fragment(pieces[j][0])):
            j += 1
        out.append((i, j, join(pieces[i:j])))
        i = j
    return out


def _ends_open(text: str) -> bool:
    """Whether text ends in the lead of a UTF-8 character whose continuation bytes are still to come."""
    k = 0
    while k < len(text) and is_fragment(text[-1 - k]):
        k += 1
    return k > 0 and (ord(text[-k]) - FRAGMENT) >= 0xC0


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte as the printable character the vocabulary spells it with."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokenizer, token: int) -> bytes | None:
    """The bytes a token stands for, where the tokenizer spells its vocabulary in GPT-2's byte alphabet or with
    SentencePiece's byte tokens (<0xF0>); None otherwise."""
    name = tokenizer.convert_ids_to_tokens(int(token))
    if not isinstance(name, str):
        return None
    if len(name) == 6 and name.startswith("<0x") and name.endswith(">"):
        return bytes([int(name[3:5], 16)])
    dec = _byte_decoder()
    if name and all(c in dec for c in name):
        return bytes(dec[c] for c in name)
    return None


def piece(tokenizer, token: int) -> str:
    """One token's text. A fragment of a character (whose plain decode is "�") keeps its bytes as fragment
    characters; a token that really is U+FFFD stays one."""
    text = tokenizer.decode([int(token)])
    if "\ufffd" not in text:
        return text
    raw = token_bytes(tokenizer, token)
    if raw is None:
        return text
    return from_bytes(raw)
