"""R2 on the local disk: objects as files, metadata in one SQLite table.

It behaves like the real bucket where the core can tell the difference: MD5 ETags (single-part
uploads), a failed `only_if` returns the object without a body, a miss returns None, ranges
follow R2's `{offset, length}` / `{suffix}` rules, keys are at most 1024 UTF-8 bytes, and a
given SHA-256 is checked before anything becomes visible. Like R2, the SHA-256 checksum is
only reported when the uploader supplied it.

Every version of an object is its own file (`data/<random hex>`) and the SQLite row is the
commit point: a put streams into a temp file, renames it into place, then swaps the row, so a
reader that already opened the old version keeps reading consistent bytes while a new one lands.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import json
import os
import secrets
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, BinaryIO

from edgellm.artifacts.conditional import etag_listed
from edgellm.ports import BindingError, Clock, R2Conditional, R2Object, R2Range
from edgellm.deps import SystemClock

MAX_KEY_BYTES = 1024
MAX_LIST_LIMIT = 1000
# Measured (bench.bench_artifacts, edge CPU per GiB served): 64 KiB chunks cost ~16k trips through
# the ASGI send path per GiB; 1 MiB chunks cut the edge's CPU per GiB several times over, and a
# connection still holds at most a chunk or two (uvicorn's write buffer pauses the body).
CHUNK_SIZE = 1024 * 1024


def check_key(key: str) -> None:
    size = len(key.encode())
    if size == 0:
        raise BindingError("R2 operation failed: 400 The key must not be empty. (10020)")
    if size > MAX_KEY_BYTES:
        raise BindingError(f"R2 operation failed: 414 The key is {size} bytes long; the limit is {MAX_KEY_BYTES}. (10020)")


def _etag_in(etag: str, header: str) -> bool:
    return etag_listed(header, f'"{etag}"', bare=True)


def precondition_holds(obj: R2Object, cond: R2Conditional | None) -> bool:
    """R2's `onlyIf`, with RFC 9110's precedence: when an ETag condition is given, the
    matching date condition is not consulted."""
    if cond is None:
        return True
    if cond.etag_matches is not None:
        if not _etag_in(obj.etag, cond.etag_matches):
            return False
    elif cond.uploaded_before is not None and not obj.uploaded < cond.uploaded_before:
        return False
    if cond.etag_does_not_match is not None:
        if _etag_in(obj.etag, cond.etag_does_not_match):
            return False
    elif cond.uploaded_after is not None and not obj.uploaded > cond.uploaded_after:
        return False
    return True


def resolve_range(size: int, rng: R2Range | None) -> tuple[int, int] | None:
    """(offset, length) that R2 would return for `rng`, or raise as R2 does when it is invalid."""
    if rng is None:
        return None
    if rng.suffix is not None:
        if rng.offset is not None or rng.length is not None:
            raise BindingError("R2 get failed: 400 Suffix is incompatible with offset and length. (10039)")
        if rng.suffix < 0:
            raise BindingError("R2 get failed: 400 The suffix must not be negative. (10039)")
        length = min(rng.suffix, size)
        return size - length, length
    offset = rng.offset or 0
    if offset < 0 or (rng.length is not None and rng.length < 0):
        raise BindingError("R2 get failed: 400 Range offset and length must not be negative. (10039)")
    if offset > size:
        raise BindingError("R2 get failed: 416 The requested range is not satisfiable. (10039)")
    length = size - offset if rng.length is None else min(rng.length, size - offset)
    return offset, length


class FileBody:
    """An object's bytes read from an already open file in chunks: a 4 GB shard never sits in
    memory. A chunk the page cache holds is read on the event loop without blocking (Linux's
    `preadv2(RWF_NOWAIT)`: it returns what is cached, or EAGAIN): a thread hop per chunk cost
    the edge ~50% more CPU per GiB. A chunk that would wait on the disk is read on a worker
    thread, so the loop goes on serving other requests meanwhile. The file is closed at the end,
    on `aclose()`, or when collected; never under a read still running on its thread (a request
    cancelled mid-read has its file closed on a thread, once that read lets go of the lock)."""

    def __init__(self, file: BinaryIO, length: int, chunk_size: int = CHUNK_SIZE) -> None:
        self._file: BinaryIO | None = file
        self._offset = file.tell()
        self._left = length
        self._chunk_size = chunk_size
        self._nowait = hasattr(os, "preadv") and hasattr(os, "RWF_NOWAIT")
        self._lock = threading.Lock()  # held by a read on its thread, and by the close

    def __aiter__(self) -> "FileBody":
        return self

    def _read_cached(self, size: int) -> bytes | None:
        """Up to `size` bytes if the page cache holds them, without blocking; None if not."""
        assert self._file is not None
        buffer = bytearray(size)
        try:
            got = os.preadv(self._file.fileno(), [buffer], self._offset, os.RWF_NOWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            self._nowait = False  # a file system without RWF_NOWAIT: every read on a thread
            return None
        return bytes(memoryview(buffer)[:got])

    def _read(self, size: int, offset: int) -> bytes:
        with self._lock:
            return b"" if self._file is None or self._file.closed else os.pread(self._file.fileno(), size, offset)

    @property
    def remaining(self) -> int:
        """Bytes of the range not yet read."""
        return 0 if self._file is None or self._file.closed else self._left

    def sendfile_to(self, sock_fd: int, count: int, stop: threading.Event, stall_timeout: float) -> int:
        """Send the next `count` bytes to a socket with sendfile(2) (on a worker thread, for
        zero_copy.py), holding the lock, so the file is not closed under it."""
        from edgellm_local.emulator.zero_copy import send_file_blocking

        with self._lock:
            if self._file is None or self._file.closed:
                return 0
            sent = send_file_blocking(sock_fd, self._file.fileno(), self._offset, min(count, self._left), stop, stall_timeout)
            self._offset += sent
            self._left -= sent
            return sent

    def _close_file(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()

    async def __anext__(self) -> bytes:
        if self._file is None or self._file.closed or self._left <= 0:
            await self.aclose()
            raise StopAsyncIteration
        size = min(self._chunk_size, self._left)
        chunk = self._read_cached(size) if self._nowait else None
        if chunk is None:
            chunk = await asyncio.get_running_loop().run_in_executor(None, self._read, size, self._offset)
        if not chunk:
            await self.aclose()
            raise StopAsyncIteration
        self._offset += len(chunk)
        self._left -= len(chunk)
        return chunk

    async def aclose(self) -> None:
        if self._file is None or self._file.closed:
            return
        self._left = 0
        if self._lock.acquire(blocking=False):
            try:
                self._file.close()
            finally:
                self._lock.release()
        else:  # a read is running on its thread: close after it, without blocking the loop
            asyncio.get_running_loop().run_in_executor(None, self._close_file)

    def __del__(self) -> None:
        # a read running on a thread holds a reference to this body, so none is running here
        if self._file is not None:
            self._file.close()


async def _chunks(data: bytes | bytearray | memoryview | str | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
        return
    async for chunk in data:
        yield bytes(chunk)


_COLUMNS = "key, file, size, etag, uploaded, http_metadata, custom_metadata, checksum_sha256"


@dataclass
class FileR2:
    """An R2 bucket under `root` (`root/data/` holds the bytes, `root/index.sqlite3` the rest)."""

    root: Path
    clock: Clock = field(default_factory=SystemClock)
    chunk_size: int = CHUNK_SIZE
    _db: sqlite3.Connection = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.root / "index.sqlite3"), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS objects (key TEXT PRIMARY KEY, file TEXT NOT NULL, size INTEGER NOT NULL, "
            "etag TEXT NOT NULL, uploaded REAL NOT NULL, http_metadata TEXT NOT NULL, custom_metadata TEXT NOT NULL, "
            "checksum_sha256 TEXT)"
        )

    def close(self) -> None:
        self._db.close()

    # --- reads ----------------------------------------------------------------------------

    def _row(self, key: str) -> tuple[Any, ...] | None:
        with self._lock:
            return self._db.execute(f"SELECT {_COLUMNS} FROM objects WHERE key = ?", (key,)).fetchone()

    @staticmethod
    def _object(row: tuple[Any, ...]) -> R2Object:
        key, _file, size, etag, uploaded, http_meta, custom_meta, checksum = row
        return R2Object(
            key=key, size=size, etag=etag, uploaded=uploaded, http_metadata=json.loads(http_meta),
            custom_metadata=json.loads(custom_meta), checksum_sha256=checksum,
        )

    async def head(self, key: str) -> R2Object | None:
        check_key(key)
        row = self._row(key)
        return None if row is None else self._object(row)

    async def get(
        self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None
    ) -> R2Object | None:
        check_key(key)
        while True:
            row = self._row(key)
            if row is None:
                return None
            obj = self._object(row)
            if not precondition_holds(obj, only_if):
                return obj
            span = resolve_range(obj.size, range)
            offset, length = span or (0, obj.size)
            try:
                file = open(self.root / "data" / row[1], "rb")
            except FileNotFoundError:
                continue  # replaced between the row read and the open: read the new version
            file.seek(offset)
            obj.range = span
            obj.body = FileBody(file, length, self.chunk_size)
            return obj

    async def list(
        self, prefix: str = "", *, cursor: str | None = None, limit: int = MAX_LIST_LIMIT, delimiter: str | None = None
    ) -> dict[str, Any]:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise BindingError(f"R2 list failed: 400 limit must be between 1 and {MAX_LIST_LIMIT}. (10022)")
        after, skip_prefix = _decode_cursor(cursor)
        objects: list[R2Object] = []
        prefixes: list[str] = []
        last: tuple[str, bool] | None = None
        truncated = False
        while not truncated:
            with self._lock:
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM objects WHERE key > ? AND substr(key, 1, ?) = ? ORDER BY key LIMIT 1000",
                    (after, len(prefix), prefix),
                ).fetchall()
            if not rows:
                break
            for row in rows:
                key = row[0]
                after = key
                if skip_prefix and key.startswith(skip_prefix):
                    continue
                if len(objects) + len(prefixes) == limit:
                    truncated = True
                    break
                cut = key.find(delimiter, len(prefix)) if delimiter else -1
                if cut >= 0:
                    skip_prefix = key[: cut + len(delimiter)]  # type: ignore[arg-type]
                    prefixes.append(skip_prefix)
                    last = (skip_prefix, True)
                else:
                    skip_prefix = None
                    objects.append(self._object(row))
                    last = (key, False)
        result: dict[str, Any] = {"objects": objects, "truncated": truncated, "delimitedPrefixes": prefixes}
        if truncated and last is not None:
            result["cursor"] = _encode_cursor(*last)
        return result

    # --- writes ---------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        data: bytes | AsyncIterator[bytes],
        *,
        http_metadata: dict[str, str] | None = None,
        custom_metadata: dict[str, str] | None = None,
        sha256: str | None = None,
    ) -> R2Object:
        check_key(key)
        name = secrets.token_hex(16)
        temp = self.root / "tmp" / name
        md5, digest, size = hashlib.md5(), hashlib.sha256(), 0
        try:
            with open(temp, "wb") as out:
                async for chunk in _chunks(data):
                    out.write(chunk)
                    md5.update(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if sha256 is not None and sha256.lower() != digest.hexdigest():
                raise BindingError(
                    "R2 put failed: 400 The SHA-256 checksum you specified did not match what we received. (10037)"
                )
            os.replace(temp, self.root / "data" / name)
        finally:
            temp.unlink(missing_ok=True)
        row = (
            key, name, size, md5.hexdigest(), self.clock.now(), json.dumps(http_metadata or {}),
            json.dumps(custom_metadata or {}), sha256.lower() if sha256 else None,
        )
        with self._lock:
            old = self._db.execute("SELECT file FROM objects WHERE key = ?", (key,)).fetchone()
            self._db.execute(f"INSERT OR REPLACE INTO objects ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
        if old is not None:
            (self.root / "data" / old[0]).unlink(missing_ok=True)
        return self._object(row)

    async def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            old = self._db.execute("SELECT file FROM objects WHERE key = ?", (key,)).fetchone()
            self._db.execute("DELETE FROM objects WHERE key = ?", (key,))
        if old is not None:
            (self.root / "data" / old[0]).unlink(missing_ok=True)


def _encode_cursor(position: str, is_prefix: bool) -> str:
    return base64.urlsafe_b64encode(json.dumps([position, is_prefix]).encode()).decode()


def _decode_cursor(cursor: str | None) -> tuple[str, str | None]:
    """(list after this key, skip keys under this delimited prefix)."""
    if not cursor:
        return "", None
    try:
        position, is_prefix = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError) as exc:
        raise BindingError("R2 list failed: 400 The cursor is not valid. (10022)") from exc
    return str(position), (str(position) if is_prefix else None)
