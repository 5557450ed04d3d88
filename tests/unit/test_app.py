"""The whole request flow without a server: `handle(request, deps)` with injected bindings."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.http import Request, Response
from edgellm.ports import BindingError, CapacityExceeded
from edgellm.deps import Deps
from edgellm.router import Router, route
from edgellm.sse import SSEDecoder
from edgellm_local.doubles.scripted import ScriptedAI

PRIMARY = "@cf/meta/llama-2-7b-chat-int8"
FALLBACK = "@cf/meta/llama-2-7b-chat-hf-lora"
RUN = f"/client/v4/accounts/acc123/ai/run/{PRIMARY}"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def deps_with(ai: Any = None, **config: Any) -> Deps:
    # kv=None: the answer cache (tested on its own) is bypassed, so each call reaches the binding
    return Deps(config=Config(**{"open_access": True, **config}), ai=ai or ScriptedAI(), kv=None, log=logging.getLogger("edgellm.test"))


def post(path: str, body: Any, headers: dict[str, str] | None = None) -> Request:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Request("POST", f"http://edge.test{path}", {"content-type": "application/json", **(headers or {})}, raw)


def get(path: str, method: str = "GET", headers: dict[str, str] | None = None) -> Request:
    return Request(method, f"http://edge.test{path}", headers or {})


def body_json(response: Response) -> Any:
    assert not response.is_streaming
    return json.loads(response.body)


async def sse_events(response: Response) -> list[Any]:
    assert response.is_streaming
    decoder = SSEDecoder()
    out: list[Any] = []
    async for chunk in response.body:  # type: ignore[union-attr]
        out += [p if p == "[DONE]" else json.loads(p) for p in decoder.feed(chunk)]
    return out


def assert_error(response: Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status == status
    assert response.headers["content-type"] == "application/json"
    error = body_json(response)["error"]
    assert set(error) == {"message", "type", "param", "code", "request_id"}
    assert error["message"] and "Traceback" not in error["message"]
    if code:
        assert error["code"] == code
    return error


async def test_chat_completion() -> None:
    response = await handle(post("/v1/chat/completions", CHAT), deps_with())
    assert response.status == 200
    assert response.headers["x-edgellm-model"] == PRIMARY
    assert "access-control-allow-origin" not in response.headers  # no Origin: not a browser's call
    data = body_json(response)
    assert data["object"] == "chat.completion" and data["model"] == PRIMARY
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world!"}
    assert data["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


async def test_created_comes_from_the_injected_clock(clock: Any) -> None:
    deps = Deps(config=Config(open_access=True), ai=ScriptedAI(), clock=clock, log=logging.getLogger("edgellm.test"))
    data = body_json(await handle(post("/v1/completions", {"prompt": "x"}), deps))
    assert data["created"] == int(clock.now())


async def test_the_binding_receives_workers_ai_inputs() -> None:
    ai = ScriptedAI()
    await handle(post("/v1/chat/completions", {**CHAT, "max_tokens": 9, "top_k": 3, "stop": "x"}), deps_with(ai))
    # the stop sequence is the gateway's (Workers AI has none): the answer is read live to stop at it
    assert ai.calls == [(PRIMARY, {"messages": CHAT["messages"], "max_tokens": 9, "temperature": 0.6, "top_k": 3, "stream": True})]


async def test_chat_stream() -> None:
    response = await handle(post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}), deps_with())
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = await sse_events(response)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == "Hello, world!"
    assert events[-2]["usage"]["total_tokens"] == 12


async def test_completion() -> None:
    ai = ScriptedAI()
    data = body_json(await handle(post("/v1/completions", {"prompt": "Once", "max_tokens": 5}), deps_with(ai)))
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == "Hello, world!"
    assert data["choices"][0]["finish_reason"] == "length"
    assert ai.calls[0][1]["raw"] is True


async def test_workers_ai_rest_route() -> None:
    ai = ScriptedAI()
    response = await handle(post(RUN, {"prompt": "hi", "max_tokens": 5}), deps_with(ai))
    assert response.status == 200
    assert body_json(response) == {
        "result": {"response": "Hello, world!", "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}},
        "success": True, "errors": [], "messages": [],
    }
    assert ai.calls[0][0] == PRIMARY  # the model id (with its slashes) comes from the path


async def test_workers_ai_rest_route_streams() -> None:
    response = await handle(post(RUN, {"messages": CHAT["messages"], "stream": True}), deps_with())
    events = await sse_events(response)
    assert [e["response"] for e in events[:-2]] == ["Hello", ",", " wor", "ld", "!"]
    assert events[-2]["usage"]["total_tokens"] == 12 and events[-1] == "[DONE]"


async def test_workers_ai_errors_carry_cloudflares_envelope_too() -> None:
    response = await handle(post("/client/v4/accounts/a/ai/run/@cf/nope/model", {"prompt": "x"}), deps_with())
    error = assert_error(response, 404, "model_not_found")
    assert error["param"] == "model"
    data = body_json(response)
    assert data["success"] is False and data["result"] is None
    assert data["errors"] == [{"code": 404, "message": error["message"]}]


async def test_fallback_is_visible_in_the_answer() -> None:
    response = await handle(post("/v1/chat/completions", CHAT), deps_with(ScriptedAI(unknown=frozenset({PRIMARY}))))
    assert response.headers["x-edgellm-model"] == FALLBACK
    assert body_json(response)["model"] == FALLBACK


@pytest.mark.parametrize(
    ("ai", "status", "code"),
    [
        (ScriptedAI(fail=CapacityExceeded("3040: Capacity temporarily exceeded")), 503, "capacity_exceeded"),
        (ScriptedAI(fail=BindingError("5000: upstream")), 502, "upstream_error"),
        (ScriptedAI(fail=OSError("network down")), 502, "upstream_error"),
        (ScriptedAI(unknown=frozenset({PRIMARY, FALLBACK})), 502, "model_unavailable"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", RUN])
async def test_failing_binding_is_502_or_503_with_retry_after(ai: ScriptedAI, status: int, code: str, path: str) -> None:
    response = await handle(post(path, CHAT), deps_with(ai))
    assert_error(response, status, code)
    assert int(response.headers["retry-after"]) > 0


async def test_models() -> None:
    data = body_json(await handle(get("/v1/models"), deps_with()))
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == [PRIMARY, FALLBACK, "gpt-4o-mini", "gpt-3.5-turbo"]
    assert [m["edgellm"]["role"] for m in data["data"]] == ["primary", "fallback", "alias", "alias"]
    assert data["data"][0]["edgellm"]["backend"] == "scripted"  # what the binding says backs the id
    assert data["data"][2]["edgellm"]["alias_of"] == PRIMARY  # the default aliases name the primary model


async def test_models_follow_the_config() -> None:
    data = body_json(await handle(get("/v1/models"), deps_with(model="@cf/a", fallback_models=("@cf/b", "@cf/a"), model_aliases={})))
    assert [m["id"] for m in data["data"]] == ["@cf/a", "@cf/b"]


async def test_healthz_and_head() -> None:
    response = await handle(get("/healthz"), deps_with())
    assert response.status == 200 and body_json(response)["status"] == "ok"
    head = await handle(get("/healthz", "HEAD"), deps_with())
    assert head.status == 200 and head.body == b""
    assert head.headers["content-length"] == str(len(response.body))


async def test_unknown_route_and_wrong_method() -> None:
    assert_error(await handle(get("/v2/nothing"), deps_with()), 404, "route_not_found")
    response = await handle(get("/v1/chat/completions"), deps_with())
    assert_error(response, 405, "method_not_allowed")
    assert "POST" in response.headers["allow"]
    response = await handle(post("/v1/models", {}), deps_with())
    assert_error(response, 405)
    assert response.headers["allow"] == "GET, HEAD, OPTIONS"


async def test_cors_preflight() -> None:
    request = get("/v1/chat/completions", "OPTIONS", {"origin": "https://app.example", "access-control-request-method": "POST",
                                                       "access-control-request-headers": "content-type, authorization"})
    refused = await handle(request, deps_with())
    assert refused.status == 204 and "access-control-allow-origin" not in refused.headers  # not on the allow-list
    response = await handle(request, deps_with(cors_origins=("https://app.example",)))
    assert response.status == 204
    assert response.headers["access-control-allow-origin"] == "https://app.example" and response.headers["vary"] == "Origin"
    assert "POST" in response.headers["access-control-allow-methods"]
    assert response.headers["access-control-allow-headers"] == "content-type, authorization"
    assert_error(await handle(get("/nowhere", "OPTIONS"), deps_with()), 404)


async def test_body_over_the_limit_is_413() -> None:
    deps = deps_with(max_body_bytes=100)
    assert_error(await handle(post("/v1/chat/completions", b" " * 101), deps), 413, "request_too_large")
    too_big = post("/v1/chat/completions", CHAT, {"content-length": "999999"})  # declared, even if truncated
    assert_error(await handle(too_big, deps), 413)
    assert (await handle(post("/v1/chat/completions", CHAT), deps)).status == 200


async def test_an_unexpected_crash_is_a_json_500_without_a_traceback() -> None:
    async def crash(request: Request, deps: Deps, ctx: object) -> Response:
        raise KeyError("secret internals")

    response = await handle(get("/boom"), deps_with(), Router((route("GET", "/boom", crash),)))
    error = assert_error(response, 500, "internal_error")
    assert "secret internals" not in error["message"]
    assert response.headers["vary"] == "Origin"


@pytest.mark.parametrize("origin,allowed", [
    ("http://edge.test", True),            # the edge's own origin
    ("http://localhost:5173", True), ("http://127.0.0.1", True), ("https://[::1]:8443", True),
    ("https://partner.example", True),     # configured
    ("https://evil.example", False), ("http://localhost.evil.example", False), ("null", False),
])
async def test_api_cors_follows_the_allow_list_and_artifacts_stay_open(origin: str, allowed: bool) -> None:
    deps = deps_with(cors_origins=("https://partner.example",))
    response = await handle(post("/v1/chat/completions", CHAT, {"origin": origin}), deps)
    assert (response.headers.get("access-control-allow-origin") == origin) is allowed
    assert ("access-control-allow-origin" in response.headers) is allowed
    artifact = await handle(get("/models", "GET", {"origin": origin}), deps_with())
    assert artifact.headers["access-control-allow-origin"] == "*"


async def test_a_route_that_declares_an_error_renderer_renders_its_errors_with_it() -> None:
    """The envelope belongs to the route, not to a path prefix: a new route chooses its own."""
    from edgellm.errors import invalid
    from edgellm.workers_ai import error_response

    async def fails(request: Request, deps: Deps, ctx: object) -> Response:
        raise invalid("bad", "x")

    router = Router((route("POST", "/elsewhere", fails, render_error=error_response), route("POST", "/client/v4/plain", fails)))
    enveloped = body_json(await handle(post("/elsewhere", {}), deps_with(), router))
    assert enveloped["success"] is False and enveloped["errors"][0]["code"] == 400
    plain = body_json(await handle(post("/client/v4/plain", {}), deps_with(), router))
    assert "success" not in plain and plain["error"]["param"] == "x"
    wrong_method = body_json(await handle(get("/elsewhere"), deps_with(), router))
    assert wrong_method["success"] is False and wrong_method["errors"][0]["code"] == 405
