"""Managing the cache: preload popular prompts, purge one entry or a whole namespace, stats.

The routes exist only when an `ADMIN_TOKEN` secret is configured (otherwise they answer 404
as if absent) and need it as a bearer token. A namespace purge bumps the namespace's
generation number, which is part of every key: old entries become unreachable at once, with
no KV listing, and expire by their TTL.
"""

from __future__ import annotations

import hmac
import re
from typing import Any, Awaitable

from .. import openai
from ..errors import ErrorKind, GatewayError, RetryAfter, admin_routes_off, binding_error, invalid
from ..generation import GenerationRequest
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..inference import start_generation
from ..ports import BindingError
from ..deps import Deps
from ..validation import read_json
from .entry import record
from . import semantic
from .key import CacheKey, CacheScope, build_cache_key, build_custom_key
from .policy import MAX_TTL, MIN_TTL, is_deterministic
from .service import GENERATION_KEY, counters_of, current_scope, lookup, store

MAX_PRELOAD = 100
_HEX = re.compile(r"^[0-9a-f]{64}$")
_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def require_admin(request: Request, deps: Deps, ctx: RequestContext, *, tenant_allowed: bool = False) -> str | None:
    """None for the admin token (every tenant); a tenant's name when its own API key calls a
    route a tenant may use on its own entries (purge, stats); else 403/401/404."""
    principal = ctx.principal
    if principal is not None and principal.admin:
        return None
    if principal is not None and principal.record is not None:
        if tenant_allowed:
            return principal.cache_tenant
        raise GatewayError(ErrorKind.PERMISSION, "This route needs the admin token; a tenant key may purge and see stats of its own entries.",
                           code="admin_only")
    token = deps.config.admin_token
    if not token:
        raise admin_routes_off(request.method, request.path)
    auth = request.header("authorization") or ""
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise GatewayError(ErrorKind.AUTHENTICATION, "A valid admin bearer token is required.", code="invalid_admin_token",
                           headers={"www-authenticate": 'Bearer realm="edgellm-admin"'})
    return None


async def _kv_write(operation: Awaitable[Any]) -> None:
    """A write KV refuses is never a 500: its one-write-per-second-per-key limit is the
    caller's to respect (429), an outage is a 503; both say when to retry."""
    try:
        await operation
    except BindingError as exc:
        raise binding_error(exc, "KV", "kv") from exc


def _admin_body(request: Request, deps: Deps, ctx: RequestContext, *, tenant_allowed: bool = False) -> tuple[dict[str, Any], str | None]:
    tenant = require_admin(request, deps, ctx, tenant_allowed=tenant_allowed)
    body = read_json(request)
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_type")
    if tenant is None and body.get("tenant") is not None:  # the admin token may act for any tenant
        tenant = body["tenant"]
        if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
            raise invalid("'tenant' must be a tenant name.", "tenant")
    return body, tenant


def _parse_item(item: Any, deps: Deps, where: str) -> GenerationRequest:
    if not isinstance(item, dict):
        raise invalid(f"'{where}' must be a chat or completion request object.", where, "invalid_type")
    if "messages" in item:
        return openai.parse_chat_request({**item, "stream": False}, deps.config)
    return openai.parse_completion_request({**item, "stream": False}, deps.config)


def _ttl(body: dict[str, Any], deps: Deps) -> int:
    if body.get("ttl") is not None:
        if isinstance(body["ttl"], bool) or not isinstance(body["ttl"], int):
            raise invalid("'ttl' must be an integer number of seconds.", "ttl", "invalid_type")
        return min(max(body["ttl"], MIN_TTL), MAX_TTL)
    name = body.get("class")
    if name is not None:
        if not isinstance(name, str):
            raise invalid("'class' must be the name of a cache class.", "class", "invalid_type")
        if name not in deps.config.cache_classes:
            raise invalid(f"Unknown cache class {name!r}.", "class", "unknown_cache_class")
        return deps.config.cache_classes[name]
    return deps.config.cache_default_ttl


