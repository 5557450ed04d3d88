"""The local edge's `HTTPFetch` for origins: httpx, streaming the response body.

On Cloudflare the same port is global `fetch` (`edgellm.runtime.pyodide_fetch`). Each call uses
its own client: the local edge serves every request on one event loop, but a client must not
outlive the request that opened it (the Worker's rule: no I/O shared across requests).

Budgets: connecting and the response headers together within `timeout` (an origin that accepts
and never answers is given up on), and no read of the body waits more than `timeout` for a byte;
how long the whole answer may take, and what counts as progress, is the caller's (routing/origin.py).
The body is decoded here, as the Workers `fetch` decodes it (gzip, deflate), in bounded pieces
with a yield to the event loop between them: a small compressed body that inflates to gigabytes
costs one piece at a time, and never stalls the other requests. Any other declared encoding is
passed on undecoded, with its `content-encoding` header, for the caller to refuse.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import AsyncIterator, Mapping

import httpx

from edgellm.ports import FetchError, FetchResponse

DECODED_PIECE_BYTES = 64 * 1024
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True)
class HttpxFetch:
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        return await self._send("POST", url, body, headers, timeout)

    async def get(self, url: str, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        """A GET (a replica's load probe: `/metrics`), under the same budgets as `post`."""
        return await self._send("GET", url, None, headers, timeout)

    async def _send(self, method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        client = httpx.AsyncClient(timeout=httpx.Timeout(timeout))
        request = client.build_request(method, url, content=body, headers={"accept-encoding": "gzip, deflate", **headers})
        try:
            async with asyncio.timeout(timeout):  # connect + headers: httpx's read timeout is per read, not for the whole head
                response = await client.send(request, stream=True)
        except (httpx.HTTPError, TimeoutError) as exc:
            await client.aclose()
            raise FetchError(f"{type(exc).__name__}: {exc}" if str(exc) else f"no response within {timeout:g} s") from exc
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        return FetchResponse(response.status_code, dict(response.headers), _body(client, response, encoding))


async def _body(client: httpx.AsyncClient, response: httpx.Response, encoding: str) -> AsyncIterator[bytes]:
    inflate = zlib.decompressobj(_WBITS[encoding]) if encoding in _WBITS else None
    try:
        async for raw in response.aiter_raw():
            if inflate is None:
                yield raw
                await asyncio.sleep(0)
                continue
            data = raw
            while data:
                try:
                    piece = inflate.decompress(data, DECODED_PIECE_BYTES)
                except zlib.error as exc:
                    raise FetchError(f"the {encoding} body does not decode: {exc}") from exc
                data = inflate.unconsumed_tail
                if piece:
                    yield piece
                await asyncio.sleep(0)  # one piece at a time: other requests run in between
    except httpx.HTTPError as exc:
        raise FetchError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        await response.aclose()
        await client.aclose()
