"""What each served model can honour: JSON mode, JSON schema, tools, forced tool choice, logprobs.

A request that asks for something the serving model cannot do is refused with a 400
`unsupported_parameter` naming it, before any inference is spent: a caller who asked for JSON
and got prose, or for a tool call and got chat, has been lied to.

Where a model's capabilities come from, first match wins:
1. configuration: `MODEL_CAPABILITIES` (`{"model id": ["json_mode", "tools", ...]}`);
2. the backend, when it states them (`AIBinding.describe(model)["capabilities"]`: the local
   edge's llama.cpp does, since its constrained generation makes any GGUF honour all of them);
3. Cloudflare's published lists for Workers AI models (`WORKERS_AI_CAPABILITIES`);
4. nothing: plain text generation only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, Iterable, Mapping

from .errors import invalid

CAPABILITY_NAMES = ("json_mode", "json_schema", "tools", "tool_choice", "logprobs", "grammar")


@dataclass(frozen=True)
class Capabilities:
    json_mode: bool = False  # response_format {"type": "json_object"}
    json_schema: bool = False  # response_format {"type": "json_schema"}
    tools: bool = False  # tools (tool_choice "auto"/"none")
    tool_choice: bool = False  # tool_choice "required" / a named function, parallel_tool_calls=false
    logprobs: bool = False  # logprobs / top_logprobs
    grammar: bool = False  # llama.cpp's `grammar` (GBNF), an extension only a llama.cpp backend honours

    @classmethod
    def of(cls, names: Iterable[str]) -> "Capabilities":
        names = set(names)
        unknown = names - set(CAPABILITY_NAMES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {', '.join(CAPABILITY_NAMES)}")
        return cls(**{name: True for name in names})

    @classmethod
    def parse(cls, value: Any) -> "Capabilities":
        """`["json_mode", ...]` or `{"json_mode": true, ...}` (configuration's two spellings)."""
        if isinstance(value, Capabilities):
            return value
        if isinstance(value, Mapping):
            return cls.of(name for name, on in value.items() if on)
        if isinstance(value, (list, tuple)):
            return _of_names(cls, tuple(str(v) for v in value))
        raise ValueError(f"capabilities must be a list of names or an object, got {value!r}")

    def names(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


@lru_cache(maxsize=128)  # frozen, so one instance serves every request naming the same list
def _of_names(cls: type[Capabilities], names: tuple[str, ...]) -> Capabilities:
    return cls.of(names)


ALL = Capabilities(True, True, True, True, True)
NONE = Capabilities()

_JSON = Capabilities(json_mode=True, json_schema=True)
_JSON_TOOLS = Capabilities(json_mode=True, json_schema=True, tools=True)
# From Cloudflare's Workers AI docs (JSON mode's "Supported models"; function calling's models).
# Workers AI has no forced tool choice and no logprobs. Configuration overrides any entry.
WORKERS_AI_CAPABILITIES: dict[str, Capabilities] = {
    "@cf/meta/llama-3.1-8b-instruct-fast": _JSON,
    "@cf/meta/llama-3.1-70b-instruct": _JSON,
    "@cf/meta/llama-3.3-70b-instruct-fp8-fast": _JSON_TOOLS,
    "@cf/meta/llama-3-8b-instruct": _JSON,
    "@cf/meta/llama-3.1-8b-instruct": _JSON,
    "@cf/meta/llama-3.2-11b-vision-instruct": _JSON,
    "@hf/nousresearch/hermes-2-pro-mistral-7b": _JSON_TOOLS,
    "@hf/thebloke/deepseek-coder-6.7b-instruct-awq": _JSON,
    "@cf/deepseek-ai/deepseek-r1-distill-qwen-32b": _JSON,
    "@cf/meta/llama-4-scout-17b-16e-instruct": Capabilities(tools=True),
    "@cf/mistralai/mistral-small-3.1-24b-instruct": Capabilities(tools=True),
}


def capabilities_of(model: str, configured: Mapping[str, Any], described: Mapping[str, Any] | None) -> Capabilities:
    """`configured` is `Config.model_capabilities`; `described` is the backend's `describe`."""
    if model in configured:
        return Capabilities.parse(configured[model])
    if described and described.get("capabilities") is not None:
        return Capabilities.parse(described["capabilities"])
    return WORKERS_AI_CAPABILITIES.get(model, NONE)


def required_capabilities(inputs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(capability, the request parameter that needs it) for every extension the inputs use."""
    needed: list[tuple[str, str]] = []
    response_format = inputs.get("response_format")
    if response_format is not None:
        kind = response_format.get("type")
        needed.append(("json_schema" if kind == "json_schema" else "json_mode", "response_format"))
    if inputs.get("tools"):
        needed.append(("tools", "tools"))
        if inputs.get("tool_choice") not in (None, "auto", "none"):
            needed.append(("tool_choice", "tool_choice"))
        if inputs.get("parallel_tool_calls") is False:
            needed.append(("tool_choice", "parallel_tool_calls"))
    if inputs.get("logprobs"):
        needed.append(("logprobs", "logprobs"))
    if inputs.get("grammar"):
        needed.append(("grammar", "grammar"))
    return needed


def missing(capabilities: Capabilities, inputs: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first (capability, parameter) the inputs need and the model lacks, or None."""
    for capability, param in required_capabilities(inputs):
        if not getattr(capabilities, capability):
            return capability, param
    return None


def enforce(model: str, capabilities: Capabilities, inputs: Mapping[str, Any]) -> None:
    gap = missing(capabilities, inputs)
    if gap is not None:
        capability, param = gap
        offered = ", ".join(capabilities.names()) or "plain text generation only"
        raise invalid(
            f"'{param}' is not supported by the model {model} on this gateway (it needs '{capability}'; "
            f"this model offers: {offered}). GET /v1/models lists each model's capabilities.",
            param, "unsupported_parameter",
        )
