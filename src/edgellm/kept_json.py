"""A JSON answer encoded once and served again: the HITs of one stored cache entry.

A HIT's JSON body is the same bytes every time except for the fields that name the answer itself
(OpenAI's `id` and `created`, the first keys of its object). Rendering it anew meant replaying
the entry's events, building the dict and encoding it, per request: the largest part of a HIT
after the KV read. The first HIT of an entry renders it as every answer is rendered; what it
produced is kept with the entry (`Generation.rendered`, the decoded entry's memo) as the bytes
after those leading fields, and later HITs write the leading fields and append the rest. So a
kept body is byte-for-byte what rendering would give (a test holds it to that).

The body a HIT serves is a `KeptBytes`: it says where the kept rest begins, so whatever encodes
bodies after the core (the local edge's gzip, as Cloudflare's edge compresses) can encode that
rest once per entry and only the leading fields per answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .http import json_bytes


@dataclass(frozen=True)
class JSONShape:
    """How a route's JSON answer is kept: `name` tells the route's formats apart (part of the
    memo's key); `head` makes the `leading` fields, which differ per answer (none: no fields do)."""

    name: str
    leading: tuple[str, ...] = ()
    head: Callable[[], dict[str, Any]] | None = None

    def kept(self, data: dict[str, Any], encoded: bytes) -> "KeptJSON | None":
        return KeptJSON.of(data, encoded, self.leading)

    def fill(self, kept: "KeptJSON") -> bytes:
        return kept.fill(self.head() if self.head is not None else None)


@dataclass(frozen=True)
class KeptJSON:
    """An encoded answer: `leading` fields written per answer, then `rest` as it was encoded."""

    leading: tuple[str, ...]
    rest: bytes
    # what an encoder derived from `rest` (`KeptBytes`): kept with the entry, so it is the
    # tenant's own, bounded as the entries are, and gone when its entry is
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, data: dict[str, Any], encoded: bytes, leading: tuple[str, ...]) -> "KeptJSON | None":
        """The encoding `encoded` of `data` kept after its first `leading` keys; None if those
        are not the object's first keys, not plain names, or their encoding is not where it
        should be."""
        if not leading:
            return cls((), encoded)
        if tuple(data)[:len(leading)] != leading or len(data) == len(leading) or not all(map(_plain, leading)):
            return None
        head = json_bytes({name: data[name] for name in leading})[:-1] + b","  # `{"id":...,"created":N,`
        if not encoded.startswith(head):
            return None
        return cls(leading, encoded[len(head) - 1:])  # from the comma on

    def fill(self, head: dict[str, Any] | None) -> "KeptBytes":
        if not self.leading:
            return KeptBytes.of(b"", self)
        assert head is not None and tuple(head) == self.leading, "a kept answer's leading fields, in their order"
        return KeptBytes.of(_head_json(head), self)


class KeptBytes(bytes):
    """A HIT's body: `head_size` bytes of its own leading fields, then `kept.rest`, the same
    bytes on every HIT of the entry. A `bytes` to everything that reads it; an encoder that
    knows it may encode the rest once (`KeptJSON.derived`) and the leading fields per answer."""

    head_size: int
    kept: KeptJSON

    @classmethod
    def of(cls, head: bytes, kept: KeptJSON) -> "KeptBytes":
        body = cls(head + kept.rest)
        body.head_size, body.kept = len(head), kept
        return body


def _plain(text: str) -> bool:
    """Text the encoder writes as it is, between quotes: printable ASCII without `"` or `\\`."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _head_json(head: dict[str, Any]) -> bytes:
    """`json_bytes(head)` without its closing brace, for a head whose names are plain
    (`KeptJSON.of` keeps no other). Ids, object names and times are plain ASCII and whole
    numbers, written as the encoder writes them (a test holds it to that); anything else goes
    through the encoder. String methods (`_plain`), not a regular expression: every HIT writes it."""
    parts = []
    for name, value in head.items():
        kind = type(value)
        if kind is int:
            parts.append(f'"{name}":{value}')
        elif kind is str and _plain(value):
            parts.append(f'"{name}":"{value}"')
        else:
            return json_bytes(head)[:-1]
    return ("{" + ",".join(parts)).encode()
