"""A Worker whose `[vars]` the config refuses, over the REAL Workers Python SDK (`src/entry.py`'s
`Default` with only what lies under the SDK stood in: `tests/support/fake_pyodide.py`).

Cloudflare starts a Worker whatever its `[vars]` hold, so the Worker itself must say what is wrong:
every route answers 503 with `Retry-After` and the OpenAI error JSON naming the variable and what it
accepts, with an `x-request-id` as every answer has; `/healthz` says `misconfigured`; and the
isolate logs it once (Workers Logs keep what an isolate prints: a line per request, with a
traceback, buried the one line that mattered). Static assets never reach the Worker
(workers-runtime.md: "a matching file is served before the Worker runs"), so the pages are not
its to answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from edgellm.errors import RetryAfter
from tests.support import fake_pyodide as fp

MODEL = "@cf/meta/llama-2-7b-chat-int8"
BGE = "@cf/baai/bge-small-en-v1.5"

# each variable with a value the Worker cannot run with, and what its answer must say
MISTAKES = [
    ({"ORIGINS": "notjson"}, ("ORIGINS", "JSON list")),
    ({"CACHE_CLASSES": "news=300"}, ("CACHE_CLASSES", "JSON object")),
    ({"MAX_WAITING_GENERATIONS": "many"}, ("MAX_WAITING_GENERATIONS", "whole number of at least 1")),
    ({"OPEN_ACCESS": "ture"}, ("OPEN_ACCESS", "true or false")),
    ({"START_TIMEOUT_SECONDS": "0"}, ("START_TIMEOUT_SECONDS", "above 0")),
    ({"BREAKER": "[5]"}, ("BREAKER", "JSON object")),
    ({"MODEL_CAPABILITIES": '{"@cf/x": ["telepathy"]}'}, ("MODEL_CAPABILITIES",)),
    ({"RATE_LIMIT_PERIOD": "30"}, ("RATE_LIMIT_PERIOD", "10 or 60")),  # read by the binding's adapter, not the config
    # settings each valid alone that make an edge fail every request of a kind, or publish what it must not
    ({"EMBEDDING_MODELS": f"{MODEL},{BGE}"}, ("MODEL", "EMBEDDING_MODELS", "chat")),
    ({"METRICS_OPEN": "true", "OPEN_ACCESS": "false"}, ("METRICS_OPEN", "OPEN_ACCESS")),
]
IDS = ["origins", "cache-classes", "whole", "flag", "number", "breaker", "capabilities", "rate-limit-period", "model-is-embedding",
       "metrics-open-with-keys"]
ROUTES = [("GET", "/healthz"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/embeddings"),
          ("GET", "/metrics"), ("POST", "/v1/responses"), ("GET", "/admin/cache/stats"), ("GET", "/no/such/route"),
          ("POST", "/client/v4/accounts/acct/ai/run/" + MODEL)]


class Worker:
    """One isolate of a deployed Worker: `entry.Default` made per request, as the runtime does,
    sharing the isolate's module state."""

    def __init__(self, rt: Any, entry: Any, **vars: str) -> None:
        self.rt, self.entry = rt, entry
        self.env = fp.JsEnv(AI=object(), CACHE=fp.jsnull, MODEL=MODEL, **vars)
        self.ctx = fp.ExecutionContext()

    async def fetch(self, method: str, path: str, headers: dict[str, str] | None = None) -> Any:
        init: dict[str, Any] = {"method": method, "headers": {"content-type": "application/json", **(headers or {})}}
        if method == "POST":
            init["body"] = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
        request = fp.FakeRequest.new(f"https://edge.example{path}", fp.to_js(init, dict_converter=fp._from_entries))
        return await self.entry.Default(self.ctx, self.env).fetch(self.rt.workers.Request(request))


@pytest.fixture
def runtime() -> Any:
    with fp.installed() as rt:
        import entry

        yield rt, entry


def setup_lines(caplog: Any, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("edgellm") and name in r.getMessage()]


@pytest.mark.parametrize(("vars", "said"), MISTAKES, ids=IDS)
async def test_a_misconfigured_worker_answers_503_naming_the_variable_on_every_route(runtime: Any, caplog: Any,
                                                                                    vars: dict[str, str], said: tuple[str, ...]) -> None:
    rt, entry = runtime
    caplog.set_level(logging.INFO)
    worker = Worker(rt, entry, **vars)
    for method, path in ROUTES:
        native = await worker.fetch(method, path)
        body = json.loads(await native.bytes())
        assert native.status == 503, (path, native.status, body)
        assert native.headers["retry-after"] == str(int(RetryAfter.UNCONFIGURED)), path
        assert native.headers["content-type"] == "application/json"
        assert native.headers.get("x-request-id"), path
        error = body["error"]
        assert error["type"] == "unavailable_error" and error["code"] == "worker_misconfigured", (path, error)
        assert error["request_id"] == native.headers["x-request-id"]
        for fragment in said:
            assert fragment in error["message"], (path, fragment, error["message"])
        if path == "/healthz":
            assert body["status"] == "misconfigured", body
    first = next(iter(vars))
    lines = setup_lines(caplog, first)
    # once per isolate, however many requests, and no traceback
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].exc_info is None and "Traceback" not in lines[0].getMessage()


async def test_a_client_request_id_is_kept_and_a_new_isolate_says_it_again(runtime: Any, caplog: Any) -> None:
    rt, entry = runtime
    caplog.set_level(logging.INFO)
    worker = Worker(rt, entry, ORIGINS="notjson")
    native = await worker.fetch("GET", "/v1/models", headers={"cf-ray": "8f1e2d3c4b5a6978-CDG"})
    assert native.status == 503 and native.headers["x-request-id"] == "8f1e2d3c4b5a6978-CDG"
    again = await worker.fetch("GET", "/v1/models")
    assert again.headers["x-request-id"] not in ("", "8f1e2d3c4b5a6978-CDG")
    assert len(setup_lines(caplog, "ORIGINS")) == 1
    from edgellm.runtime import pyodide

    pyodide._isolate = None  # the runtime starts another isolate of the same Worker: it says it once too
    await worker.fetch("GET", "/v1/models")
    assert len(setup_lines(caplog, "ORIGINS")) == 2


async def test_a_well_configured_worker_is_healthy(runtime: Any) -> None:
    rt, entry = runtime
    native = await Worker(rt, entry, EMBEDDING_MODELS=BGE, OPEN_ACCESS="true", METRICS_OPEN="true").fetch("GET", "/healthz")
    body = json.loads(await native.bytes())
    assert native.status == 200 and body["status"] == "ok" and native.headers.get("x-request-id")


# every variable the Worker reads whose value can be wrong, with a value of the wrong kind
BAD_OF_KIND = {"whole": "many", "number": "soon", "flag": "ture", "json_object": "notjson", "json_list": "notjson"}


@pytest.mark.parametrize("name", [n for n, spec in __import__("edgellm.vars").vars.VARS.items() if spec.kind in BAD_OF_KIND])
async def test_every_variable_with_a_bad_value_is_a_503_naming_it(runtime: Any, name: str) -> None:
    from edgellm.vars import VARS

    rt, entry = runtime
    native = await Worker(rt, entry, **{name: BAD_OF_KIND[VARS[name].kind]}).fetch("POST", "/v1/chat/completions")
    error = json.loads(await native.bytes())["error"]
    assert native.status == 503 and error["code"] == "worker_misconfigured" and name in error["message"], (name, error)
