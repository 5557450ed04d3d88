"""Coalescing identical cacheable misses through a Durable Object (`Deps.flights`).

Each cacheable miss is sent to the object named by its flight key (the KV key plus how the
answer is stored); the object (`FlightObject`) owns the generation: it runs the binding once,
streams the same events to every request that arrives while it runs (from any isolate), writes
KV once when the answer is complete, and stops, writing nothing, when every client has left.
HITs never reach it. Without the binding the Worker does not coalesce at all: sharing a
generation between requests inside an isolate is what workerd forbids.

Between the Worker and the object the events travel as JSON lines (one per event; a failure is
a last `error` line), so a stream cut anywhere is told from a finished one.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..errors import ErrorKind, GatewayError
from ..generation import Event, Finish, Generation, GenerationRequest, Token, ToolCallDelta, Usage
from ..http import Request, Response, json_bytes
from ..ports import Deps
from ..routing.policy import TIMEOUT_HEADER, start_routed
from .entry import record
from .store import store
from .flight import Flight, Subscription

FLIGHT_URL = "https://flight.edgellm.internal/generate"
FLIGHT_CONTENT_TYPE = "application/x-ndjson"


ROUTE_HEADERS = (TIMEOUT_HEADER, "cf-ipcountry", "cf-ipcontinent")


@dataclass(frozen=True)
class RouteContext:
    """What routing reads from the request that starts a flight (its region, its first-token
    budget): the object routes the shared generation as the Worker would have routed it. Joiners
    share the starter's route; their region is the same wherever it matters, since a resident
    region's answers live under a key (hence a flight) of their own."""

    headers: dict[str, str] = field(default_factory=dict)
    cf: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, request: Request) -> "RouteContext":
        headers = {name: value for name in ROUTE_HEADERS if (value := request.header(name)) is not None}
        cf = {k: str(v) for k, v in request.cf.items() if k in ("country", "continent")}
        return cls(headers, cf)

    def request(self) -> Request:
        return Request("POST", FLIGHT_URL, dict(self.headers), b"", cf=dict(self.cf))


@dataclass(frozen=True)
class FlightOrder:
    """What the Worker asks the object for: the generation, where and how to store it, and
    what routing needs of the request that asked."""

    request: GenerationRequest
    kv_key: str
    write: bool
    ttl: int
    route: RouteContext = field(default_factory=RouteContext)

    def encode(self) -> bytes:
        r = self.request
        return json_bytes({"model": r.model, "inputs": r.inputs, "stop": list(r.stop), "stream": r.stream,
                           "include_usage": r.include_usage, "session": r.session, "prefix_scope": r.prefix_scope, "kv_key": self.kv_key, "write": self.write, "ttl": self.ttl,
                           "route": {"headers": self.route.headers, "cf": self.route.cf}})

    @classmethod
    def decode(cls, data: bytes) -> "FlightOrder":
        obj = json.loads(data)
        request = GenerationRequest(obj["model"], obj["inputs"], tuple(obj["stop"]), stream=bool(obj["stream"]),
                                    include_usage=bool(obj.get("include_usage")),
                                    # the first asker's session warms the model's cache (never part of the key)
                                    session=str(obj["session"]) if obj.get("session") else None,
                                    prefix_scope=str(obj["prefix_scope"]) if obj.get("prefix_scope") else None)
        route = obj.get("route") or {}
        context = RouteContext({str(k): str(v) for k, v in (route.get("headers") or {}).items()},
                               {str(k): str(v) for k, v in (route.get("cf") or {}).items()})
        return cls(request, str(obj["kv_key"]), bool(obj["write"]), int(obj["ttl"]), context)


def flight_name(kv_key: str, write: bool, ttl: int) -> str:
    """Requests share a flight only if they would store its answer the same way (write or not,
    for how long): a `no-store` or short-TTL request never decides for another."""
    return f"{kv_key}|{'w' if write else 'n'}|{ttl}"


# --- the wire between the Worker and the object ----------------------------------------------


def encode_event(event: Event) -> bytes:
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


def encode_error(exc: BaseException) -> bytes:
    error = exc if isinstance(exc, GatewayError) else GatewayError(
        ErrorKind.UPSTREAM, f"The shared generation failed: {type(exc).__name__}.", code="upstream_error", retry_after=5)
    return json_bytes({"error": error.to_json()["error"], "status": error.status, "retry_after": error.retry_after}) + b"\n"


def error_from(data: dict[str, Any], status: int, retry_after: int | None) -> GatewayError:
    """A `GatewayError` the object sent back (its JSON shape), rebuilt for the Worker's client."""
    error = data.get("error") if isinstance(data.get("error"), dict) else {}
    kind = next((k for k in ErrorKind if k.status == status and k.type == error.get("type")), None)
    kind = kind or next((k for k in ErrorKind if k.status == status), ErrorKind.UPSTREAM)
    return GatewayError(kind, str(error.get("message") or "The shared generation failed."),
                        param=error.get("param"), code=error.get("code"), retry_after=retry_after)


