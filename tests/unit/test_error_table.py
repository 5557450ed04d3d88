"""The one error table (`errors.ErrorKind`, `errors.RetryAfter`): each kind's status, OpenAI type and
default Retry-After, and the errors built from it without naming a number."""

from __future__ import annotations

import pytest

from edgellm.errors import ErrorKind, GatewayError, RetryAfter
from edgellm.routing.config import OriginConfig
from edgellm.routing.origin import _status_error


@pytest.mark.parametrize("kind,status,type_,retry_after", [
    (ErrorKind.INVALID_REQUEST, 400, "invalid_request_error", None),
    (ErrorKind.AUTHENTICATION, 401, "authentication_error", None),
    (ErrorKind.PERMISSION, 403, "permission_error", None),
    (ErrorKind.NOT_FOUND, 404, "not_found_error", None),
    (ErrorKind.METHOD_NOT_ALLOWED, 405, "invalid_request_error", None),
    (ErrorKind.REQUEST_TOO_LARGE, 413, "invalid_request_error", None),
    (ErrorKind.RANGE_NOT_SATISFIABLE, 416, "invalid_request_error", None),
    (ErrorKind.RATE_LIMITED, 429, "rate_limit_error", None),
    (ErrorKind.REQUEST_HEADERS_TOO_LARGE, 431, "invalid_request_error", None),
    (ErrorKind.SERVER, 500, "server_error", None),
    (ErrorKind.UPSTREAM, 502, "upstream_error", "5"),
    (ErrorKind.UNAVAILABLE, 503, "unavailable_error", "5"),
])
def test_each_kind_answers_its_status_type_and_default_retry_after(kind: ErrorKind, status: int, type_: str,
                                                                    retry_after: str | None) -> None:
    response = GatewayError(kind, "m", code="c").to_response()
    assert response.status == status and kind.type == type_
    assert response.headers.get("retry-after") == retry_after


def test_the_back_offs_are_the_values_the_gateway_always_sent() -> None:
    assert {entry.name: int(entry) for entry in RetryAfter.__members__.values()} == {
        "AT_ONCE": 1, "ADMISSION": 2, "DEPENDENCY": 5, "NO_ROUTE": 30, "UNCONFIGURED": 60}
    assert RetryAfter.KV_WRITE == 1


def test_a_named_entry_overrides_the_kinds_default_and_goes_out_as_a_plain_number() -> None:
    error = GatewayError(ErrorKind.UNAVAILABLE, "m", retry_after=RetryAfter.UNCONFIGURED)
    assert error.retry_after == 60 and type(error.retry_after) is int
    assert error.to_response().headers["retry-after"] == "60"


@pytest.mark.parametrize("status,kind,code", [(503, ErrorKind.UNAVAILABLE, "origin_unavailable"), (500, ErrorKind.UPSTREAM, "origin_error"),
                                              (400, ErrorKind.INVALID_REQUEST, "origin_rejected")])
def test_an_origins_refusal_takes_its_retry_after_from_the_table(status: int, kind: ErrorKind, code: str) -> None:
    error = _status_error(OriginConfig("o", "https://o.example"), status, b'{"error":"internal"}', 16)
    assert (error.kind, error.code) == (kind, code)
    assert error.retry_after == (5 if status >= 500 else None)
