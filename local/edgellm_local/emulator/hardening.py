"""Limits that make the local edge hold like a real HTTP server under hostile clients.

- The request head: a Host that is not a host is a 400 (the route comes from the path alone);
  `Transfer-Encoding` with `Content-Length` is a 400 and the connection closes (RFC 9112 6.3);
  more than `max_header_count` headers or `max_header_bytes` of them is a 431; a declared body
  over the limit is a 413 at once, from `Content-Length`, without reading it.
- Time: a connection must finish each request head within `head_timeout` (slowloris), each
  body chunk within `body_timeout` and the whole body at `body_min_rate` after that grace, and
  may idle `idle_timeout` between requests. Under pressure (the edge's places filling) the head
  and body deadlines shrink towards `head_timeout_min` / `body_timeout_min`, as Envoy's overload
  manager reduces its timeouts: a loaded edge cuts a slow client sooner than an idle one.
- Places (`ConnectionBook`): at most `max_connections` are open at once; one address may hold
  at most half the places still free (`address_share`: at least `min_connections_per_client`,
  at most `max_connections_per_client`), so its share shrinks as the edge fills; and request
  bodies still arriving may hold all places but `reserved_connections`, which slow bodies can
  never take (`/healthz` and every request without a body in flight find one).
- A connection refused a place is answered, never reset: a 503 with `Retry-After` written on
  the socket as it is accepted; a request body refused a place is a 503 before it is read.

Every refusal that leaves unread bytes on the connection says `connection: close`, and the
connection closes the way nginx's lingering close does: the answer is sent and the write side
shut, then what the client still sends is read and dropped (at most `linger_bytes`, for at
most `linger_timeout` seconds) before the socket closes. Closed at once instead, the client's
unsent body would meet a reset, and an HTTP client still writing it (httpx, requests, urllib)
reports a broken pipe instead of the answer (RFC 9112 9.6).
"""

from __future__ import annotations

import asyncio
import re
from http import HTTPStatus
from dataclasses import dataclass, field
from typing import Any

from edgellm.errors import ErrorKind, GatewayError, RetryAfter, invalid
from edgellm import workers_ai
from edgellm.http import Response

from edgellm_local.emulator.zero_copy import EXTENSION, ZeroCopySender, ZeroCopyStats

# RFC 3986 host (reg-name / IPv4 / bracketed IPv6) with an optional port
_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252}))(?::(\d{1,5}))?$")


