"""Embeddings: OpenAI's `POST /v1/embeddings` and Workers AI's bge models on the REST route.

Both shapes are parsed into one `EmbeddingRequest` (the texts, in order), answered by the AI
binding's `embed` (Workers AI: `env.AI.run("@cf/baai/bge-...", {"text": [...]})`; locally a
llama.cpp embedding model standing in for bge), and kept by the exact cache: an embedding is a
pure function of the model and the text, so every request is deterministic and cacheable,
under the same tenant and namespace scope (and purge generation) as chat answers.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from .access.guard import admit_tokens
from .access.reservation import CHARS_PER_TOKEN
from .cache.key import CacheKey, _digest
from .caller import Observation
from .cache.policy import CachePolicy, cache_policy
from .cache.service import counters_of, current_scope
from .capabilities import WORKERS_AI_MODELS
from .deps import Deps
from .errors import ErrorKind, GatewayError, binding_error, invalid
from .generation import GenerationRequest
from .context import RequestContext
from .http import Request, Response, json_response
from .validation import read_json
from .workers_ai import result_envelope
from .ports import BindingError, InvalidModelInput

DEFAULT_EMBEDDING_MODEL = "@cf/baai/bge-small-en-v1.5"
# Workers AI takes at most 100 texts in one `text` array (bge's input schema)
MAX_TEXTS = 100
# a text's length before any tokenizer sees it: a WordPiece token is at least one character,
# so a text longer than this many characters per token cannot fit (the binding checks tokens)
MAX_CHARS_PER_TOKEN = 32
ENCODINGS = ("float", "base64")
_WORDISH = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    texts: tuple[str, ...]
    encoding_format: str = "float"
    single: bool = False  # Workers AI's `{"text": "..."}` (one text, not a list of one)


def embedding_dimensions(model: str) -> int | None:
    """From the shipped catalog (`capabilities.WORKERS_AI_MODELS`); None for a model it lacks."""
    facts = WORKERS_AI_MODELS.get(model)
    return facts.dimensions if facts is not None and facts.kind == "embedding" else None


def input_tokens(model: str) -> int:
    """The most tokens one text may have (512, bge's positions, for a model the catalog lacks)."""
    facts = WORKERS_AI_MODELS.get(model)
    return facts.context_window if facts is not None and facts.kind == "embedding" else 512


def is_embedding_model(deps: Deps, model: str) -> bool:
    return model in deps.config.embedding_models


def _texts(value: Any, param: str, model: str) -> tuple[tuple[str, ...], bool]:
    if isinstance(value, str):
        texts, single = (value,), True
    elif isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        texts, single = tuple(value), False
    elif isinstance(value, list) and value and all(isinstance(t, int) or (isinstance(t, list) and all(isinstance(i, int) for i in t)) for t in value):
        raise invalid(f"'{param}' as token arrays is not supported: token ids are a tokenizer's own and {model} takes text; "
                      "send strings (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False).", param, "unsupported_input")
    elif isinstance(value, list) and not value:
        raise invalid(f"'{param}' must not be empty.", param, "empty_input")
    else:
        raise invalid(f"'{param}' must be a string or an array of strings.", param, "invalid_type")
    if len(texts) > MAX_TEXTS:
        raise invalid(f"'{param}' holds {len(texts)} texts; at most {MAX_TEXTS} in one request.", param, "too_many_inputs")
    limit = input_tokens(model)
    for i, text in enumerate(texts):
        where = param if single else f"{param}[{i}]"
        if not text.strip():
            raise invalid(f"'{where}' is empty: there is nothing to embed.", where, "empty_input")
        if len(text) > limit * MAX_CHARS_PER_TOKEN:
            raise invalid(f"'{where}' is too long: {model} embeds at most {limit} tokens.", where, "input_too_long")
    return texts, single


def _model(deps: Deps, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid("'model' must name an embedding model; GET /v1/models lists them.", "model", "invalid_type")
    model = deps.config.aliases.get(value, value)
    if model in deps.config.embedding_models:
        return model
    if model in deps.config.models:
        raise invalid(f"'{value}' is a chat model: it makes no embeddings; use an embedding model "
                      f"({', '.join(deps.config.embedding_models)}).", "model", "model_not_embedding")
    raise GatewayError(ErrorKind.NOT_FOUND, f"The model '{value}' does not exist on this gateway; GET /v1/models lists the models served.",
                       param="model", code="model_not_found")


def parse_openai(body: Any, deps: Deps) -> EmbeddingRequest:
    """OpenAI's embeddings body: `model`, `input` (a string or an array of strings),
    `encoding_format` (float or base64), `dimensions` (only the model's own: bge vectors cannot
    be shortened), `user` (accepted and ignored, as OpenAI stores it only for abuse reports)."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_type")
    model = _model(deps, body.get("model"))
    if "input" not in body or body["input"] is None:
        raise invalid("'input' is required: a string or an array of strings.", "input", "missing_input")
    texts, _ = _texts(body["input"], "input", model)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise invalid(f"'encoding_format' must be one of {', '.join(ENCODINGS)}; got {encoding!r}.", "encoding_format", "invalid_value")
    dimensions = body.get("dimensions")
    if dimensions is not None:
        native = (deps.ai.describe(model, live=False) or {}).get("dimensions") or embedding_dimensions(model)
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise invalid("'dimensions' must be a positive integer.", "dimensions", "invalid_type")
        if dimensions != native:
            made = f"makes {native}-dimensional vectors" if native else "has a fixed dimension"
            raise invalid(f"'dimensions' {dimensions} is not available: {model} {made} and cannot shorten them "
                          "(omit 'dimensions').", "dimensions", "unsupported_dimensions")
    return EmbeddingRequest(model, texts, encoding)


def parse_workers_ai(body: Any, model: str) -> EmbeddingRequest:
    """Workers AI's bge input: `{"text": str | [str]}`."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_type")
    if "text" not in body:
        raise invalid("'text' is required: a string or an array of strings.", "text", "missing_input")
    texts, single = _texts(body["text"], "text", model)
    return EmbeddingRequest(model, texts, single=single)


# --- the answer: the binding, through the exact cache -----------------------------------------------


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]
    prompt_tokens: int
    cache_status: str | None = None  # HIT / MISS / BYPASS, as the chat answers say it


def estimated_tokens(texts: tuple[str, ...]) -> int:
    """A lower bound on bge's WordPiece tokens (words and punctuation, plus [CLS] and [SEP]):
    Workers AI's bge answer carries no token count, and usage must say something."""
    return sum(len(_WORDISH.findall(text)) + 2 for text in texts)


def _encode_entry(embedded: Embedded) -> bytes:
    rows = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in embedded.vectors]
    return json.dumps({"v": 1, "rows": rows, "tokens": embedded.prompt_tokens}).encode()


