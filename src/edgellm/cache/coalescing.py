"""Coalescing identical cacheable misses through a Durable Object (`Deps.flights`).

Each cacheable miss is sent to the object named by its flight key (the KV key plus how the
answer is stored); the object (`FlightObject`) owns the generation: it runs the binding once,
streams the same events to every request that arrives while it runs (from any isolate), writes
KV once when the answer is complete, and stops, writing nothing, when every client has left.
HITs never reach it. Without the binding the Worker does not coalesce at all: sharing a
generation between requests inside an isolate is what workerd forbids.

Between the Worker and the object the events travel as JSON lines (one per event; a failure is
a last `error` line), so a stream cut anywhere is told from a finished one.

The object only shares a stream: the Worker plans the route (`FlightPlan`, in the order) with
its own breaker and counters, and applies what the object reports at the end (`FlightVerdict`,
on the last line), because on Cloudflare the object's isolate is not the Worker's.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

from ..admission import admitted_as
from ..errors import ErrorKind, GatewayError, RetryAfter, dependency_error
from ..generation import Event, Finish, Generation, GenerationRequest, Token, ToolCallDelta, Usage
from ..http import Request, Response, json_bytes
from ..deps import Deps
from ..inference import start_generation
from ..routing.breaker import CircuitBreaker
from ..routing.failover import start_routed
from ..telemetry import tracing
from ..telemetry.spans import traced_generation
from ..routing.plan import Plan, first_token_budget, plan_route, routing_state
from ..routing.state import RoutingState
from .entry import record
from .store import store
from ..stream import close_source
from .flight import Flight, Subscription

FLIGHT_URL = "https://flight.edgellm.internal/generate"
FLIGHT_CONTENT_TYPE = "application/x-ndjson"
VERDICT_HEADER = "x-edgellm-flight-verdict"  # a flight that failed to start: its verdict (JSON)


@dataclass(frozen=True)
class FlightPlan:
    """The route the Worker decided for a flight, sent whole in its order: the object only
    shares a stream, it never plans. On Cloudflare the object runs in an isolate of its own, often
    elsewhere, with fresh per-isolate state; the Worker's isolate holds the breaker, the routing
    counters and the parsed tokenizer, and sees every miss. So the Worker plans (region, token
    count, what its breaker allows: edge or skip, a probe), and the object runs that plan with the
    Worker's budgets and model ids, then reports what happened (`FlightVerdict`) for the Worker to
    apply to its breaker and counters."""

    routed: bool = False  # routing configured; else the edge-only gateway
    edge: bool = True
    origins: tuple[str, ...] = ()  # names from ROUTING_ORIGINS, in the order to try them
    reason: str = "primary"
    probe: bool = False  # this flight decides the Worker's half-open breaker
    prompt_tokens: int | None = None
    first_token_s: float | None = None  # the edge's first-token budget (cf-aig-request-timeout)
    stall_ms: int | None = None
    models: tuple[str, ...] | None = None  # the edge's fallback model ids (None: the object's own)

    @classmethod
    async def decide(cls, deps: Deps, request: Request, gen_request: GenerationRequest) -> "FlightPlan":
        """Plan in the Worker, with its breaker and counters (a refusal is raised here, before
        any object is asked)."""
        config = deps.config
        if not config.routing.active:
            return cls(models=config.fallback_models)
        plan = await plan_route(deps, request, gen_request)
        budget = first_token_budget(config.routing, request) if plan.edge and plan.origins else None
        return cls(True, plan.edge, tuple(o.name for o in plan.origins), plan.reason, plan.probe, plan.prompt_tokens,
                   budget, config.routing.stall_ms, config.fallback_models)

    def to_json(self) -> dict[str, Any]:
        return {"routed": self.routed, "edge": self.edge, "origins": list(self.origins), "reason": self.reason,
                "probe": self.probe, "prompt_tokens": self.prompt_tokens, "first_token_s": self.first_token_s,
                "stall_ms": self.stall_ms, "models": None if self.models is None else list(self.models)}

    @classmethod
    def from_json(cls, data: Any) -> "FlightPlan":
        if not isinstance(data, dict):
            return cls()
        tokens, budget, stall, models = data.get("prompt_tokens"), data.get("first_token_s"), data.get("stall_ms"), data.get("models")
        return cls(bool(data.get("routed")), bool(data.get("edge", True)), tuple(str(o) for o in data.get("origins") or ()),
                   str(data.get("reason") or "primary"), bool(data.get("probe")), None if tokens is None else int(tokens),
                   None if budget is None else float(budget), None if stall is None else int(stall),
                   None if models is None else tuple(str(m) for m in models))

    def in_object(self, deps: Deps) -> tuple[Deps, Plan | None, RoutingState]:
        """The object's deps for this flight (the Worker's model ids and stall budget, a routing
        state of the flight's own whose breaker only records), and the core plan to run."""
        config = deps.config
        if self.models is not None:
            config = replace(config, fallback_models=self.models)
        if self.stall_ms is not None:
            config = replace(config, routing=replace(config.routing, stall_ms=self.stall_ms))
        routing = RoutingState(breaker=VerdictBreaker(config.routing.breaker))
        flight_deps = replace(deps, config=config, state=replace(deps.state, routing=routing))
        if not self.routed:
            return flight_deps, None, routing
        by_name = {o.name: o for o in config.routing.origins}
        origins = tuple(by_name[name] for name in self.origins if name in by_name)
        return flight_deps, Plan(self.edge, origins, self.reason, self.probe, self.prompt_tokens), routing


