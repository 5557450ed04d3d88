"""Sessions: the name under which a model keeps a conversation's prompt prefix cached.

A client names its session with `x-session-affinity` (the header Workers AI routes on for its
prefix caching) or OpenAI's `prompt_cache_key`; a Responses conversation is its own session.
The session only decides where the prompt is computed, never what is answered, so it is never
part of the answer cache's key. It is scoped to the caller's tenant, though: a session decides
whose cached prompt prefix a request lands on, and a tenant who could name another's session
could time how much of its own prompt was already computed (the side channel of shared prompt
caches, which providers close by scoping caches per organisation).
"""

from __future__ import annotations

from typing import Any

from .errors import invalid
from .http import Request
from .tenancy import TenantScope

SESSION_HEADER = "x-session-affinity"
MAX_SESSION_LENGTH = 256


def _checked(value: Any, param: str) -> str:
    if not isinstance(value, str) or not (0 < len(value) <= MAX_SESSION_LENGTH) or not value.isprintable():
        raise invalid(f"'{param}' must be 1 to {MAX_SESSION_LENGTH} printable characters.", param, "invalid_session")
    return value


def tenant_session(scope: TenantScope, name: str) -> str:
    """`name` as the caller's tenant sees it (`TenantScope.session_name`)."""
    return scope.session_name(name)


def request_session(request: Request, scope: TenantScope, body: Any) -> str | None:
    """The session a request names (the header first, then the body's `prompt_cache_key`),
    scoped to its tenant."""
    header = request.header(SESSION_HEADER)
    if header is not None:
        return tenant_session(scope, _checked(header.strip(), SESSION_HEADER))
    value = body.get("prompt_cache_key") if isinstance(body, dict) else None
    return None if value is None else tenant_session(scope, _checked(value, "prompt_cache_key"))
