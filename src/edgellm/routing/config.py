"""The routing policy as configuration: origins, budgets, the breaker, regions.

Everything arrives as `[vars]` strings (JSON where a structure is needed) and secrets; an
origin names the secret that holds its bearer token, so the token never sits in `[vars]`.

    ORIGINS = '[{"name": "central", "url": "https://llm.example.com", "token_secret": "ORIGIN_TOKEN",
                 "timeout_ms": 30000, "context_window": 32768, "region": "EU", "slots": 4,
                 "models": {"@cf/meta/llama-2-7b-chat-int8": "meta-llama/Llama-2-7b-chat-hf"}}]'
    EDGE_FIRST_TOKEN_MS = "3000"   EDGE_STALL_MS = "2000"
    EDGE_MAX_PROMPT_TOKENS = "3000"   EDGE_MAX_OUTPUT_TOKENS = "1024"   EDGE_TOKENIZER = "smollm2-135m"
    BREAKER = '{"failures": 5, "window_s": 30, "cooldown_s": 30}'
    REGIONS = '{"EU": {"origin": "central", "cache_ttl": 3600, "resident": true}, "US": {"origin": "us"}}'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

DEFAULT_FIRST_TOKEN_MS = 3000
DEFAULT_STALL_MS = 2000
DEFAULT_ORIGIN_TIMEOUT_MS = 30000
DEFAULT_ORIGIN_TOTAL_MS = 300000


@dataclass(frozen=True)
class OriginConfig:
    """One OpenAI-compatible origin. `models` maps the edge's model ids to the origin's; empty
    means it serves every id under the same name. `region` is where it runs (a continent or
    country code), checked against resident regions."""

    name: str
    url: str
    token: str | None = None
    timeout_ms: int = DEFAULT_ORIGIN_TIMEOUT_MS
    context_window: int = 32768
    models: dict[str, str] = field(default_factory=dict)
    region: str | None = None
    # a llama.cpp server's slot count (its --parallel): a session is pinned to one slot (id_slot,
    # cache_prompt). None: any other OpenAI-compatible server, sent only the x-session-affinity header.
    slots: int | None = None
    # the whole answer's budget; `timeout_ms` bounds connecting + headers, and each wait for a token
    total_ms: int = DEFAULT_ORIGIN_TOTAL_MS

    def serves(self, model: str) -> bool:
        return not self.models or model in self.models

    def model_for(self, model: str) -> str:
        return self.models.get(model, model)

    @property
    def base_url(self) -> str:
        """The URL up to `/v1`: `https://x/v1` and `https://x` are both accepted."""
        url = self.url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"


@dataclass(frozen=True)
class RegionConfig:
    """Policy for requests from one continent or country.

    `resident`: the request, its prompt and its cached answer never go to an origin outside
    `name` (or `allowed`), nor to a cache namespace shared with other regions. `edge`: whether
    the AI binding may serve it at all (Workers AI's own placement is Cloudflare's, see docs/edge-and-origin.md)."""

    name: str
    origin: str | None = None
    cache_ttl: int | None = None
    resident: bool = False
    edge: bool = True
    cache: bool = True
    allowed: tuple[str, ...] = ()

    def admits(self, origin: OriginConfig) -> bool:
        if not self.resident:
            return True
        return origin.region is not None and origin.region in (self.name, *self.allowed)


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 5
    window_s: float = 30.0
    cooldown_s: float = 30.0


@dataclass(frozen=True)
class RoutingConfig:
    origins: tuple[OriginConfig, ...] = ()
    first_token_ms: int = DEFAULT_FIRST_TOKEN_MS
    stall_ms: int = DEFAULT_STALL_MS
    edge_max_prompt_tokens: int | None = None
    edge_max_output_tokens: int | None = None
    edge_tokenizer: str | None = None
    breaker: BreakerConfig = BreakerConfig()
    regions: dict[str, RegionConfig] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Routing with nothing configured is exactly the edge-only gateway of before."""
        return bool(self.origins or self.regions or self.edge_tokenizer or self.edge_max_prompt_tokens)

    def origin(self, name: str) -> OriginConfig | None:
        return next((o for o in self.origins if o.name == name), None)

    @classmethod
    def from_env(cls, env: Mapping[str, Any]) -> "RoutingConfig":
        def get(name: str) -> Any:
            value = env.get(name)
            return None if value is None or value == "" else value

        def number(name: str) -> int | None:
            value = get(name)
            return None if value is None else _whole(name, value)

        return cls(
            origins=tuple(_origin(item, env, i) for i, item in enumerate(_json("ORIGINS", get("ORIGINS"), [], list))),
            first_token_ms=number("EDGE_FIRST_TOKEN_MS") or DEFAULT_FIRST_TOKEN_MS,
            stall_ms=number("EDGE_STALL_MS") or DEFAULT_STALL_MS,
            edge_max_prompt_tokens=number("EDGE_MAX_PROMPT_TOKENS"),
            edge_max_output_tokens=number("EDGE_MAX_OUTPUT_TOKENS"),
            edge_tokenizer=get("EDGE_TOKENIZER"),
            breaker=BreakerConfig(**{k: v for k, v in _json("BREAKER", get("BREAKER"), {}, dict).items()
                                     if k in ("failures", "window_s", "cooldown_s")}),
            regions={str(k).upper(): _region(str(k).upper(), v) for k, v in _json("REGIONS", get("REGIONS"), {}, dict).items()},
        )