class VerdictBreaker(CircuitBreaker):
    """The breaker a flight runs with inside the object: it decides nothing (the Worker's breaker
    did, in the plan) and only records the verdict the run gives, for the Worker to apply."""

    verdict: str | None = None

    def admit(self, now: float) -> str:
        return "edge"

    def success(self, now: float) -> None:
        self.verdict = "success"

    def failure(self, now: float) -> None:
        self.verdict = "failure"

    def abandon(self) -> None:
        pass


def flight_verdict(routing: RoutingState | None) -> dict[str, Any] | None:
    """What a flight's run did to routing (breaker verdict, counters), as the object reports it."""
    if routing is None:
        return None
    breaker = routing.breaker
    counters = {name: value for name, value in routing.counters.to_json().items() if value}
    return {"breaker": getattr(breaker, "verdict", None), "counters": counters,
            "stall_to_origin_ms": routing.last_stall_to_origin_ms}


def apply_verdict(deps: Deps, plan: FlightPlan, verdict: dict[str, Any] | None) -> None:
    """The object's report, applied to the Worker's breaker and counters: a success or failure
    as if the Worker had run the edge itself; no verdict frees a probe the plan took."""
    if not plan.routed:
        return
    state, now = routing_state(deps), deps.clock.now()
    breaker = state.breaker
    assert breaker is not None
    outcome = (verdict or {}).get("breaker")
    if outcome == "success":
        breaker.success(now)
    elif outcome == "failure":
        breaker.failure(now)
    elif plan.probe:
        breaker.abandon()
    for name, value in ((verdict or {}).get("counters") or {}).items():
        if isinstance(value, int) and isinstance(getattr(state.counters, name, None), int):
            setattr(state.counters, name, getattr(state.counters, name) + value)
    stall = (verdict or {}).get("stall_to_origin_ms")
    if isinstance(stall, (int, float)):
        state.last_stall_to_origin_ms = float(stall)


@dataclass(frozen=True)
class FlightOrder:
    """What the Worker asks the object for: the generation, where and how to store it, and the
    route the Worker planned for it."""

    request: GenerationRequest
    kv_key: str
    write: bool
    ttl: int
    plan: FlightPlan = field(default_factory=FlightPlan)
    tenant: str | None = None  # whose generation the Worker admitted (the local engine's fair queue is told it)

    def encode(self) -> bytes:
        r = self.request
        return json_bytes({"model": r.model, "inputs": r.inputs, "stop": list(r.stop), "stream": r.stream,
                           "include_usage": r.include_usage, "session": r.session, "prefix_scope": r.prefix_scope,
                           "kv_key": self.kv_key, "write": self.write, "ttl": self.ttl, "plan": self.plan.to_json(),
                           "tenant": self.tenant})

    @classmethod
    def decode(cls, data: bytes) -> "FlightOrder":
        obj = json.loads(data)
        request = GenerationRequest(obj["model"], obj["inputs"], tuple(obj["stop"]), stream=bool(obj["stream"]),
                                    include_usage=bool(obj.get("include_usage")),
                                    # the first asker's session warms the model's cache (never part of the key)
                                    session=str(obj["session"]) if obj.get("session") else None,
                                    prefix_scope=str(obj["prefix_scope"]) if obj.get("prefix_scope") else None)
        tenant = obj.get("tenant")
        return cls(request, str(obj["kv_key"]), bool(obj["write"]), int(obj["ttl"]), FlightPlan.from_json(obj.get("plan")),
                   str(tenant) if tenant is not None else None)


