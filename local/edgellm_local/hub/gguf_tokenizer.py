"""Hugging Face tokenizer files built from a GGUF's own vocabulary.

A GGUF carries everything llama.cpp needs to tokenize; browsers and `tokenizers` need the same
vocabulary as `tokenizer.json`. These pure functions translate one into the other so that both
give the same token ids (the tests compare them with llama.cpp on a fuzzed corpus):

- `gpt2` vocabularies (byte-level BPE: GPT-2, SmolLM2) keep their merges as they are; the
  GGUF's `tokenizer.ggml.pre` name selects the pre-tokenizer regexes llama.cpp uses for it.
- `llama` vocabularies (SentencePiece with scores and byte fallback: Llama 2) become the HF
  "Llama" BPE: merges derived from the scores as `transformers`' LlamaConverter does, the
  legacy "prepend ▁, spaces to ▁" normalizer (llama.cpp's `add_space_prefix`, which also
  applies after every special token, as HF's normalizer does per segment), `<0xXX>` byte
  fallback.

Control and unknown tokens become special added tokens (llama.cpp matches them in text when
special parsing is on), user-defined ones plain added tokens (llama.cpp always matches them).
"""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

SPM_SPACE = "\u2581"  # "▁", SentencePiece's whitespace marker

_SPECIAL_TYPES = {int(gguf.TokenType.CONTROL), int(gguf.TokenType.UNKNOWN)}
_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)


class UnsupportedVocabulary(ValueError):
    """The GGUF's vocabulary kind or pre-tokenizer has no faithful HF equivalent here."""


def gguf_value(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value (arrays as lists, strings decoded), or `default` when absent."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """llama.cpp's regexes for each `tokenizer.ggml.pre` name, as HF pre-tokenizers."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt-2", "gpt2"):
        return byte_level
    if pre == "smollm":  # llama.cpp: "\p{N}" first (one digit per piece), then GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise UnsupportedVocabulary(f"BPE pre-tokenizer {pre!r} is not supported (supported: gpt-2, smollm)")


def _added_tokens(tokens: list[str], types: list[int]) -> tuple[list[AddedToken], list[AddedToken]]:
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in _SPECIAL_TYPES]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    return special, user


def _vocab(tokens: list[str]) -> dict[str, int]:
    """token -> id; a duplicated token string keeps its first id, as llama.cpp's lookup does."""
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    return vocab


def _bpe_merges(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """GGUF merge lines ("Ġ t") as pairs. llama.cpp splits at the first space after position
    0; pairs whose operands or result are not tokens can never yield a token and are dropped."""
    pairs = []
    for line in merges:
        cut = line.find(" ", 1)
        left, right = line[:cut], line[cut + 1 :]
        if cut > 0 and left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    return pairs


def spm_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges equivalent to SentencePiece's "merge the adjacent pair whose concatenation
    scores highest": every split of a piece into two pieces, ranked by the piece's score
    (transformers' `generate_merges`, so the result equals HF's own Llama conversion)."""
    merges: list[tuple[str, str, float]] = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def parity_warnings(reader: gguf.GGUFReader) -> list[str]:
    """Known ways this GGUF's `tokenizer.json` can tokenize differently from llama.cpp.

    SentencePiece (and llama.cpp) merge the highest-scoring pair, breaking a tie between two
    different pieces by position; HF BPE needs a strict merge order, so such ties are broken by
    rank instead. Real SentencePiece BPE models give every merged piece its own score (its merge
    rank), but a vocabulary whose scores tie can tokenize some inputs differently: say so."""
    if gguf_value(reader, "tokenizer.ggml.model") != "llama":
        return []
    tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens", [])
    scores = gguf_value(reader, "tokenizer.ggml.scores", [0.0] * len(tokens))
    vocab = _vocab(tokens)
    merged = [s for t, s in zip(tokens, scores) if any(t[:i] in vocab and t[i:] in vocab for i in range(1, len(t)))]
    tied = len(merged) - len(set(merged))
    if not tied:
        return []
    return [f"{tied} merged SentencePiece pieces share a score with another: llama.cpp breaks such ties by "
            "position, HF BPE by merge rank, so some inputs may tokenize differently"]


def _template(reader: gguf.GGUFReader, tokens: list[str], add_bos: bool, add_eos: bool) -> processors.PostProcessor | None:
    """BOS/EOS added by encode(add_special_tokens=True), as llama.cpp's `add_special` does."""
    bos_id, eos_id = gguf_value(reader, "tokenizer.ggml.bos_token_id"), gguf_value(reader, "tokenizer.ggml.eos_token_id")
    add_bos, add_eos = add_bos and bos_id is not None, add_eos and eos_id is not None
    if not (add_bos or add_eos):
        return None
    head, tail = [bos_id] if add_bos else [], [eos_id] if add_eos else []
    single = " ".join([*(tokens[i] for i in head), "$A", *(tokens[i] for i in tail)])
    pair = " ".join([single, *(tokens[i] for i in head), "$B:1", *(tokens[i] for i in tail)])
    specials = [(tokens[i], i) for i in dict.fromkeys(head + tail)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def add_bos_eos(reader: gguf.GGUFReader) -> tuple[bool, bool]:
    """llama.cpp's defaults when the GGUF is silent: SentencePiece adds BOS, BPE does not."""
    default_bos = gguf_value(reader, "tokenizer.ggml.model") == "llama"
    return (
        bool(gguf_value(reader, "tokenizer.ggml.add_bos_token", default_bos)),
        bool(gguf_value(reader, "tokenizer.ggml.add_eos_token", False)),
    )


def build_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """A `tokenizers.Tokenizer` that tokenizes as llama.cpp does with this GGUF."""
    kind = gguf_value(reader, "tokenizer.ggml.model")
    tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens", [])
    types: list[int] = gguf_value(reader, "tokenizer.ggml.token_type", [int(gguf.TokenType.NORMAL)] * len(tokens))
    vocab = _vocab(tokens)
    if kind == "gpt2":
        merges = _bpe_merges(gguf_value(reader, "tokenizer.ggml.merges", []), vocab)
        tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(gguf_value(reader, "tokenizer.ggml.pre", "gpt-2"))
        tokenizer.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = gguf_value(reader, "tokenizer.ggml.scores", [0.0] * len(tokens))
        unk_id = gguf_value(reader, "tokenizer.ggml.unknown_token_id")
        piece_scores = {t: float(s) for i, (t, s) in enumerate(zip(tokens, scores)) if vocab[t] == i}
        model = BPE(vocab, spm_merges(vocab, piece_scores), unk_token=None if unk_id is None else tokens[unk_id],
                    fuse_unk=True, byte_fallback=True)
        tokenizer = Tokenizer(model)
        replace = normalizers.Replace(" ", SPM_SPACE)
        if gguf_value(reader, "tokenizer.ggml.add_space_prefix", True):
            tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPM_SPACE), replace])
        else:
            tokenizer.normalizer = replace
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    else:
        raise UnsupportedVocabulary(f"tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    special, user = _added_tokens(tokens, types)
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user)
    post = _template(reader, tokens, *add_bos_eos(reader))
    if post is not None:
        tokenizer.post_processor = post
    elif kind == "gpt2":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _token(tokens: list[str], index: Any) -> str | None:
    return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None


