"""Usage: every request recorded once it is answered (a stream: once its body ends, a client
that left: when it left), and the tokens charged to the key's window. HITs count as requests,
never as tokens.

What was generated is counted always: a stream cut before its final event is charged the
tokens it delivered plus its prompt (the estimate of `access.reservation` when the answer never
said), and a whole-answer request whose client left is charged its reservation, since the
binding's whole-answer call reports nothing until it ends."""

from __future__ import annotations

from typing import Callable

from ..generation import Event, Finish, Generation, Token, ToolCallDelta
from ..http import Response
from ..caller import Observation, Principal, Reservation
from ..context import RequestContext
from ..ports import UsageEvent
from ..deps import Deps
from ..stream import Stream
from .ratelimit import charge_tokens
from .reservation import settle

CLIENT_LEFT = 499  # the status recorded for a request whose client left before its answer (nginx's)


def _seen_by(seen: Observation, now: Callable[[], float] | None) -> Callable[[Event], None]:
    """The tap filling `seen` from a generation's events as they pass to the renderer (and, with
    `now`, when its first token passed: the request's time to first token)."""

    def see(event: Event) -> None:
        if isinstance(event, Finish):
            seen.prompt_tokens, seen.completion_tokens = event.usage.prompt_tokens, event.usage.completion_tokens
            seen.finished = True
            if event.route:
                seen.route = event.route
        elif isinstance(event, (Token, ToolCallDelta)):
            if not seen.delivered and now is not None:
                seen.first_token_at = now()
            seen.delivered += 1

    return see


def observe(ctx: RequestContext, generation: Generation, now: Callable[[], float] | None = None) -> None:
    """Called by the API handlers with the generation they serve: taps its events. A `Stream`,
    so closing it unread (a client gone before the first byte) still closes the events behind it,
    and with them the generation's admission ticket. `now`: the clock (`deps.clock.now`)."""
    seen = Observation(generation.model, generation.cache_status or "BYPASS", route=generation.route)
    ctx.observed = seen
    reported = generation.prompt_seen

    def unfinished() -> None:  # closed before its Finish: the prompt the model counted, when it said (not the estimate)
        if not seen.finished and not seen.prompt_tokens and reported is not None:
            seen.prompt_tokens = reported.prompt_tokens

    generation.events = Stream(generation.events).tap(_seen_by(seen, now)).on_close(unfinished)


def _unfinished(seen: Observation, reservation: Reservation | None, streamed: bool) -> None:
    """Fill the counts of an answer that ended before its Finish: the tokens delivered (a whole
    answer delivers nothing before its end: then its reservation's `max_tokens`), and the
    prompt as estimated at admission."""
    prompt = reservation.prompt_tokens if reservation is not None else 0
    seen.prompt_tokens = seen.prompt_tokens or prompt
    if streamed or reservation is None:
        seen.completion_tokens = max(seen.completion_tokens, seen.delivered)
    else:
        seen.completion_tokens = max(seen.completion_tokens, seen.delivered, reservation.max_tokens)


def _record(ctx: RequestContext, response: Response, deps: Deps) -> None:
    principal: Principal | None = ctx.principal
    if principal is None:
        return
    seen: Observation | None = ctx.observed
    reservation: Reservation | None = ctx.reservation
    started, route = ctx.started, ctx.route
    now = ctx.ended = deps.clock.now()  # the request's end, for the telemetry layer's metrics and log line too
    tokens = 0
    if seen is None and reservation is not None and response.status == CLIENT_LEFT:
        seen = Observation(reservation.model, "")  # left while the answer was being made: it may all have been generated
    if seen is not None and seen.cache_status != "HIT":
        if not seen.finished:
            _unfinished(seen, reservation, response.is_streaming)
        elif seen.prompt_tokens == 0 and reservation is not None:  # an answer cut short that could not say its prompt
            seen.prompt_tokens = reservation.prompt_tokens
        tokens = seen.prompt_tokens + seen.completion_tokens
        if principal.record is not None and reservation is None:
            charge_tokens(deps.state.access, principal.key_id, principal.record.tokens_per_minute, tokens, now)
            spent = deps.state.access.spent
            spent[principal.key_id] = spent.get(principal.key_id, 0) + tokens
    if reservation is not None:
        settle(deps.state.access, reservation, tokens, now)
    if deps.usage is None:
        return
    # its values in the fields' order (`_make`): a named tuple's keywords are matched in Python,
    # which cost a HIT more than twice what the row's values do
    event = UsageEvent._make((
        now,  # time
        principal.scope.usage_tenant,  # tenant
        principal.key_id,  # key_id
        seen.model if seen else "",  # model
        route,  # route
        seen.cache_status if seen else "",  # cache_status
        seen.prompt_tokens if seen else 0,  # prompt_tokens
        seen.completion_tokens if seen else 0,  # completion_tokens
        round(max(0.0, now - started) * 1000, 3),  # latency_ms
        response.status,  # status
        ctx.guardrails.usage_value if ctx.guardrails is not None else "",  # guardrails
    ))
    try:
        deps.usage.record_now(event)  # only queues the row (UsageSink): no task, no wait
    except Exception as exc:  # usage never fails a request
        deps.log.warning("usage record failed: %s", exc)


def departed(ctx: RequestContext, deps: Deps) -> Response:
    """A request whose client left before its answer (the handler was cancelled): recorded
    now, with what it generated, as a 499 (a streamed body is recorded when it is closed).
    The usage row's route is the route's template (`ctx.route`), never the raw path."""
    response = Response(CLIENT_LEFT)
    if ctx.principal is not None:
        _record(ctx, response, deps)
    return response


def account(ctx: RequestContext, response: Response, deps: Deps) -> Response:
    """Record the request's usage now, or when its streamed body ends (however it ends).
    Public routes (artifacts, health) are not recorded: their bodies are handed over as they are."""
    if ctx.principal is None:
        return response
    if isinstance(response.body, (bytes, bytearray)):  # a whole answer (`Response.is_streaming`, without its call)
        _record(ctx, response, deps)
        return response
    # a Stream: a body closed before its first read is still recorded, and still closes what it streams
    response.body = Stream(response.body).on_close(lambda: _record(ctx, response, deps))
    return response
