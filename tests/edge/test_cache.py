"""The response cache through the local edge's real HTTP server and the real llama.cpp runner."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import replace
from typing import Any, Callable

import httpx
import pytest

from edgellm.config import Config
from edgellm.ports import BindingError
from edgellm.deps import Deps
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.server import EdgeServer

TOKEN = "test-admin-token"
CHAT = {"messages": [{"role": "user", "content": "Tell me about the edge."}], "temperature": 0, "max_tokens": 24}
ADMIN = {"authorization": f"Bearer {TOKEN}"}


def wait_for(condition: Callable[[], bool], timeout: float = 60) -> None:
    """Block until the server's observable state satisfies `condition` (checked every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition was never met")
        threading.Event().wait(0.01)


def flight_objects(server: EdgeServer) -> list[Any]:
    flights = server.app.deps.flights
    return [flights.get(name).object for name in flights.names]


def subscribers(server: EdgeServer) -> int:
    return sum(o.current.subscribers for o in flight_objects(server) if o.current is not None)


def is_stream(response: httpx.Response) -> bool:
    return response.headers["content-type"].startswith("text/event-stream")


def run_clients(server: EdgeServer, bodies: list[dict], ready: Callable[[], bool], ai: ScriptedAI,
                headers: list[dict[str, str]] | None = None, before_release: Any = None) -> list[httpx.Response]:
    """Send the requests at once, wait until `ready()` (all are in), open the gate, collect them in order."""
    results: list[Any] = [None] * len(bodies)

    def call(i: int) -> None:
        results[i] = httpx.post(server.url + "/v1/chat/completions", json=bodies[i], headers=(headers or [{}] * len(bodies))[i], timeout=60)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    wait_for(ready)
    ai.gate.set()
    for t in threads:
        t.join()
    return results