def _whole(name: str, value: Any) -> int:
    """Milliseconds or tokens, at least 1; refused naming the variable (0 would time out or refuse everything)."""
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return number


def _json(name: str, value: Any, default: Any, shape: type) -> Any:
    """A JSON-valued variable of one shape (a list or an object), refused naming the variable."""
    if value is None:
        return default
    what = "a JSON list" if shape is list else "a JSON object"
    try:
        data = value if isinstance(value, (list, dict)) else json.loads(str(value))
    except ValueError as exc:
        raise ValueError(f"{name} must be {what}, got {value!r} ({exc})") from None
    if not isinstance(data, shape):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return data


def _origin_url(url: str, index: int) -> str:
    """An origin is reached over HTTP: any other scheme, or a URL without a host, would fail every
    request routed to it, so it is refused when the config is read."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"ORIGINS[{index}] url must be an http:// or https:// URL with a host, "
                         f"e.g. http://127.0.0.1:8080/v1, got {url!r}")
    return url


def _origin(item: Any, env: Mapping[str, Any], index: int) -> OriginConfig:
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict) or not isinstance(item.get("url"), str):
        raise ValueError(f"ORIGINS[{index}] must be a URL or an object with a 'url'")
    secret = item.get("token_secret")
    token = env.get(secret) if secret else item.get("token")
    return OriginConfig(
        name=str(item.get("name") or f"origin{index + 1}"),
        url=_origin_url(item["url"], index),
        token=str(token) if token else None,
        timeout_ms=int(item.get("timeout_ms") or DEFAULT_ORIGIN_TIMEOUT_MS),
        context_window=int(item.get("context_window") or 32768),
        models={str(k): str(v) for k, v in (item.get("models") or {}).items()},
        region=str(item["region"]).upper() if item.get("region") else None,
        slots=int(item["slots"]) if item.get("slots") else None,
        total_ms=int(item.get("total_ms") or DEFAULT_ORIGIN_TOTAL_MS),
    )


def _region(name: str, item: Any) -> RegionConfig:
    item = item if isinstance(item, dict) else {}
    return RegionConfig(
        name=name,
        origin=item.get("origin"),
        cache_ttl=int(item["cache_ttl"]) if item.get("cache_ttl") is not None else None,
        resident=bool(item.get("resident", False)),
        edge=bool(item.get("edge", True)),
        cache=bool(item.get("cache", True)),
        allowed=tuple(str(a).upper() for a in item.get("allowed", ())),
    )
