"""The edge's pure-Python token counter, held to `tokenizers` id for id on a fuzzed corpus.

Three vocabularies, as `edgellm publish` writes them: SmolLM2's byte-level BPE (with its
digit-splitting pre-tokenizer), the tiny GGUF's GPT-2 BPE and the tiny GGUF's SentencePiece
vocabulary with byte fallback. Also the chat template rendering the counter applies first.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer

from edgellm.routing.counting import render_chat
from edgellm.tokenizer import Tokenizer, UnsupportedTokenizer, gpt2_split
from edgellm_local.llama.model_file import default_model_path
from edgellm_local.hub.gguf_tokenizer import build_tokenizer, tokenizer_config
from tests.support.tiny_gguf import write_tiny_gguf
from tests.unit.test_gguf_tokenizer import fuzz_corpus, special_texts

FUZZ_STRINGS = 400


def random_unicode(rng: random.Random, count: int) -> list[str]:
    """Arbitrary code points from every plane the tokenizers split differently (no surrogates)."""
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x600, 0x6FF), (0x900, 0x97F),
              (0x2000, 0x206F), (0x2150, 0x218F), (0x3000, 0x30FF), (0x4E00, 0x4EFF), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F)]
    out = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    return out


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("counting-models")
    return {
        "smollm2": default_model_path(),
        "tiny-bpe": write_tiny_gguf(root / "tiny-bpe.gguf", vocab="bpe"),
        "tiny-spm": write_tiny_gguf(root / "tiny-spm.gguf", vocab="spm"),
    }


@pytest.fixture(scope="module", params=["smollm2", "tiny-bpe", "tiny-spm"])
def pair(request: pytest.FixtureRequest, model_paths: dict[str, Path]) -> tuple[str, HFTokenizer, Tokenizer, gguf.GGUFReader]:
    reader = gguf.GGUFReader(model_paths[request.param])
    text = build_tokenizer(reader).to_str()  # exactly the tokenizer.json `publish` ships
    return request.param, HFTokenizer.from_str(text), Tokenizer.from_json(json.loads(text)), reader


@pytest.mark.parametrize("add_special", [True, False])
def test_ids_equal_tokenizers_on_a_fuzzed_corpus(pair: tuple[str, HFTokenizer, Tokenizer, gguf.GGUFReader], add_special: bool) -> None:
    name, hf, ours, reader = pair
    rng = random.Random(f"{name}-{add_special}")
    corpus = fuzz_corpus(seed=rng.randint(0, 2**31), count=FUZZ_STRINGS, specials=special_texts(reader)) + random_unicode(rng, 200)
    mismatches = [(text, hf.encode(text, add_special_tokens=add_special).ids, ours.encode(text, add_special))
                  for text in corpus if hf.encode(text, add_special_tokens=add_special).ids != ours.encode(text, add_special)]
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} differ, first: {mismatches[0]!r}"


def test_long_prompts_equal_tokenizers(pair: tuple[str, HFTokenizer, Tokenizer, gguf.GGUFReader]) -> None:
    name, hf, ours, _ = pair
    rng = random.Random(name)
    text = " ".join(rng.choice(fuzz_corpus(seed=7, count=200, specials=[])) for _ in range(800))
    assert ours.encode(text) == hf.encode(text).ids
    assert ours.count(text) == len(hf.encode(text).ids) > 1000


@pytest.mark.parametrize("text", ["", " ", "  a", "a  b", "a \n b", "\n\n x", "it's", "I'M", "'ll'", " 'x", "x1 22", "!'s", "   \t"])
def test_the_gpt2_scanner_agrees_with_the_regex_pre_tokenizer(text: str) -> None:
    from tokenizers import pre_tokenizers

    expected = [piece for piece, _ in pre_tokenizers.Split(
        pattern=__import__("tokenizers").Regex(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
        behavior="isolated").pre_tokenize_str(text)]
    assert gpt2_split(text) == expected


def test_chat_templates_render_as_llama_cpp_sees_them(pair: tuple[str, HFTokenizer, Tokenizer, gguf.GGUFReader]) -> None:
    """The rendered prompt uses the template family the GGUF names, with the generation prompt."""
    name, _, ours, reader = pair
    template = tokenizer_config(reader).get("chat_template", "")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = render_chat(template, messages)
    if "<|im_start|>" in template:
        assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    elif "[INST]" in template:
        assert text == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"
    assert ours.count(text) > len(messages)


def test_unsupported_models_are_refused_clearly() -> None:
    with pytest.raises(UnsupportedTokenizer, match="only BPE"):
        Tokenizer.from_json({"model": {"type": "Unigram", "vocab": []}})
