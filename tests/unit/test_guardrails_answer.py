"""The answer's guardrails through `app.handle`, with the scripted guard at the binding seam and
the answer cache on a real (in-memory SQLite) KV: a whole answer checked before it is sent, a
stream cut mid-way with `finish_reason: content_filter` and an error event, nothing of a blocked
or flagged answer or of one carrying a finding cached, and a HIT checked again for a caller whose
policy is stricter than the one it was stored under."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from edgellm.access.keys import KeyRing, new_key
from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.guardrails.policy import parse_policy
from edgellm.http import Request, Response
from edgellm.ports import BindingError
from edgellm.sse import SSEDecoder
from edgellm_local.doubles.guard import ScriptedGuard
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.kv import SqliteKV

SAFE_WORDS = tuple(f"word{i} " for i in range(40))
# 40 tokens; token 30 is the one the guard objects to
HARMFUL = SAFE_WORDS[:30] + ("hurt ",) + SAFE_WORDS[31:]
ANSWER_POLICY = {"moderation": {"answer": {"S1": "block", "S2": "flag"}}}


class Drain:
    """`wait_until` that keeps the background writes (the cache's) so a test can await them."""

    def __init__(self) -> None:
        self.tasks: list[Any] = []

    def __call__(self, awaitable: Any) -> None:
        self.tasks.append(asyncio.ensure_future(awaitable))

    async def all(self) -> None:
        await asyncio.gather(*self.tasks)


def deps_with(policy: dict[str, Any] | None, tokens: tuple[str, ...], guard: Any = None, **config: Any) -> tuple[Deps, ScriptedAI, Drain]:
    ai = ScriptedAI(tokens=tokens)
    drain = Drain()
    config = {"open_access": True, **config}
    deps = Deps(config=Config(guardrails=parse_policy(policy), guard_window_tokens=8, **config), ai=ai,
                kv=SqliteKV(), guard=guard or ScriptedGuard(rules=[("hurt", "unsafe\nS1"), ("steal", "unsafe\nS2")]),
                wait_until=drain, log=logging.getLogger("edgellm.test"))
    return deps, ai, drain


def chat(stream: bool = False, headers: dict[str, str] | None = None) -> Request:
    body = {"messages": [{"role": "user", "content": "tell me a story"}], "stream": stream, "temperature": 0}
    return Request("POST", "http://edge.test/v1/chat/completions", {"content-type": "application/json", **(headers or {})},
                   json.dumps(body).encode())


async def events_of(response: Response) -> list[Any]:
    decoder = SSEDecoder()
    out: list[Any] = []
    async for chunk in response.body:  # type: ignore[union-attr]
        out += [p if p == "[DONE]" else json.loads(p) for p in decoder.feed(chunk)]
    return out


def calls(ai: ScriptedAI) -> int:
    return len(ai.calls)


async def test_a_whole_answer_is_checked_before_any_of_it_is_sent_and_a_blocked_one_is_not_cached() -> None:
    deps, ai, drain = deps_with(ANSWER_POLICY, HARMFUL)
    response = await handle(chat(), deps)
    assert response.status == 200
    choice = json.loads(response.body)["choices"][0]
    assert choice["finish_reason"] == "content_filter" and "hurt" not in (choice["message"]["content"] or "")
    assert choice["message"]["content"] in ("", None)  # one window: nothing of it was released
    await drain.all()
    again = await handle(chat(), deps)
    assert json.loads(again.body)["choices"][0]["finish_reason"] == "content_filter"
    assert calls(ai) == 2 and again.headers["cf-aig-cache-status"] != "HIT"  # never cached, so generated again
    assert deps.state.telemetry.guardrails[("answer", "S1", "block")] == 2


async def test_a_stream_is_released_window_by_window_and_cut_mid_stream() -> None:
    deps, ai, drain = deps_with(ANSWER_POLICY, HARMFUL)
    events = await events_of(await handle(chat(stream=True), deps))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e.get("choices"))
    assert text.startswith("word0 ") and "word23" in text  # the windows judged safe were released
    assert "hurt" not in text and "word31" not in text  # the window holding the harm never was
    finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]]
    assert finishes == ["content_filter"]
    assert events[-1] != "[DONE]" and events[-1]["error"]["code"] == "content_filter"
    await drain.all()
    await events_of(await handle(chat(stream=True), deps))
    assert calls(ai) == 2  # nothing of it was cached


