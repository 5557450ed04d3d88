"""CORS: the API answers browsers only from allowed origins; artifacts stay open to all.

Allowed: the edge's own origin, localhost (any port, http or https) and `CORS_ORIGINS`. A
refused origin gets no `Access-Control-Allow-Origin`, so the browser withholds the answer;
`Vary: Origin` keeps shared caches from mixing the two.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Mapping
from urllib.parse import urlsplit

from ..config import Config
from ..http import Request

EXPOSE = ("cf-aig-cache-status, x-request-id, age, x-edgellm-model, x-edgellm-route, x-edgellm-cache-key, etag, content-length, content-range,"
          " accept-ranges, retry-after, x-repo-commit, x-linked-etag, x-linked-size, x-error-code")
_LOCALHOST = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$")


def own_origin(request: Request) -> str:
    parts = urlsplit(request.url)
    return f"{parts.scheme}://{parts.netloc}"


def origin_allowed(origin: str, request: Request, config: Config) -> bool:
    return origin == own_origin(request) or bool(_LOCALHOST.match(origin)) or origin in config.cors_origins


def is_artifact_path(path: str) -> bool:
    """Artifacts keep their open policy: `/models/...` and the Hugging Face layout's `/api/models/...`."""
    return path == "/models" or path.startswith("/models/") or path.startswith("/api/models/")


# what most answers get, made once: the headers do not depend on the answer, only on the origin
_OPEN: Mapping[str, str] = MappingProxyType({"access-control-allow-origin": "*", "access-control-expose-headers": EXPOSE})
_REFUSED: Mapping[str, str] = MappingProxyType({"vary": "Origin"})  # no origin, or one not allowed


def cors_headers(request: Request, config: Config) -> Mapping[str, str]:
    if is_artifact_path(request.path):
        return _OPEN
    origin = request.headers.get("origin")
    if origin and origin_allowed(origin, request, config):
        return {"vary": "Origin", "access-control-allow-origin": origin, "access-control-expose-headers": EXPOSE}
    return _REFUSED
