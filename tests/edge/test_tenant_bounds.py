"""Tenant bounds and operator paths,
through the local edge's real HTTP server: reserved tenant names, custom keys in the shared pool,
`x-ratelimit-*` headers, revocation that takes effect now, and one cache key for -0.0 and 0."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgellm.access.keys import KeyRing, NewKey, new_key
from edgellm.config import Config
from edgellm_local.emulator.usage_sqlite import SqliteUsage

ADMIN = "admin-secret"
EDGELLM = Path(sys.executable).with_name("edgellm")
Q = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 8}


@pytest.fixture
def keyed(start_edge, make_deps, clock, tmp_path: Path):
    deps = make_deps(config=Config(admin_token=ADMIN), clock=clock, usage=SqliteUsage(tmp_path / "usage.sqlite3"))
    ring = KeyRing(deps.kv)

    def mint(tenant: str, **limits: Any) -> NewKey:
        made = new_key(tenant, clock.now(), **limits)
        asyncio.run(ring.put(made.record))
        return made

    return start_edge(deps), deps, mint, ring


def chat(server: Any, key: str | None, body: dict = Q, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_a_key_record_for_a_reserved_tenant_is_refused(keyed, clock) -> None:
    server, _, mint, ring = keyed
    admin = {"authorization": f"Bearer {ADMIN}"}
    assert httpx.post(server.url + "/admin/cache/preload", json={"requests": [Q]}, headers=admin).status_code == 200
    made = mint("acme")
    for tenant in ("default", "DEFAULT", "admin"):
        forged = replace(made.record, tenant=tenant)  # written to KV by hand, past the CLI's check
        clock.advance(2)  # KV takes one write per second per key
        asyncio.run(ring.put(forged))
        server.app.deps.state.access.keys = None  # the isolate reads the record again
        refused = chat(server, made.api_key)
        assert refused.status_code == 401 and "reserved" in refused.json()["error"]["message"], tenant
    with pytest.raises(ValueError, match="reserved"):
        new_key("default", 0)


def test_in_the_shared_pool_a_custom_key_is_the_choosers_own(keyed) -> None:
    server, _, mint, _ = keyed
    s1, s2 = mint("s1", share_cache=True).api_key, mint("s2", share_cache=True).api_key
    custom = {"cf-aig-cache-key": "faq-1"}
    assert chat(server, s1, **custom).headers["cf-aig-cache-status"] == "MISS"
    server.drain()
    mine = chat(server, s1, **custom)
    assert mine.headers["cf-aig-cache-status"] == "HIT"
    other = {**Q, "messages": [{"role": "user", "content": "Write something else entirely"}]}
    chat(server, s2, other, **custom, **{"cache-control": "no-cache"})  # the attack: overwrite s1's named entry
    server.drain()
    purge = httpx.post(server.url + "/admin/cache/purge", json={"cache_key": "faq-1"}, headers={"authorization": f"Bearer {s2}"})
    assert purge.status_code == 200
    again = chat(server, s1, **custom)
    assert again.headers["cf-aig-cache-status"] == "HIT"
    assert again.json()["choices"][0]["message"] == mine.json()["choices"][0]["message"]
    # identical requests without a custom key are still shared
    assert chat(server, s1).headers["cf-aig-cache-status"] == "MISS"
    server.drain()
    assert chat(server, s2).headers["cf-aig-cache-status"] == "HIT"


def _reset_seconds(value: str) -> int:
    match = re.fullmatch(r"(?:(\d+)m)?(\d+)s", value)
    assert match, value
    return int(match.group(1) or 0) * 60 + int(match.group(2))


def test_every_keyed_answer_says_its_rate_limits(keyed) -> None:
    server, _, mint, _ = keyed
    key = mint("acme", requests_per_minute=2, tokens_per_minute=5000).api_key
    first = chat(server, key)
    assert first.status_code == 200
    h = first.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "1")
    assert 0 < _reset_seconds(h["x-ratelimit-reset-requests"]) <= 60
    assert h["x-ratelimit-limit-tokens"] == "5000" and 0 <= int(h["x-ratelimit-remaining-tokens"]) < 5000
    assert 0 < _reset_seconds(h["x-ratelimit-reset-tokens"]) <= 60
    bad = chat(server, key, {"messages": "bad"})  # an error answer is keyed too
    assert bad.status_code == 400 and bad.headers["x-ratelimit-remaining-requests"] == "0"
    refused = chat(server, key)
    assert refused.status_code == 429 and refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert _reset_seconds(refused.headers["x-ratelimit-reset-requests"]) == int(refused.headers["retry-after"])
    unlimited = mint("other", requests_per_minute=0).api_key
    assert not any(name.startswith("x-ratelimit-") for name in chat(server, unlimited).headers)  # no limit, nothing to say


def test_revoke_now_drops_the_key_from_the_running_edges_cache(keyed, tmp_path: Path) -> None:
    server, _, mint, _ = keyed
    later, now = mint("acme"), mint("acme")
    assert chat(server, later.api_key).status_code == 200 and chat(server, now.api_key).status_code == 200
    plain = subprocess.run([str(EDGELLM), "keys", "revoke", "--state", str(tmp_path), later.record.key_id],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and "30 s" in plain.stdout, plain.stderr
    assert chat(server, later.api_key).status_code == 200  # cached: the delay the CLI states
    immediate = subprocess.run([str(EDGELLM), "keys", "revoke", "--state", str(tmp_path), now.record.key_id, "--now",
                                "--edge", server.url, "--admin-token", ADMIN], capture_output=True, text=True, timeout=60)
    assert immediate.returncode == 0, immediate.stderr
    refused = chat(server, now.api_key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "revoked_api_key"
    route = httpx.post(f"{server.url}/admin/keys/{later.record.key_id}/revoke", headers={"authorization": f"Bearer {ADMIN}"})
    assert route.status_code == 200 and route.json()["key_id"] == later.record.key_id
    assert chat(server, later.api_key).status_code == 401
    tenant_key = mint("acme").api_key
    assert httpx.post(f"{server.url}/admin/keys/{later.record.key_id}/revoke", headers={"authorization": f"Bearer {tenant_key}"}).status_code == 403
    assert httpx.post(f"{server.url}/admin/keys/nosuchkey000/revoke", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 404


def test_minus_zero_and_zero_temperature_share_a_cache_key(edge) -> None:
    first = httpx.post(edge.url + "/v1/chat/completions", json={**Q, "temperature": -0.0}, timeout=60)
    assert first.status_code == 200, first.text
    edge.drain()
    second = httpx.post(edge.url + "/v1/chat/completions", json={**Q, "temperature": 0}, timeout=60)
    assert second.headers["x-edgellm-cache-key"] == first.headers["x-edgellm-cache-key"]
    assert second.headers["cf-aig-cache-status"] == "HIT"


class BrokenKV:
    """A KV binding whose reads fail with an internal-looking message (a fault at the binding seam)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        from edgellm.ports import BindingError

        if key.startswith("access/keys/"):
            raise BindingError("sqlite3.OperationalError: unable to open /srv/internal/kv.sqlite3")
        return await self.inner.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_failing_dependency_never_echoes_its_internal_text(start_edge, make_deps, clock) -> None:
    base = make_deps(config=Config(admin_token=ADMIN), clock=clock)
    made = new_key("acme", clock.now())
    asyncio.run(KeyRing(base.kv).put(made.record))
    server = start_edge(replace(base, kv=BrokenKV(base.kv)))
    refused = chat(server, made.api_key)
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
    message = refused.json()["error"]["message"]
    assert "/srv/internal" not in message and "sqlite3" not in message and "OperationalError" not in message, message
