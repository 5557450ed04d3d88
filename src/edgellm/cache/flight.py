"""One generation shared by every identical request that joins it, inside a Durable Object.

Requests are isolated on Cloudflare: a generation (its task, its binding stream) belongs to the
request that started it, so a `Flight` lives only in a Durable Object (`cache.coalescing`), whose
requests may share what it owns; never in the Worker's isolate.

The generation runs in its own task (the producer) that appends events; each request holds a
`Subscription` that replays what is buffered, then follows live. A request counts from the moment
it joins until its subscription is closed or ends, whether or not it ever read (a subscription
closed before its first read uncounts at once). When the last one leaves before the end, the
producer is cancelled: an abandoned generation costs nothing more and writes nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ..errors import ErrorKind, GatewayError, RetryAfter
from ..generation import Event, Generation
from ..stream import close_source


def abandoned() -> GatewayError:
    return GatewayError(ErrorKind.UNAVAILABLE, "The shared generation was abandoned; try again.", code="generation_abandoned", retry_after=RetryAfter.AT_ONCE)


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

    def start(self, start: Callable[[], Awaitable[Generation]], on_done: Callable[["Flight"], None]) -> "Flight":
        self.producer = asyncio.ensure_future(self.run(start, on_done))
        return self

    async def run(self, start: Callable[[], Awaitable[Generation]], on_done: Callable[["Flight"], None]) -> None:
        """Produce the generation's events; `on_done` is called once, whatever the outcome
        (check `error`: None means the generation ran to its Finish)."""
        generation: Generation | None = None
        try:
            generation = await start()
            self.model = generation.model
            self.route = generation.route
            self.started.set_result(generation.model)
            async for event in generation.events:
                self.events.append(event)
                self._notify()
        except asyncio.CancelledError:
            self.error = self.error or abandoned()
            if not self.started.done():
                self.started.set_exception(self.error)
                self.started.exception()  # everyone may have left: not "an exception never retrieved"
            raise
        except BaseException as exc:  # delivered to every subscriber
            self.error = exc
            if not self.started.done():
                self.started.set_exception(exc)
        finally:
            if generation is not None:
                await close_source(generation.events)  # stops the binding stream (and llama.cpp behind it)
            self.done = True
            self._notify()
            on_done(self)

    def join(self) -> "Subscription":
        """Count a request in now; its subscription streams every event from the first."""
        self.subscribers += 1
        return Subscription(self)

    def _leave(self) -> None:
        self.subscribers -= 1
        if self.subscribers == 0 and not self.done and self.producer is not None:
            self.producer.cancel()


@dataclass
class Subscription:
    """One request's view of a flight: an async iterator of events, closed exactly once (by its
    end, a failure, or `aclose`, even before the first read)."""

    flight: Flight
    position: int = 0
    closed: bool = False

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> Event:
        flight = self.flight
        while not self.closed:
            if self.position < len(flight.events):
                self.position += 1
                return flight.events[self.position - 1]
            if flight.done:
                self._close()
                if flight.error is not None:
                    raise flight.error
                break
            await flight._changed.wait()
        raise StopAsyncIteration

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.flight._leave()

    async def aclose(self) -> None:
        self._close()
