"""Admission fair between tenants, and a bound on how long a request waits to start,
through the local edge's real HTTP server: one tenant's burst cannot take every
place of the Worker's admission or of the llama.cpp runner's queue, and a request that finds no
slot within the runner's `start_timeout` gets a 503 with Retry-After instead of silence."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgellm.access.keys import KeyRing, NewKey, new_key
from edgellm.config import Config
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.slot_pool import SlotPool
from tests.edge.test_budgets import WAIT


def body(text: str, stream: bool = False) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 8, "stream": stream}


SKIP_CACHE = {"cf-aig-skip-cache": "true"}


def chat(server: Any, text: str, stream: bool = False, timeout: float = WAIT) -> httpx.Response:
    """One chat completion past the answer cache (every request here must reach admission)."""
    return httpx.post(server.url + "/v1/chat/completions", json=body(text, stream), headers=SKIP_CACHE, timeout=timeout)


def assert_cannot_start_in_a_second(server: Any) -> None:
    """JSON and stream alike: a 503 with Retry-After, `capacity_exceeded`, naming the 1 s deadline."""
    for stream in (False, True):
        waited = chat(server, f"wait {stream}", stream, timeout=20)
        assert waited.status_code == 503 and int(waited.headers["retry-after"]) > 0, waited.text
        assert waited.json()["error"]["code"] == "capacity_exceeded" and "1 s" in waited.json()["error"]["message"]


@pytest.fixture
def tenants_edge(start_edge, make_deps, clock):
    def make(config: Config, ai: Any = None, **gate: Any):
        base = make_deps(config=config, clock=clock, **({"ai": ai} if ai is not None else {}))
        gated = ScriptedAI(base.ai, **gate)
        deps = replace(base, ai=gated)
        ring = KeyRing(deps.kv)

        def mint(tenant: str) -> NewKey:
            made = new_key(tenant, clock.now(), requests_per_minute=0)
            asyncio.run(ring.put(made.record))
            return made

        return start_edge(deps), gated, mint

    return make


class Clients:
    """Requests sent from threads; `statuses` fill as their answers (or stream heads) arrive."""

    def __init__(self, server: Any, ai: ScriptedAI) -> None:
        self.server, self.ai, self.threads = server, ai, []
        self.statuses: list[tuple[str, int]] = []

    def send(self, key: NewKey, text: str, stream: bool = False) -> None:
        def run() -> None:
            headers = {"authorization": f"Bearer {key.api_key}", **SKIP_CACHE}
            with httpx.stream("POST", self.server.url + "/v1/chat/completions", json=body(text, stream), headers=headers, timeout=WAIT) as r:
                with self.ai.arrived:
                    self.statuses.append((key.record.tenant, r.status_code))
                    self.ai.arrived.notify_all()
                r.read()

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def wait(self, condition: Any) -> None:
        with self.ai.arrived:
            assert self.ai.arrived.wait_for(condition, WAIT), (self.statuses, self.ai.called, self.ai.stalls)

    def finish(self) -> None:
        self.ai.gate.set()
        for thread in self.threads:
            thread.join(WAIT)


def test_the_workers_admission_keeps_a_share_for_another_tenant(tenants_edge) -> None:
    server, ai, mint = tenants_edge(Config(admin_token="t", max_waiting_generations=4), hold_runs=True)
    a, b = mint("alice"), mint("bob")
    clients = Clients(server, ai)
    try:
        for i in range(4):  # Bob's burst: held at the binding once admitted
            clients.send(b, f"bob {i}")
        clients.wait(lambda: ai.called + len(clients.statuses) >= 4)
        assert [s for _, s in clients.statuses] == [503] and ai.called == 3  # Bob alone holds 3 of 4 places
        clients.send(a, "alice")
        clients.wait(lambda: ai.called == 4 or len(clients.statuses) == 2)
        assert ai.called == 4, clients.statuses  # Alice is admitted beside Bob's burst
    finally:
        clients.finish()
    assert sorted(clients.statuses) == [("alice", 200), ("bob", 200), ("bob", 200), ("bob", 200), ("bob", 503)]


@pytest.fixture(scope="module")
def narrow_runner(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> LlamaCppRunner:
    return LlamaCppRunner(tiny_model, n_ctx=1024, n_parallel=1, threads=1, max_waiting=4,
                          slot_dir=tmp_path_factory.mktemp("narrow-slots"), cache_ram_mib=0).load()


def test_the_llama_cpp_queue_keeps_a_share_for_another_tenant(tenants_edge, narrow_runner: LlamaCppRunner) -> None:
    config = Config(admin_token="t")
    server, ai, mint = tenants_edge(config, ai=LlamaCppAI.for_config(config, narrow_runner), stall_after=1)
    a, b = mint("alice"), mint("bob")
    clients = Clients(server, ai)
    try:
        for i in range(4):  # Bob's streams hold the runner's places while they stall after a token
            clients.send(b, f"bob {i}", stream=True)
        clients.wait(lambda: ai.stalls + sum(s == 503 for _, s in clients.statuses) >= 4)
        assert ai.stalls == 3 and [s for _, s in clients.statuses].count(503) == 1, clients.statuses
        clients.send(a, "alice", stream=True)
        clients.wait(lambda: any(t == "alice" for t, _ in clients.statuses))  # her answer's head has arrived
        assert ("alice", 200) in clients.statuses, clients.statuses
        clients.wait(lambda: ai.stalls == 4)  # and her stream is generating beside Bob's
    finally:
        clients.finish()


def test_a_request_that_cannot_start_in_time_is_a_503_with_retry_after(start_edge, make_deps, tiny_model: Path, tmp_path: Path) -> None:
    config = Config(open_access=True)
    runner = LlamaCppRunner(tiny_model, n_ctx=512, n_parallel=1, threads=1, slot_dir=tmp_path / "slots", cache_ram_mib=0,
                            start_timeout=1.0).load()
    inner = LlamaCppAI.for_config(config, runner)
    inner.slots = SlotPool(runner)
    ai = ScriptedAI(inner, stall_after=1)
    server = start_edge(make_deps(config=config, ai=ai))
    holder = threading.Thread(target=lambda: chat(server, "hold the slot", True))
    holder.start()
    try:
        assert ai.stalled.wait(WAIT)  # the only slot is held by a stream
        assert_cannot_start_in_a_second(server)
    finally:
        ai.gate.set()
        holder.join(WAIT)
    assert chat(server, "after").status_code == 200


def test_without_a_slot_pool_a_request_that_cannot_start_in_time_is_a_503(start_edge, make_deps, tiny_model: Path) -> None:
    """The runner without slots (llama.cpp's own queue, which has no deadline) keeps the start deadline:
    with its one llama.cpp slot's place taken (a generation llama.cpp is busy with), a request waits
    `start_timeout`, then gets a 503 with Retry-After, JSON or stream."""
    config = Config(open_access=True)
    runner = LlamaCppRunner(tiny_model, n_ctx=512, n_parallel=1, threads=1, cache_ram_mib=0, start_timeout=1.0).load()
    try:
        ai = LlamaCppAI.for_config(config, runner)
        assert ai.slots is None
        server = start_edge(make_deps(config=config, ai=ai))
        asyncio.run(runner.starts.acquire(1))  # the busy slot
        try:
            assert_cannot_start_in_a_second(server)
        finally:
            runner.starts.release()
        for stream in (False, True):
            after = chat(server, f"after {stream}", stream)
            assert after.status_code == 200, after.text
        assert runner.starts.free == 1  # every place came back
    finally:
        runner.close()


def test_the_workers_admission_answers_a_stream_that_cannot_start_with_a_503(start_edge, make_deps) -> None:
    config = Config(open_access=True, start_timeout_seconds=1.0)
    base = make_deps(config=config)
    ai = ScriptedAI(base.ai, hold_streams=True)  # its streams never open; cancelled when the deadline passes
    server = start_edge(replace(base, ai=ai))
    waited = chat(server, "never opens", True, timeout=20)
    assert ai.called == 1  # the stream call reached the binding
    assert waited.status_code == 503 and int(waited.headers["retry-after"]) > 0, waited.text
    error = waited.json()["error"]
    assert error["code"] == "start_timeout" and "1 s" in error["message"] and set(error) == {"message", "type", "param", "code", "request_id"}
    assert server.app.deps.state.admission.active == 0  # its place came back
    assert chat(server, "whole").status_code == 200


ROUTES = {
    "chat": ("/v1/chat/completions", lambda text: body(text)),
    "responses": ("/v1/responses", lambda text: {"input": text, "max_output_tokens": 8, "temperature": 0, "store": False}),
    "workers-ai": ("/client/v4/accounts/local/ai/run/@cf/meta/llama-2-7b-chat-int8",
                   lambda text: {"messages": [{"role": "user", "content": text}], "max_tokens": 8}),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_whole_answer_the_binding_never_gives_is_a_503_charged_its_reservation_and_never_cached(
        start_edge, make_deps, clock, tmp_path: Path, route: str) -> None:
    """A non-streamed call has a deadline too (start deadline + max_tokens at the slowest allowed
    rate): past it the binding's call is cancelled, the client gets a 503 with Retry-After, the key
    is charged its reservation (the binding may have made the whole answer) and nothing is cached."""
    from tests.edge.test_budgets import ADMIN, NotifyingUsage
    from edgellm_local.emulator.usage_sqlite import SqliteUsage

    config = Config(admin_token=ADMIN, start_timeout_seconds=0.5, run_min_tokens_per_second=1000)
    base = make_deps(config=config, clock=clock)
    ai, usage = ScriptedAI(base.ai, hold_runs=True), NotifyingUsage(SqliteUsage(tmp_path / "usage.sqlite3"))
    deps = replace(base, ai=ai, usage=usage)
    made = new_key("acme", clock.now(), requests_per_minute=0, token_budget=10_000)
    asyncio.run(KeyRing(deps.kv).put(made.record))
    server = start_edge(deps)
    path, payload = ROUTES[route]
    for attempt in (1, 2):
        waited = httpx.post(server.url + path, json=payload("never answered"), headers={"authorization": f"Bearer {made.api_key}"},
                            timeout=WAIT)
        assert waited.status_code == 503 and int(waited.headers["retry-after"]) > 0, waited.text
        assert ai.cancelled.wait(WAIT), "the stalled call was never cancelled"
        ai.cancelled.clear()
        assert ai.called == attempt  # the second identical request reached the binding: nothing was cached
        error = waited.json()["errors"][0] if route == "workers-ai" else waited.json()["error"]
        if route == "workers-ai":
            assert "did not finish this answer" in error["message"]
        else:
            assert error["code"] == "answer_timeout" and "0.508 s" in error["message"] and set(error) == {"message", "type", "param", "code", "request_id"}
    rows = usage.wait_rows(2)
    assert [row.status for row in rows] == [503, 503]
    assert all(row.prompt_tokens > 0 and row.completion_tokens == 8 for row in rows), rows  # the whole reservation
    assert not deps.state.access.reserved and deps.state.admission.active == 0  # settled, and its place came back


def test_the_local_binding_stalled_by_fault_injection_gets_the_whole_answer_deadline(start_edge, make_deps) -> None:
    """The same deadline over the real llama.cpp binding, its whole answer held by the local edge's
    own fault injection (`FaultyAI`, `edgellm dev --fault delay_first=1:delay_s=...`)."""
    from edgellm_local.doubles.faults import FaultPlan, FaultyAI

    config = Config(open_access=True, start_timeout_seconds=10, run_min_tokens_per_second=1000)  # room for the stream below
    base = make_deps(config=config)
    ai = FaultyAI(base.ai, FaultPlan(delay_first=1, delay_s=3600))
    server = start_edge(replace(base, ai=ai))
    waited = chat(server, "held")
    assert waited.status_code == 503 and int(waited.headers["retry-after"]) > 0, waited.text
    assert waited.json()["error"]["code"] == "answer_timeout" and ai.injected["delay_first"] == 1
    ai.plan = FaultPlan()  # the fault gone, a stream over the same binding still answers
    streamed = chat(server, "free", stream=True)
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