def _decode_entry(value: bytes) -> Embedded | None:
    try:
        entry = json.loads(value)
        rows = [base64.b64decode(row) for row in entry["rows"]]
        vectors = [list(struct.unpack(f"<{len(row) // 4}f", row)) for row in rows]
        return Embedded(vectors, int(entry["tokens"]), "HIT")
    except (ValueError, KeyError, TypeError, struct.error):
        return None


async def _cache_key(deps: Deps, request: Request, ctx: RequestContext, embedding: EmbeddingRequest) -> tuple[CacheKey | None, CachePolicy]:
    """(key or None when bypassed, policy): the chat cache's policy headers, scope and purge generation."""
    # an embedding is deterministic: the policy is asked as for a temperature-0 request
    policy = cache_policy(request, GenerationRequest(embedding.model, {"temperature": 0}), deps.config)
    if policy.bypass or deps.kv is None:
        return None, policy
    scope = await current_scope(deps, ctx.tenant_scope.cache_tenant)
    custom = policy.custom_key
    payload = {"custom": custom} if custom else {"embeddings": {"model": embedding.model, "texts": list(embedding.texts)}}
    key = CacheKey(scope, _digest({"scope": [scope.tenant, scope.namespace], **payload}))
    return key, policy


def reserved_tokens(embedding: EmbeddingRequest) -> int:
    """What a request reserves of its key's tokens: cautious, as a generation's prompt estimate
    is (`access.reservation`): never below the answer's own estimate (a text of one-letter words
    is a token a letter), and never more than the model reads of each text."""
    limit = input_tokens(embedding.model)
    return sum(min(limit, max(math.ceil(len(text) / CHARS_PER_TOKEN) + 2, estimated_tokens((text,)))) for text in embedding.texts)


async def embed(deps: Deps, request: Request, ctx: RequestContext, embedding: EmbeddingRequest, param: str = "input") -> Embedded:
    """The vectors, from the cache or the binding. The key's model list, token window and budget
    hold as for a generation (its input tokens are the whole cost; a HIT is charged none), and
    usage, metrics and the log line record them."""
    await admit_tokens(ctx, deps, embedding.model, reserved_tokens(embedding), 0)
    embedded = await _embedded(deps, request, ctx, embedding, param)
    ctx.observed = Observation(embedding.model, embedded.cache_status or "BYPASS", embedded.prompt_tokens, finished=True,
                               route="edge", generated=False)
    return embedded


