"""What the edge learns about one request as it passes the pipeline's layers (`edgellm.pipeline`),
in one typed place: its id and span, the route it matched, who calls, what it reserved of its key's
limits and what its generation did. Handlers are given it beside the `Request`, which stays the
HTTP request and nothing else (Starlette's untyped `request.state` is what this replaces).

Not frozen: an outer layer reads on its way out what an inner one learned on its way in (the
usage record reads the principal, the log line the route and the observation), so each field is
written once, by the one layer (or handler step) named beside it, and read by the others. What
those fields hold is immutable where it can be (`Principal`, the route's parameters); a
`Reservation` and an `Observation` change as the request runs, by their nature.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping

from .caller import Observation, Principal, Reservation
from .tenancy import UNSCOPED, TenantScope

if TYPE_CHECKING:
    from .guardrails.check import PromptCheck
    from .router import Router
    from .telemetry.tracing import Span

NO_PARAMS: Mapping[str, str] = MappingProxyType({})


@dataclass(slots=True, init=False)  # its `__init__` below: one is made per request
class RequestContext:
    router: Router  # the table the request is routed by (`app.ROUTES`), given by `app.handle`
    started: float = 0.0  # when it arrived (the clock's time): the telemetry layer
    id: str = ""  # its request id (`x-request-id`): the request id layer
    span: Span | None = None  # its span, when something reads one (a tracer, an origin): the request id layer
    route: str = "unmatched"  # the matched route's template (metrics, usage): the match layer
    handler: str = "none"  # the handler's name (the log line): the match or preflight layer
    endpoint: Callable[..., Awaitable[object]] | None = None  # the handler itself: the match layer
    params: Mapping[str, str] = field(default_factory=lambda: NO_PARAMS)  # the path's `{name}` parameters, decoded: the match layer
    principal: Principal | None = None  # who calls (None on public routes): the authentication layer
    reservation: Reservation | None = None  # what it holds of its key's limits: admission (`access.admit_tokens`)
    observed: Observation | None = None  # what its generation did: the handler (`access.observe`)
    guardrails: PromptCheck | None = None  # what the guardrails did to its prompt: the guardrails layer
    # when its answer was whole (a stream: when its body ended), when the usage layer read the clock
    # for its record: the telemetry layer's metrics and log line take the same time, not a second read
    ended: float | None = None

    def __init__(self, router: Router, started: float = 0.0, id: str = "", span: Span | None = None, route: str = "unmatched",
                 handler: str = "none", endpoint: Callable[..., Awaitable[object]] | None = None, params: Mapping[str, str] = NO_PARAMS,
                 principal: Principal | None = None, reservation: Reservation | None = None, observed: Observation | None = None,
                 guardrails: PromptCheck | None = None, ended: float | None = None) -> None:
        """As the dataclass's would be, without calling `params`' factory: its default is
        immutable (which a dataclass field may only give by a factory). One store per field: a
        tuple assignment of several builds and unpacks a tuple."""
        self.router = router
        self.started = started
        self.id = id
        self.span = span
        self.route = route
        self.handler = handler
        self.endpoint = endpoint
        self.params = params
        self.principal = principal
        self.reservation = reservation
        self.observed = observed
        self.guardrails = guardrails
        self.ended = ended

    @property
    def tenant_scope(self) -> TenantScope:
        """Where the caller's tenant shows (made once, with the principal); no caller: none."""
        return self.principal.scope if self.principal is not None else UNSCOPED
