"""Who is calling: the API key (or the admin token) of a request, checked before any handler runs.

Routes fall in three classes by path alone: public (health, artifacts, OPTIONS), the inference
API (`/v1/*`, `/client/v4/*`: a key), and admin (`/admin/*`: `ADMIN_TOKEN` for everything, or a
tenant's own key for its own entries). Open mode (`OPEN_ACCESS`) admits API calls without a key
as the configured tenant; it exists only when configured.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace

from ..config import Config
from ..errors import ErrorKind, GatewayError, RetryAfter, dependency_error, invalid
from ..generation import GenerationRequest
from ..context import RequestContext
from ..http import Request
from ..ports import BindingError
from ..deps import Deps
from .keys import KeyCache, KeyRecord, KeyRing, is_reserved_tenant, parse_api_key
from .ratelimit import check_tokens, rate_limited, ratelimit_headers, take_request
from .reservation import prompt_estimate, reserve
from ..caller import Principal  # here since the request names its type (also edgellm.access.Principal)
OPEN_KEY_ID = "open"
ADMIN_KEY_ID = "admin"


def is_api_path(path: str) -> bool:
    return path.startswith("/v1/") or path.startswith("/client/v4/")


def is_admin_path(path: str) -> bool:
    """The operator's routes, `/metrics` among them: a tenant's key there is known as one (and
    refused as one, 403), not taken for a mistyped admin token."""
    return path.startswith("/admin/") or path == "/metrics"


def presented_key(request: Request) -> str | None:
    headers = request.headers  # lower-case names (`Request`)
    auth = headers.get("authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return (headers.get("x-api-key") or "").strip() or None


def unauthenticated(message: str, code: str = "invalid_api_key") -> GatewayError:
    return GatewayError(ErrorKind.AUTHENTICATION, message, code=code, headers={"www-authenticate": 'Bearer realm="edgellm"'})


async def _record(deps: Deps, key_id: str) -> KeyRecord | None:
    access, now = deps.state.access, deps.clock.now()
    if access.keys is None:
        access.keys = KeyCache()
    known, record = access.keys.get(key_id, now)
    if known:
        return record
    if deps.kv is None:
        raise GatewayError(ErrorKind.UNAVAILABLE, "No KV namespace is bound; keys cannot be checked.", code="keys_unavailable", retry_after=RetryAfter.UNCONFIGURED)
    try:
        record = await KeyRing(deps.kv).get(key_id)
    except (BindingError, ValueError) as exc:
        # the record's failure is the error's detail, logged by `app.handle`: the operator's, never the caller's
        raise dependency_error(exc, ErrorKind.UNAVAILABLE, "Keys cannot be checked now; retry shortly.", "keys_unavailable",
                               where="the key record") from exc
    access.keys.put(key_id, record, now)
    return record


def open_principal(deps: Deps) -> Principal:
    """Open mode's caller: the configured tenant without a key. One per isolate and Config (a
    principal is immutable), so no request pays for making it and its tenant scope."""
    kept = deps.state.access.open_principal
    if kept is None or kept[0] is not deps.config:
        kept = deps.state.access.open_principal = (deps.config, Principal(deps.config.tenant, OPEN_KEY_ID))
    return kept[1]


async def authenticate(request: Request, deps: Deps) -> Principal | None:
    """The principal of an API or admin request (None on public routes); 401 when unknown."""
    settled = settle(request, deps)
    if isinstance(settled, KeyToCheck):
        return await check_key(request, deps, settled)
    return settled


@dataclass(frozen=True, slots=True)
class KeyToCheck:
    """An `el-` key `settle` could not decide on: its record must be read (`check_key`)."""

    parsed: tuple[str, str] | None  # (key id, secret); None: malformed


def settle(request: Request, deps: Deps) -> Principal | None | KeyToCheck:
    """What `authenticate` decides without reading a key's record: a public route, the admin
    token, open mode (or a 401); else the key to check. Apart, so the callers without a key
    (a HIT in open mode) pay for no await."""
    path = request.path
    api = is_api_path(path)
    if not (api or is_admin_path(path)):
        return None
    given = presented_key(request)
    token = deps.config.admin_token
    if given and token and hmac.compare_digest(given.encode(), token.encode()):
        return Principal(deps.config.tenant, ADMIN_KEY_ID, admin=True)
    parsed = parse_api_key(given) if given else None
    foreign = given is not None and parsed is None and not given.startswith("el-")
    if given is None or (foreign and deps.config.open_access and api):
        # Open mode: no key, or a value that is no EdgeLLM key at all (SDKs must send some
        # api_key); a malformed, unknown or revoked `el-` key is still refused below.
        if deps.config.open_access and api:
            return open_principal(deps)
        if is_admin_path(path):
            return None  # the admin handlers answer (404 without ADMIN_TOKEN, else 401)
        raise unauthenticated("An API key is required: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.", "missing_api_key")
    return KeyToCheck(parsed)


async def check_key(request: Request, deps: Deps, key: KeyToCheck) -> Principal | None:
    """The caller of a key `settle` left to check: its record, and its request limits taken."""
    path, parsed = request.path, key.parsed
    record = await _record(deps, parsed[0]) if parsed else None
    if record is None or parsed is None or not record.matches(parsed[1]):
        if is_admin_path(path):
            return None  # not a tenant key: the admin handlers answer (404 without ADMIN_TOKEN, else 401)
        raise unauthenticated("The API key is not valid.")
    if not record.active:
        raise unauthenticated("The API key has been revoked.", "revoked_api_key")
    if is_reserved_tenant(record.tenant, deps.config.tenant):  # a record written by hand for a tenant the edge uses itself
        raise unauthenticated("The API key is not valid: its tenant name is reserved.")
    try:
        take_request(deps.state.access, record.key_id, record.requests_per_minute, deps.clock.now())
        if deps.rate_limiter is not None and is_api_path(path):
            try:
                allowed = await deps.rate_limiter.limit(record.key_id)
            except Exception as exc:  # fail open: the in-isolate window above still holds
                deps.log.warning("rate limiter failed: %s", exc)
                allowed = True
            if not allowed:  # retry after the binding's window (a binding that does not say: 60 s, its longest)
                raise rate_limited("requests", int(getattr(deps.rate_limiter, "period_s", 60)))
    except GatewayError as refused:  # a 429 says the limits too, as every keyed answer does
        refused.headers.update(key_ratelimit_headers(deps, record))
        raise
    return Principal(record.tenant, record.key_id, record)


def key_ratelimit_headers(deps: Deps, record: KeyRecord) -> dict[str, str]:
    return ratelimit_headers(deps.state.access, record.key_id, record.requests_per_minute, record.tokens_per_minute, deps.clock.now())


_WITHIN_LIMITS = "within_input_limits"  # `GenerationRequest.derived`: the config it was found within


def check_input_limits(gen_request: GenerationRequest, config: Config) -> None:
    """How many messages and how long each: bounds a caller can rely on, before any work. The
    request is immutable, so once within a config's bounds it stays so: a request the parse memo
    shares (a repeated body, as a HIT's often is) is checked once per config, not per request."""
    derived = gen_request.derived
    if derived.get(_WITHIN_LIMITS) is config:
        return
    messages = gen_request.inputs.get("messages")
    if isinstance(messages, list):
        if len(messages) > config.max_messages:
            raise invalid(f"At most {config.max_messages} messages are accepted, got {len(messages)}.", "messages", "too_many_messages")
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str) and len(content) > config.max_message_chars:
                raise invalid(f"A message may hold at most {config.max_message_chars} characters.", f"messages[{i}].content", "message_too_long")
    prompt = gen_request.inputs.get("prompt")
    if isinstance(prompt, str) and len(prompt) > config.max_message_chars:
        raise invalid(f"The prompt may hold at most {config.max_message_chars} characters.", "prompt", "prompt_too_long")
    derived[_WITHIN_LIMITS] = config


