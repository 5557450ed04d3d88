"""`tokenizer.json` built from a GGUF tokenizes exactly as llama.cpp does with that GGUF.

llama.cpp's own tokenizer is the oracle: xllamacpp embeds llama.cpp's HTTP server, whose
`/tokenize` runs the same code the model's prompts go through. Each model gets one server
(module-scoped) and a few hundred seeded, fuzzed strings, compared id for id with and without
the special tokens llama.cpp adds (`add_special`), with special-token parsing on (HF always
matches special tokens in text). The tokenizer under test is re-loaded from its JSON text, so
what is compared is what `publish` ships.
"""

from __future__ import annotations

import json
import random
import urllib.request
import zlib
from dataclasses import replace
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest
import xllamacpp
from tokenizers import Tokenizer

from edgellm_local.llama.model_file import default_model_path
from edgellm_local.llama.embedded_server import start_server
from edgellm_local.hub.gguf_tokenizer import UnsupportedVocabulary, build_tokenizer, model_config, parity_warnings, spm_merges, tokenizer_config
from tests.support import tiny_gguf
from tests.support.tiny_gguf import write_tiny_gguf

FUZZ_STRINGS = 300
MODELS = ("smollm2", "tiny-bpe", "tiny-spm")

WORDS = ["the", "The", "hello", "Hello", "world", "and", "of", "to", "is", "that", "with", "what",
         "good", "new", "you", "not", "tokenizer", "HTTP", "edge", "Llama", "don't", "it's", "we'll",
         "I'm", "they're", "you've", "he'd", "aaaa", "zzz", "xylophone", "thethe", "ing", "hellohello"]
DIGITS = ["0", "7", "42", "2024", "3.14159", "1,000,000", "0x1F", "1e-5", "007", "12345678901234"]
SPACES = [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t", "\u00a0", "\u3000",
          "\u2009", "\u0085", "\u200b", "\v", "\f"]
PUNCT = list("!?.,;:'\"()[]{}<>/\\|@#$%^&*-_=+~`") + ["...", "--", "?!", "''", "``", "->", "=>", "::"]
CODE = ["def f(x):\n    return x ** 2\n", "if (a && b) { c(); }", "<div class=\"x\">hi</div>",
        "for i in range(10):", "SELECT * FROM t WHERE id = 1;", "x = [1, 2, 3]  # list",
        "fn main() -> i32 {}", "#include <stdio.h>", "$ curl -sS https://example.com/a?b=c"]
UNICODE = ["café", "naïve", "Straße", "résumé", "Ελληνικά", "Русский язык", "עברית", "العربية",
           "हिन्दी", "ไทย", "Ñandú", "Ångström", "e\u0301", "ﬁ", "Ⅻ", "½", "٣٤", "²", "①", "ℌ"]
# The vocabularies' own spellings (SentencePiece's space, GPT-2's space glyph, a byte token's
# name) and long runs, where merge order matters most.
LOOKALIKES = ["\u2581", "\u2581x", "\u0120", "\u0120the", "<0x41>", "<0x0A>", "aaaaaaaaa", "..........",
              "          ", "\n\n\n\n", "hellohellohello", "=========", "0000000", "ababababab"]
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🤖", "✨🔥", "🫠"]
CJK = ["日本語", "中文字符", "한국어", "こんにちは", "カタカナ", "漢字かな交じり文", "，。！"]
FIXED = ["", " ", "  ", "\n", "a", " a", "a ", "  a  ", "Hello world", " Hello", "\n\nHello\n",
         "hello   world", "a\tb", "\r\n\r\n", "123", " 123", "1 2 3", "   \n\n   ", "ÿ", "\u00a0x"]


