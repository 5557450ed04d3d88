"""The local edge's HTTP server: an ASGI adapter around the core's `handle`, run by uvicorn.

This is the CPython runtime adapter (the Pyodide one is `edgellm.runtime.pyodide`): it turns
ASGI into `Request`, serves static assets first (as Workers Static Assets does), tracks
`waitUntil` work, and stops a streamed body when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import socket
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable

import uvicorn

from edgellm.access.logs import log_request, request_id
from edgellm.app import ROUTES, handle
from edgellm.context import RequestContext
from edgellm.http import Request, Response
from edgellm.deps import Deps

from edgellm_local.emulator.assets import StaticAssets
from edgellm_local.emulator.durable import local_flights, local_routers
from edgellm_local.emulator.isolation import InTask, as_runtime, request_context
from edgellm_local.emulator.edge_encoding import encoded
from edgellm_local.emulator.page_headers import HeaderRules
from edgellm_local.emulator.hardening import ConnectionBook, ServerLimits, declared_too_large, receive_body, refuse_head, uvicorn_options
from edgellm_local.emulator.r2 import FileBody
from edgellm_local.emulator.zero_copy import EXTENSION, ZeroCopyStats


_SCOPE: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("asgi_scope", default={})
# A body that never waits (a replay in memory, a file in the page cache) to a client that keeps
# up would hold the event loop to its end: after this many bytes the loop's other requests get a
# turn. The server's `send` only waits when its client falls behind (flow control).
FAIR_SHARE_BYTES = 256 * 1024


class PortInUse(Exception):
    pass


@dataclass
class EdgeApp:
    """ASGI application for the local edge."""

    deps: Deps
    assets: StaticAssets | None = None
    coalesce: bool = True  # the local FLIGHTS Durable Object binding; False: the Worker without it
    route_objects: bool = True  # the local ROUTER Durable Object binding (a pool's view); False: each isolate's own
    compress: bool = False  # gzip text for clients that accept it, as Cloudflare does (`edgellm dev` turns it on)
    # API paths skip the static-file lookup (its filesystem probing cost ~80 us on every request);
    # False is the old order, kept for the benchmark's baseline
    api_first: bool = True
    limits: ServerLimits = field(default_factory=ServerLimits)
    page_headers: HeaderRules = field(default_factory=HeaderRules)
    zero_copy: bool = True  # local files go to the socket with sendfile(2) where the server offers it (zero_copy.py)
    zero_copy_stats: ZeroCopyStats = field(default_factory=ZeroCopyStats)
    # the places' ledger the server's protocol keeps and the body reads consult (hardening.py);
    # remade for the limits of the moment by `connection_book` when a server is made
    connections: ConnectionBook = field(init=False, repr=False)
    _background: set[asyncio.Future[Any]] = field(default_factory=set, init=False, repr=False)
    _for_requests: tuple[Deps, Deps] | None = field(default=None, init=False, repr=False)  # (deps, its request deps)

    def __post_init__(self) -> None:
        self.connections = ConnectionBook(self.limits)
        if not self.page_headers.rules and self.assets is not None:
            self.page_headers = HeaderRules.load(self.assets.root)
        if self.coalesce and self.deps.flights is None:
            # objects get the edge's bindings as they are when first used: `edgellm dev` wraps the
            # AI binding in FaultyAI after building the app, and a flight must run that one too
            self.deps = replace(self.deps, flights=local_flights(lambda: self.deps, self.wait_until))
        if self.route_objects and self.deps.routers is None and self.deps.config.routing.pools:
            # the ROUTER binding: one object per pool holds the pool's view (routing.router)
            self.deps = replace(self.deps, routers=local_routers(lambda: self.deps, self.wait_until))

    def connection_book(self) -> ConnectionBook:
        """A new ledger for a server about to run, with the app's limits as they are now (a
        test or `edgellm dev` may replace them after building the app)."""
        self.connections = ConnectionBook(self.limits)
        return self.connections

    def _request_deps(self) -> Deps:
        """`deps.for_request(wait_until)`, made once per `deps`: every request here has the same
        `waitUntil` (this app's), and `dataclasses.replace` cost every request ~4 us. Remade when
        `deps` is replaced (`edgellm dev` wraps the AI binding after building the app)."""
        kept = self._for_requests
        if kept is None or kept[0] is not self.deps:
            kept = self._for_requests = (self.deps, self.deps.for_request(self.wait_until))
        return kept[1]

    def wait_until(self, awaitable: Awaitable[Any]) -> None:
        future = asyncio.ensure_future(awaitable)
        self._background.add(future)
        future.add_done_callback(self._background_done)

    def _background_done(self, future: asyncio.Future[Any]) -> None:
        self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self.deps.log.error("waitUntil task failed: %r", future.exception())

    async def drain(self) -> None:
        """Wait for every `waitUntil` task (used at shutdown and by tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def flush_bookkeeping(self) -> None:
        """A clean stop writes what per-request bookkeeping holds in memory (usage rows are
        committed in batches, off the request's path: usage.py)."""
        close = getattr(self.deps.usage, "close", None)
        if close is not None:
            try:
                await asyncio.to_thread(close)
            except Exception as exc:
                self.deps.log.error("usage not flushed at shutdown: %r", exc)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    loop = type(asyncio.get_running_loop())
                    # the isolating loop (isolation.py) and the engine under it: uvloop's or asyncio's
                    engine = next((c for c in loop.__mro__ if c.__module__.split(".")[0] in ("uvloop", "asyncio")), loop)
                    self.deps.log.info("serving on the %s.%s event loop, on %s.%s", loop.__module__, loop.__qualname__,
                                       engine.__module__, engine.__qualname__)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.drain()
                    await self.flush_bookkeeping()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        async def runtime_receive() -> Any:
            return await as_runtime(receive)

        async def runtime_send(message: Any) -> None:
            await as_runtime(send, message)

        with request_context(f"{scope['method']} {scope['path']}"):  # I/O made here is this request's
            await self._serve(scope, runtime_receive, runtime_send)

    def _zero_copy_sender(self, scope: dict[str, Any], response: Response) -> Any:
        """The server's sendfile extension when this body can use it: a whole local file or a
        range of one (not compressed: a gzip body is not a FileBody), with its exact length."""
        body = response.body
        if not self.zero_copy or not isinstance(body, FileBody) or scope["method"] == "HEAD":
            return None
        sender = scope.get("extensions", {}).get(EXTENSION)
        if sender is None:
            return None
        if response.headers.get("content-length") != str(body.remaining):
            self.zero_copy_stats.fallbacks += 1
            self.deps.log.info("zero-copy skipped: content-length %r, %d bytes left", response.headers.get("content-length"), body.remaining)
            return None
        return sender

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        refusal = refuse_head(scope, self.deps.config.max_body_bytes, self.limits)
        if refusal is not None:
            await self._send(refusal, send)
            return
        if declared_too_large(scope, self.deps.config.max_body_bytes):
            unread = self._request_of(scope, b"")  # the core refuses it by its declared length, as on the Worker
            response = encoded(await handle(unread, self._request_deps()), unread, compress=self.compress)
            response.headers["connection"] = "close"
            await self._send(response, send)
            return
        request = await self._read_request(scope, receive)
        if isinstance(request, Response):  # too slow or too large: answered, connection closes
            await self._send(request, send)
            return
        if request is None:
            return  # the client left while sending its body: nothing to answer, nothing to start
        # From here the client may leave at any moment, before its JSON answer as well as
        # mid-stream: then the work is cancelled, which closes the body and stops the generation.
        _SCOPE.set(scope)  # the serving task's context carries it (its server extensions)
        # The answer runs in this task (a task of its own cost as much as a /healthz's answer);
        # the watcher cancels this task when the client leaves, and says so.
        serving = asyncio.current_task()
        assert serving is not None
        left = False

        async def watch() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            serving.cancel()

        watcher: asyncio.Future[None] | None = None

        def start_watching() -> None:
            nonlocal watcher
            watcher = asyncio.ensure_future(watch())

        try:
            # until the answer first waits no disconnect could reach it: an answer that never
            # waits (a HIT, /healthz) needs no watcher, and no task for one
            await InTask(self._answer(request, send), on_first_wait=start_watching)
        except asyncio.CancelledError:
            # the client left (the watcher cancelled the answer): nothing more to answer. But
            # this task being cancelled by anyone else too (the server shutting down) must stay
            # a cancel, or its canceller would see the request served and carry on as if it had stopped.
            if not left or serving.cancelling() > 1:
                raise
            serving.uncancel()
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _answer(self, request: Request, send: Any) -> None:
        response = None
        if self.assets is not None and not (self.api_first and ROUTES.has_path(request.path)):
            response = self.assets.serve(request)
        if response is not None:
            response = self.page_headers.apply(request.path, response)
            asset = RequestContext(ROUTES, started=self.deps.clock.now(), id=request_id(request, self.deps.state.request_ids),
                                   route="asset", handler="asset")
            response.headers["x-request-id"] = asset.id
            log_request(request, asset, response, self.deps, asset.started)
        if response is None:
            response = await handle(request, self._request_deps())
        response = encoded(response, request, compress=self.compress)
        await self._send(response, send, self._zero_copy_sender(_SCOPE.get(), response))

    async def _read_request(self, scope: dict[str, Any], receive: Any) -> Request | Response | None:
        body = await receive_body(receive, self.deps.config.max_body_bytes, self.limits, self.connections)
        if body is None or isinstance(body, Response):
            return body
        return self._request_of(scope, body)

    @staticmethod
    def _request_of(scope: dict[str, Any], body: bytes) -> Request:
        path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        # The route comes from the path alone: the Host is checked (refuse_head) and never parsed
        # together with the path, so `Host: x/admin?` cannot move the request elsewhere.
        url = f"http://{headers.get('host') or 'localhost'}{path}" + (f"?{query}" if query else "")
        return Request(scope["method"], url, headers, body)

    async def _send(self, response: Response, send: Any, sendfile: Any = None) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        if not response.is_streaming:
            await send({"type": "http.response.body", "body": bytes(response.body)})
            return
        body = response.body
        try:
            if sendfile is not None:
                await as_runtime(sendfile, body, body.remaining)  # type: ignore[union-attr]
                await send({"type": "http.response.body", "body": b""})
                return
            since_turn = 0
            async for chunk in body:  # type: ignore[union-attr]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                since_turn += len(chunk)
                if since_turn >= FAIR_SHARE_BYTES:
                    since_turn = 0
                    await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            pass  # the client went away mid-stream
        finally:
            with contextlib.suppress(Exception):
                await body.aclose()  # type: ignore[union-attr]


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} on {host} is already in use; stop the other server or pass --port") from exc
        raise
    # Accepted sockets inherit this: without it, a keep-alive response written as headers then
    # body waits on Nagle + delayed ACK, adding ~40 ms to every request after the first.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


SERVER_KINDS = {
    # uvicorn's C parser and libuv loop: +21% cache-HIT throughput over the pure-Python pair
    # (both loops enforce request isolation, as workerd does: see `isolation`)
    "fast": {"http": "httptools", "loop": "edgellm_local.emulator.isolation:new_uvloop"},
    "baseline": {"http": "h11", "loop": "edgellm_local.emulator.isolation:new_event_loop"},  # for benchmarks: what the edge ran on before
}


def make_server(app: EdgeApp, kind: str = "fast") -> uvicorn.Server:
    """The uvicorn server. Run it with `server.run(sockets=...)` (or on a loop from
    `server.config.get_loop_factory()`): a bare `asyncio.run(server.serve())` skips uvicorn's loop
    choice and runs on the default asyncio loop whatever `loop` says."""
    # both kinds get the hostile-input guards (hardening.py) around their own HTTP parser
    options = {**SERVER_KINDS[kind], **uvicorn_options(app.limits, SERVER_KINDS[kind]["http"], app.zero_copy_stats if app.zero_copy else None,
                                                         app.connection_book())}
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=3, **options)
    return uvicorn.Server(config)


class EdgeServer:
    """Runs the local edge on a background thread: for tests and benchmarks that need a real
    HTTP server around their own `Deps` (an injected clock, a fault-injecting binding)."""

    def __init__(self, app: EdgeApp, host: str = "127.0.0.1", port: int = 0, kind: str = "fast") -> None:
        self.app = app
        self.sock = bind_socket(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = make_server(app, kind)  # "fast" is what `edgellm dev` serves
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        factory = self.server.config.get_loop_factory()
        self.loop = factory() if factory else asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
        finally:
            self.loop.close()  # left to the garbage collector, its __del__ raises on a closed fd

    def start(self) -> "EdgeServer":
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the local edge failed to start")
            threading.Event().wait(0.01)
        return self

    def drain(self) -> None:
        """Block until the server's `waitUntil` tasks have finished."""
        assert self.loop is not None and not self.loop.is_closed()
        asyncio.run_coroutine_threadsafe(self.app.drain(), self.loop).result(30)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)

    def __enter__(self) -> "EdgeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
