"""Bad input through the real HTTP server: every case is a 4xx JSON error in the OpenAI shape
that names what was wrong, on both OpenAI routes and the Workers AI route. Never a 500."""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator

import httpx
import pytest

from edgellm.config import MAX_BODY_BYTES, Config
from edgellm.deps import Deps
from edgellm.validation import MAX_JSON_DEPTH
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.server import EdgeApp, EdgeServer
from tests.conftest import target_base_url

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RUN = "/client/v4/accounts/0123abcd/ai/run/@cf/meta/llama-2-7b-chat-int8"
BASE: dict[str, dict[str, Any]] = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    COMPLETIONS: {"prompt": "hi", "max_tokens": 2},
    RUN: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}


# (status, param or None, words the message must contain, http method, path, body)
Case = tuple[int, str | None, tuple[str, ...], str, str, Any]


def for_each_route(status: int, param: str | None, words: tuple[str, ...], change: dict[str, Any]) -> list[Case]:
    return [(status, param, words, "POST", path, {**BASE[path], **change}) for path in BASE]


WRONG_TYPES = {
    "max_tokens": "10", "temperature": "hot", "top_p": [0.5], "top_k": 1.5, "seed": "42",
    "repetition_penalty": {"x": 1}, "frequency_penalty": True, "presence_penalty": "0", "stream": "yes",
}
OUT_OF_RANGE = [
    ("temperature", -0.1), ("temperature", 5.1),
    ("top_k", 0), ("top_k", 51),
    ("seed", 0), ("seed", 10_000_000_000),
    ("top_p", -0.5), ("top_p", 2.5),
    ("repetition_penalty", -1), ("repetition_penalty", 2.5),
    ("frequency_penalty", -2.5), ("frequency_penalty", 2.5),
    ("presence_penalty", -2.5), ("presence_penalty", 2.5),
    ("max_tokens", 0), ("max_tokens", -3),
]

# One rule for every string field, wherever it sits: a lone surrogate is a 400 naming the field
# (it was refused in `content`, by the model's input encoder, and answered 200 in `stop`).
LONE_SURROGATES: list[Case] = [
    (400, param, ("unicode",), "POST", path, {**BASE[path], **change}) for param, path, change in [
        ("messages[0].content", CHAT, {"messages": [{"role": "user", "content": "\udc00"}]}),
        ("messages[0].content", RUN, {"messages": [{"role": "user", "content": "a\ud800b"}]}),
        ("prompt", COMPLETIONS, {"prompt": "x\udbff"}),
        ("prompt", RUN, {"messages": None, "prompt": "x\udbff"}),
        ("stop", CHAT, {"stop": "end\ud800"}),
        ("stop[1]", CHAT, {"stop": ["ok", "\udfff"]}),
        ("stop", COMPLETIONS, {"stop": "\ud800"}),
        ("model", CHAT, {"model": "\ud800"}),
        ("user", CHAT, {"user": "\ud800"}),
        ("lora", RUN, {"lora": "\ud800"}),
        ("tools[0].function.description", CHAT,
         {"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]}),
        ("response_format.json_schema.schema.properties.\ud800", CHAT,
         {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"\ud800": {}}}}}}),
    ]
]