def fuzz_corpus(seed: int, count: int, specials: list[str]) -> list[str]:
    """Seeded strings mixing every class of input a tokenizer splits differently."""
    rng = random.Random(seed)
    classes = [WORDS, WORDS, DIGITS, SPACES, PUNCT, CODE, UNICODE, EMOJI, CJK, LOOKALIKES, specials or WORDS]
    corpus = list(FIXED) + [f"{s}hi" for s in specials] + [f"a{s} b" for s in specials]
    while len(corpus) < count:
        parts = []
        for _ in range(rng.randint(1, 10)):
            parts.append(rng.choice(rng.choice(classes)))
            if rng.random() < 0.4:
                parts.append(rng.choice([" ", " ", "  ", "\n", ""]))
        corpus.append("".join(parts))
    return corpus


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizer-models")
    return {
        "smollm2": default_model_path(),
        "tiny-bpe": write_tiny_gguf(root / "tiny-bpe.gguf", vocab="bpe"),
        "tiny-spm": write_tiny_gguf(root / "tiny-spm.gguf", vocab="spm"),
    }


@dataclass
class ModelUnderTest:
    name: str
    reader: gguf.GGUFReader
    tokenizer: Tokenizer  # re-loaded from its JSON text: what `publish` ships
    server: Any  # llama.cpp with the same GGUF


@pytest.fixture(scope="module")
def readers(model_paths: dict[str, Path]) -> dict[str, gguf.GGUFReader]:
    return {name: gguf.GGUFReader(path) for name, path in model_paths.items()}


@pytest.fixture(scope="module", params=MODELS)
def model(
    request: pytest.FixtureRequest, model_paths: dict[str, Path], readers: dict[str, gguf.GGUFReader]
) -> Iterator[ModelUnderTest]:
    params = xllamacpp.CommonParams()
    params.model.path = str(model_paths[request.param])
    params.n_ctx = 512
    params.n_parallel = 1
    params.cpuparams.n_threads = 2
    params.cpuparams_batch.n_threads = 2
    params.verbosity = -1
    server = start_server(params)  # served once: safe to drop (llama_server.py)
    assert server.listening_address, "xllamacpp's embedded server should listen on loopback"
    reader = readers[request.param]
    tokenizer = Tokenizer.from_str(build_tokenizer(reader).to_str())
    yield ModelUnderTest(request.param, reader, tokenizer, server)
    del server


def llama_tokenize(server: Any, text: str, add_special: bool) -> list[int]:
    body = {"content": text, "add_special": add_special, "parse_special": True}
    request = urllib.request.Request(
        server.listening_address.rstrip("/") + "/tokenize",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["tokens"]


def special_texts(reader: gguf.GGUFReader) -> list[str]:
    tokens, types = reader.fields["tokenizer.ggml.tokens"].contents(), reader.fields["tokenizer.ggml.token_type"].contents()
    return [t for t, k in zip(tokens, types) if k in (gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN)][:6]


@pytest.mark.parametrize("add_special", [False, True], ids=["plain", "add_special"])
def test_token_ids_equal_llama_cpp_on_a_fuzzed_corpus(model: ModelUnderTest, add_special: bool) -> None:
    corpus = fuzz_corpus(seed=zlib.crc32(model.name.encode()), count=FUZZ_STRINGS, specials=special_texts(model.reader))
    mismatches = []
    for text in corpus:
        expected = llama_tokenize(model.server, text, add_special)
        got = model.tokenizer.encode(text, add_special_tokens=add_special).ids
        if got != expected:
            mismatches.append((text, expected, got))
    assert len(corpus) >= FUZZ_STRINGS
    assert not mismatches, f"{model.name}: {len(mismatches)}/{len(corpus)} differ, e.g. {mismatches[:3]}"


def test_bos_is_added_only_where_the_gguf_says(model: ModelUnderTest) -> None:
    bos = model.reader.fields["tokenizer.ggml.bos_token_id"].contents()
    with_special = model.tokenizer.encode("hello", add_special_tokens=True).ids
    assert with_special == llama_tokenize(model.server, "hello", True)
    assert (with_special[0] == bos) == (model.name == "tiny-spm")  # only the SentencePiece GGUF sets add_bos


@pytest.mark.parametrize("text", ["Hello world", "  two leading spaces", "tabs\tand\nnewlines\n",
                                  "日本語 😀 café", "x = [1, 2, 3]  # list", "½ Ⅻ"])
def test_decoding_gives_the_text_back(model: ModelUnderTest, text: str) -> None:
    assert model.tokenizer.decode(model.tokenizer.encode(text, add_special_tokens=False).ids) == text


def test_spm_merges_rank_pieces_by_score_then_operand_length() -> None:
    vocab = {"a": 0, "b": 1, "ab": 2, "abb": 3, "bb": 4}
    scores = {"a": -10.0, "b": -11.0, "ab": -1.0, "abb": -2.0, "bb": -3.0}
    assert spm_merges(vocab, scores) == [("a", "b"), ("ab", "b"), ("a", "bb"), ("b", "b")]


def test_unsupported_vocabularies_are_refused_by_name(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "odd.gguf", "llama")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[UNK]", "a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedVocabulary, match="'bert'"):
        build_tokenizer(gguf.GGUFReader(tmp_path / "odd.gguf"))


