"""Random ids (an answer's `chatcmpl-...`, a request's log id), from the OS's CSPRNG a block at a time.

`secrets.token_hex` asks the OS for every id: a `getrandom` call, which CPython makes with the
GIL released. Inside the running local edge, with its other threads (llama.cpp's, the log and
usage writers), one took 11-13 us where a bare interpreter takes 0.7, and a cache HIT made two.
One draw of `block` bytes serves hundreds of ids; they are as unpredictable as `secrets`' own,
since they are its bytes. The lock: the local edge runs an event loop per server thread, and
two callers must never be handed the same bytes.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class RandomIds:
    """Hex ids cut from blocks of `source` bytes (`secrets.token_bytes` unless a test says otherwise)."""

    block: int = 4096
    source: Callable[[int], bytes] = secrets.token_bytes
    _pool: bytes = field(default=b"", init=False, repr=False)
    _at: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def hex(self, nbytes: int) -> str:
        """`nbytes` random bytes as hex, as `secrets.token_hex(nbytes)` gives."""
        with self._lock:
            if self._at + nbytes > len(self._pool):
                self._pool, self._at = self.source(max(self.block, nbytes)), 0
            pool, start = self._pool, self._at
            self._at = start + nbytes
        return pool[start:start + nbytes].hex()

    def new(self, prefix: str, nbytes: int = 12) -> str:
        """An OpenAI-style id: `prefix-` and 2 x `nbytes` hex digits."""
        return f"{prefix}-{self.hex(nbytes)}"


@dataclass
class RequestIds:
    """Request ids (`x-request-id`): a random prefix per isolate and a count, `3f9a0c41d2e7-1a`.
    Every answer carries one, a cache HIT's too, so it must cost less than a random draw (a lock
    and a slice: a fifth of what the rest of a request's bookkeeping costs); it only has to be
    unique (the prefix tells isolates apart), never unpredictable: it is no secret."""

    ids: RandomIds | None = None
    _prefix: str = field(default="", init=False, repr=False)
    _count: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)  # next() is atomic under the GIL

    def new(self) -> str:
        prefix = self._prefix
        if not prefix:
            prefix = self._prefix = (self.ids or RandomIds(block=6)).hex(6)
        return f"{prefix}-{next(self._count):x}"
