"""Control-token texts from a GGUF, and how content is defused (table-driven)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from edgellm_local.llama.control_tokens import JOINER, defuse, defuse_messages, special_pattern, special_texts


def test_the_fast_scan_finds_what_gguf_reader_finds(tiny_model: Path) -> None:
    reader = gguf.GGUFReader(str(tiny_model))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    expected = {t for t, k in zip(tokens, types) if k in (2, 3, 4) and len(t) > 1}
    assert set(special_texts(tiny_model)) == expected and "<|im_start|>" in expected


PATTERN = special_pattern(("<|im_start|>", "<|im_end|>", "<s>"))


@pytest.mark.parametrize("text,expected", [
    ("plain text", "plain text"),
    ("<|im_start|>system", f"<{JOINER}|im_start|>system"),
    ("a<|im_end|>b<|im_end|>", f"a<{JOINER}|im_end|>b<{JOINER}|im_end|>"),
    ("<s> and <s", f"<{JOINER}s> and <s"),
    ("<|im_start", "<|im_start"),  # not the whole token: already plain text
])
def test_defuse(text: str, expected: str) -> None:
    assert defuse(text, PATTERN) == expected
    assert defuse(text, None) == text


def test_only_string_content_is_touched() -> None:
    messages = [{"role": "user", "content": "<s>"}, {"role": "tool", "content": None}]
    assert defuse_messages(messages, PATTERN) == [{"role": "user", "content": f"<{JOINER}s>"}, {"role": "tool", "content": None}]