async def admit_generation(ctx: RequestContext, deps: Deps, gen_request: GenerationRequest) -> GenerationRequest:
    """Before a generation (or a HIT): its input within bounds, then `admit_tokens` for its
    prompt (estimated) and its `max_tokens`. The request to serve: `gen_request`, or with its
    `max_tokens` cut to what is left of the key's budget (a shorter answer, cut at `length`).
    A caller without a key has no limits to admit to: its prompt is not estimated."""
    check_input_limits(gen_request, deps.config)
    if ctx.principal is None or ctx.principal.record is None:
        return gen_request
    max_tokens = await admit_tokens(ctx, deps, gen_request.model, prompt_estimate(gen_request.inputs), gen_request.max_tokens)
    if max_tokens == gen_request.max_tokens:
        return gen_request
    return replace(gen_request, inputs={**gen_request.inputs, "max_tokens": max_tokens})


async def admit_tokens(ctx: RequestContext, deps: Deps, model: str, prompt: int, max_tokens: int) -> int:
    """Before any call that spends tokens (a generation, embeddings) or its HIT: the key may use
    the model, has tokens left in its window and in its budget; what the request may cost (the
    `prompt` estimate plus `max_tokens`) is then reserved until its usage is recorded.

    The budget admits a request only when that cost fits what is left of it (the budget less
    what was spent and what requests in progress reserved), so no request overspends it: one
    that does not fit has its `max_tokens` cut to what is left after its prompt, and is refused
    (429 `insufficient_quota`) when not one token would be left. An embedding (`max_tokens` 0:
    its input is its whole cost) cannot be cut, so it fits or is refused. Returns the
    `max_tokens` reserved."""
    principal: Principal | None = ctx.principal
    record = principal.record if principal else None
    if record is None:
        return max_tokens
    if not record.allows_model(model):
        raise GatewayError(ErrorKind.PERMISSION, f"This key may not use the model {model}.", param="model", code="model_not_allowed")
    if record.token_budget > 0:
        spent = deps.state.access.spent.get(record.key_id, 0)
        if deps.usage is not None:
            try:
                spent = max(spent, await deps.usage.tokens_spent(record.key_id))
            except Exception as exc:
                deps.log.warning("usage read failed: %s", exc)
        # what requests in progress have reserved counts as spent (access.reservation)
        left = record.token_budget - spent - deps.state.access.reserved.get(record.key_id, 0)
        if left <= 0:
            raise GatewayError(ErrorKind.RATE_LIMITED, f"The key's token budget ({record.token_budget}) is spent.",
                               code="insufficient_quota")
        if prompt + max_tokens > left:
            if max_tokens <= 0 or left - prompt < 1:
                what = "its input" if max_tokens <= 0 else "its prompt, estimated"
                raise GatewayError(ErrorKind.RATE_LIMITED, f"The key's token budget ({record.token_budget}) has {left} tokens left; "
                                   f"this request may cost {prompt} ({what}). Send less, or ask for a larger budget.",
                                   code="insufficient_quota")
            max_tokens = left - prompt
    # checked and reserved with no await between: a concurrent request sees this one's reservation
    check_tokens(deps.state.access, record.key_id, record.tokens_per_minute, deps.clock.now())
    ctx.reservation = reserve(deps.state.access, record.key_id, record.tokens_per_minute, model, prompt, max_tokens, deps.clock.now())
    return max_tokens
