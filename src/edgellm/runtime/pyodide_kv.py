"""Workers KV (`env.CACHE`) as the core's `KVStore`: values as bytes (`arrayBuffer`), options as
JS objects, and KV's `KV PUT failed: <status>` errors classified by their status."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..ports import BindingError, KVEntry, KVLimitError, KVRateLimited
from .pyodide_toolbox import is_missing, js_message, js_options


_KV_STATUS = re.compile(r"^KV \w+ failed: (\d{3})\b")


def kv_error(exc: BaseException) -> BindingError:
    """`KV PUT failed: 429 ...` -> KVRateLimited; any other 4xx -> KVLimitError; else BindingError."""
    message = js_message(exc)
    match = _KV_STATUS.match(message)
    status = int(match.group(1)) if match else 0
    if status == 429:
        return KVRateLimited(message)
    return KVLimitError(message) if 400 <= status < 500 else BindingError(message)


@dataclass
class WorkersKV:
    binding: Any

    async def get(self, key: str, *, cache_ttl: int | None = None) -> KVEntry | None:
        # the type alone as a string, or with `cacheTtl` as an options object (KV's two forms)
        kind = "arrayBuffer" if cache_ttl is None else js_options({"type": "arrayBuffer", "cacheTtl": cache_ttl})
        try:
            result = await self.binding.getWithMetadata(key, kind)
        except JsException as exc:
            raise kv_error(exc) from exc
        if is_missing(result) or is_missing(result.value):
            return None
        metadata = None if is_missing(result.metadata) else result.metadata.to_py()
        return KVEntry(result.value.to_bytes(), metadata)

    async def put(self, key: str, value: bytes, *, expiration_ttl: int | None = None, metadata: dict[str, Any] | None = None,
                  expiration: float | None = None) -> None:
        options: dict[str, Any] = {}
        if expiration_ttl is not None:
            options["expirationTtl"] = expiration_ttl
        if expiration is not None:  # an absolute time (seconds since the epoch), as KV takes it
            options["expiration"] = int(expiration)
        if metadata is not None:
            options["metadata"] = metadata
        try:
            await self.binding.put(key, to_js(value), js_options(options))
        except JsException as exc:
            raise kv_error(exc) from exc

    async def delete(self, key: str) -> None:
        try:
            await self.binding.delete(key)
        except JsException as exc:
            raise kv_error(exc) from exc

    async def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {"prefix": prefix, "limit": limit}
        if cursor:
            options["cursor"] = cursor
        try:
            return (await self.binding.list(js_options(options))).to_py()
        except JsException as exc:
            raise kv_error(exc) from exc
