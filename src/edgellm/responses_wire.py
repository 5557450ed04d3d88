"""The OpenAI Responses wire format: request parsing into Workers AI terms, and rendering of a
`Generation` as a Response object or as the Responses event stream.

Text generation is served, and structured outputs (`text.format` of type `json_object` or
`json_schema`, through the same `response_format` machinery as chat, so only where the model can
honour it). Every other field the API defines is either honoured, accepted when it asks for
nothing beyond that (`tools: []`, `truncation: "disabled"`...), or refused with a 400 naming it:
a client asking for tools or files must know it did not get them. Defaults are the edge's (Workers AI's): temperature 0.6, 256 output tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from . import sse
from .config import Config
from .conversations import StoredResponse
from .errors import LOG, GatewayError, invalid, streamed_error
from .generation import Finish, Generation, GenerationRequest, Token, Usage
from .stream import owns
from .openai import new_id, resolve_model
from .parameters import parse_grammar, refuse_unknown
from .structured import parse_response_format
from .validation import as_bool, as_int, as_str
from .workers_ai import validate_messages, validate_sampling

_ROLE_ALIASES = {"developer": "system"}
_INPUT_ROLES = ("user", "assistant", "system", "developer")  # a message item's roles (no tool messages here)
_TEXT_PARTS = ("input_text", "output_text", "text")
_HONOURED = ("model", "input", "instructions", "previous_response_id", "store", "stream", "max_output_tokens",
             "temperature", "top_p", "metadata", "prompt_cache_key", "grammar")
# accepted as long as they ask for plain text generation (checked by _neutral)
_ACCEPTED = ("user", "safety_identifier", "service_tier", "stream_options", "truncation", "tools", "tool_choice",
             "parallel_tool_calls", "text", "include", "reasoning", "background", "top_logprobs", "max_tool_calls",
             "prompt_cache_retention")
# Tool calls are the chat completions route's (every backend's tool support is wired there); the
# Responses route generates text and structured text only, so a refusal says where tools do work.
_TOOLS_ELSEWHERE = ("tools are not supported on /v1/responses (it answers text and text.format only): send tool calls "
                    "to POST /v1/chat/completions, which takes tools, tool_choice and parallel_tool_calls where the model "
                    "can honour them")
_REFUSED = {
    "tools": _TOOLS_ELSEWHERE,
    "tool_choice": _TOOLS_ELSEWHERE,
    "text": "'text' takes 'format' (text, json_object or json_schema) and 'verbosity'",
    "include": "'include' is not supported (no tool or reasoning output exists here)",
    "reasoning": "reasoning options are not supported by these models",
    "background": "background responses are not supported",
    "truncation": "'truncation' is 'disabled' or 'auto'",
    "top_logprobs": "logprobs are not supported",
    "max_tool_calls": _TOOLS_ELSEWHERE,
    "conversation": "the 'conversation' object is not supported; continue with 'previous_response_id'",
    "prompt": "prompt templates are not supported",
}


def _neutral(name: str, value: Any) -> bool:
    """Does an accepted field ask for nothing beyond plain text generation?"""
    if name == "tools":
        return value == []
    if name == "tool_choice":
        return value in ("auto", "none")
    if name == "text":  # its format is parsed by _text_format
        return isinstance(value, dict) and set(value) <= {"format", "verbosity"} and value.get("verbosity") in (None, "medium")
    if name == "include":
        return value == []
    if name == "reasoning":
        return value == {} or (isinstance(value, dict) and all(v is None for v in value.values()))
    if name == "background":
        return value is False
    if name == "truncation":  # "auto" drops the oldest turns of a stored conversation to fit (responses_api.fit_chain)
        return value in ("disabled", "auto")
    if name == "top_logprobs":
        return value == 0
    if name == "max_tool_calls":
        return False
    return True


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated `POST /v1/responses`: this turn's input, and how to continue the history."""

    model: str
    input: tuple[dict[str, str], ...]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    sampling: dict[str, Any]
    max_output_tokens: int | None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    text_format: dict[str, Any] | None = None  # `text.format` as sent (json_object / json_schema), echoed back
    response_format: dict[str, Any] | None = None  # the same in Workers AI terms, for the generation
    truncation: str = "disabled"

    def generation_request(self, history: list[dict[str, str]], session: str | None) -> GenerationRequest:
        """The whole conversation as chat messages: this turn's instructions (they are not
        inherited, as in OpenAI's API), the stored history, then this turn's input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages = [*system, *history, *self.input]
        inputs: dict[str, Any] = {"messages": messages, **self.sampling}
        if self.response_format is not None:
            inputs["response_format"] = self.response_format
        return GenerationRequest(self.model, inputs, stream=self.stream, session=session)


def _text_format(value: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """`text.format` -> (the format to echo, Workers AI's `response_format`); (None, None) for text.
    The Responses API flattens chat's `json_schema` object into the format itself."""
    fmt = value.get("format") if isinstance(value, dict) else None
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None, None
    if not isinstance(fmt, dict):
        raise invalid("'text.format' must be an object.", "text.format", "invalid_type")
    kind = fmt.get("type")
    if kind == "json_schema":
        as_chat = {"type": kind, "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    else:
        as_chat = {"type": kind}
    try:
        converted = parse_response_format(as_chat, openai_shape=True)
    except GatewayError as exc:  # the chat parser names chat's field; this request has another
        raise invalid(exc.message.replace("response_format.json_schema", "text.format").replace("response_format", "text.format"),
                      "text.format", exc.code or "invalid_value") from exc
    return dict(fmt), converted


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(f"'{where}' must be a string or an array of text parts.", where, "invalid_type")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise invalid(f"'{where}[{j}]' is {kind}; images, files and audio are not supported (text only).", f"{where}[{j}]", "unsupported_content")
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise invalid(f"'{where}[{j}]' must be an input_text part.", f"{where}[{j}]", "unsupported_content")
        texts.append(part["text"])
    return "".join(texts)


def parse_input(value: Any) -> tuple[dict[str, str], ...]:
    """`input`: a string (one user message) or message items -> Workers AI messages."""
    if isinstance(value, str):
        if not value:
            raise invalid("'input' must not be empty.", "input")
        return ({"role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a string or a non-empty array of message items.", "input", "invalid_type")
    messages = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"'{where}' must be a message object.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind != "message":
            raise invalid(f"'{where}' is a {kind!r} item; only message items are supported (no tools).", f"{where}.type", "unsupported_item")
        if item.get("role") not in _INPUT_ROLES:
            raise invalid(f"'{where}.role' must be one of {', '.join(_INPUT_ROLES)}; got {item.get('role')!r}.", f"{where}.role", "invalid_role")
        role = _ROLE_ALIASES.get(item["role"], item["role"])
        messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    return tuple(validate_messages(messages, "input"))


def _check_fields(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if value is None or name in _HONOURED:
            continue
        if name in _ACCEPTED and _neutral(name, value):
            continue
        reason = _REFUSED.get(name)
        if reason is None:
            refuse_unknown(name)  # the chat route's rule: llama.cpp's extensions named as such
        raise invalid(f"'{name}': {reason}.", name, "unsupported_parameter")


def parse_request(body: Any, config: Config) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_type")
    _check_fields(body)
    model = resolve_model(body, config)
    if body.get("input") is None:
        raise invalid("'input' is required.", "input", "missing_required_parameter")
    max_output = as_int(body, "max_output_tokens", 1, config.context_window)
    sampling = validate_sampling({"max_tokens": max_output, "temperature": body.get("temperature"), "top_p": body.get("top_p")}, config)
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or len(metadata) > 16 or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()):
        raise invalid("'metadata' must be an object of at most 16 string pairs (keys <= 64, values <= 512 characters).", "metadata")
    previous = as_str(body, "previous_response_id", allow_empty=False)
    text_format, response_format = _text_format(body.get("text"))
    sampling.update(parse_grammar(body, structured=response_format is not None))  # llama.cpp's GBNF, as on chat
    store = as_bool(body, "store")
    return ResponsesRequest(
        model=model,
        input=parse_input(body["input"]),
        instructions=as_str(body, "instructions") or None,
        previous_response_id=previous,
        store=True if store is None else store,
        stream=bool(as_bool(body, "stream")),
        sampling=sampling,
        max_output_tokens=max_output,
        prompt_cache_key=as_str(body, "prompt_cache_key", allow_empty=False),
        metadata=dict(metadata),
        text_format=text_format,
        response_format=response_format,
        truncation=body.get("truncation") or "disabled",
    )


# --- rendering -----------------------------------------------------------------------------


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def message_id_of(response_id: str) -> str:
    """The output message's id, derived from the response's so a retrieve shows the same one."""
    return "msg_" + response_id.removeprefix("resp_")


@dataclass(frozen=True)
class ResponseMeta:
    """What a Response object echoes of its request, fixed before generation starts."""

    id: str
    created_at: int
    request: ResponsesRequest
    message_id: str = field(default_factory=lambda: new_id("msg").replace("-", "_"))


def _message(meta: ResponseMeta, text: str, status: str) -> dict[str, Any]:
    return {"id": meta.message_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def response_object(meta: ResponseMeta, model: str, *, status: str, text: str | None = None,
                    usage: Usage | None = None, reason: str | None = None) -> dict[str, Any]:
    """`reason`: why an incomplete response stopped (`incomplete_details.reason`): the token
    budget (`max_output_tokens`, the default) or the content policy (`content_filter`)."""
    request = meta.request
    return {
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": reason or "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": model,
        "output": [] if text is None else [_message(meta, text, "completed" if status == "completed" else "incomplete")],
        "parallel_tool_calls": True,
        "previous_response_id": request.previous_response_id,
        "prompt_cache_key": request.prompt_cache_key,
        "reasoning": {"effort": None, "summary": None},
        "store": request.store,
        "temperature": request.sampling.get("temperature"),
        "text": {"format": request.text_format or {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": request.sampling.get("top_p", 1.0),
        "truncation": request.truncation,
        "usage": usage_json(usage) if usage is not None else None,
        "user": None,
        "metadata": request.metadata,
    }


# the finish reasons that leave a response incomplete, as OpenAI's `incomplete_details.reason` says them
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def status_of(finish: Finish) -> str:
    return "incomplete" if finish.finish_reason in _INCOMPLETE else "completed"


def reason_of(finish: Finish) -> str | None:
    """`incomplete_details.reason` of a response that ended with `finish`, or None."""
    return _INCOMPLETE.get(finish.finish_reason)


def stored_record(meta: ResponseMeta, model: str, text: str, finish: Finish) -> StoredResponse:
    request = meta.request
    return StoredResponse(
        id=meta.id, previous_response_id=request.previous_response_id, created_at=meta.created_at, model=model,
        instructions=request.instructions, input=request.input, output_text=text, status=status_of(finish),
        usage=finish.usage.to_json(),
        params={"temperature": request.sampling.get("temperature"), "top_p": request.sampling.get("top_p"),
                "max_output_tokens": request.max_output_tokens, "metadata": request.metadata, "store": True,
                **({"text_format": request.text_format} if request.text_format else {}),
                **({"incomplete_reason": reason_of(finish)} if reason_of(finish) else {})},
    )


def input_items(record: StoredResponse) -> list[dict[str, Any]]:
    """A stored turn's input messages as OpenAI's input items (ids derived from the response's,
    so a listing is the same each time)."""
    base = record.id.removeprefix("resp_")
    return [{"id": f"msg_in{i}_{base}", "type": "message", "role": m["role"], "status": "completed",
             "content": [{"type": "output_text" if m["role"] == "assistant" else "input_text", "text": m["content"],
                          **({"annotations": []} if m["role"] == "assistant" else {})}]}
            for i, m in enumerate(record.input)]


def render_stored(record: StoredResponse) -> dict[str, Any]:
    params = record.params
    request = ResponsesRequest(
        model=record.model, input=record.input, instructions=record.instructions,
        previous_response_id=record.previous_response_id, store=True, stream=False,
        sampling={k: params[k] for k in ("temperature", "top_p") if params.get(k) is not None},
        max_output_tokens=params.get("max_output_tokens"), metadata=params.get("metadata") or {},
        text_format=params.get("text_format"),
    )
    meta = ResponseMeta(record.id, record.created_at, request, message_id=message_id_of(record.id))
    return response_object(meta, record.model, status=record.status, text=record.output_text, usage=Usage.from_json(record.usage),
                           reason=params.get("incomplete_reason"))


Completion = Callable[[str, Finish], Awaitable[None]]


async def render_json(generation: Generation, meta: ResponseMeta, on_complete: Completion) -> dict[str, Any]:
    text, finish = await generation.collect()
    await on_complete(text, finish)
    return response_object(meta, generation.model, status=status_of(finish), text=text, usage=finish.usage, reason=reason_of(finish))


@owns("generation")
async def render_stream(generation: Generation, meta: ResponseMeta, on_complete: Completion,
                        log: logging.Logger = LOG) -> AsyncIterator[bytes]:
    """The Responses event stream: `response.created`, `response.in_progress`, the output item
    and content part opening, one `response.output_text.delta` per token, their `.done`
    events, then `response.completed` (or `response.incomplete` when the token budget ran
    out, or the guardrails cut the answer: `content_filter`, then their `error` event). The
    answer is stored before that last event, so a client that sends the next turn as soon as it
    arrives finds it. A failure is an `error` event, and the stream ends there. The final
    event carries `edgellm_guardrails` when the guardrails flagged or masked (as OpenAI's
    stream's final chunk does).
    """
    sequence = 0

    def event(kind: str, **data: Any) -> bytes:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **data}
        sequence += 1
        return sse.encode_named_event(kind, payload)

    at = {"item_id": meta.message_id, "output_index": 0, "content_index": 0}
    parts: list[str] = []

    async def closing(finish: Finish) -> list[bytes]:
        text = "".join(parts)
        await on_complete(text, finish)
        status = status_of(finish)
        done = _message(meta, text, "completed" if status == "completed" else "incomplete")
        final = response_object(meta, generation.model, status=status, text=text, usage=finish.usage, reason=reason_of(finish))
        return [event("response.output_text.done", **at, text=text, logprobs=[]),
                event("response.content_part.done", **at, part=done["content"][0]),
                event("response.output_item.done", output_index=0, item=done),
                event(f"response.{status}", response=final,
                      **({"edgellm_guardrails": finish.guardrails} if finish.guardrails else {}))]

    try:
        yield event("response.created", response=response_object(meta, generation.model, status="in_progress"))
        yield event("response.in_progress", response=response_object(meta, generation.model, status="in_progress"))
        yield event("response.output_item.added", output_index=0, item={**_message(meta, "", "in_progress"), "content": []})
        yield event("response.content_part.added", **at, part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        finish: Finish | None = None
        async for item in generation.events:
            if isinstance(item, Token):
                if item.text:
                    parts.append(item.text)
                    yield event("response.output_text.delta", **at, delta=item.text, logprobs=[])
            elif isinstance(item, Finish):
                finish = item
                if finish.finish_reason == "content_filter":  # cut by the guardrails: closed now, their error event follows
                    for chunk in await closing(finish):
                        yield chunk
        if finish is None or finish.finish_reason != "content_filter":
            for chunk in await closing(finish or Finish("stop", Usage())):
                yield chunk
    except GatewayError as exc:
        error = streamed_error(exc, log)["error"]
        yield event("error", code=error["code"], message=error["message"], param=error["param"])
