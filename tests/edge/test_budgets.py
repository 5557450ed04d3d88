"""Budgets that cannot be dodged, through the local edge's real HTTP server:
a cut stream and a departed client are charged what they generated, limits are reserved at
admission so concurrency cannot overspend them, and a stream cut by a stop sequence still says
its prompt. Faults (a stream that stalls, an answer that never comes) are injected at the binding
seam around the real llama.cpp binding."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgellm.access.keys import KeyRing, NewKey, new_key
from edgellm.config import Config
from edgellm.ports import UsageEvent
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.usage_sqlite import SqliteUsage

ADMIN = "admin-secret"
WAIT = 60  # seconds any event may take before the test fails (it never hangs)


@dataclass
class NotifyingUsage:
    """The SQLite usage port, telling the test when a row was written (an event, not a sleep)."""

    inner: SqliteUsage
    rows: list[UsageEvent] = field(default_factory=list)
    recorded: threading.Condition = field(default_factory=threading.Condition)

    async def record(self, event: UsageEvent) -> None:
        self.record_now(event)

    def record_now(self, event: UsageEvent) -> None:
        self.inner.record_now(event)
        with self.recorded:
            self.rows.append(event)
            self.recorded.notify_all()

    def wait_rows(self, n: int) -> list[UsageEvent]:
        with self.recorded:
            assert self.recorded.wait_for(lambda: len(self.rows) >= n, WAIT), f"{len(self.rows)} of {n} usage rows"
            return list(self.rows)

    async def query(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.query(*args, **kwargs)

    async def tokens_spent(self, key_id: str) -> int:
        return await self.inner.tokens_spent(key_id)


@pytest.fixture
def budget_edge(start_edge, make_deps, clock, tmp_path: Path, tiny_runner):
    """A keyed edge with usage rows the test can wait for, and the gated real binding."""

    def make(**gate: Any):
        base = make_deps(config=Config(admin_token=ADMIN), clock=clock)
        usage = NotifyingUsage(SqliteUsage(tmp_path / "usage.sqlite3"))
        ai = ScriptedAI(base.ai, **gate)
        from dataclasses import replace
        deps = replace(base, ai=ai, usage=usage)
        ring = KeyRing(deps.kv)

        def mint(tenant: str, **limits: Any) -> NewKey:
            made = new_key(tenant, clock.now(), **limits)
            asyncio.run(ring.put(made.record))
            return made

        return start_edge(deps), deps, ai, usage, mint

    return make


def body(text: str = "Tell me a long story about the sea.", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 30, **extra}


def auth(key: NewKey) -> dict[str, str]:
    return {"authorization": f"Bearer {key.api_key}", "cf-aig-skip-cache": "true"}


def test_a_stream_closed_before_its_end_is_charged_what_it_delivered(budget_edge) -> None:
    server, deps, ai, usage, mint = budget_edge(stall_after=3)
    key = mint("acme", requests_per_minute=0, token_budget=10_000)
    chunks = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body(stream=True), headers=auth(key), timeout=WAIT) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                chunks += 1
                if chunks == 3:
                    break
        assert ai.stalled.wait(WAIT)
    row = usage.wait_rows(1)[0]
    assert row.completion_tokens >= 3, row
    assert row.prompt_tokens > 0, row
    assert deps.state.access.spent[key.record.key_id] == row.prompt_tokens + row.completion_tokens
    assert not deps.state.access.reserved  # the reservation was settled


def test_a_whole_answer_whose_client_left_is_recorded_and_logged(budget_edge, caplog) -> None:
    server, deps, ai, usage, mint = budget_edge(hold_runs=True)
    key = mint("acme", requests_per_minute=0, token_budget=10_000)
    payload = json.dumps(body()).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {server.host}\r\ncontent-type: application/json\r\n"
               f"authorization: Bearer {key.api_key}\r\ncf-aig-skip-cache: true\r\ncontent-length: {len(payload)}\r\n\r\n").encode() + payload
    with caplog.at_level(logging.INFO, logger="edgellm.test.access"):
        with socket.create_connection((server.host, server.port), timeout=WAIT) as sock:
            sock.sendall(request)
            with ai.arrived:
                assert ai.arrived.wait_for(lambda: ai.called == 1, WAIT)
        row = usage.wait_rows(1)[0]
        ai.gate.set()
        server.drain()
    assert row.status == 499 and row.tenant == "acme", row
    assert row.prompt_tokens > 0 and row.completion_tokens == 30, row  # the whole reservation: nothing said what it generated
    lines = [r for r in caplog.records if r.name == "edgellm.test.access" and r.edgellm["path"] == "/v1/chat/completions"]
    assert [r.edgellm["status"] for r in lines] == [499]
    assert not deps.state.access.reserved


def _concurrent(server: Any, ai: ScriptedAI, key: NewKey, n: int) -> list[int]:
    """`n` concurrent misses held at the binding until every one was either admitted (reached the
    binding) or refused; then released. Returns their statuses."""
    statuses: list[int] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        response = httpx.post(server.url + "/v1/chat/completions", json=body(f"question {i}"), headers=auth(key), timeout=WAIT)
        with lock:
            statuses.append(response.status_code)
        with ai.arrived:
            ai.arrived.notify_all()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    with ai.arrived:
        assert ai.arrived.wait_for(lambda: ai.called + len(statuses) >= n, WAIT)
    ai.gate.set()
    for thread in threads:
        thread.join(WAIT)
    return statuses


@pytest.mark.parametrize("limit", ["token_budget", "tokens_per_minute"])
def test_concurrent_requests_cannot_overspend_a_key_by_more_than_one_reservation(budget_edge, limit: str) -> None:
    server, deps, ai, usage, mint = budget_edge(hold_runs=True)
    key = mint("acme", requests_per_minute=0, **{limit: 100})
    statuses = _concurrent(server, ai, key, 6)
    admitted = statuses.count(200)
    assert sorted(set(statuses)) == [200, 429], statuses
    rows = usage.wait_rows(6)
    reservation = max(r.prompt_tokens for r in rows if r.status == 200) + 30
    # each admitted request reserved its prompt and max_tokens 30: admitted while anything was left
    assert admitted <= 100 // reservation + 1, (statuses, reservation)
    spent = sum(r.prompt_tokens + r.completion_tokens for r in rows)
    assert spent <= 100 + reservation
    assert not deps.state.access.reserved


def test_a_stream_cut_by_a_stop_sequence_reports_its_prompt(budget_edge) -> None:
    server, _, _, _, mint = budget_edge()
    key = mint("acme", requests_per_minute=0)
    whole = httpx.post(server.url + "/v1/chat/completions", json=body(), headers=auth(key), timeout=WAIT).json()
    text = whole["choices"][0]["message"]["content"]
    assert len(text) >= 6, text
    stop = text[3:5]
    cut = httpx.post(server.url + "/v1/chat/completions", json=body(stop=[stop]), headers=auth(key), timeout=WAIT).json()
    usage = None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body(stream=True, stop=[stop], stream_options={"include_usage": True}),
                      headers=auth(key), timeout=WAIT) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("usage"):
                usage = json.loads(line[6:])["usage"]
    assert usage is not None
    assert cut["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] > 0
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"], (usage, whole["usage"])
    assert 0 < usage["completion_tokens"] <= whole["usage"]["completion_tokens"]
