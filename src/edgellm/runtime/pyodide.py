"""The Worker's entry point on Pyodide (workerd): the isolate's state, its request log, and `fetch`,
which converts the native request, builds the bindings (`pyodide_bindings`), runs the core's
`handle` until the client leaves, and converts the answer back.

Only `edgellm.runtime.pyodide*` modules import `js`, `pyodide` or `workers`: the toolbox
(`pyodide_toolbox`), one module per binding, the request/response conversion (`pyodide_native`),
the Durable Object hosts (`pyodide_durable`, `pyodide_flight`, `pyodide_conversations`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable

from pyodide.ffi import create_proxy  # type: ignore[import-not-found]
from workers import Response as WorkersResponse  # type: ignore[import-not-found]

from ..access.logs import request_id
from ..api import misconfigured_health
from ..app import handle
from ..errors import ErrorKind, GatewayError, misconfigured
from ..http import Response
from ..state import IsolateState
from .pyodide_bindings import Misconfigured, build_deps
from .pyodide_native import to_core_request, to_native_response
from .pyodide_toolbox import is_missing

_isolate: IsolateState | None = None


def isolate_state() -> IsolateState:
    """The isolate's shared state, created on first use (not at import: the deploy snapshot
    must hold no per-isolate data). This is the one module-level variable in the project: an
    isolate is exactly the scope of its counters, admission and routing breaker (shared I/O lives
    in Durable Objects, never here)."""
    global _isolate
    if _isolate is None:
        _isolate = IsolateState()
        _log_requests()
    return _isolate


def _log_requests() -> None:
    """Workers Logs keep what the isolate prints: one JSON line per request (access.logs)."""
    logger = logging.getLogger("edgellm.access")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


# What a client that left is answered (nobody reads it): nginx's "client closed request".
CLIENT_CLOSED = 499


async def until_departure(work: Awaitable[Response], request: Any) -> Response | None:
    """Run the handler, cancelled if the client leaves before it answers: workerd signals that
    on the JS request's `signal` (`enable_request_signal` compatibility flag; the SDK's
    `workers.Request` does not expose it, so `request.js_object.signal`). Without it a
    non-streamed generation ran to its end for nobody. None when the client left. Once the
    handler has answered, a streamed body sees a departure as GeneratorExit (`_js_chunks`)."""
    signal = getattr(getattr(request, "js_object", None), "signal", None)
    if signal is None or is_missing(signal):
        return await work
    task = asyncio.ensure_future(work)
    departed = False

    def on_abort(event: Any = None) -> None:
        nonlocal departed
        departed = True
        task.cancel()

    listener = create_proxy(on_abort)  # JS keeps it: a proxy, destroyed once removed
    signal.addEventListener("abort", listener)
    try:
        if signal.aborted:
            on_abort()
        return await task
    except asyncio.CancelledError:
        if departed and task.cancelled():
            return None
        raise  # the Worker's own request was cancelled
    finally:
        signal.removeEventListener("abort", listener)
        listener.destroy()


async def fetch(request: Any, env: Any, ctx: Any, state: IsolateState | None = None) -> Any:
    state = state or isolate_state()
    try:
        deps = build_deps(env, ctx, state)
        core_request = await to_core_request(request, deps.config.max_body_bytes)
    except Misconfigured as refused:  # said once by `isolate_config`; answered on every route
        return await _before_handle(request, misconfigured(str(refused)), state)
    except Exception as exc:  # before `handle` can answer: still JSON, never the platform's bare 500
        logging.getLogger("edgellm").exception("could not set up the request")
        # a binding's or the runtime's failure, named by its type; its text (paths, a runtime's words) logged above
        return await _before_handle(request, GatewayError(
            ErrorKind.SERVER, f"The Worker could not set up this request ({type(exc).__name__}); check its bindings.",
            code="worker_setup_failed"), state)
    response = await until_departure(handle(core_request, deps), request)
    if response is None:
        return WorkersResponse(b"", status=CLIENT_CLOSED)
    return to_native_response(response)


async def _before_handle(request: Any, error: GatewayError, state: IsolateState) -> Any:
    """An error answered before `handle` could run, with a request id as every answer has (header
    and body: the id an operator finds the request by in Workers Logs); `/healthz` says the edge is
    misconfigured in its own words (`api.misconfigured_health`). The body is never read."""
    head = await to_core_request(request, 0, read_body=False)
    error.request_id = request_id(head, state.request_ids)
    misconfigured_edge = error.code == "worker_misconfigured"
    response = misconfigured_health(error) if misconfigured_edge and head.path == "/healthz" else error.to_response()
    response.headers["x-request-id"] = error.request_id
    return to_native_response(response)
