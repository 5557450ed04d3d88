"""Sessions: `x-session-affinity` or `prompt_cache_key` reach the AI binding (Workers AI's header
through the Pyodide adapter), never the answer cache's key; usage reports cached tokens."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.http import Request
from edgellm.deps import Deps
from edgellm_local.emulator.kv import SqliteKV
from tests.support import fake_pyodide as fp
from edgellm_local.doubles.scripted import ScriptedAI

CHAT = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def post(body: Any, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions") -> Request:
    return Request("POST", f"http://edge.test{path}", {"content-type": "application/json", **(headers or {})}, json.dumps(body).encode())


def deps(ai: ScriptedAI, tmp_path: Path | None = None, background: list[Any] | None = None) -> Deps:
    kv = SqliteKV(tmp_path / "kv.sqlite3") if tmp_path else None
    keep = (lambda aw: background.append(asyncio.ensure_future(aw))) if background is not None else None
    d = Deps(config=Config(open_access=True), ai=ai, kv=kv, log=logging.getLogger("edgellm.test"))
    return d.for_request(keep) if keep else d


@pytest.mark.parametrize("headers,body,session", [
    ({}, {}, None),
    ({"x-session-affinity": "conv-1"}, {}, "conv-1"),
    ({}, {"prompt_cache_key": "key-2"}, "key-2"),
    ({"x-session-affinity": "conv-1"}, {"prompt_cache_key": "key-2"}, "conv-1"),
])
async def test_the_session_reaches_the_binding(headers: dict[str, str], body: dict[str, Any], session: str | None) -> None:
    ai = ScriptedAI()
    for stream in (False, True):
        response = await handle(post({**CHAT, **body, "stream": stream}, headers), deps(ai))
        assert response.status == 200
    assert ai.sessions == [session, session]


def test_a_keyless_caller_cannot_name_a_keyed_tenants_session() -> None:
    """A keyed tenant's session `x` is `acme:x`; a keyless caller (open mode, the admin token)
    naming `acme:x` must land elsewhere, or it would reach (and time) acme's cached prompt."""
    from edgellm.access.guard import Principal
    from edgellm.access.keys import new_key
    from edgellm.sessions import tenant_session

    from edgellm.tenancy import UNSCOPED

    keyed = Principal(tenant="acme", key_id="k1", record=new_key("acme", 0).record).scope  # any record: a key's caller
    keyless = Principal(tenant="default", key_id="open").scope
    assert tenant_session(keyed, "x") == "acme:x"
    assert tenant_session(keyless, "acme:x") != tenant_session(keyed, "x")
    assert tenant_session(keyless, "conv-1") == "conv-1"  # a plain name stays as it was
    assert tenant_session(UNSCOPED, "acme:x") != "acme:x"  # no principal at all: the same rule


@pytest.mark.parametrize("headers,body,param", [
    ({"x-session-affinity": ""}, {}, "x-session-affinity"),
    ({}, {"prompt_cache_key": 7}, "prompt_cache_key"),
    ({}, {"prompt_cache_key": "x" * 257}, "prompt_cache_key"),
])
async def test_a_bad_session_is_a_400(headers: dict[str, str], body: dict[str, Any], param: str) -> None:
    response = await handle(post({**CHAT, **body}, headers), deps(ScriptedAI()))
    assert response.status == 400 and json.loads(response.body)["error"]["param"] == param


async def test_the_session_is_not_part_of_the_cache_key(tmp_path: Path) -> None:
    ai = ScriptedAI()
    background: list[Any] = []
    d = deps(ai, tmp_path, background)
    first = await handle(post(CHAT, {"x-session-affinity": "a"}), d)
    await asyncio.gather(*background)  # the generation and its KV write (waitUntil)
    await asyncio.gather(*background)
    second = await handle(post(CHAT, {"x-session-affinity": "b"}), d)
    assert first.headers["cf-aig-cache-status"] == "MISS" and second.headers["cf-aig-cache-status"] == "HIT"
    assert first.headers["x-edgellm-cache-key"] == second.headers["x-edgellm-cache-key"]


async def test_cached_tokens_the_binding_reports_are_in_the_openai_usage() -> None:
    ai = ScriptedAI(usage={"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 6}})
    response = await handle(post({**CHAT, "temperature": 0.5}, {"x-session-affinity": "s"}), deps(ai))
    assert json.loads(response.body)["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14,
                                                 "prompt_tokens_details": {"cached_tokens": 6}}


class OptionsAIBinding:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def run(self, model: str, inputs: Any, *options: Any) -> Any:
        self.calls.append((model, fp.require_js_object(inputs), *[fp.require_js_object(o) for o in options]))
        return fp.JsDict({"response": "ok"})


async def test_the_pyodide_adapter_sends_the_session_as_x_session_affinity() -> None:
    with fp.installed():
        from edgellm.runtime import pyodide_ai

        binding = OptionsAIBinding()
        ai = pyodide_ai.WorkersAI(binding)
        await ai.run("@cf/m", {"prompt": "x"}, session="conv-9")
        await ai.run("@cf/m", {"prompt": "x"})
    (_, _, options), without = binding.calls
    assert options == {"extraHeaders": {"x-session-affinity": "conv-9"}}
    assert len(without) == 2  # no session: the call is exactly as before