CASES: list[Case] = [
    *[(400, None, ("json",), "POST", path, b'{"messages": [') for path in BASE],
    *[(400, None, ("empty",), "POST", path, b"") for path in BASE],
    # refused before parsing, naming the limit (on workerd ~5000 deep kills the isolate)
    *[(400, None, ("nested", str(MAX_JSON_DEPTH)), "POST", path, b"[" * 100_000 + b"]" * 100_000) for path in BASE],
    *[(400, None, ("nested", str(MAX_JSON_DEPTH)), "POST", path, b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}")
      for path in BASE],
    *[(400, None, ("object",), "POST", path, b"[1, 2]") for path in BASE],
    *[(413, None, ("exceeds", str(MAX_BODY_BYTES)), "POST", path, b" " * (MAX_BODY_BYTES + 1)) for path in BASE],
    *[case for name, value in WRONG_TYPES.items() for case in for_each_route(400, name, (name,), {name: value})],
    *[case for name, value in OUT_OF_RANGE for case in for_each_route(400, name, (name, str(value)), {name: value})],
    (400, "messages", ("messages", "at least one"), "POST", CHAT, {"messages": []}),
    # refused by the model itself (llama.cpp's chat template), still the caller's error: 400
    (400, None, ("assistant",), "POST", CHAT, {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}),
    (400, "messages", ("messages", "at least one"), "POST", RUN, {"messages": []}),
    (400, "messages", ("messages",), "POST", CHAT, {"messages": "hi"}),
    (400, "messages", ("messages",), "POST", CHAT, {}),
    (400, "messages", ("prompt", "messages"), "POST", RUN, {}),
    (400, "prompt", ("prompt",), "POST", COMPLETIONS, {}),
    (400, "prompt", ("prompt",), "POST", COMPLETIONS, {"prompt": 12}),
    (400, "messages[0].role", ("role", "wizard"), "POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}),
    (400, "messages[1].tool_call_id", ("tool_call_id",), "POST", RUN,  # a tool result must name the call it answers
     {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}),
    (400, "messages[0].content", ("content",), "POST", CHAT, {"messages": [{"role": "user", "content": 7}]}),
    (404, "model", ("@cf/no/such-model",), "POST", CHAT, {**BASE[CHAT], "model": "@cf/no/such-model"}),
    (404, "model", ("@cf/no/such-model",), "POST", COMPLETIONS, {**BASE[COMPLETIONS], "model": "@cf/no/such-model"}),
    (404, "model", ("@cf/no/such-model",), "POST", RUN.replace("@cf/meta/llama-2-7b-chat-int8", "@cf/no/such-model"), BASE[RUN]),
    (400, "model", ("model",), "POST", CHAT, {**BASE[CHAT], "model": 3}),
    (400, "stop", ("stop",), "POST", CHAT, {**BASE[CHAT], "stop": 5}),
    (400, "n", ("n=1",), "POST", CHAT, {**BASE[CHAT], "n": 3}),
    (400, "stream_options", ("stream_options",), "POST", CHAT, {**BASE[CHAT], "stream": True, "stream_options": "usage"}),
    *LONE_SURROGATES,
    *[(405, None, ("GET", "POST"), "GET", path, None) for path in BASE],
    (405, None, ("DELETE", "POST"), "DELETE", CHAT, None),
    (405, None, ("POST", "GET"), "POST", "/v1/models", BASE[CHAT]),
    (404, None, ("/v1/chat/completion",), "POST", "/v1/chat/completion", BASE[CHAT]),
    (404, None, ("/v2/chat/completions",), "POST", "/v2/chat/completions", BASE[CHAT]),
    (404, None, ("/client/v4/accounts/abc/ai/runs/m",), "POST", "/client/v4/accounts/abc/ai/runs/m", BASE[RUN]),
]


def case_id(case: Case) -> str:
    status, param, _, method, path, body = case
    what = param or (body[:12].decode(errors="replace") if isinstance(body, bytes) else "body")
    return f"{method} {path.split('/')[-1] if 'client' in path else path} {status} {what}"


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """One server for the whole table: every request is rejected before (or at) the model
    (`EDGELLM_TEST_BASE_URL` when set)."""
    base = target_base_url()
    if base is not None:
        with httpx.Client(base_url=base, timeout=30) as http:
            yield http
        return
    config = Config(open_access=True)
    runner: LlamaCppRunner = request.getfixturevalue("tiny_runner")
    deps = Deps(config=config, ai=LlamaCppAI.for_config(config, runner), log=logging.getLogger("edgellm.test"))
    with EdgeServer(EdgeApp(deps)) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_bad_input_is_a_clear_4xx_json_error(client: httpx.Client, case: Case) -> None:
    status, param, words, method, path, body = case
    if isinstance(body, bytes) or body is None:
        response = client.request(method, path, content=body, headers={"content-type": "application/json"})
    else:  # json.dumps keeps a lone surrogate as "\ud800", as a client would send it
        response = client.request(method, path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})

    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert "Traceback" not in response.text
    data = response.json()
    error = data["error"]
    # the core's answers name their request id; a body refused before the core reads it (413, the
    # platform's limit, as on Cloudflare) has none
    assert set(error) == {"message", "type", "param", "code", "request_id"} or (status == 413 and set(error) == {"message", "type", "param", "code"})
    assert error.get("request_id", response.headers.get("x-request-id")) == response.headers.get("x-request-id")
    assert error["param"] == param
    assert isinstance(error["code"], str) and error["code"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    for word in words:
        assert word.lower() in error["message"].lower(), error["message"]
    if status == 405:
        assert "POST" in response.headers["allow"] or "GET" in response.headers["allow"]
        assert set(response.headers["allow"].split(", ")) >= {"OPTIONS"}
    if "/ai/run/" in path:  # the REST route renders its errors in Cloudflare's envelope as well
        assert data["success"] is False and data["result"] is None
        assert data["errors"][0]["code"] == status
    else:  # other routes, and paths no route matches (a prefix alone chooses nothing)
        assert "success" not in data