def flight_name(kv_key: str, write: bool, ttl: int) -> str:
    """Requests share a flight only if they would store its answer the same way (write or not,
    for how long): a `no-store` or short-TTL request never decides for another."""
    return f"{kv_key}|{'w' if write else 'n'}|{ttl}"


# --- the wire between the Worker and the object ----------------------------------------------


def encode_event(event: Event, routing: dict[str, Any] | None = None) -> bytes:
    """One event as a JSON line, whole: logprobs, tool-call fragments, and the finish's route and
    whether it may be cached (an answer stitched from two routes may not) all cross intact."""
    if isinstance(event, Token):
        data: dict[str, Any] = {"token": event.text}
        if event.logprobs is not None:
            data["logprobs"] = list(event.logprobs)
    elif isinstance(event, ToolCallDelta):
        data = {"tool_call": {"index": event.index, "id": event.id, "name": event.name, "arguments": event.arguments}}
    else:
        data = {"finish": event.finish_reason, "usage": event.usage.to_json(), "route": event.route, "cacheable": event.cacheable}
        if routing is not None:
            data["routing"] = routing
    return json_bytes(data) + b"\n"


def decode_event(data: dict[str, Any]) -> Event | None:
    """The event a JSON line carries (None for an error line)."""
    if "token" in data:
        logprobs = data.get("logprobs")
        return Token(str(data["token"]), tuple(logprobs) if isinstance(logprobs, list) else None)
    if "tool_call" in data:
        call = data["tool_call"]
        return ToolCallDelta(int(call["index"]), call.get("id"), call.get("name"), str(call.get("arguments") or ""))
    if "finish" in data:
        route = data.get("route")
        return Finish(str(data["finish"]), Usage.from_json(data.get("usage")), str(route) if route else None,
                      bool(data.get("cacheable", True)))
    return None


def object_error(exc: BaseException, message: str) -> GatewayError:
    """An exception in the object as the error it sends back: a `GatewayError` as it is, any other
    in the gateway's words with the exception's text as the detail (logged by the Worker, never
    shown: the object-to-Worker line is internal, the Worker's answer to its client is not)."""
    return exc if isinstance(exc, GatewayError) else dependency_error(exc, ErrorKind.UPSTREAM, message, "upstream_error", RetryAfter.DEPENDENCY,
                                                                       "in the flights object")


def encode_error(exc: BaseException, routing: dict[str, Any] | None = None) -> bytes:
    error = object_error(exc, "The shared generation failed (the details are in the edge log); retry shortly.")
    return json_bytes({"error": error.to_json()["error"], "status": error.status, "retry_after": error.retry_after,
                       "routing": routing, "detail": error.detail}) + b"\n"


def error_from(data: dict[str, Any], status: int, retry_after: int | None) -> GatewayError:
    """A `GatewayError` the object sent back (its JSON shape), rebuilt for the Worker's client."""
    error = data.get("error") if isinstance(data.get("error"), dict) else {}
    kind = next((k for k in ErrorKind if k.status == status and k.type == error.get("type")), None)
    kind = kind or next((k for k in ErrorKind if k.status == status), ErrorKind.UPSTREAM)
    detail = data.get("detail")
    return GatewayError(kind, str(error.get("message") or "The shared generation failed."),
                        param=error.get("param"), code=error.get("code"), retry_after=retry_after,
                        detail=str(detail) if detail else None)


