"""Tiny random-weight Llama GGUF models for fast, deterministic tests.

``write_tiny_gguf()`` writes a ~0.3 MB Llama-architecture GGUF file (2 layers,
width 64) with either a GPT-2-style byte-level BPE vocabulary (ChatML chat
template) or a Llama-2-style SentencePiece vocabulary (``[INST]`` template).
llama.cpp loads it in milliseconds and generates gibberish at full speed,
which is all a test of the serving plumbing needs.

Gotchas this module handles, and why:

* **The pre-tokenizer is called ``"gpt-2"``** (with a dash).  llama.cpp
  refuses to load a BPE vocabulary with an unknown ``tokenizer.ggml.pre``;
  ``"gpt2"`` is the *tokenizer model* name, not a pre-tokenizer name.
* **BPE merges are written in the byte-to-unicode alphabet** ("Ġ" for a
  space), and every merge result is itself a vocabulary token.  llama.cpp
  splits a merge line at the first space after position 0 and falls back to
  single-byte tokens whenever a merge result is missing from the vocabulary,
  so a merge without its token would silently never be used.
* **SentencePiece scores encode merge order**: llama.cpp's SPM tokenizer
  repeatedly merges the adjacent pair whose concatenation has the *highest*
  score, so merged pieces get ``-rank`` (earlier merge = higher score), as in
  Llama 2's ``tokenizer.model``.  Single characters are scored below every
  merge; their score never matters because no merge produces them.
* **SPM byte fallback** needs all 256 ``<0xXX>`` pieces (upper-case hex, type
  BYTE): llama.cpp looks them up by that exact spelling for any character
  that is not a piece (emoji, CJK) and for the newline token.
* **Greedy decoding must not stop at EOS.**  Random weights would make the
  end-of-generation tokens win now and then, and a test asserting
  ``completion_tokens == max_tokens`` would flake.  Zeroing their ``output``
  rows alone is not enough (a zero logit still beats negative ones), and the
  Llama architecture has no lm-head bias.  So residual dimension 0 is
  reserved as a constant "bias feature": every token embedding has 1.0 there
  and no layer writes to it (row 0 of ``attn_output`` and ``ffn_down`` is
  zero), so after the final RMS norm it is always positive.  The ``output``
  column for that dimension then acts as a per-token logit bias: +4 for
  printable-ASCII tokens, -4 for everything else -- control/unknown tokens
  (whose other ``output`` entries are zeroed) and non-ASCII byte tokens, so
  generated text is always valid UTF-8.
* **Determinism**: all weights come from ``numpy.random.default_rng(seed)``
  in a fixed order and ``GGUFWriter`` writes no timestamps, so one seed gives
  byte-identical files.  2-D matrices are F16 (llama.cpp's ``MOSTLY_F16``
  keeps 1-D norm weights in F32, which its CPU kernels require).
"""

from __future__ import annotations

import os
import pathlib
import string
from dataclasses import dataclass
from typing import Literal, Sequence

import gguf
import numpy as np

VocabKind = Literal["bpe", "spm"]

__all__ = ["TinyLlamaShape", "VocabKind", "write_tiny_gguf"]


