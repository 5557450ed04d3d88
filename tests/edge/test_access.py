"""API keys, tenants, rate limits, budgets and usage, through the local edge's real HTTP server."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgellm.access.keys import KeyRing, NewKey, new_key
from edgellm.config import Config
from edgellm_local.emulator.usage_sqlite import SqliteUsage

ADMIN = "admin-secret"
Q = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 8}


@pytest.fixture
def keyed(start_edge, make_deps, clock, tmp_path: Path):
    """A keyed edge (no open mode) with usage in SQLite; `mint(tenant, **limits)` adds a key."""
    deps = make_deps(config=Config(admin_token=ADMIN), clock=clock, usage=SqliteUsage(tmp_path / "usage.sqlite3"))
    ring = KeyRing(deps.kv)

    def mint(tenant: str, **limits: Any) -> NewKey:
        made = new_key(tenant, clock.now(), **limits)
        asyncio.run(ring.put(made.record))
        return made

    server = start_edge(deps)
    return server, deps, mint, ring


def chat(server, key: str | None, body: dict = Q, header: str = "authorization", **headers: str) -> httpx.Response:
    if key is not None:
        headers[header] = f"Bearer {key}" if header == "authorization" else key
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_no_key_wrong_key_and_both_header_forms(keyed) -> None:
    server, _, mint, _ = keyed
    key = mint("acme").api_key
    for path in ("/v1/chat/completions", "/v1/completions", f"/client/v4/accounts/a/ai/run/{Config().model}"):
        response = httpx.post(server.url + path, json={"prompt": "hi", **Q}, timeout=30)
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error", path
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert chat(server, key[:-1] + ("A" if key[-1] != "A" else "B")).status_code == 401  # wrong secret
    assert chat(server, "el-nosuchkey000.abcdefghijklmnopqrstuvwxyz").status_code == 401
    assert chat(server, key).status_code == 200
    assert chat(server, key, header="x-api-key").status_code == 200
    # public routes stay public
    assert httpx.get(server.url + "/healthz").json()["access"] == "keys"
    assert httpx.get(server.url + "/models").status_code == 200


def test_revoked_and_rotated_keys_are_refused(keyed, clock) -> None:
    server, _, mint, ring = keyed
    made = mint("acme")
    assert chat(server, made.api_key).status_code == 200
    clock.advance(2)  # KV takes one write per second per key
    asyncio.run(ring.put(replace(made.record, revoked=clock.now())))
    clock.advance(31)  # an isolate re-reads a key record after 30 s, as KV propagates writes
    response = chat(server, made.api_key)
    assert response.status_code == 401 and response.json()["error"]["code"] == "revoked_api_key"


def test_rotate_via_cli_functions(keyed, clock) -> None:
    from edgellm.access.keys import rotated
    server, _, mint, ring = keyed
    made = mint("acme", requests_per_minute=7)
    clock.advance(2)  # KV takes one write per second per key
    old, fresh = rotated(made.record, clock.now())
    asyncio.run(ring.put(fresh.record))
    asyncio.run(ring.put(old))
    assert fresh.record.tenant == "acme" and fresh.record.requests_per_minute == 7
    assert chat(server, made.api_key).status_code == 401
    assert chat(server, fresh.api_key).status_code == 200


def test_a_tenant_never_reads_or_overwrites_another_tenants_entry(keyed) -> None:
    server, _, mint, _ = keyed
    a, b = mint("alice").api_key, mint("bob").api_key
    first = chat(server, a)
    assert first.headers["cf-aig-cache-status"] == "MISS"
    server.drain()
    assert chat(server, a).headers["cf-aig-cache-status"] == "HIT"
    assert chat(server, b).headers["cf-aig-cache-status"] == "MISS"  # same prompt, other tenant
    # the attack: Bob sends Alice's custom key, then refreshes it with no-cache and other text
    custom = {"cf-aig-cache-key": "faq-1"}
    chat(server, a, **custom)
    server.drain()
    alice_answer = chat(server, a, **custom)
    assert alice_answer.headers["cf-aig-cache-status"] == "HIT"
    bob_read = chat(server, b, **custom)
    assert bob_read.headers["cf-aig-cache-status"] == "MISS"
    other = {**Q, "messages": [{"role": "user", "content": "Write something else entirely"}]}
    chat(server, b, other, **custom, **{"cache-control": "no-cache"})
    server.drain()
    again = chat(server, a, **custom)
    assert again.headers["cf-aig-cache-status"] == "HIT"
    assert again.json()["choices"][0]["message"] == alice_answer.json()["choices"][0]["message"]
    assert again.headers["x-edgellm-cache-key"] != bob_read.headers["x-edgellm-cache-key"]


def test_sharing_needs_both_sides(keyed) -> None:
    server, _, mint, _ = keyed
    s1, s2, private = mint("s1", share_cache=True).api_key, mint("s2", share_cache=True).api_key, mint("p").api_key
    assert chat(server, s1).headers["cf-aig-cache-status"] == "MISS"
    server.drain()
    assert chat(server, s2).headers["cf-aig-cache-status"] == "HIT"  # both allow sharing
    assert chat(server, private).headers["cf-aig-cache-status"] == "MISS"  # p does not share: never reads the pool
    server.drain()
    body = {**Q, "messages": [{"role": "user", "content": "private question"}]}
    chat(server, private, body)
    server.drain()
    assert chat(server, private, body).headers["cf-aig-cache-status"] == "HIT"
    assert chat(server, s1, body).headers["cf-aig-cache-status"] == "MISS"  # p's entry never reaches the pool


def test_admin_needs_the_token_and_tenants_see_their_own(keyed) -> None:
    server, _, mint, _ = keyed
    a, b = mint("alice").api_key, mint("bob").api_key
    url = server.url + "/admin/cache"
    assert httpx.get(url + "/stats").status_code == 401
    assert httpx.get(url + "/stats", headers={"authorization": "Bearer nope"}).status_code == 401
    assert httpx.post(url + "/preload", json={"requests": [Q]}, headers={"authorization": f"Bearer {a}"}).status_code == 403
    assert httpx.get(url + "/stats", headers={"authorization": f"Bearer {ADMIN}"}).json()["scope"] == "isolate"
    first = chat(server, a)
    server.drain()
    stats_a = httpx.get(url + "/stats", headers={"authorization": f"Bearer {a}"}).json()
    stats_b = httpx.get(url + "/stats", headers={"authorization": f"Bearer {b}"}).json()
    assert (stats_a["tenant"], stats_a["entries"], stats_b["entries"]) == ("alice", 1, 0)
    # Bob purging Alice's entry by its hash purges in his own scope: Alice's entry stays
    digest = first.headers["x-edgellm-cache-key"]
    assert httpx.post(url + "/purge", json={"key": digest}, headers={"authorization": f"Bearer {b}"}).status_code == 200
    assert chat(server, a).headers["cf-aig-cache-status"] == "HIT"
    assert httpx.post(url + "/purge", json={"key": digest}, headers={"authorization": f"Bearer {a}"}).status_code == 200
    assert chat(server, a).headers["cf-aig-cache-status"] == "MISS"


def test_rate_limit_429_then_recovery_on_the_injected_clock(keyed, clock) -> None:
    server, _, mint, _ = keyed
    key = mint("acme", requests_per_minute=3).api_key
    chat(server, key)
    server.drain()
    assert [chat(server, key).status_code for _ in range(2)] == [200, 200]  # HITs count as requests
    refused = chat(server, key)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_error" and int(refused.headers["retry-after"]) >= 1
    clock.advance(int(refused.headers["retry-after"]))
    assert chat(server, key).status_code == 200


def test_tokens_per_minute_counts_misses_not_hits(keyed, clock) -> None:
    server, _, mint, _ = keyed
    key = mint("acme", tokens_per_minute=1, requests_per_minute=0).api_key
    assert chat(server, key).status_code == 200  # the window had tokens left; this spends them
    server.drain()
    other = {**Q, "messages": [{"role": "user", "content": "another"}]}
    assert chat(server, key, other).status_code == 429
    clock.advance(60)
    assert chat(server, key, other).status_code == 200


def test_hits_are_free_of_tokens(keyed) -> None:
    server, _, mint, _ = keyed
    key = mint("acme", tokens_per_minute=10_000, requests_per_minute=0).api_key
    chat(server, key)
    server.drain()
    state = server.app.deps.state.access
    spent = state.windows[f"{key[3:15]}/tokens"][1]
    for _ in range(3):
        assert chat(server, key).headers["cf-aig-cache-status"] == "HIT"
    assert state.windows[f"{key[3:15]}/tokens"][1] == spent > 0


def test_budget_exhaustion(keyed) -> None:
    server, _, mint, _ = keyed
    key = mint("acme", token_budget=27, requests_per_minute=0).api_key  # Q's prompt, estimated (26), and one token
    first = chat(server, key)
    assert first.status_code == 200  # admitted with its max_tokens cut to what is left: spent after this one
    assert first.json()["usage"]["completion_tokens"] <= 1
    server.drain()
    refused = chat(server, key, {**Q, "messages": [{"role": "user", "content": "more"}]})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"


def test_model_allow_list(keyed) -> None:
    server, _, mint, _ = keyed
    key = mint("acme", models=("@cf/meta/llama-2-7b-chat-hf-lora",)).api_key
    refused = chat(server, key)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    assert chat(server, key, {**Q, "model": "@cf/meta/llama-2-7b-chat-hf-lora"}).status_code == 200


def test_usage_totals_equal_the_requests_sent(keyed) -> None:
    server, _, mint, _ = keyed
    a, b = mint("alice").api_key, mint("bob").api_key
    statuses = [chat(server, a).status_code for _ in range(3)]
    server.drain()
    statuses += [chat(server, b).status_code, chat(server, b, {"messages": "bad"}).status_code]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**Q, "stream": True},
                      headers={"authorization": f"Bearer {b}", "cf-aig-skip-cache": "true"}) as stream:
        stream.read()
    server.drain()
    admin = {"authorization": f"Bearer {ADMIN}"}
    report = httpx.get(server.url + "/admin/usage", params={"group_by": "tenant,model,day"}, headers=admin).json()
    assert report["totals"]["requests"] == 6
    by_tenant = {row["tenant"]: row for row in report["data"] if row["model"]}
    assert by_tenant["alice"]["requests"] == 3 and by_tenant["alice"]["hits"] >= 1
    assert report["totals"]["errors"] == 1
    assert report["totals"]["cost_usd"] > 0 and report["totals"]["saved_usd"] > 0
    assert report["totals"]["completion_tokens"] > 0
    own = httpx.get(server.url + "/admin/usage", headers={"authorization": f"Bearer {a}"}).json()
    assert own["tenant"] == "alice" and own["totals"]["requests"] == 3
    assert httpx.get(server.url + "/admin/usage", params={"group_by": "nope"}, headers=admin).status_code == 400
    assert httpx.get(server.url + "/admin/usage").status_code == 401


def test_cors_allow_list_through_the_server_and_pages_send_security_headers(start_edge) -> None:
    server = start_edge(config=Config(open_access=True, cors_origins=("https://partner.example",)))
    for origin, allowed in (("https://partner.example", True), (server.url, True), ("http://localhost:3000", True),
                            ("https://evil.example", False)):
        response = httpx.post(server.url + "/v1/chat/completions", json=Q, headers={"origin": origin}, timeout=60)
        assert (response.headers.get("access-control-allow-origin") == origin) is allowed, origin
        preflight = httpx.options(server.url + "/v1/chat/completions", headers={"origin": origin, "access-control-request-method": "POST"})
        assert ("access-control-allow-origin" in preflight.headers) is allowed, origin
    assert httpx.get(server.url + "/models", headers={"origin": "https://evil.example"}).headers["access-control-allow-origin"] == "*"
    for page in ("/", "/chat", "/tokenizer"):
        headers = httpx.get(server.url + page).headers
        assert headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert httpx.get(server.url + "/_headers").status_code == 404


def test_one_structured_record_per_request_without_prompt_text(keyed, caplog) -> None:
    import json as json_module
    import logging

    from edgellm_local.emulator.access_log import AccessLineFormatter

    server, _, mint, _ = keyed
    key = mint("acme").api_key
    secret_prompt = {**Q, "messages": [{"role": "user", "content": "my secret prompt"}]}
    with caplog.at_level(logging.INFO, logger="edgellm.test.access"):
        chat(server, key, secret_prompt, **{"cf-ray": "8f2a1b3c4d5e6f70-AMS"})
        httpx.get(server.url + "/chat")
        server.drain()
    records = [r for r in caplog.records if r.name == "edgellm.test.access"]
    api = next(r for r in records if r.edgellm["path"] == "/v1/chat/completions")
    assert api.edgellm["request_id"] == "8f2a1b3c4d5e6f70-AMS"
    assert (api.edgellm["status"], api.edgellm["cache"], api.edgellm["route"], api.edgellm["tenant"]) == (200, "MISS", "/v1/chat/completions", "acme")
    assert api.edgellm["handler"] == "create_chat_completion"
    assert json_module.loads(api.getMessage()) == api.edgellm
    assert all("secret" not in r.getMessage() for r in caplog.records)
    asset = next(r for r in records if r.edgellm["path"] == "/chat")
    assert asset.edgellm["route"] == "asset" and asset.edgellm["status"] == 200
    line = AccessLineFormatter().format(api)
    assert line.startswith("POST /v1/chat/completions 200 MISS create_chat_completion ") and "tenant=acme" in line
