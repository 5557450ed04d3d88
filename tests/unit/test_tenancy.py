"""`TenantScope`: every place a request's tenant shows, from the one scope its principal makes."""

from __future__ import annotations

import pytest

from edgellm.access.guard import Principal
from edgellm.access.keys import new_key
from edgellm.app import ROUTES
from edgellm.context import RequestContext
from edgellm.tenancy import SHARED_TENANT, UNSCOPED, TenantScope


def keyed(tenant: str, share_cache: bool = False) -> Principal:
    return Principal(tenant, "k1", new_key(tenant, 0, share_cache=share_cache).record)


@pytest.mark.parametrize(("principal", "cache", "custom", "usage", "session"), [
    (keyed("acme"), "acme", "acme", "acme", "acme:s"),
    (keyed("acme", share_cache=True), SHARED_TENANT, "acme", "acme", "acme:s"),  # a custom key is never the pool's
    (Principal("default", "open"), "default", "default", "default", "s"),
    (Principal("default", "admin", admin=True), "default", "default", "default", "s"),
])
def test_a_principals_scope_names_each_place_its_tenant_shows(principal: Principal, cache: str, custom: str, usage: str,
                                                                session: str) -> None:
    scope = principal.scope
    assert (scope.cache_tenant, scope.custom_key_tenant, scope.usage_tenant, scope.admission_tenant) == (cache, custom, usage, usage)
    assert scope.session_name("s") == session
    assert scope.object_name("conv_1") == f"{principal.tenant}/conv_1"
    assert principal.cache_tenant == cache


def test_a_request_without_a_caller_is_unscoped() -> None:
    ctx = RequestContext(ROUTES)
    assert ctx.tenant_scope is UNSCOPED
    assert (UNSCOPED.cache_tenant, UNSCOPED.custom_key_tenant, UNSCOPED.admission_tenant) == (None, None, None)
    assert UNSCOPED.session_name("acme:x") == ":acme:x"  # never a keyed tenant's session (b460165)
    with pytest.raises(ValueError):
        UNSCOPED.object_name("conv_1")
    ctx.principal = keyed("acme")
    assert ctx.tenant_scope == TenantScope("acme", "acme", True)
