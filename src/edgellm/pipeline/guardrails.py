"""The prompt's guardrails (docs/guardrails.md), before any handler of a generation route: the
caller's policy (its key's, else the gateway's `GUARDRAILS`) applied to the prompt. DLP first, at
the edge with no model: a `block` finding is a 400 `content_filter` naming the detectors; `mask`
findings become placeholders in the body the handler is given (so inference, an origin, the cache
key and a stored conversation only ever see the placeholder); `flag` says so in
`x-edgellm-guardrails`. Then moderation by the guard (Llama Guard 3) on the masked prompt: a
blocked category is the same 400 naming the categories, before any inference, so nothing is
cached or sent to an origin. A guard that fails, times out or answers no verdict follows
`GUARD_FAIL`: closed, a 503 `guard_unavailable` with Retry-After; open, the prompt passes, counted.

Embeddings are not checked: a vector carries no text back to anyone, it never goes to an origin,
and masking would change the vector the caller asked for.

The checked request reaches the handler as a `Request` whose body is the masked one (a typed
`Request`, never a side channel), and what was done is `ctx.guardrails` (`PromptCheck`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Awaitable

from ..context import RequestContext
from ..deps import Deps
from ..errors import ErrorKind, GatewayError
from ..guardrails.answer import AnswerCheck, AnswerVerdicts
from ..guardrails.check import PromptCheck
from ..guardrails.dlp import redact
from ..guardrails.moderation import guard_messages
from ..guardrails.policy import Policy
from ..guardrails.prompt import PROMPT_FIELDS, SCAN_LIMIT, DLPOutcome, apply_dlp, guard_conversation, prompt_leaves
from ..http import Request, Response
from ..ports import BindingError
from ..validation import json_too_deep
from . import Next

HEADER = "x-edgellm-guardrails"


def caller_policy(deps: Deps, ctx: RequestContext) -> Policy:
    """The key's own policy when it has one, else the gateway's."""
    principal = ctx.principal
    record = principal.record if principal is not None else None
    if record is not None and record.guardrails:
        own = record.policy
        if own is not None:
            return own
    return deps.config.guardrails


class _Counter:
    """The /metrics counter, and the same verdict kept for the request's usage row."""

    __slots__ = ("deps", "counted")

    def __init__(self, deps: Deps, counted: set[str]) -> None:
        self.deps, self.counted = deps, counted

    def count_guardrail(self, stage: str, label: str, action: str) -> None:
        self.deps.state.telemetry.count_guardrail(stage, label, action)
        self.counted.add(f"{stage}:{label}:{action}")


def _checked_route(request: Request, deps: Deps, ctx: RequestContext) -> bool:
    if request.method != "POST" or ctx.route not in PROMPT_FIELDS:
        return False
    if ctx.route == "workers-ai":  # the run route: a chat model's (an embedding model's is not checked)
        model = ctx.params.get("model")
        return model is not None and model not in deps.config.embedding_models
    return True


