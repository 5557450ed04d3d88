"""Type and range checks shared by the OpenAI and Workers AI wire formats.

Each check names the offending parameter so the 400 tells the caller exactly what to fix.
`bool` is rejected where a number is expected: in Python it is an `int`, on the wire it is not.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ErrorKind, GatewayError, invalid
from .http import Request


def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, or a 413/400 that says what is wrong with it."""
    declared = request.header("content-length")
    if len(request.body) > limit or (declared and declared.isdigit() and int(declared) > limit):
        raise GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"The request body exceeds {limit} bytes.", code="request_too_large")
    if not request.body.strip():
        raise invalid("The request body is empty; send a JSON object.", None, "invalid_json")
    try:
        value = json.loads(request.body)
    except RecursionError:
        raise invalid("The request body is nested too deeply.", None, "invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"The request body is not valid JSON: {exc}.", None, "invalid_json") from exc
    refuse_lone_surrogates(request.body, value)
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_lone_surrogates(raw: bytes, value: Any) -> None:
    """One rule for every string of a request, wherever it sits (content, stop, model, a tool's
    name, an object key): a lone surrogate is a 400 naming the field. JSON may spell one
    (`"\\ud800"`) though no UTF-8 text holds one, so without this it was refused where the
    model's input is encoded (content) and passed where the gateway used the string itself (stop).
    Only a body that spells a surrogate escape is walked: UTF-8 bytes cannot encode one."""
    if not _SURROGATE_ESCAPE.search(raw):
        return
    stack: list[tuple[Any, str | None]] = [(value, None)]
    while stack:  # a stack, not recursion: the depth is the body's, not Python's
        item, where = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                raise invalid(f"'{where or 'body'}' is not valid Unicode: it holds a lone surrogate (a \\uD800-\\uDFFF escape "
                              "without its pair).", where, "invalid_unicode")
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                path = f"{where}.{key}" if where else str(key)
                stack.append((child, path))
                stack.append((key, path))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))


def as_int(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise invalid(f"'{name}' must be an integer, got {value!r}.", name, "invalid_type")
    value = int(value)
    _check_range(name, value, lo, hi)
    return value


def as_float(body: dict[str, Any], name: str, lo: float | None = None, hi: float | None = None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{name}' must be a number, got {value!r}.", name, "invalid_type")
    if value != value or value in (float("inf"), float("-inf")):
        raise invalid(f"'{name}' must be a finite number.", name)
    _check_range(name, value, lo, hi)
    return float(value)


def as_bool(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean, got {value!r}.", name, "invalid_type")
    return value


def as_str(body: dict[str, Any], name: str, *, allow_empty: bool = True) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"'{name}' must be a string, got {type(value).__name__}.", name, "invalid_type")
    if not allow_empty and not value:
        raise invalid(f"'{name}' must not be empty.", name)
    return value


def _check_range(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
        raise invalid(f"'{name}' must be {bounds}, got {value}.", name, "out_of_range")
