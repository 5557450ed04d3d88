"""One error type for the whole gateway, mapped to the OpenAI error JSON in one place.

The kinds and their statuses follow llama.cpp's server table, which OpenAI-compatible
clients already understand (`openai.BadRequestError` for 400, `NotFoundError` for 404, ...).
"""

from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from .http import Response, json_response
from .ports import BindingError, CapacityExceeded, ContextWindowExceeded, InvalidModelInput, KVLimitError, KVRateLimited, ModelNotFound

# Workers AI's refusal of a prompt past the model's window (error 5021: "...exceeded this model
# context window limit"), as its adapter passes it on (an InvalidModelInput).
_CONTEXT_REFUSAL = re.compile(r"\b5021\b|context window|context size|context length", re.IGNORECASE)
# Workers AI's refusal of the caller's own fields by its input schema (its local mirror says the
# same): text about the caller's input, the one binding text a client is shown.
_SCHEMA_REFUSAL = re.compile(r"^(?:AiError: )?5006: Input validation error: ")
# Error codes of requests whose generation may have run to its end before it failed (a whole
# answer past its deadline): charged their reservation, as a request whose client left. A code,
# not a flag, so it survives the flights object's JSON error line.
SPENT_CODES = frozenset(("answer_timeout",))


class RetryAfter(enum.IntEnum):
    """Every `Retry-After` the gateway sends (seconds), named for why a client should wait that
    long: the one table of back-offs (a route, a binding, an adapter picks an entry, never a number)."""

    AT_ONCE = 1  # the work a retry needs is there now: a shared generation cut or abandoned, an artifact replaced while read
    KV_WRITE = 1  # KV takes one write per second per key: the wait is exactly known
    ADMISSION = 2  # every generation place of this isolate is taken: one frees when a generation ends
    # a failing dependency (binding, origin, object): the gateway cannot know when an overload or
    # outage ends, so one short, honest back-off serves all; the default of every 502/503
    DEPENDENCY = 5
    NO_ROUTE = 30  # every route the request may take is failing (their breakers open)
    UNCONFIGURED = 60  # nothing will change until an operator acts: a binding not bound, no route in a region, a bad manifest


class ErrorKind(enum.Enum):
    """The one table from error kind to HTTP status, OpenAI error type and default `Retry-After`
    (llama.cpp's server table for the statuses; a 502/503 always says when to come back)."""

    INVALID_REQUEST = (400, "invalid_request_error", None)
    AUTHENTICATION = (401, "authentication_error", None)
    PERMISSION = (403, "permission_error", None)  # a valid key that may not do this (model, admin route)
    NOT_FOUND = (404, "not_found_error", None)
    METHOD_NOT_ALLOWED = (405, "invalid_request_error", None)
    REQUEST_TOO_LARGE = (413, "invalid_request_error", None)
    RANGE_NOT_SATISFIABLE = (416, "invalid_request_error", None)
    RATE_LIMITED = (429, "rate_limit_error", None)  # the window's own wait, told by whoever refuses
    REQUEST_HEADERS_TOO_LARGE = (431, "invalid_request_error", None)
    SERVER = (500, "server_error", None)
    UPSTREAM = (502, "upstream_error", RetryAfter.DEPENDENCY)
    UNAVAILABLE = (503, "unavailable_error", RetryAfter.DEPENDENCY)

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def type(self) -> str:
        return self.value[1]

    @property
    def retry_after(self) -> RetryAfter | None:
        """The `Retry-After` an error of this kind says unless it names another entry."""
        return self.value[2]


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
    retry_after: int | None = None  # None: the kind's default (`ErrorKind.retry_after`)
    headers: dict[str, str] = field(default_factory=dict)
    detail: str | None = None  # for the log only (a binding's own error text), never sent
    request_id: str | None = None  # the request's id (`x-request-id`), named in the body when set (the error layer)
    binding: str | None = None  # the binding whose call failed (`binding_error`'s code: "ai", "kv", "r2"); None: no binding's

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.retry_after is None:
            self.retry_after = self.kind.retry_after
        if self.retry_after is not None:
            self.retry_after = int(self.retry_after)  # a plain number on the wire and in the flights' JSON

    @property
    def status(self) -> int:
        return self.kind.status

    @property
    def spent(self) -> bool:
        """Whether the work this error ended may all have been done (and is charged as such)."""
        return self.code in SPENT_CODES

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "type": self.kind.type, "param": self.param, "code": self.code}
        if self.request_id:
            error["request_id"] = self.request_id
        return {"error": error}

    def to_response(self, extra: dict[str, Any] | None = None) -> Response:
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        data = self.to_json()
        if extra:
            data.update(extra)
        return json_response(data, status=self.status, headers=headers)


