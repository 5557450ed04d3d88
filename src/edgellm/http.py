"""The request/response vocabulary every handler is written against.

Handlers never see the transport: adapters turn a workerd or ASGI request into a `Request`
and a `Response` back into the native object. Streaming bodies are async iterators of bytes; a
body that owns what it was rendered from is a `stream.Stream`, which closes it however it ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, overload
from urllib.parse import parse_qsl, urlsplit


Body = bytes | AsyncIterator[bytes]


class _Path:
    """`Request.path`: the URL's path, split out the first time it is read and then kept on the
    request (a plain attribute from then on): every layer of the pipeline reads it."""

    @overload
    def __get__(self, request: None, owner: type | None = None) -> _Path: ...
    @overload
    def __get__(self, request: Request, owner: type | None = None) -> str: ...

    def __get__(self, request: Request | None, owner: type | None = None) -> str | _Path:
        if request is None:
            return self
        path = urlsplit(request.url).path or "/"
        request.path = path  # type: ignore[assignment]  # the instance's own, read before this (no `__set__`)
        return path


@dataclass
class Request:
    """An HTTP request with its body already read (bounded by the adapter).

    `headers` has lower-case names. `path` is the raw (still percent-encoded) path so that
    an encoded slash stays distinguishable from a real one. What the edge learns of the request
    as it serves it (its id, route parameters, caller, ...) is not kept here: it is the pipeline's
    `context.RequestContext`.
    """

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    cf: Mapping[str, str] = field(default_factory=dict)  # Cloudflare's request.cf facts (country, continent); empty locally

    path = _Path()  # not a field: the URL's, read as a `str`

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.url).query))

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)


@dataclass
class Response:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Body = b""

    @property
    def is_streaming(self) -> bool:
        return not isinstance(self.body, (bytes, bytearray))


def json_bytes(data: Any) -> bytes:
    """Compact UTF-8 JSON. JSON input may carry a lone surrogate (`"\\ud800"`) that UTF-8
    cannot hold; echoed back (a model name in an error), it is escaped instead of failing."""
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = json_bytes(data)
    merged = {"content-type": "application/json"}
    merged.update({k.lower(): v for k, v in (headers or {}).items()})
    return Response(status=status, headers=merged, body=body)
