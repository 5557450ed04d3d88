"""Where the Worker's answers and the local edge's differed in the real runtime, held the same: an R2
object keeps its Content-Length through the Worker, a body over the limit gets the same 413 (the
core's, with the core's headers) on both, and static assets carry the Content-Type wrangler
uploads them with.

The Worker runs through `src/entry.py` over the REAL Workers SDK (`tests/support/fake_pyodide.py`
stands in for what lies under it; its `[length]` contract: workerd knows the length of a body
stream and of a `FixedLengthStream`'s readable half only, and sends a Response over any other
stream chunked, without Content-Length). The local edge is its real HTTP server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.edge import DEFAULT_PUBLIC
from edgellm_local.emulator.assets import StaticAssets, asset_content_type
from edgellm_local.emulator.r2 import FileR2
from edgellm_local.emulator.server import EdgeApp, EdgeServer
from tests.support import fake_pyodide as fp
from tests.unit.test_workers_sdk import Platform, runtime  # noqa: F401  (the SDK over the stand-ins)

TOKENIZER = json.dumps({"model": {"vocab": {f"t{i}": i for i in range(4000)}}}).encode()
TRANSPORT = {"date", "server", "content-length", "connection"}  # the HTTP server's own, not the answer's
PER_REQUEST = {"x-request-id"}  # each request's own: present on both, compared by presence


@pytest.fixture
def r2(tmp_path: Path) -> FileR2:
    return FileR2(tmp_path / "r2")


async def test_an_r2_object_keeps_its_content_length_through_the_worker(runtime: Any, r2: FileR2) -> None:  # noqa: F811
    """A first read is copied to the Cache API as it goes out (a Python tee): a stream workerd
    knows no length of, whose Content-Length it dropped, until it went through a FixedLengthStream.
    A HIT of the cache, a range and a second read keep it too."""
    rt, entry = runtime
    await r2.put("models/tiny/tokenizer.json", TOKENIZER)
    platform = Platform(rt, entry, fp.JsAi(ScriptedAI()))
    platform.env.ARTIFACTS = fp.JsR2Bucket(r2)
    url = "https://edge.example/models/tiny/tokenizer.json"
    for headers, status, length in [({}, 200, len(TOKENIZER)), ({}, 200, len(TOKENIZER)), ({"range": "bytes=10-109"}, 206, 100)]:
        native = await platform.fetch({}, headers, url=url, method="GET")
        body = await native.bytes()
        assert native.status == status and len(body) == length
        assert native.headers.get("content-length") == str(length), dict(native.headers.items())
        await platform.settle()


async def test_a_body_over_the_limit_gets_the_same_413_from_the_worker_and_the_local_edge(runtime: Any) -> None:  # noqa: F811
    rt, entry = runtime
    limit = Config().max_body_bytes
    body = {"model": "@cf/meta/llama-2-7b-chat-int8", "messages": [{"role": "user", "content": "x" * (limit + 1)}]}
    platform = Platform(rt, entry, fp.JsAi(ScriptedAI()))
    native = await platform.fetch(body, {"origin": "https://app.example"})
    worker = (native.status, {k: v for k, v in native.headers.items() if k not in TRANSPORT | PER_REQUEST}, json.loads(await native.bytes()))
    assert native.headers.get("x-request-id") == worker[2]["error"].pop("request_id")
    server = EdgeServer(EdgeApp(Deps(config=Config(open_access=True), ai=ScriptedAI()), None)).start()
    try:
        answer = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(body),
                            headers={"content-type": "application/json", "origin": "https://app.example"}, timeout=30)
    finally:
        server.stop()
    local = (answer.status_code, {k: v for k, v in answer.headers.items() if k not in TRANSPORT | PER_REQUEST}, answer.json())
    assert answer.headers["x-request-id"] == local[2]["error"].pop("request_id")
    assert worker[0] == 413 and worker[2]["error"]["code"] == "request_too_large"
    assert local == worker
    assert answer.headers["connection"] == "close"  # its unread body is still on the wire: the connection cannot be reused


@pytest.mark.parametrize("name,expected", [
    ("openapi.json", "application/json"),  # no charset: wrangler adds one to text/* only
    ("index.html", "text/html; charset=utf-8"),
    ("css/site.css", "text/css; charset=utf-8"),
    ("js/sse.mjs", "text/javascript; charset=utf-8"),
    ("vendor/tokenizers.min.mjs", "text/javascript; charset=utf-8"),
])
def test_a_static_asset_has_the_content_type_wrangler_uploads_it_with(name: str, expected: str) -> None:
    """wrangler 4.86 `getContentType`: the `mime` package's type, `; charset=utf-8` added to
    `text/*` types only; the local edge serves public/ with the same."""
    assert (DEFAULT_PUBLIC / name).is_file()
    assert asset_content_type(name) == expected
    path = "/" if name == "index.html" else f"/{name}"  # an .html name is a 307 to its clean URL
    served = StaticAssets(DEFAULT_PUBLIC).serve(Request("GET", f"http://localhost{path}", {}, b""))
    assert served is not None and served.headers["content-type"] == expected
