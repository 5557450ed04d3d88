"""What each served model can honour: JSON mode, JSON schema, tools, forced tool choice, logprobs.

A request that asks for something the serving model cannot do is refused with a 400
`unsupported_parameter` naming it, before any inference is spent: a caller who asked for JSON
and got prose, or for a tool call and got chat, has been lied to.

Where a model's capabilities come from, first match wins:
1. configuration: `MODEL_CAPABILITIES` (`{"model id": ["json_mode", "tools", ...]}`);
2. the backend, when it states them (`AIBinding.describe(model)["capabilities"]`: the local
   edge's llama.cpp does, since its constrained generation makes any GGUF honour all of them);
3. Cloudflare's model catalog for Workers AI models (`WORKERS_AI_MODELS`);
4. nothing: plain text generation only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from types import MappingProxyType
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
_TOOLS = Capabilities(tools=True)


@dataclass(frozen=True)
class ModelFacts:
    """What Cloudflare's model catalog says of a Workers AI model: its context window (tokens) and
    what it honours (JSON mode's "Supported models", function calling's models). Shipped as data
    because the `Ai` binding describes nothing (workerd: it has no `describe()`), and the Worker
    must answer `/v1/models` and `system_fingerprint` as the local edge does."""

    context_window: int  # an embedding model's: the most tokens one text may have
    capabilities: Capabilities = NONE
    kind: str = "text-generation"  # or "embedding" (the bge models: `/v1/embeddings`)
    dimensions: int | None = None  # an embedding model's vector width


# Cloudflare's Workers AI catalog (developers.cloudflare.com/workers-ai/models/, each model's
# "Properties": context window, function calling, JSON mode). Workers AI has no forced tool choice
# and no logprobs. Configuration overrides any entry (`MODEL_CAPABILITIES`, `CONTEXT_WINDOW`).
WORKERS_AI_MODELS: dict[str, ModelFacts] = {
    "@cf/meta/llama-2-7b-chat-int8": ModelFacts(8192),  # the runtime notes: "Context window listed as 8192 tokens"
    "@cf/meta/llama-2-7b-chat-fp16": ModelFacts(4096),
    "@cf/meta/llama-2-7b-chat-hf-lora": ModelFacts(8192),
    "@cf/meta/llama-3-8b-instruct": ModelFacts(7968, _JSON),
    "@cf/meta/llama-3.1-8b-instruct": ModelFacts(7968, _JSON),
    "@cf/meta/llama-3.1-8b-instruct-fast": ModelFacts(128000, _JSON),
    "@cf/meta/llama-3.1-70b-instruct": ModelFacts(24000, _JSON),
    "@cf/meta/llama-3.2-11b-vision-instruct": ModelFacts(128000, _JSON),
    "@cf/meta/llama-3.3-70b-instruct-fp8-fast": ModelFacts(24000, _JSON_TOOLS),
    "@cf/meta/llama-4-scout-17b-16e-instruct": ModelFacts(131000, _TOOLS),
    "@cf/mistralai/mistral-small-3.1-24b-instruct": ModelFacts(128000, _TOOLS),
    "@hf/nousresearch/hermes-2-pro-mistral-7b": ModelFacts(24000, _JSON_TOOLS),
    "@hf/thebloke/deepseek-coder-6.7b-instruct-awq": ModelFacts(4096, _JSON),
    "@cf/deepseek-ai/deepseek-r1-distill-qwen-32b": ModelFacts(80000, _JSON),
    # text embeddings (each bge model's page: "Max input tokens", the vector's dimension)
    "@cf/baai/bge-small-en-v1.5": ModelFacts(512, kind="embedding", dimensions=384),
    "@cf/baai/bge-base-en-v1.5": ModelFacts(512, kind="embedding", dimensions=768),
    "@cf/baai/bge-large-en-v1.5": ModelFacts(512, kind="embedding", dimensions=1024),
    "@cf/baai/bge-m3": ModelFacts(8192, kind="embedding", dimensions=1024),
}


@lru_cache(maxsize=64)  # read-only and a pure function of the id: every answer (HITs too) reads it
def workers_ai_description(model: str) -> Mapping[str, Any]:
    """`AIBinding.describe` for a Workers AI model, from the catalog: the same keys the local edge
    gives (`backend`, `build`, `capabilities`, and `context_window` where the catalog lists one).
    A model the catalog lacks is described without capabilities: plain text generation only,
    unless configuration says more."""
    facts = WORKERS_AI_MODELS.get(model)
    described: dict[str, Any] = {"backend": "workers-ai", "build": "workers-ai"}
    if facts is not None:
        described.update(capabilities=tuple(facts.capabilities.names()), context_window=facts.context_window)
        if facts.kind == "embedding":
            described.update(kind=facts.kind, dimensions=facts.dimensions)
    return MappingProxyType(described)


def capabilities_of(model: str, configured: Mapping[str, Any], described: Mapping[str, Any] | None) -> Capabilities:
    """`configured` is `Config.model_capabilities`; `described` is the backend's `describe`."""
    if model in configured:
        return Capabilities.parse(configured[model])
    if described and described.get("capabilities") is not None:
        return Capabilities.parse(described["capabilities"])
    facts = WORKERS_AI_MODELS.get(model)
    return facts.capabilities if facts is not None else NONE


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
