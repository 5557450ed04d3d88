"""Where a request's generation goes first, decided before anything is sent.

    request ─▶ region (cf country/continent) ─▶ count prompt tokens (tokenizer.json from R2)
        too long for every route ─▶ 400 context_length_exceeded (no inference)
        resident region, only foreign origins could answer ─▶ 503 residency (nothing leaves)
        breaker open ─▶ origin (reason=breaker)
        too long for the edge / region without edge ─▶ origin
        else edge first (model fallback ids first), with the origins to fail over to

Plain functions over values: `candidates` gathers the facts into a frozen `Candidates`,
`refusal` turns "no route can take it" into the one error the client gets, and `plan_route`
returns a frozen `Plan`. A module of its own because a plan is made apart from running it: a
flights object's leader runs the plan its Worker made (`cache.coalescing.FlightPlan`), and the
region and first-token budget are read by the cache and the flights without any failover code;
`failover` runs a plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ErrorKind, GatewayError, RetryAfter
from ..generation import GenerationRequest
from ..http import Request
from ..deps import Deps
from .affinity import by_affinity
from .breaker import CircuitBreaker
from .config import OriginConfig, RegionConfig, RoutingConfig
from .counting import count_prompt_tokens
from .origin import uncarried
from .state import RoutingState

TIMEOUT_HEADER = "cf-aig-request-timeout"

def routing_state(deps: Deps) -> RoutingState:
    state = deps.state.routing
    if state.breaker is None:
        state.breaker = CircuitBreaker(deps.config.routing.breaker)
    return state


def resolve_region(config: RoutingConfig, request: Request) -> RegionConfig | None:
    """The region policy for this request: its country's, else its continent's. On Cloudflare
    the adapter fills `request.cf` (not spoofable); the local edge reads `cf-ipcountry` /
    `cf-ipcontinent` headers, as sent by Cloudflare's proxy."""
    if not config.regions:
        return None
    cf = request.cf
    if cf:
        country, continent = cf.get("country"), cf.get("continent")
    else:
        country, continent = request.header("cf-ipcountry"), request.header("cf-ipcontinent")
    for code in (country, continent):
        if code and str(code).upper() in config.regions:
            return config.regions[str(code).upper()]
    return None


def first_token_budget(config: RoutingConfig, request: Request) -> float:
    raw = request.header(TIMEOUT_HEADER)
    if raw is None:
        return config.first_token_ms / 1000
    try:
        ms = int(raw.strip())
    except ValueError:
        raise GatewayError(ErrorKind.INVALID_REQUEST, f"'{TIMEOUT_HEADER}' must be a whole number of milliseconds, got {raw!r}.",
                           param=TIMEOUT_HEADER, code="invalid_header") from None
    if ms <= 0:
        raise GatewayError(ErrorKind.INVALID_REQUEST, f"'{TIMEOUT_HEADER}' must be positive.", param=TIMEOUT_HEADER, code="invalid_header")
    return ms / 1000


@dataclass(frozen=True)
class Plan:
    """Edge first or not, the origins to try in order, why (`reason`: "primary", or why the edge
    is skipped), whether the edge attempt is the breaker's half-open probe, the prompt tokens."""

    edge: bool
    origins: tuple[OriginConfig, ...]
    reason: str  # why the edge is skipped, or "primary"
    probe: bool = False
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class Candidates:
    """What a request could run on, before anything is decided: the origins serving its model
    (`serving`), those its region admits in the order to try (`allowed`) and those it shuts out
    (`blocked`), what no origin can carry (`uncarried`), its prompt tokens (None: not counted)
    and whether the edge may take it (`edge_allowed`: its region; `edge_fits`: its window and
    limits)."""

    region: RegionConfig | None
    serving: tuple[OriginConfig, ...]
    allowed: tuple[OriginConfig, ...]
    blocked: tuple[OriginConfig, ...]
    uncarried: tuple[str, ...]
    tokens: int | None
    out: int
    edge_allowed: bool
    edge_fits: bool

    def fits(self, window: int) -> bool:
        return self.tokens is None or self.tokens + self.out <= window

    @property
    def origins(self) -> tuple[OriginConfig, ...]:
        """The admitted origins whose window holds the request, in the order to try them."""
        return tuple(o for o in self.allowed if self.fits(o.context_window))


