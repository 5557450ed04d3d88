"""Running the scheduler for one request: build its `Ask`, refresh stale load readings within
the probe's short timeout, ask the pool's Durable Object when one is bound (falling back on this
isolate's own view when it does not answer in time), and follow the answer to record how the
replica did.

Everything awaited here is this request's own I/O (its probes, its call to the object); the views
it updates are plain per-isolate data (`RoutingState.pools`), as the breaker is.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

from ..deps import Deps
from ..generation import Event, Finish, GenerationRequest, Token, ToolCallDelta
from ..stream import owns
from .config import OriginConfig, PoolConfig
from .counting import render_chat
from .fleet import LIVE_GAPS, MAX_GAPS, Expected, PoolView, time_between_tokens
from .probe import refresh
from .router import ask_router, report
from .scheduler import CHARS_PER_TOKEN, Ask, prefix_blocks


def ask_for(gen_request: GenerationRequest, prompt_tokens: int | None) -> Ask:
    """The request's prompt as the scheduler reads it. Any fixed rendering hashes the same
    messages the same way; the tokens are the counted ones, else estimated from the length."""
    inputs = gen_request.inputs
    if "prompt" in inputs and inputs.get("raw"):
        text = str(inputs["prompt"])
        continues = True  # a raw prompt may hold earlier turns: taken as continuing, its history wherever it is
    else:
        messages = [m for m in inputs.get("messages") or [{"role": "user", "content": inputs.get("prompt", "")}] if isinstance(m, dict)]
        text = render_chat("<|im_start|>", [{"role": str(m.get("role", "")), "content": _text(m.get("content"))} for m in messages])
        continues = any(m.get("role") == "assistant" for m in messages)
    tokens = float(prompt_tokens) if prompt_tokens is not None else len(text) / CHARS_PER_TOKEN
    return Ask(prefix_blocks(text), tokens, len(text), gen_request.session, continues=continues)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: their text, in order
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def pool_view(deps: Deps, pool: PoolConfig) -> PoolView:
    views = deps.state.routing.pools
    view = views.get(pool.name)
    if view is None or view.config != pool:
        view = views[pool.name] = PoolView(pool, deps.config.routing.breaker)
    return view


@dataclass(frozen=True)
class Choice:
    """One replica to try, and why it comes where it does (`prefix`, `load`, `session`)."""

    origin: OriginConfig
    reason: str
    view: PoolView | None = None
    ask: Ask | None = None
    lease: str | None = None  # the pool's object counts this request under it (the first pick only)
    expected: Expected | None = None  # what the isolate's view expected the replica to reuse, once sent


async def order(deps: Deps, gen_request: GenerationRequest, origins: tuple[OriginConfig, ...],
                prompt_tokens: int | None) -> list[Choice]:
    """`origins` in the order to try them: each pool's replicas where the pool's first replica
    stood, ordered by the pool's policy (replicas that are down left out); origins of no pool
    keep their place."""
    routing = deps.config.routing
    out: list[Choice] = []
    done: set[str] = set()
    ask: Ask | None = None
    for origin in origins:
        pool = routing.pool_of(origin)
        if pool is None:
            out.append(Choice(origin, ""))
            continue
        if pool.name in done:
            continue
        done.add(pool.name)
        members = [o for o in origins if o.pool == pool.name]
        ask = ask or ask_for(gen_request, prompt_tokens)
        view = pool_view(deps, pool)
        picks, lease = await _picks(deps, view, members, ask)
        by_name = {o.name: o for o in members}
        out.extend(Choice(by_name[p.name], p.reason, view, ask, lease if i == 0 else None)
                   for i, p in enumerate(picks) if p.name in by_name)
    return out


async def _picks(deps: Deps, view: PoolView, members: list[OriginConfig], ask: Ask) -> tuple[list[Any], str | None]:
    """The pool object's order when it answers in time (it probes on its own), else this
    isolate's, after refreshing its stale readings within the probe's timeout."""
    asked = await ask_router(deps, view, ask)
    if asked is not None:
        return asked
    await refresh(deps, view, members)
    return view.choose(ask, deps.clock.now()), None


def dispatched(deps: Deps, choice: Choice, reason: str) -> Choice:
    """`choice` is being sent: the view counts it in flight; the choice returned carries what the
    view expected of the replica, for `finished` to hold the answer against."""
    if choice.view is not None and choice.ask is not None:
        return replace(choice, expected=choice.view.dispatched(choice.origin.name, choice.ask, reason, deps.clock.now()))
    return choice


def abandoned(deps: Deps, choice: Choice) -> None:
    """The request sent on `choice` ended with no verdict on the replica (the client left, or the
    request itself was refused)."""
    if choice.view is not None:
        choice.view.finished(choice.origin.name, deps.clock.now(), None, expected=choice.expected)


def failed(deps: Deps, choice: Choice) -> None:
    """The replica refused or could not be reached before answering."""
    if choice.view is not None:
        choice.view.finished(choice.origin.name, deps.clock.now(), ok=False, expected=choice.expected)
        report(deps, choice, ok=False)


@dataclass
class _Outcome:
    """What a replica's answer showed, gathered as it passes: token times, its usage, whether it
    failed (a client that leaves is no verdict)."""

    started: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    ok: bool | None = None
    cached: int | None = None
    prompt: int | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive tokens, the first `MAX_GAPS`
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=LIVE_GAPS))  # the last ones, while it streams
    clock: Callable[[], float] = time.monotonic

    def see(self, event: Event) -> None:
        if isinstance(event, (Token, ToolCallDelta)):
            now = self.clock()
            if self.last is not None:
                if len(self.gaps) < MAX_GAPS:
                    self.gaps.append(now - self.last)
                self.recent.append(now - self.last)
            self.first = now if self.first is None else self.first
            self.last = now
            self.tokens += 1
        elif isinstance(event, Finish):
            self.ok = True
            self.cached, self.prompt = event.usage.cached_tokens, event.usage.prompt_tokens


@owns("events")
async def _watched(events: AsyncIterator[Event], outcome: _Outcome) -> AsyncIterator[Event]:
    try:
        async for event in events:
            yield event
    except Exception:  # the replica failed mid-answer (a client leaving is GeneratorExit/CancelledError)
        outcome.ok = False
        raise


def followed(deps: Deps, choice: Choice, events: AsyncIterator[Event], started: float,
             clock: Callable[[], float] = time.monotonic) -> AsyncIterator[Event]:
    """The replica's events, passed on; from their first token, the pool's view can see the gaps between
    their latest tokens (a replica slowed down shows it before any answer of it ends); when they
    end, fail or are closed (even before their first step), the view hears how it went (time to
    first token, time between tokens, to the last token, what the replica said it reused from its
    cache) and its in-flight count comes down."""
    if choice.view is None:
        return events
    view = choice.view
    outcome = _Outcome(started, clock=clock)
    replica = view.replicas[choice.origin.name]
    sent_before, alone = replica.sent, replica.in_flight <= 1
    since: list[float] = []  # the replica's clock of neighbours waiting (`awaited`) at this answer's first token

    def done() -> None:
        view.unwatch(choice.origin.name, outcome.recent)
        now = deps.clock.now()
        ttft = None if outcome.first is None else outcome.first - outcome.started
        shared = not alone or replica.sent > sent_before or replica.shared(now, view.config.probe_age_ms / 1000)
        # how long a request this view sent there waited for its first token while this answer
        # streamed: the stalls a neighbour's prompt could have caused
        explained = replica.awaited(now) - since[0] if since else 0.0
        itl = time_between_tokens(outcome.gaps, shared, explained)
        total = None if outcome.last is None else outcome.last - outcome.started
        view.finished(choice.origin.name, now, outcome.ok, ttft, itl, outcome.cached, outcome.prompt, total,
                      expected=choice.expected, prefilled=outcome.first is not None)
        report(deps, choice, ok=outcome.ok, ttft_s=ttft, itl_s=itl, cached_tokens=outcome.cached, prompt_tokens=outcome.prompt,
               total_s=total)

    def see(event: Event) -> None:
        before = outcome.first
        outcome.see(event)
        if before is None and outcome.first is not None:
            now = deps.clock.now()
            if choice.expected is not None:
                view.prefilled(choice.origin.name, choice.expected, now)
            view.watch(choice.origin.name, outcome.recent, now)
            since.append(replica.awaited(now))

    return _watched(events, outcome).tap(see).on_close(done)


def route_text(choice: Choice, reason: str, why_not_edge: str) -> str:
    """`x-edgellm-route` for an origin answer: a pool's replica names itself and why it was
    chosen, with why the edge did not take it when the edge was in the plan."""
    if choice.view is None:
        return f"origin; reason={why_not_edge}; origin={choice.origin.name}"
    edge = "" if why_not_edge == "pool" else f"; edge={why_not_edge}"
    return f"origin; origin={choice.origin.name}; reason={reason}{edge}"