@dataclass
class FlightBody:
    """The object's streamed answer to one request: its subscription, as JSON lines. A class,
    not a generator, so that closing it before its first read still uncounts the request."""

    subscription: Subscription
    routing: RoutingState | None = None  # the flight's run, reported on the last line
    failed: bool = False

    def __aiter__(self) -> "FlightBody":
        return self

    async def __anext__(self) -> bytes:
        if self.failed:
            raise StopAsyncIteration
        try:
            event = await anext(self.subscription)
            return encode_event(event, flight_verdict(self.routing) if isinstance(event, Finish) else None)
        except StopAsyncIteration:
            raise
        except Exception as exc:
            self.failed = True
            return encode_error(exc, flight_verdict(self.routing))

    async def aclose(self) -> None:
        await self.subscription.aclose()


@dataclass
class RoutedFlight(Flight):
    routing: RoutingState | None = None  # what the run did to routing, for the Worker


@dataclass
class FlightObject:
    """The Durable Object's logic (hosted by `entry.Flight` on Cloudflare, by the local edge's
    emulation locally). One object per flight name, so at most one flight runs in it at a time.
    Its `deps.state` is the object's own (fresh, as on Cloudflare): nothing in it decides a route."""

    deps: Deps  # the object's own bindings: AI, KV, clock
    current: RoutedFlight | None = None
    generations: int = 0  # started by this object (tests and benchmarks read it)
    joined: int = 0

    async def fetch(self, request: Request) -> Response:
        try:
            order = FlightOrder.decode(request.body)
        except (ValueError, KeyError, TypeError) as exc:
            refused = GatewayError(ErrorKind.INVALID_REQUEST, "Bad flight order.", code="bad_flight_order",
                                   detail=f"bad flight order: {type(exc).__name__}: {exc}")
            return refused.to_response({"detail": refused.detail})
        flight, role = self.current, "joined"
        if flight is None or flight.done:
            flight, role = self._start(order, tracing.parse_traceparent(request.header("traceparent"))), "started"
        else:
            self.joined += 1
        subscription = flight.join()
        try:
            model = await asyncio.shield(flight.started)
        except asyncio.CancelledError:
            await subscription.aclose()
            raise
        except Exception as exc:
            await subscription.aclose()
            error = object_error(exc, "The generation failed to start (the details are in the edge log); retry shortly.")
            response = error.to_response({"detail": error.detail} if error.detail else None)
            response.headers["x-edgellm-flight"] = role
            response.headers[VERDICT_HEADER] = json_bytes(flight_verdict(flight.routing)).decode()
            return response
        headers = {"content-type": FLIGHT_CONTENT_TYPE, "x-edgellm-model": model, "x-edgellm-flight": role}
        if flight.route:
            headers["x-edgellm-route"] = flight.route
        return Response(200, headers, FlightBody(subscription, flight.routing))

    def _start(self, order: FlightOrder, trace: tracing.SpanContext | None) -> RoutedFlight:
        """The flight's producer, started under what the Worker sent (the object's isolate has none
        of the request's context): its trace, so the generation's span, the KV write's and an
        origin's `traceparent` stay in the client's trace, and its admitted tenant."""
        deps, routing_deps, plan, routing = self.deps, *order.plan.in_object(self.deps)
        self.generations += 1

        def on_done(done: Flight) -> None:
            if self.current is done:
                self.current = None
            answer = record(done.model, done.events, deps.clock.now()) if done.error is None else None
            if answer is not None and order.write:
                deps.wait_until(store(deps, order.kv_key, answer, order.ttl))

        async def run() -> Generation:
            # on the Worker's plan (edge, origins, budgets); a stitched answer's Finish is not
            # cacheable, so `record` refuses it and the flight writes nothing
            if plan is None:  # routing not configured: the edge-only gateway (a new value, never a changed one)
                return replace(await start_generation(routing_deps, order.request), route="edge; reason=primary")
            return await start_routed(routing_deps, Request("POST", FLIGHT_URL), order.request, plan, order.plan.first_token_s)

        # the flight's generation: a span under the Worker's `cache.flight` span, when one records
        with tracing.using(tracing.Span(trace)) if trace is not None else nullcontext(), admitted_as(order.tenant):
            self.current = RoutedFlight(routing=routing).start(lambda: traced_generation(routing_deps, order.request, run), on_done)  # type: ignore[assignment]
        deps.wait_until(self.current.producer)  # keeps the object alive until the answer is complete
        return self.current


