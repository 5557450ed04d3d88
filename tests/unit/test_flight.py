"""Request coalescing: who counts, what late joiners see, and when a generation is abandoned."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from edgellm.cache.flight import Flight
from edgellm.errors import ErrorKind, GatewayError
from edgellm.generation import Event, Finish, Generation, Token, Usage


def paced(n: int, gate: asyncio.Event | None = None) -> Generation:
    async def events() -> AsyncIterator[Event]:
        for i in range(n):
            if gate is not None and i == 1:
                await gate.wait()
            yield Token(f"t{i} ")
            await asyncio.sleep(0)
        yield Finish("length", Usage(3, n))

    return Generation("@cf/test", events())


async def started(generation: Generation) -> Generation:
    return generation


def fly(generation: Generation, done: list[Flight]) -> Flight:
    flight = Flight()
    flight.producer = asyncio.ensure_future(flight.run(lambda: started(generation), done.append))
    return flight


async def test_a_joined_request_keeps_the_generation_alive_before_its_first_read() -> None:
    gate, done = asyncio.Event(), []
    flight = fly(paced(5, gate), done)
    leader, follower = flight.join(), flight.join()
    assert await flight.started == "@cf/test"
    assert isinstance(await anext(leader), Token)
    await leader.aclose()  # the leader's client goes away before the follower has read anything
    gate.set()
    events = [event async for event in follower]
    assert [e.text for e in events if isinstance(e, Token)] == [f"t{i} " for i in range(5)]
    assert isinstance(events[-1], Finish)
    assert done[0].error is None and flight.subscribers == 0


async def test_a_joiner_mid_flight_replays_what_it_missed_then_follows_live() -> None:
    gate, done = asyncio.Event(), []
    flight = fly(paced(4, gate), done)
    early = flight.join()
    first = await anext(early)  # one event out, the producer now waits on the gate
    late = flight.join()  # joins mid-flight
    assert await anext(late) == first  # replayed
    gate.set()  # the rest arrives live, to both
    rest_early = [event async for event in early]
    rest_late = [event async for event in late]
    assert rest_early == rest_late and len(rest_early) == 4 and isinstance(rest_early[-1], Finish)


async def test_a_joiner_after_the_end_still_gets_the_whole_answer() -> None:
    done: list[Flight] = []
    flight = fly(paced(4), done)
    first = [event async for event in flight.join()]
    late = [event async for event in flight.join()]
    assert late == first and len(first) == 5


async def test_when_every_client_leaves_the_generation_is_cancelled_and_not_complete() -> None:
    gate, done = asyncio.Event(), []
    flight = fly(paced(50, gate), done)
    a, b = flight.join(), flight.join()
    await anext(a)
    await anext(b)
    await a.aclose()
    await b.aclose()
    with pytest.raises(asyncio.CancelledError):
        await flight.producer
    assert isinstance(done[0].error, GatewayError) and done[0].error.retry_after is not None
    assert not any(isinstance(e, Finish) for e in done[0].events)


async def test_a_failure_reaches_every_joined_request() -> None:
    done: list[Flight] = []

    async def events() -> AsyncIterator[Event]:
        yield Token("a")
        raise GatewayError(ErrorKind.UPSTREAM, "binding broke", retry_after=5)

    flight = fly(Generation("@cf/test", events()), done)
    for joined in (flight.join(), flight.join()):
        with pytest.raises(GatewayError, match="binding broke"):
            [event async for event in joined]


async def test_a_request_closed_before_its_first_read_uncounts_at_once() -> None:
    """A subscription closed before it was ever read leaves no subscriber behind (the old
    generator-based join only uncounted in a `finally` that never runs for an unstarted one)."""
    gate, done = asyncio.Event(), []
    flight = fly(paced(50, gate), done)
    joined = flight.join()
    assert flight.subscribers == 1
    await joined.aclose()
    assert flight.subscribers == 0
    with pytest.raises(asyncio.CancelledError):
        await flight.producer  # nobody left: the generation was abandoned
    await joined.aclose()  # closing twice uncounts once
    assert flight.subscribers == 0
