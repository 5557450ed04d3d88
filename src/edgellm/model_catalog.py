"""`GET /client/v4/accounts/{account_id}/ai/models/search`: the served models in Cloudflare's shape.

The Cloudflare SDKs' `ai.models.list(account_id=...)` call this and page through it (`page`,
`per_page`) until a page comes back empty, so the answer is Cloudflare's paginated envelope with
`result_info`. Each entry is the catalogue object Cloudflare returns (`id`, `name`, `description`,
`task`, `properties`); the ids are stable UUIDs derived from the model name, since the gateway
has no catalogue of its own: it lists the models it serves (the configured one, then fallbacks,
then the embedding models), with the context window `GET /v1/models` gives each (`context_window`).
"""

from __future__ import annotations

import uuid
from typing import Any

from .embeddings import input_tokens
from .errors import invalid
from .context import RequestContext
from .http import Request, Response, json_response
from .deps import Deps
from .workers_ai import result_envelope

_NAMESPACE = uuid.UUID("6f1d2c86-3c1e-4b7a-9d55-6e0f3f1f3a10")
TEXT_GENERATION = {
    "id": str(uuid.uuid5(_NAMESPACE, "task:text-generation")),
    "name": "Text Generation",
    "description": "Family of generative text models, such as large language models (LLM), that can be adapted for a variety of natural language tasks.",
}
TEXT_EMBEDDINGS = {
    "id": str(uuid.uuid5(_NAMESPACE, "task:text-embeddings")),
    "name": "Text Embeddings",
    "description": "Feature extraction models transform raw data into numerical features that can be processed while preserving the information in the original dataset.",
}
DEFAULT_PER_PAGE = 20
MAX_PER_PAGE = 1000


def context_window(deps: Deps, model: str) -> int:
    """The context window this edge serves `model` with, the one number both model lists give:
    an embedding model's most tokens per text; a text model's as its backend describes it (the
    local edge's llama.cpp context per slot, the Worker's shipped catalog), else `CONTEXT_WINDOW`."""
    if model in deps.config.embedding_models:
        return input_tokens(model)
    described = deps.ai.describe(model, live=False) or {}
    return int(described.get("context_window") or deps.config.context_window)


def catalogue_entry(model: str, role: str, context_window: int) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid5(_NAMESPACE, model)),
        "source": 1,
        "name": model,
        "description": f"{model}, served by this EdgeLLM gateway ({role}).",
        "task": TEXT_EMBEDDINGS if role == "embedding" else TEXT_GENERATION,
        "tags": [],
        "properties": [{"property_id": "context_window", "value": str(context_window)}],
    }


def _positive(request: Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise invalid(f"{name} must be an integer from 1 to {maximum}.", name, "invalid_pagination")
    return int(raw)


async def search_models(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    page = _positive(request, "page", 1, 1_000_000)
    per_page = _positive(request, "per_page", DEFAULT_PER_PAGE, MAX_PER_PAGE)
    search = (request.query.get("search") or "").lower()
    task = (request.query.get("task") or "").lower()
    author = (request.query.get("author") or "").lower()
    config = deps.config
    models = [
        catalogue_entry(m, "primary" if m == config.model else "fallback", context_window(deps, m)) for m in config.models
    ] + [catalogue_entry(m, "embedding", context_window(deps, m)) for m in config.embedding_models]
    models = [
        m for m in models
        if (not search or search in m["name"].lower() or search in m["description"].lower())
        and (not task or task in (m["task"]["name"].lower(), m["task"]["id"]))
        and (not author or m["name"].lower().startswith(f"@cf/{author}/") or m["name"].lower().startswith(f"@hf/{author}/"))
    ]
    chosen = models[(page - 1) * per_page : page * per_page]
    body = result_envelope(chosen)
    body["result_info"] = {"count": len(chosen), "page": page, "per_page": per_page, "total_count": len(models)}
    return json_response(body)
