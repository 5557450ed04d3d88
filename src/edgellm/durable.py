"""The Durable Object port: where work shared between requests lives.

Requests are isolated on Cloudflare: I/O one request started can never be awaited by another.
A Durable Object is one single-threaded instance per name, worldwide; the requests it serves
interleave at await points and may share what it owns. So anything several requests must
follow together (one generation streamed to every identical request, a conversation) is the
object's, and requests reach it only through `namespace.get(name).fetch(request)`, as the
Worker does with `env.BINDING.get(env.BINDING.idFromName(name)).fetch(...)`.

The object's logic is plain core code (a `DurableObject`); the runtime adapter hosts it (the
Pyodide one in a `workers.DurableObject` class exported by `src/entry.py`, the local edge in
`edgellm_local.emulator.durable`) and carries requests and responses across, bodies streamed.
"""

from __future__ import annotations

from typing import Protocol

from .http import Request, Response


class DurableObject(Protocol):
    """What a Durable Object does with each request sent to it. A streamed `Response` body is
    read by the caller chunk by chunk while the object keeps serving other requests; the caller
    closing it (`aclose`) is how the object learns its client left."""

    async def fetch(self, request: Request) -> Response: ...


class DurableObjectStub(Protocol):
    """A handle on one object. `fetch` returns once the object has answered the status and
    headers; a streamed body follows. Errors the object raises arrive as a failed `fetch`."""

    async def fetch(self, request: Request) -> Response: ...


class DurableObjectNamespace(Protocol):
    """A Durable Object binding: one object per name (`idFromName`), created on first use."""

    def get(self, name: str) -> DurableObjectStub: ...
