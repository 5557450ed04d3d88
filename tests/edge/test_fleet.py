"""A pool of real replicas behind the local edge: llama.cpp servers (xllamacpp's llama-server),
each a process of its own on loopback, with the tiny GGUF. The answer header and the edge's
`/admin/routing/stats` say where each request went; the replicas' own `/metrics` say what
they reused from their cache. A replica is made busy or slow from outside (its process stopped,
or stopped on a duty cycle), never by code inside it."""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from bench.fleet_replicas import LyingReplica, Replica, pool_origins
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.emulator.server import EdgeApp, EdgeServer

ADMIN = "fleet-admin"
SYSTEM = " ".join(f"rule{i % 7} says keep answers short and kind" for i in range(14))  # two whole 256-character blocks


@pytest.fixture(scope="module")
def replicas(tiny_model: Path) -> Iterator[list[Replica]]:
    started = Replica.start_all(tiny_model, [f"gpu-{c}" for c in "abc"])
    yield started
    for replica in started:
        replica.stop()


@pytest.fixture
def fleet(make_deps: Callable[..., Deps]) -> Iterator[Callable[..., httpx.Client]]:
    """An edge in front of a pool of `members`, deciding from its own isolate's view (the pool's
    object is tested in test_fleet_placement.py)."""
    clients: list[httpx.Client] = []
    servers: list[EdgeServer] = []

    def start(members: list[Any], **settings: Any) -> httpx.Client:
        env = {"ADMIN_TOKEN": ADMIN, "OPEN_ACCESS": "true",
               "BREAKER": settings.pop("breaker", '{"failures": 5, "window_s": 30, "cooldown_s": 30}')}
        deps = make_deps(config=Config.from_env({**env, "ORIGINS": pool_origins(members, **settings)}))
        server = EdgeServer(EdgeApp(replace(deps, fetch=HttpxFetch(), kv=None), route_objects=False)).start()
        servers.append(server)
        client = httpx.Client(base_url=server.url, timeout=60)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


def chat(user: str, system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], "max_tokens": 4,
            "temperature": 0, **extra}


def route(response: httpx.Response) -> dict[str, str]:
    """`origin; origin=gpu-b; reason=prefix` as {"origin": "gpu-b", "reason": "prefix"}."""
    assert response.status_code == 200, response.text
    parts = [p.strip() for p in response.headers["x-edgellm-route"].split(";")]
    assert parts[0] == "origin"
    return dict(p.split("=", 1) for p in parts[1:])


def stats(client: httpx.Client) -> dict[str, dict[str, Any]]:
    data = client.get("/admin/routing/stats", headers={"authorization": f"Bearer {ADMIN}"}).json()
    return {r["name"]: r for pool in data["pools"] for r in pool["replicas"]}


def wait_for(condition: Callable[[], bool], what: str, tries: int = 600) -> None:
    """Poll a condition the edge reports (its stats), never a fixed sleep."""
    done = threading.Event()
    for _ in range(tries):
        if condition():
            return
        done.wait(0.05)
    raise AssertionError(f"never happened: {what}")


class Hanging:
    """Requests sent in threads to a replica whose process is stopped: they stay in flight at the
    edge until the replica is continued."""

    def __init__(self, client: httpx.Client) -> None:
        self.client, self.threads, self.responses = client, [], []

    def send(self, body: dict[str, Any], **headers: str) -> None:
        thread = threading.Thread(target=lambda: self.responses.append(self.client.post("/v1/chat/completions", json=body, headers=headers)))
        thread.start()
        self.threads.append(thread)

    def join(self) -> list[httpx.Response]:
        for thread in self.threads:
            thread.join(60)
        return self.responses


def test_a_shared_prefix_goes_to_the_replica_that_holds_it(fleet: Callable[..., httpx.Client], replicas: list[Replica]) -> None:
    client = fleet(replicas)
    first = route(client.post("/v1/chat/completions", json=chat("question 0")))
    holder = next(r for r in replicas if r.name == first["origin"])
    cached_before = holder.metrics()["llamacpp:prompt_tokens_cached_total"]
    later = [route(client.post("/v1/chat/completions", json=chat(f"question {i}"))) for i in range(1, 6)]
    assert {r["origin"] for r in later} == {holder.name} and {r["reason"] for r in later} == {"prefix"}
    # the replica itself says it reused the shared prompt from its cache for each of them
    assert holder.metrics()["llamacpp:prompt_tokens_cached_total"] - cached_before >= 5 * 100
    other = route(client.post("/v1/chat/completions", json=chat("question", system="an entirely different application " * 12)))
    assert other["reason"] in ("load", "prefix")
    seen = stats(client)
    assert seen[holder.name]["sent"] >= 6 and seen[holder.name]["estimated_prefix_hits"] == 5
    assert all(r["in_flight"] == 0 for r in seen.values())


