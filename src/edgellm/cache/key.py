"""Cache keys: SHA-256 over a canonical encoding of everything that shapes the output.

Two requests that can only produce the same answer must share a key (key order, `0` vs
`0.0`, defaults omitted or spelled out), and any change that can change the answer must give
a new one. Validation has already applied defaults and typed every number (floats as float,
integers as int), so a canonical JSON dump of the normalised inputs is enough.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..generation import GenerationRequest

FORMAT_VERSION = 1
_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Sampling parameters and their types. Anything here changes the output; `stream` does not.
SHAPING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty",
           "frequency_penalty", "presence_penalty", "raw", "lora")
# Structured outputs, tools and logprobs (structured.py): each changes the answer or its shape.
# Keyed only when present, so a plain request keeps the key it always had.
EXTENSIONS = ("response_format", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "grammar")
# Message fields of a tool conversation, beside role and content.
MESSAGE_EXTRAS = ("tool_calls", "tool_call_id")


def _message(message: dict[str, Any]) -> list[Any]:
    extras = {name: message[name] for name in MESSAGE_EXTRAS if message.get(name) is not None}
    return [message["role"], message["content"], extras] if extras else [message["role"], message["content"]]


@dataclass(frozen=True)
class CacheScope:
    """Who owns an entry: tenant and cache namespace (plus its purge generation)."""

    tenant: str
    namespace: str
    generation: int = 0

    def __post_init__(self) -> None:
        for name in (self.tenant, self.namespace):
            if not _SAFE.match(name):
                raise ValueError(f"tenant and namespace names must match {_SAFE.pattern}: {name!r}")

    @cached_property  # frozen: made once per scope (an isolate keeps its scope for a while)
    def prefix(self) -> str:
        return f"cache/v{FORMAT_VERSION}/{self.tenant}/{self.namespace}/g{self.generation}/"


@dataclass(frozen=True)
class CacheKey:
    scope: CacheScope
    digest: str  # 64 hex chars

    @cached_property  # frozen: one string per key, so its hash is computed once (KV's read memo, the decode memo)
    def kv_key(self) -> str:
        """`cache/v1/<tenant>/<namespace>/g<n>/<sha256>`: at most ~230 bytes, well under KV's 512."""
        return self.scope.prefix + self.digest


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value if isinstance(value, int) else float(value) + 0.0  # + 0.0: -0.0 and 0.0 are one temperature


def canonical_request(request: GenerationRequest) -> dict[str, Any]:
    inputs = request.inputs
    body: dict[str, Any] = {"v": FORMAT_VERSION, "model": request.model}
    if "messages" in inputs:
        body["messages"] = [_message(m) for m in inputs["messages"]]
    else:
        body["prompt"] = inputs["prompt"]
    body["params"] = {name: _number(inputs[name]) for name in SHAPING if inputs.get(name) is not None}
    if request.stop:
        body["stop"] = list(request.stop)
    extensions = {name: inputs[name] for name in EXTENSIONS if inputs.get(name) is not None}
    if extensions:
        body["extensions"] = extensions
    return body


def _digest(payload: Any) -> str:
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # JSON input may carry a lone surrogate ("\ud800") that UTF-8 cannot hold; hash it as is
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def build_cache_key(request: GenerationRequest, scope: CacheScope) -> CacheKey:
    """A pure function of the request and the scope's tenant and namespace: the key is kept on
    the request (`GenerationRequest.derived`), so a HIT on a request the parse memo shares (a
    client repeating a question) hashes nothing and makes no key; under another purge generation
    the same digest gets its scope's key."""
    memo = ("cache-key", scope.tenant, scope.namespace)
    key: CacheKey | None = request.derived.get(memo)
    if key is None:
        key = CacheKey(scope, _digest({"scope": [scope.tenant, scope.namespace], "request": canonical_request(request)}))
    elif key.scope is not scope and key.scope != scope:
        key = CacheKey(scope, key.digest)
    else:
        return key
    request.derived[memo] = key
    return key


def build_custom_key(custom: str, scope: CacheScope) -> CacheKey:
    """`cf-aig-cache-key`: the caller names the entry, still scoped to its tenant and namespace."""
    return CacheKey(scope, _digest({"scope": [scope.tenant, scope.namespace], "custom": custom}))
