"""The Worker's `HTTPFetch` for origins: global `fetch`, streamed, with an abort on timeout.

The request belongs to the Worker request that made it (an origin call is never shared with
another request). `timeout` bounds the wait for the response headers (AbortController); the
body streams as `Uint8Array` chunks, and a read error becomes `FetchError`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..ports import FetchError, FetchResponse
from ..stream import owns
from .pyodide_toolbox import is_missing, js_message, js_options, read_stream


@dataclass(frozen=True)
class WorkersFetch:
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        return await self._send(url, {"method": "POST", "headers": dict(headers), "body": body.decode()}, timeout)

    async def get(self, url: str, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        """A GET (a replica's load probe: `/metrics`), under the same budget as `post`."""
        return await self._send(url, {"method": "GET", "headers": dict(headers)}, timeout)

    async def _send(self, url: str, options: dict[str, Any], timeout: float) -> FetchResponse:
        controller = js.AbortController.new()
        init = js_options({**options, "signal": controller.signal})
        try:
            async with asyncio.timeout(timeout):
                response = await js.fetch(url, init)
        except TimeoutError:
            controller.abort()
            raise FetchError(f"no response from {url} within {timeout:g} s") from None
        except JsException as exc:
            raise FetchError(js_message(exc)) from exc
        content_type = response.headers.get("content-type")
        stream = response.body
        return FetchResponse(int(response.status), {"content-type": "" if is_missing(content_type) else str(content_type)},
                             _no_chunks() if is_missing(stream) else _chunks(read_stream(stream)))


@owns("chunks")
async def _chunks(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body's chunks, a read error as `FetchError`."""
    try:
        async for chunk in chunks:
            yield chunk
    except JsException as exc:
        raise FetchError(js_message(exc)) from exc


async def _no_chunks() -> AsyncIterator[bytes]:
    """A response without a body."""
    return
    yield  # an async generator that gives nothing
