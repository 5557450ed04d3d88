"""`unmask_answer` through the local edge's real HTTP server: the caller's own masked values are
put back into the answer it reads (JSON and streamed, on every answer route), while the model,
the answer's check, the cache, a stored Responses turn, the log line and the usage row see only
the placeholders; a second caller whose prompt masks to the same text HITs the same entry and
gets its own value back.

The model is `ScriptedAI` at the binding seam: it answers a fixed text that repeats the masked
prompt's placeholder, cut across tokens as a real model's tokens cut it (the tiny test GGUF's
random weights never write `[EMAIL_1]`), plus a placeholder the prompt never issued."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from edgellm.config import Config
from edgellm.deps import SystemClock
from edgellm.guardrails.policy import parse_policy
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.conversation_sqlite import conversation_factory
from edgellm_local.emulator.durable import LocalDurableObjectNamespace
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.emulator.usage_sqlite import SqliteUsage
from tests.edge.test_observability import Records, records  # noqa: F401  (the access log's records fixture)

JANE, BOB = "jane.doe@example.com", "bob@example.org"
TOKENS = ("Sure, I will write to ", "[EMA", "IL_1", "] and cc [EMAIL_9]", " today.")
MASKED = "Sure, I will write to [EMAIL_1] and cc [EMAIL_9] today."
RUN = "/client/v4/accounts/0123abcd/ai/run/@cf/meta/llama-2-7b-chat-int8"
ON = {"dlp": {"email": "mask"}, "unmask_answer": True}


def answer_for(email: str) -> str:
    return MASKED.replace("[EMAIL_1]", email)  # [EMAIL_9] was never issued: it stays


def chat(email: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"Please mail {email} about the invoice"}], "max_tokens": 16,
            "temperature": 0, **extra}


def sse(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Headers, list[Any]]:
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        return response.headers, [json.loads(line) for line in lines if line != "[DONE]"]


def chat_text(events: list[Any]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


@pytest.fixture
def unmasking(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any], tmp_path: Path) -> Callable[..., Any]:
    def start(policy: dict[str, Any], **config: Any) -> tuple[httpx.Client, SqliteUsage]:
        cfg = Config(open_access=True, guardrails=parse_policy(policy), **config)
        usage = SqliteUsage(tmp_path / "usage.sqlite3", flush_interval=0.01)
        conversations = LocalDurableObjectNamespace(conversation_factory(tmp_path / "conversations", cfg, SystemClock()),
                                                    class_name="Conversation")
        server = start_edge(make_deps(config=cfg, ai=ScriptedAI(tokens=TOKENS), usage=usage, conversations=conversations))
        return httpx.Client(base_url=server.url, timeout=60), usage

    return start


def kv_values(tmp_path: Path) -> list[str]:
    with sqlite3.connect(tmp_path / "kv.sqlite3") as db:
        return [bytes(value).decode(errors="replace") for (value,) in db.execute("SELECT value FROM kv")]


def test_each_caller_gets_its_own_value_back_and_only_placeholders_are_kept(unmasking, records: Records, tmp_path: Path) -> None:  # noqa: F811
    client, usage = unmasking(ON, log_prompts=True)
    with client:
        first = client.post("/v1/chat/completions", json=chat(JANE))
        assert first.status_code == 200, first.text
        assert first.json()["choices"][0]["message"]["content"] == answer_for(JANE)
        assert first.headers["cf-aig-cache-status"] == "MISS"
        # the restored value is the caller's own: the answer's DLP check judged the masked answer
        assert first.headers["x-edgellm-guardrails"] == "masked; detectors=email"
        headers, events = sse(client, "/v1/chat/completions", chat(JANE))
        assert headers["cf-aig-cache-status"] == "HIT"
        assert chat_text(events) == answer_for(JANE)
        # a second caller, another address in the same place: the same masked prompt, the same entry, its own value
        second = client.post("/v1/chat/completions", json=chat(BOB))
        assert second.headers["cf-aig-cache-status"] == "HIT"
        assert second.json()["choices"][0]["message"]["content"] == answer_for(BOB)
        assert JANE not in second.text
        headers, events = sse(client, "/v1/chat/completions", chat(BOB))
        assert headers["cf-aig-cache-status"] == "HIT" and chat_text(events) == answer_for(BOB)
        assert JANE not in json.dumps(events)
    stored = kv_values(tmp_path)
    assert any("[EMAIL_1]" in value for value in stored)  # the entry: the masked answer
    assert not any(JANE in value or BOB in value for value in stored)
    usage.flush()
    with sqlite3.connect(tmp_path / "usage.sqlite3") as db:
        rows = db.execute("SELECT * FROM usage").fetchall()
        guardrails = db.execute("SELECT guardrails FROM usage").fetchall()
    assert len(rows) == 4 and not any(JANE in str(row) or BOB in str(row) for row in rows)
    assert set(guardrails) == {("prompt:email:mask",)}  # no answer finding: the check saw placeholders only
    lines = records.wait(4)
    assert not any(JANE in json.dumps(line, default=str) or BOB in json.dumps(line, default=str) for line in lines)
    assert not any(JANE in message or BOB in message for message in records.messages)


def test_without_unmask_answer_the_placeholders_stay(unmasking) -> None:
    client, _ = unmasking({"dlp": {"email": "mask"}})
    with client:
        answer = client.post("/v1/chat/completions", json=chat(JANE))
        assert answer.json()["choices"][0]["message"]["content"] == MASKED
        _, events = sse(client, "/v1/chat/completions", chat(JANE))
        assert chat_text(events) == MASKED


def test_every_answer_route_unmasks_json_and_stream(unmasking) -> None:
    client, _ = unmasking(ON)
    prompt = f"Please mail {JANE} about the invoice"
    with client:
        # completions
        whole = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0})
        assert whole.status_code == 200, whole.text
        assert whole.json()["choices"][0]["text"] == answer_for(JANE)
        _, events = sse(client, "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0})
        assert "".join(e["choices"][0]["text"] for e in events if e.get("choices")) == answer_for(JANE)
        # the Workers AI run route
        whole = client.post(RUN, json={"prompt": prompt, "max_tokens": 16})
        assert whole.status_code == 200, whole.text
        assert whole.json()["result"]["response"] == answer_for(JANE)
        _, events = sse(client, RUN, {"prompt": prompt, "max_tokens": 16})
        assert "".join(e.get("response") or "" for e in events) == answer_for(JANE)
        # the Responses API: the caller reads its value; the stored turn (a later turn's history) keeps the placeholder
        whole = client.post("/v1/responses", json={"input": prompt, "max_output_tokens": 16, "temperature": 0})
        assert whole.status_code == 200, whole.text
        assert whole.json()["output"][0]["content"][0]["text"] == answer_for(JANE)
        kept = client.get(f"/v1/responses/{whole.json()['id']}").json()
        assert kept["output"][0]["content"][0]["text"] == MASKED and JANE not in json.dumps(kept)
        _, events = sse(client, "/v1/responses", {"input": prompt, "max_output_tokens": 16, "temperature": 0})
        deltas = "".join(e.get("delta", "") for e in events if e.get("type") == "response.output_text.delta")
        assert deltas == answer_for(JANE)
        done = next(e for e in events if e.get("type") == "response.completed")
        assert done["response"]["output"][0]["content"][0]["text"] == answer_for(JANE)
        kept = client.get(f"/v1/responses/{done['response']['id']}").json()
        assert kept["output"][0]["content"][0]["text"] == MASKED


def test_an_origins_answer_is_unmasked_and_the_origin_sees_only_the_placeholder(start_edge: Callable[..., EdgeServer],
                                                                                make_deps: Callable[..., Any]) -> None:
    """A real origin process that repeats the prompt (the edge's own binding fails, so it answers)."""
    from dataclasses import replace

    from edgellm_local.doubles.faults import FaultPlan, FaultyAI
    from edgellm_local.emulator.http_fetch import HttpxFetch
    from tests.support.hostile_origin import HostileOriginProcess

    origin = HostileOriginProcess.start()
    try:
        origin.set_mode("echo")
        config = Config.from_env({"ORIGINS": json.dumps([{"name": "echo", "url": origin.url}]), "OPEN_ACCESS": "true",
                                  "GUARDRAILS": json.dumps(ON)})
        deps = make_deps(config=config, kv=None)
        server = start_edge(replace(deps, ai=FaultyAI(deps.ai, FaultPlan(fail=1.0)), fetch=HttpxFetch()))
        prompt = f"Please mail {JANE} about the invoice"
        with httpx.Client(base_url=server.url, timeout=60) as client:
            whole = client.post("/v1/chat/completions", json=chat(JANE))
            assert whole.status_code == 200, whole.text
            assert whole.headers["x-edgellm-route"].startswith("origin")
            assert whole.json()["choices"][0]["message"]["content"] == prompt
            assert origin.last_body()["messages"][0]["content"] == "Please mail [EMAIL_1] about the invoice"  # type: ignore[index]
            headers, events = sse(client, "/v1/chat/completions", chat(JANE))
            assert headers["x-edgellm-route"].startswith("origin") and chat_text(events) == prompt
            assert JANE not in json.dumps(origin.last_body())
    finally:
        origin.stop()


def test_a_keys_own_policy_unmasks_its_answers_and_another_keys_keep_placeholders(start_edge: Callable[..., EdgeServer],
                                                                                   make_deps: Callable[..., Any]) -> None:
    """Set per key (`edgellm keys create --guardrails`): the same tenant's two keys HIT one entry;
    only the unmasking key's caller reads its value."""
    import asyncio

    from edgellm.access.keys import KeyRing, new_key

    deps = make_deps(config=Config(open_access=False, guardrails=parse_policy({"dlp": {"email": "mask"}})),
                     ai=ScriptedAI(tokens=TOKENS))
    unmasking = new_key("acme", 0.0, guardrails=json.dumps(ON))
    plain = new_key("acme", 0.0)
    for made in (unmasking, plain):
        asyncio.run(KeyRing(deps.kv).put(made.record))
    server = start_edge(deps)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        mine = client.post("/v1/chat/completions", json=chat(JANE), headers={"authorization": f"Bearer {unmasking.api_key}"})
        assert mine.status_code == 200, mine.text
        assert mine.json()["choices"][0]["message"]["content"] == answer_for(JANE)
        theirs = client.post("/v1/chat/completions", json=chat(JANE), headers={"authorization": f"Bearer {plain.api_key}"})
        assert theirs.headers["cf-aig-cache-status"] == "HIT"
        assert theirs.json()["choices"][0]["message"]["content"] == MASKED  # the gateway's policy: placeholders stay


def test_a_tool_calls_arguments_get_the_callers_value_back(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any]) -> None:
    """A function-calling model's call, its arguments cut inside the placeholder: the caller's code
    runs the call, so it gets the address (as JSON string content); the JSON and the stream agree."""
    hermes = "@hf/nousresearch/hermes-2-pro-mistral-7b"  # tools, per Cloudflare's lists
    tool = {"type": "function", "function": {"name": "send_mail", "parameters": {"type": "object", "properties": {"to": {"type": "string"}}}}}
    script = ({"response": "", "tool_calls": [{"index": 0, "id": "call_1", "name": "send_mail", "arguments": '{"to": "[EMA'}]},
              {"response": "", "tool_calls": [{"index": 0, "arguments": 'IL_1]"}'}]},
              {"response": "", "usage": {"prompt_tokens": 9, "completion_tokens": 3}})
    ai = ScriptedAI(events=script, description=None)
    deps = make_deps(config=Config(open_access=True, model=hermes, guardrails=parse_policy(ON)), ai=ai, kv=None)
    server = start_edge(deps)
    body = {**chat(JANE), "model": hermes, "tools": [tool]}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        _, events = sse(client, "/v1/chat/completions", body)
        calls = [c for e in events if e.get("choices") for c in e["choices"][0]["delta"].get("tool_calls") or []]
        assert calls and calls[0]["function"]["name"] == "send_mail"
        assert json.loads("".join(c["function"].get("arguments") or "" for c in calls)) == {"to": JANE}
    assert "[EMAIL_1]" in json.dumps(ai.calls[-1][1]) and JANE not in json.dumps(ai.calls[-1][1])  # the model saw the placeholder
