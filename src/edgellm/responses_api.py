"""Handlers of the Responses API: create (continuing a stored conversation), retrieve, delete.

A turn resolves `previous_response_id` to the whole history (one read of the conversation's
Durable Object), then runs as an ordinary chat generation: the answer cache keys on the
resolved messages (so a deterministic turn is cached like chat, and a continuation keys on
its conversation, not on an id), and the conversation is the session, so the model keeps
its prompt prefix warm. The answer is stored before the client is told it is complete.
"""

from __future__ import annotations

from dataclasses import replace

from . import access, responses_wire as wire
from .api import enforce_capabilities, generation_headers, streamed_body
from .cache.service import cached_generation
from .conversations import ConversationStore, StoredResponse, conversation_of, new_conversation_id, new_response_id, not_found
from .errors import GatewayError, invalid
from .generation import Finish
from .guardrails.unmask import remasked
from .context import RequestContext
from .http import Request, Response, json_response
from .deps import Deps
from .sessions import request_session, tenant_session
from .tenancy import TenantScope
from .validation import read_json


def conversation_store(ctx: RequestContext, deps: Deps) -> ConversationStore | None:
    """The caller's tenant's conversations: another tenant's response ids are not found, even
    when known (ids are unguessable, but they travel in logs and URLs)."""
    if deps.conversations is None:
        return None
    scope = ctx.tenant_scope if ctx.principal is not None else TenantScope(deps.config.tenant)
    return ConversationStore(deps.conversations, scope)


def fit_chain(chain: list[StoredResponse], parsed: wire.ResponsesRequest, max_messages: int) -> list[StoredResponse]:
    """The stored turns this turn continues, within the message cap: with `truncation: "auto"`
    the oldest turns are dropped until the conversation fits (OpenAI's rule); otherwise a
    conversation past the cap is the documented `conversation_too_large`, naming
    `previous_response_id` (the caller never sent the messages the cap counts)."""
    own = len(parsed.input) + (1 if parsed.instructions else 0)
    total = own + sum(len(record.messages()) for record in chain)
    if total <= max_messages:
        return chain
    if parsed.truncation == "auto":
        kept = list(chain)
        while kept and total > max_messages:
            total -= len(kept.pop(0).messages())
        return kept  # this turn's own input past the cap is refused as for chat, naming 'messages'
    raise invalid(f"This conversation holds {total} messages with this turn, more than the {max_messages} a turn may carry; "
                  "send 'truncation': 'auto' to drop the oldest turns, or start a new conversation (omit 'previous_response_id').",
                  "previous_response_id", "conversation_too_large")


async def create_response(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    body = read_json(request)
    parsed = wire.parse_request(body, deps.config)
    session = request_session(request, ctx.tenant_scope, body)
    store = conversation_store(ctx, deps)
    history: list[dict[str, str]] = []
    if parsed.previous_response_id is not None:
        if store is None:
            raise not_found(parsed.previous_response_id)
        chain = fit_chain(await store.chain(parsed.previous_response_id), parsed, deps.config.max_messages)
        history = [message for record in chain for message in record.messages()]
        conversation = conversation_of(parsed.previous_response_id) or new_conversation_id()
    else:
        conversation = new_conversation_id()
    if store is None and parsed.store:  # no conversation binding: nothing can be stored, and the answer says so
        parsed = replace(parsed, store=False)
    gen_request = parsed.generation_request(history, session or tenant_session(ctx.tenant_scope, conversation))
    gen_request = await access.admit_generation(ctx, deps, gen_request)  # the key's models, limits and budget, as for chat
    try:  # text.format: only where the model can honour it, as for chat
        enforce_capabilities(deps, gen_request)
    except GatewayError as exc:
        raise invalid(exc.message.replace("'response_format'", "'text.format'"), "text.format", exc.code) from exc
    response_id = new_response_id(conversation)
    if parsed.store and store is not None:
        await store.begin(response_id)  # a DELETE while this is generated deletes it (it is then never stored)
    meta = wire.ResponseMeta(response_id, int(deps.clock.now()), parsed, message_id=wire.message_id_of(response_id))
    generation = await cached_generation(deps, request, ctx, gen_request)
    access.observe(ctx, generation, deps.clock.now)

    check = ctx.guardrails.answer if ctx.guardrails is not None else None
    unmasked = check.placeholders if check is not None else None  # the caller's values, put back in its answer

    async def on_complete(text: str, finish: Finish) -> None:
        if parsed.store and store is not None:
            if unmasked:  # a stored turn is a later turn's prompt: it keeps what the model saw
                text = remasked(text, unmasked)
            await store.append(wire.stored_record(meta, generation.model, text, finish))

    headers = generation_headers(generation)
    if parsed.stream:
        headers.update({"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"})
        return Response(200, headers, streamed_body(generation, wire.render_stream(generation, meta, on_complete, deps.log)))
    return json_response(await wire.render_json(generation, meta, on_complete), headers=headers)


async def get_response(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response_id = ctx.params["response_id"]
    store = conversation_store(ctx, deps)
    if store is None:
        raise not_found(response_id)
    return json_response(wire.render_stored(await store.get(response_id)))


async def list_input_items(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """`GET /v1/responses/{id}/input_items` (the SDK's `wire.input_items.list`): the turn's
    own input messages as OpenAI's message items, newest first unless `order=asc`."""
    response_id = ctx.params["response_id"]
    store = conversation_store(ctx, deps)
    if store is None:
        raise not_found(response_id)
    record = await store.get(response_id)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("'order' must be 'asc' or 'desc'.", "order", "invalid_value")
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise invalid("'limit' must be an integer from 1 to 100.", "limit", "invalid_value")
    items = wire.input_items(record)
    if order == "desc":
        items.reverse()
    after = request.query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise invalid(f"'after' names no input item of {response_id}.", "after", "invalid_value")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})


async def delete_response(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response_id = ctx.params["response_id"]
    store = conversation_store(ctx, deps)
    if store is None:
        raise not_found(response_id)
    await store.delete(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})
