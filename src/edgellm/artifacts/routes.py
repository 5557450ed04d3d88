"""Serving model artifacts from R2: `GET`/`HEAD /models/{name}/...` and the `GET /models` index.

One request is at most two R2 operations: a `head` decides everything HTTP needs (404, 304,
416, which range), then a `get` streams exactly those bytes with `only_if` pinned to the ETag
the decision was made on. If the object was replaced in between, R2 answers without a body and
the decision is made again, so a 206 never mixes the headers of one version with the bytes of
another. The body is the R2 object's async iterator, handed to the runtime unread.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, TypeVar

from ..errors import ErrorKind, GatewayError, RetryAfter, binding_error
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..ports import BindingError, BlobStore, R2Conditional, R2Object, R2Range
from ..deps import Deps
from .conditional import ByteRange, none_match, parse_range, range_applies
from .names import REVALIDATE, ArtifactPath, name_from_prefix, parse_artifact_path

T = TypeVar("T")
ATTEMPTS = 3
MAX_INDEX_PAGES = 10
MAX_INDEX_MODELS = 200  # the index answers with at most this many names
HEADS_IN_FLIGHT = 6  # Workers allow only a few simultaneous subrequests per invocation


def _store(deps: Deps) -> BlobStore:
    if deps.r2 is None:
        raise GatewayError(
            ErrorKind.UNAVAILABLE, "Model artifacts are not available: no R2 bucket is bound.",
            code="r2_unavailable", retry_after=RetryAfter.UNCONFIGURED,
        )
    return deps.r2


async def _call(operation: Awaitable[T]) -> T:
    """Run one R2 operation; its failures become 502 (or 503 + Retry-After when retryable)."""
    try:
        return await operation
    except BindingError as exc:
        raise binding_error(exc, "R2", "r2") from exc


def _not_found(path: ArtifactPath) -> GatewayError:
    return GatewayError(ErrorKind.NOT_FOUND, f"Model {path.name!r} has no {path.file}.", code="artifact_not_found")


def _headers(path: ArtifactPath, obj: R2Object) -> dict[str, str]:
    return {
        "etag": obj.http_etag,
        "cache-control": path.cache_control,
        "accept-ranges": "bytes",
        "x-content-type-options": "nosniff",
    }


def _decide(request: Request, obj: R2Object) -> tuple[int, ByteRange | None]:
    """(status, range) for the current version: 304, 206 with a range, or 200; raises 416."""
    if none_match(request.header("if-none-match"), obj.http_etag):
        return 304, None
    if request.method != "GET" or not range_applies(request.header("if-range"), obj.http_etag):
        return 200, None  # Range is defined for GET only (RFC 9110 14.2)
    byte_range = parse_range(request.header("range"), obj.size)
    return (206, byte_range) if byte_range else (200, None)


async def get_artifact(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    path = parse_artifact_path(request.path)  # before R2 is touched
    store = _store(deps)
    for _ in range(ATTEMPTS):
        head = await _call(store.head(path.key))
        if head is None:
            raise _not_found(path)
        status, byte_range = _decide(request, head)
        headers = _headers(path, head)
        if status == 304:
            return Response(304, headers, b"")
        headers["content-type"] = path.content_type
        headers["content-length"] = str(byte_range.length if byte_range else head.size)
        if byte_range:
            headers["content-range"] = byte_range.content_range(head.size)
        if request.method == "HEAD":
            return Response(status, headers, b"")
        r2_range = R2Range(offset=byte_range.first, length=byte_range.length) if byte_range else None
        obj = await _call(store.get(path.key, range=r2_range, only_if=R2Conditional(etag_matches=head.etag)))
        if obj is None:
            raise _not_found(path)
        if obj.body is not None:
            return Response(status, headers, obj.body)
        # replaced between head and get: decide again on the new version
    raise GatewayError(
        ErrorKind.UNAVAILABLE, f"{path.key} kept changing while it was read; try again.", code="artifact_changing", retry_after=RetryAfter.AT_ONCE
    )


async def list_published_models(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """Models whose manifest is published (a name with blobs but no manifest is mid-publish)."""
    store = _store(deps)
    names: list[str] = []
    cursor: str | None = None
    for _ in range(MAX_INDEX_PAGES):
        if len(names) >= MAX_INDEX_MODELS:
            break
        page: dict[str, Any] = await _call(store.list("models/", cursor=cursor, delimiter="/"))
        names += [n for n in map(name_from_prefix, page.get("delimitedPrefixes", [])) if n]
        cursor = page.get("cursor")
        if not page.get("truncated") or not cursor:
            break
    names = names[:MAX_INDEX_MODELS]
    limit = asyncio.Semaphore(HEADS_IN_FLIGHT)

    async def manifest_head(name: str) -> R2Object | None:
        async with limit:
            return await _call(store.head(ArtifactPath(name, "manifest.json").key))

    heads = await asyncio.gather(*(manifest_head(n) for n in names))
    data = [
        {"name": n, "manifest": f"/models/{n}/manifest.json"} for n, head in zip(names, heads) if head is not None
    ]
    return json_response({"object": "list", "data": data}, headers={"cache-control": REVALIDATE})
