"""The bindings the core needs, as small interfaces, and the exceptions a binding may raise.

Each port is named for a capability; the Pyodide adapter implements them over Cloudflare's
bindings, the local edge over llama.cpp, SQLite and files, and tests inject their own (fault
injecting ones included) through `edgellm.deps.Deps`, the way httpx takes a transport.

A leaf, like httpx's `_transports/base.py`: it imports nothing of the core, so every module
(errors, config, state, the adapters) may import it without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, NamedTuple, Protocol, TypeVar as _TypeVar


# --- errors a binding may raise (adapters translate their runtime's exceptions to these) ----


class BindingError(Exception):
    """A binding failed. `retryable` failures become 503 + Retry-After, the rest 502.

    Its text is for the log (it may hold a runtime's or llama.cpp's own words, internal paths);
    `public`, when an adapter sets it, is what the client may read instead (`errors.binding_error`)."""

    retryable = False
    public: str | None = None


E = _TypeVar("E", bound=BindingError)


def with_public(error: E, public: str) -> E:
    """`error`, saying `public` to the client while its own text stays in the log."""
    error.public = public
    return error


class ModelNotFound(BindingError):
    """The AI binding does not know the model id, or it has been retired."""


class InvalidModelInput(BindingError):
    """The AI binding rejected the inputs (its schema check)."""


class ContextWindowExceeded(InvalidModelInput):
    """The AI binding refused a prompt (plus max_tokens) longer than the model's context window."""


class CapacityExceeded(BindingError):
    """The AI binding is overloaded or rate limited; try again later."""

    retryable = True


class StreamCutError(BindingError):
    """The AI binding's stream ended without `[DONE]`: an incomplete answer, never a finished one."""


class KVLimitError(BindingError):
    """A KV call broke one of KV's documented limits (key/value/metadata size, TTL floor)."""


class KVRateLimited(KVLimitError):
    """KV refused a second write to the same key within a second (429)."""

    retryable = True


class UsageNotQueryable(Exception):
    """The usage sink records but cannot be read back from here (Analytics Engine without the
    SQL API's account and token): not a failure of the sink, a configuration it lacks."""


# --- ports --------------------------------------------------------------------------------


