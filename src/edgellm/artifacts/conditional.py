"""HTTP range and conditional-request logic (RFC 9110 sections 13 and 14) as pure functions.

Choices where the RFC leaves room:
- A malformed `Range` (or another unit) is ignored: the full 200 is served, as RFC 9110 14.2 says.
- Several ranges are also answered with the full 200 (allowed by 14.2; a multipart/byteranges
  body buys a model loader nothing, and pull tools ask for one range at a time).
- `If-Range` with a date is treated as a mismatch (full 200): these responses carry no
  `Last-Modified` to compare it with, and serving the whole entity is always safe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ErrorKind, GatewayError

_RANGE = re.compile(r"\s*bytes\s*=\s*(.*)", re.IGNORECASE | re.DOTALL)
_SPEC = re.compile(r"(\d*)-(\d*)")
_ETAG = re.compile(r'\s*(W/)?("[^"]*")\s*(?:,|$)')
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_BARE_ETAG = re.compile(r'\s*(W/)?("[^"]*"|[^\s",]+)\s*(?:,|$)')  # R2's `onlyIf` also takes unquoted tags


@dataclass(frozen=True)
class ByteRange:
    """Inclusive first and last byte positions, already within the representation."""

    first: int
    last: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    def content_range(self, size: int) -> str:
        return f"bytes {self.first}-{self.last}/{size}"


def unsatisfiable(size: int) -> GatewayError:
    return GatewayError(
        ErrorKind.RANGE_NOT_SATISFIABLE,
        f"The requested range is not satisfiable; the representation is {size} bytes.",
        param="range",
        code="range_not_satisfiable",
        headers={"content-range": f"bytes */{size}"},
    )


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The single byte range `header` asks for within `size` bytes.

    None means "serve the whole representation" (no header, malformed, another unit, or several
    ranges); an unsatisfiable single range raises the 416 `GatewayError` with `bytes */size`.
    """
    if header is None:
        return None
    match = _RANGE.fullmatch(header)
    if not match:
        return None
    specs = [s.strip() for s in match.group(1).split(",")]
    if len(specs) != 1:
        return None
    spec = _SPEC.fullmatch(specs[0])
    if not spec or spec.group(0) == "-":
        return None
    first, last = spec.group(1), spec.group(2)
    if first == "":  # suffix: the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise unsatisfiable(size)
        return ByteRange(max(size - n, 0), size - 1)
    start = int(first)
    if last != "" and int(last) < start:
        return None  # an invalid range-spec makes the whole header invalid: ignore it
    if start >= size:
        raise unsatisfiable(size)
    end = size - 1 if last == "" else min(int(last), size - 1)
    return ByteRange(start, end)


def range_header(offset: int | None = None, length: int | None = None, suffix: int | None = None) -> str:
    """The `Range` value asking for what an `R2Range` asks R2 for: `length` bytes from `offset`
    (to the end without a length), or the last `suffix` bytes."""
    if suffix is not None:
        return f"bytes=-{suffix}"
    first = offset or 0
    return f"bytes={first}-" if length is None else f"bytes={first}-{first + length - 1}"


def parse_content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """(first, last, total) of `Content-Range: bytes first-last/total`; total None for `*`;
    None when `value` is absent or not that form (an unsatisfied `bytes */size` included)."""
    match = _CONTENT_RANGE.fullmatch((value or "").strip())
    if not match:
        return None
    first, last, total = match.groups()
    return int(first), int(last), None if total == "*" else int(total)


def parse_etags(header: str, *, bare: bool = False) -> list[tuple[bool, str]] | None:
    """The `(weak, '"tag"')` pairs of an ETag list (`*` is `[(False, "*")]`); None if malformed.

    `bare` also accepts unquoted tags (R2's `onlyIf` does), returned quoted like the rest."""
    if header.strip() == "*":
        return [(False, "*")]
    pattern = _BARE_ETAG if bare else _ETAG
    tags: list[tuple[bool, str]] = []
    pos = 0
    while pos < len(header):
        if not header[pos:].strip():
            break
        match = pattern.match(header, pos)
        if not match:
            return None
        tag = match.group(2)
        tags.append((bool(match.group(1)), tag if tag.startswith('"') else f'"{tag}"'))
        pos = match.end()
    return tags or None


def etag_listed(header: str, etag: str, *, bare: bool = False) -> bool:
    """True when the ETag list `header` is `*` or names the quoted `etag` under the weak
    comparison (RFC 9110 8.8.3.2: `W/` is ignored). A malformed list names nothing."""
    tags = parse_etags(header, bare=bare)
    return tags is not None and any(tag in (etag, "*") for _weak, tag in tags)


def none_match(header: str | None, etag: str) -> bool:
    """True when `If-None-Match` matches the current quoted `etag` (weak comparison), i.e. the
    client's copy is current and the answer is 304."""
    return header is not None and etag_listed(header, etag)


def range_applies(if_range: str | None, etag: str) -> bool:
    """True when the Range header should be honoured: no `If-Range`, or one whose ETag is a
    strong match for the current quoted `etag`."""
    if if_range is None:
        return True
    value = if_range.strip()
    if value.startswith("W/") or not (value.startswith('"') and value.endswith('"')):
        return False  # weak tags never match strongly; a date has nothing to match here
    return value == etag
