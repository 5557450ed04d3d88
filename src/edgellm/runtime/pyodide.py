"""The Pyodide (workerd) adapter: the only module that imports `js`, `pyodide` or `workers`.

It follows the runtime's observed behaviour (../shared/docs/workers-runtime.md): a miss is
`jsnull`, not `None`; options objects and bytes must go through `to_js`; a streamed body must
be a JS ReadableStream of `Uint8Array` chunks; errors arrive as `JsException` with the JS message.
"""

from __future__ import annotations

import asyncio
import logging
import re
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Mapping

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, create_proxy, jsnull, to_js  # type: ignore[import-not-found]
from workers import Response as WorkersResponse  # type: ignore[import-not-found]

from ..app import handle
from ..config import Config
from ..errors import ErrorKind, GatewayError
from ..http import Request, Response
from ..ports import (
    BindingError, CapacityExceeded, Deps, InvalidModelInput, KVEntry, KVLimitError, KVRateLimited, ModelNotFound,
    StreamCutError,
    UsageEvent, UsageNotQueryable,
)
from ..sse import IncompleteStream, decode_events
from ..structured import for_workers_ai_binding
from ..state import IsolateState
from ..stream import close_source


def js_options(data: Mapping[str, Any]) -> Any:
    """A plain dict is silently wrong for bindings (R2 ranges, nested AI inputs): convert it."""
    return to_js(dict(data), dict_converter=js.Object.fromEntries)


def is_missing(value: Any) -> bool:
    """A KV/R2 miss is `jsnull` (falsy, but `is None` is False); JS `undefined` arrives as None."""
    return value is None or value is jsnull


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


# --- AI -----------------------------------------------------------------------------------

_AI_CODE = re.compile(r"\b(\d{4})\b")


def ai_error(exc: BaseException) -> BindingError:
    message = _message(exc)
    match = _AI_CODE.search(message)
    code = match.group(1) if match else ""
    if code == "5007" or "No such model" in message or "deprecated" in message.lower():
        return ModelNotFound(message)
    if code in ("5006", "5005", "5021") or "Input validation" in message:
        return InvalidModelInput(message)
    if code in ("3036", "3040") or "Capacity" in message:
        return CapacityExceeded(message)
    return BindingError(message)


async def read_stream(stream: Any) -> AsyncIterator[bytes]:
    """A JS ReadableStream's chunks. Close it explicitly (`aclosing`): its `finally` awaits the
    reader's cancel, which the garbage collector cannot do ("async generator ignored GeneratorExit")."""
    reader = stream.getReader()
    finished = False
    try:
        while True:
            result = await reader.read()
            if result.done:
                finished = True
                return
            yield result.value.to_bytes()
    finally:
        try:
            if not finished:
                await reader.cancel()  # tells the producer (the AI binding, R2) to stop
        except JsException:
            pass
        try:
            reader.releaseLock()
        except JsException:
            pass


def ai_run_options(session: str | None) -> tuple[Any, ...]:
    """`env.AI.run`'s third argument: a session goes as the `x-session-affinity` header, which
    routes the conversation's turns to the replica holding its prefix cache."""
    if not session:
        return ()
    return (js_options({"extraHeaders": {"x-session-affinity": session}}),)


