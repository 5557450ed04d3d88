"""Tests for tests/support/tiny_gguf.py: tiny GGUF models that llama.cpp runs.

Each vocabulary kind gets one model file and one in-process llama.cpp server
(module-scoped), so the whole file runs in well under a second of model time.
"""

from __future__ import annotations

import json
import pathlib
import urllib.request
from collections.abc import Iterator
from typing import Any

import gguf
import pytest

from tests.support.tiny_gguf import VocabKind, write_tiny_gguf

import xllamacpp

from edgellm_local.llama.embedded_server import start_server

VOCABS: tuple[VocabKind, ...] = ("bpe", "spm")
MAX_TOKENS = 16
ONE_MB = 1024 * 1024

TOKENIZER_MODEL = {"bpe": "gpt2", "spm": "llama"}
# " the the the": BPE -> 3 x " the"; SPM -> <s>, "▁" (space prefix), 3 x "▁the".
THE_THE_THE = " the the the"
THE_THE_THE_TOKENS = {"bpe": 3, "spm": 5}


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request: pytest.FixtureRequest) -> VocabKind:
    return request.param


@pytest.fixture(scope="module")
def model_path(vocab: VocabKind, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_tiny_gguf(tmp_path_factory.mktemp(vocab) / "tiny.gguf", vocab=vocab, seed=0)


@pytest.fixture(scope="module")
def server(model_path: pathlib.Path) -> Iterator[Any]:
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_ctx = 512
    params.n_parallel = 2
    params.cpuparams.n_threads = 2
    params.cpuparams_batch.n_threads = 2
    params.verbosity = -1
    srv = start_server(params)  # served once: safe to drop (llama_server.py)
    yield srv
    del srv


def _chat(server: Any, content: str = "hi", **extra: Any) -> dict[str, Any]:
    request = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        **extra,
    }
    return server.handle_chat_completions(request)


def _complete(server: Any, prompt: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return server.handle_completions({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def _post(server: Any, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST to the HTTP listener the embedded llama.cpp server also runs."""
    address = getattr(server, "listening_address", "")
    assert address, "xllamacpp's embedded server should listen on loopback"
    request = urllib.request.Request(
        address.rstrip("/") + endpoint,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    return reader.fields[key].contents()


def test_file_is_small_with_expected_metadata(vocab: VocabKind, model_path: pathlib.Path) -> None:
    assert model_path.stat().st_size < ONE_MB

    reader = gguf.GGUFReader(model_path)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "tokenizer.ggml.model") == TOKENIZER_MODEL[vocab]
    assert _field(reader, "llama.vocab_size") == len(tokens)
    assert len(_field(reader, "tokenizer.ggml.token_type")) == len(tokens)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert embd.shape.tolist() == [64, len(tokens)]
    assert "{%" in _field(reader, "tokenizer.chat_template")

    eos = tokens[_field(reader, "tokenizer.ggml.eos_token_id")]
    if vocab == "bpe":
        assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"
        assert _field(reader, "tokenizer.ggml.add_bos_token") is False
        assert eos == "<|im_end|>"
        assert "\u0120t he" in _field(reader, "tokenizer.ggml.merges")
        assert "\u0120the" in tokens
    else:
        assert tokens[:3] == ["<unk>", "<s>", "</s>"]
        assert tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
        assert _field(reader, "tokenizer.ggml.add_bos_token") is True
        assert len(_field(reader, "tokenizer.ggml.scores")) == len(tokens)
        assert eos == "</s>"
        assert "\u2581the" in tokens


@pytest.mark.parametrize("kind", VOCABS)
def test_same_seed_is_byte_identical_and_seeds_differ(kind: VocabKind, tmp_path: pathlib.Path) -> None:
    first = write_tiny_gguf(tmp_path / "a.gguf", vocab=kind, seed=7).read_bytes()
    again = write_tiny_gguf(tmp_path / "b.gguf", vocab=kind, seed=7).read_bytes()
    other = write_tiny_gguf(tmp_path / "c.gguf", vocab=kind, seed=8).read_bytes()
    assert first == again
    assert first != other
    assert len(first) == len(other)


def test_chat_completion_runs_to_max_tokens(server: Any) -> None:
    response = _chat(server)
    assert response["choices"][0]["message"]["content"].strip()
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["usage"]["completion_tokens"] == MAX_TOKENS


def test_raw_completion_runs_to_max_tokens(server: Any) -> None:
    response = _complete(server, "hello")
    assert response["choices"][0]["text"]
    assert response["usage"]["completion_tokens"] == MAX_TOKENS


def test_greedy_chat_is_deterministic(server: Any) -> None:
    # cache_prompt=False makes the second run recompute the prompt from scratch.
    first = _chat(server, "hello there", cache_prompt=False)
    second = _chat(server, "hello there", cache_prompt=False)
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_prompt_tokenization_uses_merges(vocab: VocabKind, server: Any) -> None:
    usage = _complete(server, THE_THE_THE, max_tokens=1)["usage"]
    assert usage["prompt_tokens"] < len(THE_THE_THE.encode())
    assert usage["prompt_tokens"] == THE_THE_THE_TOKENS[vocab]


def test_tokenize_endpoint_shows_merged_pieces(server: Any) -> None:
    pieces = [t["piece"] for t in _post(server, "/tokenize", {"content": THE_THE_THE, "with_pieces": True})["tokens"]]
    assert pieces[-3:] == [" the"] * 3


def test_characters_outside_the_vocab_fall_back_to_bytes(server: Any) -> None:
    text = "\U0001F642\u4f60"  # emoji + CJK: no piece for either in either vocab
    tokens = _post(server, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    byte_pieces = [t["piece"] for t in tokens if isinstance(t["piece"], list)]
    assert sum(len(p) for p in byte_pieces) == len(text.encode())
    ids = [t["id"] for t in tokens]
    assert _post(server, "/detokenize", {"tokens": ids})["content"].strip() == text
