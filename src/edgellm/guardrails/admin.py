"""`GET /admin/guardrails`: the policy in force, for the operator (the admin token): the gateway's
`GUARDRAILS`, or with `?key=<key id>` the policy that key's requests get (its own, else the
gateway's), with whether answers are unmasked for their caller, what a failing guard means and
the answer window."""

from __future__ import annotations

from ..access.keys import KeyRing
from ..cache.admin import require_admin
from ..context import RequestContext
from ..deps import Deps
from ..errors import ErrorKind, GatewayError
from ..http import Request, Response, json_response


async def get_guardrails(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    require_admin(request, deps, ctx)
    config = deps.config
    policy, scope = config.guardrails, "gateway"
    key_id = request.query.get("key")
    if key_id:
        record = await KeyRing(deps.kv).get(key_id) if deps.kv is not None else None
        if record is None:
            raise GatewayError(ErrorKind.NOT_FOUND, f"No API key {key_id!r}.", param="key", code="key_not_found")
        if record.policy is not None:
            policy, scope = record.policy, "key"
    return json_response({
        "object": "guardrails.policy",
        "scope": scope,  # "key": the key's own policy; "gateway": GUARDRAILS (a key without its own gets it)
        "policy": {**policy.to_json(), "unmask_answer": policy.unmask_answer},  # said when off too
        "guard": {"configured": deps.guard is not None, "model": config.guard_model, "fail": config.guard_fail,
                  "timeout_seconds": config.guard_timeout_seconds},
        "answer_window_tokens": config.guard_window_tokens,
    })
