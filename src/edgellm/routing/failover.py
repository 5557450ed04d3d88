"""Running a route's plan: the edge first, failing over to an origin when the edge fails.

    edge first (model fallback ids first), budget to the first token
        binding error / capacity / no first token in time ─▶ edge closed, origin
        stall past the stall budget or failure after tokens ─▶ origin continues the text
            already sent; one stream; final event says route=edge,origin; never cached

`_start_edge` returns the edge's first event or a `Cut` (why it stopped); `_follow_edge` relays
the edge until its Finish or a `Cut`, then `_origin_continues` takes over. The breaker hears each
edge attempt once, through its `EdgeVerdict` (success, failure, or closed without a verdict);
times come from the injected `deps.clock`; the caller's objects are never changed (a new
`Generation` is returned). A module of its own, apart from `plan`, because this is the part that
holds streams open and must close them on every path: the planning is plain decisions over
values, this is the I/O.

Everything one request starts (the edge stream, the origin request) is awaited by that request
only; the breaker and counters are plain per-isolate data (`IsolateState.routing`).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import AsyncIterator

from ..errors import ErrorKind, GatewayError, RetryAfter
from ..generation import Event, Finish, Generation, GenerationRequest, Token, ToolCallDelta, Usage
from ..http import Request
from ..inference import apply_stop, start_generation
from ..deps import Deps
from ..ports import Clock
from ..stream import close_source, owns
from . import pools
from .breaker import CircuitBreaker
from .config import OriginConfig
from .origin import OriginClient
from .plan import Plan, first_token_budget, plan_route, routing_state

FAILOVER_KINDS = (ErrorKind.UPSTREAM, ErrorKind.UNAVAILABLE)
_REASONS = {"capacity_exceeded": "capacity", "model_unavailable": "model-unavailable"}


@dataclass(frozen=True)
class Cut:
    """The edge stopped short of its Finish: why, for the log, the counters and the route header
    (`edge-timeout`, `edge-error`, `capacity`, `model-unavailable`, `too-long-for-edge` before the
    first token; `stall`, `edge-failed-mid-stream` after it)."""

    reason: str


@dataclass
class EdgeVerdict:
    """The breaker's record of one edge attempt, and the only code that touches the breaker for
    it: a success or a failure, recorded once; an attempt that ends with neither (the client left,
    a bad request, the edge's own window) frees a half-open probe slot when closed."""

    breaker: CircuitBreaker
    clock: Clock
    given: bool = False

    def record(self, ok: bool) -> None:
        if not self.given:
            self.given = True
            (self.breaker.success if ok else self.breaker.failure)(self.clock.now())

    def close(self) -> None:
        if not self.given:
            self.given = True
            self.breaker.abandon()


async def start_routed(deps: Deps, request: Request, gen_request: GenerationRequest, plan: Plan | None = None,
                       budget: float | None = None) -> Generation:
    """Start the generation on the route the policy picks; the edge-only gateway when routing
    is not configured. A flights object passes the `plan` and first-token `budget` the Worker
    decided (`cache.coalescing.FlightPlan`), so it never plans itself."""
    if not deps.config.routing.active:
        return replace(await start_generation(deps, gen_request), route="edge; reason=primary")
    plan = plan or await plan_route(deps, request, gen_request)
    counters = routing_state(deps).counters
    if not plan.edge:
        return await _from_origins(deps, gen_request, plan.origins, plan.reason, plan.prompt_tokens)
    if not plan.origins:  # nowhere to fail over to: no budgets, exactly as before
        generation = await start_generation(deps, gen_request)
        counters.edge += 1
        return replace(generation, route="edge; reason=primary")
    budget = first_token_budget(deps.config.routing, request) if budget is None else budget
    breaker = routing_state(deps).breaker
    assert breaker is not None
    verdict = EdgeVerdict(breaker, deps.clock)
    try:
        started = await _start_edge(deps, gen_request, budget)
    except BaseException:  # a bad request, or the client left: no verdict on the edge
        verdict.close()
        raise
    if isinstance(started, Cut):
        if started.reason == "too-long-for-edge":  # the edge's own window: not a failure
            verdict.close()
            counters.too_long_for_edge += 1
        else:
            verdict.record(ok=False)
            counters.failovers_before_first_token += 1
        deps.log.warning("edge failed before its first token (%s); asking the origin", started.reason)
        return await _from_origins(deps, gen_request, plan.origins, started.reason, plan.prompt_tokens)
    generation, first = started
    counters.edge += 1
    followed = _follow_edge(deps, gen_request, plan, verdict, first, generation.events).on_close(verdict.close)  # read or not
    return Generation(generation.model, followed, route="edge; reason=primary", prompt_seen=generation.prompt_seen)


async def _start_edge(deps: Deps, gen_request: GenerationRequest, budget: float) -> tuple[Generation, Event] | Cut:
    """The edge's generation and its first event within `budget` seconds, or why not. A started
    generation that does not give its first event is closed here, never left running; errors the
    origin cannot help with (and the client leaving) propagate."""
    generation: Generation | None = None
    try:
        async with asyncio.timeout(budget):
            generation = await start_generation(deps, replace(gen_request, stream=True))
            return generation, await anext(generation.events)
    except TimeoutError:
        cut = Cut("edge-timeout")
    except StopAsyncIteration:
        cut = Cut("edge-error")
    except GatewayError as exc:
        if exc.code == "context_length_exceeded":  # the edge's own window (uncounted, or counted short)
            cut = Cut("too-long-for-edge")
        elif exc.kind in FAILOVER_KINDS:
            cut = Cut(_REASONS.get(exc.code or "", "edge-error"))
        else:
            raise
    except asyncio.CancelledError:
        if generation is not None:
            await close_source(generation.events)
        raise
    if generation is not None:
        await close_source(generation.events)
    return cut


async def _from_origins(deps: Deps, gen_request: GenerationRequest, origins: tuple[OriginConfig, ...], reason: str,
                        prompt_tokens: int | None = None) -> Generation:
    """The first origin that answers, in the order routing gives (a pool's replicas by its
    scheduler; a replica that fails gives way to the next, `reason=failover`)."""
    state = routing_state(deps)
    last: GatewayError | None = None
    choices = await pools.order(deps, gen_request, origins, prompt_tokens)
    if origins and not choices:  # every replica of the pool is down (its breakers open)
        raise _all_down()
    for tried, choice in enumerate(choices):
        origin = choice.origin
        assert deps.fetch is not None
        why = choice.reason if tried == 0 else "failover"
        if choice.view is not None and not choice.view.admit(origin.name, deps.clock.now()):
            continue
        choice = pools.dispatched(deps, choice, why)
        started = time.monotonic()
        try:
            events = await OriginClient(origin, deps.fetch, deps.tracer, deps.state.ids).start(gen_request)
        except GatewayError as exc:
            if exc.kind not in FAILOVER_KINDS:  # the request's own fault (a 400): no verdict on the replica
                pools.abandoned(deps, choice)
                raise
            pools.failed(deps, choice)
            state.counters.origin_errors += 1
            deps.log.warning("origin %s failed: %s", origin.name, exc.detail or exc.message)  # its own text: the log's only
            last = exc
            continue
        except BaseException:
            pools.abandoned(deps, choice)
            raise
        state.counters.origin += 1
        route = pools.route_text(choice, why, reason)
        followed = pools.followed(deps, choice, events, started)
        return Generation(origin.model_for(gen_request.model), _tagged(apply_stop(followed, gen_request.stop), route), route=route)
    if choices and all(c.view is not None for c in choices):  # a pool, every replica down or failing
        raise _all_down(last)
    if last is not None:
        raise last
    raise GatewayError(ErrorKind.UNAVAILABLE, f"The edge is unavailable ({reason}) and no origin is configured for this request.",
                       code="no_route", retry_after=RetryAfter.NO_ROUTE)


def _all_down(last: GatewayError | None = None) -> GatewayError:
    return GatewayError(ErrorKind.UNAVAILABLE, "Every replica that serves this request is down or failing; retry shortly.",
                        code="origin_unavailable", retry_after=RetryAfter.NO_ROUTE,
                        detail=(last.detail or last.message) if last is not None else "every replica's breaker is open")


@owns("events")
async def _tagged(events: AsyncIterator[Event], route: str) -> AsyncIterator[Event]:
    async for event in events:
        yield replace(event, route=route) if isinstance(event, Finish) else event


async def _next_edge_event(events: AsyncIterator[Event], stall: float) -> Event | Cut | None:
    """The edge's next event within `stall` seconds; a `Cut` when it stalls or fails in a way an
    origin can take over; None when it ends without a Finish."""
    try:
        async with asyncio.timeout(stall):
            return await anext(events)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        return Cut("stall")
    except GatewayError as exc:
        if exc.kind not in FAILOVER_KINDS:
            raise
        return Cut("edge-failed-mid-stream")


@owns("events")
async def _follow_edge(deps: Deps, gen_request: GenerationRequest, plan: Plan, verdict: EdgeVerdict,
                       first: Event, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """Relay the edge stream from its `first` event. Its Finish is the edge's success; a stall or
    a failure after tokens is its failure, and an origin continues the text already sent (one
    stream, route `edge,origin`, never cached). Ending any other way records no verdict."""
    stall = deps.config.routing.stall_ms / 1000
    sent: list[str] = []
    called = False  # a tool-call fragment reached the client: no origin can continue a half-sent call
    try:
        step: Event | Cut | None = first
        while not isinstance(step, Cut):
            if step is None:
                return
            if isinstance(step, Finish):
                verdict.record(ok=True)
                yield replace(step, route="edge")
                return
            if isinstance(step, ToolCallDelta):
                called = True
            else:
                sent.append(step.text)
            yield step
            step = await _next_edge_event(events, stall)
        await close_source(events)  # stop the edge generation before asking the origin
        verdict.record(ok=False)
        rest = _origin_continues(deps, gen_request, plan, step, "".join(sent), len(sent), called)
        try:
            async for event in rest:
                yield event
        finally:
            await close_source(rest)
    finally:
        verdict.close()
        await close_source(events)


async def _origin_continues(deps: Deps, gen_request: GenerationRequest, plan: Plan, cut: Cut, text: str, sent: int,
                            called: bool) -> AsyncIterator[Event]:
    """The rest of an answer the edge cut after `sent` tokens (`text`), from an origin; a 502 when
    no origin may continue it."""
    state = routing_state(deps)
    unfinishable = _not_continuable(gen_request, called)
    if unfinishable is not None:
        deps.log.warning("edge %s after %d tokens; %s", cut.reason, sent, unfinishable)
        raise GatewayError(ErrorKind.UPSTREAM, f"The edge failed mid-answer ({cut.reason}) and {unfinishable}.",
                           code="upstream_error", retry_after=RetryAfter.DEPENDENCY)
    stalled_at = deps.clock.now()
    state.counters.failovers_mid_stream += 1
    route = f"edge,origin; reason={cut.reason}"
    deps.log.warning("edge %s after %d tokens; the origin continues", cut.reason, sent)
    continuation = await _continue(deps, gen_request, plan.origins, text, sent)
    origin_tokens = 0
    async with aclosing(apply_stop(continuation, gen_request.stop)) as events:  # closed with this, wherever it is left
        async for event in events:
            if isinstance(event, (Token, ToolCallDelta)):
                if origin_tokens == 0:
                    state.last_stall_to_origin_ms = (deps.clock.now() - stalled_at) * 1000
                origin_tokens += 1
                yield event
            else:
                usage = Usage(plan.prompt_tokens or 0, sent + event.usage.completion_tokens)
                yield Finish(event.finish_reason, usage, route=route, cacheable=False)
                return


def _not_continuable(gen_request: GenerationRequest, called: bool) -> str | None:
    """Why an origin cannot continue this cut answer, or None. A continuation is the partial text
    as an assistant prefill: a tool call already begun cannot be resumed that way, and a grammar
    (a JSON schema, a tool call) constrains only what is generated, never the prefill, so the
    origin would not be bound by it where the edge stopped."""
    if called:
        return "a tool call already begun cannot be continued elsewhere"
    constrained = [name for name in ("tools", "response_format") if gen_request.inputs.get(name) is not None]
    if constrained:
        return f"an answer constrained by '{constrained[0]}' cannot be continued elsewhere"
    return None


async def _continue(deps: Deps, gen_request: GenerationRequest, origins: tuple[OriginConfig, ...], text: str, sent: int) -> AsyncIterator[Event]:
    last: GatewayError | None = None
    remaining = max(1, gen_request.max_tokens - sent)
    for choice in await pools.order(deps, gen_request, origins, None):
        origin = choice.origin
        assert deps.fetch is not None
        choice = pools.dispatched(deps, choice, choice.reason)
        started = time.monotonic()
        try:
            events = await OriginClient(origin, deps.fetch, deps.tracer, deps.state.ids).start(gen_request, prefill=text, max_tokens=remaining)
        except GatewayError as exc:
            pools.failed(deps, choice)
            routing_state(deps).counters.origin_errors += 1
            deps.log.warning("origin %s could not continue: %s", origin.name, exc.detail or exc.message)
            last = exc
            continue
        except BaseException:
            pools.abandoned(deps, choice)
            raise
        return pools.followed(deps, choice, events, started)
    if last is None:
        raise GatewayError(ErrorKind.UPSTREAM, "The edge failed mid-answer and every replica that could continue it is down.",
                           code="upstream_error", retry_after=RetryAfter.DEPENDENCY)
    raise last