async def candidates(deps: Deps, request: Request, gen_request: GenerationRequest) -> Candidates:
    config, routing = deps.config, deps.config.routing
    region = resolve_region(routing, request)
    serving = [o for o in routing.origins if o.serves(gen_request.model)] if deps.fetch is not None else []
    allowed = [o for o in serving if region is None or region.admits(o)]
    blocked = [o for o in serving if o not in allowed]
    cannot_carry = uncarried(gen_request)
    if cannot_carry:  # an origin would answer without them: the edge alone may take this request
        allowed, blocked = [], []
    if gen_request.session:  # a conversation keeps to one replica (its KV cache is there)
        allowed = by_affinity(allowed, gen_request.session)
    if region is not None and region.origin:
        allowed.sort(key=lambda o: o.name != region.origin)  # the region's own origin first
    tokens = await count_prompt_tokens(deps, gen_request)
    out = gen_request.max_tokens
    edge_fits = (tokens is None or tokens + out <= config.context_window) and (
        tokens is None or routing.edge_max_prompt_tokens is None or tokens <= routing.edge_max_prompt_tokens
    ) and (routing.edge_max_output_tokens is None or out <= routing.edge_max_output_tokens)
    return Candidates(region, tuple(serving), tuple(allowed), tuple(blocked), tuple(cannot_carry), tokens, out,
                      region is None or region.edge, edge_fits)


def refusal(deps: Deps, found: Candidates) -> GatewayError | None:
    """Why no route can take the request (the edge may not, and no origin can), as the error
    the client gets; nothing is sent anywhere."""
    config, counters = deps.config, routing_state(deps).counters
    region, edge_allowed = found.region, found.edge_allowed
    if found.uncarried and found.serving:
        return GatewayError(
            ErrorKind.INVALID_REQUEST,
            f"Only an origin could take this request, and '{found.uncarried[0]}' cannot be sent to an origin "
            f"({'it is too long for the edge' if edge_allowed else 'the edge is not allowed for this region'}). Nothing was sent.",
            param=found.uncarried[0], code="unsupported_parameter",
        )
    if found.tokens is not None and not found.fits(config.context_window) and not any(found.fits(o.context_window) for o in found.serving):
        counters.context_length_exceeded += 1
        return _context_error(found.tokens, found.out, max([config.context_window, *(o.context_window for o in found.serving)]))
    if region is not None and region.resident and found.blocked:
        counters.residency_refusals += 1
        return GatewayError(
            ErrorKind.UNAVAILABLE,
            f"Requests from region {region.name} must stay in it, and no origin inside it can take this one "
            f"({'the edge cannot' if edge_allowed else 'the edge is not allowed for this region'}; "
            f"origins outside: {', '.join(o.name for o in found.blocked)}). Nothing was sent.",
            code="residency_unavailable", retry_after=RetryAfter.UNCONFIGURED,
        )
    if not edge_allowed:
        return GatewayError(ErrorKind.UNAVAILABLE, f"No route serves region {region.name if region else '?'}.",
                            code="no_route", retry_after=RetryAfter.UNCONFIGURED)
    if found.tokens is not None:
        counters.context_length_exceeded += 1
        return _context_error(found.tokens, found.out, config.context_window)
    return None  # uncounted, past the edge's output limit: the plan's empty origins answer 503 no_route


def _context_error(tokens: int, max_tokens: int, largest: int) -> GatewayError:
    return GatewayError(
        ErrorKind.INVALID_REQUEST,
        f"This request needs {tokens} prompt tokens plus up to {max_tokens} completion tokens, more than the largest context "
        f"window of any route ({largest} tokens). Shorten the messages or lower max_tokens.",
        param="messages", code="context_length_exceeded",
    )


async def plan_route(deps: Deps, request: Request, gen_request: GenerationRequest) -> Plan:
    """Where the request goes first: an origin when the edge may not or cannot take it, or the
    breaker is open; else the edge, with the origins to fail over to. A 400/503 when neither."""
    state = routing_state(deps)
    found = await candidates(deps, request, gen_request)
    origins, tokens = found.origins, found.tokens
    if not (found.edge_allowed and found.edge_fits) and not origins:
        error = refusal(deps, found)
        if error is not None:
            raise error
    if not found.edge_allowed:
        return Plan(False, origins, "region", prompt_tokens=tokens)
    if origins and any(p.primary for o in origins if (p := deps.config.routing.pool_of(o)) is not None):
        return Plan(False, origins, "pool", prompt_tokens=tokens)  # a primary pool takes its requests before the edge
    if not found.edge_fits:
        state.counters.too_long_for_edge += 1
        return Plan(False, origins, "too-long-for-edge", prompt_tokens=tokens)
    if origins:
        admitted = state.breaker.admit(deps.clock.now())  # type: ignore[union-attr]
        if admitted == "skip":
            state.counters.breaker_skips += 1
            return Plan(False, origins, "breaker", prompt_tokens=tokens)
        return Plan(True, origins, "primary", probe=admitted == "probe", prompt_tokens=tokens)
    return Plan(True, (), "primary", prompt_tokens=tokens)
