"""Handlers of the inference API: OpenAI-compatible routes, the Workers AI REST route, models, health.

Every generation route is the same three steps: parse the wire format into a
`GenerationRequest`, start (or replay) a `Generation`, render it in the caller's format.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import hashlib

from . import access, embeddings, model_catalog, openai, workers_ai
from .capabilities import capabilities_of, enforce, required_capabilities
from .errors import ErrorKind, GatewayError
from .generation import Generation, GenerationRequest
from .inference import whole_tool_calls
from .caller import Observation
from .context import RequestContext
from .http import Request, Response, json_response
from .kept_json import JSONShape, KeptJSON
from .stream import Stream, in_blocks
from .cache.service import cached_generation
from .deps import Deps
from .sessions import request_session
from .validation import read_json

JSONRenderer = Callable[[Generation], Awaitable[dict[str, Any]]]
StreamRenderer = Callable[[Generation], Stream[bytes]]


def generation_headers(generation: Generation) -> dict[str, str]:
    headers = {"x-edgellm-model": generation.model}
    if generation.cache_status:
        headers["cf-aig-cache-status"] = generation.cache_status
    if generation.age is not None:
        headers["age"] = str(generation.age)
    if generation.cache_key:
        headers["x-edgellm-cache-key"] = generation.cache_key
    if generation.cache_match:
        headers["x-edgellm-cache-match"] = generation.cache_match
    route = generation.route or ("edge; reason=cache" if generation.cache_status == "HIT" else None)
    if route:
        headers["x-edgellm-route"] = route
    return headers


def enforce_capabilities(deps: Deps, gen_request: GenerationRequest, described: Mapping[str, Any] | None = None) -> None:
    """A 400 naming the parameter the model cannot honour, before any inference (or cache).
    `described`: the backend's `describe` of the model, when the caller has it already."""
    needs = gen_request.derived.get("needs")  # kept on the immutable request, as its cache digest is
    if needs is None:
        needs = gen_request.derived["needs"] = tuple(required_capabilities(gen_request.inputs))
    if not needs:  # plain text generation: every model has it
        return
    model = gen_request.model
    if described is None:
        described = deps.ai.describe(model, live=False)
    enforce(model, capabilities_of(model, deps.config.model_capabilities, described), gen_request.inputs)


def system_fingerprint(deps: Deps, model: str, described: Mapping[str, Any] | None = None) -> str | None:
    """OpenAI's `system_fingerprint`: names the model id and the backend build that answered
    (a client compares it to notice a backend change). Null when the backend names no build
    (the Workers AI binding does not say which build serves a model)."""
    described = (described if described is not None else deps.ai.describe(model, live=False)) or {}
    build = described.get("build")
    if not build:
        return None
    return _fingerprint(model, str(described.get("backend", "")), str(build))


@lru_cache(maxsize=64)  # a pure function of three strings; a hash per answer otherwise
def _fingerprint(model: str, backend: str, build: str) -> str:
    return "fp_" + hashlib.sha256(f"{model}|{backend}|{build}".encode()).hexdigest()[:12]


async def serve_generation(
    request: Request, deps: Deps, ctx: RequestContext, gen_request: GenerationRequest, as_json: JSONRenderer, as_stream: StreamRenderer,
    shape: JSONShape | None = None,
) -> Response:
    """`shape`: how the route's JSON answer is kept for a stored entry's next HITs (`kept_json`)."""
    gen_request = await access.admit_generation(ctx, deps, gen_request)
    described = deps.ai.describe(gen_request.model, live=False)  # once: the capabilities and the fingerprint both read it
    enforce_capabilities(deps, gen_request, described)
    if gen_request.session is None and ctx.principal is not None and gen_request.prefix_scope != ctx.principal.scope.prefix_scope:
        gen_request = replace(gen_request, prefix_scope=ctx.principal.scope.prefix_scope)
    generation = await cached_generation(deps, request, ctx, gen_request)
    generation.system_fingerprint = system_fingerprint(deps, generation.model, described if generation.model == gen_request.model else None)
    memo_key = (shape.name, generation.model, generation.system_fingerprint) if shape is not None else None
    if memo_key is not None and generation.rendered is not None and not gen_request.stream and memo_key in generation.rendered:
        return _kept_answer(ctx, generation, shape, generation.rendered[memo_key])  # type: ignore[arg-type]
    if gen_request.inputs.get("tools"):  # whatever produced the calls (edge, origin, a HIT's replay), clients get them whole
        generation.events = whole_tool_calls(generation.events)
    access.observe(ctx, generation, deps.clock.now)
    if gen_request.stream:
        headers = generation_headers(generation)
        headers.update({"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"})
        return Response(200, headers, streamed_body(generation, as_stream(generation)))
    body = await as_json(generation)  # first: a failover while collecting changes the route header
    response = json_response(body, headers=generation_headers(generation))
    if generation.rendered is not None and shape is not None and ctx.observed is not None and ctx.observed.finished:
        kept = shape.kept(body, bytes(response.body))
        if kept is not None:  # the next HITs of this entry: these bytes, and this usage
            generation.rendered[memo_key] = (kept, ctx.observed.copy())
    return response


