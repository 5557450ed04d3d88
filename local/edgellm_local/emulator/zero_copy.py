"""Zero-copy bodies: a local file (or a range of one) goes from the page cache to the socket with
`sendfile(2)`, never through Python.

uvicorn implements no ASGI zero-copy and uvloop has no `loop.sendfile`, so the httptools protocol
(`hardening.guarded_protocol`) puts a `edgellm.sendfile` extension in each request's scope: a
coroutine function `(body, count)` that the app calls after `http.response.start` and before its
final empty `http.response.body`. It
- waits until the transport's write buffer is empty (the headers, and anything before them, are
  in the kernel: the bytes stay in order), through uvicorn's own flow control;
- runs `os.sendfile` on a worker thread over a duplicate of the socket's descriptor (the
  transport may close its own at any moment; the duplicate is closed by the thread that made
  it), polling for room when the socket is full: a slow reader holds the kernel's socket buffer
  and nothing more, and the loop never blocks;
- holds the file body's lock meanwhile, so the body cannot be closed under it (`r2.FileBody`);
- stops when the request is cancelled (the client left), when the peer resets, or when the
  reader takes nothing for `stall_timeout` seconds;
- tells uvicorn's cycle how many body bytes went out, so its Content-Length accounting holds.
The app falls back to the chunked path where this cannot apply: no extension (h11, TLS), a body
that is not a whole open file, a compressed or HEAD answer (server.py)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import threading
from dataclasses import dataclass, field
from typing import Any

EXTENSION = "edgellm.sendfile"
SENDFILE_CHUNK = 8 * 1024 * 1024  # one syscall's most; the kernel sends what the socket holds
POLL_MS = 200  # how often a waiting sender looks at its stop flag


@dataclass
class ZeroCopyStats:
    """What the zero-copy path did (observable by tests and benchmarks, not timed)."""

    bodies: int = 0  # sent in full
    bytes: int = 0  # of those bodies
    fallbacks: int = 0  # bodies that could have gone zero-copy but went chunked (reason logged)
    in_flight: int = 0  # sender threads running now (each holds a duplicate socket descriptor)
    stopped: int = 0  # sends ended early: the client left, reset, stalled, or the request was cancelled


class PeerGone(OSError):
    """The client left or stopped reading while a file was being sent."""


def send_file_blocking(sock_fd: int, file_fd: int, offset: int, count: int, stop: threading.Event,
                       stall_timeout: float) -> int:
    """`count` bytes of `file_fd` from `offset` to the non-blocking socket `sock_fd`, waiting
    for room with poll(2). Returns the bytes sent (fewer only if the file is shorter)."""
    sent = 0
    poller = select.poll()
    poller.register(sock_fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
    waited = 0.0
    while sent < count and not stop.is_set():
        try:
            n = os.sendfile(sock_fd, file_fd, offset + sent, min(SENDFILE_CHUNK, count - sent))
        except BlockingIOError:
            events = poller.poll(POLL_MS)
            if not events:
                waited += POLL_MS / 1000
                if waited >= stall_timeout:
                    raise PeerGone(errno.ETIMEDOUT, "the client read nothing for too long")
                continue
            if any(mask & (select.POLLERR | select.POLLHUP) for _fd, mask in events):
                raise PeerGone(errno.EPIPE, "the client went away")
            continue
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise PeerGone(exc.errno, "the client went away") from exc
        if n == 0:
            break  # the file ended early (it cannot for an R2 version, whose files never change)
        sent += n
        waited = 0.0
    if stop.is_set() and sent < count:
        raise PeerGone(errno.ECANCELED, "the request was cancelled")
    return sent


@dataclass
class ZeroCopySender:
    """The `edgellm.sendfile` extension of one request (made by the protocol, see the module doc)."""

    protocol: Any  # uvicorn's HttpToolsProtocol
    cycle: Any  # its RequestResponseCycle for this request
    stats: ZeroCopyStats
    stall_timeout: float = 60.0
    _used: bool = field(default=False, init=False)

    async def _drained(self) -> None:
        """Every byte the transport holds is in the kernel: the file's bytes go after them."""
        transport = self.cycle.transport
        if transport.get_write_buffer_size() == 0:
            return
        high, low = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0, low=0)  # pauses the protocol until the buffer is empty
        try:
            await self.cycle.flow.drain()
        finally:
            transport.set_write_buffer_limits(high=high, low=low)

    async def __call__(self, body: Any, count: int) -> int:
        """Send `count` bytes of `body` (an `r2.FileBody` positioned at its range) after the
        headers; returns the bytes sent. Raises OSError when the client is gone."""
        if self._used:
            raise RuntimeError("one zero-copy body per response")
        self._used = True
        cycle = self.cycle
        if cycle.disconnected or cycle.transport.is_closing():
            raise PeerGone(errno.EPIPE, "the client went away")
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        await self._drained()
        if cycle.disconnected or cycle.transport.is_closing():
            raise PeerGone(errno.EPIPE, "the client went away")
        sock = cycle.transport.get_extra_info("socket")
        sock_fd = os.dup(sock.fileno())  # ours to close, whatever the transport does meanwhile
        stop = threading.Event()

        stats = self.stats
        stats.in_flight += 1  # the counters change on the loop only (the thread hands its end back)

        def run() -> int:
            sent = -1  # an error: the client left, reset or stalled
            try:
                sent = body.sendfile_to(sock_fd, count, stop, self.stall_timeout)
                return sent
            finally:
                os.close(sock_fd)
                with contextlib.suppress(RuntimeError):  # the loop already closed: nobody left to tell
                    loop.call_soon_threadsafe(finished, sent)

        def finished(sent: int) -> None:
            # counted from the thread's outcome, not after the await below: the client may have
            # every byte and be gone (the request cancelled) before this task resumes
            stats.in_flight -= 1
            if sent == count:
                stats.bodies += 1
                stats.bytes += sent
            else:
                stats.stopped += 1

        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, run)
        try:
            sent = await asyncio.shield(future)
        except asyncio.CancelledError:
            stop.set()  # the thread stops within POLL_MS; it closes its descriptor itself
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
            raise
        cycle.expected_content_length -= sent
        return sent