LOG = logging.getLogger("edgellm")  # the edge's log, as `Deps.log` is on every runtime


def streamed_error(error: GatewayError, log: logging.Logger = LOG) -> dict[str, Any]:
    """The `error` JSON of a failure after a stream's first byte, which can only be an event now;
    its `detail` (a binding's or origin's own text, never the client's to read) goes to the log
    here, as `app.handle` logs it for an answer that had not started. The one place every SSE
    renderer (chat/completions, Workers AI, Responses) sends its error through."""
    if error.detail:
        log.warning("mid-stream %s: %s", error.code or error.kind.type, error.detail)
    return error.to_json()


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message, param=param, code=code)


def is_context_refusal(message: str) -> bool:
    """Whether a backend's refusal says the prompt is past the model's context window."""
    return bool(_CONTEXT_REFUSAL.search(message))


_WINDOW_FIGURES = re.compile(r"\((\d+)(?: tokens)?\)")


def window_figures(text: str) -> str:
    """"the request needs N tokens, the window holds M" from a context refusal's two figures
    (llama.cpp's "request (N tokens) exceeds the available context size (M tokens)", Workers AI's
    5021), if it has exactly them, else "": the numbers help a client trim, the backend's wording
    is not for it."""
    figures = _WINDOW_FIGURES.findall(text)
    return f"the request needs {figures[0]} tokens, the window holds {figures[1]}" if len(figures) == 2 else ""