class AIBinding(Protocol):
    """Workers AI: `env.AI.run(model, inputs)`.

    `run` returns `{"response": str, "usage": {...}}`. `stream` returns (once the model has
    accepted the request, so unknown-model errors surface at the `await`) an async iterator of
    Workers AI stream events `{"response": "<token text>"}`, the last one possibly carrying
    `usage`. Closing the iterator early must stop the generation.

    `session` (passed only when the request has one) names a conversation whose prompt prefix
    the model should keep cached between turns: Workers AI's `x-session-affinity`, a llama.cpp
    slot locally. `usage.prompt_tokens_details.cached_tokens` says how much was reused.
    """

    async def run(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> dict[str, Any]: ...

    async def stream(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> AsyncIterator[dict[str, Any]]: ...

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        """An embedding model's vectors for `texts`, in order: Workers AI's bge output
        `{"shape": [n, d], "data": [[...], ...]}`, with `usage.prompt_tokens` where the backend
        counts them (llama.cpp does; Workers AI does not say). A text past the model's input
        tokens raises `InvalidModelInput`; an id that is no embedding model `ModelNotFound`."""
        ...

    def describe(self, model: str, *, live: bool = True) -> Mapping[str, Any] | None:
        """Extra facts about a model for `/v1/models` (the local edge names its GGUF).
        `live=False`: only the facts that stay while it serves (backend, build, capabilities),
        which every answer reads, HITs included, so they should cost nothing to ask; True adds
        what the backend is doing now (the local edge's slot pool)."""
        ...


@dataclass(frozen=True)
class KVEntry:
    value: bytes
    metadata: dict[str, Any] | None = None


class KVStore(Protocol):
    """Workers KV with its real limits: keys <= 512 bytes, TTL >= 60 s, eventually consistent.

    `cache_ttl` is KV's `cacheTtl` (>= 60): the read may be answered from the location's cache
    of an earlier read for that long, so a write made elsewhere may go unseen until then."""

    async def get(self, key: str, *, cache_ttl: int | None = None) -> KVEntry | None: ...

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expiration_ttl: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class R2Range:
    offset: int | None = None
    length: int | None = None
    suffix: int | None = None


@dataclass(frozen=True)
class R2Conditional:
    etag_matches: str | None = None
    etag_does_not_match: str | None = None
    uploaded_before: float | None = None
    uploaded_after: float | None = None


@dataclass
class R2Object:
    """Metadata of an R2 object; `body` is set on a successful `get` (None on `head` or when an
    `only_if` precondition failed, exactly as R2 returns an object without a body)."""

    key: str
    size: int
    etag: str
    uploaded: float
    http_metadata: dict[str, str] = field(default_factory=dict)
    custom_metadata: dict[str, str] = field(default_factory=dict)
    checksum_sha256: str | None = None
    range: tuple[int, int] | None = None  # (offset, length) actually returned
    body: AsyncIterator[bytes] | None = None

    @property
    def http_etag(self) -> str:
        return f'"{self.etag}"'


class BlobStore(Protocol):
    """R2: strongly consistent object storage with ranges and conditional reads."""

    async def head(self, key: str) -> R2Object | None: ...

    async def get(
        self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None
    ) -> R2Object | None: ...

    async def put(
        self,
        key: str,
        data: bytes | AsyncIterator[bytes],
        *,
        http_metadata: dict[str, str] | None = None,
        custom_metadata: dict[str, str] | None = None,
        sha256: str | None = None,
    ) -> R2Object: ...

    async def delete(self, key: str) -> None: ...

    async def list(
        self, prefix: str = "", *, cursor: str | None = None, limit: int = 1000, delimiter: str | None = None
    ) -> dict[str, Any]: ...


class RateLimiter(Protocol):
    """The Workers Rate Limiting binding's shape: `limit(key)` spends one unit of the key's
    window and says whether it was allowed. Its limit and period are the binding's own
    configuration (`[[ratelimits]]` in wrangler.toml); the gateway also keeps per-key limits in
    the isolate (access.ratelimit)."""

    async def limit(self, key: str) -> bool: ...


class UsageEvent(NamedTuple):
    """One answered request, as the usage port records it (no prompt or answer text).

    A named tuple, not a frozen dataclass: one is made for every answer, HITs included, and a
    frozen dataclass's `__init__` (a `object.__setattr__` per field) cost 2.5 us where this costs
    0.5; the SQLite sink writes it as its row as it is."""

    time: float
    tenant: str
    key_id: str
    model: str
    route: str
    cache_status: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    status: int
    # what the guardrails did, by name only: "stage:label:action" items from the fixed taxonomy
    # (S1..S14, the detectors' names, guard_error) and the actions, comma-joined and sorted
    # (`prompt:S1:block,answer:email:mask`); never a found value, so the column stays bounded
    guardrails: str = ""


class UsageSink(Protocol):
    """Where usage goes: Workers Analytics Engine on Cloudflare (`writeDataPoint`), SQLite locally.

    `query` answers `GET /admin/usage`: rows of totals grouped by any of tenant, model, day,
    route, cache_status. A sink that cannot be queried from the Worker raises `UsageNotQueryable`.

    `record_now` is how a request records: synchronous, it only queues the row (Analytics Engine's
    `writeDataPoint` returns nothing to await; SQLite's writer thread takes it), so recording
    costs a request no task and no wait. `record` is the same write for a caller that awaits."""

    def record_now(self, event: UsageEvent) -> None: ...

    async def record(self, event: UsageEvent) -> None: ...

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]: ...

    async def tokens_spent(self, key_id: str) -> int: ...


@dataclass
class CachedResponse:
    """An answer of the edge cache: a stored 200, or the 206 it cut from one for a Range."""

    status: int
    headers: dict[str, str]  # lower-case names
    body: AsyncIterator[bytes]


class EdgeCache(Protocol):
    """The data centre's HTTP cache in front of a slower store (Workers' Cache API,
    `caches.open(name)`): whole 200 responses stored by URL; `match` with a `range` header
    answers a 206 cut from the stored 200 itself. Best effort: it may forget anything, and a
    failure is a miss, never an error."""

    async def match(self, url: str, headers: Mapping[str, str]) -> CachedResponse | None: ...

    async def put(self, url: str, status: int, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None: ...


@dataclass
class FetchResponse:
    """An HTTP response whose body is still streaming; close `body` (aclose) to release it."""

    status: int
    headers: Mapping[str, str]
    body: AsyncIterator[bytes]


class FetchError(BindingError):
    """The request could not be sent or its response did not come (refused, reset, timed out)."""

    retryable = True


class HTTPFetch(Protocol):
    """Outbound HTTP for origins: global `fetch` on the Worker, httpx on the local edge.

    `timeout` (seconds) bounds the wait for the response headers; reading the body is bounded
    by the caller. Failures to connect or to answer raise `FetchError`.
    """

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> FetchResponse: ...


@dataclass(frozen=True)
class VectorRecord:
    """One vector to upsert: `id` at most 64 bytes, `namespace` at most 64 bytes, `metadata` a
    small JSON object (Vectorize: 10 KiB)."""

    id: str
    values: tuple[float, ...]
    namespace: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VectorMatch:
    id: str
    score: float  # cosine similarity, 1.0 for the same direction
    metadata: Mapping[str, Any] = field(default_factory=dict)


class VectorIndex(Protocol):
    """Cloudflare Vectorize (a cosine index of fixed dimension), as the Worker binding offers it:
    `query(vector, {topK, namespace, filter, returnMetadata: "all"})`, `upsert([{id, values,
    namespace, metadata}])`, `deleteByIds(ids)` (developers.cloudflare.com/vectorize/reference/client-api/).

    What callers may rely on, and no more: mutations are asynchronous (an upsert may take seconds
    to be seen by a query, so a miss just after one is normal); an upsert replaces a vector with
    the same id in full; a query sees only its `namespace` and the vectors whose metadata equals
    every `filter` value (an indexed string property, `$eq`); at most 20 matches with metadata;
    scores are cosine similarities, best first."""

    async def query(self, vector: list[float], *, top_k: int, namespace: str,
                    filter: Mapping[str, str] | None = None) -> list[VectorMatch]: ...

    async def upsert(self, records: list[VectorRecord]) -> None: ...

    async def delete_by_ids(self, ids: list[str]) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class FaultControl(Protocol):
    """The fault injector in front of the AI binding, as `GET|POST /admin/faults` reads and
    replaces it: the local edge's `FaultyAI` (tests, benchmarks, demos); None on Cloudflare,
    where the route is a 404."""

    def state(self) -> dict[str, Any]:
        """`{"plan": {...}, "calls": n, "closed": n, "injected": {kind: n}}`."""
        ...

    def replace_plan(self, plan: Mapping[str, Any]) -> None:
        """Put a new plan in place (its JSON); a plan it cannot take raises ValueError or TypeError."""
        ...


class TraceSpan(Protocol):
    """One span: its W3C context (an object with `trace_id`, `span_id`, `sampled` and
    `traceparent()`), attributes, and its end (`error`: why it failed, if it did)."""

    context: Any

    def set(self, key: str, value: Any) -> None: ...

    def end(self, error: str | None = None) -> None: ...


class Tracer(Protocol):
    """Where spans go: nowhere (`telemetry.tracing.NoopTracer`, the default), log lines on
    Cloudflare (`LogTracer`), the OpenTelemetry SDK on the local edge. `recording`: whether a span
    is more than its context (a recording tracer's span ids are worth sending on)."""

    recording: bool

    def start_span(self, name: str, parent: Any, attributes: Mapping[str, Any] | None = None) -> TraceSpan:
        """A span under `parent` (a span's context; None: a new trace)."""
        ...


class GuardError(BindingError):
    """The moderation guard failed: it errored, timed out or answered something that is not a
    verdict. What that means for the request is `GUARD_FAIL`'s choice (closed or open)."""


@dataclass(frozen=True)
class Verdict:
    """A moderation guard's answer: `categories` are Llama Guard 3's hazard codes (S1..S14),
    empty when `safe`."""

    safe: bool
    categories: tuple[str, ...] = ()


class ContentGuard(Protocol):
    """A moderation model (Llama Guard 3): Workers AI's `@cf/meta/llama-guard-3-8b` on Cloudflare,
    a guard GGUF through llama.cpp locally, a scripted guard in tests.

    `messages` are `{role, content}` dicts, the conversation to classify: a prompt alone, or
    ending with the assistant's answer (then the answer is what is judged)."""

    async def classify(self, messages: list[Mapping[str, Any]]) -> Verdict:
        """The verdict; a failure of any kind raises a `BindingError` (a `GuardError` when the
        guard answered something unparsable)."""
        ...
