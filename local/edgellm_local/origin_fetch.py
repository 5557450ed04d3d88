"""The local edge's `HTTPFetch` for origins: httpx, streaming the response body.

On Cloudflare the same port is global `fetch` (`edgellm.runtime.pyodide_fetch`). Each call uses
its own client: the local edge serves every request on one event loop, but a client must not
outlive the request that opened it (the Worker's rule: no I/O shared across requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Mapping

import httpx

from edgellm.ports import FetchError, FetchResponse


@dataclass(frozen=True)
class HttpxFetch:
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, read=None))
        try:
            response = await client.send(client.build_request("POST", url, content=body, headers=dict(headers)), stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            raise FetchError(f"{type(exc).__name__}: {exc}") from exc
        return FetchResponse(response.status_code, dict(response.headers), _body(client, response))


async def _body(client: httpx.AsyncClient, response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        raise FetchError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        await response.aclose()
        await client.aclose()
