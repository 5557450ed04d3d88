"""The llama.cpp runner's start places when no slot pool leases slots: one per llama.cpp slot.

Without a slot pool a request handed to llama.cpp waits in llama.cpp's own queue for a slot, for as
long as the slots are busy: the runner's bounded queue says how many wait, not how long
(streams could wait over 90 s without a byte). A request instead waits here for one of the
`n_parallel` places (so llama.cpp always has a slot for it), within a deadline it can be refused at
(503 + Retry-After). The runner is shared by event loops (one per edge server thread), so the
places are counted under a thread lock and a waiter is woken on its own loop.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    loop: asyncio.AbstractEventLoop
    woken: asyncio.Future[None]
    granted: bool = False  # set under the lock: the place is this waiter's, woken or not


@dataclass
class StartPlaces:
    """`size` places; `acquire` waits at most `timeout` seconds for one (TimeoutError), first come first served."""

    size: int
    _free: int = field(default=-1, init=False)
    _waiters: list[_Waiter] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._free = max(1, self.size)

    async def acquire(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter = _Waiter(loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(waiter.woken)
        except BaseException:
            with self._lock:
                if not waiter.granted:
                    self._waiters.remove(waiter)
                    raise
            self.release()  # granted as the deadline passed: hand the place on
            raise

    def release(self) -> None:
        with self._lock:
            if not self._waiters:
                self._free = min(self._free + 1, max(1, self.size))
                return
            waiter = self._waiters.pop(0)
            waiter.granted = True
        waiter.loop.call_soon_threadsafe(lambda: waiter.woken.done() or waiter.woken.set_result(None))

    @property
    def free(self) -> int:
        with self._lock:
            return self._free
