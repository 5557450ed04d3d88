"""Admission control: a bounded number of generations in progress per isolate (or local edge).

Without a bound, a burst of misses queues without end (under 200 clients, misses waited 49 s at
p50) and every one of them waits longer. Beyond the bound a new miss is refused at once with
503 + Retry-After, in the OpenAI error shape, so clients back off; cache HITs never ask.

Identical cacheable misses coalesce in the flights Durable Object: only the request that
starts a flight costs a generation. The isolate cannot know which request that is until the
object answers, so every request of the isolate for the same flight shares one place
(`admit_shared`), and a request the object says `joined` gives its share back at once: a herd of
identical misses costs one place, never a 503 each, while the generations this isolate starts
stay bounded (one object runs at most one flight at a time).

The count is plain data in the isolate (`IsolateState.admission`): no request ever awaits
another's I/O through it.

Places are shared fairly between tenants (`fair_share`): one tenant's burst of misses must not
take every place while another tenant's requests all get 503s. A tenant alone may hold all but
a quarter of the places (the room another tenant finds when it arrives); with others holding
places, each may hold an equal share. The tenant of the admitted request is also told to the
binding it calls (`admitted_tenant`), so the local edge's llama.cpp queue shares its places the
same way.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Iterator, Mapping

from .errors import ErrorKind, GatewayError, RetryAfter
from .generation import Event, Generation
from .stream import Stream

# The tenant of the request this task serves, as admitted: per task (each request is served in
# its own), read by a binding's own queue (the local edge's llama.cpp runner). None: no tenant.
_ADMITTED_TENANT: ContextVar[str | None] = ContextVar("edgellm_admitted_tenant", default=None)


def admitted_tenant() -> str | None:
    return _ADMITTED_TENANT.get()


@contextmanager
def admitted_as(tenant: str | None) -> Iterator[None]:
    """What starts inside (a task copies the context it starts in) runs for `tenant`, admitted
    elsewhere: the flights object runs a generation the Worker admitted, in an isolate of its
    own where only the order can say whose it is."""
    token = _ADMITTED_TENANT.set(tenant)
    try:
        yield
    finally:
        _ADMITTED_TENANT.reset(token)


def fair_share(limit: int, holding: Mapping[str | None, int], tenant: str | None) -> int:
    """How many of `limit` places `tenant` may hold, given what each tenant holds now."""
    tenants = {t for t, n in holding.items() if n > 0} | {tenant}
    alone = limit - limit // 4  # the room left for a tenant that arrives
    return max(1, min(alone, math.ceil(limit / len(tenants))))


@dataclass
class Admission:
    active: int = 0
    refused: int = 0
    shared: dict[str, "SharedPlace"] = field(default_factory=dict)  # flight name -> its one place
    by_tenant: dict[str | None, int] = field(default_factory=dict)  # places each tenant holds

    def admit_shared(self, name: str, limit: int, tenant: str | None = None) -> "Share":
        """A share of the one place every request of this isolate for flight `name` holds
        together: the first takes the place (or gets the 503), the others share it; it is
        freed when the last share is released."""
        place = self.shared.get(name)
        if place is None:
            place = self.shared[name] = SharedPlace(self, name, self.admit(limit, tenant))
        place.holders += 1
        return Share(place)

    async def admitted(self, limit: int, start: Callable[[], Awaitable[Generation]], tenant: str | None = None) -> Generation:
        """Start a generation if the isolate admits one more for this tenant (503 + Retry-After
        at once if not); it holds its place until its events end or are closed."""
        ticket = self.admit(limit, tenant)
        try:
            generation = await start()
        except BaseException:
            ticket.release()
            raise
        generation.events = holding(generation.events, ticket)
        return generation

    async def admitted_flight(self, name: str, limit: int, start: Callable[[], Awaitable[tuple[Generation, bool]]],
                              tenant: str | None = None) -> tuple[Generation, bool]:
        """A miss through the flights object (`start` answers the generation and whether this
        request joined one already running), admitted as the generation it may start: the
        isolate's requests for flight `name` share one place, taken before the object is asked
        (only its answer says whether this request starts the flight), and a request that joined
        gives its share back, since joining costs the backend nothing. So a herd of identical
        misses in one isolate is never refused for its own size; the place lasts while this
        isolate may have started the flight, until the starter's events end or are closed."""
        share = self.admit_shared(name, limit, tenant)
        try:
            generation, joined = await start()
        except BaseException:
            share.release()
            raise
        if joined:
            share.release()
        else:
            generation.events = holding(generation.events, share)
        return generation, joined

    def admit(self, limit: int, tenant: str | None = None) -> "Ticket":
        _ADMITTED_TENANT.set(tenant)
        held = self.by_tenant.get(tenant, 0)
        if self.active >= limit or held >= fair_share(limit, self.by_tenant, tenant):
            self.refused += 1
            whose = "" if self.active >= limit else f" (this tenant holds {held}, its fair share)"
            raise GatewayError(
                ErrorKind.UNAVAILABLE,
                f"Too many generations in progress here ({self.active}, the limit is {limit}){whose}; retry shortly.",
                code="overloaded", retry_after=RetryAfter.ADMISSION,
            )
        self.active += 1
        self.by_tenant[tenant] = held + 1
        return Ticket(self, tenant)


@dataclass
class Ticket:
    """One admitted generation; `release` is idempotent."""

    admission: Admission
    tenant: str | None = None
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.active -= 1
            held = self.admission.by_tenant.get(self.tenant, 0) - 1
            if held > 0:
                self.admission.by_tenant[self.tenant] = held
            else:
                self.admission.by_tenant.pop(self.tenant, None)


@dataclass
class SharedPlace:
    """One admitted place held by every request of the isolate for one flight."""

    admission: Admission
    name: str
    ticket: Ticket
    holders: int = 0


@dataclass
class Share:
    """One request's share of a `SharedPlace`; `release` is idempotent, like a `Ticket`'s."""

    place: SharedPlace
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        place = self.place
        place.holders -= 1
        if place.holders == 0:
            place.ticket.release()
            if place.admission.shared.get(place.name) is place:
                del place.admission.shared[place.name]


def holding(events: AsyncIterator[Event], ticket: Ticket | Share) -> Stream[Event]:
    """A generation's events holding its ticket until they end, fail or are closed (even unread)."""
    return Stream(events).on_close(ticket.release)

