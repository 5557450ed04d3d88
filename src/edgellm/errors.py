"""One error type for the whole gateway, mapped to the OpenAI error JSON in one place.

The kinds and their statuses follow llama.cpp's server table, which OpenAI-compatible
clients already understand (`openai.BadRequestError` for 400, `NotFoundError` for 404, ...).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .http import Response, json_response


class ErrorKind(enum.Enum):
    INVALID_REQUEST = (400, "invalid_request_error")
    AUTHENTICATION = (401, "authentication_error")
    PERMISSION = (403, "permission_error")
    NOT_FOUND = (404, "not_found_error")
    METHOD_NOT_ALLOWED = (405, "invalid_request_error")
    REQUEST_TOO_LARGE = (413, "invalid_request_error")
    UNSUPPORTED_MEDIA_TYPE = (415, "invalid_request_error")
    RANGE_NOT_SATISFIABLE = (416, "invalid_request_error")
    RATE_LIMITED = (429, "rate_limit_error")
    REQUEST_HEADERS_TOO_LARGE = (431, "invalid_request_error")
    SERVER = (500, "server_error")
    NOT_SUPPORTED = (501, "not_supported_error")
    UPSTREAM = (502, "upstream_error")
    UNAVAILABLE = (503, "unavailable_error")

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def type(self) -> str:
        return self.value[1]


@dataclass
class GatewayError(Exception):
    """Raised anywhere in the core; `app.handle` turns it into the OpenAI error JSON.

    `retry_after` (seconds) is sent as `Retry-After` so clients back off instead of hammering
    a failing dependency; `headers` carries protocol extras such as `Allow` or `Content-Range`.
    """

    kind: ErrorKind
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def status(self) -> int:
        return self.kind.status

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_response(self, extra: dict[str, Any] | None = None) -> Response:
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        data = self.to_json()
        if extra:
            data.update(extra)
        return json_response(data, status=self.status, headers=headers)


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message, param=param, code=code)