@dataclass(frozen=True)
class ServerLimits:
    max_header_bytes: int = 32 * 1024
    max_header_count: int = 100
    head_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 5.0
    max_connections: int = 512
    # one address's share of the places: half of those still free (address_share), so it shrinks
    # as the edge fills; a fixed cap per address either starves a proxy's many clients on an idle
    # edge or lets ten addresses of slow bodies take every place
    max_connections_per_client: int = 256
    min_connections_per_client: int = 4  # an address always gets this many while any place is free
    # places a request body still arriving can never take (at most half of max_connections):
    # slow bodies from any number of addresses leave these to /healthz and bodiless requests
    reserved_connections: int = 32
    body_min_rate: float = 1024.0  # bytes/s: a body must arrive within body_timeout + its size / this
    max_request_line: int = 16 * 1024  # with max_header_bytes: how much of a head is read before it must end
    # the deadlines a full edge gives (scaled_timeout): a slow client then holds a place seconds, not tens
    head_timeout_min: float = 1.0
    body_timeout_min: float = 2.0
    # a refused request's lingering close: what is read and dropped after the answer before closing
    linger_bytes: int = 8 * 1024 * 1024
    linger_timeout: float = 2.0

    @property
    def max_head_bytes(self) -> int:
        return self.max_request_line + self.max_header_bytes

    @property
    def body_places(self) -> int:
        """How many requests may be receiving a body at once."""
        return self.max_connections - min(self.reserved_connections, self.max_connections // 2)


# The pressure (occupied share of the places) where deadlines start to shrink, and where they
# reach their minimum: Envoy's overload manager's scaling and saturation thresholds.
PRESSURE_FROM = 0.5
PRESSURE_FULL = 0.9
# A body read waits at most this long before it looks at the edge's pressure again: a slow body
# that started on an idle edge is cut soon after the edge fills, not at its idle deadline.
RECHECK_SECONDS = 1.0


def address_share(capacity: int, open_now: int, floor: int, ceiling: int) -> int:
    """How many places one address may hold while `open_now` of `capacity` are taken: half of
    the free ones, at least `floor` (while any is free), at most `ceiling`. Alone on an idle edge
    an address gets about a third of the places; the tenth of ten greedy addresses a few."""
    free = capacity - open_now
    if free <= 0:
        return 0
    return min(ceiling, max(floor, free // 2))


def scaled_timeout(base: float, floor: float, pressure: float) -> float:
    """`base` while the edge is at most PRESSURE_FROM full, `floor` from PRESSURE_FULL on, and
    in between a straight line from one to the other (Envoy's `reduce_timeouts` action)."""
    floor = min(base, floor)
    if pressure <= PRESSURE_FROM:
        return base
    if pressure >= PRESSURE_FULL:
        return floor
    return base - (base - floor) * (pressure - PRESSURE_FROM) / (PRESSURE_FULL - PRESSURE_FROM)


@dataclass
class ConnectionBook:
    """Who holds the edge's places now: kept by the protocol (connections) and the app (bodies),
    both on the server's loop, and read by every accept, every body and every deadline."""

    limits: "ServerLimits"
    open: int = 0  # connections holding a place
    by_address: dict[str, int] = field(default_factory=dict)
    reading: int = 0  # requests whose body is still arriving
    lingering: int = 0  # closed connections still draining what their client sends (no place)
    refused: int = 0  # connections answered 503 on accept (for tests and benchmarks)
    bodies_refused: int = 0  # bodies answered 503 before they were read

    def admit(self, address: str) -> str | None:
        """Takes a place for a new connection from `address`, or says why there is none."""
        limits = self.limits
        held = self.by_address.get(address, 0)
        if self.open >= limits.max_connections:
            return "Every connection place of the edge is taken."
        if held >= address_share(limits.max_connections, self.open, limits.min_connections_per_client, limits.max_connections_per_client):
            return f"This client address holds its share of the edge's connection places ({held})."
        self.open += 1
        self.by_address[address] = held + 1
        return None

    def leave(self, address: str) -> None:
        self.open -= 1
        held = self.by_address[address] - 1
        if held:
            self.by_address[address] = held
        else:
            del self.by_address[address]

    def pressure(self) -> float:
        return self.open / self.limits.max_connections

    def take_body_place(self) -> bool:
        if self.reading >= self.limits.body_places:
            return False
        self.reading += 1
        return True


def valid_host(host: str) -> bool:
    match = _HOST.fullmatch(host)
    return bool(match) and (match.group(1) is None or int(match.group(1)) <= 65535)


def _closing(error: GatewayError, path: str = "") -> Response:
    # Workers-AI-style clients read Cloudflare's envelope, as app.handle answers them
    extra = None
    if path.startswith("/client/v4/"):
        extra = workers_ai.result_envelope(None, success=False, errors=[{"code": error.status, "message": error.message}])
    response = error.to_response(extra)
    response.headers["connection"] = "close"
    return response


def refuse_head(scope: dict[str, Any], max_body_bytes: int, limits: ServerLimits) -> Response | None:
    """A refusal for a request head that must not reach the core, or None."""
    raw, path = scope["headers"], scope.get("path", "")
    if len(raw) > limits.max_header_count or sum(len(k) + len(v) + 4 for k, v in raw) > limits.max_header_bytes:
        return _closing(GatewayError(ErrorKind.REQUEST_HEADERS_TOO_LARGE, f"Request headers exceed {limits.max_header_count} fields or {limits.max_header_bytes} bytes.",
                                     code="headers_too_large"), path)
    names = [k.lower() for k, _ in raw]
    hosts = [v for k, v in raw if k.lower() == b"host"]
    if len(hosts) > 1 or (hosts and not valid_host(hosts[0].decode("latin-1"))):
        return _closing(invalid("The Host header is not a valid host.", "host", "invalid_host"), path)
    if b"transfer-encoding" in names and b"content-length" in names:
        return _closing(invalid("Transfer-Encoding together with Content-Length is ambiguous (RFC 9112); send one.",
                                "transfer-encoding", "ambiguous_length"), path)
    return None


def declared_too_large(scope: dict[str, Any], max_body_bytes: int) -> bool:
    """A `Content-Length` over the limit: the body is never read, and the core answers the request
    without it (its 413, with every header it gives, as the Worker answers it), on a connection
    then closed, since its unread body is still on the wire."""
    lengths = {v.strip() for k, v in scope["headers"] if k.lower() == b"content-length"}
    if len(lengths) != 1:
        return False
    declared = next(iter(lengths))
    return declared.isdigit() and int(declared) > max_body_bytes


def no_place(message: str) -> Response:
    """The 503 of a connection or a body refused a place: the client may come back soon."""
    return _closing(GatewayError(ErrorKind.UNAVAILABLE, message + " Retry later.", code="too_many_connections",
                                 retry_after=RetryAfter.ADMISSION))


def body_timed_out() -> Response:
    return _closing(GatewayError(ErrorKind.INVALID_REQUEST, "The request body did not arrive in time.", code="request_timeout"))


def body_too_large(limit: int) -> Response:
    return _closing(GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"The request body exceeds {limit} bytes.", code="request_too_large"))


def uvicorn_options(limits: ServerLimits, http: str = "httptools", zero_copy: ZeroCopyStats | None = None,
                    book: ConnectionBook | None = None) -> dict[str, Any]:
    """uvicorn.Config keywords: the idle timeout, and `http`'s parser ("httptools" or "h11")
    guarded as below. h11 also bounds an incomplete head itself; httptools does not, so the
    guard counts head bytes for both. `book` is the places' ledger the app reads too (its body
    places and deadlines); a new one when not given."""
    book = book if book is not None else ConnectionBook(limits)
    return {"timeout_keep_alive": limits.idle_timeout, "http": guarded_protocol(limits, _base_protocol(http), zero_copy, book),
            "h11_max_incomplete_event_size": limits.max_header_bytes}


def _base_protocol(http: str) -> type:
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    if http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return H11Protocol
    raise ValueError(f"unknown HTTP implementation {http!r}")


def raw_response(response: Response) -> bytes:
    """A whole HTTP/1.1 answer as bytes, for the protocol to write straight on a socket (before
    or outside any request the app sees)."""
    body = bytes(response.body)  # type: ignore[arg-type]
    headers = {**response.headers, "content-length": str(len(body))}
    return (f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}\r\n".encode("latin-1")
            + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()) + b"\r\n" + body)


