"""The prompt's guardrails through `app.handle`: the scripted guard at the binding seam (the
`ContentGuard` port), the scripted AI behind it, and what each policy action does to a request
before any inference: block (400 content_filter), mask (the model sees only placeholders), flag
(the header); the guard's failures under GUARD_FAIL closed and open; a key's own policy."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

import pytest

from edgellm.access.keys import KeyRing, new_key
from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.guardrails.policy import parse_policy
from edgellm.http import Request
from edgellm.ports import BindingError
from edgellm.telemetry.exposition import families, render_text
from edgellm_local.doubles.guard import ScriptedGuard
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.kv import SqliteKV

CARD = "4111 1111 1111 1111"
EMAIL = "jane.doe@example.com"
SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
PHONE = "+44 20 7946 0958"


def deps_with(policy: dict[str, Any], guard: Any = None, ai: Any = None, **config: Any) -> Deps:
    return Deps(config=Config(open_access=True, guardrails=parse_policy(policy), **config), ai=ai or ScriptedAI(),
                guard=guard, log=logging.getLogger("edgellm.test"))


def chat(text: str, *, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None, **extra: Any) -> Request:
    if path == "/v1/completions":
        body: dict[str, Any] = {"prompt": text}
    elif path == "/v1/responses":
        body = {"model": "@cf/meta/llama-2-7b-chat-int8", "input": text}
    else:
        body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]}
    raw = json.dumps({**body, **extra}).encode()
    return Request("POST", f"http://edge.test{path}", {"content-type": "application/json", **(headers or {})}, raw)


def error_of(response: Any) -> dict[str, Any]:
    return json.loads(response.body)["error"]


def sent_to_model(ai: ScriptedAI) -> str:
    return json.dumps([inputs for _, inputs in ai.calls])


GENERATION_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                     "/client/v4/accounts/acc/ai/run/@cf/meta/llama-2-7b-chat-int8"]


@pytest.mark.parametrize("path", GENERATION_ROUTES)
async def test_a_blocked_category_refuses_the_prompt_before_any_inference(path: str) -> None:
    ai = ScriptedAI()
    guard = ScriptedGuard(rules=[("how to build", "unsafe\nS1,S10")])
    deps = deps_with({"moderation": {"prompt": {"S1": "block", "S10": "block"}}}, guard, ai)
    body = {"prompt": "how to build it"} if "/ai/run/" in path else {}
    request = chat("how to build it", path=path) if not body else Request("POST", f"http://edge.test{path}", {}, json.dumps(body).encode())
    response = await handle(request, deps)
    assert response.status == 400
    text = response.body.decode()
    assert "content_filter" in text and "S1, S10" in text
    assert ai.calls == []  # refused before any inference
    assert guard.calls  # the guard judged it
    assert deps.state.telemetry.guardrails[("prompt", "S1", "block")] == 1


async def test_a_flagged_category_passes_and_says_so() -> None:
    ai = ScriptedAI()
    guard = ScriptedGuard(rules=[("a lock", "unsafe\nS2")])
    deps = deps_with({"moderation": {"prompt": {"S1": "block", "S2": "flag"}}}, guard, ai)
    response = await handle(chat("how do I pick a lock"), deps)
    assert response.status == 200 and ai.calls
    assert response.headers["x-edgellm-guardrails"] == "flagged; categories=S2"
    clean = await handle(chat("what is the weather"), deps)
    assert clean.status == 200 and "x-edgellm-guardrails" not in clean.headers
    # a category the policy does not name is allowed, and not flagged
    guard.rules = [("weather", "unsafe\nS5")]
    assert "x-edgellm-guardrails" not in (await handle(chat("what is the weather"), deps)).headers


async def test_a_blocked_detector_refuses_the_prompt_naming_the_detector_never_the_value() -> None:
    ai = ScriptedAI()
    deps = deps_with({"dlp": {"secret": "block", "email": "mask"}}, ai=ai)
    response = await handle(chat(f"deploy with {SECRET} and mail {EMAIL}"), deps)
    assert response.status == 400
    error = error_of(response)
    assert error["code"] == "content_filter" and "secret" in error["message"]
    assert SECRET not in response.body.decode() and EMAIL not in response.body.decode()
    assert ai.calls == []


@pytest.mark.parametrize("path", GENERATION_ROUTES[:3])
async def test_a_masked_finding_never_reaches_the_model(path: str) -> None:
    ai = ScriptedAI()
    deps = deps_with({"dlp": {"payment_card": "mask", "email": "mask"}}, ai=ai)
    response = await handle(chat(f"charge {CARD} and mail {EMAIL}, again {EMAIL}", path=path), deps)
    assert response.status == 200, response.body
    sent = sent_to_model(ai)
    assert CARD not in sent and EMAIL not in sent and "4111" not in sent
    assert "[PAYMENT_CARD_1]" in sent and sent.count("[EMAIL_1]") == 2  # one value, one placeholder
    assert response.headers["x-edgellm-guardrails"] == "masked; detectors=email,payment_card"


async def test_a_flagged_detector_passes_unchanged() -> None:
    ai = ScriptedAI()
    deps = deps_with({"dlp": {"phone": "flag"}}, ai=ai)
    response = await handle(chat(f"call me on {PHONE}"), deps)
    assert response.status == 200 and PHONE in sent_to_model(ai)
    assert response.headers["x-edgellm-guardrails"] == "flagged; detectors=phone"
    assert deps.state.telemetry.guardrails[("prompt", "phone", "flag")] == 1


async def test_the_guard_judges_the_masked_prompt() -> None:
    guard = ScriptedGuard()
    deps = deps_with({"dlp": {"email": "mask"}, "moderation": {"prompt": {"S1": "block"}}}, guard)
    assert (await handle(chat(f"write to {EMAIL}"), deps)).status == 200
    assert EMAIL not in json.dumps(guard.calls) and "[EMAIL_1]" in json.dumps(guard.calls)


@pytest.mark.parametrize("failure", ["error", "timeout", "unparsable", "no guard"])
async def test_a_failing_guard_closed_is_a_503_and_open_lets_the_prompt_through(failure: str) -> None:
    policy = {"moderation": {"prompt": {"S1": "block"}}}

    def guard() -> ScriptedGuard | None:
        if failure == "no guard":
            return None
        made = ScriptedGuard(default="I cannot tell" if failure == "unparsable" else "safe")
        if failure == "error":
            made.fail = BindingError("the guard model is overloaded")
        if failure == "timeout":
            made.gate = asyncio.Event()  # never set: the call never answers
        return made

    ai = ScriptedAI()
    closed = deps_with(policy, guard(), ai, guard_timeout_seconds=0.05)
    response = await handle(chat("hello"), closed)
    assert response.status == 503 and response.headers["retry-after"]
    assert error_of(response)["code"] == "guard_unavailable" and ai.calls == []
    opened = deps_with(policy, guard(), ai, guard_timeout_seconds=0.05, guard_fail="open")
    response = await handle(chat("hello"), opened)
    assert response.status == 200 and ai.calls
    assert opened.state.telemetry.guardrails[("prompt", "guard_error", "open")] == 1


async def test_a_keys_own_policy_replaces_the_gateways() -> None:
    kv = SqliteKV()
    strict = new_key("acme", 0.0, guardrails=json.dumps({"dlp": {"email": "block"}}))
    plain = new_key("acme", 0.0)
    for made in (strict, plain):
        await KeyRing(kv).put(made.record)
    ai = ScriptedAI()
    deps = replace(deps_with({"dlp": {"email": "flag"}}, ai=ai), kv=kv, config=Config(guardrails=parse_policy({"dlp": {"email": "flag"}})))
    auth = lambda made: {"authorization": f"Bearer {made.api_key}"}  # noqa: E731
    assert (await handle(chat(f"mail {EMAIL}", headers=auth(strict)), deps)).status == 400
    response = await handle(chat(f"mail {EMAIL}", headers=auth(plain)), deps)
    assert response.status == 200 and response.headers["x-edgellm-guardrails"] == "flagged; detectors=email"


async def test_embeddings_are_not_checked() -> None:
    deps = deps_with({"dlp": {"email": "block"}}, embedding_models=("@cf/baai/bge-small-en-v1.5",))
    request = Request("POST", "http://edge.test/v1/embeddings", {}, json.dumps(
        {"model": "@cf/baai/bge-small-en-v1.5", "input": f"mail {EMAIL}"}).encode())
    response = await handle(request, deps)
    assert response.status != 400 or "content_filter" not in response.body.decode()


async def test_a_prompt_past_the_scan_limit_is_refused_under_a_dlp_policy() -> None:
    from edgellm.guardrails.prompt import SCAN_LIMIT

    ai = ScriptedAI()
    deps = deps_with({"dlp": {"email": "mask"}}, ai=ai, max_body_bytes=4 * SCAN_LIMIT)
    response = await handle(chat("word " * (SCAN_LIMIT // 5 + 10)), deps)
    assert response.status == 413 and error_of(response)["code"] == "guardrails_scan_limit" and ai.calls == []


async def test_verdicts_are_on_the_metrics_page_by_label_and_action() -> None:
    guard = ScriptedGuard(rules=[("lock", "unsafe\nS2")])
    deps = deps_with({"moderation": {"prompt": {"S2": "flag"}}, "dlp": {"email": "mask"}}, guard)
    await handle(chat(f"pick a lock for {EMAIL}"), deps)
    page = render_text(families(deps))
    assert 'guardrails_verdicts_total{' in page
    assert 'label="S2"' in page and 'label="email"' in page and EMAIL not in page


async def test_findings_are_redacted_in_the_log_line_and_absent_from_usage_rows(caplog: pytest.LogCaptureFixture) -> None:
    rows: list[Any] = []

    class Rows:
        def record_now(self, event: Any) -> None:
            rows.append(event)

        async def record(self, event: Any) -> None:
            rows.append(event)

    deps = replace(deps_with({"dlp": {"email": "flag"}}, log_prompts=True), usage=Rows())
    with caplog.at_level(logging.INFO):
        response = await handle(chat(f"card {CARD}, key {SECRET}, mail {EMAIL}"), deps)
    assert response.status == 200
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "[payment_card ****1111]" in logged and "[secret:" in logged and "[email]" in logged
    assert rows
    recorded = repr(rows)
    for value in (CARD, SECRET, EMAIL):
        assert value not in logged and value not in recorded


async def test_the_admin_route_shows_the_gateways_policy_and_a_keys() -> None:
    kv = SqliteKV()
    own = new_key("acme", 0.0, guardrails=json.dumps({"dlp": {"email": "block"}}))
    unmasking = new_key("acme", 0.0, guardrails=json.dumps({"dlp": {"email": "mask"}, "unmask_answer": True}))
    plain = new_key("acme", 0.0)
    for made in (own, plain, unmasking):
        await KeyRing(kv).put(made.record)
    gateway = {"moderation": {"prompt": {"S1": "block"}}}
    deps = replace(deps_with(gateway, ScriptedGuard()), kv=kv,
                   config=Config(admin_token="t0ken", guardrails=parse_policy(gateway)))
    admin = {"authorization": "Bearer t0ken"}

    async def get(query: str = "", headers: dict[str, str] = admin) -> Any:
        return await handle(Request("GET", f"http://edge.test/admin/guardrails{query}", headers, b""), deps)

    shown = json.loads((await get()).body)
    assert shown["scope"] == "gateway" and shown["policy"]["moderation"]["prompt"] == {"S1": "block"}
    assert shown["guard"]["configured"] is True and shown["guard"]["fail"] == "closed"
    keyed = json.loads((await get(f"?key={own.record.key_id}")).body)
    assert keyed["scope"] == "key" and keyed["policy"]["dlp"] == {"email": "block"}
    assert shown["policy"]["unmask_answer"] is False and keyed["policy"]["unmask_answer"] is False  # said when off too
    assert json.loads((await get(f"?key={unmasking.record.key_id}")).body)["policy"]["unmask_answer"] is True
    assert json.loads((await get(f"?key={plain.record.key_id}")).body)["scope"] == "gateway"
    assert (await get("?key=nosuchkey000")).status == 404
    assert (await get(headers={"authorization": f"Bearer {own.api_key}"})).status == 403  # a tenant's key is no admin


async def test_a_blocked_and_a_masked_prompt_each_leave_a_usage_row_of_category_and_action() -> None:
    from edgellm_local.emulator.usage_sqlite import SqliteUsage

    guard = ScriptedGuard(rules=[("how to build", "unsafe\nS1")])
    policy = {"moderation": {"prompt": {"S1": "block"}}, "dlp": {"email": "mask"}}
    deps = replace(deps_with(policy, guard, admin_token="t0ken"), usage=SqliteUsage())
    assert (await handle(chat("how to build it"), deps)).status == 400
    assert (await handle(chat(f"mail {EMAIL}"), deps)).status == 200
    assert (await handle(chat("hello"), deps)).status == 200
    shown = await handle(Request("GET", "http://edge.test/admin/usage?group_by=route", {"authorization": "Bearer t0ken"}, b""), deps)
    report = json.loads(shown.body)
    assert report["totals"]["requests"] == 3
    assert report["totals"]["guardrails"] == {"prompt:S1:block": 1, "prompt:email:mask": 1}
    assert EMAIL not in shown.body.decode()


async def test_a_body_nested_too_deep_is_refused_before_the_layer_parses_it() -> None:
    """Pyodide dies on deep JSON instead of raising (the runtime notes): the layer never parses a
    body the handler's bounded parser would refuse; the caller gets that 400."""
    ai = ScriptedAI()
    deps = deps_with({"dlp": {"email": "mask"}, "moderation": {"prompt": {"S1": "block"}}}, guard=ScriptedGuard(), ai=ai)
    deep = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    request = Request("POST", "http://edge.test/v1/chat/completions", {"content-type": "application/json"}, deep)
    response = await handle(request, deps)
    assert response.status == 400 and error_of(response)["code"] == "json_too_deep" and ai.calls == []
