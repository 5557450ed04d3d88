"""Access in the core: rate windows on an injected clock, the rate-limit binding, tenancy of keys."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

import pytest

from edgellm.access.guard import Principal, authenticate
from edgellm.tenancy import SHARED_TENANT
from edgellm.access.keys import KeyRecord, KeyRing, new_key, parse_api_key
from edgellm.access.ratelimit import take_request
from edgellm.app import handle
from edgellm.cache.key import CacheScope, build_custom_key
from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.http import Request
from edgellm.ports import BindingError
from edgellm.deps import Deps
from edgellm.state import AccessState
from edgellm_local.emulator.kv import SqliteKV
from edgellm_local.doubles.scripted import ScriptedAI


def test_request_window_refuses_then_recovers_on_the_clock(clock) -> None:
    state = AccessState()
    for _ in range(2):
        take_request(state, "k", 2, clock.now())
    with pytest.raises(GatewayError) as refused:
        take_request(state, "k", 2, clock.now())
    assert refused.value.status == 429 and refused.value.retry_after == 60
    clock.advance(59)
    with pytest.raises(GatewayError) as still:
        take_request(state, "k", 2, clock.now())
    assert still.value.retry_after == 1
    clock.advance(1)
    take_request(state, "k", 2, clock.now())  # a new window
    take_request(state, "other", 2, clock.now())  # keys never share a window


def test_key_format_and_records() -> None:
    made = new_key("acme", 0.0)
    key_id, secret = parse_api_key(made.api_key)  # type: ignore[misc]
    assert made.record.key_id == key_id and made.record.matches(secret) and not made.record.matches(secret + "x")
    assert secret not in made.record.encode().decode()
    assert KeyRecord.decode(made.record.encode()) == made.record
    for bad in ("", "el-short.x", "Bearer el-abc", made.api_key + "\n"):
        assert parse_api_key(bad) is None
    for tenant in (SHARED_TENANT, "", "a/b", "x" * 65):
        with pytest.raises(ValueError):
            new_key(tenant, 0.0)


def test_custom_keys_and_flights_never_cross_tenants() -> None:
    alice, bob = (Principal(t, "k" + t, new_key(t, 0).record) for t in ("alice", "bob"))
    keys = {p.tenant: build_custom_key("faq", CacheScope(p.cache_tenant, "default")) for p in (alice, bob)}
    assert keys["alice"].kv_key != keys["bob"].kv_key and keys["alice"].digest != keys["bob"].digest
    sharing = [Principal(t, "k", replace(new_key(t, 0).record, share_cache=True)) for t in ("s1", "s2")]
    assert {p.cache_tenant for p in sharing} == {SHARED_TENANT}


async def test_the_rate_limit_binding_refusing_is_a_429(clock) -> None:
    class Refusing:
        async def limit(self, key: str) -> bool:
            return False

    kv = SqliteKV(clock=clock)
    made = new_key("acme", clock.now(), requests_per_minute=0)
    await KeyRing(kv).put(made.record)
    deps = Deps(config=Config(), ai=ScriptedAI(), kv=kv, clock=clock, log=logging.getLogger("edgellm.test"), rate_limiter=Refusing())
    request = Request("POST", "http://edge.test/v1/completions", {"authorization": f"Bearer {made.api_key}"}, json.dumps({"prompt": "x"}).encode())
    response = await handle(request, deps)
    assert response.status == 429 and response.headers["retry-after"] == "60"
    assert json.loads(response.body)["error"]["type"] == "rate_limit_error"
    open_deps = replace(deps, config=Config(open_access=True))
    no_key = Request("POST", "http://edge.test/v1/completions", {}, json.dumps({"prompt": "x"}).encode())
    assert (await handle(no_key, open_deps)).status == 200  # open mode: no key, no per-key limit
    assert (await handle(no_key, deps)).status == 401


async def test_open_mode_ignores_a_foreign_api_key_but_not_a_bad_edgellm_key(clock) -> None:
    """SDKs must send some api_key: in open mode a value that is no EdgeLLM key is no key, while
    an `el-` key that is malformed, unknown or revoked is refused in every mode."""
    kv = SqliteKV(clock=clock)
    made = new_key("acme", clock.now())
    await KeyRing(kv).put(replace(made.record, revoked=clock.now()))
    open_deps = Deps(config=Config(open_access=True), ai=ScriptedAI(), kv=kv, clock=clock, log=logging.getLogger("edgellm.test"))
    keyed_deps = replace(open_deps, config=Config())

    def call(key: str) -> Request:
        return Request("POST", "http://edge.test/v1/completions", {"authorization": f"Bearer {key}"}, json.dumps({"prompt": "x"}).encode())

    assert (await handle(call("sk-unused-locally"), open_deps)).status == 200
    assert (await handle(call("sk-unused-locally"), keyed_deps)).status == 401
    for bad in (made.api_key, "el-short", "el-abcdefghijkl." + "x" * 30):
        assert (await handle(call(bad), open_deps)).status == 401, bad


# --- a streamed answer closed early: its admission, its binding stream and its usage -----------

STREAMED = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    "/v1/completions": {"prompt": "hi", "stream": True},
    f"/client/v4/accounts/acc/ai/run/{Config().model}": {"prompt": "hi", "stream": True},
    "/v1/responses": {"input": "hi", "stream": True},
}


@pytest.mark.parametrize("cached", [False, True], ids=["bypass", "miss"])
@pytest.mark.parametrize("read", [0, 1], ids=["unread", "partly-read"])
@pytest.mark.parametrize("path", list(STREAMED))
async def test_a_stream_closed_early_frees_its_admission_closes_the_binding_and_is_recorded_once(
    path: str, read: int, cached: bool, clock, tmp_path
) -> None:
    """The server closes a body whose client left, possibly before its first read. Every layer
    between the body and the generation (the usage recorder, the Finish tap, the renderer) must
    pass the close on, or the admission ticket leaks (after `max_waiting_generations` such
    leaks every miss in the isolate is a 503), the binding keeps streaming, and nothing is recorded."""
    from edgellm_local.emulator.usage_sqlite import SqliteUsage

    ai, usage, background = ScriptedAI(open_streams=True), SqliteUsage(tmp_path / "usage.sqlite3"), []
    deps = Deps(config=Config(open_access=True), ai=ai, kv=SqliteKV(clock=clock) if cached else None, clock=clock,
                log=logging.getLogger("edgellm.test"), usage=usage, wait_until=background.append)
    body = {**STREAMED[path], "temperature": 0} if cached else STREAMED[path]
    response = await handle(Request("POST", f"http://edge.test{path}", {"content-type": "application/json"}, json.dumps(body).encode()), deps)
    assert response.status == 200 and response.is_streaming
    assert response.headers["cf-aig-cache-status"] == ("MISS" if cached else "BYPASS")
    assert deps.state.admission.active == 1
    for _ in range(read):
        await anext(response.body)  # type: ignore[arg-type]
    await response.body.aclose()  # type: ignore[union-attr]
    await response.body.aclose()  # type: ignore[union-attr]  # a second close changes nothing
    assert deps.state.admission.active == 0
    assert [s.closed for s in ai.streams] == [True]
    await asyncio.gather(*background)
    rows = await usage.query(0, clock.now() + 1, ())
    assert rows[0]["requests"] == 1


# --- a tenant's cache stats when KV fails ----------------------------------------------------


@dataclass
class ListFailingKV:
    """The local KV binding whose LIST fails with `error` (as a KV outage or a refused call reaches
    the core through the runtime adapter); GET and PUT still work, so keys still authenticate."""

    inner: SqliteKV
    error: BindingError

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> dict[str, Any]:
        raise self.error


def _retryable(message: str) -> BindingError:
    error = BindingError(message)
    error.retryable = True
    return error


@pytest.mark.parametrize(("error", "status", "code"), [
    (_retryable("KV LIST failed: 503 Service Unavailable"), 503, "kv_unavailable"),
    (BindingError("KV LIST failed: 500 Internal Error"), 502, "kv_error"),
])
async def test_a_tenants_cache_stats_when_kv_list_fails_is_a_502_or_503_with_retry_after(
    error: BindingError, status: int, code: str, clock, caplog: pytest.LogCaptureFixture
) -> None:
    kv = SqliteKV(clock=clock)
    made = new_key("acme", clock.now())
    await KeyRing(kv).put(made.record)
    deps = Deps(config=Config(), ai=ScriptedAI(), kv=ListFailingKV(kv, error), clock=clock, log=logging.getLogger("edgellm.test"))
    response = await handle(Request("GET", "http://edge.test/admin/cache/stats", {"authorization": f"Bearer {made.api_key}"}, b""), deps)
    assert response.status == status, (response.status, response.body)
    assert response.headers["retry-after"] == "5"
    body = json.loads(response.body)["error"]
    assert set(body) == {"message", "type", "param", "code", "request_id"} and body["code"] == code and "KV" in body["message"]
    # the binding's own text goes to the edge's log, never to the caller
    assert "KV LIST failed" not in body["message"] and "KV LIST failed" in caplog.text


@pytest.mark.parametrize("method,path,expected", [
    ("GET", "/v1/responses/resp_0123abcd", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/resp_ffff", "/v1/responses/{response_id}"),
    ("POST", "/v1/chat/completions", "/v1/chat/completions"),
    ("POST", "/client/v4/accounts/abc/ai/run/@cf/meta/m", "workers-ai"),
])
def test_the_usage_route_is_the_routes_template_not_the_raw_path(method: str, path: str, expected: str) -> None:
    """Every response id was its own route value, so usage could not be grouped."""
    from edgellm.app import route_name

    assert route_name(Request(method, "https://edge.example" + path)) == expected


async def test_open_mode_has_one_caller_per_isolate_and_config(clock) -> None:
    """Open mode's principal is made once per Config (it is immutable) and never outlives it:
    another tenant configured is another caller."""
    deps = Deps(config=Config(open_access=True), ai=ScriptedAI(), clock=clock, log=logging.getLogger("edgellm.test"))

    def call() -> Request:
        return Request("POST", "http://edge.test/v1/chat/completions", {}, b"{}")

    first = await authenticate(call(), deps)
    assert first is not None and await authenticate(call(), deps) is first and first.tenant == deps.config.tenant
    other = replace(deps, config=Config(open_access=True, tenant="elsewhere"))
    theirs = await authenticate(call(), other)
    assert theirs is not None and theirs.tenant == "elsewhere" and theirs.scope.tenant == "elsewhere"


def test_a_request_within_one_configs_bounds_is_checked_again_under_another() -> None:
    """The parse memo shares one request among repeated bodies, so its input bounds are checked
    once per config; a config with tighter bounds (a new isolate's, a test's) checks it again."""
    from edgellm.access.guard import check_input_limits
    from edgellm.generation import GenerationRequest

    request = GenerationRequest("@cf/m", {"messages": [{"role": "user", "content": "hi"}] * 3})
    roomy = Config()
    check_input_limits(request, roomy)
    check_input_limits(request, roomy)  # within: the same answer, from what it learned the first time
    with pytest.raises(GatewayError) as refused:
        check_input_limits(request, Config(fixed_max_messages=2))
    assert refused.value.code == "too_many_messages"
    check_input_limits(request, roomy)
