"""The host of the coalescing Durable Object (`Flight` in src/entry.py): its `FlightObject` built
over the object's own bindings, with a `wait_until` that works inside a Durable Object."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable

from ..cache.coalescing import FlightObject
from ..state import IsolateState
from .pyodide_bindings import build_deps


@dataclass
class ObjectBackground:
    """`wait_until` inside a Durable Object. Its `ctx.waitUntil` drops a bare coroutine (the runtime
    logs "coroutine ... was never awaited"), so the work is scheduled here first, a reference kept
    until it ends (a task nobody holds can vanish), and the task handed to `waitUntil`, which keeps
    the object alive until it is done."""

    ctx: Any
    tasks: set[asyncio.Future[Any]] = field(default_factory=set)

    def __call__(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.ctx.waitUntil(task)


def flight_object(env: Any, ctx: Any) -> FlightObject:
    """The flights object's logic over the object's own bindings (it never calls FLIGHTS itself)."""
    deps = build_deps(env, ctx, IsolateState(), wait_until=ObjectBackground(ctx))
    return FlightObject(replace(deps, flights=None))
