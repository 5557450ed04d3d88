"""The request and the response at the edge of the runtime: a `workers.Request` becomes the core's
`Request` (its `cf` facts included), the core's `Response` a `workers.Response` (a streamed body a
JS ReadableStream). Used by the Worker's `fetch` and by every Durable Object's."""

from __future__ import annotations

from typing import Any

from workers import Response as WorkersResponse  # type: ignore[import-not-found]

from ..http import Request, Response
from .pyodide_toolbox import is_missing, to_native_body


async def to_core_request(request: Any, max_body: int, read_body: bool = True) -> Request:
    """`read_body=False`: its method, URL and headers only (an answer that reads no body)."""
    headers = {name.lower(): value for name, value in request.headers.items()}
    declared = headers.get("content-length", "")
    too_big = declared.isdigit() and int(declared) > max_body
    body = b"" if too_big or not read_body or request.method in ("GET", "HEAD") else await request.bytes()
    return Request(request.method, str(request.url), headers, bytes(body), cf=_cf(request))


def _cf(request: Any) -> dict[str, str]:
    """Where the request came from (`cf`, set by Cloudflare: the client cannot forge it). It is on
    the JS request (`request.js_object.cf`), not on the Python `workers.Request`."""
    cf = getattr(getattr(request, "js_object", None), "cf", None)
    if is_missing(cf):
        return {}
    values = {name: getattr(cf, name, None) for name in ("country", "continent")}
    return {name: str(value) for name, value in values.items() if not is_missing(value)}


def to_native_response(response: Response) -> Any:
    headers = dict(response.headers)
    if not response.is_streaming:
        return WorkersResponse(bytes(response.body), status=response.status, headers=headers)
    declared = headers.get("content-length", "")
    length = int(declared) if declared.isdigit() else None  # an artifact's: kept on the way out (to_native_body)
    return WorkersResponse(to_native_body(response.body, length), status=response.status, headers=headers)  # type: ignore[arg-type]
