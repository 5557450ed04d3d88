"""What the edge learns of a request as it serves it: who calls (`Principal`, with its
`TenantScope`), what its generation did (`Observation`) and what it reserved of its key's
limits (`Reservation`). Plain data, in a module of their own so that `http.Request` can name
their types without importing the modules that act on them (access.guard, access.usage and
access.reservation all build on `http`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .tenancy import TenantScope

if TYPE_CHECKING:
    from .access.keys import KeyRecord


@dataclass(frozen=True)
class Principal:
    """The caller. `record` is None in open mode and for the admin token. `scope` is where its
    tenant shows (cache keys, conversations, sessions, usage, admission), made once with it."""

    tenant: str
    key_id: str
    record: KeyRecord | None = None
    admin: bool = False  # ADMIN_TOKEN: every tenant, every admin route
    scope: TenantScope = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", TenantScope.of(self.tenant, self.share_cache, self.record is not None))

    @property
    def share_cache(self) -> bool:
        return self.record is not None and self.record.share_cache

    @property
    def cache_tenant(self) -> str:
        """The tenant part of this caller's cache keys (`TenantScope.cache_tenant`)."""
        return self.scope.cache_tenant or self.tenant  # never None for a caller


@dataclass
class Observation:
    """What the usage record needs of a generation; filled as its events pass."""

    model: str
    cache_status: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    delivered: int = 0  # Token and tool-call events passed on: the tokens of an answer cut before its Finish
    finished: bool = False
    route: str | None = None  # where it ran (`x-edgellm-route`; a mid-stream failover's Finish updates it)
    first_token_at: float | None = None  # when its first token passed (the clock's time): time to first token
    generated: bool = True  # False for embeddings: no token comes out, so there is no time to a first one

    def copy(self) -> "Observation":
        """Another request's own (usage fills in what it lacks); `dataclasses.replace` costs ~5x.
        Its first token is its own: not copied."""
        return Observation(self.model, self.cache_status, self.prompt_tokens, self.completion_tokens, self.delivered, self.finished,
                           self.route, generated=self.generated)


@dataclass
class Reservation:
    """What one admitted request holds of its key's limits until `settle`."""

    key_id: str
    tokens: int  # prompt estimate + max_tokens
    prompt_tokens: int  # the estimate alone
    max_tokens: int
    per_minute: int
    window_start: float | None  # the token window the reservation went into (None: no per-minute limit)
    model: str = ""
    settled: bool = False
