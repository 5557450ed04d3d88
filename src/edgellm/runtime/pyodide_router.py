"""The host of a pool's routing Durable Object (`Router` in src/entry.py): its `RouterObject`
over the object's own bindings (its `fetch` probes the pool's replicas), with the `wait_until`
that works inside a Durable Object (`pyodide_flight.ObjectBackground`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..routing.router import RouterObject
from ..state import IsolateState
from .pyodide_bindings import build_deps
from .pyodide_flight import ObjectBackground


def router_object(env: Any, ctx: Any) -> RouterObject:
    deps = build_deps(env, ctx, IsolateState(), wait_until=ObjectBackground(ctx))
    return RouterObject(replace(deps, flights=None, routers=None))
