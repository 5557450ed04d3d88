"""Gateway configuration, read from the Worker's `[vars]`/secrets (or the local edge's flags).

Values arrive as strings (that is what `[vars]` and secrets are), so parsing lives here once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

DEFAULT_MODEL = "@cf/meta/llama-2-7b-chat-int8"
DEFAULT_FALLBACK_MODELS = ("@cf/meta/llama-2-7b-chat-hf-lora",)
MAX_BODY_BYTES = 1024 * 1024


def _list(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    text = str(value).strip()
    if text.startswith("["):
        return tuple(str(v) for v in json.loads(text))
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _dict(value: Any, default: Mapping[str, int]) -> dict[str, int]:
    if value is None or value == "":
        return dict(default)
    data = value if isinstance(value, Mapping) else json.loads(str(value))
    return {str(k): int(v) for k, v in data.items()}


@dataclass(frozen=True)
class Config:
    model: str = DEFAULT_MODEL
    fallback_models: tuple[str, ...] = DEFAULT_FALLBACK_MODELS
    context_window: int = 8192
    max_body_bytes: int = MAX_BODY_BYTES
    cache_namespace: str = "default"
    cache_default_ttl: int = 86400
    cache_classes: dict[str, int] = field(
        default_factory=lambda: {"news": 300, "faq": 86400, "template": 7 * 86400}
    )
    admin_token: str | None = None
    tenant: str = "default"
    max_waiting_generations: int = 32  # admission control: generations in progress per isolate

    @property
    def models(self) -> tuple[str, ...]:
        """Every model id the gateway serves, primary first, without duplicates."""
        return tuple(dict.fromkeys((self.model, *self.fallback_models)))

    @classmethod
    def from_env(cls, env: Mapping[str, Any]) -> "Config":
        def get(name: str) -> Any:
            value = env.get(name)
            return None if value is None or value == "" else value

        base = cls()
        return cls(
            model=str(get("MODEL") or base.model),
            # present but empty turns fallback off; absent keeps the default list
            fallback_models=_list(env.get("FALLBACK_MODELS")) if env.get("FALLBACK_MODELS") is not None else base.fallback_models,
            context_window=int(get("CONTEXT_WINDOW") or base.context_window),
            cache_namespace=str(get("CACHE_NAMESPACE") or base.cache_namespace),
            cache_default_ttl=int(get("CACHE_DEFAULT_TTL") or base.cache_default_ttl),
            cache_classes=_dict(get("CACHE_CLASSES"), base.cache_classes),
            admin_token=get("ADMIN_TOKEN"),
            tenant=str(get("TENANT") or base.tenant),
            max_waiting_generations=int(get("MAX_WAITING_GENERATIONS") or base.max_waiting_generations),
        )