async def preload_cache(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    body, tenant = _admin_body(request, deps, ctx)
    items = body.get("requests")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_PRELOAD:
        raise invalid(f"'requests' must be an array of 1 to {MAX_PRELOAD} requests.", "requests", "invalid_type")
    if deps.kv is None:
        raise GatewayError(ErrorKind.UNAVAILABLE, "No KV namespace is bound; the cache is off.", code="cache_unavailable", retry_after=RetryAfter.UNCONFIGURED)
    ttl, refresh = _ttl(body, deps), bool(body.get("refresh"))
    scope = await current_scope(deps, tenant)
    results = []
    for i, item in enumerate(items):
        gen_request = _parse_item(item, deps, f"requests[{i}]")  # a bad item fails the whole call, before any work
        if not is_deterministic(gen_request):
            raise invalid(f"'requests[{i}]' is not deterministic: set temperature 0 or a seed.", f"requests[{i}]", "not_cacheable")
        results.append((gen_request, build_cache_key(gen_request, scope)))
    report = []
    for gen_request, key in results:
        report.append(await _preload_one(deps, gen_request, key, ttl, refresh))
    return json_response({"object": "cache.preload", "ttl": ttl, "results": report,
                          "stored": sum(r["status"] == "stored" for r in report)})


async def _preload_one(deps: Deps, gen_request: GenerationRequest, key: CacheKey, ttl: int, refresh: bool) -> dict[str, Any]:
    if not refresh and (await lookup(deps, key))[0] is not None:
        return {"key": key.digest, "status": "cached"}
    try:
        generation = await start_generation(deps, gen_request)
        events = [event async for event in generation.events]
    except GatewayError as exc:
        return {"key": key.digest, "status": "error", "error": exc.to_json()["error"]}
    answer = record(generation.model, events, deps.clock.now())
    if answer is None or not await store(deps, key.kv_key, answer, ttl):
        return {"key": key.digest, "status": "error", "error": {"message": "the answer could not be stored"}}
    return {"key": key.digest, "status": "stored", "model": answer.model, "usage": answer.usage.to_json()}


async def purge_cache(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    body, tenant = _admin_body(request, deps, ctx, tenant_allowed=True)
    if deps.kv is None:
        raise GatewayError(ErrorKind.UNAVAILABLE, "No KV namespace is bound; the cache is off.", code="cache_unavailable", retry_after=RetryAfter.UNCONFIGURED)
    if "namespace" in body:
        if ctx.principal is not None and not ctx.principal.admin and ctx.principal.share_cache:
            raise GatewayError(ErrorKind.PERMISSION, "The shared pool's namespace can only be purged with the admin token.", code="admin_only")
        return await _purge_namespace(deps, body["namespace"], tenant or deps.config.tenant)
    if ctx.principal is not None and ctx.principal.record is not None:
        tenant = ctx.principal.tenant  # a tenant key purges its own entries only, never the shared pool's
    scope = await current_scope(deps, tenant)
    if "key" in body:
        digest = body["key"]
        if not isinstance(digest, str) or not _HEX.match(digest):
            raise invalid("'key' must be the 64-hex cache key (the x-edgellm-cache-key header).", "key")
        key = CacheKey(scope, digest)
    elif "cache_key" in body:
        if not isinstance(body["cache_key"], str) or not body["cache_key"]:
            raise invalid("'cache_key' must be the custom key sent as cf-aig-cache-key.", "cache_key")
        key = build_custom_key(body["cache_key"], scope)
    elif "request" in body:
        key = build_cache_key(_parse_item(body["request"], deps, "request"), scope)
    else:
        raise invalid("Send one of 'key', 'cache_key', 'request' or 'namespace'.", None, "missing_required_parameter")
    await _kv_write(deps.kv.delete(key.kv_key))
    semantic.forget_entry(deps, tenant or deps.config.tenant, key)
    return json_response({"object": "cache.purge", "purged": "key", "key": key.digest})


async def _purge_namespace(deps: Deps, namespace: Any, tenant: str) -> Response:
    assert deps.kv is not None
    if not isinstance(namespace, str):
        raise invalid("'namespace' must be a string.", "namespace", "invalid_type")
    try:
        CacheScope(tenant, namespace)
    except ValueError as exc:
        raise invalid(str(exc), "namespace") from None
    kv_key = GENERATION_KEY.format(tenant=tenant, namespace=namespace)
    try:
        current = await deps.kv.get(kv_key)
    except BindingError as exc:
        raise binding_error(exc, "KV", "kv") from exc
    generation = (int(current.value) if current is not None else 0) + 1
    await _kv_write(deps.kv.put(kv_key, str(generation).encode()))
    deps.state.generations[(tenant, namespace)] = (CacheScope(tenant, namespace, generation), deps.clock.now())
    return json_response({"object": "cache.purge", "purged": "namespace", "namespace": namespace, "generation": generation})


async def cache_stats(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    tenant = require_admin(request, deps, ctx, tenant_allowed=True)
    if tenant is not None:
        return json_response(await tenant_stats(deps, tenant))
    scope = await current_scope(deps)
    return json_response({
        "object": "cache.stats",
        "scope": "isolate",  # counters are per isolate: KV must never be used as a counter
        **counters_of(deps).to_json(),
        "inflight": deps.state.admission.active,
        "namespace": scope.namespace, "generation": scope.generation,
        "default_ttl": deps.config.cache_default_ttl, "classes": deps.config.cache_classes,
        "semantic": {**deps.state.semantic.to_json(), "max_error": deps.config.semantic_max_error,
                     "check_rate": deps.config.semantic_check_rate, "checks_per_minute": deps.config.semantic_checks_per_minute},
    })


MAX_STATS_PAGES = 10


async def tenant_stats(deps: Deps, tenant: str) -> dict[str, Any]:
    """A tenant's view: its own live entries (listed under its own prefix, never another's),
    not the isolate's counters, which mix every tenant."""
    scope = await current_scope(deps, tenant)
    entries, cursor, complete = 0, None, False
    if deps.kv is not None:
        for _ in range(MAX_STATS_PAGES):
            try:
                page = await deps.kv.list(prefix=scope.prefix, cursor=cursor)
            except BindingError as exc:  # KV down or refusing: a 502/503 with Retry-After, never a 500
                raise binding_error(exc, "KV", "kv") from exc
            entries += len(page.get("keys", []))
            cursor = page.get("cursor")
            if page.get("list_complete", True) or not cursor:
                complete = True
                break
    return {"object": "cache.stats", "scope": "tenant", "tenant": tenant, "entries": entries, "entries_complete": complete,
            "namespace": scope.namespace, "generation": scope.generation, "default_ttl": deps.config.cache_default_ttl}
