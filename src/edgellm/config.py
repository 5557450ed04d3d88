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
# Workers AI's published prices, USD per million (input, output) tokens; MODEL_PRICES overrides.
DEFAULT_PRICES = {
    "@cf/meta/llama-2-7b-chat-int8": (0.556, 6.667),
    "@cf/meta/llama-2-7b-chat-hf-lora": (0.556, 6.667),
}


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _prices(value: Any) -> dict[str, tuple[float, float]]:
    if value is None or value == "":
        return dict(DEFAULT_PRICES)
    data = value if isinstance(value, Mapping) else json.loads(str(value))
    return {**DEFAULT_PRICES, **{str(k): (float(v[0]), float(v[1])) for k, v in data.items()}}


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
    # Access (see access/): without OPEN_ACCESS every API call needs a key; open mode is only
    # ever configured, and said loudly (start banner, /healthz).
    open_access: bool = False
    cors_origins: tuple[str, ...] = ()  # besides the edge's own origin and localhost
    max_messages: int = 256
    max_message_chars: int = 64 * 1024
    # USD per million tokens (input, output), for the usage API's estimated cost.
    model_prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))

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
            open_access=_flag(get("OPEN_ACCESS") or "false"),
            cors_origins=_list(get("CORS_ORIGINS")),
            model_prices=_prices(get("MODEL_PRICES")),
        )
