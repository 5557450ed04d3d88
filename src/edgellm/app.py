"""The whole request flow in one place: match a route, run its handler, turn errors into JSON.

Runtime adapters call `handle(request, deps)` and nothing else.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache

from . import access, api, artifacts, embeddings, fault_admin, model_catalog, responses_api
from .access import report as usage_report
from .access.cors import cors_headers
from .access.guard import key_ratelimit_headers
from .access.revocation import revoke_key
from .access.logs import request_id
from .access.usage import Observation
from .artifacts import hf
from .cache import admin as cache_admin
from .routing import admin as routing_admin
from .errors import ErrorKind, GatewayError
from .http import Request, Response
from .telemetry import tracing
from .telemetry.finished import request_ended, when_ended
from .telemetry.routes import get_metrics
from .deps import Deps
from .router import Router, route
from .validation import refuse_oversized
from . import workers_ai

ROUTES = Router((
    route("POST", "/v1/chat/completions", api.create_chat_completion),
    route("POST", "/v1/completions", api.create_completion),
    route("POST", "/v1/embeddings", embeddings.create_embedding),
    route("GET", "/v1/models", api.list_models),
    route("GET", "/v1/models/{model:path}", api.retrieve_model),
    route("POST", "/v1/responses", responses_api.create_response),
    route("GET", "/v1/responses/{response_id}", responses_api.get_response),
    route("DELETE", "/v1/responses/{response_id}", responses_api.delete_response),  # one path, two entries: the router unions their methods for a 405
    route("GET", "/v1/responses/{response_id}/input_items", responses_api.list_input_items),
    route("POST", "/client/v4/accounts/{account_id}/ai/run/{model:path}", api.run_model, render_error=workers_ai.error_response),
    route("GET", "/client/v4/accounts/{account_id}/ai/models/search", model_catalog.search_models, render_error=workers_ai.error_response),
    route("GET", "/healthz", api.health),
    route("GET", "/models", artifacts.list_published_models),
    # the Hugging Face Hub's layout (repo `models/{name}`); before the catch-all artifact route
    route("GET", "/models/{name}/resolve/{revision}/{file:path}", hf.resolve_file),
    route("GET", "/api/models/models/{name}", hf.get_repo_info),
    route("GET", "/api/models/models/{name}/revision/{revision}", hf.get_repo_info),
    route("GET", "/api/models/models/{name}/tree/{revision}", hf.list_repo_tree),
    route("GET", "/api/models/models/{name}/tree/{revision}/{path:path}", hf.list_repo_tree),
    route("GET", "/models/{path:path}", artifacts.get_artifact),
    # the same repos as `{name}` (a repo id without namespace, as the Hub's `gpt2`), after the
    # artifact route so a model's own blob paths are never read as a bare repo
    route("GET", "/api/models/{bare}", hf.get_repo_info),
    route("GET", "/api/models/{bare}/revision/{revision}", hf.get_repo_info),
    route("GET", "/api/models/{bare}/tree/{revision}", hf.list_repo_tree),
    route("GET", "/api/models/{bare}/tree/{revision}/{path:path}", hf.list_repo_tree),
    route("GET", "/{bare}/resolve/{revision}/{file:path}", hf.resolve_file),
    route("GET", "/{owner}/{repo}/resolve/{revision}/{file:path}", hf.foreign_repo),
    route("GET", "/api/models/{owner}/{repo}", hf.foreign_repo),
    route("GET", "/api/models/{owner}/{repo}/revision/{revision}", hf.foreign_repo),
    route("GET", "/api/models/{owner}/{repo}/tree/{revision:path}", hf.foreign_repo),
    route("POST", "/admin/cache/preload", cache_admin.preload_cache),
    route("POST", "/admin/cache/purge", cache_admin.purge_cache),
    route("GET", "/admin/cache/stats", cache_admin.cache_stats),
    route("GET", "/admin/usage", usage_report.get_usage),
    route("POST", "/admin/keys/{key_id}/revoke", revoke_key),
    route("GET", "/admin/routing/stats", routing_admin.routing_stats),
    route(("GET", "POST"), "/admin/faults", fault_admin.faults),
    route("GET", "/metrics", get_metrics),
))


def route_name(request: Request) -> str:
    """The route's template (`/v1/responses/{response_id}`), never the raw path: a path that
    carries an id would make every request its own value, and usage could not be grouped. Here,
    beside the table, so usage is told it (`access.account`) and never imports the app back."""
    if len(request.path) > 256:  # not remembered: the memo stays small whatever paths arrive
        return _route_template.__wrapped__(request.method, request.path)
    return _route_template(request.method, request.path)


@lru_cache(maxsize=1024)  # the routes are fixed: matching them all is a regex per route, per request
def _route_template(method: str, path: str) -> str:
    if path.startswith("/client/v4/"):
        return "workers-ai"
    template = next((r.template for r in ROUTES.routes if method in r.methods and r.pattern.match(path)), None)
    return template if template is not None else "unmatched"


def _preflight(request: Request, router: Router, deps: Deps) -> Response:
    router.match("GET" if request.header("access-control-request-method") in (None, "HEAD") else request.header("access-control-request-method", "GET"), request.path)
    return Response(204, {
        **cors_headers(request, deps.config),
        "access-control-allow-methods": "GET, HEAD, POST, DELETE, OPTIONS",
        "access-control-allow-headers": request.header("access-control-request-headers") or "*",
        "access-control-max-age": "86400",
    })


def _error_response(request: Request, error: GatewayError, router: Router) -> Response:
    # the route says how its errors render (Cloudflare's envelope on the REST route); else OpenAI's `error`
    error.request_id = request.id  # the body names it: the id a client quotes to find the log line
    render = router.error_renderer(request.path)
    return render(error) if render else error.to_response()


async def handle(request: Request, deps: Deps, router: Router = ROUTES) -> Response:
    started, handler_name = deps.clock.now(), "none"
    request.id = request_id(request, deps.state.request_ids)
    if deps.tracer.recording or deps.config.routing.active:
        # the request's span (under the client's trace when it sent a W3C traceparent, else a new
        # trace), current for what it calls: an origin is sent its trace. Nothing else reads it
        # while the request runs; the log line makes one when it needs the trace id.
        request.span = tracing.request_span(deps.tracer, deps.state.ids, request.method, request.headers.get("traceparent"))
        tracing.enter(request.span)
    try:
        if request.method == "OPTIONS":
            handler_name = "preflight"
            response = _preflight(request, router, deps)
        else:
            handler, params = router.match(request.method, request.path)
            handler_name = getattr(handler, "__name__", "handler")
            request.path_params = params
            request.principal = await access.authenticate(request, deps)
            refuse_oversized(request, deps.config.max_body_bytes)
            response = await handler(request, deps)
    except GatewayError as error:
        if error.detail:  # a binding's own text: for the operator, never the client
            deps.log.warning("%s %s: %s", request.method, request.path, error.detail)
        if error.code is not None and error.code.startswith("r2_"):  # every R2 failure is `binding_error(.., "r2")`'s
            deps.state.telemetry.r2_errors += 1
        if error.spent and request.reservation is not None and request.observed is None:
            # the generation may have run to its end (a whole answer past its deadline): its usage
            # is settled as for a client that left before its JSON answer, at its reservation
            request.observed = Observation(request.reservation.model, "")
        response = _error_response(request, error, router)
    except asyncio.CancelledError:  # the client left before its answer: still a usage row, its metrics and a log line
        route = route_name(request)
        request_ended(request, access.departed(request, deps, started, route), deps, started, route, handler_name)
        raise
    except Exception as exc:  # the last line of defence: never a traceback, never a bare 500
        deps.log.exception("unhandled error on %s %s", request.method, request.path)
        response = _error_response(request, GatewayError(ErrorKind.SERVER, f"Internal error: {type(exc).__name__}.", code="internal_error"), router)
    route = route_name(request)
    response = access.account(request, response, deps, started, route)
    if request.principal is not None and request.principal.record is not None:  # every keyed answer says its limits
        for name, value in key_ratelimit_headers(deps, request.principal.record).items():
            response.headers.setdefault(name, value)
    response.headers["x-request-id"] = request.id
    when_ended(request, response, deps, started, route, handler_name)
    for name, value in cors_headers(request, deps.config).items():
        response.headers.setdefault(name, value)
    if request.method == "HEAD" and not response.is_streaming:
        response.headers.setdefault("content-length", str(len(response.body)))
        response.body = b""
    return response
