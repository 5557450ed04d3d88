"""Per-isolate state: what one Worker isolate (or one local edge process) shares between the
requests it serves. It is created by the runtime adapter and passed in through `Deps.state`,
never kept at module level in the core. Plain data only: I/O shared between requests belongs in
a Durable Object (`edgellm.durable`), never here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable

from .admission import Admission
from .cache.semantic_state import SemanticState
from .config import Config
from .ids import RandomIds, RequestIds
from .routing.state import RoutingState
from .telemetry.metrics import Telemetry

if TYPE_CHECKING:  # a type only: importing it runs access/__init__, whose guard needs Deps, which holds this state
    from .access.keys import KeyCache
    from .caller import Principal
    from .cache.key import CacheScope


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    bytes_served: int = 0
    coalesced: int = 0
    semantic_hits: int = 0  # of `hits`, those answered by meaning (cache/semantic.py)
    write_errors: int = 0
    read_errors: int = 0

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class AccessState:
    """Per-isolate access data: recently read key records and the in-isolate rate windows
    (plain data; the Workers Rate Limiting binding, when bound, is the cross-isolate limit)."""

    keys: KeyCache | None = None  # created on first use
    windows: dict[str, tuple[float, int]] = field(default_factory=dict)  # limit key -> (window start, used)
    spent: dict[str, int] = field(default_factory=dict)  # key id -> tokens this isolate charged
    reserved: dict[str, int] = field(default_factory=dict)  # key id -> tokens held by requests in progress (access.reservation)
    open_principal: tuple[Config, Principal] | None = None  # open mode's caller, per Config (access.guard.open_principal)


@dataclass
class RecentMemo:
    """A few recent values by key, the oldest dropped first: per isolate (passed in through
    `Deps.state`, never a module global), plain data only, bounded by `limit`. What is kept is
    shared by every request that finds it: read, never changed."""

    limit: int = 256
    entries: dict[Hashable, Any] = field(default_factory=dict)

    def get(self, key: Hashable) -> Any:
        return self.entries.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        if key not in self.entries and len(self.entries) >= self.limit:
            del self.entries[next(iter(self.entries))]
        self.entries[key] = value


@dataclass
class ParsedBodies(RecentMemo):
    """The last request bodies parsed, per tenant: an identical body (a client repeating a
    cacheable question) skips its JSON parse and its checks. Keyed by the caller's tenant
    scope, so one tenant's request never finds another's parse warm (no timing tells it what
    another asked), by the route's wire format and by everything `read_json` reads (the bytes
    and the declared length); an entry holds the Config it was parsed under and serves only
    that one. Only accepted bodies are kept (a refusal raises before it is stored), small ones
    (`max_body`). What is kept is shared by the tenant's identical requests: read, never changed
    (the cache key and routing copy)."""

    max_body: int = 4096

    def parsed(self, key: Hashable, config: Config) -> tuple[Any, Any] | None:
        entry = self.get(key)
        if entry is None or entry[0] is not config:
            return None
        return entry[1], entry[2]

    def keep(self, key: Hashable, config: Config, body: Any, parsed: Any) -> None:
        self.put(key, (config, body, parsed))


@dataclass
class IsolateState:
    config: Config | None = None  # the Worker's parsed Config, set on the isolate's first request
    # why the Worker's [vars] were refused (None: not refused): kept so the isolate says it once and answers 503 after
    misconfigured: str | None = None
    generations: dict[tuple[str, str], tuple[CacheScope, float]] = field(default_factory=dict)  # (tenant, namespace) -> (scope at its purge generation, read at)
    cache: CacheCounters = field(default_factory=CacheCounters)
    semantic: SemanticState = field(default_factory=SemanticState)  # the semantic cache's reachability and costs
    parsed: ParsedBodies = field(default_factory=ParsedBodies)  # recent request bodies, parsed, per tenant
    answers: RecentMemo = field(default_factory=RecentMemo)  # recent cache entries, decoded, by (tenant's KV key, bytes)
    admission: Admission = field(default_factory=Admission)  # generations in progress in this isolate
    access: AccessState = field(default_factory=AccessState)
    ids: RandomIds = field(default_factory=RandomIds)  # answer and request ids, from the CSPRNG a block at a time
    routing: RoutingState = field(default_factory=RoutingState)  # the edge's breaker, routing counters, tokenizers
    telemetry: Telemetry = field(default_factory=Telemetry)  # counts of finished requests, for /metrics
    request_ids: RequestIds = field(default_factory=RequestIds)  # x-request-id values (access.logs.request_id)
