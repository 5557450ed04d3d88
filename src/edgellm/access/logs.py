"""One structured log record per request: JSON with a request id (`cf-ray` on Cloudflare), and
never the prompt or the answer. The local edge formats the same record as an access line."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from ..http import Request, Response
from ..deps import Deps
from ..ids import RandomIds

_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id(request: Request, ids: RandomIds) -> str:
    for name in ("cf-ray", "x-request-id"):
        value = request.header(name)
        if value and _ID.match(value):
            return value
    return ids.hex(8)  # the isolate's ids (`IsolateState.ids`): no OS call per request


class _AsJson:
    """The record's JSON, made when a handler formats the line (the local edge formats in a
    thread of its own, off the request's path), not when the request logs it."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def __str__(self) -> str:
        return json.dumps(self.record, separators=(",", ":"))


def log_request(request: Request, response: Response, deps: Deps, started: float, route: str) -> dict[str, Any] | None:
    logger = deps.log.getChild("access")
    if not logger.isEnabledFor(logging.INFO):
        return None
    principal = request.principal
    record = {
        "request_id": request_id(request, deps.state.ids), "method": request.method, "path": request.path[:256], "status": response.status,
        "cache": response.headers.get("cf-aig-cache-status", "-"), "route": route,
        "ms": round(max(0.0, deps.clock.now() - started) * 1000, 1),
        "tenant": principal.tenant if principal else None, "key_id": principal.key_id if principal else None,
        "model": response.headers.get("x-edgellm-model"),
    }
    logger.info("%s", _AsJson(record), extra={"edgellm": record})
    return record
