"""A pure-Python reader of Hugging Face `tokenizer.json` BPE tokenizers, for counting tokens.

The Worker ships no third-party packages, so the edge cannot use `tokenizers`; this module
implements the subset `edgellm publish` writes (and most Llama-family models use): added /
special tokens split first; normalizers Sequence, Prepend, Replace, NFC/NFKC/NFD/NFKD,
Lowercase; pre-tokenizers Sequence, Digits, ByteLevel (GPT-2's regex, hand-rolled because
Python's `re` has no `\\p{L}`), Metaspace, Split on whitespace; a BPE model with merge ranks,
byte fallback and unknown-token fusing (the heap-based merge order of `tokenizers`); and the
TemplateProcessing post-processor (BOS/EOS). Tests hold its ids to `tokenizers` on a fuzzed
corpus. Anything else raises `UnsupportedTokenizer` and the edge routes without counting.
"""

from __future__ import annotations

import heapq
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable

# Unicode White_Space (what `\s` means in the regex engine `tokenizers` uses)
WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_CONTRACTIONS = ("re", "ve", "ll", "s", "t", "m", "d")


class UnsupportedTokenizer(ValueError):
    """The tokenizer.json uses a component this reader does not implement."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _kind(ch: str) -> str:
    if ch in WHITESPACE:
        return "s"
    cat = unicodedata.category(ch)
    return "L" if cat[0] == "L" else "N" if cat[0] == "N" else "o"


def gpt2_split(text: str) -> list[str]:
    """GPT-2's pre-tokenizer regex, `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`,
    as a scanner."""
    kinds = [_kind(c) for c in text]
    n, i, out = len(text), 0, []
    while i < n:
        if text[i] == "'":
            for c in _CONTRACTIONS:
                if text.startswith(c, i + 1):
                    out.append(text[i : i + 1 + len(c)])
                    i += 1 + len(c)
                    break
            else:
                c = None
            if c is not None:
                continue
        start = i
        if text[i] == " " and i + 1 < n and kinds[i + 1] != "s":
            i += 1
        kind = kinds[i]
        if kind != "s":
            j = i + 1
            while j < n and kinds[j] == kind:
                j += 1
            out.append(text[start:j])
            i = j
            continue
        j = i
        while j < n and kinds[j] == "s":
            j += 1
        if j == n or j - i == 1:
            out.append(text[i:j])
            i = j
        else:  # `\s+(?!\S)`: leave the last space to the word after it
            out.append(text[i : j - 1])
            i = j - 1
    return out


def _normalizer(spec: dict[str, Any] | None) -> Callable[[str], str]:
    if spec is None:
        return lambda s: s
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [_normalizer(s) for s in spec["normalizers"]]

        def run(s: str) -> str:
            for step in steps:
                s = step(s)
            return s

        return run
    if kind == "Prepend":
        prefix = spec["prepend"]
        return lambda s: prefix + s if s else s
    if kind == "Replace":
        pattern, content = spec["pattern"], spec["content"]
        if "String" in pattern:
            old = pattern["String"]
            return lambda s: s.replace(old, content)
        regex = re.compile(pattern["Regex"])
        return lambda s: regex.sub(content, s)
    if kind in ("NFC", "NFKC", "NFD", "NFKD"):
        return lambda s: unicodedata.normalize(kind, s)
    if kind == "Lowercase":
        return str.lower
    raise UnsupportedTokenizer(f"normalizer {kind!r}")


def _pre_tokenizer(spec: dict[str, Any] | None, byte_map: dict[int, str]) -> Callable[[list[str]], list[str]]:
    if spec is None:
        return lambda pieces: pieces
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [_pre_tokenizer(s, byte_map) for s in spec["pretokenizers"]]

        def run(pieces: list[str]) -> list[str]:
            for step in steps:
                pieces = step(pieces)
            return pieces

        return run
    if kind == "Digits":
        individual = spec.get("individual_digits", False)

        def digits(pieces: list[str]) -> list[str]:
            out = []
            for piece in pieces:
                out.extend(_split_digits(piece, individual))
            return out

        return digits
    if kind == "ByteLevel":
        prefix, use_regex = spec.get("add_prefix_space", False), spec.get("use_regex", True)

        def byte_level(pieces: list[str]) -> list[str]:
            out = []
            for piece in pieces:
                if prefix and piece and not piece.startswith(" "):
                    piece = " " + piece
                for part in gpt2_split(piece) if use_regex else [piece]:
                    out.append("".join(byte_map[b] for b in part.encode()))
            return out

        return byte_level
    if kind == "Metaspace":
        replacement = spec.get("replacement", "▁")
        scheme = spec.get("prepend_scheme", "always" if spec.get("add_prefix_space", True) else "never")
        split = spec.get("split", True)

        def metaspace(pieces: list[str]) -> list[str]:
            out = []
            for k, piece in enumerate(pieces):
                piece = piece.replace(" ", replacement)
                if scheme == "always" or (scheme == "first" and k == 0):
                    if not piece.startswith(replacement):
                        piece = replacement + piece
                if split:
                    out.extend(p for p in re.split(f"(?={re.escape(replacement)})", piece) if p)
                else:
                    out.append(piece)
            return out

        return metaspace
    raise UnsupportedTokenizer(f"pre-tokenizer {kind!r}")


def _split_digits(piece: str, individual: bool) -> list[str]:
    out, current, digit_run = [], "", None
    for ch in piece:
        is_digit = unicodedata.category(ch)[0] == "N"
        if is_digit and individual:
            if current:
                out.append(current)
            out.append(ch)
            current, digit_run = "", None
        elif current and digit_run is not None and digit_run != is_digit:
            out.append(current)
            current, digit_run = ch, is_digit
        else:
            current += ch
            digit_run = is_digit
    if current:
        out.append(current)
    return out


@dataclass
class Tokenizer:
    """`Tokenizer.from_json(obj).encode(text)` gives the ids `tokenizers` gives (with special
    tokens added by the post-processor); `count` is `len(encode(...))`."""

    vocab: dict[str, int]
    ranks: dict[tuple[int, int], tuple[int, int]]  # (left id, right id) -> (rank, merged id)
    added: dict[str, int]
    normalize: Callable[[str], str]
    pre_tokenize: Callable[[list[str]], list[str]]
    byte_fallback: bool = False
    unk_id: int | None = None
    fuse_unk: bool = False
    prefix_ids: tuple[int, ...] = ()
    suffix_ids: tuple[int, ...] = ()
    _added_re: re.Pattern[str] | None = None
    _cache: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, spec: dict[str, Any]) -> "Tokenizer":
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise UnsupportedTokenizer(f"model {model.get('type')!r} (only BPE)")
        if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("dropout"):
            raise UnsupportedTokenizer("BPE with subword prefixes, suffixes or dropout")
        vocab: dict[str, int] = dict(model["vocab"])
        ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(model.get("merges") or []):
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            if left in vocab and right in vocab and left + right in vocab:
                ranks.setdefault((vocab[left], vocab[right]), (rank, vocab[left + right]))
        added = {t["content"]: t["id"] for t in spec.get("added_tokens") or []}
        for t in spec.get("added_tokens") or []:
            if t.get("normalized") and not t.get("special"):
                raise UnsupportedTokenizer("normalized added tokens")
        prefix, suffix = _template(spec.get("post_processor"))
        unk = model.get("unk_token")
        tok = cls(vocab, ranks, added, _normalizer(spec.get("normalizer")), _pre_tokenizer(spec.get("pre_tokenizer"), bytes_to_unicode()),
                  bool(model.get("byte_fallback")), vocab.get(unk) if unk else None, bool(model.get("fuse_unk")), prefix, suffix)
        if added:
            tok._added_re = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)))
        return tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = list(self.prefix_ids) if add_special_tokens else []
        for segment, special in self._segments(text):
            if special is not None:
                ids.append(special)
                continue
            normalized = self.normalize(segment)
            for piece in self.pre_tokenize([normalized] if normalized else []):
                ids.extend(self._word(piece))
        if add_special_tokens:
            ids.extend(self.suffix_ids)
        return ids

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def _segments(self, text: str) -> list[tuple[str, int | None]]:
        if self._added_re is None:
            return [(text, None)]
        out: list[tuple[str, int | None]] = []
        position = 0
        for match in self._added_re.finditer(text):
            if match.start() > position:
                out.append((text[position : match.start()], None))
            out.append((match.group(), self.added[match.group()]))
            position = match.end()
        if position < len(text):
            out.append((text[position:], None))
        return out

    def _symbols(self, word: str) -> list[int]:
        symbols: list[int] = []
        unk_last = False
        for ch in word:
            token = self.vocab.get(ch)
            if token is not None:
                symbols.append(token)
                unk_last = False
                continue
            if self.byte_fallback:
                fallback = [self.vocab.get(f"<0x{b:02X}>") for b in ch.encode()]
                if all(f is not None for f in fallback):
                    symbols.extend(fallback)  # type: ignore[arg-type]
                    unk_last = False
                    continue
            if self.unk_id is None:
                continue  # `tokenizers` drops a character it cannot represent
            if not (self.fuse_unk and unk_last):
                symbols.append(self.unk_id)
            unk_last = True
        return symbols

    def _word(self, word: str) -> tuple[int, ...]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        ids = self._merge(self._symbols(word))
        if len(self._cache) < 100_000:
            self._cache[word] = ids
        return ids

    def _merge(self, symbols: list[int]) -> tuple[int, ...]:
        """`tokenizers`' Word::merge_all: repeatedly merge the lowest-ranked adjacent pair (the
        leftmost on ties), over a linked list with a heap of candidate merges."""
        n = len(symbols)
        if n < 2:
            return tuple(symbols)
        ids, alive = symbols[:], [True] * n
        prev, nxt = list(range(-1, n - 1)), list(range(1, n + 1))
        ranks = self.ranks
        heap = []
        for i in range(n - 1):
            merge = ranks.get((ids[i], ids[i + 1]))
            if merge is not None:
                heap.append((merge[0], i, merge[1]))
        heapq.heapify(heap)
        while heap:
            rank, pos, new_id = heapq.heappop(heap)
            if not alive[pos] or nxt[pos] >= n:
                continue
            right = nxt[pos]
            merge = ranks.get((ids[pos], ids[right]))
            if merge is None or merge[1] != new_id:
                continue
            ids[pos] = new_id
            alive[right] = False
            nxt[pos] = nxt[right]
            if nxt[pos] < n:
                prev[nxt[pos]] = pos
            if prev[pos] >= 0:
                merge = ranks.get((ids[prev[pos]], ids[pos]))
                if merge is not None:
                    heapq.heappush(heap, (merge[0], prev[pos], merge[1]))
            if nxt[pos] < n:
                merge = ranks.get((ids[pos], ids[nxt[pos]]))
                if merge is not None:
                    heapq.heappush(heap, (merge[0], pos, merge[1]))
        return tuple(ids[i] for i in range(n) if alive[i])


def _template(spec: dict[str, Any] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """TemplateProcessing's single template -> (ids before the text, ids after it)."""
    if spec is None or spec.get("type") in ("ByteLevel",):
        return (), ()
    if spec.get("type") == "Sequence":
        parts = [_template(p) for p in spec.get("processors") or []]
        return tuple(i for p in parts for i in p[0]), tuple(i for p in parts for i in p[1])
    if spec.get("type") != "TemplateProcessing":
        raise UnsupportedTokenizer(f"post-processor {spec.get('type')!r}")
    specials = spec.get("special_tokens") or {}
    before: list[int] = []
    after: list[int] = []
    seen_text = False
    for item in spec.get("single") or []:
        if "Sequence" in item:
            seen_text = True
        elif "SpecialToken" in item:
            ids = specials[item["SpecialToken"]["id"]]["ids"]
            (after if seen_text else before).extend(ids)
    return tuple(before), tuple(after)
