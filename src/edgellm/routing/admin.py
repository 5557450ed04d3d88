"""`GET /admin/routing/stats`: this isolate's breaker and routing counters (bearer ADMIN_TOKEN)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..cache.admin import require_admin
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..deps import Deps
from .plan import routing_state
from .pools import pool_view
from .router import ROUTER_HOST


async def routing_stats(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    require_admin(request, deps, ctx)
    state = routing_state(deps)
    routing = deps.config.routing
    assert state.breaker is not None
    return json_response({
        "object": "routing.stats",
        "scope": "isolate",  # the breaker and counters are per isolate, like the cache counters
        "breaker": state.breaker.to_json(deps.clock.now()),
        **state.counters.to_json(),
        "last_stall_to_origin_ms": state.last_stall_to_origin_ms,
        "origins": [{"name": o.name, "url": o.url, "region": o.region, "context_window": o.context_window} for o in routing.origins],
        "first_token_ms": routing.first_token_ms, "stall_ms": routing.stall_ms,
        "edge_tokenizer": routing.edge_tokenizer,
        "tokenizer_loaded": {name: t is not None for name, t in state.tokenizers.items()},
        "regions": sorted(routing.regions),
        # each pool as this isolate sees it (its own dispatches and probes); with the ROUTER
        # object bound, the pool's whole view is the object's (`pool_objects`)
        "pools": [pool_view(deps, pool).to_json(deps.clock.now()) for pool in routing.pools.values()],
        **({"pool_objects": await _object_views(deps)} if getattr(deps, "routers", None) is not None and routing.pools else {}),
    })


async def _object_views(deps: Deps) -> list[dict[str, Any]]:
    out = []
    for pool in deps.config.routing.pools.values():
        try:
            async with asyncio.timeout(1.0):
                response = await deps.routers.get(pool.name).fetch(  # type: ignore[attr-defined]
                    Request("POST", ROUTER_HOST + "/stats", {"content-type": "application/json"}, json.dumps({"pool": pool.name}).encode()))
            out.append(json.loads(response.body))
        except Exception as exc:  # the stats page still answers without the object
            out.append({"pool": pool.name, "error": f"the pool's object did not answer: {type(exc).__name__}"})
    return out