def binding_error(exc: BindingError, binding: str, code: str, subject: str | None = None) -> GatewayError:
    """A failing binding (AI, KV or R2) as the gateway answers it, in this one place.

    The failure's class decides the answer, never the call site: input the binding refused is the
    caller's 400; KV's one-write-per-second limit is a 429 to retry after that second; a
    `retryable` failure (overload, outage) is a 503, any other (a retired model included) a 502,
    and every 5xx says `Retry-After: RetryAfter.DEPENDENCY`. `binding` names it in the message
    ("R2", "The AI binding"), `code` in the error code (`{code}_error`, `{code}_unavailable`).

    The binding's own text never reaches the client (it may hold llama.cpp's or a runtime's words,
    internal paths): the message says what failed in the gateway's words, with the adapter's
    `public` text if it set one; the binding's text is the error's `detail`, which `app.handle`
    logs. Only a schema refusal of the caller's input (5006) keeps its text, which is about the
    caller's own fields.
    """
    where = f"{binding} failed for {subject}" if subject else f"{binding} failed"
    # the binding's own sentence goes inside the edge's: its closing stop would double the edge's ("later.; retry")
    said = f": {exc.public.rstrip(' .;:')}" if exc.public else ""
    detail = f"{where}: {type(exc).__name__}: {exc}"

    def answer(kind: ErrorKind, message: str, error_code: str, retry_after: int | None = None, param: str | None = None) -> GatewayError:
        return GatewayError(kind, message, param=param, code=error_code, retry_after=retry_after, detail=detail, binding=code)

    if isinstance(exc, KVRateLimited):
        return answer(ErrorKind.RATE_LIMITED, "Too soon: KV takes one write per second to a key; retry after a second.",
                      "kv_rate_limited", RetryAfter.KV_WRITE)
    if isinstance(exc, KVLimitError):
        return answer(ErrorKind.INVALID_REQUEST, f"KV refused the call: a key or value is past KV's limits{said}.", "kv_limit")
    if isinstance(exc, ContextWindowExceeded) or (isinstance(exc, InvalidModelInput) and is_context_refusal(str(exc))):
        figures = window_figures(exc.public or str(exc))
        # OpenAI's code for it, which clients (LangChain, LiteLLM) trim or fall back on
        return answer(ErrorKind.INVALID_REQUEST, "The prompt and max_tokens do not fit the model's context window"
                      f"{f' ({figures})' if figures else ''}{said}.", "context_length_exceeded", param="messages")
    if isinstance(exc, InvalidModelInput):
        told = said or (f": {exc}" if _SCHEMA_REFUSAL.search(str(exc)) else "")
        return answer(ErrorKind.INVALID_REQUEST, f"The model rejected the input{told}.", "invalid_model_input")
    if isinstance(exc, ModelNotFound):
        return answer(ErrorKind.UPSTREAM, f"No configured model is available ({where}: the model is unknown or retired).",
                      "model_unavailable", RetryAfter.DEPENDENCY)
    if isinstance(exc, CapacityExceeded):
        return answer(ErrorKind.UNAVAILABLE, f"Capacity exceeded: {where}: it has no room for this request now{said}; retry shortly.",
                      "capacity_exceeded", RetryAfter.DEPENDENCY)
    if exc.retryable:
        return answer(ErrorKind.UNAVAILABLE, f"{where}: it is unavailable for now{said}; retry shortly.", f"{code}_unavailable",
                      RetryAfter.DEPENDENCY)
    return answer(ErrorKind.UPSTREAM, f"{where}{said or ' (the details are in the edge log)'}; retry shortly.", f"{code}_error",
                  RetryAfter.DEPENDENCY)


def dependency_error(exc: BaseException, kind: ErrorKind, message: str, code: str, retry_after: int = RetryAfter.DEPENDENCY,
                     where: str = "") -> GatewayError:
    """A failing dependency that is not a classified binding call (a Durable Object that threw, an
    object the edge could not reach): `binding_error`'s rule without its classes. The message is
    the gateway's own; the exception's text (a runtime's traceback, an object's internal words,
    paths) is the error's `detail`, which `app.handle` (or `streamed_error`) logs."""
    said = f"{where}: " if where else ""
    return GatewayError(kind, message, code=code, retry_after=retry_after, detail=f"{said}{type(exc).__name__}: {exc}")


def misconfigured(problem: str) -> GatewayError:
    """The answer of a Worker whose configuration was refused (`problem`: the config's own line,
    naming the variable and what it accepts). Cloudflare starts a Worker whatever its [vars] hold,
    so every route says this until an operator fixes it: a 503 (the edge is there, the service is
    not), never a 500 that reads like a bug."""
    return GatewayError(ErrorKind.UNAVAILABLE, f"This edge is misconfigured, so it serves nothing until its operator fixes "
                        f"its [vars] and deploys again: {problem}.", code="worker_misconfigured",
                        retry_after=RetryAfter.UNCONFIGURED)


def admin_routes_off(method: str, path: str) -> GatewayError:
    """The 404 of an admin route on an edge without an admin token, saying how to turn them on
    (on `make dev` they are off, and "No route" alone reads like a typo)."""
    return GatewayError(
        ErrorKind.NOT_FOUND,
        f"No route for {method} {path}: the admin routes (/admin/*, and the /usage page's report) are off because this "
        "edge has no admin token. Locally start it with `edgellm dev --admin-token TOKEN` (or `EDGELLM_ADMIN_TOKEN=TOKEN "
        "make dev`); on Cloudflare run `npx wrangler secret put ADMIN_TOKEN`. Then send `Authorization: Bearer TOKEN`.",
        code="route_not_found")
