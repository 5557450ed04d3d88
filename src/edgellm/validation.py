"""Type and range checks shared by the OpenAI and Workers AI wire formats.

Each check names the offending parameter so the 400 tells the caller exactly what to fix.
`bool` is rejected where a number is expected: in Python it is an `int`, on the wire it is not.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from .errors import ErrorKind, GatewayError, invalid
from .http import Request

# How deep arrays and objects may nest in a body. On workerd, `json.loads` of a body ~5000 deep
# overflows the WebAssembly stack: a fatal error, not a RecursionError, and the isolate is lost
# (3000 was fine; the threshold depends on V8's stack). So depth is bounded BEFORE parsing, far
# under what the runtime survives, and the same on both runtimes. No API body needs more.
MAX_JSON_DEPTH = 256

# a JSON string, escapes included: its brackets are text, not nesting. An unterminated string
# runs to the end, as it does for json.loads (which then fails there, never deeper than the
# brackets before it); every match succeeds, so the scan stays linear (no retry from each quote).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_OPEN, _CLOSE = b"[{", b"]}"
_OTHERS = bytes(b for b in range(256) if b not in _OPEN + _CLOSE)
# brackets as signed steps: an opener +1, a closer -1 (0xff read as a signed byte)
_STEPS = bytes.maketrans(_OPEN + _CLOSE, b"\x01\x01\xff\xff")


def _utf8(data: bytes) -> bytes:
    """The bytes json.loads would parse, as UTF-8 (it also reads UTF-16 and UTF-32)."""
    encoding = json.detect_encoding(data)
    if encoding in ("utf-8", "utf-8-sig"):
        return data
    return data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")


def json_depth(data: bytes) -> int:
    """How deep arrays and objects nest in raw JSON, found by a scan of its bytes, without parsing
    (strings and their escapes skipped). Every step runs in C (regex, translate, accumulate over
    a signed view), so a wide body of a MiB costs milliseconds."""
    try:
        data = _utf8(data)
    except (UnicodeDecodeError, LookupError):
        return 0  # json.loads refuses it before parsing anything
    brackets = _STRING.sub(b"", data).translate(_STEPS, _OTHERS)
    return max(0, max(accumulate(memoryview(brackets).cast("b")), default=0))


def json_too_deep(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsing `data` would nest deeper than `limit` (a body with no more openers than
    the limit cannot, and skips the scan)."""
    return data.count(b"[") + data.count(b"{") > limit and json_depth(data) > limit


def refuse_oversized(request: Request, limit: int) -> None:
    """A 413 for a body over `limit`, read or only declared: a runtime never reads a body whose
    Content-Length is over it (the request reaches the core without it), so every route refuses
    it, not only those that parse one (an empty body means something to some)."""
    declared = request.headers.get("content-length")  # lower-case names (`Request`)
    if len(request.body) > limit or (declared and declared.isdigit() and int(declared) > limit):
        raise GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"The request body exceeds {limit} bytes.", code="request_too_large")


def read_json(request: Request, limit: int | None = None) -> Any:
    """The body as JSON, or a 400 that says what is wrong with it. Its size was refused by the
    pipeline's body size layer, before any handler; `limit`: checked again (a 413), for a caller
    outside the pipeline."""
    if limit is not None:
        refuse_oversized(request, limit)
    if not request.body.strip():
        raise invalid("The request body is empty; send a JSON object.", None, "invalid_json")
    return loads_bounded(request.body)


def loads_bounded(data: bytes) -> Any:
    """`json.loads` of input from outside, refused with a 400 when nested deeper than MAX_JSON_DEPTH."""
    if json_too_deep(data):
        raise invalid(f"The request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays and objects "
                      "are accepted.", None, "json_too_deep")
    try:
        value = json.loads(data)
    except RecursionError:  # unreachable past the scan; kept so CPython never answers a 500
        raise invalid("The request body is nested too deeply.", None, "json_too_deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"The request body is not valid JSON: {exc}.", None, "invalid_json") from exc
    refuse_lone_surrogates(data, value)
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


def described(value: Any) -> str:
    """A JSON value as a caller reads it: "got True" named Python's spelling of a JSON `true`, and
    said nothing of its type where the type was the mistake."""
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, (int, float)):
        return f"{value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else type(value).__name__


def as_int(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise invalid(f"'{name}' must be an integer, got {described(value)}.", name, "invalid_type")
    value = int(value)
    _check_range(name, value, lo, hi)
    return value


def as_float(body: dict[str, Any], name: str, lo: float | None = None, hi: float | None = None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{name}' must be a number, got {described(value)}.", name, "invalid_type")
    if value != value or value in (float("inf"), float("-inf")):
        raise invalid(f"'{name}' must be a finite number.", name)
    _check_range(name, value, lo, hi)
    return float(value)


def as_bool(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean, got {described(value)}.", name, "invalid_type")
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
