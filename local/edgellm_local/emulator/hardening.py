"""Limits that make the local edge hold like a real HTTP server under hostile clients.

- The request head: a Host that is not a host is a 400 (the route comes from the path alone);
  `Transfer-Encoding` with `Content-Length` is a 400 and the connection closes (RFC 9112 6.3);
  more than `max_header_count` headers or `max_header_bytes` of them is a 431; a declared body
  over the limit is a 413 at once, from `Content-Length`, without reading it.
- Time: a connection must finish each request head within `head_timeout` (slowloris), each
  body chunk within `body_timeout` and the whole body at `body_min_rate` after that grace, and
  may idle `idle_timeout` between requests; at most `max_connections` are open at once, and
  `max_connections_per_client` from one address (more are closed on accept).

Every refusal that leaves unread bytes on the connection says `connection: close`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from edgellm.errors import ErrorKind, GatewayError, invalid
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
    # one client address's share of max_connections: 512 trickling connections from one address
    # once held every slot, and /healthz went unanswered for all
    max_connections_per_client: int = 64
    body_min_rate: float = 1024.0  # bytes/s: a body must arrive within body_timeout + its size / this
    max_request_line: int = 16 * 1024  # with max_header_bytes: how much of a head is read before it must end

    @property
    def max_head_bytes(self) -> int:
        return self.max_request_line + self.max_header_bytes


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


def body_timed_out() -> Response:
    return _closing(GatewayError(ErrorKind.INVALID_REQUEST, "The request body did not arrive in time.", code="request_timeout"))


def body_too_large(limit: int) -> Response:
    return _closing(GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"The request body exceeds {limit} bytes.", code="request_too_large"))


def uvicorn_options(limits: ServerLimits, http: str = "httptools", zero_copy: ZeroCopyStats | None = None) -> dict[str, Any]:
    """uvicorn.Config keywords: the idle timeout, and `http`'s parser ("httptools" or "h11")
    guarded as below. h11 also bounds an incomplete head itself; httptools does not, so the
    guard counts head bytes for both."""
    return {"timeout_keep_alive": limits.idle_timeout, "http": guarded_protocol(limits, _base_protocol(http), zero_copy),
            "h11_max_incomplete_event_size": limits.max_header_bytes}


def _base_protocol(http: str) -> type:
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    if http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return H11Protocol
    raise ValueError(f"unknown HTTP implementation {http!r}")


def head_too_large(limits: ServerLimits) -> bytes:
    """The 431 written straight to the socket for a head that does not end in time (in bytes)."""
    response = _closing(GatewayError(ErrorKind.REQUEST_HEADERS_TOO_LARGE, f"The request head exceeds {limits.max_head_bytes} bytes.",
                                     code="headers_too_large"))
    body = bytes(response.body)  # type: ignore[arg-type]
    headers = {**response.headers, "content-length": str(len(body))}
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()) + b"\r\n" + body)


def guarded_protocol(limits: ServerLimits, base: type, zero_copy: ZeroCopyStats | None = None) -> type:
    """uvicorn's HTTP protocol (httptools or h11) with a head deadline, a head size cap and a
    connection cap. The deadline is armed when a connection opens and whenever bytes of a new
    request arrive, and disarmed once the head is complete (the ASGI cycle has started). The
    bytes of an unfinished head are counted for both parsers: httptools keeps accepting header
    lines for as long as they come (h11 stops at `h11_max_incomplete_event_size`).
    With `zero_copy` (httptools only), each request's scope offers the zero-copy file sender
    (zero_copy.py), which counts what it sends there."""

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.close()
                return
            peer = self.client[0] if self.client else None
            if peer is not None and sum(1 for c in self.connections if c.client and c.client[0] == peer) > limits.max_connections_per_client:
                transport.close()
                return
            self._arm()

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(limits.head_timeout, self._head_expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._between_requests():
                self._arm()
                self._head_bytes += len(data)
            super().data_received(data)
            if not self._between_requests():
                self._disarm()
                self._head_bytes = 0
            elif self._head_bytes > limits.max_head_bytes and not self.transport.is_closing():
                self.transport.write(head_too_large(limits))
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        if zero_copy is not None and base.__name__ == "HttpToolsProtocol":
            def on_headers_complete(self) -> None:
                super().on_headers_complete()
                # no TLS (the bytes must be encrypted in Python) and a cycle of this request
                if self.cycle is not None and self.cycle.scope is self.scope and self.transport.get_extra_info("sslcontext") is None:
                    self.scope.setdefault("extensions", {})[EXTENSION] = ZeroCopySender(self, self.cycle, zero_copy)

    return GuardedProtocol


async def receive_body(receive: Any, limit: int, timeout: float, min_rate: float = ServerLimits.body_min_rate) -> bytes | Response | None:
    """The request body, a refusal (too slow, too large: answered before reading the rest), or
    None when the client left. Slow means a chunk not within `timeout`, or the whole body not
    within `timeout` + its size / `min_rate` (a trickle of a byte every few seconds would pass
    any per-chunk timeout and hold the connection for ever)."""
    chunks, size, more = [], 0, True
    loop = asyncio.get_running_loop()
    start = loop.time()
    while more:
        remaining = min(timeout, start + timeout + size / min_rate - loop.time())
        try:
            if remaining <= 0:
                raise asyncio.TimeoutError
            async with asyncio.timeout(remaining):  # not wait_for: that wraps receive() in a task of its own
                message = await receive()
        except asyncio.TimeoutError:
            return body_timed_out()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return body_too_large(limit)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)