async def test_a_safe_stream_is_whole_and_cached_with_the_policy_it_was_checked_under() -> None:
    deps, ai, drain = deps_with(ANSWER_POLICY, SAFE_WORDS)
    events = await events_of(await handle(chat(stream=True), deps))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e.get("choices"))
    assert text == "".join(SAFE_WORDS) and events[-1] == "[DONE]"
    assert len(deps.guard.calls) == len(SAFE_WORDS) // 8  # one verdict a window  # type: ignore[union-attr]
    await drain.all()
    hit = await handle(chat(), deps)
    assert hit.headers["cf-aig-cache-status"] == "HIT" and calls(ai) == 1
    assert len(deps.guard.calls) == len(SAFE_WORDS) // 8  # the same policy: not checked again  # type: ignore[union-attr]


async def test_a_flagged_answer_says_so_and_is_not_cached() -> None:
    deps, ai, drain = deps_with(ANSWER_POLICY, ("how ", "to ", "steal ", "a ", "bike"))
    response = await handle(chat(), deps)
    assert json.loads(response.body)["choices"][0]["message"]["content"] == "how to steal a bike"
    assert response.headers["x-edgellm-guardrails"] == "flagged; categories=S2"
    await drain.all()
    assert (await handle(chat(), deps)).headers["cf-aig-cache-status"] != "HIT"


async def test_a_hit_is_checked_again_under_a_stricter_keys_policy_and_a_blocked_answer_is_never_replayed() -> None:
    deps, ai, drain = deps_with(None, HARMFUL, open_access=False)
    kv = deps.kv
    lax, strict = new_key("acme", 0.0), new_key("acme", 0.0, guardrails=json.dumps(ANSWER_POLICY))
    for made in (lax, strict):
        await KeyRing(kv).put(made.record)  # type: ignore[arg-type]
    auth = {"authorization": f"Bearer {lax.api_key}"}
    first = await handle(chat(headers=auth), deps)
    assert json.loads(first.body)["choices"][0]["finish_reason"] == "stop"
    await drain.all()
    assert (await handle(chat(headers=auth), deps)).headers["cf-aig-cache-status"] == "HIT"
    strict_hit = await handle(chat(headers={"authorization": f"Bearer {strict.api_key}"}), deps)
    assert strict_hit.headers["cf-aig-cache-status"] == "HIT" and calls(ai) == 1
    choice = json.loads(strict_hit.body)["choices"][0]
    assert choice["finish_reason"] == "content_filter" and "hurt" not in (choice["message"]["content"] or "")


async def test_dlp_on_answers_masks_or_blocks_and_never_caches_a_finding() -> None:
    tokens = ("write ", "to ", "jane.doe", "@example", ".com ", "today")
    deps, ai, drain = deps_with({"dlp": {"email": "mask"}}, tokens)
    response = await handle(chat(), deps)
    assert json.loads(response.body)["choices"][0]["message"]["content"] == "write to [email] today"
    await drain.all()
    assert (await handle(chat(), deps)).headers["cf-aig-cache-status"] != "HIT"
    events = await events_of(await handle(chat(stream=True), deps))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if isinstance(e, dict) and e.get("choices"))
    assert text == "write to [email] today" and "jane" not in json.dumps(events)
    blocked, _, _ = deps_with({"dlp": {"email": "block"}}, tokens)
    events = await events_of(await handle(chat(stream=True), blocked))
    assert "jane" not in json.dumps(events) and events[-1]["error"]["code"] == "content_filter"


