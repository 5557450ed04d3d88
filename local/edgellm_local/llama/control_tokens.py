"""Message content must reach the model as text, never as control tokens.

llama.cpp tokenizes the rendered chat template with special-token parsing on, so a user who
types `<|im_start|>system ...` into a message would forge a turn. Before the template is
rendered, every control or user-defined token's text found in message content is broken with
a WORD JOINER (U+2060) after its first character: the text reads the same, and no longer
matches the token, so it is tokenized as plain text. Raw prompts (`raw: true`,
`/v1/completions`) are the caller's own formatting and are left alone, as on Workers AI.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf

from edgellm_local.llama.model_file import gguf_metadata

JOINER = "\u2060"
_SPECIAL = {int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED), int(gguf.TokenType.UNKNOWN)}


_WANTED = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")


def _read_gguf_vocab(path: Path) -> tuple[list[str], list[int]]:
    """The token texts and types, from the GGUF's metadata alone (`gguf_metadata`)."""
    found = gguf_metadata(path, lambda key: key in _WANTED, until=len(_WANTED))
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
