"""Usage: every request recorded once it is answered (a stream: once its body ends), and the
tokens charged to the key's window. HITs count as requests, never as tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ..generation import Event, Finish, Generation
from ..http import Request, Response
from ..ports import Deps, UsageEvent
from .guard import Principal
from .ratelimit import charge_tokens


@dataclass
class Observation:
    """What the usage record needs of a generation; filled as its events pass."""

    model: str
    cache_status: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Tapped:
    """A generation's events on their way to the renderer, filling `seen` from the Finish. A
    class, not a generator: an async generator closed before its first read skips its `finally`,
    so closing this unread (a client gone before the first byte) would never close the events
    behind it, and `Admitted` would keep its admission ticket for good."""

    events: AsyncIterator[Event]
    seen: Observation
    closed: bool = False

    def __aiter__(self) -> "Tapped":
        return self

    async def __anext__(self) -> Event:
        try:
            event = await anext(self.events)
        except BaseException:
            await self.aclose()
            raise
        if isinstance(event, Finish):
            self.seen.prompt_tokens, self.seen.completion_tokens = event.usage.prompt_tokens, event.usage.completion_tokens
        return event

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        close = getattr(self.events, "aclose", None)
        if close is not None:
            await close()


def observe(request: Request, generation: Generation) -> None:
    """Called by the API handlers with the generation they serve: taps its Finish event."""
    seen = Observation(generation.model, generation.cache_status or "BYPASS")
    request.observed = seen
    generation.events = Tapped(generation.events, seen)


def route_name(request: Request) -> str:
    """The route's template (`/v1/responses/{response_id}`), never the raw path: a path that
    carries an id would make every request its own value, and usage could not be grouped."""
    path = request.path
    if path.startswith("/client/v4/"):
        return "workers-ai"
    from ..app import ROUTES  # at call time: the app imports this module

    template = next((r.template for r in ROUTES.routes if request.method in r.methods and r.pattern.match(path)), None)
    return template if template is not None else "unmatched"


def _record(request: Request, response: Response, deps: Deps, started: float) -> None:
    principal: Principal | None = request.principal
    if principal is None:
        return
    seen: Observation | None = request.observed
    now = deps.clock.now()
    tokens = 0
    if seen is not None and seen.cache_status != "HIT":
        tokens = seen.prompt_tokens + seen.completion_tokens
        if principal.record is not None:
            charge_tokens(deps.state.access, principal.key_id, principal.record.tokens_per_minute, tokens, now)
            spent = deps.state.access.spent
            spent[principal.key_id] = spent.get(principal.key_id, 0) + tokens
    if deps.usage is None:
        return
    event = UsageEvent(
        time=now, tenant=principal.tenant, key_id=principal.key_id,
        model=seen.model if seen else "", route=route_name(request),
        cache_status=seen.cache_status if seen else "", prompt_tokens=seen.prompt_tokens if seen else 0,
        completion_tokens=seen.completion_tokens if seen else 0,
        latency_ms=round(max(0.0, now - started) * 1000, 3), status=response.status,
    )

    async def write() -> None:
        try:
            await deps.usage.record(event)  # type: ignore[union-attr]
        except Exception as exc:  # usage never fails a request
            deps.log.warning("usage record failed: %s", exc)

    deps.wait_until(write())


def account(request: Request, response: Response, deps: Deps, started: float) -> Response:
    """Record the request's usage now, or when its streamed body ends (however it ends).
    Public routes (artifacts, health) are not recorded: their bodies are handed over as they are."""
    if request.principal is None:
        return response
    if not response.is_streaming:
        _record(request, response, deps, started)
        return response
    response.body = Recorded(response.body, lambda: _record(request, response, deps, started))
    return response


@dataclass
class Recorded:
    """A streamed body that records its request once, when it ends, fails or is closed. A class,
    not a generator, so that a body closed before its first read still closes what it streams
    (and, through it, the generation's admission ticket) and is still recorded."""

    body: Any
    on_done: Callable[[], None]
    done: bool = False

    def __aiter__(self) -> "Recorded":
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self.body)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            close = getattr(self.body, "aclose", None)
            if close is not None:
                await close()
        finally:
            self.on_done()