def tokenizer_config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """`tokenizer_config.json`: what transformers(.js) reads besides `tokenizer.json` (the
    chat template, the special tokens and whether BOS/EOS are added). Absent values are omitted."""
    tokens: list[str] = gguf_value(reader, "tokenizer.ggml.tokens", [])
    add_bos, add_eos = add_bos_eos(reader)
    arch = gguf_value(reader, "general.architecture", "llama")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": gguf_value(reader, f"{arch}.context_length"),
    }
    for name in ("bos", "eos", "unk", "pad"):
        config[f"{name}_token"] = _token(tokens, gguf_value(reader, f"tokenizer.ggml.{_ID_KEYS[name]}"))
    if gguf_value(reader, "tokenizer.ggml.model") == "llama":
        config["legacy"] = True  # "▁" prepended to every segment, as llama.cpp does
    config["chat_template"] = gguf_value(reader, "tokenizer.chat_template")
    return {key: value for key, value in config.items() if value is not None}


_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}
_ARCHITECTURES = {"llama": "LlamaForCausalLM"}


def _float32(value: Any) -> float | None:
    """GGUF stores these as float32; print the shortest decimal (1e-05, not 9.9999997e-06)."""
    return None if value is None else float(str(np.float32(value)))


def model_config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """An HF-style `config.json` from the GGUF's hyper-parameters (for tools that size a model
    before loading it: context length, layers, heads, vocabulary)."""
    arch = gguf_value(reader, "general.architecture", "llama")
    heads = gguf_value(reader, f"{arch}.attention.head_count")
    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURES.get(arch, f"{arch.capitalize()}ForCausalLM")],
        "model_type": arch,
        "vocab_size": gguf_value(reader, f"{arch}.vocab_size", len(gguf_value(reader, "tokenizer.ggml.tokens", []))),
        "hidden_size": gguf_value(reader, f"{arch}.embedding_length"),
        "num_hidden_layers": gguf_value(reader, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": gguf_value(reader, f"{arch}.attention.head_count_kv", heads),
        "intermediate_size": gguf_value(reader, f"{arch}.feed_forward_length"),
        "max_position_embeddings": gguf_value(reader, f"{arch}.context_length"),
        "rms_norm_eps": _float32(gguf_value(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32(gguf_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
        "bos_token_id": gguf_value(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf_value(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": gguf_value(reader, "tokenizer.ggml.padding_token_id"),
    }
    return {key: value for key, value in config.items() if value is not None}
