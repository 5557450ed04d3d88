"""The Workers AI text-generation wire format: input validation and output rendering.

Ranges and defaults are those of `@cf/meta/llama-2-7b-chat-int8`'s schema. Defaults are
applied here, once, so that a request that omits `temperature` and one that spells out 0.6
are the same request everywhere downstream (the binding, the cache key).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from . import sse
from .config import Config
from .errors import GatewayError, invalid
from .generation import Finish, Generation, Token
from .validation import as_bool, as_float, as_int, as_str

DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMPERATURE = 0.6
ROLES = ("system", "user", "assistant")

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


def validate_messages(value: Any, param: str = "messages") -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be an array of messages.", param, "invalid_type")
    if not value:
        raise invalid(f"'{param}' must contain at least one message.", param, "empty_messages")
    messages = []
    for i, message in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{where}' must be an object with 'role' and 'content'.", where, "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"'{where}.role' must be one of {', '.join(ROLES)}; got {role!r}.", f"{where}.role", "invalid_role")
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
    raw = as_bool(body, "raw")
    if raw is not None:
        inputs["raw"] = raw
    lora = as_str(body, "lora", allow_empty=False)
    if lora is not None:
        inputs["lora"] = lora
    return inputs, bool(as_bool(body, "stream"))


# --- rendering -----------------------------------------------------------------------------


def result_envelope(result: Any, *, success: bool = True, errors: list[Any] | None = None) -> dict[str, Any]:
    """Cloudflare's REST envelope: `{result, success, errors, messages}`."""
    return {"result": result, "success": success, "errors": errors or [], "messages": []}


async def render_json(generation: Generation) -> dict[str, Any]:
    text, finish = await generation.collect()
    return result_envelope({"response": text, "usage": finish.usage.to_json()})


async def render_stream(generation: Generation) -> AsyncIterator[bytes]:
    """Workers AI SSE: one `{"response": token}` per token, a usage event, then `[DONE]`.

    A failure mid-stream is sent as an `error` event and the stream ends without `[DONE]`,
    so a client can tell a cut answer from a complete one.
    """
    try:
        async for event in generation.events:
            if isinstance(event, Token):
                if event.text:
                    yield sse.encode_event({"response": event.text})
            elif isinstance(event, Finish):
                final: dict[str, Any] = {"response": "", "usage": event.usage.to_json()}
                if event.route:
                    final["edgellm_route"] = event.route
                yield sse.encode_event(final)
    except GatewayError as exc:
        yield sse.encode_event(exc.to_json())
        return
    yield sse.encode_done()
