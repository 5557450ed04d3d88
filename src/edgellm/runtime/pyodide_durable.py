"""Durable Objects on workerd: the core's `DurableObjectNamespace` over a DO binding, and the
hosting of a core `DurableObject` inside a `workers.DurableObject` class (`src/entry.py`).

Runtime facts (../shared/docs/workers-runtime.md, "Durable Objects from Python", and the SDK's
own workers/rpc.py): `env.FLIGHTS` is the SDK's `_DurableObjectNamespaceWrapper`; its `get(id)`
is a `_FetcherWrapper` whose `fetch` is `workers.fetch`: options are keyword arguments only
(`method=`, `headers=`, `body=`) and the answer is a `workers.Response` (its JS Response is
`.js_object`, its body a JS ReadableStream or None). A streamed answer is read chunk by chunk;
errors thrown in the object arrive as an exception (`pyodide.http.AbortError`) carrying its
traceback, translated here in one place.

Inside an object, `ctx.waitUntil` is not adapted for Python awaitables (a bare coroutine handed
to it never runs): `pyodide_flight.ObjectBackground` schedules the work first and hands over the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import MAX_BODY_BYTES
from ..durable import DurableObject
from ..http import Request, Response
from ..ports import BindingError
from .pyodide_native import to_core_request, to_native_response
from .pyodide_toolbox import is_missing
from .pyodide_r2 import R2Body as JsBody

STREAMED_TYPES = ("application/x-ndjson", "text/event-stream")


def _headers(native: Any) -> dict[str, str]:
    """A `workers.Response`'s headers (an `http.client.HTTPMessage`, names lower-cased)."""
    return {str(name).lower(): str(value) for name, value in native.headers.items()}


@dataclass
class WorkersDurableObjectStub:
    stub: Any  # the SDK's _FetcherWrapper

    async def fetch(self, request: Request) -> Response:
        options: dict[str, Any] = {"method": request.method, "headers": dict(request.headers)}
        if request.body:
            options["body"] = bytes(request.body)  # pyfetch's to_js makes it a Uint8Array
        try:
            native = await self.stub.fetch(request.url, **options)
        except Exception as exc:  # pyodide.http.AbortError from the object, or a JsException
            raise BindingError(f"Durable Object fetch failed: {getattr(exc, 'message', None) or exc}") from exc
        status, headers = int(native.status), _headers(native)
        body = native.body  # the JS ReadableStream, or None for no body (workers/response.py)
        if body is None or is_missing(body):
            return Response(status, headers, b"")
        if status == 200 and headers.get("content-type", "").startswith(STREAMED_TYPES):
            return Response(200, headers, JsBody(body))  # read chunk by chunk; closing it cancels the reader
        return Response(status, headers, bytes(await native.bytes()))


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