async def _embedded(deps: Deps, request: Request, ctx: RequestContext, embedding: EmbeddingRequest, param: str) -> Embedded:
    key, policy = await _cache_key(deps, request, ctx, embedding)
    counters = counters_of(deps)  # chat's: /metrics and the cache stats count both kinds of answer
    if key is None:
        counters.bypasses += 1
    elif deps.kv is not None and policy.read:
        try:
            entry = await deps.kv.get(key.kv_key)
        except Exception as exc:  # fail open: a KV failure is a miss
            deps.log.warning("embedding cache read failed for %s: %s", key.kv_key, exc)
            counters.read_errors += 1
            entry = None
        cached = _decode_entry(bytes(entry.value)) if entry is not None else None
        if cached is not None and len(cached.vectors) == len(embedding.texts):
            counters.hits += 1
            counters.bytes_served += len(entry.value)  # type: ignore[union-attr]
            return cached
    if key is not None:
        counters.misses += 1
    try:
        result = await deps.ai.embed(embedding.model, list(embedding.texts))
        vectors = _vectors(result, len(embedding.texts))
        usage = result.get("usage")
        tokens = int((usage.get("prompt_tokens") if isinstance(usage, dict) else None) or estimated_tokens(embedding.texts))
    except InvalidModelInput as exc:  # the model's own refusal of a text (past its input tokens): the caller's field
        said = exc.public or str(exc)
        raise invalid(f"'{param}' was refused by {embedding.model}: {said}", param, "invalid_input") from exc
    except BindingError as exc:
        raise binding_error(exc, "The AI binding", "upstream", embedding.model) from exc
    except Exception as exc:  # a binding's unexpected failure is a 502, never a bare 500
        raise binding_error(BindingError(f"{type(exc).__name__}: {exc}"), "The AI binding", "upstream", embedding.model) from exc
    embedded = Embedded(vectors, tokens, "MISS" if key is not None else "BYPASS")
    if key is not None and deps.kv is not None and policy.write:
        deps.wait_until(_store(deps, key, embedded, policy.ttl))
    return embedded


def _vectors(result: Any, texts: int) -> list[list[float]]:
    """The answer's vectors, checked for what the answer is made of (one vector of numbers per
    text, all of one width): anything else is the binding's failure (`BindingError`: a 502),
    found before a byte is rendered or stored."""
    vectors = result.get("data") if isinstance(result, dict) else None
    if not isinstance(vectors, list) or len(vectors) != texts:
        raise BindingError(f"the embedding model answered {len(vectors) if isinstance(vectors, list) else 'no'} vectors for {texts} texts")
    width = len(vectors[0]) if isinstance(vectors[0], list) else 0
    for vector in vectors:
        if not isinstance(vector, list) or not vector or len(vector) != width or not all(type(x) in (float, int) for x in vector):
            raise BindingError(f"the embedding model answered a vector that is not {width or 'some'} numbers")
    return vectors


async def _store(deps: Deps, key: CacheKey, embedded: Embedded, ttl: int) -> None:
    assert deps.kv is not None
    try:
        await deps.kv.put(key.kv_key, _encode_entry(embedded), expiration_ttl=ttl, metadata={"kind": "embeddings"})
    except Exception as exc:
        deps.log.error("embedding cache write failed for %s: %s", key.kv_key, exc)
        counters_of(deps).write_errors += 1


def _headers(embedding: EmbeddingRequest, embedded: Embedded) -> dict[str, str]:
    headers = {"x-edgellm-model": embedding.model}
    if embedded.cache_status:
        headers["cf-aig-cache-status"] = embedded.cache_status
    return headers


def _vector(values: list[float], encoding: str) -> Any:
    if encoding == "base64":  # OpenAI's: little-endian float32, base64 (the openai client decodes it so)
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


# --- handlers ---------------------------------------------------------------------------------


async def create_embedding(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """`POST /v1/embeddings` (the openai client's `embeddings.create`)."""
    embedding = parse_openai(read_json(request), deps)
    embedded = await embed(deps, request, ctx, embedding)
    data = [{"object": "embedding", "index": i, "embedding": _vector(v, embedding.encoding_format)}
            for i, v in enumerate(embedded.vectors)]
    body = {"object": "list", "data": data, "model": embedding.model,
            "usage": {"prompt_tokens": embedded.prompt_tokens, "total_tokens": embedded.prompt_tokens}}
    return json_response(body, headers=_headers(embedding, embedded))


async def run_embedding_model(request: Request, deps: Deps, ctx: RequestContext, model: str) -> Response:
    """Workers AI's REST shape for a bge model: `{"result": {"shape": [n, d], "data": [[...]]}}`."""
    embedding = parse_workers_ai(read_json(request), model)
    embedded = await embed(deps, request, ctx, embedding, "text")
    width = len(embedded.vectors[0]) if embedded.vectors else 0
    result = {"shape": [len(embedded.vectors), width], "data": embedded.vectors, "pooling": "mean"}
    return json_response(result_envelope(result), headers=_headers(embedding, embedded))


def model_entries(deps: Deps) -> list[dict[str, Any]]:
    """`/v1/models` entries of the embedding models: their kind and dimension."""
    entries = []
    for model in deps.config.embedding_models:
        described = dict(deps.ai.describe(model) or {})
        entries.append({"id": model, "object": "model", "created": 0, "owned_by": "cloudflare",
                        "edgellm": {"role": "embedding", **described, "kind": "embedding",
                                    "dimensions": described.get("dimensions") or embedding_dimensions(model)}})
    return entries
