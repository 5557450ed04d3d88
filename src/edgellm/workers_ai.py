"""The Workers AI text-generation wire format: input validation and output rendering.

Ranges and defaults are those of `@cf/meta/llama-2-7b-chat-int8`'s schema. Defaults are
applied here, once, so that a request that omits `temperature` and one that spells out 0.6
are the same request everywhere downstream (the binding, the cache key).
"""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator

from . import sse
from .config import Config
from .errors import LOG, GatewayError, invalid, streamed_error
from .generation import Finish, Generation, Token, ToolCallDelta
from .stream import owns
from .http import Response
from .structured import is_tool_message, parse_extensions, refuse_chat_only, validate_tool_message
from .validation import as_bool, as_float, as_int, as_str

DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMPERATURE = 0.6
ROLES = ("system", "user", "assistant")
# every role a message may have here, as a role error lists them (a `tool` result is validated apart)
ACCEPTED_ROLES = (*ROLES, "tool")

# name -> (kind, low, high); None means the schema sets no bound on that side.
SAMPLING: dict[str, tuple[str, float | None, float | None]] = {
    "temperature": ("float", 0, 5),
    "top_p": ("float", 0, 2),
    "top_k": ("int", 1, 50),
    "seed": ("int", 1, 9_999_999_999),
    "repetition_penalty": ("float", 0, 2),
    "frequency_penalty": ("float", -2, 2),
    "presence_penalty": ("float", -2, 2),
}


def validate_messages(value: Any, param: str = "messages", accepted_roles: tuple[str, ...] = ACCEPTED_ROLES) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be an array of messages.", param, "invalid_type")
    if not value:
        raise invalid(f"'{param}' must contain at least one message.", param, "empty_messages")
    messages = []
    for i, message in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{where}' must be an object with 'role' and 'content'.", where, "invalid_type")
        if is_tool_message(message):  # a tool result, or an assistant turn that called tools
            messages.append(validate_tool_message(message, where))
            continue
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"'{where}.role' must be one of {', '.join(accepted_roles)}; got {role!r}.", f"{where}.role", "invalid_role")
        content = message.get("content")
        if not isinstance(content, str):
            raise invalid(f"'{where}.content' must be a string.", f"{where}.content", "invalid_type")
        messages.append({"role": role, "content": content})
    return messages


def validate_sampling(body: dict[str, Any], config: Config) -> dict[str, Any]:
    """Sampling parameters with Workers AI's defaults applied (and nothing else)."""
    out: dict[str, Any] = {
        "max_tokens": as_int(body, "max_tokens", 1, config.context_window) or DEFAULT_MAX_TOKENS,
    }
    for name, (kind, lo, hi) in SAMPLING.items():
        value = as_int(body, name, lo, hi) if kind == "int" else as_float(body, name, lo, hi)
        if value is not None:
            out[name] = value
    out.setdefault("temperature", DEFAULT_TEMPERATURE)
    return out


def validate_options(body: dict[str, Any]) -> dict[str, Any]:
    """`raw` (no chat template) and `lora` (an adapter name), only when given."""
    options: dict[str, Any] = {}
    raw = as_bool(body, "raw")
    if raw is not None:
        options["raw"] = raw
    lora = as_str(body, "lora", allow_empty=False)
    if lora is not None:
        options["lora"] = lora
    return options


def validate_inputs(body: Any, config: Config) -> tuple[dict[str, Any], bool]:
    """A Workers AI input object -> (inputs with defaults, stream flag)."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_type")
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise invalid("Send exactly one of 'prompt' or 'messages'.", "prompt" if has_prompt else "messages", "missing_input")
    inputs: dict[str, Any] = {}
    if has_prompt:
        inputs["prompt"] = as_str(body, "prompt", allow_empty=False)
    else:
        inputs["messages"] = validate_messages(body["messages"])
    inputs.update(validate_sampling(body, config))
    inputs.update(validate_options(body))
    if has_messages:  # JSON mode, tools and logprobs (Workers AI's shapes), checked alike
        inputs.update(parse_extensions(body, openai_shape=False))
    else:
        refuse_chat_only(body, "send 'messages' instead of 'prompt'")
    return inputs, bool(as_bool(body, "stream"))


# --- rendering -----------------------------------------------------------------------------


def result_envelope(result: Any, *, success: bool = True, errors: list[Any] | None = None) -> dict[str, Any]:
    """Cloudflare's REST envelope: `{result, success, errors, messages}`."""
    return {"result": result, "success": success, "errors": errors or [], "messages": []}


def error_response(error: GatewayError) -> Response:
    """The REST route's errors: the OpenAI error JSON inside Cloudflare's envelope, which
    Workers-AI-style clients read (`success: false, errors: [...]`)."""
    return error.to_response(result_envelope(None, success=False, errors=[{"code": error.status, "message": error.message}]))


async def render_json(generation: Generation) -> dict[str, Any]:
    answer = await generation.collect_answer()
    result: dict[str, Any] = {"response": answer.text, "usage": answer.finish.usage.to_json()}
    if answer.tool_calls:  # Workers AI's function-calling output: [{name, arguments: <object>}]
        result["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": _arguments(c.arguments)} for c in answer.tool_calls]
    return result_envelope(result)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@owns("generation")
async def render_stream(generation: Generation, log: logging.Logger = LOG) -> AsyncIterator[bytes]:
    """Workers AI SSE: one `{"response": token}` per token, a usage event (with `edgellm_route`
    and, when the guardrails flagged or masked, `edgellm_guardrails`), then `[DONE]`.

    A failure mid-stream is sent as an `error` event and the stream ends without `[DONE]`,
    so a client can tell a cut answer from a complete one.
    """
    try:
        async for event in generation.events:
            if isinstance(event, Token):
                if event.text:
                    yield sse.encode_event({"response": event.text})
            elif isinstance(event, ToolCallDelta):
                yield sse.encode_event({"response": "", "tool_calls": [{"index": event.index, "id": event.id, "name": event.name,
                                                                          "arguments": event.arguments}]})
            elif isinstance(event, Finish):
                final: dict[str, Any] = {"response": "", "usage": event.usage.to_json()}
                if event.route:
                    final["edgellm_route"] = event.route
                if event.guardrails:  # what the guardrails did, once the whole answer is checked (as the OpenAI stream's)
                    final["edgellm_guardrails"] = event.guardrails
                yield sse.encode_event(final)
    except GatewayError as exc:
        yield sse.encode_event(streamed_error(exc, log))
        return
    yield sse.encode_done()