def streamed_body(generation: Generation, rendered: Stream[bytes]) -> Stream[bytes]:
    """The SSE body rendered from `generation` (a renderer's `Stream`, owning the generation). A
    HIT's replay never waits (every stored token is there at once), so it goes out in blocks
    (`in_blocks`: a write, a gzip flush and on Workers a JS hop each, not one per token); a live
    answer goes out chunk by chunk, each token as it is made."""
    return in_blocks(rendered) if generation.cache_status == "HIT" else rendered


def _kept_answer(ctx: RequestContext, generation: Generation, shape: JSONShape, kept: tuple[KeptJSON, Observation]) -> Response:
    """A HIT of an entry whose JSON answer was rendered before (`kept_json`): the same bytes but
    its own leading fields, the same headers as rendering gives, and the usage then observed
    (the events are never read, so nothing else would observe it)."""
    body, observed = kept
    ctx.observed = observed.copy()
    return Response(200, {"content-type": "application/json", **generation_headers(generation)}, shape.fill(body))


def parsed_body(request: Request, deps: Deps, ctx: RequestContext, chat: bool,
                parse: Callable[[Any, Any], GenerationRequest]) -> tuple[Any, GenerationRequest]:
    """The body and its `GenerationRequest`, from the tenant's recent identical body when there
    is one (`state.ParsedBodies`): parsing and checking the same bytes gives the same result.
    The request carries its tenant's prefix scope already (`serve_generation` would set it), so
    the one the memo shares keeps what is derived from it (its cache key) across requests."""
    memo = deps.state.parsed
    if len(request.body) > memo.max_body:
        body = read_json(request)
        return body, parse(body, deps.config)
    scope = ctx.tenant_scope
    key = (scope, chat, request.header("content-length"), bytes(request.body))  # bytes: hashable whatever the adapter gave
    known = memo.parsed(key, deps.config)
    if known is not None:
        return known  # type: ignore[return-value]
    body = read_json(request)
    gen_request = parse(body, deps.config)
    if ctx.principal is not None and gen_request.prefix_scope != scope.prefix_scope:
        gen_request = replace(gen_request, prefix_scope=scope.prefix_scope)
    memo.keep(key, deps.config, body, gen_request)
    return body, gen_request


async def _openai_generation(request: Request, deps: Deps, ctx: RequestContext, *, chat: bool) -> Response:
    parse = openai.parse_chat_request if chat else openai.parse_completion_request
    render_json = openai.render_chat_json if chat else openai.render_completion_json
    body, gen_request = parsed_body(request, deps, ctx, chat, parse)
    session = request_session(request, ctx.tenant_scope, body)
    if session is not None or gen_request.session is not None:  # a session's request reuses its session's prefix alone
        gen_request = replace(gen_request, session=session, prefix_scope=None if session is not None else gen_request.prefix_scope)
    created = int(deps.clock.now())
    answer_id = deps.state.ids.new("chatcmpl" if chat else "cmpl")  # this answer's, whichever way it is rendered
    return await serve_generation(
        request, deps, ctx, gen_request,
        lambda g: render_json(g, created, answer_id),
        lambda g: openai.render_stream(g, created, chat=chat, include_usage=gen_request.include_usage,
                                       tools=bool(gen_request.inputs.get("tools")), log=deps.log, answer_id=answer_id),
        JSONShape("openai.chat" if chat else "openai.completion", openai.HEAD_FIELDS, lambda: openai.answer_head(chat, created, answer_id)),
    )