def head_too_large(limits: ServerLimits) -> bytes:
    """The 431 written straight to the socket for a head that does not end in time (in bytes)."""
    return raw_response(_closing(GatewayError(ErrorKind.REQUEST_HEADERS_TOO_LARGE, f"The request head exceeds {limits.max_head_bytes} bytes.",
                                              code="headers_too_large")))


class _CycleTransport:
    """The connection's transport as uvicorn's protocol and cycles see it: writes go straight
    to it (bound methods, no call in between); `close` may linger (`GuardedProtocol._close`)."""

    def __init__(self, protocol: Any, transport: Any) -> None:
        self._protocol, self._transport = protocol, transport
        self.write, self.get_extra_info = transport.write, transport.get_extra_info

    def close(self) -> None:
        self._protocol._close()

    def is_closing(self) -> bool:
        return self._protocol._lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: ServerLimits, base: type, zero_copy: ZeroCopyStats | None = None,
                     book: ConnectionBook | None = None) -> type:
    """uvicorn's HTTP protocol (httptools or h11) with a head deadline, a head size cap, the
    places of `book` and a lingering close. The deadline is armed when a connection opens and
    whenever bytes of a new request arrive (its length read from the edge's pressure then), and
    disarmed once the head is complete (the ASGI cycle has started). The bytes of an unfinished
    head are counted for both parsers: httptools keeps accepting header lines for as long as they
    come (h11 stops at `h11_max_incomplete_event_size`).
    With `zero_copy` (httptools only), each request's scope offers the zero-copy file sender
    (zero_copy.py), which counts what it sends there."""
    book = book if book is not None else ConnectionBook(limits)

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0
        _address: str | None = None  # the address whose place this connection holds, while it does
        _lingering = False
        _lost = False
        _drained = 0
        _linger_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._raw = transport
            self.transport = _CycleTransport(self, transport)  # what every cycle of this connection is given
            address = self.client[0] if self.client else ""
            refusal = book.admit(address)
            if refusal is not None:
                # answered before its request is read (a reset would tell the client nothing);
                # the lingering close lets its request in and drops it, so the answer is read
                book.refused += 1
                transport.write(raw_response(no_place(refusal)))
                self._close(refused=True)
                return
            self._address = address
            self._arm()

        def _release(self) -> None:
            if self._address is not None:
                book.leave(self._address)
                self._address = None

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(scaled_timeout(limits.head_timeout, limits.head_timeout_min, book.pressure()),
                                                        self._head_expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self._raw.close()  # a client sending nothing in time: nothing of it is waited for

        def _peer_may_send(self) -> bool:
            """Whether the client may still be sending this connection bytes the server has not
            read: a head not finished, or a request body not read to its end."""
            if self.cycle is None or self.cycle.response_complete and not self.cycle.more_body:
                return self._head_bytes > 0
            return bool(self.cycle.more_body)

        def _close(self, refused: bool = False) -> None:
            """The close every cycle of this connection asks for: at once when nothing of the
            client's is left unread; otherwise a lingering close (the module's docstring)."""
            raw = self._raw
            if self._lingering:
                return  # already closing: its own deadline or the client's end finishes it
            if self._lost or raw.is_closing() or not (refused or self._peer_may_send()) \
                    or book.lingering >= limits.max_connections or not raw.can_write_eof():
                self._release()
                raw.close()
                return
            self._lingering = True
            book.lingering += 1
            self._release()  # a draining connection holds no place: it ends within its own bounds
            self._disarm()
            raw.write_eof()  # the answer goes out, then the end of what we send
            self.flow.resume_reading()
            self._linger_timer = self.loop.call_later(limits.linger_timeout, raw.close)

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                self._drained += len(data)
                if self._drained > limits.linger_bytes:
                    self._raw.close()
                return
            if self._between_requests():
                self._arm()
                self._head_bytes += len(data)
            super().data_received(data)
            if not self._between_requests():
                self._disarm()
                self._head_bytes = 0
            elif self._head_bytes > limits.max_head_bytes and not self.transport.is_closing():
                self._raw.write(head_too_large(limits))
                self._close()

        def shutdown(self) -> None:
            if self._lingering:
                self._raw.close()
                return
            super().shutdown()

        def connection_lost(self, exc: Exception | None) -> None:
            self._lost = True
            self._disarm()
            self._release()
            if self._lingering:
                self._lingering = False
                book.lingering -= 1
                if self._linger_timer is not None:
                    self._linger_timer.cancel()
            super().connection_lost(exc)

        if zero_copy is not None and base.__name__ == "HttpToolsProtocol":
            def on_headers_complete(self) -> None:
                super().on_headers_complete()
                # no TLS (the bytes must be encrypted in Python) and a cycle of this request
                if self.cycle is not None and self.cycle.scope is self.scope and self._raw.get_extra_info("sslcontext") is None:
                    self.scope.setdefault("extensions", {})[EXTENSION] = ZeroCopySender(self, self.cycle, zero_copy)

    return GuardedProtocol


async def receive_body(receive: Any, limit: int, limits: ServerLimits, book: ConnectionBook | None = None) -> bytes | Response | None:
    """The request body, a refusal (too slow, too large, no place: answered before reading the
    rest), or None when the client left. Slow means a chunk not within the body deadline, or the
    whole body not within that deadline + its size / `body_min_rate` (a trickle of a byte every
    few seconds would pass any per-chunk timeout and hold the connection for ever). The deadline
    is `body_timeout`, shrinking as `book`'s places fill (`scaled_timeout`), and is looked at again
    at least every RECHECK_SECONDS. A body still arriving holds one of `book`'s body places; with
    none free it is refused unless it is already here whole."""
    if book is not None and not book.take_body_place():
        return await _whole_or_refused(receive, limit, book)
    try:
        return await _read_body(receive, limit, limits, book)
    finally:
        if book is not None:
            book.reading -= 1


async def _whole_or_refused(receive: Any, limit: int, book: ConnectionBook) -> bytes | Response | None:
    try:
        async with asyncio.timeout(0):  # taken only if it needs no wait: the body came with its head
            message = await receive()
    except asyncio.TimeoutError:
        message = {"type": "http.request", "more_body": True}
    if message["type"] == "http.disconnect":
        return None
    if message.get("more_body", False):
        book.bodies_refused += 1
        return no_place("Every place for a request body still arriving is taken.")
    body = message.get("body", b"")
    return body_too_large(limit) if len(body) > limit else body


async def _read_body(receive: Any, limit: int, limits: ServerLimits, book: ConnectionBook | None) -> bytes | Response | None:
    chunks, size, more = [], 0, True
    loop = asyncio.get_running_loop()
    start = last = loop.time()
    while more:
        timeout = limits.body_timeout if book is None else scaled_timeout(limits.body_timeout, limits.body_timeout_min, book.pressure())
        remaining = min(last + timeout, start + timeout + size / limits.body_min_rate) - loop.time()
        if remaining <= 0:
            return body_timed_out()
        try:
            async with asyncio.timeout(min(remaining, RECHECK_SECONDS)):  # not wait_for: that wraps receive() in a task of its own
                message = await receive()
        except asyncio.TimeoutError:
            continue  # the deadline again, under the pressure of now
        last = loop.time()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return body_too_large(limit)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)