@dataclass
class FlightEvents:
    """The Worker's side of a flight: JSON lines from the object's stream back into events. An
    answer that ends without its Finish or an error line was cut, and says so."""

    body: AsyncIterator[bytes]
    on_verdict: Callable[[dict[str, Any] | None], None] | None = None  # called once: the run's report, or None
    _buffer: bytes = b""
    _pending: list[bytes] = field(default_factory=list)
    _ended: bool = False

    def _verdict(self, data: dict[str, Any] | None) -> None:
        report, self.on_verdict = self.on_verdict, None
        if report is not None:
            report(data)

    def __aiter__(self) -> "FlightEvents":
        return self

    async def __anext__(self) -> Event:
        while not self._pending:
            if self._ended:
                raise StopAsyncIteration
            try:
                chunk = await anext(self.body)
            except StopAsyncIteration:
                self._ended = True
                if self._buffer.strip():
                    self._pending.append(self._buffer)
                    self._buffer = b""
                    continue
                raise GatewayError(ErrorKind.UPSTREAM, "The shared generation was cut before its end.",
                                   code="generation_cut", retry_after=RetryAfter.AT_ONCE) from None
            lines = (self._buffer + chunk).split(b"\n")
            self._buffer = lines.pop()
            self._pending.extend(line for line in lines if line.strip())
        data = json.loads(self._pending.pop(0))
        event = decode_event(data)
        if event is None or isinstance(event, Finish):
            self._verdict(data.get("routing") if isinstance(data.get("routing"), dict) else None)
        if isinstance(event, Finish):
            self._ended, self._pending = True, []
            await self.aclose()
        if event is not None:
            return event
        self._ended, self._pending = True, []
        await self.aclose()
        raise error_from(data, int(data.get("status") or 502), data.get("retry_after"))

    async def aclose(self) -> None:
        self._verdict(None)  # closed before the end (the client left): no verdict
        await close_source(self.body)


async def shared_generation(deps: Deps, order: FlightOrder) -> tuple[Generation, bool]:
    """Ask the flight's object for the generation: (generation, whether this request joined one
    already running)."""
    assert deps.flights is not None
    stub = deps.flights.get(flight_name(order.kv_key, order.write, order.ttl))
    headers = {"content-type": "application/json"}
    if tracing.current_span() is not None:  # a trace someone reads (a tracer records, or an origin may be called)
        # goes on to the object as to any service the request calls (W3C trace context): on
        # Cloudflare the object runs in an isolate of its own, which sees nothing else of it
        headers["traceparent"] = tracing.outgoing(deps.tracer, deps.state.ids)
    request = Request("POST", FLIGHT_URL, headers, order.encode())
    try:
        response = await stub.fetch(request)
    except GatewayError:
        raise
    except Exception as exc:  # the object failed (on workerd an AbortError carrying its traceback): its text is the log's
        raise dependency_error(exc, ErrorKind.UPSTREAM, "The coalescing object failed (the details are in the edge log); retry shortly.",
                               "flight_failed", RetryAfter.AT_ONCE, "the flights object") from exc
    started = response.headers.get("x-edgellm-flight") == "started"
    # only the request that started the flight applies its verdict; a joiner frees a probe it took
    report = (lambda verdict: apply_verdict(deps, order.plan, verdict)) if started else (lambda verdict: apply_verdict(deps, order.plan, None))
    if response.status != 200 or not response.is_streaming:
        try:
            verdict = json.loads(response.headers.get(VERDICT_HEADER) or "null")
        except ValueError:
            verdict = None
        report(verdict if isinstance(verdict, dict) else None)
        body = response.body if isinstance(response.body, (bytes, bytearray)) else b"".join([c async for c in response.body])
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        retry = response.headers.get("retry-after")
        raise error_from(data if isinstance(data, dict) else {}, response.status, int(retry) if retry and retry.isdigit() else None)
    model = response.headers.get("x-edgellm-model", order.request.model)
    events = FlightEvents(response.body, report)  # type: ignore[arg-type]
    generation = Generation(model, events, route=response.headers.get("x-edgellm-route"))
    return generation, response.headers.get("x-edgellm-flight") == "joined"