async def create_chat_completion(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    return await _openai_generation(request, deps, ctx, chat=True)


async def create_completion(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    return await _openai_generation(request, deps, ctx, chat=False)


async def run_model(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """Cloudflare's REST shape: `POST /client/v4/accounts/{account_id}/ai/run/{model}`."""
    model = ctx.params["model"]
    if embeddings.is_embedding_model(deps, model):
        return await embeddings.run_embedding_model(request, deps, ctx, model)
    if model not in deps.config.models:
        raise GatewayError(ErrorKind.NOT_FOUND, f"No such model {model}; GET /v1/models lists the models served.", param="model", code="model_not_found")
    inputs, stream = workers_ai.validate_inputs(read_json(request), deps.config)
    gen_request = GenerationRequest(model, inputs, stream=stream)
    return await serve_generation(request, deps, ctx, gen_request, workers_ai.render_json, lambda g: workers_ai.render_stream(g, deps.log),
                                  JSONShape("workers-ai"))


async def list_models(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    data = []
    for model in deps.config.models:
        entry: dict[str, Any] = {"id": model, "object": "model", "created": 0, "owned_by": "cloudflare"}
        described = deps.ai.describe(model) or {}
        entry["edgellm"] = {"role": "primary" if model == deps.config.model else "fallback", **described,
                            "capabilities": capabilities_of(model, deps.config.model_capabilities, described).names(),
                            "context_window": model_catalog.context_window(deps, model)}
        data.append(entry)
    for entry in embeddings.model_entries(deps):  # the window the models search gives them too
        entry["edgellm"]["context_window"] = model_catalog.context_window(deps, entry["id"])
        data.append(entry)
    for alias, target in deps.config.aliases.items():
        data.append({"id": alias, "object": "model", "created": 0, "owned_by": "edgellm",
                     "edgellm": {"role": "alias", "alias_of": target}})
    return json_response({"object": "list", "data": data})


async def retrieve_model(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """`GET /v1/models/{id}` (the SDK's `models.retrieve`); model ids contain slashes."""
    model = ctx.params["model"]
    if model in deps.config.aliases:  # every id models.list lists can be retrieved, aliases as listed there
        return json_response({"id": model, "object": "model", "created": 0, "owned_by": "edgellm",
                              "edgellm": {"role": "alias", "alias_of": deps.config.aliases[model]}})
    if embeddings.is_embedding_model(deps, model):
        entry = next(e for e in embeddings.model_entries(deps) if e["id"] == model)
        entry["edgellm"]["context_window"] = model_catalog.context_window(deps, model)
        return json_response(entry)
    if model not in deps.config.models:
        raise GatewayError(ErrorKind.NOT_FOUND, f"The model '{model}' does not exist on this gateway; GET /v1/models lists the models served.",
                           param="model", code="model_not_found")
    entry: dict[str, Any] = {"id": model, "object": "model", "created": 0, "owned_by": "cloudflare"}
    entry["edgellm"] = {"role": "primary" if model == deps.config.model else "fallback", **(deps.ai.describe(model) or {}),
                        "context_window": model_catalog.context_window(deps, model)}
    return json_response(entry)


def misconfigured_health(error: GatewayError) -> Response:
    """`/healthz` of an edge whose configuration was refused: a 503 a probe sees as down, saying
    why in the same `error` the other routes answer."""
    return error.to_response({"status": "misconfigured"})


async def health(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    body: dict[str, Any] = {"status": "ok", "model": deps.config.model, "access": "open" if deps.config.open_access else "keys",
                            # what the usage page tells its reader (a 404 from /admin says the same to anyone)
                            "admin_routes": bool(deps.config.admin_token),
                            # whether /metrics answers without the admin token (the usage page's live view asks)
                            "metrics_open": deps.config.metrics_open}
    if deps.config.open_access:
        body["warning"] = "OPEN ACCESS: API calls need no key; anyone who can reach this edge can spend inference."
    return json_response(body)
