"""`POST /admin/keys/{key_id}/revoke`: revoke a key and drop it from the answering edge's key cache.

An isolate keeps the key records it read for 30 s (`KeyCache`), so a key revoked in KV alone is
still accepted there for up to 30 s. This route (the admin token only) writes the revoked record
if it is not yet revoked and puts it in this isolate's cache at once: the local edge (one
process) refuses the key from the next request. On Cloudflare it reaches the isolate that
answers; the others see the revocation when their cached record expires (at most 30 s).
"""

from __future__ import annotations

from dataclasses import replace

from ..cache.admin import require_admin
from ..errors import ErrorKind, GatewayError, RetryAfter
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..ports import BindingError
from ..deps import Deps
from .keys import KeyCache, KeyRing

_KEY_ID_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789")


async def revoke_key(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    require_admin(request, deps, ctx)
    key_id = ctx.params["key_id"]
    if len(key_id) != 12 or not set(key_id) <= _KEY_ID_CHARS:
        raise GatewayError(ErrorKind.INVALID_REQUEST, "A key id is 12 lower-case letters and digits.", param="key_id", code="invalid_key_id")
    if deps.kv is None:
        raise GatewayError(ErrorKind.UNAVAILABLE, "No KV namespace is bound; keys cannot be changed.", code="keys_unavailable", retry_after=RetryAfter.UNCONFIGURED)
    ring, now = KeyRing(deps.kv), deps.clock.now()
    try:
        record = await ring.get(key_id)
        if record is not None and record.active:
            record = replace(record, revoked=now)
            await ring.put(record)
    except (BindingError, ValueError) as exc:
        deps.log.warning("key revocation failed for %s: %s", key_id, exc)
        raise GatewayError(ErrorKind.UNAVAILABLE, "Keys cannot be changed now; retry shortly.", code="keys_unavailable", retry_after=RetryAfter.DEPENDENCY) from exc
    if record is None:
        raise GatewayError(ErrorKind.NOT_FOUND, f"No key {key_id}.", param="key_id", code="key_not_found")
    access = deps.state.access
    if access.keys is None:
        access.keys = KeyCache()
    access.keys.put(key_id, record, now)  # this isolate refuses it from the next request
    return json_response({"object": "key.revocation", "key_id": key_id, "revoked": record.revoked,
                          "dropped": "this edge's key cache; other Cloudflare isolates within 30 s"})