def guardrails(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    if not _checked_route(request, deps, ctx):
        return call_next(request, deps, ctx)
    policy = caller_policy(deps, ctx)
    if policy.empty:  # no guardrails: no coroutine, no parse (the usual case costs one lookup)
        return call_next(request, deps, ctx)
    return _check(call_next, request, deps, ctx, policy)


def refused(what: str, names: tuple[str, ...], param: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST,
                        f"The prompt was refused by this gateway's content policy ({what}: {', '.join(names)}).",
                        param=param, code="content_filter")


async def _check(call_next: Next, request: Request, deps: Deps, ctx: RequestContext, policy: Policy) -> Response:
    try:  # nesting bounded before parsing (deep JSON ends a Pyodide isolate instead of raising)
        body = json.loads(request.body) if request.body and not json_too_deep(request.body) else None
    except ValueError:
        body = None
    if not isinstance(body, dict):  # not a body to check: the handler answers its 400
        return await call_next(request, deps, ctx)
    counted: set[str] = set()  # every verdict, for the usage row: the request's, blocked or not
    ctx.guardrails = PromptCheck(policy, counted=counted)
    telemetry = _Counter(deps, counted)
    param = PROMPT_FIELDS[ctx.route][0]
    dlp = DLPOutcome()
    if policy.dlp:
        leaves = prompt_leaves(body, ctx.route)
        if sum(len(leaf.text) for leaf in leaves) > SCAN_LIMIT:
            raise GatewayError(ErrorKind.REQUEST_TOO_LARGE,
                               f"The prompt is longer than the {SCAN_LIMIT // 1024} KiB this gateway's data-loss checks read; "
                               "send a shorter one.", param=param, code="guardrails_scan_limit")
        dlp = apply_dlp(leaves, policy)
        for action, names in (("block", dlp.blocked), ("mask", dlp.masked), ("flag", dlp.flagged)):
            for name in names:
                telemetry.count_guardrail("prompt", name, action)
        if dlp.blocked:
            raise refused("data it does not let through", dlp.blocked, param)
    flagged: tuple[str, ...] = ()
    failed_open = False
    if policy.prompt:
        flagged, failed_open = await _moderate(body, deps, ctx, policy, param, telemetry)
    answer = None
    if policy.answer or policy.dlp:
        try:
            conversation = tuple(guard_messages(guard_conversation(body, ctx.route)))
        except ValueError:
            conversation = ()
        answer = AnswerCheck(policy, conversation, deps.config.guard_window_tokens, AnswerVerdicts(counted=counted),
                             (flagged, dlp.flagged, dlp.masked), dlp.placeholders if policy.unmask_answer else {})
    check = PromptCheck(policy, flagged, dlp.flagged, dlp.masked, failed_open, answer, counted)
    ctx.guardrails = check
    if dlp.changed:  # the handler, and everything after it, sees only the placeholders
        raw = json.dumps(body, ensure_ascii=False).encode()
        request = replace(request, body=raw, headers={**request.headers, "content-length": str(len(raw))})
    response = await call_next(request, deps, ctx)
    header = check.header  # a whole answer's verdicts are in by now; a stream's are still to come
    if header is not None:
        response.headers[HEADER] = header
    return response


async def _moderate(body: dict, deps: Deps, ctx: RequestContext, policy: Policy, param: str,
                    telemetry: "_Counter") -> tuple[tuple[str, ...], bool]:
    """The guard's verdict on the (masked) prompt under `policy.prompt`: raises the 400 for a
    blocked category, or the 503 of a failed guard under GUARD_FAIL=closed; else (the flagged
    categories, whether a failed guard was passed open)."""
    try:
        messages = guard_messages(guard_conversation(body, ctx.route))
    except ValueError:  # nothing to classify (no text): the handler answers for an empty prompt
        return (), False
    try:
        if deps.guard is None:
            raise BindingError("no guard model is configured")
        verdict = await asyncio.wait_for(deps.guard.classify(messages), deps.config.guard_timeout_seconds)
    except (BindingError, asyncio.TimeoutError) as exc:
        telemetry.count_guardrail("prompt", "guard_error", deps.config.guard_fail)
        detail = redact(str(exc) or type(exc).__name__)  # a guard's text may quote the prompt
        if deps.config.guard_fail == "open":
            deps.log.warning("the content guard failed (%s); GUARD_FAIL=open lets the prompt through", detail)
            return (), True
        raise GatewayError(ErrorKind.UNAVAILABLE, "The content guard is unavailable, so the prompt cannot be checked; retry later.",
                           code="guard_unavailable", detail=f"the content guard failed: {detail}") from None
    blocked = tuple(c for c in verdict.categories if policy.prompt.get(c) == "block")
    flagged = tuple(c for c in verdict.categories if policy.prompt.get(c) == "flag")
    for category in blocked:
        telemetry.count_guardrail("prompt", category, "block")
    for category in flagged:
        telemetry.count_guardrail("prompt", category, "flag")
    if blocked:
        raise refused("categories", blocked, param)
    return flagged, False
