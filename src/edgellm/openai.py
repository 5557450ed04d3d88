"""The OpenAI wire format: request parsing into Workers AI terms, and response rendering.

OpenAI's snake_case lives here and nowhere else. Accepted extensions that Workers AI has and
OpenAI lacks: `top_k`, `repetition_penalty`, `raw`, `lora`.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, AsyncIterator

from . import sse
from .config import Config
from .errors import LOG, ErrorKind, GatewayError, invalid, streamed_error
from .generation import Finish, Generation, GenerationRequest, Token, ToolCallDelta
from .stream import owns
from .parameters import check_chat_fields, parse_grammar
from .structured import parse_extensions, refuse_chat_only
from .validation import as_bool, as_int
from .workers_ai import validate_messages, validate_options, validate_sampling

MAX_STOP_SEQUENCES = 4
# OpenAI request parameters no backend of this gateway can honour (the legacy `functions` API:
# send `tools`; audio; predicted outputs; logit bias, which Workers AI lacks).
UNSUPPORTED_PARAMETERS = ("functions", "function_call", "logit_bias", "audio", "modalities", "prediction",
                          "web_search_options")
_ROLE_ALIASES = {"developer": "system"}
ACCEPTED_ROLES = ("system", "developer", "user", "assistant", "tool")  # what a role error lists


def resolve_model(body: dict[str, Any], config: Config) -> str:
    model = body.get("model")
    if model is None or model == "":
        return config.model
    if not isinstance(model, str):
        raise invalid("'model' must be a string.", "model", "invalid_type")
    model = config.aliases.get(model, model)
    if model in config.embedding_models:  # it exists, but makes vectors, not text: the caller's mistake, said so
        raise invalid(f"'{model}' is an embedding model: it cannot generate text; POST /v1/embeddings with it instead.",
                      "model", "model_not_chat")
    if model not in config.models:
        raise GatewayError(
            ErrorKind.NOT_FOUND,
            f"The model '{model}' does not exist on this gateway; GET /v1/models lists the models served.",
            param="model", code="model_not_found",
        )
    return model


def _content_text(parts: list[Any], where: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(f"'{where}[{j}]' must be a text part; only text content is supported.", f"{where}[{j}]", "unsupported_content")
        texts.append(part["text"])
    return "".join(texts)


def parse_messages(value: Any) -> list[dict[str, str]]:
    """OpenAI messages -> Workers AI messages: `developer` is a system message, and content
    given as text parts is joined; then Workers AI's own checks apply."""
    if isinstance(value, list):
        value = [_normalise_message(m, i) for i, m in enumerate(value)]
    return validate_messages(value, accepted_roles=ACCEPTED_ROLES)


def _normalise_message(message: Any, i: int) -> Any:
    if not isinstance(message, dict):
        return message
    role = _ROLE_ALIASES.get(message.get("role"), message.get("role"))
    content = message.get("content")
    if isinstance(content, list):
        content = _content_text(content, f"messages[{i}].content")
    return {**message, "role": role, "content": content}


def _parse_stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise invalid("'stop' must be a non-empty string or an array of non-empty strings.", "stop", "invalid_type")
    if len(items) > MAX_STOP_SEQUENCES:
        raise invalid(f"'stop' may hold at most {MAX_STOP_SEQUENCES} sequences.", "stop")
    return tuple(items)


def _parse_common(body: Any, config: Config) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_type")
    model = resolve_model(body, config)
    n = as_int(body, "n", 1)
    if n not in (None, 1):
        raise invalid("Only n=1 is supported: every backend here returns one choice per request; send n requests "
                      "(with different seeds) for several answers.", "n", "unsupported_parameter")
    for name in UNSUPPORTED_PARAMETERS:  # OpenAI parameters accepted nowhere here: refused, never dropped
        if body.get(name) is not None:
            raise invalid(f"'{name}' is not supported on this gateway.", name, "unsupported_parameter")
    sampling_body = dict(body)
    if body.get("max_completion_tokens") is not None:
        # checked under the name the caller sent: refused as 'max_tokens', it named a field not in the request
        sampling_body["max_tokens"] = as_int(body, "max_completion_tokens", 1, config.context_window)
    sampling = validate_sampling(sampling_body, config)
    return model, sampling, validate_options(body)


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(as_bool(body, "stream"))
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object.", "stream_options", "invalid_type")
    include_usage = bool(as_bool(options or {}, "include_usage"))
    return stream, include_usage


def parse_chat_request(body: Any, config: Config) -> GenerationRequest:
    model, sampling, extras = _parse_common(body, config)
    if "messages" not in body:
        raise invalid("'messages' is required.", "messages", "missing_required_parameter")
    check_chat_fields(body, UNSUPPORTED_PARAMETERS)
    structure = parse_extensions(body, openai_shape=True)
    inputs = {"messages": parse_messages(body["messages"]), **sampling, **extras, **structure,
              **parse_grammar(body, structured=bool(structure.get("response_format") or structure.get("tools")))}
    stream, include_usage = _stream_flags(body)
    stop = _parse_stop(body)
    if stop and inputs.get("logprobs"):  # the gateway cuts at stop sequences; a cut token's logprob would be a lie
        raise invalid("'logprobs' cannot be combined with 'stop' on this gateway.", "logprobs", "unsupported_parameter")
    if inputs.get("tools") and inputs.get("logprobs"):  # no backend here has both: the logprobs would be the call envelope's
        raise invalid("'logprobs' cannot be combined with 'tools' on this gateway.", "logprobs", "unsupported_parameter")
    return GenerationRequest(model, inputs, stop, stream, include_usage)