class FailingKV:
    """A KV namespace that is down: every call raises, as a JsException would on the Worker."""

    async def get(self, key: str, **kwargs: Any) -> Any:
        raise BindingError("KV GET failed: 503 Service Unavailable")

    async def put(self, key: str, value: bytes, **kwargs: Any) -> None:
        raise BindingError("KV PUT failed: 503 Service Unavailable")

    async def delete(self, key: str) -> None:
        raise BindingError("KV DELETE failed: 503")

    async def list(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise BindingError("KV LIST failed: 503")


@pytest.fixture
def cache_edge(start_edge, make_deps, clock) -> tuple[EdgeServer, Deps, ScriptedAI]:
    deps = make_deps(config=Config(admin_token=TOKEN, open_access=True), clock=clock)
    ai = ScriptedAI(deps.ai)
    deps = type(deps)(**{**deps.__dict__, "ai": ai})
    return start_edge(deps), deps, ai


def post(server: EdgeServer, body: dict, path: str = "/v1/chat/completions", **headers: str) -> httpx.Response:
    response = httpx.post(server.url + path, json=body, headers=headers, timeout=60)
    server.drain()  # the KV write happens after the answer (waitUntil); wait for it
    return response


def sse_payloads(response: httpx.Response) -> list[Any]:
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


def chat_text(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def stream_text(response: httpx.Response) -> str:
    parts = []
    for data in sse_payloads(response):
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


def test_hit_after_miss_is_the_same_answer_without_inference(cache_edge) -> None:
    server, deps, ai = cache_edge
    first = post(server, CHAT)
    second = post(server, CHAT)
    assert first.headers["cf-aig-cache-status"] == "MISS" and "age" not in first.headers
    assert second.headers["cf-aig-cache-status"] == "HIT" and second.headers["age"] == "0"
    assert chat_text(first) == chat_text(second) and chat_text(first)
    assert second.json()["usage"] == first.json()["usage"]
    assert second.json()["model"] == first.json()["model"]
    assert ai.called == 1


def test_a_gzip_client_gets_every_hit_from_the_kept_answer(start_edge, make_deps) -> None:
    """httpx and the OpenAI SDK ask for gzip: each HIT is the kept answer with its own leading
    fields, a valid gzip body whose compressed rest is the same bytes on every HIT (deflated once
    per entry, `edge_encoding.gzip_kept`), never compressed again per answer."""
    import gzip
    import zlib

    server = start_edge(make_deps(config=Config(open_access=True)), compress=True)
    url = server.url + "/v1/chat/completions"
    with httpx.Client(timeout=60, headers={"accept-encoding": "gzip, deflate"}) as client:
        assert client.post(url, json=CHAT).headers["cf-aig-cache-status"] == "MISS"
        server.drain()
        assert client.post(url, json=CHAT).headers["cf-aig-cache-status"] == "HIT"  # the first HIT renders, and keeps it
        raws, answers = [], []
        for _ in range(3):
            with client.stream("POST", url, json=CHAT) as response:
                assert response.headers["cf-aig-cache-status"] == "HIT" and response.headers["content-encoding"] == "gzip"
                raws.append(b"".join(response.iter_raw()))
        plain = client.post(url, json=CHAT, headers={"accept-encoding": "identity"})
    for raw in raws:
        assert gzip.decompress(raw) == zlib.decompress(raw, 16 + zlib.MAX_WBITS)  # one whole member, as every client reads it
        answers.append(json.loads(gzip.decompress(raw)))
    assert len({a["id"] for a in answers} | {plain.json()["id"]}) == 4
    assert all({**a, "id": "", "created": 0} == {**plain.json(), "id": "", "created": 0} for a in answers)
    # after gzip's 10-byte header and the stored block (5 bytes, then the leading fields), up to the trailer
    rests = {raw[15 + gzip.decompress(raw).index(b',"model"'):-8] for raw in raws}
    assert len(rests) == 1 and len(next(iter(rests))) > 100, "the rest is the same deflated bytes on every HIT"


def test_stream_and_non_stream_share_one_entry(cache_edge) -> None:
    server, deps, ai = cache_edge
    streamed = post(server, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert streamed.headers["cf-aig-cache-status"] == "MISS"
    as_json = post(server, CHAT)
    assert as_json.headers["cf-aig-cache-status"] == "HIT"
    assert chat_text(as_json) == stream_text(streamed)
    replayed = post(server, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert replayed.headers["cf-aig-cache-status"] == "HIT"
    payloads = sse_payloads(replayed)
    assert payloads[-1] == "[DONE]" and len(payloads) > 4  # token by token, not one blob
    assert json.loads(payloads[-2])["usage"] == as_json.json()["usage"]
    assert stream_text(replayed) == stream_text(streamed)
    assert ai.called == 1


def test_workers_ai_route_replays_in_its_own_formats(cache_edge) -> None:
    server, deps, ai = cache_edge
    path = f"/client/v4/accounts/acct/ai/run/{deps.config.model}"
    first = post(server, CHAT)
    as_json = post(server, CHAT, path)
    assert as_json.headers["cf-aig-cache-status"] == "HIT"
    assert as_json.json()["result"]["response"] == chat_text(first) and as_json.json()["success"] is True
    as_sse = post(server, {**CHAT, "stream": True}, path)
    assert as_sse.headers["cf-aig-cache-status"] == "HIT"
    events = sse_payloads(as_sse)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["response"] for e in events[:-1]) == chat_text(first)
    assert ai.called == 1


def test_non_deterministic_requests_bypass(cache_edge) -> None:
    server, deps, ai = cache_edge
    body = {k: v for k, v in CHAT.items() if k != "temperature"}  # Workers AI default 0.6
    for _ in range(2):
        assert post(server, body).headers["cf-aig-cache-status"] == "BYPASS"
    seeded = {**body, "temperature": 0.9, "seed": 7}
    assert post(server, seeded).headers["cf-aig-cache-status"] == "MISS"
    assert post(server, seeded).headers["cf-aig-cache-status"] == "HIT"
    assert ai.called == 3


def test_control_headers(cache_edge, clock) -> None:
    server, deps, ai = cache_edge
    assert post(server, CHAT, **{"cf-aig-skip-cache": "true"}).headers["cf-aig-cache-status"] == "BYPASS"
    assert post(server, CHAT, **{"cache-control": "no-store"}).headers["cf-aig-cache-status"] == "MISS"
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "MISS"        # no-store wrote nothing
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"
    assert post(server, CHAT, **{"cf-aig-skip-cache": "true"}).headers["cf-aig-cache-status"] == "BYPASS"
    clock.advance(100)
    assert post(server, CHAT).headers["age"] == "100"
    refreshed = post(server, CHAT, **{"cache-control": "no-cache"})
    assert refreshed.headers["cf-aig-cache-status"] == "MISS"                # not read, but rewritten
    assert ai.called == 5  # bypass, no-store, miss, bypass, no-cache
    again = post(server, CHAT)
    assert again.headers["cf-aig-cache-status"] == "HIT" and again.headers["age"] == "0"


def test_custom_key_shares_an_entry_across_bodies(cache_edge) -> None:
    server, deps, ai = cache_edge
    a = post(server, CHAT, **{"cf-aig-cache-key": "greeting"})
    other = {**CHAT, "messages": [{"role": "user", "content": "Something else entirely"}]}
    b = post(server, other, **{"cf-aig-cache-key": "greeting"})
    assert (a.headers["cf-aig-cache-status"], b.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
    assert chat_text(a) == chat_text(b)
    assert post(server, other).headers["cf-aig-cache-status"] == "MISS"


def test_ttl_expiry_age_and_classes(cache_edge, clock) -> None:
    server, deps, ai = cache_edge
    assert post(server, CHAT, **{"cf-aig-cache-ttl": "5"}).headers["cf-aig-cache-status"] == "MISS"
    clock.advance(30)  # the 5 s asked for was clamped to KV's 60 s floor
    hit = post(server, CHAT)
    assert hit.headers["cf-aig-cache-status"] == "HIT" and hit.headers["age"] == "30"
    clock.advance(31)
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "MISS"

    news = {**CHAT, "max_tokens": 8}
    assert post(server, news, **{"x-edgellm-cache-class": "news"}).headers["cf-aig-cache-status"] == "MISS"
    clock.advance(299)
    assert post(server, news).headers["cf-aig-cache-status"] == "HIT"
    clock.advance(2)
    assert post(server, news).headers["cf-aig-cache-status"] == "MISS"


def test_bad_cache_headers_are_400(cache_edge) -> None:
    server, _, _ = cache_edge
    for headers in ({"cf-aig-cache-ttl": "tomorrow"}, {"x-edgellm-cache-class": "hourly"}):
        response = post(server, CHAT, **headers)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == next(iter(headers))


def test_aborted_stream_leaves_no_entry(cache_edge) -> None:
    server, deps, ai = cache_edge
    long = {**CHAT, "max_tokens": 500, "stream": True}  # within the 512 tokens a test slot holds
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=long, timeout=60) as response:
        assert response.headers["cf-aig-cache-status"] == "MISS"
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    server.drain()
    assert asyncio.run(deps.kv.list(prefix="cache/"))["keys"] == []
    [flight_object] = flight_objects(server)
    assert flight_object.current is None and deps.state.admission.active == 0
    assert post(server, long).headers["cf-aig-cache-status"] == "MISS"


def test_failing_generation_mid_stream_leaves_no_entry(start_edge, make_deps) -> None:
    deps = make_deps()

    server = start_edge(type(deps)(**{**deps.__dict__, "ai": ScriptedAI(deps.ai, fail_after=2, mid_stream=BindingError("InferenceUpstreamError: 3043: internal server error"))}))
    response = post(server, {**CHAT, "stream": True})
    payloads = sse_payloads(response)
    assert "[DONE]" not in payloads and "error" in json.loads(payloads[-1])
    assert asyncio.run(deps.kv.list(prefix="cache/"))["keys"] == []


@pytest.mark.parametrize("clients", [2, 20])
def test_concurrent_identical_misses_share_one_generation(start_edge, make_deps, clients: int) -> None:
    deps = make_deps()
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    results = run_clients(server, [{**CHAT, "stream": i % 2 == 0} for i in range(clients)], lambda: subscribers(server) == clients, ai)
    server.drain()
    assert ai.called == 1
    assert {r.status_code for r in results} == {200}
    assert all(sse_payloads(r)[-1] == "[DONE]" for r in results if is_stream(r))
    texts = {stream_text(r) if is_stream(r) else chat_text(r) for r in results}
    assert len(texts) == 1 and texts != {""}
    assert deps.state.cache.coalesced == clients - 1
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"


def leave_after_one_line(server: EdgeServer, body: dict) -> threading.Thread:
    """A streaming client that reads the first line of its answer, then goes away."""

    def run() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
            assert response.headers["cf-aig-cache-status"] == "MISS"
            next(response.iter_lines())

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_one_client_leaving_early_does_not_stop_the_others(start_edge, make_deps) -> None:
    deps = make_deps()
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    body = {**CHAT, "stream": True}
    leaver = leave_after_one_line(server, body)
    results = run_clients(server, [body, CHAT], lambda: subscribers(server) == 3, ai)
    leaver.join()
    server.drain()
    assert ai.called == 1 and {r.status_code for r in results} == {200}
    assert sse_payloads(results[0])[-1] == "[DONE]" and stream_text(results[0]) == chat_text(results[1])
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"


def test_every_client_leaving_stops_the_generation_and_writes_nothing(start_edge, make_deps) -> None:
    deps = make_deps()
    ai = ScriptedAI(deps.ai, hold_calls=True, hold_after_first=True)
    server = start_edge(replace(deps, ai=ai))
    long = {**CHAT, "max_tokens": 256, "stream": True}
    leavers = [leave_after_one_line(server, long) for _ in range(2)]
    wait_for(lambda: subscribers(server) == 2)
    ai.gate.set()
    for leaver in leavers:
        leaver.join()
    wait_for(lambda: ai.closed == 1)  # the binding's stream was closed: llama.cpp stopped
    server.drain()
    [flight_object] = flight_objects(server)
    assert flight_object.current is None and flight_object.generations == 1
    assert ai.called == 1 and deps.state.admission.active == 0
    assert asyncio.run(deps.kv.list(prefix="cache/"))["keys"] == []


def test_a_json_client_leaving_before_its_answer_stops_the_generation(start_edge, make_deps) -> None:
    deps = make_deps()
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    body = json.dumps({**CHAT, "max_tokens": 256}).encode()
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(lambda: subscribers(server) == 1)
    wait_for(lambda: subscribers(server) == 0)  # the server saw the disconnect and cancelled the request
    ai.gate.set()
    server.drain()
    [flight_object] = flight_objects(server)
    assert flight_object.current is None and deps.state.admission.active == 0
    assert asyncio.run(deps.kv.list(prefix="cache/"))["keys"] == []


def test_without_the_flights_object_identical_misses_do_not_share(start_edge, make_deps) -> None:
    """No Durable Object binding: no coalescing at all (never sharing inside the isolate)."""
    deps = make_deps()
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai), coalesce=False)
    results = run_clients(server, [{**CHAT, "stream": True}, CHAT], lambda: ai.waiting == 2, ai)
    server.drain()
    assert ai.called == 2 and {r.status_code for r in results} == {200}
    assert sse_payloads(results[0])[-1] == "[DONE]" and stream_text(results[0]) == chat_text(results[1])
    assert deps.state.cache.coalesced == 0
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"


def test_kv_failure_fails_open(start_edge, make_deps) -> None:
    deps = make_deps(kv=FailingKV(), config=Config(admin_token=TOKEN, open_access=True))
    server = start_edge(deps)
    for _ in range(2):
        response = post(server, CHAT)
        assert response.status_code == 200 and chat_text(response)
        assert response.headers["cf-aig-cache-status"] == "MISS"
    streamed = post(server, {**CHAT, "stream": True})
    assert sse_payloads(streamed)[-1] == "[DONE]"
    stats = httpx.get(server.url + "/admin/cache/stats", headers=ADMIN).json()
    # each of the 3 requests read its namespace generation and its entry; the stats route its generation.
    # The 3 failed writes are the flights objects' (each with its own state, as on Cloudflare, where
    # an object runs in another isolate): logged there, not counted in the Worker's stats
    assert stats["read_errors"] == 7 and stats["write_errors"] == 0


def test_corrupt_entry_is_a_miss_and_is_overwritten(cache_edge, clock) -> None:
    server, deps, ai = cache_edge
    first = post(server, CHAT)
    [entry] = asyncio.run(deps.kv.list(prefix="cache/"))["keys"]
    assert entry["name"].endswith(first.headers["x-edgellm-cache-key"])
    clock.advance(1)  # KV takes one write per second per key
    asyncio.run(deps.kv.put(entry["name"], b"{not json"))
    clock.advance(1)
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "MISS"
    again = post(server, CHAT)
    assert again.headers["cf-aig-cache-status"] == "HIT" and chat_text(again) == chat_text(first)


def test_admin_routes_need_the_token(cache_edge, start_edge) -> None:
    server, _, _ = cache_edge
    assert httpx.get(server.url + "/admin/cache/stats").status_code == 401
    assert httpx.get(server.url + "/admin/cache/stats", headers={"authorization": "Bearer nope"}).status_code == 401
    unconfigured = start_edge()
    response = httpx.get(unconfigured.url + "/admin/cache/stats", headers=ADMIN)
    assert response.status_code == 404 and response.json()["error"]["code"] == "route_not_found"


def test_purge_one_key_and_a_whole_namespace(cache_edge, clock) -> None:
    server, deps, ai = cache_edge
    other = {**CHAT, "max_tokens": 8}
    key = post(server, CHAT).headers["x-edgellm-cache-key"]
    post(server, other)
    purged = httpx.post(server.url + "/admin/cache/purge", json={"key": key}, headers=ADMIN)
    assert purged.status_code == 200
    clock.advance(1)  # KV takes one write per second per key
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "MISS"
    assert post(server, other).headers["cf-aig-cache-status"] == "HIT"

    by_request = httpx.post(server.url + "/admin/cache/purge", json={"request": other}, headers=ADMIN)
    assert by_request.json()["key"] != key
    clock.advance(1)
    assert post(server, other).headers["cf-aig-cache-status"] == "MISS"

    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"
    namespace = httpx.post(server.url + "/admin/cache/purge", json={"namespace": "default"}, headers=ADMIN).json()
    assert namespace["generation"] == 1
    too_soon = httpx.post(server.url + "/admin/cache/purge", json={"namespace": "default"}, headers=ADMIN)
    assert too_soon.status_code == 429 and too_soon.headers["retry-after"] == "1"
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "MISS"
    assert post(server, other).headers["cf-aig-cache-status"] == "MISS"
    bad = httpx.post(server.url + "/admin/cache/purge", json={"key": "../etc"}, headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "key"


def test_preload_then_hit_and_stats(cache_edge) -> None:
    server, deps, ai = cache_edge
    faq = [{"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 12} for q in ("Opening hours?", "Refunds?")]
    response = httpx.post(server.url + "/admin/cache/preload", json={"requests": faq, "class": "faq"}, headers=ADMIN, timeout=60)
    assert response.status_code == 200
    assert [r["status"] for r in response.json()["results"]] == ["stored", "stored"] and response.json()["ttl"] == 86400
    again = httpx.post(server.url + "/admin/cache/preload", json={"requests": faq}, headers=ADMIN, timeout=60)
    assert [r["status"] for r in again.json()["results"]] == ["cached", "cached"]
    calls = ai.called
    for item in faq:
        assert post(server, item).headers["cf-aig-cache-status"] == "HIT"
    assert ai.called == calls == 2
    not_cacheable = httpx.post(server.url + "/admin/cache/preload", json={"requests": [{"prompt": "x"}]}, headers=ADMIN)
    assert not_cacheable.status_code == 400 and not_cacheable.json()["error"]["code"] == "not_cacheable"
    for bad_class in ({}, ["faq"], 7):  # a 400 naming 'class', never a TypeError (found by the schema fuzzing)
        refused = httpx.post(server.url + "/admin/cache/preload", json={"requests": faq, "class": bad_class}, headers=ADMIN)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "class"
    stats = httpx.get(server.url + "/admin/cache/stats", headers=ADMIN).json()
    assert stats["hits"] == 2 and stats["bytes_served"] > 0 and stats["generation"] == 0


def test_coalescing_never_lets_one_request_decide_another_ones_storage(start_edge, make_deps) -> None:
    deps = make_deps()
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    results = run_clients(server, [CHAT, CHAT], lambda: ai.waiting == 2, ai, headers=[{"cache-control": "no-store"}, {}])
    server.drain()
    assert ai.called == 2 and len(flight_objects(server)) == 2  # different storage policies: two flights
    assert chat_text(results[0]) == chat_text(results[1])
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"  # the plain request's answer was stored


def test_admission_bound_answers_503_at_once_never_to_hits_and_recovers(start_edge, make_deps) -> None:
    deps = make_deps(config=Config(open_access=True, max_waiting_generations=2))
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    ai.gate.set()
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "MISS"  # an answer to HIT later
    ai.gate.clear()
    uncached = {k: v for k, v in CHAT.items() if k != "temperature"}
    waiting: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: waiting.append(post(server, uncached))) for _ in range(2)]
    for t in threads:
        t.start()
    wait_for(lambda: ai.waiting == 2)
    refused = httpx.post(server.url + "/v1/chat/completions", json=uncached, timeout=60)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["type"] == "unavailable_error" and refused.json()["error"]["code"] == "overloaded"
    assert post(server, CHAT).headers["cf-aig-cache-status"] == "HIT"  # HITs are never refused
    ai.gate.set()
    for t in threads:
        t.join()
    assert [r.status_code for r in waiting] == [200, 200]
    assert post(server, uncached).status_code == 200 and deps.state.admission.active == 0


def test_a_herd_of_identical_misses_joins_one_flight_past_the_admission_bound(start_edge, make_deps) -> None:
    """Joiners cost the backend nothing: more identical misses than `max_waiting_generations`
    all join the one flight (one place for the herd), none is refused."""
    clients = 5
    deps = make_deps(config=Config(open_access=True, max_waiting_generations=2))
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    # all in: each is subscribed to the flight or was refused (the latter only without the fix)
    results = run_clients(server, [{**CHAT, "stream": i % 2 == 0} for i in range(clients)],
                          lambda: subscribers(server) + deps.state.admission.refused == clients, ai)
    server.drain()
    assert [r.status_code for r in results] == [200] * clients and deps.state.admission.refused == 0
    assert ai.called == 1 and deps.state.cache.coalesced == clients - 1
    texts = {stream_text(r) if is_stream(r) else chat_text(r) for r in results}
    assert len(texts) == 1 and texts != {""}
    assert deps.state.admission.active == 0 and deps.state.admission.shared == {}


def test_the_flights_an_isolate_starts_stay_bounded_while_joiners_pass(start_edge, make_deps) -> None:
    """Two different misses fill a bound of 2: a third different one is refused at once, while
    one identical to a running flight still joins it."""
    deps = make_deps(config=Config(open_access=True, max_waiting_generations=2))
    ai = ScriptedAI(deps.ai, hold_calls=True)
    server = start_edge(replace(deps, ai=ai))
    first, second, third = ({**CHAT, "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(3))
    answers: dict[int, httpx.Response] = {}

    def send(i: int, body: dict) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.__setitem__(i, httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)))
        thread.start()
        return thread

    threads = [send(0, first), send(1, second)]
    wait_for(lambda: subscribers(server) == 2 and deps.state.admission.active == 2)
    refused = httpx.post(server.url + "/v1/chat/completions", json=third, timeout=60)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
    assert refused.json()["error"]["code"] == "overloaded"
    threads.append(send(2, first))  # joins the first flight: shares its place, takes none
    wait_for(lambda: subscribers(server) == 3 or deps.state.admission.refused > 1)
    assert deps.state.admission.refused == 1 and deps.state.admission.active == 2
    ai.gate.set()
    for thread in threads:
        thread.join()
    server.drain()
    assert [answers[i].status_code for i in range(3)] == [200, 200, 200]
    assert ai.called == 2 and chat_text(answers[0]) == chat_text(answers[2])
    assert deps.state.admission.active == 0 and deps.state.admission.shared == {}
