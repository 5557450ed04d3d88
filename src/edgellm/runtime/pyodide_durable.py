"""Durable Objects on workerd: the core's `DurableObjectNamespace` over a DO binding, and the
hosting of a core `DurableObject` inside a `workers.DurableObject` class (`src/entry.py`).

Runtime facts (../shared/docs/workers-runtime.md, "Durable Objects from Python"): the Worker
reaches an object with `env.FLIGHTS.get(env.FLIGHTS.idFromName(name))` and `await
stub.fetch(url, init)`; a streamed Response comes back as a stream; errors thrown in the object
arrive as an exception (`AbortError`) carrying its traceback, translated here in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pyodide.ffi import to_js  # type: ignore[import-not-found]

from ..cache.coalescing import FlightObject
from ..config import MAX_BODY_BYTES
from ..durable import DurableObject
from ..http import Request, Response
from ..ports import BindingError
from ..state import IsolateState
from .pyodide import build_deps, is_missing, js_options, to_core_request, to_native_response
from .pyodide_r2 import R2Body as JsBody

STREAMED_TYPES = ("application/x-ndjson", "text/event-stream")


def _headers(native: Any) -> dict[str, str]:
    return {str(entry[0]).lower(): str(entry[1]) for entry in native.headers.entries()}


@dataclass
class WorkersDurableObjectStub:
    stub: Any

    async def fetch(self, request: Request) -> Response:
        init: dict[str, Any] = {"method": request.method, "headers": dict(request.headers)}
        if request.body:
            init["body"] = to_js(bytes(request.body))
        try:
            native = await self.stub.fetch(request.url, js_options(init))
        except Exception as exc:  # JsException, or pyodide.http.AbortError from the object
            raise BindingError(f"Durable Object fetch failed: {getattr(exc, 'message', None) or exc}") from exc
        headers = _headers(native)
        body = getattr(native, "body", None)
        if body is None or is_missing(body):
            return Response(int(native.status), headers, b"")
        if native.status == 200 and headers.get("content-type", "").startswith(STREAMED_TYPES):
            return Response(200, headers, JsBody(body))  # read chunk by chunk; closing it cancels the reader
        return Response(int(native.status), headers, bytes((await native.arrayBuffer()).to_bytes()))


@dataclass
class WorkersDurableObjectNamespace:
    binding: Any

    def get(self, name: str) -> WorkersDurableObjectStub:
        return WorkersDurableObjectStub(self.binding.get(self.binding.idFromName(name)))


# What a Worker sends its objects: a flight's order is the client's whole input (up to the
# Worker's own MAX_BODY_BYTES) plus its key and route, so an object takes twice that.
OBJECT_MAX_BODY = 2 * MAX_BODY_BYTES


async def serve_object(obj: DurableObject, request: Any, max_body: int = OBJECT_MAX_BODY) -> Any:
    """One request to a Durable Object hosted in workerd: native -> core -> native, body streamed."""
    return to_native_response(await obj.fetch(await to_core_request(request, max_body)))


def flight_object(env: Any, ctx: Any) -> FlightObject:
    """The flights object's logic over the object's own bindings (it never calls FLIGHTS itself)."""
    deps = build_deps(env, ctx, IsolateState())
    return FlightObject(replace(deps, flights=None))
