"""A client that leaves a streamed answer at any point gives back everything its request held.

A runtime closes the body of a client already gone, possibly before its first read (workerd
when the client left before the first byte; the local server on a disconnect). Every layer
between that body and the generation must pass the close on, read or not: otherwise the
admission place leaks (after `max_waiting_generations` such departures every caller of the
isolate gets 503 `overloaded`), the binding keeps generating, an origin's body stays open, and a
half-open breaker's probe is never given back. Each route is left before its first read, after
each chunk, and after its end.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.ports import CapacityExceeded, FetchResponse
from edgellm.routing.breaker import HALF_OPEN
from edgellm.routing.plan import routing_state
from edgellm_local.doubles.scripted import OpenStream, ScriptedAI
from edgellm_local.emulator.kv import SqliteKV
from tests.unit.test_app import post

HERMES = "@hf/nousresearch/hermes-2-pro-mistral-7b"  # tools, per Cloudflare's lists
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = [{"role": "user", "content": "weather in Paris?"}]
ORIGINS = '[{"name": "o1", "url": "http://origin.invalid/v1", "timeout_ms": 5000}]'


@dataclass
class OpenBody:
    """An origin's HTTP body, holding its connection until it ends or is closed, read or not."""

    chunks: list[bytes]
    closed: bool = False

    def __aiter__(self) -> "OpenBody":
        return self

    async def __anext__(self) -> bytes:
        if self.closed or not self.chunks:
            raise StopAsyncIteration
        return self.chunks.pop(0)

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class OriginFetch:
    """The Worker's `fetch` port answering as an OpenAI-compatible origin streams; keeps its bodies."""

    bodies: list[OpenBody] = field(default_factory=list)

    async def post(self, url: str, body: bytes, headers: Any, timeout: float) -> FetchResponse:
        self.bodies.append(OpenBody([
            b'data: {"choices": [{"delta": {"content": "From"}, "finish_reason": null}]}\n\n',
            b'data: {"choices": [{"delta": {"content": " origin"}, "finish_reason": null}]}\n\n',
            b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\n',
            b"data: [DONE]\n\n",
        ]))
        return FetchResponse(200, {"content-type": "text/event-stream"}, self.bodies[-1])


@dataclass
class ToolCallingAI(ScriptedAI):
    """A function-calling model streaming a call in fragments, then text, then its usage."""

    def describe(self, model: str, *, live: bool = True) -> Any:
        return None  # capabilities from Cloudflare's lists, as the real binding's

    def _script(self) -> list[dict[str, Any]]:
        return [{"response": "", "tool_calls": [{"index": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city"'}]},
                {"response": "", "tool_calls": [{"index": 0, "arguments": ': "Paris"}'}]},
                {"response": "ok"},
                {"response": "", "usage": {"prompt_tokens": 9, "completion_tokens": 3}}]


@dataclass(frozen=True)
class Route:
    path: str
    body: dict[str, Any]
    ai: Callable[[], ScriptedAI] = lambda: ScriptedAI(open_streams=True)
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] | None = None  # configured from the environment (routing)
    hit: bool = False  # answered from the cache: the first request stores it, the departures replay it
    probe: bool = False  # the breaker is half-open before each request: this request probes the edge


RUN = f"/client/v4/accounts/acc/ai/run/{Config().model}"
ROUTES = {
    "chat": Route("/v1/chat/completions", {"messages": CHAT, "stream": True}),
    "chat-usage": Route("/v1/chat/completions", {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "chat-tools": Route("/v1/chat/completions", {"messages": CHAT, "stream": True, "tools": [TOOL]},
                        lambda: ToolCallingAI(open_streams=True), {"model": HERMES}),
    "chat-stop": Route("/v1/chat/completions", {"messages": CHAT, "stream": True, "stop": ["wor"]}),
    "completions": Route("/v1/completions", {"prompt": "hi", "stream": True}),
    "workers-ai-run": Route(RUN, {"prompt": "hi", "stream": True}),
    "responses": Route("/v1/responses", {"input": "hi", "stream": True}),
    "chat-hit": Route("/v1/chat/completions", {"messages": CHAT, "stream": True, "temperature": 0}, hit=True),
    "chat-tools-hit": Route("/v1/chat/completions", {"messages": CHAT, "stream": True, "tools": [TOOL], "temperature": 0},
                            lambda: ToolCallingAI(open_streams=True), {"model": HERMES}, hit=True),
    "origin-after-edge-failed": Route("/v1/chat/completions", {"messages": CHAT, "stream": True},
                                      lambda: ScriptedAI(fail=CapacityExceeded("3040: Capacity temporarily exceeded")),
                                      env={"ORIGINS": ORIGINS, "EDGE_FIRST_TOKEN_MS": "5000"}),
    "edge-with-failover-probing": Route("/v1/chat/completions", {"messages": CHAT, "stream": True},
                                        env={"ORIGINS": ORIGINS, "EDGE_FIRST_TOKEN_MS": "5000"}, probe=True),
}


def deps_for(route: Route, clock: Any, background: list[Any]) -> tuple[Deps, ScriptedAI, OriginFetch]:
    ai, fetch = route.ai(), OriginFetch()
    config = Config.from_env({**route.env, "OPEN_ACCESS": "true"}) if route.env is not None else Config(open_access=True, **route.config)
    deps = Deps(config=config, ai=ai, kv=SqliteKV(":memory:", clock=clock) if route.hit else None, clock=clock, fetch=fetch,
                log=logging.getLogger("edgellm.test"), wait_until=background.append)
    return deps, ai, fetch


@pytest.mark.parametrize("name", list(ROUTES))
async def test_a_client_leaving_at_any_point_gives_back_its_place_its_generation_and_its_origin(name: str, clock) -> None:
    route, background = ROUTES[name], []
    deps, ai, fetch = deps_for(route, clock, background)

    async def served() -> Any:
        breaker = routing_state(deps).breaker
        if route.probe:
            assert breaker is not None
            breaker.state, breaker.probing = HALF_OPEN, False
        response = await handle(post(route.path, route.body), deps)
        assert response.status == 200 and response.is_streaming, response.body
        return response

    async def settled() -> None:  # the cache writes the answers left behind
        while background:
            await background.pop()

    whole = [chunk async for chunk in (await served()).body]
    await settled()
    if route.hit:  # the departures below replay the stored answer
        replay = await served()
        assert replay.headers["cf-aig-cache-status"] == "HIT"
        whole = [chunk async for chunk in replay.body]
    assert whole and not any(b'"error":{' in chunk or b"event: error" in chunk for chunk in whole)
    for point in range(len(whole) + 1):  # before the first read, after each chunk, after the end
        response = await served()
        for _ in range(point):
            await anext(response.body)
        await response.body.aclose()
        left = f"{name}: left after {point} of {len(whole)} chunks"
        assert deps.state.admission.active == 0 and not deps.state.admission.by_tenant, left
        assert all(s.closed for s in ai.streams), left
        assert all(b.closed for b in fetch.bodies), left
        if route.probe:
            assert not routing_state(deps).breaker.probing, left  # type: ignore[union-attr]
    assert ai.streams or fetch.bodies or route.hit
    await settled()
