"""The whole request flow in one place: the pipeline's layers (`LAYERS`, outermost first) around
the route table (`ROUTES`) whose handler answers.

Runtime adapters call `handle(request, deps)` and nothing else.
"""

from __future__ import annotations

from functools import lru_cache

from . import api, artifacts, embeddings, fault_admin, model_catalog, responses_api
from .access import report as usage_report
from .access.revocation import revoke_key
from .artifacts import hf
from .cache import admin as cache_admin
from .guardrails import admin as guardrails_admin
from .context import RequestContext
from .routing import admin as routing_admin
from .http import Request, Response
from .telemetry.routes import get_metrics
from .deps import Deps
from .pipeline import Layer, dispatch, stacks
from .pipeline.authentication import authentication
from .pipeline.body_size import body_size
from .pipeline.cors import cors
from .pipeline.errors import errors
from .pipeline.guardrails import guardrails
from .pipeline.head import head
from .pipeline.limits import key_limits
from .pipeline.match import match
from .pipeline.preflight import preflight
from .pipeline.request_id import request_id
from .pipeline.telemetry import telemetry
from .pipeline.usage import usage
from .router import Router, route
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
    route("GET", "/admin/guardrails", guardrails_admin.get_guardrails),
    route(("GET", "POST"), "/admin/faults", fault_admin.faults),
    route("GET", "/metrics", get_metrics),
))


# The request's way through the edge, outermost first: each layer does its one thing on the way in
# and, where it needs to, one on the way out (in reverse order), around the route's handler.
# Guardrails are a layer after `body_size` (the prompt checked before the handler); the semantic
# cache's verifier a step inside the cache (`cache.semantic`), where a candidate answer is found.
# docs/architecture.md.
LAYERS: tuple[Layer, ...] = (
    head,            # out: a HEAD's answer without its body
    request_id,      # in: the request id and, when read, its span; out: `x-request-id`
    cors,            # out: CORS headers
    telemetry,       # in: when it started; out: metrics, span, log line (a stream: when it ends); a departure: a 499
    key_limits,      # out: a keyed answer's `x-ratelimit-*`
    usage,           # out: the usage record and tokens charged (a stream: when it ends); a departure: a 499 row
    errors,          # out: a GatewayError or any exception becomes the error JSON
    preflight,       # in: OPTIONS answered here
    match,           # in: the route (404/405), its parameters and template
    authentication,  # in: the caller, its key's request limits (401/429)
    body_size,       # in: a body over the limit is a 413
    guardrails,      # in: a generation's prompt checked (DLP, then the guard): 400 content_filter, masked, or flagged
)


def route_name(request: Request) -> str:
    """The route's template (`/v1/responses/{response_id}`), never the raw path: a path that
    carries an id would make every request its own value, and usage could not be grouped (the
    match layer tells the context the same)."""
    if len(request.path) > 256:  # not remembered: the memo stays small whatever paths arrive
        return _route_template.__wrapped__(request.method, request.path)
    return _route_template(request.method, request.path)


@lru_cache(maxsize=1024)  # the routes are fixed: matching them all is a regex per route, per request
def _route_template(method: str, path: str) -> str:
    if path.startswith("/client/v4/"):
        return "workers-ai"
    template = next((r.template for r in ROUTES.routes if method in r.methods and r.pattern.match(path)), None)
    return template if template is not None else "unmatched"


# one stack per method, each without the layers that have no work on it (`pipeline.only_for`)
_BY_METHOD, _OTHER_METHODS = stacks(LAYERS, dispatch)


async def handle(request: Request, deps: Deps, router: Router = ROUTES) -> Response:
    return await _BY_METHOD.get(request.method, _OTHER_METHODS)(request, deps, RequestContext(router))
