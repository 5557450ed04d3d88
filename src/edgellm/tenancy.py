"""Whose a request's state is: one `TenantScope` per request, made with its principal.

A tenant shows in six places, and each had worked it out on its own: the answer cache's keys
(the caller's tenant, or the shared pool for keys that both share), a custom cache key (always
the caller's own: a name one tenant chose must never let another write under it), the
Durable Object of a stored conversation (`<tenant>/<conversation>`), a session's name
(`<tenant>:<name>` for a key's caller), and the usage row, the admission share and prompt-prefix
reuse (the caller's own tenant). The scope names them all, so a rule changes in one place. Leaf
module: it imports nothing of the core.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED_TENANT = "_shared"  # the cache scope of tenants that share; no key's tenant can be named so


@dataclass(frozen=True)
class TenantScope:
    """`tenant` is the caller's own tenant (None: no caller, as on public routes); `cache_tenant`
    the tenant part of its derived cache keys (None: the configured tenant); `keyed` whether the
    caller holds a key (open mode and the admin token do not)."""

    tenant: str | None = None
    cache_tenant: str | None = None
    keyed: bool = False

    @classmethod
    def of(cls, tenant: str, share_cache: bool, keyed: bool) -> "TenantScope":
        """A caller's scope: its cache entries are shared only when its key allows sharing (so an
        entry is shared only between tenants that both allow it)."""
        return cls(tenant, SHARED_TENANT if share_cache else tenant, keyed)

    @property
    def custom_key_tenant(self) -> str | None:
        """The tenant part of a custom key (`cf-aig-cache-key`): the caller's own, never the pool."""
        return self.tenant

    @property
    def admission_tenant(self) -> str | None:
        """Whose share of the isolate's generation places a request takes (admission.fair_share)."""
        return self.tenant

    @property
    def prefix_scope(self) -> str | None:
        """Whose prompt prefixes a request without a session may reuse on the local slot pool:
        the caller's own tenant's, never another's (their reuse can be timed)."""
        return self.tenant

    @property
    def usage_tenant(self) -> str:
        """The tenant a usage row is charged to (only a caller's requests are recorded)."""
        return self.tenant or ""

    def object_name(self, conversation: str) -> str:
        """The Durable Object of one of this tenant's conversations: a tenant reaching for
        another's response id lands on an object that holds nothing."""
        if self.tenant is None:
            raise ValueError("a conversation belongs to a tenant; this scope has none")
        return f"{self.tenant}/{conversation}"

    def session_name(self, name: str) -> str:
        """`name` as this tenant sees it: a keyed tenant's sessions are `<tenant>:<name>` (tenant
        names hold no ':'), so two tenants naming the same session never share a prompt cache.
        Keyless callers (open mode) and the admin token keep the bare name, unless it holds a
        ':': a keyless `acme:x` would be tenant acme's session `x` (its prompt cache, timed by
        another caller), so it becomes `:acme:x`, a name no keyed tenant's session can have
        (tenant names are never empty) and whose states the local slot pool shares with nothing."""
        if self.keyed:
            return f"{self.tenant}:{name}"
        return f":{name}" if ":" in name else name


UNSCOPED = TenantScope()  # a request without a caller (public routes; handlers called directly)
