"""`GET /admin/routing/stats`: this isolate's breaker and routing counters (bearer ADMIN_TOKEN)."""

from __future__ import annotations

from ..cache.admin import require_admin
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..deps import Deps
from .plan import routing_state


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
    })
