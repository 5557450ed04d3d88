"""Admission control: a bounded number of generations in progress per isolate (or local edge).

Without a bound, a burst of misses queues without end (under 200 clients, misses waited 49 s at
p50) and every one of them waits longer. Beyond the bound a new miss is refused at once with
503 + Retry-After, in the OpenAI error shape, so clients back off; cache HITs never ask.

The count is plain data in the isolate (`IsolateState.admission`): no request ever awaits
another's I/O through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from .generation import Event

RETRY_AFTER_SECONDS = 2


@dataclass
class Admission:
    active: int = 0
    refused: int = 0

    def admit(self, limit: int) -> "Ticket":
        # imported here: errors -> ports -> state -> admission would be a cycle at import time
        from .errors import ErrorKind, GatewayError

        if self.active >= limit:
            self.refused += 1
            raise GatewayError(
                ErrorKind.UNAVAILABLE,
                f"Too many generations in progress here ({self.active}, the limit is {limit}); retry shortly.",
                code="overloaded", retry_after=RETRY_AFTER_SECONDS,
            )
        self.active += 1
        return Ticket(self)


@dataclass
class Ticket:
    """One admitted generation; `release` is idempotent."""

    admission: Admission
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.active -= 1


class Admitted:
    """A generation's events holding its ticket until they end, fail or are closed."""

    def __init__(self, events: AsyncIterator[Event], ticket: Ticket) -> None:
        self.events, self.ticket = events, ticket

    def __aiter__(self) -> "Admitted":
        return self

    async def __anext__(self) -> Event:
        try:
            return await anext(self.events)
        except BaseException:
            self.ticket.release()
            raise

    async def aclose(self) -> None:
        self.ticket.release()
        close = getattr(self.events, "aclose", None)
        if close is not None:
            await close()