def parse_completion_request(body: Any, config: Config) -> GenerationRequest:
    model, sampling, extras = _parse_common(body, config)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("'prompt' is required and must be a string.", "prompt", "invalid_type" if "prompt" in body else "missing_required_parameter")
    if not prompt:
        raise invalid("'prompt' must not be empty.", "prompt")
    if body.get("logprobs") is not None:  # never silently dropped: no backend here returns them for completions
        raise invalid("'logprobs' is not supported on /v1/completions; use /v1/chat/completions with 'logprobs': true.",
                      "logprobs", "unsupported_parameter")
    refuse_chat_only(body, "use /v1/chat/completions")
    # An OpenAI completion continues the text as given: no chat template unless asked.
    inputs = {"prompt": prompt, **sampling, "raw": True, **extras}
    stream, include_usage = _stream_flags(body)
    return GenerationRequest(model, inputs, _parse_stop(body), stream, include_usage)


# --- rendering -----------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


HEAD_FIELDS = ("id", "object", "created")


def answer_head(chat: bool, created: int, answer_id: str | None = None) -> dict[str, Any]:
    """The fields of an OpenAI answer that name this answer, first in its object (so a HIT's
    kept body writes them and appends the rest: `kept_json`). `answer_id`: the request's own
    (`IsolateState.ids`); a new one otherwise."""
    if chat:
        return {"id": answer_id or new_id("chatcmpl"), "object": "chat.completion", "created": created}
    return {"id": answer_id or new_id("cmpl"), "object": "text_completion", "created": created}


async def render_chat_json(generation: Generation, created: int, answer_id: str | None = None) -> dict[str, Any]:
    answer = await generation.collect_answer()
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.tool_calls:
        message["content"] = answer.text or None
        message["tool_calls"] = [call.to_json() for call in answer.tool_calls]
    logprobs = {"content": list(answer.logprobs), "refusal": None} if answer.logprobs is not None else None
    return {
        **answer_head(True, created, answer_id),
        "model": generation.model,
        "system_fingerprint": generation.system_fingerprint,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": answer.finish.finish_reason}],
        "usage": answer.finish.usage.to_json(),
    }


async def render_completion_json(generation: Generation, created: int, answer_id: str | None = None) -> dict[str, Any]:
    text, finish = await generation.collect()
    return {
        **answer_head(False, created, answer_id),
        "model": generation.model,
        "system_fingerprint": generation.system_fingerprint,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish.finish_reason}],
        "usage": finish.usage.to_json(),
    }


def tool_call_delta_json(delta: ToolCallDelta) -> dict[str, Any]:
    """OpenAI's `delta.tool_calls[]` item: id, type and name on a call's first fragment only."""
    out: dict[str, Any] = {"index": delta.index}
    if delta.id is not None:
        out["id"] = delta.id
        out["type"] = "function"
    function: dict[str, Any] = {"arguments": delta.arguments}
    if delta.name is not None:
        function["name"] = delta.name
    out["function"] = function
    return out


@owns("generation")
async def render_stream(generation: Generation, created: int, *, chat: bool, include_usage: bool,
                        tools: bool = False, log: logging.Logger = LOG, answer_id: str | None = None) -> AsyncIterator[bytes]:
    """OpenAI SSE chunks, one per token as it arrives, then `[DONE]`.

    With `tools` the first chunk's `content` is null, not "": a streamed tool call then
    assembles to `content: None` in the SDKs, as the same call does unstreamed (text tokens
    still append to it).

    A failure after the first byte cannot change the status line any more, so it is sent as an
    `error` event (the shape OpenAI's SDK raises from) and the stream ends without `[DONE]`.
    """
    cid = answer_id or new_id("chatcmpl" if chat else "cmpl")
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choice: dict[str, Any] | None, usage: Any = None, route: str | None = None, guardrails: str | None = None) -> bytes:
        data: dict[str, Any] = {"id": cid, "object": obj, "created": created, "model": generation.model,
                                "system_fingerprint": generation.system_fingerprint, "choices": [choice] if choice else []}
        if include_usage:
            data["usage"] = usage
        if route:  # the final chunk says where the answer ran (both routes after a mid-stream failover)
            data["edgellm_route"] = route
        if guardrails:  # and what the guardrails did, once the whole answer is checked (its headers went first)
            data["edgellm_guardrails"] = guardrails
        return sse.encode_event(data)

    def choice(delta_text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if chat:
            opening = {"role": "assistant", "content": None if tools else ""}
            delta: dict[str, Any] = opening if first else ({} if delta_text is None else {"content": delta_text})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}

    try:
        if chat:
            yield chunk(choice(None, None, first=True))
        async for event in generation.events:
            if isinstance(event, Token):
                piece = choice(event.text, None)
                if event.logprobs is not None:
                    piece["logprobs"] = {"content": list(event.logprobs), "refusal": None}
                yield chunk(piece)
            elif isinstance(event, ToolCallDelta) and chat:
                yield chunk({"index": 0, "delta": {"tool_calls": [tool_call_delta_json(event)]}, "logprobs": None, "finish_reason": None})
            elif isinstance(event, Finish):
                yield chunk(choice(None, event.finish_reason), route=event.route, guardrails=event.guardrails)
                if include_usage:
                    yield chunk(None, event.usage.to_json())
    except GatewayError as exc:
        yield sse.encode_event(streamed_error(exc, log))
        return
    yield sse.encode_done()
