"""`edgellm pull`: download a published model from an edge, verified and resumable.

Why it works the way it does:
- Every byte goes from the socket straight to its place in a preallocated `<file>.partial`
  (`pwrite` at its offset) and into an incremental SHA-256, so memory is bounded by
  `parallel x chunk_size` whatever the shard size. Writes and hashing run in a worker thread
  (hashlib releases the GIL), so the event loop keeps reading the other streams meanwhile.
- Shards are requested with `Range`, so a dropped connection continues from the last byte
  received, and a sidecar state file (`<file>.partial.state`) records verified shards and the
  bytes received of the others: a rerun rehashes those bytes from disk and never fetches them again.
- Failures are sorted once, in `_fetch_once`: 5xx, 429 and transport errors are transient
  (bounded retries with backoff, `Retry-After` honoured); a shard whose SHA-256 or size is wrong
  is corrupt (reported, discarded and fetched again, a bounded number of times); anything else
  is a `PullError` with a message for the user.
- The HTTP client is injected (an `httpx.AsyncClient`), so tests inject faults with
  `httpx.MockTransport`, as the edge's own bindings are faked only at their seam.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TextIO

import httpx

from .manifest import Manifest, ManifestError, Shard
from .progress import MB, Progress
from .streaming_transport import StreamingTransport
from .resume import (
    ResumeState,
    RetryPolicy,
    parse_content_range,
    parse_retry_after,
    range_header,
    write_atomic,
)

CHUNK_SIZE = 1 << 20
Buffer = bytes | bytearray | memoryview
MAX_MANIFEST_BYTES = 16 << 20
STATE_SAVE_INTERVAL = 1.0


class PullError(Exception):
    """The pull cannot finish; the message says why (shown to the user as is)."""


class _Transient(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, progressed: bool = False) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.progressed = progressed


class _Corrupt(Exception):
    pass


@dataclass
class _Target:
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


@dataclass(frozen=True)
class PullResult:
    path: Path
    size: int
    fetched: int
    reused: int
    shards: int
    shards_reused: int
    seconds: float

    def summary(self) -> str:
        rate = self.fetched / self.seconds / MB if self.seconds > 0 else 0.0
        return (
            f"pulled {self.path}: {self.size:,} bytes, {self.fetched:,} fetched in {self.seconds:.2f} s "
            f"({rate:.1f} MB/s), {self.shards_reused}/{self.shards} shards reused"
        )


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


def _preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size) if size else None
    except OSError:  # filesystems without fallocate: a sparse file of the right size will do
        pass
    os.ftruncate(fd, size)


class Downloader:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        parallel: int = 4,
        chunk_size: int = CHUNK_SIZE,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        stderr: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        show_progress: bool = True,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.client = client
        self.parallel = parallel
        self.chunk_size = chunk_size
        self.retry = retry
        self.sleep = sleep
        self.rand = rand
        self.stderr = stderr or sys.stderr  # looked up now, not at import: it may be redirected
        self.clock = clock
        self.show_progress = show_progress

    async def pull(self, base_url: str, name: str, out: Path) -> PullResult:
        root = f"{base_url.rstrip('/')}/models/{name}/"
        raw = await self._retrying("manifest.json", lambda: self._get_small(root + "manifest.json"))
        try:
            manifest = Manifest.parse(raw)
        except ManifestError as exc:
            raise PullError(f"{root}manifest.json: {exc}") from None
        if manifest.name != name:
            raise PullError(f"{root}manifest.json describes {manifest.name!r}, not {name!r}")
        out.mkdir(parents=True, exist_ok=True)
        for file in manifest.files:
            await self._pull_file(root, file.path, file.size, file.sha256, out)
        result = await _ModelPull(self, root, manifest, out).run()
        write_atomic(out / "manifest.json", raw)  # last: its presence means the pull completed
        return result

    def say(self, message: str) -> None:
        self.stderr.write(f"edgellm pull: {message}\n")
        self.stderr.flush()

    async def _pull_file(self, root: str, path: str, size: int, sha256: str, out: Path) -> None:
        final = out / path
        if await _file_matches(final, size, sha256):
            return
        partial = out / (path + ".partial")
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _preallocate(fd, size)
            await self.fetch(_Target(path, root + path, fd, 0, size, sha256))
        finally:
            os.close(fd)
        os.replace(partial, final)

    async def fetch(self, t: _Target, on_bytes: Callable[[_Target, int], None] = lambda t, n: None) -> None:
        """Fetch `t` until its bytes are complete and match its SHA-256."""
        while True:
            try:
                if t.received < t.size or t.size == 0:
                    await self._retrying(t.label, lambda: self._fetch_once(t, on_bytes))
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

    async def _retrying(self, label: str, once: Callable[[], Awaitable[Any]]) -> Any:
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

    async def _get_small(self, url: str) -> bytes:
        try:
            async with self.client.stream("GET", url) as resp:
                await self._check_status(resp)
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_MANIFEST_BYTES:
                        raise PullError(f"{url} is larger than {MAX_MANIFEST_BYTES} bytes; not a manifest")
                return bytes(body)
        except httpx.TransportError as exc:
            raise _Transient(_describe(exc)) from None

    async def _fetch_once(self, t: _Target, on_bytes: Callable[[_Target, int], None]) -> None:
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

    async def _receive(self, resp: httpx.Response, t: _Target, on_bytes: Callable[[_Target, int], None]) -> None:
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
        finally:
            if pieces:  # bytes that did arrive are kept, even when the stream broke or we were cancelled
                size = _write_and_hash(t.fd, pieces, t.base + t.received, t.hasher)
                t.received += size
                on_bytes(t, size)


class _ModelPull:
    """One model download into `<file>.partial`: resume state, workers, whole-file check."""

    def __init__(self, dl: Downloader, root: str, manifest: Manifest, out: Path) -> None:
        self.dl, self.root, self.manifest = dl, root, manifest
        self.final = out / manifest.model.file
        self.partial = out / (manifest.model.file + ".partial")
        self.state_path = out / (manifest.model.file + ".partial.state")
        self.state = ResumeState(manifest.model.sha256)
        self.targets: list[_Target] = []
        self.progress = Progress(
            manifest.model.size,
            len(manifest.shards),
            dl.stderr,
            is_tty=dl.stderr.isatty() if dl.show_progress else False,
            clock=dl.clock,
            log_interval=5.0 if dl.show_progress else float("inf"),
        )
        self.whole_next = 0
        self.whole_hasher: Any = hashlib.sha256()
        self.whole_ready = asyncio.Event()
        self.last_save = dl.clock()
        self.reused_shards = 0

    async def run(self) -> PullResult:
        model = self.manifest.model
        if await _file_matches(self.final, model.size, model.sha256):
            self.progress.reused(model.size, len(self.manifest.shards))
            self.reused_shards = len(self.manifest.shards)
            return self._result()
        if self.partial.exists():
            self.state = ResumeState.load(self.state_path, self.manifest)
        fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _preallocate(fd, model.size)
            await self._plan(fd)
            await self._download(fd)
        except BaseException:
            self.state.received = {t.index: t.received for t in self.targets if t.index not in self.state.verified and t.received}
            self.state.save(self.state_path)
            raise
        finally:
            os.close(fd)
        if self.whole_hasher.hexdigest() != model.sha256:
            self.partial.unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
            raise PullError(f"{self.manifest.name}: every shard matched but the whole file's sha256 does not match the manifest; the manifest is inconsistent")
        os.replace(self.partial, self.final)
        self.state_path.unlink(missing_ok=True)
        if self.dl.show_progress:
            self.progress.finish()
        return self._result()

    def _result(self) -> PullResult:
        p = self.progress
        return PullResult(self.final, p.total, p.fetched, p.reused_bytes, p.shards, self.reused_shards, p.seconds)

    async def _download(self, fd: int) -> None:
        queue = deque(self.targets)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._hash_whole_file(fd))
                for _ in range(min(self.dl.parallel, len(queue))):
                    group.create_task(self._work(queue))
        except BaseExceptionGroup as failures:  # the first failure is the one to report
            raise _first_leaf(failures) from None

    async def _plan(self, fd: int) -> None:
        """Targets for the shards still missing; bytes already on disk are rehashed, not refetched."""
        reused = set(self.state.verified)
        for shard in self.manifest.shards:
            if shard.index in reused:
                self.progress.reused(shard.size)
                continue
            target = _Target(f"shard {shard.index} ({shard.path})", self.root + shard.path, fd, shard.offset, shard.size, shard.sha256, shard.index)
            have = self.state.received.get(shard.index, 0)
            if have:
                target.hasher = await asyncio.to_thread(hash_range, fd, shard.offset, have, hashlib.sha256())
                target.received = have
                self.progress.reused(have, shards=0)
            self.targets.append(target)
        self.reused_shards = len(reused)

    async def _work(self, queue: deque[_Target]) -> None:
        while queue:
            target = queue.popleft()
            await self.dl.fetch(target, self._on_bytes)
            self.state.verified.add(target.index)  # type: ignore[arg-type]
            self.state.received.pop(target.index, None)  # type: ignore[arg-type]
            self.state.save(self.state_path)
            self.progress.shard_verified()
            self.whole_ready.set()

    def _on_bytes(self, target: _Target, size: int) -> None:
        if size >= 0:
            self.progress.advance(size)
        else:
            self.progress.rewind(-size)
        self.state.received[target.index] = target.received  # type: ignore[index]
        now = self.dl.clock()
        if now - self.last_save >= STATE_SAVE_INTERVAL:
            self.last_save = now
            self.state.save(self.state_path)

    async def _hash_whole_file(self, fd: int) -> None:
        """Hash the file in shard order as shards are verified, overlapping with the download,
        so the final whole-file check costs little more than the last shards' hashing."""
        shards: tuple[Shard, ...] = self.manifest.shards
        while self.whole_next < len(shards):
            while self.whole_next < len(shards) and shards[self.whole_next].index in self.state.verified:
                shard = shards[self.whole_next]
                await asyncio.to_thread(hash_range, fd, shard.offset, shard.size, self.whole_hasher)
                self.whole_next += 1
            if self.whole_next < len(shards):
                self.whole_ready.clear()
                await self.whole_ready.wait()


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _file_matches(path: Path, size: int, sha256: str) -> bool:
    """A complete file from an earlier pull is reused when its size and SHA-256 match."""
    try:
        if path.stat().st_size != size:
            return False
    except OSError:
        return False

    def digest() -> str:
        fd = os.open(path, os.O_RDONLY)
        try:
            return hash_range(fd, 0, size, hashlib.sha256()).hexdigest()
        finally:
            os.close(fd)

    return await asyncio.to_thread(digest) == sha256


def _describe(exc: httpx.TransportError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def make_client(parallel: int) -> httpx.AsyncClient:
    # identity: a compressed body would not line up with byte ranges and shard sizes
    return httpx.AsyncClient(
        transport=StreamingTransport(),
        timeout=httpx.Timeout(60.0, connect=15.0),
        headers={"Accept-Encoding": "identity", "User-Agent": "edgellm-pull"},
        follow_redirects=True,
    )


async def pull(base_url: str, name: str, out: Path, parallel: int = 4, **options: Any) -> PullResult:
    async with make_client(parallel) as client:
        return await Downloader(client, parallel=parallel, **options).pull(base_url, name, out)


def run(args: Any) -> int:
    """The `edgellm pull` command: 0 on success, 1 when the pull fails, 130 when interrupted."""
    try:
        result = asyncio.run(pull(args.base_url, args.name, Path(args.out), parallel=args.parallel))
    except PullError as exc:
        print(f"edgellm pull: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nedgellm pull: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(result.summary(), file=sys.stderr)
    return 0
