"""`FileBody`'s two ways of reading: a chunk the page cache holds is read on the event
loop (`preadv2(RWF_NOWAIT)`), one that would wait on the disk on a worker thread. Both must give
exactly the object's bytes, at its offset, whichever way each chunk was read."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from edgellm_local.emulator.r2 import FileBody

SIZE = 3 * 65536 + 123


def _source(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(SIZE)
    path = tmp_path / "object"
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return path, data


def _evict(path: Path) -> None:
    """Drop the (clean, synced) file's pages from the page cache, so a RWF_NOWAIT read finds
    nothing cached (on file systems that honour the advice)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def _read(path: Path, offset: int, length: int, *, nowait: bool) -> tuple[bytes, set[int]]:
    """The body's bytes, and the threads its chunks were read on."""
    file = open(path, "rb")
    file.seek(offset)
    body = FileBody(file, length, chunk_size=65536)
    body._nowait = nowait  # False: every chunk takes the worker-thread path
    threads: set[int] = set()
    original = body._read

    def on_thread(size: int, at: int) -> bytes:
        threads.add(threading.get_ident())
        return original(size, at)

    body._read = on_thread  # type: ignore[method-assign]
    chunks = [chunk async for chunk in body]
    assert all(isinstance(chunk, bytes) for chunk in chunks)
    assert file.closed
    return b"".join(chunks), threads


@pytest.mark.parametrize("offset,length", [(0, SIZE), (65536 - 7, 2 * 65536 + 11), (SIZE - 5, 5)])
def test_thread_reads_give_the_range_bytes(tmp_path: Path, offset: int, length: int) -> None:
    path, data = _source(tmp_path)
    got, threads = asyncio.run(_read(path, offset, length, nowait=False))
    assert got == data[offset : offset + length]
    assert threads and threading.get_ident() not in threads  # read off the event loop's thread


@pytest.mark.parametrize("offset,length", [(0, SIZE), (65536 - 7, 2 * 65536 + 11)])
def test_cached_reads_and_evicted_reads_give_the_same_bytes(tmp_path: Path, offset: int, length: int) -> None:
    path, data = _source(tmp_path)
    cached, _ = asyncio.run(_read(path, offset, length, nowait=True))
    _evict(path)
    evicted, _ = asyncio.run(_read(path, offset, length, nowait=True))
    assert cached == evicted == data[offset : offset + length]


def test_close_mid_body_closes_the_file(tmp_path: Path) -> None:
    path, data = _source(tmp_path)

    async def first_chunk_then_close() -> tuple[bytes, bool]:
        file = open(path, "rb")
        body = FileBody(file, SIZE, chunk_size=65536)
        chunk = await anext(body)
        await body.aclose()
        return chunk, file.closed

    chunk, closed = asyncio.run(first_chunk_then_close())
    assert chunk == data[:65536] and closed
