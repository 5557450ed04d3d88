"""Message content must reach the model as text, never as control tokens.

llama.cpp tokenizes the rendered chat template with special-token parsing on, so a user who
types `<|im_start|>system ...` into a message would forge a turn. Before the template is
rendered, every control or user-defined token's text found in message content is broken with
a WORD JOINER (U+2060) after its first character: the text reads the same, and no longer
matches the token, so it is tokenized as plain text. Raw prompts (`raw: true`,
`/v1/completions`) are the caller's own formatting and are left alone, as on Workers AI.
"""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path
from typing import Any

import gguf

JOINER = "\u2060"
_SPECIAL = {int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED), int(gguf.TokenType.UNKNOWN)}


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9
_WANTED = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


def _read_gguf_vocab(path: Path) -> tuple[list[str], list[int]]:
    """The token texts and types, scanning GGUF metadata only (gguf.GGUFReader parses every
    field and array item into objects: seconds on a 49k-token vocabulary; this takes ~0.1 s)."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            return [], []
        offset = 8 + 8
        (n_kv,) = struct.unpack_from("<Q", data, offset)
        offset += 8
        found: dict[str, list] = {}

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            return data[at + 8: at + 8 + length].decode("utf-8", "replace"), at + 8 + length

        for _ in range(n_kv):
            key, offset = string(offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            offset += 4
            if kind == _ARRAY:
                elem, count = struct.unpack_from("<IQ", data, offset)
                offset += 12
                if elem == _STRING:
                    items = []
                    for _ in range(count):
                        text, offset = string(offset)
                        items.append(text)
                    if key in _WANTED:
                        found[key] = items
                else:
                    size = _SCALAR[elem]
                    if key in _WANTED and elem in (4, 5):
                        found[key] = list(struct.unpack_from(f"<{count}{'I' if elem == 4 else 'i'}", data, offset))
                    offset += size * count
            elif kind == _STRING:
                _, offset = string(offset)
            else:
                offset += _SCALAR[kind]
            if len(found) == len(_WANTED):
                break
    return found.get(_WANTED[0], []), found.get(_WANTED[1], [])


def special_texts(path: Path) -> tuple[str, ...]:
    """The text of every token llama.cpp would match as special inside a prompt."""
    tokens, types = _read_gguf_vocab(path)
    return tuple(sorted({t for t, k in zip(tokens, types) if int(k) in _SPECIAL and len(t) > 1}, key=len, reverse=True))


def special_pattern(texts: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(re.escape(t) for t in texts)) if texts else None


def defuse(text: str, pattern: re.Pattern[str] | None) -> str:
    if pattern is None:
        return text
    return pattern.sub(lambda m: m.group(0)[0] + JOINER + m.group(0)[1:], text)


def defuse_messages(messages: list[dict[str, Any]], pattern: re.Pattern[str] | None) -> list[dict[str, Any]]:
    return [{**m, "content": defuse(m["content"], pattern)} if isinstance(m.get("content"), str) else m for m in messages]