def test_configs_come_from_the_gguf_metadata(readers: dict[str, gguf.GGUFReader]) -> None:
    smol = readers["smollm2"]
    assert model_config(smol) == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "intermediate_size": 1536, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
        "rope_theta": 100000.0, "hidden_act": "silu", "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    }
    config = tokenizer_config(smol)
    assert (config["eos_token"], config["add_bos_token"], config["model_max_length"]) == ("<|im_end|>", False, 8192)
    assert "<|im_start|>" in config["chat_template"]
    spm = tokenizer_config(readers["tiny-spm"])
    assert {k: spm[k] for k in ("bos_token", "eos_token", "unk_token", "add_bos_token", "legacy")} == {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, "legacy": True,
    }
    assert "[INST]" in spm["chat_template"]


def write_spm_gguf_with_tied_scores(path: Path) -> Path:
    """The tiny SentencePiece GGUF, but every merged piece scored by its length alone, so many
    different pieces share a score (built from tiny_gguf's parts: it has no hook for scores)."""
    vocab = tiny_gguf._spm_vocab()
    scores = tuple(-float(len(t)) if s < 0 and len(t) > 1 else s for t, s in zip(vocab.tokens, vocab.scores or ()))
    vocab = replace(vocab, scores=scores)
    shape = tiny_gguf.TinyLlamaShape()
    writer = gguf.GGUFWriter(path, "llama")
    tiny_gguf._add_hparams(writer, shape, 512, len(vocab.tokens))
    tiny_gguf._add_tokenizer(writer, vocab)
    for name, tensor in tiny_gguf._model_tensors(0, shape, vocab):
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_known_divergence_tied_sentencepiece_scores_is_named(
    tmp_path: Path, readers: dict[str, gguf.GGUFReader]
) -> None:
    """The one divergence found: llama.cpp (like SentencePiece) merges the best-scoring pair and
    breaks a tie between *different* pieces by position; HF BPE has a strict merge order, so it
    breaks it by rank. Real SentencePiece BPE vocabularies (and the tiny one above, which passes
    the fuzz test) score every merged piece distinctly, so it cannot arise there; a GGUF whose
    scores tie is warned about at publish time rather than silently shipped."""
    assert parity_warnings(readers["tiny-spm"]) == [] and parity_warnings(readers["smollm2"]) == []
    path = write_spm_gguf_with_tied_scores(tmp_path / "tied.gguf")
    reader = gguf.GGUFReader(path)
    [warning] = parity_warnings(reader)
    assert "share a score" in warning
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = 512
    params.verbosity = -1
    server = start_server(params)  # served once: safe to drop (llama_server.py)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    # "▁h", "he" and "ll" all score -2: llama.cpp takes the leftmost ("▁h"), HF the first-ranked.
    llama = [tokens[i] for i in llama_tokenize(server, "hello", False)]
    hf = [tokens[i] for i in build_tokenizer(reader).encode("hello", add_special_tokens=False).ids]
    assert (llama, hf) == (["▁h", "e", "ll", "o"], ["▁hello"])
    del server
