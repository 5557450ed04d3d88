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

Replicas that serve the same models form a pool: a `pool` name on each origin, or one entry with a
`replicas` list (URLs, or objects that override the entry's own fields) and the pool's settings:

    ORIGINS = '[{"pool": "gpu", "kind": "llama.cpp", "primary": true, "load_bound": 0.25,
                 "replicas": ["http://10.0.0.1:8080", {"name": "gpu-b", "url": "http://10.0.0.2:8080"}]}]'

A pool's replicas are ordered per request by the scheduler (`routing.scheduler`); a replica listed
twice, a pool with no replica, or one URL in two pools that serve different models is refused here,
so the Worker fails at start and `edgellm deploy-check` names the mistake.
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
    pool: str | None = None  # the pool of replicas it belongs to (None: an origin of its own, tried in order)
    # what its load probe reads: "llama.cpp" (/metrics: requests processing and deferred, KV use),
    # "vllm" (/metrics: requests running and waiting, KV use) or None (nothing: the gateway's own counts)
    kind: str | None = None

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


POLICIES = ("scheduler", "round-robin", "least-in-flight", "session")
KINDS = ("llama.cpp", "vllm", "edgellm")
DEFAULT_LOAD_BOUND = 1.0
DEFAULT_PROBE_MS = 150
DEFAULT_PROBE_AGE_MS = 1000


@dataclass(frozen=True)
class PoolConfig:
    """A pool of replicas and how a request picks one. `policy`: "scheduler" (prefix locality,
    load and health in one cost, `routing.scheduler`), or the baselines "round-robin",
    "least-in-flight" and "session" (rendezvous on the session id, the single origins' rule).
    `load_bound`: a replica above (1 + load_bound) x the pool's mean load takes no more until the
    others catch up. `primary`: the pool takes its model's requests instead of the edge (a pool
    behind the edge otherwise takes what the edge cannot). `probe_ms`: the load probe's timeout, the most it adds
    to a request; `probe_age_ms`: how old a replica's reported load may be and still count.
    `router_ms`: with the ROUTER Durable Object bound, how long a request waits for the pool's
    object to answer before it picks from its own isolate's view."""

    name: str
    replicas: tuple[str, ...]
    policy: str = "scheduler"
    load_bound: float = DEFAULT_LOAD_BOUND
    primary: bool = False
    probe_ms: int = DEFAULT_PROBE_MS
    probe_age_ms: int = DEFAULT_PROBE_AGE_MS
    router_ms: int = 10


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
    pools: dict[str, PoolConfig] = field(default_factory=dict)

    def pool_of(self, origin: OriginConfig) -> PoolConfig | None:
        return self.pools.get(origin.pool) if origin.pool else None

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

        origins, pools = _origins(_json("ORIGINS", get("ORIGINS"), [], list), env)
        return cls(
            origins=origins,
            pools=pools,
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


_POOL_SETTINGS = ("policy", "load_bound", "primary", "probe_ms", "probe_age_ms", "router_ms")


def _origins(items: list[Any], env: Mapping[str, Any]) -> tuple[tuple[OriginConfig, ...], dict[str, PoolConfig]]:
    """The origins, a pool's `replicas` spread into origins of their own, and the pools, checked:
    an operator who lists a replica twice, leaves a pool empty or puts one server in two pools
    with different models has made a mistake the gateway would otherwise route around silently."""
    origins: list[OriginConfig] = []
    settings: dict[str, dict[str, Any]] = {}
    for index, item in enumerate(items):
        if isinstance(item, dict) and "replicas" in item:
            pool = item.get("pool") or item.get("name")
            if not isinstance(pool, str) or not pool:
                raise ValueError(f"ORIGINS[{index}] has 'replicas' but no 'pool' name")
            replicas = item["replicas"]
            if not isinstance(replicas, list) or not replicas:
                raise ValueError(f"ORIGINS[{index}]: pool {pool!r} has no replica (its 'replicas' list is empty)")
            shared = {k: v for k, v in item.items() if k not in ("replicas", "name", "url", *_POOL_SETTINGS)}
            settings.setdefault(pool, {}).update({k: item[k] for k in _POOL_SETTINGS if k in item})
            for number, replica in enumerate(replicas):
                replica = {"url": replica} if isinstance(replica, str) else replica
                if not isinstance(replica, dict):
                    raise ValueError(f"ORIGINS[{index}].replicas[{number}] must be a URL or an object with a 'url'")
                merged = {**shared, "name": f"{pool}-{number + 1}", **replica, "pool": pool}
                origins.append(_origin(merged, env, index, where=f"ORIGINS[{index}].replicas[{number}]"))
        else:
            origins.append(_origin(item, env, index))
    names = [o.name for o in origins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"ORIGINS lists {twice[0]!r} twice: every origin and replica needs a name of its own")
    pools: dict[str, PoolConfig] = {}
    members: dict[str, list[OriginConfig]] = {}
    for origin in origins:
        if origin.pool:
            members.setdefault(origin.pool, []).append(origin)
    for pool, replicas in members.items():
        urls = [r.base_url for r in replicas]
        again = next((u for u in urls if urls.count(u) > 1), None)
        if again is not None:
            raise ValueError(f"ORIGINS: pool {pool!r} lists the replica {again} twice")
        pools[pool] = _pool(pool, tuple(r.name for r in replicas), settings.get(pool, {}))
    for pool in settings:
        if pool not in members:
            raise ValueError(f"ORIGINS: pool {pool!r} has no replica")
    seen: dict[str, OriginConfig] = {}
    for origin in origins:
        other = seen.setdefault(origin.base_url, origin)
        if other is not origin and other.pool != origin.pool and other.models != origin.models:
            raise ValueError(f"ORIGINS: {origin.base_url} is a replica of pool {other.pool or other.name!r} and of "
                             f"{origin.pool or origin.name!r} with different models: one server serves one set of models")
    return tuple(origins), pools


def _pool(name: str, replicas: tuple[str, ...], item: dict[str, Any]) -> PoolConfig:
    where = f"ORIGINS: pool {name!r}"
    policy = str(item.get("policy", "scheduler"))
    if policy not in POLICIES:
        raise ValueError(f"{where}: policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    try:
        bound = float(item.get("load_bound", DEFAULT_LOAD_BOUND))
    except (TypeError, ValueError):
        bound = -1.0
    if not 0 <= bound <= 100 or bound != bound:
        raise ValueError(f"{where}: load_bound must be a number from 0 to 100 (1: spill above twice the mean load), "
                         f"got {item.get('load_bound')!r}")
    whole = {key: _whole(f"{where} {key}", item[key]) for key in ("probe_ms", "probe_age_ms", "router_ms") if key in item}
    return PoolConfig(name, replicas, policy, bound, bool(item.get("primary", False)), **whole)


def _origin(item: Any, env: Mapping[str, Any], index: int, where: str | None = None) -> OriginConfig:
    where = where or f"ORIGINS[{index}]"
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict) or not isinstance(item.get("url"), str):
        raise ValueError(f"{where} must be a URL or an object with a 'url'")
    kind = item.get("kind")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"{where} kind must be one of {', '.join(KINDS)} (what its load probe reads), got {kind!r}")
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
        pool=str(item["pool"]) if item.get("pool") else None,
        kind=kind if kind is not None else ("llama.cpp" if item.get("slots") else None),
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