@dataclass(frozen=True)
class TinyLlamaShape:
    """Hyper-parameters of the tiny model (defaults give a ~0.3 MB file)."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    rms_eps: float = 1e-5
    rope_freq_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class TinyVocab:
    """Everything the GGUF tokenizer section needs, plus per-token logit bias."""

    model: str
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    scores: tuple[float, ...] | None
    merges: tuple[str, ...] | None
    bos_id: int
    eos_id: int
    eot_id: int | None
    unk_id: int | None
    add_bos: bool
    chat_template: str
    logit_bias: tuple[float, ...]


# Common English merges, in rank order, with " " standing for the space
# marker ("Ġ" in byte-level BPE, "▁" in SentencePiece).  Both operands of each
# merge are either a single character or the result of an earlier merge.
_MERGES: tuple[tuple[str, str], ...] = (
    (" ", "t"), ("h", "e"), (" ", "a"), ("i", "n"), (" t", "he"),
    ("e", "r"), ("o", "n"), (" ", "s"), ("r", "e"), (" ", "w"),
    ("a", "t"), ("e", "n"), (" ", "o"), ("o", "r"), ("e", "s"),
    (" ", "c"), ("i", "s"), ("i", "t"), ("a", "n"), ("a", "l"),
    ("a", "r"), (" ", "b"), (" ", "f"), (" ", "p"), (" ", "m"),
    ("e", "d"), ("in", "g"), (" ", "h"), ("o", "u"), (" ", "i"),
    ("n", "d"), (" a", "nd"), (" o", "f"), (" t", "o"), (" ", "in"),
    (" i", "s"), (" t", "h"), (" th", "at"), (" ", "d"), (" ", "l"),
    ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "hello"), ("h", "i"),
    (" h", "i"), ("o", "w"), (" h", "ow"), ("y", "ou"), (" ", "you"),
    (" ", "n"), (" ", "g"), (" ", "e"), (" ", "re"), ("l", "e"),
    ("s", "t"), ("o", "m"), ("c", "h"), ("l", "y"), ("v", "e"),
    ("a", "s"), (" w", "as"), (" f", "or"), ("t", "h"), ("i", "th"),
    (" w", "ith"), ("i", "on"), ("t", "ion"), (" c", "on"), (" b", "e"),
    (" w", "e"), (" ", "it"), (" ", "on"), (" ", "at"), (" ", "an"),
    ("a", "d"), (" ", "or"), (" ", "as"), (" w", "h"), (" wh", "at"),
    (" s", "t"), ("n", "t"), ("e", "nt"), ("c", "e"), ("a", "y"),
    (" d", "o"), (" n", "o"), ("o", "t"), (" n", "ot"), (" a", "re"),
    ("e", "w"), (" n", "ew"), (" m", "e"), (" m", "y"), (" s", "o"),
    ("u", "n"), (" ", "un"), ("o", "o"), (" g", "oo"), (" goo", "d"),
)

_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

_BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": GPT-2's byte-to-unicode image of b" "
_SPM_SPACE = "\u2581"  # "▁": SentencePiece's whitespace marker

# Logit bias, in units of the residual "bias feature" (exactly 1 before the
# final RMS norm).  The content part of a logit is a dot product of ~63
# residual entries of size ~1 with head weights of std 0.05, i.e. std ~0.5,
# so +/-4 separates allowed from blocked tokens by many standard deviations.
_BIAS_ALLOWED = 4.0
_BIAS_BLOCKED = -4.0
_SPECIAL_TYPES = frozenset({gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN})


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode char map, in vocab order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = [b for b in range(256) if b not in mapping]  # space, controls, ...
    for offset, b in enumerate(shifted):
        mapping[b] = chr(256 + offset)
    return mapping


def _is_printable_ascii(text: str) -> bool:
    return bool(text) and all(" " <= ch <= "~" for ch in text)


def _merged_pieces(space: str, alphabet: set[str]) -> list[tuple[str, str]]:
    """The merge table with the space marker substituted, validated for closure."""
    known = set(alphabet)
    pairs: list[tuple[str, str]] = []
    for left, right in _MERGES:
        left, right = left.replace(" ", space), right.replace(" ", space)
        if left not in known or right not in known:
            raise ValueError(f"merge {left!r} + {right!r} uses an unknown piece")
        if left + right in known:
            raise ValueError(f"merge {left!r} + {right!r} is a duplicate")
        known.add(left + right)
        pairs.append((left, right))
    return pairs


def _bpe_vocab() -> TinyVocab:
    """GPT-2 byte-level BPE vocabulary with ChatML control tokens (Qwen-like)."""
    byte_map = _bytes_to_unicode()
    unicode_to_byte = {ch: b for b, ch in byte_map.items()}
    byte_tokens = list(byte_map.values())
    pairs = _merged_pieces(_BYTE_LEVEL_SPACE, set(byte_tokens))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = byte_tokens + [left + right for left, right in pairs] + specials

    def bias(token: str) -> float:
        if token in specials:
            return _BIAS_BLOCKED
        text = bytes(unicode_to_byte[ch] for ch in token).decode("latin-1")
        return _BIAS_ALLOWED if _is_printable_ascii(text) else _BIAS_BLOCKED

    n_normal = len(tokens) - len(specials)
    return TinyVocab(
        model="gpt2",
        pre="gpt-2",
        tokens=tuple(tokens),
        token_types=tuple(
            [gguf.TokenType.NORMAL] * n_normal + [gguf.TokenType.CONTROL] * len(specials)
        ),
        scores=None,
        merges=tuple(f"{left} {right}" for left, right in pairs),
        bos_id=tokens.index("<|endoftext|>"),
        eos_id=tokens.index("<|im_end|>"),
        eot_id=tokens.index("<|im_end|>"),
        unk_id=None,
        add_bos=False,
        chat_template=_CHATML_TEMPLATE,
        logit_bias=tuple(bias(t) for t in tokens),
    )


def _spm_vocab() -> TinyVocab:
    """Llama-2-style SentencePiece vocabulary: specials, 256 bytes, pieces."""
    specials = [("<unk>", gguf.TokenType.UNKNOWN), ("<s>", gguf.TokenType.CONTROL),
                ("</s>", gguf.TokenType.CONTROL)]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    chars = [_SPM_SPACE, *string.ascii_lowercase, *string.ascii_uppercase,
             *string.digits, *string.punctuation]
    merged = [left + right for left, right in _merged_pieces(_SPM_SPACE, set(chars))]
    # Llama 2 order: merged pieces by rank, then the single characters last.
    pieces = merged + chars

    tokens = [t for t, _ in specials] + byte_tokens + pieces
    token_types = ([int(k) for _, k in specials] + [gguf.TokenType.BYTE] * 256
                   + [gguf.TokenType.NORMAL] * len(pieces))
    scores = [0.0] * (len(specials) + 256) + [float(-rank) for rank in range(len(pieces))]
    logit_bias = ([_BIAS_BLOCKED] * (len(specials) + 256)
                  + [_BIAS_ALLOWED if _is_printable_ascii(p.replace(_SPM_SPACE, " "))
                     else _BIAS_BLOCKED for p in pieces])
    return TinyVocab(
        model="llama",
        pre=None,
        tokens=tuple(tokens),
        token_types=tuple(token_types),
        scores=tuple(scores),
        merges=None,
        bos_id=1,
        eos_id=2,
        eot_id=None,
        unk_id=0,
        add_bos=True,
        chat_template=_LLAMA2_TEMPLATE,
        logit_bias=tuple(logit_bias),
    )


def _make_vocab(kind: VocabKind) -> TinyVocab:
    if kind == "bpe":
        return _bpe_vocab()
    if kind == "spm":
        return _spm_vocab()
    raise ValueError(f"unknown vocab kind {kind!r}; expected 'bpe' or 'spm'")


def _add_hparams(writer: gguf.GGUFWriter, shape: TinyLlamaShape, n_ctx: int, n_vocab: int) -> None:
    writer.add_name("tiny-random-llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_freq_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)


def _add_tokenizer(writer: gguf.GGUFWriter, vocab: TinyVocab) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    if vocab.scores is not None:
        writer.add_token_scores(list(vocab.scores))
    if vocab.merges is not None:
        writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.eot_id is not None:
        writer.add_eot_token_id(vocab.eot_id)
    if vocab.unk_id is not None:
        writer.add_unk_token_id(vocab.unk_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_chat_template(vocab.chat_template)


def _random(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    """Seeded normal weights as F16 (numpy shape is (out, in); gguf reverses it)."""
    return (rng.standard_normal(tuple(shape), dtype=np.float32) * std).astype(np.float16)


def _embedding_and_head(
    rng: np.random.Generator, shape: TinyLlamaShape, vocab: TinyVocab
) -> tuple[np.ndarray, np.ndarray]:
    """Token embeddings and lm head, with residual dimension 0 as a bias feature."""
    n_vocab = len(vocab.tokens)
    embd = rng.standard_normal((n_vocab, shape.n_embd), dtype=np.float32) * 0.5
    embd[:, 0] = 1.0  # constant "bias feature"; no layer writes to dimension 0
    head = rng.standard_normal((n_vocab, shape.n_embd), dtype=np.float32) * 0.05
    special = np.isin(np.asarray(vocab.token_types), list(_SPECIAL_TYPES))
    head[special, :] = 0.0  # no content signal at all for control/unknown tokens
    head[:, 0] = np.asarray(vocab.logit_bias, dtype=np.float32)
    return embd.astype(np.float16), head.astype(np.float16)


def _block_tensors(
    rng: np.random.Generator, shape: TinyLlamaShape, layer: int
) -> list[tuple[str, np.ndarray]]:
    """One transformer block; its residual writes leave dimension 0 alone."""
    d, kv, std = shape.n_embd, shape.n_head_kv * shape.head_dim, 0.1
    attn_output = _random(rng, (d, d), std)
    ffn_down = _random(rng, (d, shape.n_ff), std)
    attn_output[0, :] = 0.0  # row 0 = output dimension 0 (the bias feature)
    ffn_down[0, :] = 0.0
    prefix = f"blk.{layer}"
    return [
        (f"{prefix}.attn_norm.weight", np.ones(d, dtype=np.float32)),
        (f"{prefix}.attn_q.weight", _random(rng, (d, d), std)),
        (f"{prefix}.attn_k.weight", _random(rng, (kv, d), std)),
        (f"{prefix}.attn_v.weight", _random(rng, (kv, d), std)),
        (f"{prefix}.attn_output.weight", attn_output),
        (f"{prefix}.ffn_norm.weight", np.ones(d, dtype=np.float32)),
        (f"{prefix}.ffn_gate.weight", _random(rng, (shape.n_ff, d), std)),
        (f"{prefix}.ffn_up.weight", _random(rng, (shape.n_ff, d), std)),
        (f"{prefix}.ffn_down.weight", ffn_down),
    ]


def _model_tensors(
    seed: int, shape: TinyLlamaShape, vocab: TinyVocab
) -> list[tuple[str, np.ndarray]]:
    """All tensors in llama.cpp's naming, drawn in a fixed order from one RNG."""
    rng = np.random.default_rng(seed)
    embd, head = _embedding_and_head(rng, shape, vocab)
    tensors = [("token_embd.weight", embd)]
    for layer in range(shape.n_layer):
        tensors.extend(_block_tensors(rng, shape, layer))
    tensors.append(("output_norm.weight", np.ones(shape.n_embd, dtype=np.float32)))
    tensors.append(("output.weight", head))
    return tensors


def write_tiny_gguf(
    path: str | os.PathLike[str],
    *,
    vocab: VocabKind = "bpe",
    seed: int = 0,
    n_ctx: int = 512,
) -> pathlib.Path:
    """Write a tiny random Llama GGUF to ``path`` and return it as a Path.

    ``vocab="bpe"`` gives a GPT-2 byte-level BPE vocabulary with ChatML
    control tokens and template (no BOS added, EOS = ``<|im_end|>``);
    ``vocab="spm"`` gives a Llama-2 SentencePiece vocabulary with byte
    fallback and the ``[INST]`` template (BOS added).  The same arguments
    always produce a byte-identical file.
    """
    out = pathlib.Path(path)
    shape = TinyLlamaShape()
    tok = _make_vocab(vocab)
    writer = gguf.GGUFWriter(out, "llama")
    try:
        _add_hparams(writer, shape, n_ctx, len(tok.tokens))
        _add_tokenizer(writer, tok)
        for name, tensor in _model_tensors(seed, shape, tok):
            writer.add_tensor(name, tensor)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return out