def test_overload_spills_to_the_next_best_replica(fleet: Callable[..., httpx.Client], replicas: list[Replica]) -> None:
    client = fleet(replicas, kind=None)  # the gateway's own in-flight counts only (a stopped replica's probe would fail)
    holder = next(r for r in replicas if r.name == route(client.post("/v1/chat/completions", json=chat("warm up")))["origin"])
    hanging = Hanging(client)
    os.kill(holder.process.pid, signal.SIGSTOP)
    try:
        hanging.send(chat("held"))
        wait_for(lambda: stats(client)[holder.name]["in_flight"] == 1, "one request in flight on the holder")
        # the shared prompt (about 140 tokens) saves less prefill than the answer queued there will
        # take (its measured service time): the predicted first token is sooner on an idle
        # replica, though the holder is within the bound (the bound itself: tests/unit)
        spilled = route(client.post("/v1/chat/completions", json=chat("one too many")))
        assert spilled["origin"] != holder.name and spilled["reason"] == "load"
    finally:
        os.kill(holder.process.pid, signal.SIGCONT)
    assert [route(r)["origin"] for r in hanging.join()] == [holder.name]
    assert all(r["in_flight"] == 0 for r in stats(client).values())


def test_a_session_sticks_and_moves_only_when_it_must(fleet: Callable[..., httpx.Client], replicas: list[Replica]) -> None:
    client = fleet(replicas, kind=None)
    session = {"x-session-affinity": "user-42"}
    turns = [route(client.post("/v1/chat/completions", json=chat(f"turn {i}", system="short"), headers=session)) for i in range(3)]
    home = turns[0]["origin"]
    assert {t["origin"] for t in turns} == {home} and [t["reason"] for t in turns[1:]] == ["session", "session"]
    replica = next(r for r in replicas if r.name == home)
    hanging = Hanging(client)
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        for i in range(2):  # its replica stops answering: the turns pile up there until it is over the bound
            hanging.send(chat(f"stuck {i}", system="short"), **session)
            wait_for(lambda: stats(client)[home]["in_flight"] == i + 1, "the session's turns in flight at home")
        moved = route(client.post("/v1/chat/completions", json=chat("moved", system="short"), headers=session))
        assert moved["origin"] != home
        again = route(client.post("/v1/chat/completions", json=chat("after the move", system="short"), headers=session))
        assert again == {"origin": moved["origin"], "reason": "session"}  # and it stays where it moved
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert all(r.status_code == 200 for r in hanging.join())


def test_a_lying_replica_is_skipped_and_a_down_one_fails_over(fleet: Callable[..., httpx.Client], replicas: list[Replica], tiny_model: Path) -> None:
    liars = [LyingReplica.start("liar-nan", "llamacpp:requests_processing NaN\nllamacpp:requests_deferred 0\n"),
             LyingReplica.start("liar-negative", "llamacpp:requests_processing -4\nllamacpp:requests_deferred 0\n"),
             LyingReplica.start("liar-html", "<html>busy</html>")]
    doomed = Replica.start(tiny_model, "gpu-doomed")
    try:
        client = fleet([*liars, doomed, *replicas[:2]], probe_ms=2000, breaker='{"failures": 1, "window_s": 30, "cooldown_s": 300}')
        doomed.stop()
        answers = [route(client.post("/v1/chat/completions", json=chat(f"unique {i}", system=f"app {i} " * 60))) for i in range(12)]
        assert {a["origin"] for a in answers} <= {r.name for r in replicas[:2]}
        seen = stats(client)
        assert all(seen[liar.name]["sent"] == 0 and seen[liar.name]["reported"]["ok"] is False for liar in liars)
        assert "not a count" in seen["liar-nan"]["reported"]["why"] and "lacks" in seen["liar-html"]["reported"]["why"]
        # the dead one was tried at most once (its failure failed the request over), then its breaker kept it out
        assert seen[doomed.name]["sent"] <= 1 and seen[doomed.name]["breaker"]["state"] in ("closed", "open")
        assert sum(a["reason"] == "failover" for a in answers) == seen[doomed.name]["sent"]
    finally:
        for liar in liars:
            liar.stop()