async def test_a_failing_guard_on_an_answer_follows_guard_fail() -> None:
    failing = ScriptedGuard(fail=BindingError("guard down"))
    deps, ai, _ = deps_with(ANSWER_POLICY, SAFE_WORDS, failing)
    response = await handle(chat(), deps)
    assert response.status == 503 and json.loads(response.body)["error"]["code"] == "guard_unavailable"
    assert response.headers["retry-after"]
    deps, ai, _ = deps_with(ANSWER_POLICY, SAFE_WORDS, ScriptedGuard(fail=BindingError("guard down")), guard_fail="open")
    response = await handle(chat(), deps)
    assert json.loads(response.body)["choices"][0]["message"]["content"] == "".join(SAFE_WORDS)


async def test_a_flagged_stream_says_so_in_its_final_chunk() -> None:
    deps, ai, drain = deps_with(ANSWER_POLICY, ("how ", "to ", "steal ", "a ", "bike"))
    events = await events_of(await handle(chat(stream=True), deps))
    [final] = [e for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]]
    assert final["choices"][0]["finish_reason"] == "stop" and final["edgellm_guardrails"] == "flagged; categories=S2"
    assert events[-1] == "[DONE]"


async def test_a_masked_and_a_blocked_stream_answer_each_leave_their_verdict_in_the_usage_row() -> None:
    from dataclasses import replace

    from edgellm_local.emulator.usage_sqlite import SqliteUsage

    tokens = ("write ", "to ", "jane.doe", "@example", ".com ", "today")
    for action in ("mask", "block"):
        deps, _, _ = deps_with({"dlp": {"email": action}}, tokens)
        deps = replace(deps, usage=SqliteUsage())
        await events_of(await handle(chat(stream=True), deps))  # the row is made when the stream's body ends
        rows = await deps.usage.query(0, 4e9, ())
        assert rows[0]["guardrails"] == {f"answer:email:{action}": 1}


async def test_a_responses_answer_cut_by_the_content_policy_is_incomplete_and_its_stream_says_so() -> None:
    def responses(stream: bool) -> Request:
        body = {"model": "@cf/meta/llama-2-7b-chat-int8", "input": "tell me a story", "stream": stream, "temperature": 0}
        return Request("POST", "http://edge.test/v1/responses", {"content-type": "application/json"}, json.dumps(body).encode())

    deps, _, _ = deps_with(ANSWER_POLICY, HARMFUL)
    data = json.loads((await handle(responses(False), deps)).body)
    assert data["status"] == "incomplete" and data["incomplete_details"] == {"reason": "content_filter"}
    assert "hurt" not in json.dumps(data)
    events = await events_of(await handle(responses(True), deps))
    final = next(e for e in events if e["type"] == "response.incomplete")
    assert final["response"]["incomplete_details"] == {"reason": "content_filter"} and "hurt" not in json.dumps(events)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "content_filter"
    deps, _, _ = deps_with(ANSWER_POLICY, ("how ", "to ", "steal ", "a ", "bike"))
    events = await events_of(await handle(responses(True), deps))
    assert events[-1]["type"] == "response.completed" and events[-1]["edgellm_guardrails"] == "flagged; categories=S2"


async def test_a_flagged_workers_ai_stream_says_so_in_its_final_event() -> None:
    deps, _, _ = deps_with(ANSWER_POLICY, ("how ", "to ", "steal ", "a ", "bike"))
    body = {"messages": [{"role": "user", "content": "tell me a story"}], "stream": True}
    request = Request("POST", "http://edge.test/client/v4/accounts/acc/ai/run/@cf/meta/llama-2-7b-chat-int8",
                      {"content-type": "application/json"}, json.dumps(body).encode())
    events = await events_of(await handle(request, deps))
    assert events[-1] == "[DONE]" and events[-2]["edgellm_guardrails"] == "flagged; categories=S2"
