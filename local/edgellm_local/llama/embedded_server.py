"""Starting an `xllamacpp.Server` so that dropping it can never hang the process.

`xllamacpp.Server(params)` returns as soon as its init thread has set a promise, which that thread
does just before it enters llama.cpp's task loop (`server_context::start_loop`). The destructor
calls `terminate()` on the queue and joins the init thread. A server dropped inside that window
loses the stop (the loop, entered after it, runs on) and the dropping thread waits for ever in
`xllamacpp::Server::~Server`: a test's `del server`, `edgellm dev` on Ctrl-C, a runner rebuilt.
`tests/support/xllamacpp_drop_hang.py` reproduces it with xllamacpp alone (about one try in
three on a 2-core machine).

So every server this project starts is handed out only once it has *served* one request that
goes through the task queue: `handle_metrics` posts a METRICS task and returns once the loop has
answered it, hence once the loop is running, after which `terminate()` is always seen. It costs
one queue round trip (well under a millisecond), and it is a property of the object, not of its
callers: no caller can drop a server that is still starting.
"""

from __future__ import annotations

import threading
from typing import Any


def start_server(params: Any) -> Any:
    """An `xllamacpp.Server` for `params` (a `CommonParams`), returned only once its task loop
    is running, so that dropping it stops it. Raises what `xllamacpp.Server` raises.

    Started on a thread of its own: a Ctrl-C (or any signal handler raising) lands on the main
    thread, so it can interrupt the wait here but never the start itself, and no server is ever
    dropped between its construction and its first answer."""
    import xllamacpp

    params.endpoint_metrics = True  # the readiness probe below is a METRICS task (and only that)
    started: list[Any] = []
    failed: list[BaseException] = []

    def start() -> None:
        try:
            server = xllamacpp.Server(params)
            wait_until_serving(server)
            started.append(server)
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=start, name="xllamacpp-start")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return started[0]


def wait_until_serving(server: Any) -> None:
    """Block until the server's task loop has answered a task (see the module docstring)."""
    server.handle_metrics()