def test_every_replica_down_is_a_503_with_retry_after(fleet: Callable[..., httpx.Client], tiny_model: Path) -> None:
    gone = Replica.start_all(tiny_model, [f"gone-{i}" for i in range(2)])
    for replica in gone:
        replica.stop()
    client = fleet(gone, kind=None, breaker='{"failures": 1, "window_s": 30, "cooldown_s": 300}')
    for _ in range(2):  # every replica failing, then every breaker open
        response = client.post("/v1/chat/completions", json=chat("anyone?"))
        assert response.status_code == 503 and int(response.headers["retry-after"]) > 0
        assert response.json()["error"]["code"] == "origin_unavailable"
    assert all(r["breaker"]["state"] == "open" for r in stats(client).values())


def test_a_slowed_replica_loses_its_share(fleet: Callable[..., httpx.Client], replicas: list[Replica]) -> None:
    client = fleet(replicas, kind=None)
    slowed = replicas[2]
    slowed.slow(stopped_s=0.04, running_s=0.01)
    try:
        # unique prompts, one at a time: without the slowdown each replica would take about a third
        answers = [route(client.post("/v1/chat/completions", json=chat(f"q{i}", system=f"tenant {i} " * 40, max_tokens=48)))
                   for i in range(24)]
    finally:
        slowed.unslow()
    served = [a["origin"] for a in answers]
    assert slowed.name in served  # it was tried, and so measured
    after = served[served.index(slowed.name) + 1:]
    assert after.count(slowed.name) <= len(after) // 6
    seen = stats(client)
    assert seen[slowed.name]["itl_s"] > 2 * min(seen[r.name]["itl_s"] for r in replicas[:2] if seen[r.name]["itl_s"])


def test_metrics_name_replicas_from_the_configuration(fleet: Callable[..., httpx.Client], replicas: list[Replica]) -> None:
    client = fleet(replicas)
    route(client.post("/v1/chat/completions", json=chat("count me")))
    text = client.get("/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    lines = [line for line in text.splitlines() if line.startswith(("edgellm_routed_replica", "edgellm_replica_in_flight"))]
    assert len(lines) == 6 and sum(float(line.rsplit(" ", 1)[1]) for line in lines if "routed" in line) == 1
    assert {json.loads('"' + line.split('replica="')[1].split('"')[0] + '"') for line in lines} == {r.name for r in replicas}


def test_what_a_replica_keeps_is_learned_from_its_own_counts(fleet: Callable[..., httpx.Client], tiny_model: Path) -> None:
    """A real replica with one slot and no RAM prompt cache keeps one prompt: the one it served
    last. Its answers' `cached_tokens` teach the edge so: after it let a prompt go, the edge's
    bound for it comes down from the 8,192 blocks it starts at, and what the edge takes it to
    hold of the prompts before falls with it."""
    replica = Replica.start(tiny_model, "gpu-one", parallel=1, cache_ram_mib=0)
    try:
        client = fleet([replica])
        apps = [" ".join(f"{name} says keep answers short and kind" for _ in range(14)) for name in ("alpha", "bravo", "charlie")]
        for system in apps:
            route(client.post("/v1/chat/completions", json=chat("hello", system=system)))
        seen = stats(client)["gpu-one"]
        assert seen["prefix_blocks_bound"] == 8192 and seen["prefix_blocks_held"] >= 6
        cached_before = replica.metrics()["llamacpp:prompt_tokens_cached_total"]
        route(client.post("/v1/chat/completions", json=chat("hello again", system=apps[0])))
        # the replica itself says it reused next to nothing (its one slot held the third prompt) ...
        assert replica.metrics()["llamacpp:prompt_tokens_cached_total"] - cached_before < 20
        seen = stats(client)["gpu-one"]
        # ... so the edge's bound came down to the floor (the depth, 4+ blocks, is under it)
        assert seen["prefix_blocks_bound"] == 16 and seen["prefix_blocks_held"] <= 16
        assert seen["in_flight"] == 0
    finally:
        replica.stop()