@dataclass
class WorkersAI:
    binding: Any

    def describe(self, model: str) -> dict[str, Any] | None:
        return None

    async def run(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> dict[str, Any]:
        inputs = for_workers_ai_binding(inputs)
        try:
            result = await self.binding.run(model, js_options(inputs), *ai_run_options(session))
        except JsException as exc:
            raise ai_error(exc) from exc
        return result.to_py()

    async def stream(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> AsyncIterator[dict[str, Any]]:
        if inputs.get("response_format") is not None:
            # Workers AI's JSON mode does not stream (Cloudflare's JSON mode docs): run it whole
            # and hand the answer on as a one-event stream
            return _one_event(await self.run(model, inputs, session=session))
        inputs = for_workers_ai_binding(inputs)
        try:
            stream = await self.binding.run(model, js_options({**inputs, "stream": True}), *ai_run_options(session))
        except JsException as exc:
            raise ai_error(exc) from exc
        return _ai_events(decode_events(read_stream(stream)))


async def _ai_events(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    async with aclosing(events):  # type: ignore[type-var]
        try:
            async for event in events:
                yield event
        except IncompleteStream as exc:
            raise StreamCutError(f"the AI stream was cut: {exc}") from exc


async def _one_event(result: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield result


# --- KV -----------------------------------------------------------------------------------


_KV_STATUS = re.compile(r"^KV \w+ failed: (\d{3})\b")


def kv_error(exc: BaseException) -> BindingError:
    """`KV PUT failed: 429 ...` -> KVRateLimited; any other 4xx -> KVLimitError; else BindingError."""
    message = _message(exc)
    match = _KV_STATUS.match(message)
    status = int(match.group(1)) if match else 0
    if status == 429:
        return KVRateLimited(message)
    return KVLimitError(message) if 400 <= status < 500 else BindingError(message)


@dataclass
class WorkersKV:
    binding: Any

    async def get(self, key: str) -> KVEntry | None:
        try:
            result = await self.binding.getWithMetadata(key, "arrayBuffer")
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


# --- request / response -------------------------------------------------------------------


async def to_core_request(request: Any, max_body: int) -> Request:
    headers = {name.lower(): value for name, value in request.headers.items()}
    declared = headers.get("content-length", "")
    too_big = declared.isdigit() and int(declared) > max_body
    body = b"" if too_big or request.method in ("GET", "HEAD") else await request.bytes()
    return Request(request.method, str(request.url), headers, bytes(body), cf=_cf(request))


def _cf(request: Any) -> dict[str, str]:
    """Where the request came from (`cf`, set by Cloudflare: the client cannot forge it). It is on
    the JS request (`request.js_object.cf`), not on the Python `workers.Request`."""
    cf = getattr(getattr(request, "js_object", None), "cf", None)
    if is_missing(cf):
        return {}
    values = {name: getattr(cf, name, None) for name in ("country", "continent")}
    return {name: str(value) for name, value in values.items() if not is_missing(value)}


async def _js_chunks(body: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """The core's body as JS chunks. When the client leaves, this receives GeneratorExit: closing
    the core's body then is what stops the generation behind it."""
    try:
        async for chunk in body:
            yield to_js(chunk)
    finally:
        await close_source(body)


def to_native_body(body: AsyncIterator[bytes]) -> Any:
    """A core body as a JS ReadableStream: an R2 or AI stream passes straight through."""
    native = getattr(body, "js_stream", None)
    if native is None:
        native = js.ReadableStream.from_(create_proxy(_js_chunks(body)))
    return native


def to_native_response(response: Response) -> Any:
    headers = dict(response.headers)
    if not response.is_streaming:
        return WorkersResponse(bytes(response.body), status=response.status, headers=headers)
    return WorkersResponse(to_native_body(response.body), status=response.status, headers=headers)  # type: ignore[arg-type]


# --- rate limiting and usage ------------------------------------------------------------------


@dataclass
class WorkersRateLimit:
    """The Rate Limiting binding (`[[ratelimits]]`): `limit({key})` -> `{success}`. `period_s` is
    its window (`simple.period`, 10 or 60), which the binding does not expose: the
    RATE_LIMIT_PERIOD var says it, and a refusal's Retry-After is that window."""

    binding: Any
    period_s: int = 60

    async def limit(self, key: str) -> bool:
        outcome = await self.binding.limit(js_options({"key": key}))
        return bool(outcome.success)


@dataclass
class AnalyticsEngineUsage:
    """Usage as Workers Analytics Engine data points (`[[analytics_engine_datasets]]`): blobs
    tenant, key id, model, route, cache status; doubles prompt and completion tokens, latency
    ms, status; indexed by tenant. The binding cannot read them back: `query` asks the SQL API
    (`reader`, core code over the Worker's `fetch`) when the account and a token are configured,
    and is not supported otherwise."""

    binding: Any
    reader: Any = None  # access.analytics_sql.AnalyticsEngineSQL

    async def record(self, event: UsageEvent) -> None:
        self.record_now(event)

    def record_now(self, event: UsageEvent) -> None:
        """`writeDataPoint` returns nothing to await: the runtime sends the point itself."""
        self.binding.writeDataPoint(js_options({
            "blobs": [event.tenant, event.key_id, event.model, event.route, event.cache_status],
            "doubles": [event.prompt_tokens, event.completion_tokens, event.latency_ms, event.status],
            "indexes": [event.tenant],
        }))

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]:
        if self.reader is None:
            raise UsageNotQueryable("set ANALYTICS_ACCOUNT_ID and the ANALYTICS_API_TOKEN secret, or query the Analytics Engine SQL API")
        return await self.reader.query(start, end, group_by, tenant)

    async def tokens_spent(self, key_id: str) -> int:
        return 0  # budgets on Cloudflare count this isolate's charges (IsolateState.access.spent)


def _optional(env: Any, name: str) -> Any:
    binding = getattr(env, name, None)
    return None if binding is None or is_missing(binding) else binding


class EnvMapping(Mapping[str, Any]):
    """`[vars]` and secrets read as a mapping (they are attributes of `env`)."""

    def __init__(self, env: Any) -> None:
        self._env = env

    def __getitem__(self, name: str) -> Any:
        value = getattr(self._env, name, None)
        if value is None or is_missing(value):
            raise KeyError(name)
        return value

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())

    def __len__(self) -> int:
        return 0


def build_deps(env: Any, ctx: Any, state: IsolateState, wait_until: Any = None) -> Deps:
    """The core's ports over the bindings. `wait_until` replaces `ctx.waitUntil` where that one
    is not adapted for Python awaitables (a Durable Object's: `pyodide_durable.ObjectBackground`)."""
    wait_until = wait_until or ctx.waitUntil
    if state.config is None:  # `[vars]` do not change within an isolate: parse them once
        state.config = Config.from_env(EnvMapping(env))
    kv, r2 = getattr(env, "CACHE", None), getattr(env, "ARTIFACTS", None)
    return Deps(
        config=state.config,
        ai=WorkersAI(env.AI),
        kv=None if is_missing(kv) else WorkersKV(kv),
        r2=_r2(r2, wait_until),
        wait_until=wait_until,
        state=state,
        conversations=_conversations(env),
        flights=_flights(getattr(env, "FLIGHTS", None)),
        rate_limiter=_rate_limiter(env),
        usage=_usage(env),
        fetch=_fetch() if state.config.routing.origins else None,
    )


def _rate_limiter(env: Any) -> WorkersRateLimit | None:
    binding = _optional(env, "RATE_LIMITER")
    if binding is None:
        return None
    period = str(_optional(env, "RATE_LIMIT_PERIOD") or "60").strip()
    return WorkersRateLimit(binding, int(period) if period.isdigit() and int(period) > 0 else 60)


def _usage(env: Any) -> AnalyticsEngineUsage | None:
    """The usage dataset, read back through the SQL API when the account and a token are set."""
    binding = _optional(env, "USAGE")
    if binding is None:
        return None
    account, token = _optional(env, "ANALYTICS_ACCOUNT_ID"), _optional(env, "ANALYTICS_API_TOKEN")
    if not account or not token:
        return AnalyticsEngineUsage(binding)
    from ..access.analytics_sql import AnalyticsEngineSQL

    dataset = _optional(env, "USAGE_DATASET") or "edgellm_usage"
    return AnalyticsEngineUsage(binding, AnalyticsEngineSQL(_fetch(), str(account), str(token), str(dataset)))


def _conversations(env: Any) -> Any:
    from .pyodide_conversations import conversation_namespace

    return conversation_namespace(env)


def _flights(binding: Any) -> Any:
    """The coalescing Durable Object binding; without it the Worker does not coalesce."""
    if binding is None or is_missing(binding):
        return None
    from .pyodide_durable import WorkersDurableObjectNamespace

    return WorkersDurableObjectNamespace(binding)


def _fetch() -> Any:
    from .pyodide_fetch import WorkersFetch

    return WorkersFetch()


def _r2(binding: Any, wait_until: Any) -> Any:
    if binding is None or is_missing(binding):
        return None
    from ..artifacts.cached_store import CachedBlobStore
    from .pyodide_r2 import WorkersEdgeCache, WorkersR2

    return CachedBlobStore(WorkersR2(binding), WorkersEdgeCache(), wait_until=wait_until)


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
    try:
        deps = build_deps(env, ctx, state or isolate_state())
        core_request = await to_core_request(request, deps.config.max_body_bytes)
    except Exception as exc:  # before `handle` can answer: still JSON, never the platform's bare 500
        logging.getLogger("edgellm").exception("could not set up the request")
        # a [vars] value the config refused (a ValueError in the config's own words, naming the
        # variable) is said; any other failure (a binding's, the runtime's) by its type, its text logged above
        said = f"{type(exc).__name__}: {exc}" if isinstance(exc, ValueError) else type(exc).__name__
        error = GatewayError(
            ErrorKind.SERVER, f"The Worker could not set up this request ({said}); check its [vars] and bindings.",
            code="worker_setup_failed",
        )
        return to_native_response(error.to_response())
    response = await until_departure(handle(core_request, deps), request)
    if response is None:
        return WorkersResponse(b"", status=CLIENT_CLOSED)
    return to_native_response(response)
