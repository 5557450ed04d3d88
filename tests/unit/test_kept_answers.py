"""A HIT's JSON answer is rendered once per stored entry and kept (`kept_json`): later HITs of the
entry are the same bytes a rendering gives, each with its own `id` and `created`, the same
headers, and the same usage row; a stream, another fingerprint or another route renders anew."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request, Response, json_bytes
from edgellm.kept_json import KeptJSON
from edgellm.ports import UsageEvent
from edgellm.state import IsolateState

from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.kv import SqliteKV

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 16}
ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"prompt": "Once", "temperature": 0, "max_tokens": 16},
    "/client/v4/accounts/acct/ai/run/@cf/meta/llama-2-7b-chat-int8": {"messages": CHAT["messages"], "temperature": 0},
}
# answers whose text the encoder treats differently: non-ASCII, escapes and control characters
TOKENS = {"plain": ("Hel", "lo"), "unicode": ("Grüß ", "😀", ' "q" \\ \n'), "control": ("a\x00", "\x1f\u2028", "b")}


@dataclass
class UsageRows:
    """A usage sink that keeps the events (what `GET /admin/usage` would group)."""

    events: list[UsageEvent] = field(default_factory=list)

    def record_now(self, event: UsageEvent) -> None:
        self.events.append(event)

    async def record(self, event: UsageEvent) -> None:
        self.record_now(event)

    async def query(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    async def tokens_spent(self, key_id: str) -> int:
        return 0


def edge(kv: SqliteKV, clock: Any, ai: ScriptedAI, usage: UsageRows | None = None) -> Deps:
    """An isolate (its own state: its own memos) over the given KV."""
    return Deps(config=Config(open_access=True), ai=ai, kv=kv, clock=clock, log=logging.getLogger("edgellm.test"),
                state=IsolateState(), usage=usage or UsageRows(), wait_until=lambda aw: pending.append(aw))


pending: list[Any] = []


async def ask(deps: Deps, path: str, body: dict[str, Any], **headers: str) -> Response:
    response = await handle(Request("POST", f"http://edge.test{path}", {"content-type": "application/json", **headers},
                                    json.dumps(body).encode()), deps)
    while pending:
        await pending.pop()
    return response


def masked(body: bytes) -> bytes:
    """The answer without what names it (OpenAI's `id`, `created`)."""
    return re.sub(rb'^\{"id":"[a-z]+-[0-9a-f]{24}","object":"([a-z_.]+)","created":\d+,', rb'{"id":ID,"object":"\1","created":T,', body)


def without_age(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in ("age", "x-request-id")}  # each request its own


@pytest.mark.parametrize("tokens", list(TOKENS.values()), ids=list(TOKENS))
@pytest.mark.parametrize("path", list(ROUTES))
async def test_a_kept_hit_is_the_bytes_a_rendering_gives(path: str, tokens: tuple[str, ...], clock: Any) -> None:
    kv, ai = SqliteKV(clock=clock), ScriptedAI(tokens=tokens, description={"backend": "scripted", "build": "b1"})
    deps = edge(kv, clock, ai)
    body = ROUTES[path]
    assert (await ask(deps, path, body)).headers["cf-aig-cache-status"] == "MISS"
    rendered = await ask(deps, path, body)  # the entry's first HIT: rendered from its events
    clock.advance(2)
    kept = [await ask(deps, path, body) for _ in range(2)]  # served from what that HIT kept
    fresh = await ask(edge(kv, clock, ai), path, body)  # another isolate: nothing kept, rendered anew
    for response in (rendered, *kept, fresh):
        assert response.status == 200 and response.headers["cf-aig-cache-status"] == "HIT"
    assert masked(kept[0].body) == masked(kept[1].body) == masked(fresh.body) == masked(rendered.body)
    assert without_age(kept[0]) == without_age(fresh) == without_age(rendered) and kept[0].headers["age"] == fresh.headers["age"]
    if path.startswith("/v1/"):  # OpenAI's: each answer its own id, created now
        ids = {json.loads(r.body)["id"] for r in (rendered, *kept)}
        assert len(ids) == 3
        assert json.loads(kept[1].body)["created"] == int(clock.now()) == json.loads(fresh.body)["created"]
        assert json.loads(kept[1].body)["system_fingerprint"].startswith("fp_")
    else:
        assert kept[0].body == rendered.body  # nothing in a Workers AI answer names it
    assert ai.called == 1  # one generation, at the MISS


async def test_kept_hits_record_the_usage_a_rendered_hit_records(clock: Any) -> None:
    usage = UsageRows()
    deps = edge(SqliteKV(clock=clock), clock, ScriptedAI(), usage)
    for _ in range(4):
        await ask(deps, "/v1/chat/completions", CHAT)
    miss, rendered, *kept = usage.events
    assert [e.cache_status for e in usage.events] == ["MISS", "HIT", "HIT", "HIT"]
    for event in kept:
        assert (event.model, event.route, event.prompt_tokens, event.completion_tokens, event.status) == \
            (rendered.model, rendered.route, rendered.prompt_tokens, rendered.completion_tokens, rendered.status)
    assert rendered.completion_tokens == miss.completion_tokens > 0


async def test_a_streamed_hit_another_fingerprint_or_route_is_rendered_anew(clock: Any) -> None:
    ai = ScriptedAI(description={"backend": "scripted", "build": "b1"})
    deps = edge(SqliteKV(clock=clock), clock, ai)
    for _ in range(3):
        await ask(deps, "/v1/chat/completions", CHAT)
    streamed = await ask(deps, "/v1/chat/completions", {**CHAT, "stream": True})
    assert streamed.is_streaming and streamed.headers["cf-aig-cache-status"] == "HIT"
    text = b"".join([chunk async for chunk in streamed.body])  # type: ignore[union-attr]
    assert b"data: [DONE]" in text and text.count(b'"content":"') >= 2
    before = json.loads((await ask(deps, "/v1/chat/completions", CHAT)).body)["system_fingerprint"]
    ai.description = {"backend": "scripted", "build": "b2"}  # the backend changed under the entry
    after = await ask(deps, "/v1/chat/completions", CHAT)
    assert after.headers["cf-aig-cache-status"] == "HIT" and json.loads(after.body)["system_fingerprint"] not in (None, before)


@pytest.mark.parametrize("path", [p for p in ROUTES if p != "/v1/completions"])
async def test_a_streamed_hit_is_sent_in_blocks_of_the_same_events(path: str, clock: Any) -> None:
    """A replay never waits, so its per-token chunks go out joined in blocks (`stream.in_blocks`:
    one write, one gzip flush each, not one per token); the events are the same bytes. A MISS
    still sends each token as it is made."""
    from edgellm.stream import REPLAY_BLOCK_BYTES

    deps = edge(SqliteKV(clock=clock), clock, ScriptedAI(tokens=tuple(f"tok{i} " for i in range(300))))
    body = {**ROUTES[path], "stream": True}

    async def chunks() -> tuple[str, list[bytes]]:
        response = await ask(deps, path, body)
        sent = [chunk async for chunk in response.body]  # type: ignore[union-attr]
        while pending:
            await pending.pop()
        return response.headers["cf-aig-cache-status"], sent

    def events(sent: list[bytes]) -> bytes:  # the stream without what names each answer
        return re.sub(rb'"id":"[a-z]+-[0-9a-f]{24}"|"created":\d+', b"", b"".join(sent))

    (miss, live), (hit, replayed) = await chunks(), await chunks()
    assert (miss, hit) == ("MISS", "HIT")
    assert events(replayed) == events(live) and events(live).count(b"tok299 ") == 1
    assert len(live) > 300  # a token a chunk, as it came
    size = len(b"".join(replayed))
    assert len(replayed) <= size // REPLAY_BLOCK_BYTES + 1 and (len(replayed) > 1 or size < REPLAY_BLOCK_BYTES)
    assert all(len(block) >= REPLAY_BLOCK_BYTES for block in replayed[:-1])


async def test_a_streamed_responses_hit_is_sent_in_blocks_too(clock: Any) -> None:
    from edgellm.stream import REPLAY_BLOCK_BYTES

    deps = edge(SqliteKV(clock=clock), clock, ScriptedAI(tokens=tuple(f"tok{i} " for i in range(300))))
    body = {"input": "Hi", "temperature": 0, "stream": True, "store": False}

    async def chunks() -> tuple[str, list[bytes]]:
        response = await ask(deps, "/v1/responses", body)
        sent = [chunk async for chunk in response.body]  # type: ignore[union-attr]
        while pending:
            await pending.pop()
        return response.headers["cf-aig-cache-status"], sent

    def text(sent: list[bytes]) -> str:
        events = [json.loads(line[6:]) for line in b"".join(sent).decode().splitlines() if line.startswith("data: {")]
        return "".join(e["delta"] for e in events if e.get("type") == "response.output_text.delta")

    (miss, live), (hit, replayed) = await chunks(), await chunks()
    assert (miss, hit) == ("MISS", "HIT") and len(live) > 300
    assert text(replayed) == text(live) == "".join(f"tok{i} " for i in range(300))
    assert len(replayed) <= len(b"".join(replayed)) // REPLAY_BLOCK_BYTES + 1


@pytest.mark.parametrize("head", [
    {"id": "chatcmpl-0a1b", "object": "chat.completion", "created": 1_800_000_000},
    {"id": "cmpl-x", "object": "text_completion", "created": 0},
    {"id": "é \"quoted\"", "object": "o", "created": -1},  # not plain: through the encoder
    {"id": "x", "object": "o", "created": True},  # a bool is no whole number here
    {"id": "x", "object": None, "created": 1.5},
    {"id": "a\\b", "object": "o", "created": 1},  # a backslash
    {"id": "x", "object": "tab\there", "created": 1},  # a control character
    {"id": "del\x7f", "object": "o", "created": 1},
    {"id": "line\u2028sep", "object": "\ud800", "created": 1},  # not ASCII; a lone surrogate
    {"id": "", "object": "o", "created": 10**20},
])
def test_the_leading_fields_are_written_as_the_encoder_writes_them(head: dict[str, Any]) -> None:
    from edgellm.kept_json import _head_json

    assert _head_json(head) == json_bytes(head)[:-1]


def test_kept_json_writes_its_leading_fields_and_keeps_the_rest() -> None:
    data = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "text": "Grüß \ud800"}
    kept = KeptJSON.of(data, json_bytes(data), ("id", "object", "created"))
    assert kept is not None
    head = {"id": "chatcmpl-2", "object": "chat.completion", "created": 22}
    assert kept.fill(head) == json_bytes({**data, **head})
    assert KeptJSON.of(data, json_bytes(data), ()) == KeptJSON((), json_bytes(data))  # nothing differs: the bytes as they are
    assert KeptJSON.of(data, json_bytes(data), ("object", "id", "created")) is None  # not the first keys, in order
    assert KeptJSON.of(data, json_bytes(data)[1:], ("id", "object", "created")) is None  # not that encoding
    odd = {"a\"b": 1, "model": "m"}
    assert KeptJSON.of(odd, json_bytes(odd), ("a\"b",)) is None  # a name the encoder escapes: rendered anew, never kept
