"""Request coalescing: identical cacheable misses in one isolate share one generation.

The generation runs in its own task (a producer) that appends events to a `Flight`; every
request for the same key joins it and streams the events, late joiners replaying what they
missed first. A request counts from the moment it joins, not from its first read, so one
client leaving early never cancels a generation another has joined but not yet read. When the
last one leaves before the end (every client aborted), the producer is cancelled, so an
abandoned generation costs nothing more and writes nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from ..errors import ErrorKind, GatewayError
from ..generation import Event, Generation


@dataclass
class Flight:
    model: str = ""
    events: list[Event] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False
    subscribers: int = 0
    started: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    producer: asyncio.Task[Any] | None = None
    route: str | None = None  # where the generation runs (routing's `x-edgellm-route`)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def run(self, start: Callable[[], Awaitable[Generation]], on_done: Callable[["Flight"], None]) -> None:
        """Produce the generation's events; `on_done` is called once, whatever the outcome
        (check `error`: None means the generation ran to its Finish)."""
        try:
            generation = await start()
            self.model = generation.model
            self.route = generation.route
            self.started.set_result(generation.model)
            async for event in generation.events:
                self.events.append(event)
                self._notify()
        except asyncio.CancelledError:
            self.error = self.error or GatewayError(
                ErrorKind.UNAVAILABLE, "The shared generation was abandoned; try again.", code="generation_abandoned", retry_after=1
            )
            if not self.started.done():
                self.started.set_exception(self.error)
            raise
        except BaseException as exc:  # delivered to every subscriber
            self.error = exc
            if not self.started.done():
                self.started.set_exception(exc)
        finally:
            self.done = True
            self._notify()
            on_done(self)

    def join(self) -> AsyncIterator[Event]:
        """Count a request in now; the iterator it returns streams every event from the first."""
        self.subscribers += 1
        return self._follow()

    async def _follow(self) -> AsyncIterator[Event]:
        position = 0
        try:
            while True:
                while position < len(self.events):
                    position += 1
                    yield self.events[position - 1]
                if self.done:
                    if self.error is not None:
                        raise self.error
                    return
                await self._changed.wait()
        finally:
            self.subscribers -= 1
            if self.subscribers == 0 and not self.done and self.producer is not None:
                self.producer.cancel()
