"""Session affinity over origins (rendezvous hashing) and a llama.cpp origin's slot pinning."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any, AsyncIterator, Mapping

from edgellm.config import Config
from edgellm.generation import GenerationRequest
from edgellm.http import Request
from edgellm.ports import FetchResponse
from edgellm.deps import Deps
from edgellm.routing.affinity import by_affinity, slot_for
from edgellm.routing.config import OriginConfig, RoutingConfig
from edgellm.routing.origin import OriginClient, origin_body
from edgellm.routing.plan import plan_route
from edgellm.state import IsolateState

ORIGINS = tuple(OriginConfig(name=f"o{i}", url=f"http://o{i}") for i in range(4))
SESSIONS = [f"s{i}" for i in range(400)]


def test_a_session_always_gets_the_same_replica_and_sessions_spread() -> None:
    first = {s: by_affinity(ORIGINS, s)[0].name for s in SESSIONS}
    assert first == {s: by_affinity(tuple(reversed(ORIGINS)), s)[0].name for s in SESSIONS}  # order-free
    counts = Counter(first.values())
    assert set(counts) == {o.name for o in ORIGINS} and min(counts.values()) > len(SESSIONS) / 8, counts


def test_removing_a_replica_moves_only_its_own_sessions() -> None:
    before = {s: by_affinity(ORIGINS, s)[0].name for s in SESSIONS}
    after = {s: by_affinity(ORIGINS[:3], s)[0].name for s in SESSIONS}
    moved = {s for s in SESSIONS if before[s] != after[s]}
    assert moved == {s for s in SESSIONS if before[s] == "o3"}
    assert all(after[s] == by_affinity(ORIGINS, s)[1].name for s in moved)  # to their second choice


def test_a_llama_cpp_origin_pins_the_session_to_a_slot_with_cache_prompt() -> None:
    llama = RoutingConfig.from_env({"ORIGINS": '[{"name": "l", "url": "http://l", "slots": 4}]'}).origins[0]
    assert llama.slots == 4
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    slots = set()
    for session in SESSIONS[:40]:
        _, body = origin_body(llama, GenerationRequest("@cf/a", chat, session=session))
        assert body["cache_prompt"] is True and body["id_slot"] == slot_for(session, llama)
        slots.add(body["id_slot"])
    assert slots == {0, 1, 2, 3}
    _, plain = origin_body(llama, GenerationRequest("@cf/a", chat))  # no session: llama.cpp picks the slot
    _, other = origin_body(ORIGINS[0], GenerationRequest("@cf/a", chat, session="s1"))  # not llama.cpp: no slot fields
    assert not {"id_slot", "cache_prompt"} & (set(plain) | set(other))


class RecordingFetch:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Mapping[str, str]]] = []

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        self.sent.append((url, dict(headers)))

        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\ndata: [DONE]\n\n'

        return FetchResponse(200, {}, events())


async def test_the_origin_request_carries_the_session_header() -> None:
    fetch = RecordingFetch()
    request = GenerationRequest("@cf/a", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, session="conv-9")
    events = await OriginClient(ORIGINS[0], fetch).start(request)
    async for _ in events:
        pass
    await OriginClient(ORIGINS[0], fetch).start(GenerationRequest("@cf/a", request.inputs))
    assert fetch.sent[0][1]["x-session-affinity"] == "conv-9" and "x-session-affinity" not in fetch.sent[1][1]


async def test_the_plan_orders_origins_by_the_session_and_keeps_the_region_origin_first() -> None:
    origins = [{"name": o.name, "url": o.url, "region": "US"} for o in ORIGINS]
    config = Config.from_env({"ORIGINS": json.dumps(origins), "REGIONS": '{"EU": {"origin": "o2"}}'})
    deps = Deps(config=config, ai=None, fetch=RecordingFetch(), state=IsolateState(), log=logging.getLogger("test"))  # type: ignore[arg-type]
    inputs: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for session in SESSIONS[:20]:
        plan = await plan_route(deps, Request("POST", "http://x/"), GenerationRequest(config.model, inputs, session=session))
        assert [o.name for o in plan.origins] == [o.name for o in by_affinity(config.routing.origins, session)]
        eu = await plan_route(deps, Request("POST", "http://x/", {"cf-ipcontinent": "EU"}), GenerationRequest(config.model, inputs, session=session))
        assert eu.origins[0].name == "o2"
        assert [o.name for o in eu.origins[1:]] == [o.name for o in by_affinity(config.routing.origins, session) if o.name != "o2"]
    unpinned = await plan_route(deps, Request("POST", "http://x/"), GenerationRequest(config.model, inputs))
    assert [o.name for o in unpinned.origins] == [o.name for o in ORIGINS]  # no session: the configured order
