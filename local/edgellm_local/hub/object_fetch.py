"""Fetching one object into its place in an open file, verified, with retries.

Every byte goes from the socket straight to its offset in the file (`pwritev`) and into an
incremental SHA-256, in batches of about `chunk_size` handled by a worker thread (hashlib releases
the GIL), so memory per stream is bounded whatever the object's size, and the event loop keeps
receiving other streams meanwhile. Failures are sorted once, in `_fetch_once`:
- 5xx, 429 and transport errors are transient: bounded retries with backoff and jitter, and the
  server's `Retry-After`; a retry asks with `Range` for the bytes still missing;
- a wrong size or SHA-256 is corruption: reported, discarded and fetched again, a bounded number
  of times;
- anything else (404, other 4xx) is a `PullError` with a message for the user.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TextIO

import httpx

from edgellm_local.hub.resume import RetryPolicy, parse_content_range, parse_retry_after, range_header

CHUNK_SIZE = 1 << 20
MAX_SMALL_BYTES = 16 << 20
Buffer = bytes | bytearray | memoryview
OnBytes = Callable[["FetchTarget", int], None]


class PullError(Exception):
    """The pull cannot finish; the message says why (shown to the user as is)."""


@dataclass
class RateLimit:
    """`--limit-rate`: at most `bytes_per_second` over all streams together, with a burst of
    `burst` seconds' worth. A stream that is over its share sleeps before reading on, and while it
    sleeps its socket buffer fills and TCP slows the sender down: nothing piles up in memory."""

    bytes_per_second: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    burst: float = 0.25
    _next_free: float = field(default=float("-inf"), init=False)

    async def take(self, size: int) -> None:
        now = self.clock()
        self._next_free = max(self._next_free, now) + size / self.bytes_per_second
        delay = self._next_free - now - self.burst
        if delay > 0:
            await self.sleep(delay)


class _Transient(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, progressed: bool = False) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.progressed = progressed


class _Corrupt(Exception):
    pass


@dataclass
class FetchTarget:
    """One object being written into an open file: a model shard or a whole tokenizer file."""

    label: str
    url: str
    fd: int
    base: int  # where the object's first byte goes in the file
    size: int
    sha256: str
    index: int | None = None
    received: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)
    corrupt: int = 0


def hash_range(fd: int, offset: int, length: int, hasher: Any, chunk_size: int = CHUNK_SIZE) -> Any:
    """Feed `length` bytes of the file at `offset` into `hasher` (from disk, in chunks)."""
    end = offset + length
    while offset < end:
        data = os.pread(fd, min(chunk_size, end - offset), offset)
        if not data:
            raise PullError(f"the partial file is shorter than expected at byte {offset}")
        hasher.update(data)
        offset += len(data)
    return hasher


def _write_and_hash(fd: int, pieces: list[Buffer], offset: int, hasher: Any) -> int:
    """Write `pieces` at `offset` in one call and hash them; the caller never joins them."""
    size = sum(len(p) for p in pieces)
    written = os.pwritev(fd, pieces, offset)
    if written < size:  # a short write (rare: signals, odd filesystems): finish it piece by piece
        rest = memoryview(b"".join(bytes(p) for p in pieces))[written:]
        while rest:
            n = os.pwrite(fd, rest, offset + written)
            rest, written = rest[n:], written + n
    for piece in pieces:
        hasher.update(piece)
    return size


class Fetcher:
    """Fetches `FetchTarget`s through an injected `httpx.AsyncClient` (tests pass one built on
    `httpx.MockTransport` to inject faults; `sleep` and `rand` make backoff observable)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        chunk_size: int = CHUNK_SIZE,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        stderr: TextIO | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.client = client
        self.rate_limit = rate_limit
        self.chunk_size = chunk_size
        self.retry = retry
        self.sleep = sleep
        self.rand = rand
        self.stderr = stderr or sys.stderr  # looked up now, not at import: it may be redirected

    def say(self, message: str) -> None:
        self.stderr.write(f"edgellm pull: {message}\n")
        self.stderr.flush()

    async def fetch(self, t: FetchTarget, on_bytes: OnBytes = lambda t, n: None) -> None:
        """Fetch `t` until its bytes are complete and match its SHA-256."""
        while True:
            try:
                if t.received < t.size or t.size == 0:
                    await self.retrying(t.label, lambda: self._fetch_once(t, on_bytes))
                digest = t.hasher.hexdigest()
                if digest == t.sha256:
                    return
                reason = f"sha256 is {digest}, the manifest says {t.sha256}"
            except _Corrupt as exc:
                reason = str(exc)
            t.corrupt += 1
            discarded, t.received, t.hasher = t.received, 0, hashlib.sha256()
            on_bytes(t, -discarded)  # its bytes on disk are worthless now, also for a rerun
            if t.corrupt >= self.retry.corrupt_attempts:
                raise PullError(f"{t.label} is corrupt on the server ({reason}) after {t.corrupt} downloads; republish the model")
            self.say(f"{t.label} is corrupt ({reason}); discarding it and fetching it again")

    async def retrying(self, label: str, once: Callable[[], Awaitable[Any]]) -> Any:
        attempt = 0
        while True:
            try:
                return await once()
            except _Transient as exc:
                attempt = 1 if exc.progressed else attempt + 1
                if attempt >= self.retry.attempts:
                    raise PullError(f"{label}: giving up after {attempt} failed attempts; last: {exc}") from None
                delay = self.retry.delay(attempt, exc.retry_after, self.rand())
                self.say(f"{label}: {exc}; retrying in {delay:.1f} s")
                await self.sleep(delay)

    async def _check_status(self, resp: httpx.Response) -> None:
        status = resp.status_code
        if status == 429 or status >= 500:
            raise _Transient(f"HTTP {status}", parse_retry_after(resp.headers.get("retry-after"), time.time()))
        if status == 416:
            raise _Corrupt(f"the server's object is smaller than the manifest says ({resp.headers.get('content-range')})")
        if status == 404:
            raise PullError(f"{resp.request.url}: not found (HTTP 404); is the model published on this edge?")
        if status not in (200, 206):
            detail = b""
            async for chunk in resp.aiter_bytes():
                detail += chunk
                if len(detail) > 500:
                    break
            raise PullError(f"{resp.request.url}: HTTP {status} {detail[:500].decode(errors='replace')}".rstrip())

    async def get_small(self, url: str, first_contact: bool = False) -> bytes:
        """A small object read whole. On `first_contact` (the manifest) a refused or unresolvable
        connection is a `PullError` at once: nothing is listening there, and retrying for seconds
        would only hide a wrong URL or a stopped edge."""
        try:
            async with self.client.stream("GET", url) as resp:
                await self._check_status(resp)
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_SMALL_BYTES:
                        raise PullError(f"{url} is larger than {MAX_SMALL_BYTES} bytes")
                return bytes(body)
        except httpx.ConnectError as exc:
            if first_contact:
                raise PullError(f"cannot reach the edge: {exc}; is it running, and is the URL right?") from None
            raise _Transient(_describe(exc)) from None
        except httpx.TransportError as exc:
            raise _Transient(_describe(exc)) from None

    async def _fetch_once(self, t: FetchTarget, on_bytes: OnBytes) -> None:
        start = t.received
        headers = {"Range": range_header(t.received, t.size)} if t.size else {}
        if t.corrupt:
            headers["Cache-Control"] = "no-cache"  # a cache in front of R2 may hold the bad copy
        try:
            async with self.client.stream("GET", t.url, headers=headers) as resp:
                await self._check_status(resp)
                if resp.status_code == 206:
                    span = parse_content_range(resp.headers.get("content-range"))
                    if span is None or span[0] != t.received:
                        raise _Transient(f"unexpected Content-Range {resp.headers.get('content-range')!r}")
                    if span[2] is not None and span[2] != t.size:
                        raise _Corrupt(f"the server's object has {span[2]} bytes, the manifest says {t.size}")
                else:  # 200: the whole object, whatever we asked for
                    length = resp.headers.get("content-length")
                    if length is not None and length.isdigit() and int(length) != t.size:
                        raise _Corrupt(f"the server's object has {length} bytes, the manifest says {t.size}")
                    if t.received:  # the server ignored our Range: take the object from its start
                        discarded, t.received, t.hasher, start = t.received, 0, hashlib.sha256(), 0
                        on_bytes(t, -discarded)
                await self._receive(resp, t, on_bytes)
        except httpx.TransportError as exc:
            raise _Transient(_describe(exc), progressed=t.received > start) from None
        if t.received < t.size:
            got = t.received - start
            raise _Transient(f"connection closed after {got:,} of {t.size - start:,} bytes", progressed=got > 0)

    async def _receive(self, resp: httpx.Response, t: FetchTarget, on_bytes: OnBytes) -> None:
        """Stream the body to disk in batches of about `chunk_size`, written and hashed in a
        worker thread while the event loop keeps receiving the other shards."""
        pieces: list[Buffer] = []
        pending = 0
        try:
            async for chunk in resp.aiter_bytes():
                room = t.size - t.received - pending
                if len(chunk) > room:
                    pieces.append(chunk[:room])
                    pending += room
                    raise _Corrupt(f"the server sent more than the manifest's {t.size} bytes")
                pieces.append(chunk)
                pending += len(chunk)
                if pending >= self.chunk_size:
                    batch, pieces, pending = pieces, [], 0
                    size = await asyncio.to_thread(_write_and_hash, t.fd, batch, t.base + t.received, t.hasher)
                    t.received += size
                    on_bytes(t, size)
                    if self.rate_limit is not None:
                        await self.rate_limit.take(size)
            if pieces and self.rate_limit is not None:  # a shard smaller than a batch is limited too
                batch, pieces, pending = pieces, [], 0
                size = _write_and_hash(t.fd, batch, t.base + t.received, t.hasher)
                t.received += size
                on_bytes(t, size)
                await self.rate_limit.take(size)
        finally:
            if pieces:  # bytes that did arrive are kept, even when the stream broke or we were cancelled
                size = _write_and_hash(t.fd, pieces, t.base + t.received, t.hasher)
                t.received += size
                on_bytes(t, size)


def _describe(exc: httpx.TransportError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