@dataclass
class FlightBody:
    """The object's streamed answer to one request: its subscription, as JSON lines. A class,
    not a generator, so that closing it before its first read still uncounts the request."""

    subscription: Subscription
    failed: bool = False

    def __aiter__(self) -> "FlightBody":
        return self

    async def __anext__(self) -> bytes:
        if self.failed:
            raise StopAsyncIteration
        try:
            return encode_event(await anext(self.subscription))
        except StopAsyncIteration:
            raise
        except Exception as exc:
            self.failed = True
            return encode_error(exc)

    async def aclose(self) -> None:
        await self.subscription.aclose()


@dataclass
class FlightObject:
    """The Durable Object's logic (hosted by `entry.Flight` on Cloudflare, by the local edge's
    emulation locally). One object per flight name, so at most one flight runs in it at a time."""

    deps: Deps  # the object's own bindings: AI, KV, clock
    current: Flight | None = None
    generations: int = 0  # started by this object (tests and benchmarks read it)
    joined: int = 0

    async def fetch(self, request: Request) -> Response:
        try:
            order = FlightOrder.decode(request.body)
        except (ValueError, KeyError, TypeError) as exc:
            return GatewayError(ErrorKind.INVALID_REQUEST, f"Bad flight order: {exc}", code="bad_flight_order").to_response()
        flight, role = self.current, "joined"
        if flight is None or flight.done:
            flight, role = self._start(order), "started"
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
            error = exc if isinstance(exc, GatewayError) else GatewayError(
                ErrorKind.UPSTREAM, f"The generation failed to start: {type(exc).__name__}.", code="upstream_error", retry_after=5)
            return error.to_response()
        headers = {"content-type": FLIGHT_CONTENT_TYPE, "x-edgellm-model": model, "x-edgellm-flight": role}
        if flight.route:
            headers["x-edgellm-route"] = flight.route
        return Response(200, headers, FlightBody(subscription))

    def _start(self, order: FlightOrder) -> Flight:
        deps = self.deps
        self.generations += 1

        def on_done(done: Flight) -> None:
            if self.current is done:
                self.current = None
            answer = record(done.model, done.events, deps.clock.now()) if done.error is None else None
            if answer is not None and order.write:
                deps.wait_until(store(deps, order.kv_key, answer, order.ttl))

        # routed as the Worker routes (edge, origin, failover); a stitched answer's Finish is not
        # cacheable, so `record` refuses it and the flight writes nothing
        self.current = Flight().start(lambda: start_routed(deps, order.route.request(), order.request), on_done)
        deps.wait_until(self.current.producer)  # keeps the object alive until the answer is complete
        return self.current


@dataclass
class FlightEvents:
    """The Worker's side of a flight: JSON lines from the object's stream back into events. An
    answer that ends without its Finish or an error line was cut, and says so."""

    body: AsyncIterator[bytes]
    _buffer: bytes = b""
    _pending: list[bytes] = field(default_factory=list)
    _ended: bool = False

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
                                   code="generation_cut", retry_after=1) from None
            lines = (self._buffer + chunk).split(b"\n")
            self._buffer = lines.pop()
            self._pending.extend(line for line in lines if line.strip())
        data = json.loads(self._pending.pop(0))
        event = decode_event(data)
        if isinstance(event, Finish):
            self._ended, self._pending = True, []
            await self.aclose()
        if event is not None:
            return event
        self._ended, self._pending = True, []
        await self.aclose()
        raise error_from(data, int(data.get("status") or 502), data.get("retry_after"))

    async def aclose(self) -> None:
        close = getattr(self.body, "aclose", None)
        if close is not None:
            await close()


async def shared_generation(deps: Deps, order: FlightOrder) -> tuple[Generation, bool]:
    """Ask the flight's object for the generation: (generation, whether this request joined one
    already running)."""
    assert deps.flights is not None
    stub = deps.flights.get(flight_name(order.kv_key, order.write, order.ttl))
    request = Request("POST", FLIGHT_URL, {"content-type": "application/json"}, order.encode())
    try:
        response = await stub.fetch(request)
    except GatewayError:
        raise
    except Exception as exc:  # the object failed (on workerd an AbortError carrying its traceback)
        raise GatewayError(ErrorKind.UPSTREAM, f"The coalescing object failed: {type(exc).__name__}: {exc}",
                           code="flight_failed", retry_after=1) from exc
    if response.status != 200 or not response.is_streaming:
        body = response.body if isinstance(response.body, (bytes, bytearray)) else b"".join([c async for c in response.body])
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        retry = response.headers.get("retry-after")
        raise error_from(data if isinstance(data, dict) else {}, response.status, int(retry) if retry and retry.isdigit() else None)
    model = response.headers.get("x-edgellm-model", order.request.model)
    generation = Generation(model, FlightEvents(response.body), route=response.headers.get("x-edgellm-route"))  # type: ignore[arg-type]
    return generation, response.headers.get("x-edgellm-flight") == "joined"
